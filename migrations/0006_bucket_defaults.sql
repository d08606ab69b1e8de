-- A bucket's default Cache-Control, served for its objects that store none. NULL: no default.
ALTER TABLE buckets ADD COLUMN default_cache_control TEXT;

-- Bucket changes now carry the bucket's id: objects are cached with headers that depend on their bucket (the
-- default above), so a server evicts that bucket's cached objects too. On insert and delete the id also clears
-- entries left under an id that SQLite reuses for a new bucket.
DROP TRIGGER buckets_ins;
DROP TRIGGER buckets_upd;
DROP TRIGGER buckets_del;
CREATE TRIGGER buckets_ins AFTER INSERT ON buckets BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('bucket', NEW.id, NEW.name);
END;
CREATE TRIGGER buckets_upd AFTER UPDATE ON buckets BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('bucket', OLD.id, OLD.name);
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('bucket', NEW.id, NEW.name);
END;
CREATE TRIGGER buckets_del AFTER DELETE ON buckets BEGIN
    INSERT INTO cache_changes (kind, bucket_id, name) VALUES ('bucket', OLD.id, OLD.name);
END;
