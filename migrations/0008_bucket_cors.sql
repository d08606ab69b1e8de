-- A bucket's CORS rule (`blobgate bucket cors set`) as JSON: origins, max_age, expose_headers. NULL: no CORS.
-- The buckets_upd trigger (0006) fires on every UPDATE of a bucket row, this column included, so a running server
-- evicts the bucket and sees the new rule on its next request.
ALTER TABLE buckets ADD COLUMN cors TEXT;
