-- A log of changes to everything the server caches in memory. Triggers append to it, so every writer is
-- covered: the server itself, the CLI, or someone with the sqlite3 shell. A running server reads the rows
-- after the last sequence number it applied and evicts exactly those cache entries.
CREATE TABLE cache_changes (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    kind       TEXT    NOT NULL,   -- bucket | object | token | signing_key | revoked_signature
    bucket_id  INTEGER,            -- for objects
    name       TEXT    NOT NULL    -- bucket name, object key, token id, key id or signature
);

CREATE TRIGGER buckets_ins AFTER INSERT ON buckets BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('bucket', NEW.name);
END;
CREATE TRIGGER buckets_upd AFTER UPDATE ON buckets BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('bucket', OLD.name);
    INSERT INTO cache_changes (kind, name) VALUES ('bucket', NEW.name);
END;
CREATE TRIGGER buckets_del AFTER DELETE ON buckets BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('bucket', OLD.name);
END;

CREATE TRIGGER objects_ins AFTER INSERT ON objects BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', NEW.bucket_id, NEW.key);
END;
CREATE TRIGGER objects_upd AFTER UPDATE ON objects BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', OLD.bucket_id, OLD.key);
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', NEW.bucket_id, NEW.key);
END;
CREATE TRIGGER objects_del AFTER DELETE ON objects BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', OLD.bucket_id, OLD.key);
END;

CREATE TRIGGER tokens_ins AFTER INSERT ON tokens BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('token', NEW.id);
END;
CREATE TRIGGER tokens_upd AFTER UPDATE ON tokens BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('token', OLD.id);
END;
CREATE TRIGGER tokens_del AFTER DELETE ON tokens BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('token', OLD.id);
END;

CREATE TRIGGER signing_keys_ins AFTER INSERT ON signing_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('signing_key', NEW.id);
END;
CREATE TRIGGER signing_keys_upd AFTER UPDATE ON signing_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('signing_key', OLD.id);
END;
CREATE TRIGGER signing_keys_del AFTER DELETE ON signing_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('signing_key', OLD.id);
END;

CREATE TRIGGER revoked_signatures_ins AFTER INSERT ON revoked_signatures BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('revoked_signature', NEW.signature);
END;
