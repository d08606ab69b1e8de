-- SQLite's 0022: CompleteMultipartUploads that committed, remembered for a while so a retry gets the same answer.
CREATE TABLE multipart_completions (
    upload_id    TEXT   COLLATE "C" PRIMARY KEY,
    bucket_id    BIGINT NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    key          TEXT   COLLATE "C" NOT NULL,
    sha256       TEXT   NOT NULL CHECK (length(sha256) = 64),
    etag         TEXT   NOT NULL,
    completed_at BIGINT NOT NULL
);

CREATE INDEX multipart_completions_by_age ON multipart_completions (completed_at);
