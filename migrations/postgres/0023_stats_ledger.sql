-- Download counters as the stats batchers flush them, appended, then folded into object_stats and
-- object_stats_daily in key order by `Metadata::fold_stats`; readers add the rows not folded yet. As SQLite's 0023.
CREATE TABLE stats_ledger (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    bucket_id         BIGINT NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    key               TEXT   COLLATE "C" NOT NULL,
    day               TEXT   COLLATE "C" NOT NULL,
    requests          BIGINT NOT NULL,
    completed         BIGINT NOT NULL,
    aborted           BIGINT NOT NULL,
    truncated         BIGINT NOT NULL,
    bytes_sent        BIGINT NOT NULL,
    range_requests    BIGINT NOT NULL,
    not_modified      BIGINT NOT NULL,
    head_requests     BIGINT NOT NULL,
    last_download_at  BIGINT
);

CREATE INDEX stats_ledger_by_bucket ON stats_ledger (bucket_id);

CREATE TABLE stats_fold (
    id           BIGINT  PRIMARY KEY CHECK (id = 1),
    upto         BIGINT  NOT NULL,
    phase        TEXT    NOT NULL CHECK (phase IN ('idle', 'folding', 'deleting')),
    done_bucket  BIGINT  NOT NULL,
    done_key     TEXT    COLLATE "C" NOT NULL
);

INSERT INTO stats_fold (id, upto, phase, done_bucket, done_key) VALUES (1, 0, 'idle', -1, '');
