-- SQLite's 0013: the claim one CompleteMultipartUpload takes on its upload (NULL: none; unix seconds).
ALTER TABLE multipart_uploads ADD COLUMN completing_since BIGINT;
