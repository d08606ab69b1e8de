//! Per-object download counters: batched adds, and the ranked read behind `blobgate stats` and `GET /stats`.

use super::{Backend, Metadata, MetadataError};
use crate::stats::{Batch, Counters};

/// One object's row of `object_stats`, with its bucket's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStats {
    pub bucket: String,
    pub key: String,
    pub counters: Counters,
    pub last_download_at: Option<i64>,
}

/// How stats are ranked, highest first. One spelling (`as_str`) for the CLI's `--by`, the admin listener's
/// `?by=` and the SQL's `ORDER BY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatsOrder {
    #[default]
    Bytes,
    Requests,
}

impl StatsOrder {
    pub const ALL: [StatsOrder; 2] = [StatsOrder::Bytes, StatsOrder::Requests];

    pub fn as_str(self) -> &'static str {
        match self {
            StatsOrder::Bytes => "bytes",
            StatsOrder::Requests => "requests",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }

    fn order_by(self) -> &'static str {
        match self {
            StatsOrder::Bytes => "s.bytes_sent DESC, s.requests DESC",
            StatsOrder::Requests => "s.requests DESC, s.bytes_sent DESC",
        }
    }
}

impl std::fmt::Display for StatsOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

const COUNTER_COLUMNS: &str =
    "requests, completed, aborted, truncated, bytes_sent, range_requests, not_modified, head_requests";

struct ObjectStatsRow {
    bucket: String,
    key: String,
    requests: i64,
    completed: i64,
    aborted: i64,
    truncated: i64,
    bytes_sent: i64,
    range_requests: i64,
    not_modified: i64,
    head_requests: i64,
    last_download_at: Option<i64>,
}
from_row!(ObjectStatsRow {
    bucket,
    key,
    requests,
    completed,
    aborted,
    truncated,
    bytes_sent,
    range_requests,
    not_modified,
    head_requests,
    last_download_at
});

impl From<ObjectStatsRow> for ObjectStats {
    fn from(r: ObjectStatsRow) -> Self {
        ObjectStats {
            bucket: r.bucket,
            key: r.key,
            counters: Counters {
                requests: r.requests as u64,
                completed: r.completed as u64,
                aborted: r.aborted as u64,
                truncated: r.truncated as u64,
                bytes_sent: r.bytes_sent as u64,
                range_requests: r.range_requests as u64,
                not_modified: r.not_modified as u64,
                head_requests: r.head_requests as u64,
            },
            last_download_at: r.last_download_at,
        }
    }
}

/// Names one flush of a stats batcher: `writer` is the batcher (random per process), `seq` counts its flushes
/// and only grows. A retried flush keeps its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsFlush {
    pub writer: String,
    pub seq: i64,
}

/// What [`Metadata::record_download_stats`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    Written,
    /// This flush (or a later one of its writer) was committed before: a retry after a commit whose answer was
    /// lost. Nothing was added again.
    AlreadyWritten,
}

/// Marks of writers not seen for this long are removed (a process that stopped long ago never retries).
const FLUSH_MARK_LIFETIME_SECS: i64 = 7 * 86_400;

