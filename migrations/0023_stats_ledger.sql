-- Download counters as the stats batchers flush them: appended (a flush writes a few pages at the end of this
-- table, whatever objects it names), then folded into object_stats and object_stats_daily in key order, in small
-- transactions, by `Metadata::fold_stats`. Readers add the rows not folded yet (`stats_fold` says which).
-- One row per object and UTC day of a flush.
CREATE TABLE stats_ledger (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,  -- append order, never reused
    bucket_id         INTEGER NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    key               TEXT    NOT NULL,
    day               TEXT    NOT NULL,             -- YYYY-MM-DD (UTC)
    requests          INTEGER NOT NULL,
    completed         INTEGER NOT NULL,
    aborted           INTEGER NOT NULL,
    truncated         INTEGER NOT NULL,
    bytes_sent        INTEGER NOT NULL,
    range_requests    INTEGER NOT NULL,
    not_modified      INTEGER NOT NULL,
    head_requests     INTEGER NOT NULL,
    last_download_at  INTEGER
);

CREATE INDEX stats_ledger_by_bucket ON stats_ledger (bucket_id);

-- Where the fold is. `phase`: 'idle' (no row up to `upto` is left); 'folding' (rows up to `upto` are being
-- folded, those of keys up to (`done_bucket`, `done_key`) already are); 'deleting' (rows up to `upto` are all
-- folded and are being deleted). One row.
CREATE TABLE stats_fold (
    id           INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    upto         INTEGER NOT NULL,
    phase        TEXT    NOT NULL CHECK (phase IN ('idle', 'folding', 'deleting')),
    done_bucket  INTEGER NOT NULL,
    done_key     TEXT    NOT NULL
) WITHOUT ROWID;

INSERT INTO stats_fold (id, upto, phase, done_bucket, done_key) VALUES (1, 0, 'idle', -1, '');
