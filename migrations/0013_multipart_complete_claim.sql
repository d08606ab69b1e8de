-- One CompleteMultipartUpload at a time per upload, across replicas: a Complete claims the upload with a
-- conditional UPDATE (NULL: nobody completes it) before it assembles the parts, and releases the claim if it fails.
-- A claim older than the claim lease (a replica that died while assembling) may be taken over.
ALTER TABLE multipart_uploads ADD COLUMN completing_since INTEGER;  -- unix seconds of the claim
