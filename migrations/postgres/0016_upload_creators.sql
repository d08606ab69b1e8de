-- SQLite's 0016: the access key id that started each S3 multipart upload (NULL before it: counts for no key).
ALTER TABLE multipart_uploads ADD COLUMN created_by TEXT COLLATE "C";
CREATE INDEX multipart_uploads_by_creator ON multipart_uploads (created_by) WHERE created_by IS NOT NULL;
