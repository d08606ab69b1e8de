-- The part sizes of an object stored by a multipart upload, in part order, as decimal numbers separated by commas
-- (`5242880,5242880,1048576`), beside its S3 ETag: GetObject and HeadObject with `partNumber=N` answer part N's
-- bytes. NULL for a single upload (one part: the whole object) and for objects completed before this migration
-- (their parts are not known: `partNumber=1` is then the whole object). The release before this one writes NULL.
ALTER TABLE object_s3_etags ADD COLUMN part_sizes TEXT;
