//! Prometheus series: every name is defined here, with the `blobgate_` prefix, and every label has a small,
//! fixed set of values (status class, response kind). Per-object figures never become labels; they go to the
//! database instead.
//!
//! Handles are registered once and kept, so the send path pays an atomic add per sendfile call, not a lookup.

pub mod downloads;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use http::StatusCode;
use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::stats::{Counters, DownloadRecord, Outcome, RecordKind};

pub const SENT_BYTES: &str = "blobgate_sent_bytes_total";
pub const SENDFILE_CALLS: &str = "blobgate_sendfile_calls_total";
pub const RESPONSES: &str = "blobgate_responses_total";
pub const OPEN_CONNECTIONS: &str = "blobgate_open_connections";
pub const ACTIVE_DOWNLOADS: &str = "blobgate_active_downloads";
pub const TRUNCATED: &str = "blobgate_truncated_responses_total";
pub const ABORTED: &str = "blobgate_aborted_responses_total";
pub const STALLED: &str = "blobgate_stalled_responses_total";
pub const ACCEPT_ERRORS: &str = "blobgate_accept_errors_total";
pub const BLOB_OPEN_ERRORS: &str = "blobgate_blob_open_errors_total";
pub const AUTH_FAILURES: &str = "blobgate_auth_failures_total";
pub const COLD_CHUNKS: &str = "blobgate_cold_chunks_total";
pub const RESPONSE_SECONDS: &str = "blobgate_response_duration_seconds";
pub const STATS_DROPPED: &str = "blobgate_stats_records_dropped_total";
pub const STATS_LAG: &str = "blobgate_stats_batch_lag_seconds";
pub const STATS_FLUSH_ERRORS: &str = "blobgate_stats_flush_errors_total";
pub const STATS_BATCHES_WRITTEN: &str = "blobgate_stats_batches_written_total";
pub const STATS_OBJECT_DAYS_WRITTEN: &str = "blobgate_stats_object_days_written_total";
pub const IDLE_RECLAIMED: &str = "blobgate_idle_connections_reclaimed_total";
pub const PER_IP_REFUSED: &str = "blobgate_per_ip_refused_connections_total";
pub const THROTTLED_REQUESTS: &str = "blobgate_throttled_requests_total";
pub const PACED_BYTES: &str = "blobgate_paced_bytes_total";
pub const UPLOADS_REFUSED: &str = "blobgate_uploads_refused_total";
pub const MULTIPART_EXPIRED: &str = "blobgate_multipart_uploads_expired_total";
pub const MULTIPART_PARTS_REFUSED: &str = "blobgate_multipart_parts_refused_total";
pub const UPLOAD_BODY_TIMEOUTS: &str = "blobgate_upload_body_timeouts_total";
pub const UPLOADS_IN_PROGRESS: &str = "blobgate_uploads_in_progress";
pub const UPLOADS_WAITING: &str = "blobgate_uploads_waiting";
pub const ACCESS_LOG_DROPPED: &str = "blobgate_access_log_dropped_total";
pub const DATABASE_UP: &str = "blobgate_database_up";
pub const CACHE_SYNC_AGE: &str = "blobgate_cache_sync_age_seconds";
pub const STATS_BUFFER_DROPPED: &str = "blobgate_stats_buffer_dropped_total";
pub const STATS_PENDING: &str = "blobgate_stats_pending_objects";
pub const UPLOADS: &str = "blobgate_uploads_total";
pub const UPLOAD_BYTES: &str = "blobgate_upload_bytes_total";
pub const TLS_CONNECTIONS: &str = "blobgate_tls_connections_total";
pub const TLS_HANDSHAKE_FAILURES: &str = "blobgate_tls_handshake_failures_total";
pub const TLS_KEY_UPDATE_CLOSES: &str = "blobgate_tls_key_update_closes_total";
pub const TLS_CERTIFICATE_EXPIRY: &str = "blobgate_tls_certificate_expiry_timestamp_seconds";
pub const BLOB_CACHE_BYTES: &str = "blobgate_blob_cache_bytes";
pub const BLOB_CACHE_HITS: &str = "blobgate_blob_cache_hits_total";
pub const BLOB_CACHE_MISSES: &str = "blobgate_blob_cache_misses_total";
pub const BLOB_STORE_FETCHED: &str = "blobgate_blob_store_bytes_fetched_total";
pub const BLOB_STORE_CORRUPT: &str = "blobgate_blob_store_corrupt_total";
pub const BLOB_CACHE_QUARANTINED: &str = "blobgate_blob_cache_quarantined";
pub const BLOB_CACHE_ENTRIES: &str = "blobgate_blob_cache_entries";
pub const BLOB_CACHE_OPEN_FILES: &str = "blobgate_blob_cache_open_files";
pub const BLOB_STORE_REQUEST_SECONDS: &str = "blobgate_blob_store_request_duration_seconds";
pub const BLOB_STORE_BREAKER_STATE: &str = "blobgate_blob_store_breaker_state";
pub const BLOB_STORE_BREAKER_OPEN: &str = "blobgate_blob_store_breaker_open";
pub const BLOB_STORE_BREAKER_REFUSED: &str = "blobgate_blob_store_breaker_refused_total";

