-- S3 access keys: SQLite's 0010 (see it for what each column means). The secret is sealed under
-- signing-secrets.key, never in the clear; deleting the bucket deletes its keys, and every change is logged
-- (kind s3_key, the key's id) so servers drop what they cached.
CREATE TABLE s3_keys (
    id          TEXT   COLLATE "C" PRIMARY KEY,
    secret      BYTEA  NOT NULL CHECK (length(secret) > 44),
    bucket_id   BIGINT NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    prefix      TEXT   NOT NULL DEFAULT '',
    scope       TEXT   NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT,
    revoked_at  BIGINT
);

-- As SQLite's triggers: an insert logs the new row's id, an update or delete the old one's.
CREATE FUNCTION s3_keys_log_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM cache_changes_append('s3_key', NULL, NEW.id);
    ELSE
        PERFORM cache_changes_append('s3_key', NULL, OLD.id);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER s3_keys_changes AFTER INSERT OR UPDATE OR DELETE ON s3_keys
    FOR EACH ROW EXECUTE FUNCTION s3_keys_log_change();
