-- With an object store: a blob whose last reference went, kept in the store for `timeouts.sweep_grace` so that
-- downloads already reading it finish on every replica, then deleted by a sweep. `deleting_at` is when a sweep
-- decided (under the blob-reference lock) to delete it; the delete itself runs outside the lock, so a put of the
-- same content that finds the row uploads its blob again once that delete is past (store/mod.rs). A row stays
-- `sweep_grace` after `deleting_at` as that delete's tombstone; `deleted_at` says the delete is over. Unix seconds.
CREATE TABLE store_blob_retirements (
    sha256      TEXT    PRIMARY KEY,
    retired_at  INTEGER NOT NULL,
    deleting_at INTEGER,
    deleted_at  INTEGER
) WITHOUT ROWID;
