-- S3 multipart uploads (issue 15). An upload and its parts are private until CompleteMultipartUpload, which
-- assembles the parts into one content-addressed blob and commits the object like any put, deleting the upload
-- in the same transaction. No server caches these tables, so they log no cache changes.
CREATE TABLE multipart_uploads (
    id                  TEXT    PRIMARY KEY,  -- opaque to clients; hex of the creation time first, so ids sort by age
    bucket_id           INTEGER NOT NULL REFERENCES buckets (id) ON DELETE CASCADE,
    key                 TEXT    NOT NULL,
    content_type        TEXT,                 -- the object's attributes, given at CreateMultipartUpload
    cache_control       TEXT,
    content_disposition TEXT,
    created_at          INTEGER NOT NULL      -- unix seconds
) WITHOUT ROWID;

-- ListMultipartUploads: by key, then by age (the id), under a prefix.
CREATE INDEX multipart_uploads_by_key ON multipart_uploads (bucket_id, key, id);

-- Each part's bytes are a staged file `<data_dir>/parts/<staged_name>`, written and fsynced before its row. A file
-- that no row names is left over from a crash or a replaced part, and the start-up sweep removes it.
CREATE TABLE multipart_parts (
    upload_id   TEXT    NOT NULL REFERENCES multipart_uploads (id) ON DELETE CASCADE,
    part_number INTEGER NOT NULL CHECK (part_number BETWEEN 1 AND 10000),
    size        INTEGER NOT NULL CHECK (size >= 0),
    staged_name TEXT    NOT NULL UNIQUE,
    md5         TEXT    NOT NULL CHECK (length(md5) = 32),     -- hex; the part's ETag is it, quoted
    sha256      TEXT    NOT NULL CHECK (length(sha256) = 64),
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (upload_id, part_number)
) WITHOUT ROWID;

-- The S3 ETag of an object that CompleteMultipartUpload committed ("<md5 of the part md5s>-<parts>"), for the
-- content `sha256` only: a row whose hash is not the object's current one no longer describes it, and the triggers
-- below remove it when the object's content changes or the object goes. Objects without a row have the native
-- ETag (their SHA-256).
CREATE TABLE object_s3_etags (
    bucket_id  INTEGER NOT NULL,
    key        TEXT    NOT NULL,
    sha256     TEXT    NOT NULL CHECK (length(sha256) = 64),
    etag       TEXT    NOT NULL,
    PRIMARY KEY (bucket_id, key),
    FOREIGN KEY (bucket_id, key) REFERENCES objects (bucket_id, key) ON DELETE CASCADE
) WITHOUT ROWID;

CREATE TRIGGER object_s3_etags_stale AFTER UPDATE OF sha256 ON objects WHEN OLD.sha256 <> NEW.sha256 BEGIN
    DELETE FROM object_s3_etags WHERE bucket_id = OLD.bucket_id AND key = OLD.key;
END;

-- A server may serve the S3 ETag with the object's cached headers: a change evicts the object's entry.
CREATE TRIGGER object_s3_etags_ins AFTER INSERT ON object_s3_etags BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', NEW.bucket_id, NEW.key);
END;
CREATE TRIGGER object_s3_etags_upd AFTER UPDATE ON object_s3_etags BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', NEW.bucket_id, NEW.key);
END;
CREATE TRIGGER object_s3_etags_del AFTER DELETE ON object_s3_etags BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('object', OLD.bucket_id, OLD.key);
END;