impl Metadata {
    /// Adds a batch of download counters in one write transaction, with the flush's mark, so that a retry of a
    /// flush whose commit did succeed adds nothing (see [`Flushed::AlreadyWritten`]). Rows of a bucket deleted
    /// since the downloads are dropped (they would violate the foreign key and fail the whole batch, again at
    /// every retry). Each row
    /// is one `INSERT … ON CONFLICT DO UPDATE SET n = n + excluded.n`, so replicas adding to the same row at once
    /// never lose an increment; rows go in key order, so two such batches lock them in the same order and cannot
    /// deadlock.
    pub async fn record_download_stats(&self, flush: &StatsFlush, batch: &Batch) -> Result<Flushed, MetadataError> {
        // The later of two timestamps: SQLite's two-argument max, PostgreSQL's greatest.
        let (later, numbered) = match &self.backend {
            Backend::Sqlite(_) => ("max", false),
            Backend::Postgres(_) => ("greatest", true),
        };
        let mut per_object: Vec<_> = batch.per_object.iter().collect();
        per_object.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut per_day: Vec<_> = batch.per_day.iter().collect();
        per_day.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut tx = self.begin_write().await?;
        let now = crate::stats::unix_now();
        let marked = with_tx!(&mut tx.tx, conn => sqlx::query(
            "INSERT INTO stats_flush_marks AS m (writer, last_seq, updated_at) VALUES ($1, $2, $3)
             ON CONFLICT (writer) DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at
             WHERE m.last_seq < excluded.last_seq",
        )
        .bind(&flush.writer)
        .bind(flush.seq)
        .bind(now)
        .execute(&mut **conn)
        .await?.rows_affected());
        if marked == 0 {
            return Ok(Flushed::AlreadyWritten);
        }
        if flush.seq == 1 {
            with_tx!(&mut tx.tx, conn => sqlx::query("DELETE FROM stats_flush_marks WHERE updated_at < $1")
                .bind(now - FLUSH_MARK_LIFETIME_SECS)
                .execute(&mut **conn)
                .await?.rows_affected());
        }
        // Many rows a statement: a batch of distinct objects costs a statement per hundred, not two per object.
        for chunk in per_object.chunks(STATS_ROWS_PER_STATEMENT) {
            let sql = per_object_upsert(later, chunk.len(), numbered);
            with_tx!(&mut tx.tx, conn => {
                let mut query = sqlx::query(&sql);
                for ((bucket_id, key), (c, last)) in chunk {
                    query = query
                        .bind(bucket_id)
                        .bind(key.as_ref())
                        .bind(c.requests as i64)
                        .bind(c.completed as i64)
                        .bind(c.aborted as i64)
                        .bind(c.truncated as i64)
                        .bind(c.bytes_sent as i64)
                        .bind(c.range_requests as i64)
                        .bind(c.not_modified as i64)
                        .bind(c.head_requests as i64)
                        .bind(last);
                }
                query.execute(&mut **conn).await?.rows_affected()
            });
        }
        for chunk in per_day.chunks(STATS_ROWS_PER_STATEMENT) {
            let sql = per_day_upsert(chunk.len(), numbered);
            with_tx!(&mut tx.tx, conn => {
                let mut query = sqlx::query(&sql);
                for (((bucket_id, key), day), c) in chunk {
                    query = query
                        .bind(bucket_id)
                        .bind(key.as_ref())
                        .bind(crate::stats::day_name(*day))
                        .bind(c.requests as i64)
                        .bind(c.completed as i64)
                        .bind(c.aborted as i64)
                        .bind(c.bytes_sent as i64)
                        .bind(c.range_requests as i64)
                        .bind(c.not_modified as i64);
                }
                query.execute(&mut **conn).await?.rows_affected()
            });
        }
        tx.commit_without_announcing().await?;
        Ok(Flushed::Written)
    }

    /// Per-object stats, optionally for one bucket and key prefix, highest first by `order`.
    pub async fn object_stats(
        &self,
        bucket_id: Option<i64>,
        prefix: &str,
        order: StatsOrder,
        limit: Option<u32>,
    ) -> Result<Vec<ObjectStats>, MetadataError> {
        let sql = format!(
            "SELECT b.name AS bucket, s.key, {COUNTER_COLUMNS}, s.last_download_at
             FROM object_stats s JOIN buckets b ON b.id = s.bucket_id
             WHERE ($1 IS NULL OR s.bucket_id = $1) AND substr(s.key, 1, length($2)) = $2
             ORDER BY {}, b.name, s.key LIMIT $3",
            order.order_by()
        );
        // No limit: the largest one, which both dialects take (SQLite's -1 is an error to PostgreSQL).
        let limit = limit.map_or(i64::MAX, i64::from);
        let rows: Vec<ObjectStatsRow> = with_pool!(&self.backend, pool =>
            sqlx::query_as(&sql).bind(bucket_id).bind(prefix).bind(limit).fetch_all(pool).await?);
        Ok(rows.into_iter().map(ObjectStats::from).collect())
    }
}

/// Rows of a stats upsert statement: 11 parameters each, far below either backend's limit.
const STATS_ROWS_PER_STATEMENT: usize = 100;

/// `rows` rows of `columns` parameters: `($1, $2, …), ($12, …)` on PostgreSQL; anonymous `(?, ?, …)` on SQLite,
/// whose lookup of a numbered parameter's name (`sqlite3_bind_parameter_name`, which sqlx calls for each) scans
/// every name before it, so a statement of a thousand numbered parameters costs half a million steps to bind.
fn value_rows(rows: usize, columns: usize, numbered: bool) -> String {
    let mut out = String::new();
    for row in 0..rows {
        out.push_str(if row == 0 { "(" } else { ", (" });
        for column in 0..columns {
            if column > 0 {
                out.push_str(", ");
            }
            if numbered {
                out.push_str(&format!("${}", row * columns + column + 1));
            } else {
                out.push('?');
            }
        }
        out.push(')');
    }
    out
}

