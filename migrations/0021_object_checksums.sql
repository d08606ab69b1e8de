-- S3 additional checksums (issue 46). `object_s3_etags.checksum`: the object's checksum as an upload gave or
-- Complete made it, `ALGORITHM TYPE VALUE` (`CRC32 FULL_OBJECT DUoRhQ==`, `SHA256 COMPOSITE …-3`), for the
-- content `sha256` only, like the ETag beside it; NULL: none stored (reads then answer the SHA-256 every object
-- has). `multipart_uploads.checksum`: the `ALGORITHM TYPE` CreateMultipartUpload asked for. `multipart_parts.checksum`:
-- the part's own, `ALGORITHM FULL_OBJECT VALUE`. The release before this one writes NULL and reads none of them.
ALTER TABLE object_s3_etags ADD COLUMN checksum TEXT;
ALTER TABLE multipart_uploads ADD COLUMN checksum TEXT;
ALTER TABLE multipart_parts ADD COLUMN checksum TEXT;
