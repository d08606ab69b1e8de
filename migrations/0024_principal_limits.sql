-- Limits on principals (`blobgate limits`): on a token, an S3 key, a bucket, anonymous clients or everyone by
-- default; src/throttle.rs says what each allows and how a request is covered. A column left NULL does not limit.
-- No reference to the principal's row: `limits set` checks that it exists, and a limit outlives a deleted one (a
-- bucket made again under the same name is limited again). Every change is logged (kind limit), so each server
-- reloads the table at its next request.
CREATE TABLE principal_limits (
    subject_kind         TEXT    NOT NULL CHECK (subject_kind IN ('default', 'anonymous', 'token', 's3-key', 'bucket')),
    subject_name         TEXT    NOT NULL,      -- token id, access key id or bucket name; '' for default, anonymous
    request_count        INTEGER CHECK (request_count > 0),   -- requests per request_period_secs
    request_period_secs  INTEGER CHECK (request_period_secs > 0),
    request_burst        INTEGER CHECK (request_burst > 0),   -- NULL: request_count
    read_bytes_per_sec   INTEGER CHECK (read_bytes_per_sec > 0),
    read_burst_bytes     INTEGER CHECK (read_burst_bytes > 0),
    write_bytes_per_sec  INTEGER CHECK (write_bytes_per_sec > 0),
    write_burst_bytes    INTEGER CHECK (write_burst_bytes > 0),
    concurrent           INTEGER CHECK (concurrent > 0),
    ipv4_prefix          INTEGER CHECK (ipv4_prefix BETWEEN 1 AND 32),    -- anonymous: bits that make one client
    ipv6_prefix          INTEGER CHECK (ipv6_prefix BETWEEN 1 AND 128),
    weight               INTEGER CHECK (weight BETWEEN 1 AND 1000),  -- share of a saturated worker; NULL: 1
    updated_at           INTEGER NOT NULL,
    PRIMARY KEY (subject_kind, subject_name)
);

CREATE TRIGGER principal_limits_ins AFTER INSERT ON principal_limits BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('limit', NEW.subject_kind || ':' || NEW.subject_name);
END;
CREATE TRIGGER principal_limits_upd AFTER UPDATE ON principal_limits BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('limit', OLD.subject_kind || ':' || OLD.subject_name);
END;
CREATE TRIGGER principal_limits_del AFTER DELETE ON principal_limits BEGIN
    INSERT INTO cache_changes (kind, name) VALUES ('limit', OLD.subject_kind || ':' || OLD.subject_name);
END;
