-- Bearer tokens. Only the SHA-256 of a token is stored; the token itself is shown once at creation.
CREATE TABLE tokens (
    id           TEXT    PRIMARY KEY,          -- public id, part of the token, shown by `token list`
    secret_hash  BLOB    NOT NULL,             -- SHA-256 of the whole token string
    bucket_id    INTEGER NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    prefix       TEXT    NOT NULL DEFAULT '',  -- keys the token may touch start with this
    scope        TEXT    NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER,                      -- NULL: never
    revoked_at   INTEGER                       -- NULL: live
);

-- HMAC keys for signed URLs, by id so that a new key can be rotated in while old links keep verifying until
-- their key is retired.
CREATE TABLE signing_keys (
    id          TEXT    PRIMARY KEY,
    secret      BLOB    NOT NULL CHECK (length(secret) = 32),
    created_at  INTEGER NOT NULL,
    retired_at  INTEGER                        -- NULL: signs (newest) and verifies
);

-- Individually revoked signed URLs, kept until they would have expired anyway.
CREATE TABLE revoked_signatures (
    signature   TEXT    PRIMARY KEY,
    expires_at  INTEGER NOT NULL,
    revoked_at  INTEGER NOT NULL
);
