-- S3 multipart uploads: SQLite's 0011 (see it for what each column means). Uploads and parts are cached by no
-- server, so they log nothing; the S3 ETag of a completed object is served with the object's cached headers, so
-- its changes log the object (kind object), as SQLite's triggers do. Integers are BIGINT, as in 0001.
CREATE TABLE multipart_uploads (
    id                  TEXT   COLLATE "C" PRIMARY KEY,
    bucket_id           BIGINT NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    key                 TEXT   COLLATE "C" NOT NULL,
    content_type        TEXT,
    cache_control       TEXT,
    content_disposition TEXT,
    created_at          BIGINT NOT NULL
);
CREATE INDEX multipart_uploads_by_key ON multipart_uploads (bucket_id, key, id);

CREATE TABLE multipart_parts (
    upload_id   TEXT   COLLATE "C" NOT NULL REFERENCES multipart_uploads (id) ON DELETE CASCADE,
    part_number BIGINT NOT NULL CHECK (part_number BETWEEN 1 AND 10000),
    size        BIGINT NOT NULL CHECK (size >= 0),
    staged_name TEXT   COLLATE "C" NOT NULL UNIQUE,
    md5         TEXT   NOT NULL CHECK (length(md5) = 32),
    sha256      TEXT   NOT NULL CHECK (length(sha256) = 64),
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (upload_id, part_number)
);

CREATE TABLE object_s3_etags (
    bucket_id  BIGINT NOT NULL,
    key        TEXT   COLLATE "C" NOT NULL,
    sha256     TEXT   NOT NULL CHECK (length(sha256) = 64),
    etag       TEXT   NOT NULL,
    PRIMARY KEY (bucket_id, key),
    FOREIGN KEY (bucket_id, key) REFERENCES objects (bucket_id, key) ON DELETE CASCADE
);

-- An ETag row describes one content only: a new content drops it.
CREATE FUNCTION object_s3_etags_drop_stale() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM object_s3_etags WHERE bucket_id = OLD.bucket_id AND key = OLD.key;
    RETURN NULL;
END
$$;
CREATE TRIGGER object_s3_etags_stale AFTER UPDATE OF sha256 ON objects
    FOR EACH ROW WHEN (OLD.sha256 <> NEW.sha256) EXECUTE FUNCTION object_s3_etags_drop_stale();

-- As SQLite's triggers: one row per change, the new row's for an insert or update, the old one's for a delete.
CREATE FUNCTION object_s3_etags_log_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM cache_changes_append('object', OLD.bucket_id, OLD.key);
    ELSE
        PERFORM cache_changes_append('object', NEW.bucket_id, NEW.key);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER object_s3_etags_changes AFTER INSERT OR UPDATE OR DELETE ON object_s3_etags
    FOR EACH ROW EXECUTE FUNCTION object_s3_etags_log_change();
