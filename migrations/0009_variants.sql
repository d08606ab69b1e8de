-- Precompressed variants of an object (issue 16): the same content in another Content-Encoding, stored as a
-- content-addressed blob like any other. A variant is part of its object: it is written and removed with the
-- object row, in the same write transaction, and its blob counts as a reference like an object's.
CREATE TABLE object_variants (
    bucket_id  INTEGER NOT NULL,
    key        TEXT    NOT NULL,
    encoding   TEXT    NOT NULL CHECK (encoding IN ('br', 'gzip')),
    sha256     TEXT    NOT NULL CHECK (length(sha256) = 64),
    size       INTEGER NOT NULL CHECK (size >= 0),
    PRIMARY KEY (bucket_id, key, encoding),
    FOREIGN KEY (bucket_id, key) REFERENCES objects (bucket_id, key) ON DELETE RESTRICT
) WITHOUT ROWID;

-- Reference counting of blobs and the start-up sweep look variants up by hash.
CREATE INDEX object_variants_by_sha256 ON object_variants (sha256);

-- A running server caches the variants with the object entry, so a variant change evicts that entry.
CREATE TRIGGER object_variants_ins AFTER INSERT ON object_variants BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', NEW.bucket_id, NEW.key);
END;
CREATE TRIGGER object_variants_upd AFTER UPDATE ON object_variants BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', OLD.bucket_id, OLD.key);
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', NEW.bucket_id, NEW.key);
END;
CREATE TRIGGER object_variants_del AFTER DELETE ON object_variants BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', OLD.bucket_id, OLD.key);
END;
