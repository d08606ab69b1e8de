//! Download statistics as data: one record per response, the counting rules (pure), and the per-object and
//! per-day aggregate a batch writes. Shared by the driver (which emits records), `metrics` (which batches them)
//! and `store` (which writes them); it does no IO, so it sits below all three.
//!
//! **What counts** is in the module doc of `metrics::downloads` and in docs/operations.md ("Download statistics").

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use crate::file_body::ObjectRef;

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
            finished_at: unix_now(),
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

    /// Adds another aggregate's counters.
    #[cfg(test)]
    pub fn add_counters(&mut self, o: &Counters) {
        self.requests += o.requests;
        self.completed += o.completed;
        self.aborted += o.aborted;
        self.truncated += o.truncated;
        self.bytes_sent += o.bytes_sent;
        self.range_requests += o.range_requests;
        self.not_modified += o.not_modified;
        self.head_requests += o.head_requests;
    }

    pub fn is_download(r: &DownloadRecord) -> bool {
        matches!(r.kind, RecordKind::Full | RecordKind::Range | RecordKind::Multipart)
    }
}

/// Object identity inside a batch.
pub type ObjectId = (i64, Arc<str>);

/// Records aggregated since the last flush, one aggregate per object and day: a flush appends exactly these to the
/// ledger, and an object's totals are their sum. Every record is looked up once, so the map hashes with foldhash
/// rather than SipHash (a seeded hash: keys are object names that a client may choose, but only names it may read).
#[derive(Debug, Default)]
pub struct Batch {
    /// Keyed by days since the epoch (UTC); formatted only when written. With each object-day, the object's
    /// latest download that day (a HEAD or 304 does not move it).
    pub per_day: foldhash::HashMap<(ObjectId, i64), (Counters, Option<i64>)>,
    pub records: usize,
    oldest: Option<Instant>,
}

impl Batch {
    /// An empty batch with room for `entries` object-days: the next batch is sized as the last, so that a second of
    /// distinct objects does not grow (and move) its table a dozen times.
    pub fn with_capacity(entries: usize) -> Self {
        Batch { per_day: foldhash::HashMap::with_capacity_and_hasher(entries, Default::default()), ..Batch::default() }
    }

    pub fn add(&mut self, r: &DownloadRecord) {
        let (counters, last) = self
            .per_day
            .entry(((r.object.bucket_id, r.object.key.clone()), r.finished_at.div_euclid(86_400)))
            .or_default();
        counters.add(r);
        if Counters::is_download(r) {
            *last = Some(last.map_or(r.finished_at, |l| l.max(r.finished_at)));
        }
        self.records += 1;
        self.oldest.get_or_insert_with(Instant::now);
    }

    /// Adds `r` only if the batch then holds at most `max_entries` object-days; a record for an object-day already
    /// in the batch always fits. Returns whether it was added. This bounds the memory of a batch that waits while
    /// the database cannot be written.
    pub fn add_within(&mut self, r: &DownloadRecord, max_entries: usize) -> bool {
        // Far from the bound (always, while the database answers) there is nothing to look up first.
        if self.entries() < max_entries {
            self.add(r);
            return true;
        }
        let id: ObjectId = (r.object.bucket_id, r.object.key.clone());
        if !self.per_day.contains_key(&(id, r.finished_at.div_euclid(86_400))) {
            return false;
        }
        self.add(r);
        true
    }

    /// Aggregates held: one per object-day.
    pub fn entries(&self) -> usize {
        self.per_day.len()
    }

    /// The objects' totals of this batch (each object's days summed, its latest download), in no order.
    #[cfg(test)]
    pub fn per_object(&self) -> foldhash::HashMap<ObjectId, (Counters, Option<i64>)> {
        let mut objects: foldhash::HashMap<ObjectId, (Counters, Option<i64>)> = Default::default();
        for ((id, _), (c, last)) in &self.per_day {
            let (total, latest) = objects.entry(id.clone()).or_default();
            total.add_counters(c);
            *latest = (*latest).max(*last);
        }
        objects
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// When the first record of this batch arrived.
    pub fn oldest(&self) -> Option<Instant> {
        self.oldest
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

/// Unix seconds now: the one wall clock for stored times and the Date field (0 before 1970). The kernel's coarse
/// clock, its time at the last tick: whole seconds need no more, and every request reads it (the fine clock reads the
/// time counter too).
pub fn unix_now() -> i64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME_COARSE).map_or(0, |t| t.tv_sec().max(0))
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
    fn batches_aggregate_per_object_day() {
        let mut b = Batch::default();
        b.add(&record(RecordKind::Full, Outcome::Completed, 100, 86_400 - 1));
        b.add(&record(RecordKind::Full, Outcome::Completed, 100, 86_400));
        b.add(&record(RecordKind::Head, Outcome::Completed, 0, 90_000));
        let (c, last) = b.per_object()[&(1, Arc::from("k"))];
        assert_eq!((c.requests, c.bytes_sent, c.head_requests), (2, 200, 1));
        assert_eq!(last, Some(86_400), "HEAD does not move last_download_at");
        assert_eq!(b.per_day.len(), 2);
        assert_eq!(
            b.per_day[&((1, Arc::from("k")), 0)],
            (Counters { requests: 1, completed: 1, bytes_sent: 100, ..Counters::default() }, Some(86_400 - 1))
        );
        assert_eq!(b.per_day[&((1, Arc::from("k")), 1)].1, Some(86_400), "a day's latest download, not its HEAD");
        assert_eq!(day_name(1), "1970-01-02");
    }

    #[test]
    fn a_bounded_batch_refuses_only_records_that_need_a_new_entry() {
        let of = |key: &str, at: i64| DownloadRecord {
            object: ObjectRef { bucket_id: 1, key: Arc::from(key) },
            ..record(RecordKind::Full, Outcome::Completed, 10, at)
        };
        let mut b = Batch::default();
        assert!(b.add_within(&of("a", 0), 2), "an object-day: 1 entry");
        assert!(b.add_within(&of("b", 0), 2), "2 entries");
        assert!(b.add_within(&of("a", 5), 2), "same object, same day: no new entry");
        assert!(!b.add_within(&of("c", 0), 2), "a new object needs one more");
        assert!(!b.add_within(&of("a", 86_400), 2), "a new day of a known object needs one more");
        assert_eq!((b.entries(), b.records), (2, 3));
        let (c, _) = b.per_object()[&(1, Arc::from("a"))];
        assert_eq!((c.requests, c.bytes_sent), (2, 20), "refused records were not counted");
    }

    #[test]
    fn days_are_utc() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(1_796_083_200), "2026-12-01");
        assert_eq!(utc_day(-5), "1970-01-01");
    }
}
