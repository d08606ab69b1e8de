-- SQLite's 0021: an object's S3 checksum (`ALGORITHM TYPE VALUE`), an upload's asked-for `ALGORITHM TYPE`, a
-- part's checksum; NULL for none.
ALTER TABLE object_s3_etags ADD COLUMN checksum TEXT;
ALTER TABLE multipart_uploads ADD COLUMN checksum TEXT;
ALTER TABLE multipart_parts ADD COLUMN checksum TEXT;
