-- SQLite's 0019: the part sizes of a multipart object, comma-separated in part order, NULL when unknown.
ALTER TABLE object_s3_etags ADD COLUMN part_sizes TEXT;
