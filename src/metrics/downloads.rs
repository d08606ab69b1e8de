//! Per-object download records: one per response, emitted by the data driver when the response ends, aggregated
//! by a batcher and written to the database in one transaction per batch (at least once a second, and on
//! shutdown). While the database cannot be written they wait in a bounded buffer (see [`run_batcher`]).
//!
//! The send path never waits on any of this: records go through a bounded channel with `try_send`, and a full
//! channel costs a dropped record and a counter increment, never a blocked response.
//!
//! **What counts** (also in docs/operations.md):
//! - `requests`: GET responses with status 200 or 206 that started (the head was written).
//! - `completed`: of those, the ones whose every planned byte was handed to the socket.
//! - `aborted`: of those, the ones cut short: the client went away, stopped reading (send-progress timeout), or
//!   the blob shrank under us (also counted in `truncated`).
//! - `bytes_sent`: object bytes handed to the socket, summed from sendfile's return values (multipart boundaries
//!   and heads are not object bytes).
//! - `range_requests`: 206 responses, single or multipart. A resumed download is one more request and one more
//!   range request, whose bytes add to `bytes_sent`.
//! - `not_modified`: 304 responses. `head_requests`: HEAD responses, which are not downloads.

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use metrics::{Counter, Gauge, counter, gauge};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::stats::{Batch, DownloadRecord};
use crate::store::{Flushed, Metadata, MetadataError, StatsFlush};

/// Most object-days aggregated before a flush, even if a second has not passed (the write starts as the batch
/// reaches it, unless one is in flight or in doubt): a flush appends one row each in one write transaction, so
/// while the database keeps up this bounds how long it holds SQLite's write lock (some 15 ms), however many
/// distinct objects a second's downloads name.
const MAX_BATCH_ENTRIES: usize = 10_000;
/// How often the channel is drained; with the channel's capacity this bounds the rate before records drop.
const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// How often the aggregate is written to SQLite.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// The driver's end of the channel. Cloning is cheap.
#[derive(Clone)]
pub struct DownloadRecorder {
    tx: mpsc::Sender<DownloadRecord>,
    dropped: Counter,
}

impl DownloadRecorder {
    /// Never waits: a full channel drops the record and counts the drop.
    pub fn record(&self, r: DownloadRecord) {
        if self.tx.try_send(r).is_err() {
            self.dropped.increment(1);
        }
    }
}

pub fn channel(capacity: usize) -> (DownloadRecorder, mpsc::Receiver<DownloadRecord>) {
    let (tx, rx) = mpsc::channel(capacity);
    (DownloadRecorder { tx, dropped: counter!(super::STATS_DROPPED) }, rx)
}

/// How often a warning about dropped records is repeated while drops go on.
const DROP_WARNING_EVERY: Duration = Duration::from_secs(10);

/// Aggregates records and writes them at least once a second. It drains the channel on a short tick instead of
/// waiting on it, so that a data worker's `try_send` never has to wake this task on another thread.
///
/// **While the database cannot be written** the write runs in a task of its own, so draining never waits on it.
/// A batch whose write failed is *in doubt* (its commit may have happened, with the answer lost): it is retried
/// alone, under the same flush mark, until it is written or the database says it already was, so nothing is
/// counted twice. New records meanwhile aggregate into the pending batch, which holds at most
/// `max_pending_entries` aggregates (so with the batch in doubt, which was a pending batch, memory stays under
/// twice that); a record that needs one more is dropped, counted (`blobgate_stats_buffer_dropped_total`) and
/// warned about. Once the database answers, the in-doubt batch and
/// then the pending one are written. On `shutdown` it drains what is left, writes it, and returns.
pub async fn run_batcher(
    meta: Metadata,
    mut rx: mpsc::Receiver<DownloadRecord>,
    max_pending_entries: usize,
    shutdown: CancellationToken,
) {
    let mut flusher = Flusher::new(meta);
    let mut pending = Batch::default();
    let buffer_dropped: Counter = counter!(super::STATS_BUFFER_DROPPED);
    let pending_gauge: Gauge = gauge!(super::STATS_PENDING);
    let mut drops = DropWarning::default();
    let mut tick = tokio::time::interval(DRAIN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_flush = Instant::now();
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = shutdown.cancelled() => true,
        };
        while let Ok(r) = rx.try_recv() {
            if !pending.add_within(&r, max_pending_entries) {
                buffer_dropped.increment(1);
                drops.dropped += 1;
            }
            // Mid-drain only while writes succeed: a batch in doubt is retried at the tick's pace below.
            if pending.entries() >= MAX_BATCH_ENTRIES && !stopping {
                flusher.collect().await;
                if flusher.idle() {
                    flusher.start(&mut pending);
                    last_flush = Instant::now();
                }
            }
        }
        drops.warn_now_and_then(max_pending_entries);
        flusher.collect().await;
        if stopping {
            break;
        }
        if !flusher.writing() && (last_flush.elapsed() >= FLUSH_EVERY || pending.entries() >= MAX_BATCH_ENTRIES) {
            flusher.start(&mut pending);
            last_flush = Instant::now();
        }
        pending_gauge.set((flusher.entries_held() + pending.entries()) as f64);
    }
    // Shutdown: what is being written, then what is in doubt, then what is pending, with a few retries, all
    // within SHUTDOWN_FLUSH: a database that is down must not hold the exit (each attempt may wait for a
    // connection for `timeouts.database_acquire`).
    let flushed = tokio::time::timeout(SHUTDOWN_FLUSH, flush_before_exit(&mut flusher, &mut pending)).await;
    let left = flusher.records_held() + pending.records;
    if flushed.is_err() || left > 0 {
        buffer_dropped.increment(left as u64);
        tracing::error!(
            records = left,
            "could not write the last download stats before exit; they are dropped (a write in flight may still \
             have been committed)"
        );
    }
}