/// `mode` of `blobgate_tls_connections_total`: who encrypts the connection's records after the handshake.
pub const TLS_MODES: [&str; 2] = ["ktls", "userspace"];

/// The `api` label of `blobgate_uploads_total`: which front end took the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadApi {
    Native,
    S3,
}

impl UploadApi {
    fn label(self) -> &'static str {
        match self {
            UploadApi::Native => "native",
            UploadApi::S3 => "s3",
        }
    }
}

/// The `result` label of `blobgate_uploads_total`: stored, refused (a 4xx: the client's doing, such as a failed
/// condition, a bad digest, a size limit or a stalled body) or failed (a 5xx: ours, or the database's).
const UPLOAD_RESULTS: [&str; 3] = ["stored", "refused", "failed"];

/// The `limit` label of `MULTIPART_PARTS_REFUSED`: the `limits.*` setting that refused the part.
const PART_LIMITS: [&str; 3] = ["max_upload_bytes", "max_object_bytes", "max_unfinished_upload_bytes_per_key"];
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
const KINDS: [&str; 6] = ["full", "range", "multipart", "not_modified", "head", "other"];
const OTHER_KIND: usize = 5;

/// Installs the process-wide Prometheus recorder once and returns its render handle.
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets(&[0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0])
                .expect("bucket list is non-empty")
                .install_recorder()
                .expect("no other metrics recorder is installed");
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(SENT_BYTES, Unit::Bytes, "Object bytes handed to sockets, summed from sendfile return values.");
    describe_counter!(SENDFILE_CALLS, "sendfile(2) calls that moved bytes.");
    describe_counter!(
        RESPONSES,
        "Responses written on the data listener, and downloads on the admin listener, by status class and kind."
    );
    describe_gauge!(OPEN_CONNECTIONS, "Open data connections.");
    describe_gauge!(ACTIVE_DOWNLOADS, "File responses currently being sent.");
    describe_counter!(TRUNCATED, "File responses cut short because the blob shrank (never padded).");
    describe_counter!(ABORTED, "File responses cut short because the client went away.");
    describe_counter!(STALLED, "File responses dropped after the send-progress timeout.");
    describe_counter!(ACCEPT_ERRORS, "accept(2) failures from resource exhaustion (EMFILE, ENFILE, ...).");
    describe_counter!(BLOB_OPEN_ERRORS, "Blobs that were missing or unreadable when a request opened them.");
    describe_counter!(AUTH_FAILURES, "Refused credentials, by reason.");
    describe_counter!(
        COLD_CHUNKS,
        "sendfile chunks that were not in the page cache and were sent from the blocking pool."
    );
    describe_counter!(STATS_DROPPED, "Download records dropped because the stats channel was full.");
    describe_gauge!(STATS_LAG, Unit::Seconds, "Age of the oldest record in the last stats batch written.");
    describe_counter!(STATS_FLUSH_ERRORS, "Failed writes of a stats batch (retried).");
    describe_counter!(STATS_BATCHES_WRITTEN, "Stats batches written (each one write transaction).");
    describe_counter!(STATS_OBJECT_DAYS_WRITTEN, "Object-days (stats ledger rows) the written stats batches held.");
    describe_counter!(IDLE_RECLAIMED, "Idle data connections closed at the connection cap to admit new clients.");
    describe_counter!(PER_IP_REFUSED, "Data connections refused (503) beyond limits.max_connections_per_ip.");
    describe_counter!(
        PACED_BYTES,
        "Bytes sent (read) or received (write) under a bandwidth limit on principals, by direction and the scope \
         of the limit (token, s3-key, bucket, anonymous, default)."
    );
    describe_counter!(
        THROTTLED_REQUESTS,
        "Requests refused by a limit on principals (`blobgate limits`), by limit (requests, concurrent), scope \
         (token, s3-key, bucket, anonymous, default) and principal (named only for a limit set on it)."
    );
    describe_counter!(
        UPLOADS_REFUSED,
        "Uploads refused (503) beyond limits.max_concurrent_uploads, after waiting timeouts.upload_queue."
    );
    describe_counter!(MULTIPART_EXPIRED, "S3 multipart uploads aborted past timeouts.multipart_upload_expiry.");
    describe_counter!(
        MULTIPART_PARTS_REFUSED,
        "UploadPart and UploadPartCopy requests refused by a limits.* bound, by the limit (the setting's name)."
    );
    describe_counter!(ACCESS_LOG_DROPPED, "Access log lines dropped because the log writer was behind.");
    describe_counter!(
        UPLOAD_BODY_TIMEOUTS,
        "Uploads ended (408) because the body sent nothing for timeouts.body_idle or fell below limits.min_upload_rate."
    );
    describe_gauge!(UPLOADS_IN_PROGRESS, "Uploads holding one of the limits.max_concurrent_uploads places.");
    describe_gauge!(UPLOADS_WAITING, "Uploads waiting (up to timeouts.upload_queue) for an upload place.");
    describe_histogram!(RESPONSE_SECONDS, Unit::Seconds, "File responses, from head written to last byte sent.");
    describe_gauge!(DATABASE_UP, "1 while the last readiness probe (SELECT 1) of the metadata database answered.");
    describe_gauge!(
        CACHE_SYNC_AGE,
        "Seconds since the caches last synced with the database; past database.max_staleness requests are refused."
    );
    describe_counter!(
        STATS_BUFFER_DROPPED,
        "Download records dropped because the stats buffer (limits.stats_buffer_objects) was full while writes failed."
    );
    describe_gauge!(STATS_PENDING, "Object-days whose download counts wait to be written.");
    describe_counter!(
        UPLOADS,
        "Requests that carried object bytes (native PUT, S3 PutObject and UploadPart), by API and result."
    );
    describe_gauge!(
        BLOB_CACHE_BYTES,
        Unit::Bytes,
        "Bytes of object-store blobs in the local cache (and being fetched)."
    );
    describe_counter!(BLOB_CACHE_HITS, "Reads that sent bytes all in the blob cache (with an object store).");
    describe_counter!(BLOB_CACHE_MISSES, "Reads that needed slices fetched from the object store.");
    describe_counter!(BLOB_STORE_FETCHED, Unit::Bytes, "Bytes fetched from the object store into the blob cache.");
    describe_counter!(
        BLOB_STORE_CORRUPT,
        "Object-store copies of blobs that failed their check (a slice against its manifest, or the whole blob): each quarantined once, never served."
    );
    describe_gauge!(BLOB_CACHE_QUARANTINED, "Blobs refused (503) until their object-store copy changes.");
    describe_gauge!(BLOB_CACHE_ENTRIES, "Blobs with an entry in the blob cache.");
    describe_gauge!(BLOB_CACHE_OPEN_FILES, "Blob cache files held open (bounded by cache.max_open_files).");
    describe_histogram!(
        BLOB_STORE_REQUEST_SECONDS,
        Unit::Seconds,
        "Object-store calls, by operation (get, head, put, delete, list); a get until its last byte."
    );
    describe_gauge!(BLOB_STORE_BREAKER_STATE, "The object store's circuit breaker: 0 closed, 1 half-open, 2 open.");
    describe_gauge!(BLOB_STORE_BREAKER_OPEN, "1 while the object store's circuit breaker fails calls at once, else 0.");
    describe_counter!(
        BLOB_STORE_BREAKER_REFUSED,
        "Object-store calls failed at once (503) by the open circuit breaker."
    );
    describe_counter!(UPLOAD_BYTES, Unit::Bytes, "Object bytes stored by uploads (body bytes, after decoding).");
    describe_counter!(TLS_CONNECTIONS, "HTTPS connections past their handshake, by who encrypts their records.");
    describe_counter!(TLS_HANDSHAKE_FAILURES, "TLS handshakes that did not finish, by reason.");
    describe_gauge!(
        TLS_CERTIFICATE_EXPIRY,
        Unit::Seconds,
        "notAfter of the served TLS certificate (the chain's first), as a Unix time; set at start and each reload."
    );
    describe_counter!(
        TLS_KEY_UPDATE_CLOSES,
        "Kernel-TLS connections closed at a TLS 1.3 KeyUpdate the kernel could not follow."
    );
}

