-- Each stats batcher (one per server process, `writer`) numbers its flushes; a flush commits its number with its
-- counts. A flush whose commit failed is retried with the same number, and a number already recorded means that
-- commit did succeed (its answer was lost when the connection went), so the batch is not added twice.
-- (Numbered like SQLite's 0012, which is the same table.)
CREATE TABLE stats_flush_marks (
    writer      TEXT   COLLATE "C" PRIMARY KEY,
    last_seq    BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
