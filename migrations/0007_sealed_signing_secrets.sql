-- Signing-key secrets are stored sealed (src/auth/sealing.rs: 'bgs1', a 24-byte nonce, the 32-byte secret
-- encrypted, a 16-byte tag: 76 bytes) under a key kept outside the database. Rows from before keep their 32 raw
-- bytes until `Store::open` seals them. SQLite cannot change a CHECK, so the table is rebuilt (with its triggers);
-- secure_delete zeroes the old table's pages, so the plaintext does not linger in free pages.
PRAGMA secure_delete = ON;

CREATE TABLE signing_keys_sealed (
    id          TEXT    PRIMARY KEY,
    secret      BLOB    NOT NULL CHECK (length(secret) IN (32, 76)),
    created_at  INTEGER NOT NULL,
    retired_at  INTEGER                        -- NULL: signs (newest) and verifies
);
INSERT INTO signing_keys_sealed (id, secret, created_at, retired_at)
    SELECT id, secret, created_at, retired_at FROM signing_keys ORDER BY rowid;
DROP TABLE signing_keys;
ALTER TABLE signing_keys_sealed RENAME TO signing_keys;

CREATE TRIGGER signing_keys_ins AFTER INSERT ON signing_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('signing_key', NEW.id);
END;
CREATE TRIGGER signing_keys_upd AFTER UPDATE ON signing_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('signing_key', OLD.id);
END;
CREATE TRIGGER signing_keys_del AFTER DELETE ON signing_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('signing_key', OLD.id);
END;

PRAGMA secure_delete = OFF;