/// Registers every series (counters at 0, gauges at their resting value) so that `/metrics` lists each one from
/// start-up: a dashboard or an alert on `rate(x[5m])` must not see "no data" until the first event.
/// `auth_failure_reasons` are the `reason` labels of `blobgate_auth_failures_total` (`auth::FailureReason`).
pub fn register_all(
    auth_failure_reasons: impl IntoIterator<Item = &'static str>,
    tls_failure_reasons: impl IntoIterator<Item = &'static str>,
) {
    for name in [
        SENT_BYTES,
        SENDFILE_CALLS,
        TRUNCATED,
        ABORTED,
        STALLED,
        ACCEPT_ERRORS,
        BLOB_OPEN_ERRORS,
        COLD_CHUNKS,
        STATS_DROPPED,
        STATS_FLUSH_ERRORS,
        STATS_BATCHES_WRITTEN,
        STATS_OBJECT_DAYS_WRITTEN,
        IDLE_RECLAIMED,
        PER_IP_REFUSED,
        UPLOADS_REFUSED,
        MULTIPART_EXPIRED,
        UPLOAD_BODY_TIMEOUTS,
        ACCESS_LOG_DROPPED,
        STATS_BUFFER_DROPPED,
        UPLOAD_BYTES,
        TLS_KEY_UPDATE_CLOSES,
        BLOB_CACHE_HITS,
        BLOB_CACHE_MISSES,
        BLOB_STORE_FETCHED,
        BLOB_STORE_CORRUPT,
        BLOB_STORE_BREAKER_REFUSED,
    ] {
        counter!(name).increment(0);
    }
    for class in CLASSES {
        for kind in KINDS {
            counter!(RESPONSES, "class" => class, "kind" => kind).increment(0);
        }
    }
    for reason in auth_failure_reasons {
        counter!(AUTH_FAILURES, "reason" => reason).increment(0);
    }
    for reason in tls_failure_reasons {
        counter!(TLS_HANDSHAKE_FAILURES, "reason" => reason).increment(0);
    }
    for mode in TLS_MODES {
        counter!(TLS_CONNECTIONS, "mode" => mode).increment(0);
    }
    for limit in PART_LIMITS {
        counter!(MULTIPART_PARTS_REFUSED, "limit" => limit).increment(0);
    }
    // The unnamed scopes, at 0; a named principal's series appears at its first refusal.
    for direction in ["read", "write"] {
        for scope in PACED_SCOPES {
            counter!(PACED_BYTES, "direction" => direction, "scope" => scope).increment(0);
        }
    }
    for limit in ["requests", "concurrent"] {
        for scope in ["default", "anonymous"] {
            counter!(THROTTLED_REQUESTS, "limit" => limit, "scope" => scope, "principal" => "").increment(0);
        }
    }
    for api in [UploadApi::Native, UploadApi::S3] {
        for result in UPLOAD_RESULTS {
            counter!(UPLOADS, "api" => api.label(), "result" => result).increment(0);
        }
    }
    for name in [
        OPEN_CONNECTIONS,
        ACTIVE_DOWNLOADS,
        UPLOADS_IN_PROGRESS,
        UPLOADS_WAITING,
        STATS_PENDING,
        STATS_LAG,
        BLOB_CACHE_BYTES,
        BLOB_CACHE_QUARANTINED,
        BLOB_CACHE_ENTRIES,
        BLOB_CACHE_OPEN_FILES,
        BLOB_STORE_BREAKER_STATE,
        BLOB_STORE_BREAKER_OPEN,
    ] {
        gauge!(name).increment(0.0);
    }
    gauge!(CACHE_SYNC_AGE).set(0.0);
    // A registered histogram is listed (empty) from the first scrape.
    for operation in crate::store::remote::StoreOperation::ALL {
        let _ = histogram!(BLOB_STORE_REQUEST_SECONDS, "op" => operation.label());
    }
}

