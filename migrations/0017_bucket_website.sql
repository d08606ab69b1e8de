-- A bucket's static-site settings (`blobgate bucket set --index-document/--error-document`), NULL when unset:
-- index_document, a relative key suffix (`index.html`) that a directory path (`/{bucket}/`, `/{bucket}/dir/`)
-- serves; error_document, a key served with 404 for a missing one. The buckets_upd trigger (0006) logs every
-- UPDATE of a bucket row, these columns included, so a running server sees a change at its next request.
ALTER TABLE buckets ADD COLUMN index_document TEXT;
ALTER TABLE buckets ADD COLUMN error_document TEXT;