/// How long the batcher may go on writing after shutdown before what it holds is dropped.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(4);

/// Writes what is in flight, in doubt and pending, with a few retries; returns early once nothing is left.
async fn flush_before_exit(flusher: &mut Flusher, pending: &mut Batch) {
    flusher.wait().await;
    for attempt in 0..5 {
        if flusher.idle() && pending.is_empty() {
            return;
        }
        flusher.start(pending);
        flusher.wait().await;
        if !flusher.idle() || !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
        }
    }
}

/// A finished write: its mark, its batch (kept for a retry), and how it went.
type FlushOutcome = (StatsFlush, Arc<Batch>, Result<Flushed, MetadataError>);

/// The writing side of the batcher: at most one write in flight, and at most one batch in doubt.
struct Flusher {
    meta: Metadata,
    /// This process's name in the flush marks: random, so a restart never reuses a mark.
    writer: String,
    next_seq: i64,
    in_flight: Option<tokio::task::JoinHandle<FlushOutcome>>,
    /// Entries and records of the batch in flight (it is inside the task).
    in_flight_size: (usize, usize),
    in_doubt: Option<(StatsFlush, Arc<Batch>)>,
    lag: Gauge,
    failures: Counter,
    /// Batches written, and the object-days they held (a batch found already written counts: its rows are in).
    batches_written: Counter,
    object_days_written: Counter,
    /// Whether the last write failed: the failure is logged when writes start failing, not at every retry.
    failing: bool,
}

impl Flusher {
    fn new(meta: Metadata) -> Self {
        Self {
            meta,
            writer: format!("{:016x}", getrandom::u64().unwrap_or_else(|_| std::process::id().into())),
            next_seq: 1,
            in_flight: None,
            in_flight_size: (0, 0),
            in_doubt: None,
            lag: gauge!(super::STATS_LAG),
            failures: counter!(super::STATS_FLUSH_ERRORS),
            batches_written: counter!(super::STATS_BATCHES_WRITTEN),
            object_days_written: counter!(super::STATS_OBJECT_DAYS_WRITTEN),
            failing: false,
        }
    }

    /// Nothing being written and nothing in doubt.
    fn idle(&self) -> bool {
        !self.writing() && self.in_doubt.is_none()
    }

    fn writing(&self) -> bool {
        self.in_flight.is_some()
    }

    fn entries_held(&self) -> usize {
        self.in_flight_size.0 + self.in_doubt.as_ref().map_or(0, |(_, b)| b.entries())
    }

    fn records_held(&self) -> usize {
        self.in_flight_size.1 + self.in_doubt.as_ref().map_or(0, |(_, b)| b.records)
    }

