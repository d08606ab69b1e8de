-- S3 object tags: a JSON object of tag keys to values, NULL when there are none. Part of an object's attributes:
-- given by `x-amz-tagging` at PutObject or CreateMultipartUpload, kept or replaced by a copy, changed in place by
-- PutObjectTagging and DeleteObjectTagging (the objects_upd trigger logs the change, so caches drop the entry).
ALTER TABLE objects ADD COLUMN tags TEXT;
ALTER TABLE multipart_uploads ADD COLUMN tags TEXT;
