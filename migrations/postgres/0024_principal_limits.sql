-- Limits on principals: SQLite's 0024 (see it for what each column means). Every change is logged (kind limit),
-- so servers reload the table.
CREATE TABLE principal_limits (
    subject_kind         TEXT   COLLATE "C" NOT NULL
                         CHECK (subject_kind IN ('default', 'anonymous', 'token', 's3-key', 'bucket')),
    subject_name         TEXT   COLLATE "C" NOT NULL,
    request_count        BIGINT CHECK (request_count > 0),
    request_period_secs  BIGINT CHECK (request_period_secs > 0),
    request_burst        BIGINT CHECK (request_burst > 0),
    read_bytes_per_sec   BIGINT CHECK (read_bytes_per_sec > 0),
    read_burst_bytes     BIGINT CHECK (read_burst_bytes > 0),
    write_bytes_per_sec  BIGINT CHECK (write_bytes_per_sec > 0),
    write_burst_bytes    BIGINT CHECK (write_burst_bytes > 0),
    concurrent           BIGINT CHECK (concurrent > 0),
    ipv4_prefix          BIGINT CHECK (ipv4_prefix BETWEEN 1 AND 32),
    ipv6_prefix          BIGINT CHECK (ipv6_prefix BETWEEN 1 AND 128),
    weight               BIGINT CHECK (weight BETWEEN 1 AND 1000),
    updated_at           BIGINT NOT NULL,
    PRIMARY KEY (subject_kind, subject_name)
);

CREATE FUNCTION principal_limits_log_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM cache_changes_append('limit', NULL, NEW.subject_kind || ':' || NEW.subject_name);
    ELSE
        PERFORM cache_changes_append('limit', NULL, OLD.subject_kind || ':' || OLD.subject_name);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER principal_limits_changes AFTER INSERT OR UPDATE OR DELETE ON principal_limits
    FOR EACH ROW EXECUTE FUNCTION principal_limits_log_change();
