-- Credentials with several grants (`--grant BUCKET[/PREFIX]:SCOPE`, repeatable; `*` for every bucket). A
-- credential's grants are rows of token_grants or s3_key_grants, in the order given; a request is allowed when one
-- grant covers its bucket and key with the scope it needs. bucket_id NULL: every bucket (only `*:admin` and the
-- like name it). Deleting a bucket deletes its grants; `Store::delete_bucket` then deletes the credentials left
-- with none (as deleting a bucket deleted its one-bucket credentials before).
--
-- The columns tokens and s3_keys had for their one grant (bucket_id, prefix, scope) stay, for the release before
-- this one (the upgrade rule, docs/operations.md): this release writes there the credential's first grant that
-- names a bucket, or NULLs when it has none, which that release reads as an unknown credential (refused, never
-- widened). So they become nullable, their bucket's deletion sets NULL rather than deleting the credential, and a
-- row inserted with them set (by that release) gets them as its one grant. SQLite changes neither a column's
-- nullability nor a foreign key in place, so both tables are rebuilt (DROP TABLE runs no triggers).

CREATE TABLE tokens_0018 (
    id           TEXT    PRIMARY KEY,
    secret_hash  BLOB    NOT NULL,
    bucket_id    INTEGER REFERENCES buckets (id) ON DELETE SET NULL,   -- the first bucket grant (older releases)
    prefix       TEXT    DEFAULT '',
    scope        TEXT    CHECK (scope IN ('read', 'write', 'admin')),
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER,
    revoked_at   INTEGER
);
INSERT INTO tokens_0018 (id, secret_hash, bucket_id, prefix, scope, created_at, expires_at, revoked_at)
    SELECT id, secret_hash, bucket_id, prefix, scope, created_at, expires_at, revoked_at FROM tokens;
DROP TABLE tokens;
ALTER TABLE tokens_0018 RENAME TO tokens;
CREATE TRIGGER tokens_ins AFTER INSERT ON tokens BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('token', NEW.id);
END;
CREATE TRIGGER tokens_upd AFTER UPDATE ON tokens BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('token', OLD.id);
END;
CREATE TRIGGER tokens_del AFTER DELETE ON tokens BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('token', OLD.id);
END;

CREATE TABLE s3_keys_0018 (
    id          TEXT    PRIMARY KEY,
    secret      BLOB    NOT NULL CHECK (length(secret) > 44),
    bucket_id   INTEGER REFERENCES buckets (id) ON DELETE SET NULL,    -- the first bucket grant (older releases)
    prefix      TEXT    DEFAULT '',
    scope       TEXT    CHECK (scope IN ('read', 'write', 'admin')),
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    revoked_at  INTEGER
);
INSERT INTO s3_keys_0018 (id, secret, bucket_id, prefix, scope, created_at, expires_at, revoked_at)
    SELECT id, secret, bucket_id, prefix, scope, created_at, expires_at, revoked_at FROM s3_keys;
DROP TABLE s3_keys;
ALTER TABLE s3_keys_0018 RENAME TO s3_keys;
CREATE TRIGGER s3_keys_ins AFTER INSERT ON s3_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('s3_key', NEW.id);
END;
CREATE TRIGGER s3_keys_upd AFTER UPDATE ON s3_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('s3_key', OLD.id);
END;
CREATE TRIGGER s3_keys_del AFTER DELETE ON s3_keys BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('s3_key', OLD.id);
END;

CREATE TABLE token_grants (
    token_id   TEXT    NOT NULL REFERENCES tokens (id) ON DELETE CASCADE,
    position   INTEGER NOT NULL,                                        -- the order they were given in
    bucket_id  INTEGER REFERENCES buckets (id) ON DELETE CASCADE,       -- NULL: every bucket
    prefix     TEXT    NOT NULL DEFAULT '',
    scope      TEXT    NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    PRIMARY KEY (token_id, position)
);
CREATE INDEX token_grants_by_bucket ON token_grants (bucket_id);
CREATE TABLE s3_key_grants (
    key_id     TEXT    NOT NULL REFERENCES s3_keys (id) ON DELETE CASCADE,
    position   INTEGER NOT NULL,
    bucket_id  INTEGER REFERENCES buckets (id) ON DELETE CASCADE,
    prefix     TEXT    NOT NULL DEFAULT '',
    scope      TEXT    NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    PRIMARY KEY (key_id, position)
);
CREATE INDEX s3_key_grants_by_bucket ON s3_key_grants (bucket_id);

-- Every existing credential keeps its meaning: its one grant.
INSERT INTO token_grants (token_id, position, bucket_id, prefix, scope)
    SELECT id, 0, bucket_id, prefix, scope FROM tokens;
INSERT INTO s3_key_grants (key_id, position, bucket_id, prefix, scope)
    SELECT id, 0, bucket_id, prefix, scope FROM s3_keys;

-- A credential inserted with the one-grant columns set (by the release before this one) gets them as its grant.
-- This release inserts with them NULL, then sets them to its first bucket grant (an UPDATE, which this skips).
CREATE TRIGGER tokens_legacy_grant AFTER INSERT ON tokens WHEN NEW.bucket_id IS NOT NULL BEGIN
    INSERT INTO token_grants (token_id, position, bucket_id, prefix, scope)
        VALUES (NEW.id, 0, NEW.bucket_id, coalesce(NEW.prefix, ''), coalesce(NEW.scope, 'read'));
END;
CREATE TRIGGER s3_keys_legacy_grant AFTER INSERT ON s3_keys WHEN NEW.bucket_id IS NOT NULL BEGIN
    INSERT INTO s3_key_grants (key_id, position, bucket_id, prefix, scope)
        VALUES (NEW.id, 0, NEW.bucket_id, coalesce(NEW.prefix, ''), coalesce(NEW.scope, 'read'));
END;

-- A grant's change is its credential's: servers drop the cached credential.
CREATE TRIGGER token_grants_ins AFTER INSERT ON token_grants BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('token', NEW.token_id);
END;
CREATE TRIGGER token_grants_del AFTER DELETE ON token_grants BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('token', OLD.token_id);
END;
CREATE TRIGGER s3_key_grants_ins AFTER INSERT ON s3_key_grants BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('s3_key', NEW.key_id);
END;
CREATE TRIGGER s3_key_grants_del AFTER DELETE ON s3_key_grants BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('s3_key', OLD.key_id);
END;
