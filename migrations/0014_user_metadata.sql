-- S3 user metadata (`x-amz-meta-*`): a JSON object of lower-case names (without the prefix) to values, NULL when
-- there is none. Part of an object's attributes, like Content-Type: given at PutObject or CreateMultipartUpload,
-- kept or replaced by a copy, answered by GetObject and HeadObject.
ALTER TABLE objects ADD COLUMN user_metadata TEXT;
ALTER TABLE multipart_uploads ADD COLUMN user_metadata TEXT;
