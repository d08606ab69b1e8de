//! Per-object download records: one per response, emitted by the data driver when the response ends, aggregated
//! by a batcher and written to SQLite in one transaction per batch (at least once a second, and on shutdown).
//!
//! The send path never waits on any of this: records go through a bounded channel with `try_send`, and a full
//! channel costs a dropped record and a counter increment, never a blocked response.
//!
//! **What counts** (also in the README):
//! - `requests`: GET responses with status 200 or 206 that started (the head was written).
//! - `completed`: of those, the ones whose every planned byte was handed to the socket.
//! - `aborted`: of those, the ones cut short: the client went away, stopped reading (send-progress timeout), or
//!   the blob shrank under us (also counted in `truncated`).
//! - `bytes_sent`: object bytes handed to the socket, summed from sendfile's return values (multipart boundaries
//!   and heads are not object bytes).
//! - `range_requests`: 206 responses, single or multipart. A resumed download is one more request and one more
//!   range request, whose bytes add to `bytes_sent`.
//! - `not_modified`: 304 responses. `head_requests`: HEAD responses, which are not downloads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use metrics::{Counter, Gauge, counter, gauge};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::file_body::ObjectRef;
use crate::store::Metadata;

/// Most records aggregated before a flush, even if a second has not passed.
const MAX_BATCH_RECORDS: usize = 50_000;
/// How often the channel is drained; with the channel's capacity this bounds the rate before records drop.
const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// How often the aggregate is written to SQLite.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    Full,
    Range,
    Multipart,
    NotModified,
    Head,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    Aborted,
    Truncated,
}

/// One response's worth of facts.
#[derive(Debug, Clone)]
pub struct DownloadRecord {
    pub object: ObjectRef,
    pub status: u16,
    pub kind: RecordKind,
    /// Object bytes the response meant to send.
    pub planned_bytes: u64,
    /// Object bytes sendfile accepted.
    pub sent_bytes: u64,
    pub outcome: Outcome,
    pub duration: Duration,
    /// Unix seconds when the response ended.
    pub finished_at: i64,
}

impl DownloadRecord {
    pub fn now(object: ObjectRef, status: u16, kind: RecordKind) -> Self {
        Self {
            object,
            status,
            kind,
            planned_bytes: 0,
            sent_bytes: 0,
            outcome: Outcome::Completed,
            duration: Duration::ZERO,
            finished_at: crate::store::unix_now(),
        }
    }
}

/// The counters of one object (or one object-day). Pure arithmetic, unit-tested.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub requests: u64,
    pub completed: u64,
    pub aborted: u64,
    pub truncated: u64,
    pub bytes_sent: u64,
    pub range_requests: u64,
    pub not_modified: u64,
    pub head_requests: u64,
}

impl Counters {
    /// Applies one record per the rules in the module doc.
    pub fn add(&mut self, r: &DownloadRecord) {
        match r.kind {
            RecordKind::Head => self.head_requests += 1,
            RecordKind::NotModified => self.not_modified += 1,
            RecordKind::Full | RecordKind::Range | RecordKind::Multipart => {
                self.requests += 1;
                self.bytes_sent += r.sent_bytes;
                if r.kind != RecordKind::Full {
                    self.range_requests += 1;
                }
                match r.outcome {
                    Outcome::Completed => self.completed += 1,
                    Outcome::Aborted => self.aborted += 1,
                    Outcome::Truncated => {
                        self.aborted += 1;
                        self.truncated += 1;
                    }
                }
            }
        }
    }

    pub fn is_download(r: &DownloadRecord) -> bool {
        matches!(r.kind, RecordKind::Full | RecordKind::Range | RecordKind::Multipart)
    }
}

/// Object identity inside a batch.
pub type ObjectId = (i64, Arc<str>);

/// Records aggregated since the last flush.
#[derive(Debug, Default)]
pub struct Batch {
    pub per_object: HashMap<ObjectId, (Counters, Option<i64>)>,
    /// Keyed by days since the epoch (UTC); formatted only when written.
    pub per_day: HashMap<(ObjectId, i64), Counters>,
    pub records: usize,
    oldest: Option<Instant>,
}

