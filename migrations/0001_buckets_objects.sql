-- Buckets and the objects in them. Object bytes live in content-addressed blob files named by `sha256`;
-- a blob is referenced by every object row that carries its hash and removed with the last of them.
CREATE TABLE buckets (
    id          INTEGER PRIMARY KEY,
    name        TEXT    NOT NULL UNIQUE,
    public      INTEGER NOT NULL DEFAULT 0 CHECK (public IN (0, 1)),
    created_at  INTEGER NOT NULL            -- unix seconds
);

CREATE TABLE objects (
    bucket_id           INTEGER NOT NULL REFERENCES buckets (id) ON DELETE RESTRICT,
    key                 TEXT    NOT NULL,
    sha256              TEXT    NOT NULL CHECK (length(sha256) = 64),
    size                INTEGER NOT NULL CHECK (size >= 0),
    content_type        TEXT,               -- NULL: guessed from the key's extension when served
    cache_control       TEXT,
    content_disposition TEXT,
    created_at          INTEGER NOT NULL,   -- unix seconds: first stored
    updated_at          INTEGER NOT NULL,   -- unix seconds: content or metadata last changed (Last-Modified)
    PRIMARY KEY (bucket_id, key)
) WITHOUT ROWID;

-- Reference counting of blobs and the start-up sweep look objects up by hash.
CREATE INDEX objects_by_sha256 ON objects (sha256);
