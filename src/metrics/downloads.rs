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

use std::time::{Duration, Instant, UNIX_EPOCH};

use metrics::{Counter, Gauge, counter, gauge};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::stats::{Batch, DownloadRecord};
use crate::store::Metadata;

/// Most records aggregated before a flush, even if a second has not passed.
const MAX_BATCH_RECORDS: usize = 50_000;
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
    let age = batch.oldest().map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
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