/// The upsert of `rows` objects' counters, adding to what is stored; rows of a bucket deleted meanwhile are
/// dropped (the join). `later` is the dialect's two-argument max. `WHERE true`: SQLite's upsert after a SELECT.
fn per_object_upsert(later: &str, rows: usize, numbered: bool) -> String {
    format!(
        "WITH v (bucket_id, key, requests, completed, aborted, truncated, bytes_sent, range_requests, not_modified,
                 head_requests, last_download_at) AS (VALUES {})
         INSERT INTO object_stats AS s (bucket_id, key, requests, completed, aborted, truncated, bytes_sent,
                                        range_requests, not_modified, head_requests, last_download_at)
         SELECT v.bucket_id, v.key, v.requests, v.completed, v.aborted, v.truncated, v.bytes_sent, v.range_requests,
                v.not_modified, v.head_requests, v.last_download_at
         FROM v JOIN buckets b ON b.id = v.bucket_id WHERE true
         ON CONFLICT (bucket_id, key) DO UPDATE SET
             requests = s.requests + excluded.requests, completed = s.completed + excluded.completed,
             aborted = s.aborted + excluded.aborted, truncated = s.truncated + excluded.truncated,
             bytes_sent = s.bytes_sent + excluded.bytes_sent,
             range_requests = s.range_requests + excluded.range_requests,
             not_modified = s.not_modified + excluded.not_modified,
             head_requests = s.head_requests + excluded.head_requests,
             last_download_at = {later}(coalesce(s.last_download_at, 0), coalesce(excluded.last_download_at, 0))",
        value_rows(rows, 11, numbered)
    )
}

