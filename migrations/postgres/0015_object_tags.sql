-- SQLite's 0015: S3 object tags as a JSON object of keys to values, NULL when none.
ALTER TABLE objects ADD COLUMN tags TEXT;
ALTER TABLE multipart_uploads ADD COLUMN tags TEXT;
