-- S3 access keys (SigV4). The server must know the secret to verify a signature, so unlike a token's it cannot
-- be stored as a hash: it is sealed (src/store/sealing.rs, with 's3_key:' || id as associated data) under
-- signing-secrets.key, the key file kept beside the database and never in it. Scope, bucket and prefix follow
-- the token rules. Deleting the bucket deletes its keys (and logs each one, below).
CREATE TABLE s3_keys (
    id          TEXT    PRIMARY KEY,          -- the access key id, shown by `s3-key list`
    secret      BLOB    NOT NULL CHECK (length(secret) > 44),  -- sealed secret access key, never in the clear
    bucket_id   INTEGER NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    prefix      TEXT    NOT NULL DEFAULT '',  -- keys the access key may touch start with this
    scope       TEXT    NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,                      -- NULL: never
    revoked_at  INTEGER                       -- NULL: live
);

CREATE TRIGGER s3_keys_ins AFTER INSERT ON s3_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('s3_key', NEW.id);
END;
CREATE TRIGGER s3_keys_upd AFTER UPDATE ON s3_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('s3_key', OLD.id);
END;
CREATE TRIGGER s3_keys_del AFTER DELETE ON s3_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('s3_key', OLD.id);
END;
