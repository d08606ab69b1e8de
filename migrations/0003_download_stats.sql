-- Per-object download counters, written by the stats batcher (never on the send path). Keyed by bucket and key,
-- not by object row, so history survives a delete and continues when the key is stored again.
CREATE TABLE object_stats (
    bucket_id         INTEGER NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    key               TEXT    NOT NULL,
    requests          INTEGER NOT NULL DEFAULT 0,  -- 200/206 GET responses started
    completed         INTEGER NOT NULL DEFAULT 0,  -- every planned byte handed to the socket
    aborted           INTEGER NOT NULL DEFAULT 0,  -- cut short: client went away, stalled, or the blob was truncated
    truncated         INTEGER NOT NULL DEFAULT 0,  -- of those, cut short because the blob shrank
    bytes_sent        INTEGER NOT NULL DEFAULT 0,  -- object bytes, summed from sendfile return values
    range_requests    INTEGER NOT NULL DEFAULT 0,  -- 206 responses (single and multipart)
    not_modified      INTEGER NOT NULL DEFAULT 0,  -- 304 responses
    head_requests     INTEGER NOT NULL DEFAULT 0,  -- HEAD responses (not downloads)
    last_download_at  INTEGER,                     -- unix seconds: end of the latest 200/206 response
    PRIMARY KEY (bucket_id, key)
) WITHOUT ROWID;

-- The same counters per UTC day, for trends.
CREATE TABLE object_stats_daily (
    bucket_id       INTEGER NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    key             TEXT    NOT NULL,
    day             TEXT    NOT NULL,              -- YYYY-MM-DD (UTC)
    requests        INTEGER NOT NULL DEFAULT 0,
    completed       INTEGER NOT NULL DEFAULT 0,
    aborted         INTEGER NOT NULL DEFAULT 0,
    bytes_sent      INTEGER NOT NULL DEFAULT 0,
    range_requests  INTEGER NOT NULL DEFAULT 0,
    not_modified    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (bucket_id, key, day)
) WITHOUT ROWID;

CREATE INDEX object_stats_by_bytes ON object_stats (bytes_sent DESC);
CREATE INDEX object_stats_by_requests ON object_stats (requests DESC);