    /// Starts a write unless one is in flight: the batch in doubt if there is one (alone, under its own mark),
    /// else the pending batch (taken, under a new mark).
    fn start(&mut self, pending: &mut Batch) {
        if self.in_flight.is_some() {
            return;
        }
        let (flush, batch) = match self.in_doubt.take() {
            Some(doubt) => doubt,
            None if pending.is_empty() => {
                self.lag.set(0.0);
                return;
            }
            None => {
                let flush = StatsFlush { writer: self.writer.clone(), seq: self.next_seq };
                self.next_seq += 1;
                let entries = pending.entries();
                (flush, Arc::new(std::mem::replace(pending, Batch::with_capacity(entries))))
            }
        };
        self.in_flight_size = (batch.entries(), batch.records);
        let meta = self.meta.clone();
        self.in_flight = Some(tokio::spawn(async move {
            let result = meta.record_download_stats(&flush, &batch).await;
            (flush, batch, result)
        }));
    }

    /// Takes the result of a finished write, if there is one; never waits.
    async fn collect(&mut self) {
        if self.in_flight.as_ref().is_some_and(|task| task.is_finished()) {
            self.wait().await;
        }
    }

    /// Waits for the write in flight, if any, and takes its result.
    async fn wait(&mut self) {
        // Taken only once finished: a shutdown that stops waiting still counts the batch in flight as held.
        let Some(task) = self.in_flight.as_mut() else { return };
        let finished = task.await;
        self.in_flight = None;
        self.in_flight_size = (0, 0);
        let (flush, batch, result) = match finished {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(error = %e, "the stats write task failed; its batch is lost");
                return;
            }
        };
        match result {
            Ok(written) => {
                self.batches_written.increment(1);
                self.object_days_written.increment(batch.entries() as u64);
                if written == Flushed::AlreadyWritten {
                    tracing::info!(records = batch.records, "a stats batch whose commit seemed to fail was written");
                }
                if std::mem::take(&mut self.failing) {
                    tracing::info!("writing download stats works again");
                }
                self.lag.set(batch.oldest().map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0));
            }
            Err(e) => {
                self.failures.increment(1);
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(error = %e, records = batch.records, "writing download stats failed; keeping them and retrying");
                }
                self.in_doubt = Some((flush, batch));
            }
        }
    }
}

/// Warns about dropped records when drops start, then at most every [`DROP_WARNING_EVERY`] while they go on.
#[derive(Default)]
struct DropWarning {
    dropped: u64,
    last: Option<Instant>,
}

impl DropWarning {
    fn warn_now_and_then(&mut self, max_pending_entries: usize) {
        if self.dropped == 0 || self.last.is_some_and(|t| t.elapsed() < DROP_WARNING_EVERY) {
            return;
        }
        tracing::warn!(
            dropped = self.dropped,
            limit = max_pending_entries,
            "download stats dropped: the buffer waiting for the database is full (limits.stats_buffer_objects)"
        );
        self.dropped = 0;
        self.last = Some(Instant::now());
    }
}

