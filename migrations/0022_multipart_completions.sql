-- A CompleteMultipartUpload that committed, remembered for a while (`store::multipart::COMPLETED_UPLOAD_MEMORY`):
-- a retry of it (its answer lost) gets the same answer, as S3 gives, while the object is still the one it made
-- (`sha256`, `etag`). Written in the commit's transaction, on every replica's database alike; old rows go at the
-- next completion.
CREATE TABLE multipart_completions (
    upload_id    TEXT    PRIMARY KEY,
    bucket_id    INTEGER NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    key          TEXT    NOT NULL,
    sha256       TEXT    NOT NULL CHECK (length(sha256) = 64),
    etag         TEXT    NOT NULL,           -- the S3 ETag the Complete answered, quoted
    completed_at INTEGER NOT NULL            -- unix seconds
) WITHOUT ROWID;

CREATE INDEX multipart_completions_by_age ON multipart_completions (completed_at);