/// Copies the blob cache's counters into their series (at each scrape: the cache counts in plain atomics).
pub fn blob_cache_snapshot(cache: &crate::store::BlobCache) {
    use std::sync::atomic::Ordering::Relaxed;
    let c = cache.counters();
    gauge!(BLOB_CACHE_BYTES).set(c.bytes.load(Relaxed) as f64);
    counter!(BLOB_CACHE_HITS).absolute(c.hits.load(Relaxed));
    counter!(BLOB_CACHE_MISSES).absolute(c.misses.load(Relaxed));
    counter!(BLOB_STORE_FETCHED).absolute(c.fetched_bytes.load(Relaxed));
    counter!(BLOB_STORE_CORRUPT).absolute(c.corrupt.load(Relaxed));
    gauge!(BLOB_CACHE_QUARANTINED).set(c.quarantined.load(Relaxed) as f64);
    let (entries, open_files) = cache.entry_counts();
    gauge!(BLOB_CACHE_ENTRIES).set(entries as f64);
    gauge!(BLOB_CACHE_OPEN_FILES).set(open_files as f64);
    let remote = cache.remote();
    let state = remote.breaker_state();
    gauge!(BLOB_STORE_BREAKER_STATE).set(f64::from(state.gauge()));
    let open = matches!(state, crate::store::remote::breaker::BreakerState::Open);
    gauge!(BLOB_STORE_BREAKER_OPEN).set(if open { 1.0 } else { 0.0 });
    counter!(BLOB_STORE_BREAKER_REFUSED).absolute(remote.refused_calls());
}