/// The JSON shape of one object's stats, shared by `blobgate stats --json` and `GET /stats`.
pub fn stats_json(s: &crate::store::ObjectStats) -> serde_json::Value {
    let c = &s.counters;
    serde_json::json!({
        "bucket": s.bucket, "key": s.key,
        "requests": c.requests, "completed": c.completed, "aborted": c.aborted, "truncated": c.truncated,
        "bytes_sent": c.bytes_sent, "range_requests": c.range_requests, "not_modified": c.not_modified,
        "head_requests": c.head_requests,
        "last_download_at": s.last_download_at.map(|t| {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(t.max(0) as u64)).to_string()
        }),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::{DatabaseTimeouts, DatabaseUrl};
    use crate::file_body::ObjectRef;
    use crate::names::BucketName;
    use crate::stats::RecordKind;
    use crate::store::StatsOrder;

    fn download(bucket_id: i64, key: &str, bytes: u64) -> DownloadRecord {
        let mut r = DownloadRecord::now(ObjectRef { bucket_id, key: Arc::from(key) }, 200, RecordKind::Full);
        (r.planned_bytes, r.sent_bytes) = (bytes, bytes);
        r
    }

    async fn totals(meta: &Metadata) -> Vec<(String, u64, u64)> {
        let rows = meta.object_stats(None, "", StatsOrder::Bytes, None).await.unwrap();
        let mut rows: Vec<_> = rows.into_iter().map(|s| (s.key, s.counters.requests, s.counters.bytes_sent)).collect();
        rows.sort();
        rows
    }

    /// The value of the unlabelled counter `name` in `metrics` (0 when absent).
    fn counter_in(metrics: &metrics_exporter_prometheus::PrometheusHandle, name: &str) -> f64 {
        let text = metrics.render();
        let value = text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')));
        value.map_or(0.0, |v| v.trim().parse().unwrap())
    }

    /// Polls `done` (every 10 ms; the 30 s deadline bounds a hang only).
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not within 30 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A SQLite database in a temp dir with the bucket `bkt`.
    async fn database_with_bucket(
        timeouts: DatabaseTimeouts,
    ) -> (tempfile::TempDir, DatabaseUrl, Metadata, crate::store::Bucket) {
        let dir = tempfile::tempdir().unwrap();
        let url = DatabaseUrl::in_data_dir(dir.path());
        let meta = Metadata::open(&url, dir.path(), timeouts).await.unwrap();
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        (dir, url, meta, bucket)
    }

    #[tokio::test]
    async fn records_wait_while_writes_fail_within_the_bound_and_are_written_once_when_the_database_returns() {
        // The batcher's counters, in a recorder of this test's own: a current-thread runtime polls the batcher on
        // this thread, where the recorder is the default.
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let metrics = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        let timeouts = DatabaseTimeouts { busy: Duration::from_millis(50), acquire: Duration::from_millis(500) };
        let (dir, url, meta, bucket) = database_with_bucket(timeouts).await;
        // Another process holds the write lock: every stats write fails (busy) until it lets go.
        let other = Metadata::open(&url, dir.path(), timeouts).await.unwrap();
        let lock = other.begin_write().await.unwrap();

        let (recorder, rx) = channel(1024);
        let stop = CancellationToken::new();
        // Room for two object-days in the pending batch.
        let batcher = tokio::spawn(run_batcher(meta.clone(), rx, 2, stop.clone()));
        recorder.record(download(bucket.id, "a", 10));
        recorder.record(download(bucket.id, "b", 20));
        // Their write failed (counted): the first two are in doubt now.
        until("a failed write", || counter_in(&metrics, crate::metrics::STATS_FLUSH_ERRORS) >= 1.0).await;
        assert!(totals(&meta).await.is_empty(), "nothing can be written yet");
        // A new pending batch takes two objects again, not a third: `d` is dropped (counted) when drained.
        recorder.record(download(bucket.id, "a", 10));
        recorder.record(download(bucket.id, "c", 30));
        recorder.record(download(bucket.id, "d", 40));
        until("the third object dropped", || counter_in(&metrics, crate::metrics::STATS_BUFFER_DROPPED) == 1.0).await;
        assert!(totals(&meta).await.is_empty());

        lock.commit().await.unwrap();
        let want = vec![("a".to_owned(), 2, 20), ("b".to_owned(), 1, 20), ("c".to_owned(), 1, 30)];
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut got = totals(&meta).await;
        while got != want && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            got = totals(&meta).await;
        }
        assert_eq!(got, want, "the outage's records, written once, without the dropped one");
        recorder.record(download(bucket.id, "d", 40));
        stop.cancel();
        batcher.await.unwrap();
        let want =
            vec![("a".to_owned(), 2, 20), ("b".to_owned(), 1, 20), ("c".to_owned(), 1, 30), ("d".to_owned(), 1, 40)];
        assert_eq!(totals(&meta).await, want, "the last records are written at shutdown, nothing twice");
    }

    #[tokio::test]
    async fn a_burst_of_distinct_objects_is_written_in_batches_of_bounded_size() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let metrics = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        let timeouts = DatabaseTimeouts { busy: Duration::from_secs(5), acquire: Duration::from_secs(5) };
        let (_dir, _url, meta, bucket) = database_with_bucket(timeouts).await;
        // Two and a half batches' worth, all in the channel before the batcher's first drain.
        let objects = MAX_BATCH_ENTRIES * 5 / 2;
        let (recorder, rx) = channel(objects);
        for i in 0..objects {
            recorder.record(download(bucket.id, &format!("k{i:06}"), 1));
        }
        let stop = CancellationToken::new();
        let batcher = tokio::spawn(run_batcher(meta.clone(), rx, 1_000_000, stop.clone()));
        let written = crate::metrics::STATS_OBJECT_DAYS_WRITTEN;
        until("every object-day written", || counter_in(&metrics, written) == objects as f64).await;
        // The first write started as the batch reached the bound, in the middle of that drain.
        let batches = counter_in(&metrics, crate::metrics::STATS_BATCHES_WRITTEN);
        assert!(batches >= 2.0, "{objects} object-days in {batches} batch(es)");
        stop.cancel();
        batcher.await.unwrap();
        let rows = totals(&meta).await;
        assert_eq!(rows.len(), objects);
        assert!(rows.iter().all(|(_, requests, bytes)| (*requests, *bytes) == (1, 1)), "each counted once");
    }
}
