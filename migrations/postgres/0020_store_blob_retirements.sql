-- SQLite's 0020: a store blob whose last reference went (`retired_at`), and when a sweep decided to delete it
-- (`deleting_at`, NULL while it waits out `timeouts.sweep_grace`), when that delete was over (`deleted_at`).
-- Unix seconds.
CREATE TABLE store_blob_retirements (
    sha256      TEXT   COLLATE "C" PRIMARY KEY,
    retired_at  BIGINT NOT NULL,
    deleting_at BIGINT,
    deleted_at  BIGINT
);