/// One object-store call of `operation` took `took` (the store's client reports each, see `RemoteBlobs::observe_calls`).
pub fn blob_store_call(operation: crate::store::remote::StoreOperation, took: std::time::Duration) {
    histogram!(BLOB_STORE_REQUEST_SECONDS, "op" => operation.label()).record(took.as_secs_f64());
}

/// One request that carried object bytes ended with `status`; `stored_bytes` is what it stored (0 unless stored).
pub fn upload_finished(api: UploadApi, status: StatusCode, stored_bytes: u64) {
    let result = match status.as_u16() {
        200..=299 => "stored",
        400..=499 => "refused",
        _ => "failed",
    };
    counter!(UPLOADS, "api" => api.label(), "result" => result).increment(1);
    if result == "stored" {
        counter!(UPLOAD_BYTES).increment(stored_bytes);
    }
}

/// Pre-registered handles for the data driver.
pub struct DriverMetrics {
    sent_bytes: Counter,
    sendfile_calls: Counter,
    responses: [[Counter; KINDS.len()]; CLASSES.len()],
    open_connections: Gauge,
    active_downloads: Gauge,
    truncated: Counter,
    aborted: Counter,
    stalled: Counter,
    accept_errors: Counter,
    cold_chunks: Counter,
    duration: Histogram,
}

impl Default for DriverMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl DriverMetrics {
    pub fn new() -> Self {
        Self {
            sent_bytes: counter!(SENT_BYTES),
            sendfile_calls: counter!(SENDFILE_CALLS),
            responses: CLASSES.map(|class| KINDS.map(|kind| counter!(RESPONSES, "class" => class, "kind" => kind))),
            open_connections: gauge!(OPEN_CONNECTIONS),
            active_downloads: gauge!(ACTIVE_DOWNLOADS),
            truncated: counter!(TRUNCATED),
            aborted: counter!(ABORTED),
            stalled: counter!(STALLED),
            accept_errors: counter!(ACCEPT_ERRORS),
            cold_chunks: counter!(COLD_CHUNKS),
            duration: histogram!(RESPONSE_SECONDS),
        }
    }