impl Batch {
    pub fn add(&mut self, r: &DownloadRecord) {
        let id: ObjectId = (r.object.bucket_id, r.object.key.clone());
        let (counters, last) = self.per_object.entry(id.clone()).or_default();
        counters.add(r);
        if Counters::is_download(r) {
            *last = Some(last.map_or(r.finished_at, |l| l.max(r.finished_at)));
        }
        self.per_day.entry((id, r.finished_at.div_euclid(86_400))).or_default().add(r);
        self.records += 1;
        self.oldest.get_or_insert_with(Instant::now);
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    fn clear(&mut self) {
        *self = Batch::default();
    }
}

/// `YYYY-MM-DD` (UTC) of a unix time.
pub fn utc_day(unix_secs: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(unix_secs.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()[..10].to_owned()
}

/// `YYYY-MM-DD` (UTC) of a day number (days since 1970-01-01).
pub fn day_name(day: i64) -> String {
    utc_day(day.saturating_mul(86_400))
}

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

/// Aggregates records and writes them at least once a second. It drains the channel on a short tick instead of
/// waiting on it, so that a data worker's `try_send` never has to wake this task on another thread. On `shutdown`
/// it drains what is left, writes it, and returns. A failed write (SQLite busy past its timeout) keeps the batch
/// and retries, so no counts are lost while the process lives.
pub async fn run_batcher(meta: Metadata, mut rx: mpsc::Receiver<DownloadRecord>, shutdown: CancellationToken) {
    let lag: Gauge = gauge!(super::STATS_LAG);
    let failures: Counter = counter!(super::STATS_FLUSH_ERRORS);
    let mut batch = Batch::default();
    let mut tick = tokio::time::interval(DRAIN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_flush = Instant::now();
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = shutdown.cancelled() => true,
        };
        while let Ok(r) = rx.try_recv() {
            batch.add(&r);
            if batch.records >= MAX_BATCH_RECORDS {
                flush(&meta, &mut batch, &lag, &failures).await;
            }
        }
        if stopping {
            break;
        }
        if last_flush.elapsed() >= FLUSH_EVERY {
            flush(&meta, &mut batch, &lag, &failures).await;
            last_flush = Instant::now();
        }
    }
    for attempt in 0..5 {
        if flush(&meta, &mut batch, &lag, &failures).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
    }
    tracing::error!(records = batch.records, "could not write the last download stats before exit");
}

/// Writes the batch; true when it is written (or empty).
async fn flush(meta: &Metadata, batch: &mut Batch, lag: &Gauge, failures: &Counter) -> bool {
    if batch.is_empty() {
        lag.set(0.0);
        return true;
    }
    let age = batch.oldest.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
    match meta.record_download_stats(batch).await {
        Ok(()) => {
            lag.set(age);
            batch.clear();
            true
        }
        Err(e) => {
            failures.increment(1);
            tracing::warn!(error = %e, records = batch.records, "writing download stats failed; will retry");
            false
        }
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
    use super::*;

    fn record(kind: RecordKind, outcome: Outcome, sent: u64, at: i64) -> DownloadRecord {
        DownloadRecord {
            object: ObjectRef { bucket_id: 1, key: Arc::from("k") },
            status: 200,
            kind,
            planned_bytes: 100,
            sent_bytes: sent,
            outcome,
            duration: Duration::ZERO,
            finished_at: at,
        }
    }

    #[test]
    fn counting_rules() {
        use Outcome::*;
        use RecordKind::*;
        let mut c = Counters::default();
        c.add(&record(Full, Completed, 100, 0));
        c.add(&record(Range, Completed, 10, 0));
        c.add(&record(Multipart, Aborted, 5, 0));
        c.add(&record(Full, Truncated, 50, 0));
        c.add(&record(NotModified, Completed, 0, 0));
        c.add(&record(Head, Completed, 0, 0));
        let want = Counters {
            requests: 4,
            completed: 2,
            aborted: 2,
            truncated: 1,
            bytes_sent: 165,
            range_requests: 2,
            not_modified: 1,
            head_requests: 1,
        };
        assert_eq!(c, want);
    }

    #[test]
    fn batches_aggregate_per_object_and_day() {
        let mut b = Batch::default();
        b.add(&record(RecordKind::Full, Outcome::Completed, 100, 86_400 - 1));
        b.add(&record(RecordKind::Full, Outcome::Completed, 100, 86_400));
        b.add(&record(RecordKind::Head, Outcome::Completed, 0, 90_000));
        let (c, last) = b.per_object[&(1, Arc::from("k"))];
        assert_eq!((c.requests, c.bytes_sent, c.head_requests), (2, 200, 1));
        assert_eq!(last, Some(86_400), "HEAD does not move last_download_at");
        assert_eq!(b.per_day.len(), 2);
        assert_eq!(b.per_day[&((1, Arc::from("k")), 0)].requests, 1);
        assert_eq!(day_name(1), "1970-01-02");
    }

    #[test]
    fn days_are_utc() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(1_796_083_200), "2026-12-01");
        assert_eq!(utc_day(-5), "1970-01-01");
    }
}