/// The upsert of `rows` objects' counters of a day, as [`per_object_upsert`].
fn per_day_upsert(rows: usize, numbered: bool) -> String {
    format!(
        "WITH v (bucket_id, key, day, requests, completed, aborted, bytes_sent, range_requests, not_modified)
             AS (VALUES {})
         INSERT INTO object_stats_daily AS s (bucket_id, key, day, requests, completed, aborted, bytes_sent,
                                              range_requests, not_modified)
         SELECT v.bucket_id, v.key, v.day, v.requests, v.completed, v.aborted, v.bytes_sent, v.range_requests,
                v.not_modified
         FROM v JOIN buckets b ON b.id = v.bucket_id WHERE true
         ON CONFLICT (bucket_id, key, day) DO UPDATE SET
             requests = s.requests + excluded.requests, completed = s.completed + excluded.completed,
             aborted = s.aborted + excluded.aborted, bytes_sent = s.bytes_sent + excluded.bytes_sent,
             range_requests = s.range_requests + excluded.range_requests,
             not_modified = s.not_modified + excluded.not_modified",
        value_rows(rows, 9, numbered)
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::names::BucketName;
    use crate::store::metadata::TestBackend;
    use crate::store::metadata::pool::tests::database;

    on_both_backends!(a_retried_flush_whose_commit_succeeded_adds_nothing);
    async fn a_retried_flush_whose_commit_succeeded_adds_nothing(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let mut batch = Batch::default();
        let counters = Counters { requests: 1, bytes_sent: 10, ..Counters::default() };
        batch.per_object.insert((bucket.id, Arc::from("a")), (counters, Some(5)));
        batch.per_day.insert(((bucket.id, Arc::from("a")), 20_000), counters);
        let flush = |writer: &str, seq| StatsFlush { writer: writer.into(), seq };
        assert_eq!(meta.record_download_stats(&flush("w1", 1), &batch).await.unwrap(), Flushed::Written);
        // The answer to that commit was lost: the same flush again adds nothing.
        assert_eq!(meta.record_download_stats(&flush("w1", 1), &batch).await.unwrap(), Flushed::AlreadyWritten);
        let rows = meta.object_stats(Some(bucket.id), "", StatsOrder::Bytes, None).await.unwrap();
        assert_eq!((rows[0].counters.requests, rows[0].counters.bytes_sent), (1, 10));
        assert_eq!(meta.record_download_stats(&flush("w1", 2), &batch).await.unwrap(), Flushed::Written);
        assert_eq!(meta.record_download_stats(&flush("w2", 1), &batch).await.unwrap(), Flushed::Written);
        let rows = meta.object_stats(Some(bucket.id), "", StatsOrder::Bytes, None).await.unwrap();
        assert_eq!((rows[0].counters.requests, rows[0].counters.bytes_sent), (3, 30));
    }

    on_both_backends!(a_batch_of_hundreds_of_objects_is_written_whole_and_a_deleted_buckets_rows_are_dropped);
    async fn a_batch_of_hundreds_of_objects_is_written_whole_and_a_deleted_buckets_rows_are_dropped(
        backend: TestBackend,
    ) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        // Three statements' worth and a part, each object on two days, and one row of a bucket that is gone.
        let objects = 2 * STATS_ROWS_PER_STATEMENT + 37;
        let mut batch = Batch::default();
        for i in 0..objects {
            let key: Arc<str> = Arc::from(format!("k{i:04}"));
            let counters = Counters { requests: 1, completed: 1, bytes_sent: i as u64, ..Counters::default() };
            batch.per_object.insert((bucket.id, key.clone()), (counters, Some(i as i64)));
            for day in [20_000, 20_001] {
                batch.per_day.insert(((bucket.id, key.clone()), day), counters);
            }
        }
        let counters = Counters { requests: 1, ..Counters::default() };
        batch.per_object.insert((bucket.id + 1000, Arc::from("gone")), (counters, None));
        batch.per_day.insert(((bucket.id + 1000, Arc::from("gone")), 20_000), counters);
        let flush = StatsFlush { writer: "w".into(), seq: 1 };
        assert_eq!(meta.record_download_stats(&flush, &batch).await.unwrap(), Flushed::Written);
        let rows = meta.object_stats(None, "", StatsOrder::Bytes, None).await.unwrap();
        assert_eq!(rows.len(), objects, "every object once, the deleted bucket's row dropped");
        for row in &rows {
            let i: u64 = row.key[1..].parse().unwrap();
            assert_eq!((row.counters.requests, row.counters.bytes_sent), (1, i), "{row:?}");
            assert_eq!(row.last_download_at, Some(i as i64));
        }
        let flush = StatsFlush { writer: "w".into(), seq: 2 };
        meta.record_download_stats(&flush, &batch).await.unwrap();
        let rows = meta.object_stats(None, "k0236", StatsOrder::Bytes, None).await.unwrap();
        assert_eq!((rows[0].counters.requests, rows[0].counters.bytes_sent), (2, 472), "added to what was stored");
        let (days, requests): (i64, i64) = with_pool!(&meta.backend, pool => sqlx::query_as(
            "SELECT count(*), CAST(sum(requests) AS BIGINT) FROM object_stats_daily"
        ).fetch_one(pool).await.unwrap());
        assert_eq!((days as usize, requests as usize), (2 * objects, 2 * 2 * objects), "both days, both flushes");
    }

    on_both_backends!(concurrent_batches_lose_no_increment);
    async fn concurrent_batches_lose_no_increment(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let (writers, batches) = (6, 15);
        let mut tasks = Vec::new();
        for writer in 0..writers {
            let meta = meta.clone();
            tasks.push(tokio::spawn(async move {
                for n in 0..batches {
                    // Both rows in every batch: concurrent transactions lock the same rows, in key order.
                    let mut batch = Batch::default();
                    for key in ["a", "b"] {
                        let counters = Counters { requests: 1, completed: 1, bytes_sent: 10, ..Counters::default() };
                        batch.per_object.insert((bucket.id, Arc::from(key)), (counters, Some(writer * 100 + n)));
                        batch.per_day.insert(((bucket.id, Arc::from(key)), 20_000), counters);
                    }
                    let flush = StatsFlush { writer: format!("w{writer}"), seq: n + 1 };
                    meta.record_download_stats(&flush, &batch).await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let rows = meta.object_stats(Some(bucket.id), "", StatsOrder::Bytes, None).await.unwrap();
        let total = (writers * batches) as u64;
        assert_eq!(rows.len(), 2, "{rows:?}");
        for row in &rows {
            assert_eq!((row.counters.requests, row.counters.bytes_sent), (total, total * 10), "{row:?}");
            assert_eq!(row.last_download_at, Some((writers - 1) * 100 + batches - 1), "the latest wins");
        }
        let top = meta.object_stats(None, "b", StatsOrder::Requests, Some(1)).await.unwrap();
        assert_eq!(top.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn stats_orders_keep_their_spelling() {
        assert_eq!(StatsOrder::ALL.map(StatsOrder::as_str), ["bytes", "requests"]);
        for order in StatsOrder::ALL {
            assert_eq!(StatsOrder::parse(order.as_str()), Some(order));
            assert_eq!(order.to_string(), order.as_str());
        }
        assert_eq!(StatsOrder::parse("size"), None);
        assert_eq!(StatsOrder::default(), StatsOrder::Bytes);
    }
}
