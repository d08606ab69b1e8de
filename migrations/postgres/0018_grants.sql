-- SQLite's 0018 (see it for the whole story): a credential's grants are rows of token_grants or s3_key_grants
-- (bucket_id NULL: every bucket); the one-grant columns of tokens and s3_keys stay for the release before this
-- one, nullable, set NULL when their bucket goes; a row inserted with them set gets them as its one grant.
ALTER TABLE tokens ALTER COLUMN bucket_id DROP NOT NULL, ALTER COLUMN prefix DROP NOT NULL,
    ALTER COLUMN scope DROP NOT NULL;
ALTER TABLE tokens DROP CONSTRAINT tokens_bucket_id_fkey,
    ADD CONSTRAINT tokens_bucket_id_fkey FOREIGN KEY (bucket_id) REFERENCES buckets (id) ON DELETE SET NULL;
ALTER TABLE s3_keys ALTER COLUMN bucket_id DROP NOT NULL, ALTER COLUMN prefix DROP NOT NULL,
    ALTER COLUMN scope DROP NOT NULL;
ALTER TABLE s3_keys DROP CONSTRAINT s3_keys_bucket_id_fkey,
    ADD CONSTRAINT s3_keys_bucket_id_fkey FOREIGN KEY (bucket_id) REFERENCES buckets (id) ON DELETE SET NULL;

CREATE TABLE token_grants (
    token_id   TEXT   COLLATE "C" NOT NULL REFERENCES tokens (id) ON DELETE CASCADE,
    position   BIGINT NOT NULL,
    bucket_id  BIGINT REFERENCES buckets (id) ON DELETE CASCADE,
    prefix     TEXT   NOT NULL DEFAULT '',
    scope      TEXT   NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    PRIMARY KEY (token_id, position)
);
CREATE INDEX token_grants_by_bucket ON token_grants (bucket_id);
CREATE TABLE s3_key_grants (
    key_id     TEXT   COLLATE "C" NOT NULL REFERENCES s3_keys (id) ON DELETE CASCADE,
    position   BIGINT NOT NULL,
    bucket_id  BIGINT REFERENCES buckets (id) ON DELETE CASCADE,
    prefix     TEXT   NOT NULL DEFAULT '',
    scope      TEXT   NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    PRIMARY KEY (key_id, position)
);
CREATE INDEX s3_key_grants_by_bucket ON s3_key_grants (bucket_id);

INSERT INTO token_grants (token_id, position, bucket_id, prefix, scope)
    SELECT id, 0, bucket_id, prefix, scope FROM tokens;
INSERT INTO s3_key_grants (key_id, position, bucket_id, prefix, scope)
    SELECT id, 0, bucket_id, prefix, scope FROM s3_keys;

CREATE FUNCTION tokens_legacy_grant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO token_grants (token_id, position, bucket_id, prefix, scope)
        VALUES (NEW.id, 0, NEW.bucket_id, coalesce(NEW.prefix, ''), coalesce(NEW.scope, 'read'));
    RETURN NULL;
END
$$;
CREATE TRIGGER tokens_legacy_grant AFTER INSERT ON tokens
    FOR EACH ROW WHEN (NEW.bucket_id IS NOT NULL) EXECUTE FUNCTION tokens_legacy_grant();
CREATE FUNCTION s3_keys_legacy_grant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO s3_key_grants (key_id, position, bucket_id, prefix, scope)
        VALUES (NEW.id, 0, NEW.bucket_id, coalesce(NEW.prefix, ''), coalesce(NEW.scope, 'read'));
    RETURN NULL;
END
$$;
CREATE TRIGGER s3_keys_legacy_grant AFTER INSERT ON s3_keys
    FOR EACH ROW WHEN (NEW.bucket_id IS NOT NULL) EXECUTE FUNCTION s3_keys_legacy_grant();

-- A grant's change is its credential's.
CREATE FUNCTION token_grants_log_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM cache_changes_append('token', NULL, NEW.token_id);
    ELSE
        PERFORM cache_changes_append('token', NULL, OLD.token_id);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER token_grants_changes AFTER INSERT OR DELETE ON token_grants
    FOR EACH ROW EXECUTE FUNCTION token_grants_log_change();
CREATE FUNCTION s3_key_grants_log_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM cache_changes_append('s3_key', NULL, NEW.key_id);
    ELSE
        PERFORM cache_changes_append('s3_key', NULL, OLD.key_id);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER s3_key_grants_changes AFTER INSERT OR DELETE ON s3_key_grants
    FOR EACH ROW EXECUTE FUNCTION s3_key_grants_log_change();
