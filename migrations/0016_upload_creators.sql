-- Who started each S3 multipart upload: the access key id, so `limits.max_unfinished_upload_bytes_per_key` can sum
-- what one key holds in `parts/` (checked under the write lock at every part). Uploads started before this
-- migration have none and count for no key.
ALTER TABLE multipart_uploads ADD COLUMN created_by TEXT;
CREATE INDEX multipart_uploads_by_creator ON multipart_uploads (created_by) WHERE created_by IS NOT NULL;