    pub fn connection_opened(&self) -> GaugeGuard<'_> {
        self.open_connections.increment(1.0);
        GaugeGuard(&self.open_connections)
    }

    pub fn download_started(&self) -> GaugeGuard<'_> {
        self.active_downloads.increment(1.0);
        GaugeGuard(&self.active_downloads)
    }

    pub fn accept_error(&self) {
        self.accept_errors.increment(1);
    }

    /// A response without an object record (errors, health of the request itself).
    pub fn other_response(&self, status: StatusCode) {
        self.responses[class_index(status)][OTHER_KIND].increment(1);
    }

    /// A static-site 404 whose body, the bucket's error document, took `sendfile_calls`: a response without an
    /// object record, as other errors are, whose bytes count as sent (`add_sent_bytes`, per call).
    pub fn error_document_sent(&self, status: StatusCode, sendfile_calls: u64) {
        self.other_response(status);
        self.sendfile_calls.increment(sendfile_calls);
    }

    /// One object response ended (completed or not): a file response, a HEAD, or a 304.
    pub fn finished(&self, record: &DownloadRecord, sendfile_calls: u64) {
        let kind = match record.kind {
            RecordKind::Full => 0,
            RecordKind::Range => 1,
            RecordKind::Multipart => 2,
            RecordKind::NotModified => 3,
            RecordKind::Head => 4,
        };
        let status = StatusCode::from_u16(record.status).unwrap_or(StatusCode::OK);
        self.responses[class_index(status)][kind].increment(1);
        self.sendfile_calls.increment(sendfile_calls);
        if !Counters::is_download(record) {
            return;
        }
        match record.outcome {
            Outcome::Completed => self.duration.record(record.duration.as_secs_f64()),
            Outcome::Truncated => self.truncated.increment(1),
            Outcome::Aborted => self.aborted.increment(1),
        }
    }

    pub fn stalled(&self) {
        self.stalled.increment(1);
    }

    /// Object bytes one sendfile call moved (the driver's `SendObserver`).
    pub fn add_sent_bytes(&self, object_bytes: u64) {
        self.sent_bytes.increment(object_bytes);
    }

    pub fn add_cold_chunk(&self) {
        self.cold_chunks.increment(1);
    }
}

/// Decrements its gauge when dropped, so early returns cannot leak a count.
pub struct GaugeGuard<'a>(&'a Gauge);

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

pub fn blob_open_error() {
    counter!(BLOB_OPEN_ERRORS).increment(1);
}

/// An HTTPS connection finished its handshake; `mode` is one of [`TLS_MODES`].
pub fn tls_connection(mode: &'static str) {
    counter!(TLS_CONNECTIONS, "mode" => mode).increment(1);
}

/// The certificate now served expires at `not_after` (seconds since the Unix epoch).
pub fn tls_certificate_expiry(not_after: u64) {
    gauge!(TLS_CERTIFICATE_EXPIRY).set(not_after as f64);
}

pub fn tls_key_update_closed() {
    counter!(TLS_KEY_UPDATE_CLOSES).increment(1);
}

pub fn tls_handshake_failure(reason: &'static str) {
    counter!(TLS_HANDSHAKE_FAILURES, "reason" => reason).increment(1);
}

pub fn idle_connection_reclaimed() {
    counter!(IDLE_RECLAIMED).increment(1);
}

/// The scopes a limit is set on, as the paced-bytes series name them.
const PACED_SCOPES: [&str; 5] = ["token", "s3-key", "bucket", "anonymous", "default"];

/// Paced bytes as one thread counted them, by direction and scope: a thread writes its own cells alone, so a paced
/// response costs no shared cache line (one counter's would pass between the data workers at every response);
/// [`paced_snapshot`] adds them up into their series at each scrape.
#[derive(Default)]
struct PacedCells([[AtomicU64; PACED_SCOPES.len()]; 2]);

/// Every thread's cells that ever counted (data workers and runtime threads: a fixed set), kept when it ends.
static PACED_CELLS: std::sync::Mutex<Vec<Arc<PacedCells>>> = std::sync::Mutex::new(Vec::new());

thread_local! {
    static PACED_OF_THREAD: Arc<PacedCells> = {
        let cells = Arc::new(PacedCells::default());
        PACED_CELLS.lock().unwrap_or_else(|p| p.into_inner()).push(cells.clone());
        cells
    };
}

