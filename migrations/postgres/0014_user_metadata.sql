-- SQLite's 0014: S3 user metadata (`x-amz-meta-*`) as a JSON object of names to values, NULL when none.
ALTER TABLE objects ADD COLUMN user_metadata TEXT;
ALTER TABLE multipart_uploads ADD COLUMN user_metadata TEXT;
