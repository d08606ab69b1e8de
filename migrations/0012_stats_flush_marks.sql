-- Each stats batcher (one per server process, `writer`) numbers its flushes; a flush commits its number with its
-- counts. A flush whose commit failed is retried with the same number, and a number already recorded means that
-- commit did succeed (its answer was lost), so the batch is not added twice.
CREATE TABLE stats_flush_marks (
    writer TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