/// Bytes that went out (`read`) or came in (`write`) under a bandwidth limit set on `scope`: a chunk's worth (or a
/// small body's) each time.
pub fn paced_bytes(direction: &'static str, scope: &'static str, bytes: u64) {
    // Told apart by length and first byte, not compared whole: this runs for every paced chunk (a test keeps the
    // names apart so).
    let direction_index = usize::from(direction.len() == "write".len());
    match PACED_SCOPES.iter().position(|s| s.len() == scope.len() && s.as_bytes().first() == scope.as_bytes().first()) {
        Some(i) => PACED_OF_THREAD.with(|cells| {
            // This thread is the cell's one writer: a load and a store, no read-modify-write.
            let cell = &cells.0[direction_index][i];
            cell.store(cell.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
        }),
        None => counter!(PACED_BYTES, "direction" => direction, "scope" => scope).increment(bytes),
    }
}

/// Adds up every thread's paced bytes into their series (at each scrape).
pub fn paced_snapshot() {
    let mut totals = [[0u64; PACED_SCOPES.len()]; 2];
    for cells in PACED_CELLS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        for (direction, row) in cells.0.iter().enumerate() {
            for (scope, cell) in row.iter().enumerate() {
                totals[direction][scope] += cell.load(Ordering::Relaxed);
            }
        }
    }
    for (direction, row) in totals.iter().enumerate() {
        for (scope, total) in row.iter().enumerate() {
            let (direction, scope) = (["read", "write"][direction], PACED_SCOPES[scope]);
            counter!(PACED_BYTES, "direction" => direction, "scope" => scope).absolute(*total);
        }
    }
}

/// A request refused by a limit: `principal` is the token id, access key id or bucket name the limit was set on,
/// empty for the default and anonymous limits (their principals are unbounded).
pub fn throttled(limit: &'static str, scope: &'static str, principal: &str) {
    counter!(THROTTLED_REQUESTS, "limit" => limit, "scope" => scope, "principal" => principal.to_owned()).increment(1);
}

pub fn per_ip_refused() {
    counter!(PER_IP_REFUSED).increment(1);
}

pub fn upload_refused() {
    counter!(UPLOADS_REFUSED).increment(1);
}

/// Counts S3 multipart uploads this process aborted for being older than `timeouts.multipart_upload_expiry`.
pub fn multipart_uploads_expired(count: u64) {
    counter!(MULTIPART_EXPIRED).increment(count);
}

/// Counts an S3 part refused by the setting `limits.<limit>` (one of a fixed set of names).
pub fn multipart_part_refused(limit: &'static str) {
    debug_assert!(PART_LIMITS.contains(&limit), "{limit} is not a part limit");
    counter!(MULTIPART_PARTS_REFUSED, "limit" => limit).increment(1);
}

pub fn upload_body_timeout() {
    counter!(UPLOAD_BODY_TIMEOUTS).increment(1);
}

/// Counts an upload in progress for as long as the guard lives.
pub fn upload_waiting() -> OwnedGaugeGuard {
    let gauge = gauge!(UPLOADS_WAITING);
    gauge.increment(1.0);
    OwnedGaugeGuard(gauge)
}

pub fn upload_in_progress() -> OwnedGaugeGuard {
    let gauge = gauge!(UPLOADS_IN_PROGRESS);
    gauge.increment(1.0);
    OwnedGaugeGuard(gauge)
}

pub struct OwnedGaugeGuard(Gauge);

impl Drop for OwnedGaugeGuard {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// `reason` is one of a fixed set of literals (missing, malformed, unknown_token, revoked, expired, forbidden,
/// bad_signature, signature_expired, signature_revoked), so the label stays bounded.
pub fn auth_failure(reason: &'static str) {
    counter!(AUTH_FAILURES, "reason" => reason).increment(1);
}

fn class_index(status: StatusCode) -> usize {
    (status.as_u16() / 100).clamp(1, 5) as usize - 1
}

#[cfg(test)]
mod tests {
    use super::PACED_SCOPES;

    #[test]
    fn paced_scopes_are_told_apart_by_length_and_first_byte() {
        for (i, a) in PACED_SCOPES.iter().enumerate() {
            for b in &PACED_SCOPES[i + 1..] {
                assert!(a.len() != b.len() || a.as_bytes()[0] != b.as_bytes()[0], "{a} and {b}");
            }
        }
    }
}
