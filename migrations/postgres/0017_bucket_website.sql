-- SQLite's 0017: a bucket's index and error documents, NULL when unset. The buckets_changes trigger (0001) logs
-- every UPDATE of a bucket row, these columns included.
ALTER TABLE buckets ADD COLUMN index_document TEXT;
ALTER TABLE buckets ADD COLUMN error_document TEXT;
