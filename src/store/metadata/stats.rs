//! Per-object download counters: batched adds, and the ranked read behind `blobgate stats` and `GET /stats`.

use super::{Backend, Metadata, MetadataError, TxBackend};
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

#[derive(sqlx::FromRow)]
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
    /// every retry).
    pub async fn record_download_stats(&self, flush: &StatsFlush, batch: &Batch) -> Result<Flushed, MetadataError> {
        let mut tx = self.begin_write().await?;
        let TxBackend::Sqlite(sqlite) = &mut tx.tx;
        let now = crate::stats::unix_now();
        let marked = sqlx::query(
            "INSERT INTO stats_flush_marks (writer, last_seq, updated_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (writer) DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at
             WHERE stats_flush_marks.last_seq < excluded.last_seq",
        )
        .bind(&flush.writer)
        .bind(flush.seq)
        .bind(now)
        .execute(&mut **sqlite)
        .await?;
        if marked.rows_affected() == 0 {
            return Ok(Flushed::AlreadyWritten);
        }
        if flush.seq == 1 {
            sqlx::query("DELETE FROM stats_flush_marks WHERE updated_at < ?1")
                .bind(now - FLUSH_MARK_LIFETIME_SECS)
                .execute(&mut **sqlite)
                .await?;
        }
        for ((bucket_id, key), (c, last)) in &batch.per_object {
            sqlx::query(
                "INSERT INTO object_stats (bucket_id, key, requests, completed, aborted, truncated, bytes_sent,
                                           range_requests, not_modified, head_requests, last_download_at)
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11 WHERE EXISTS (SELECT 1 FROM buckets WHERE id = ?1)
                 ON CONFLICT (bucket_id, key) DO UPDATE SET
                     requests = requests + excluded.requests, completed = completed + excluded.completed,
                     aborted = aborted + excluded.aborted, truncated = truncated + excluded.truncated,
                     bytes_sent = bytes_sent + excluded.bytes_sent,
                     range_requests = range_requests + excluded.range_requests,
                     not_modified = not_modified + excluded.not_modified,
                     head_requests = head_requests + excluded.head_requests,
                     last_download_at = max(coalesce(last_download_at, 0), coalesce(excluded.last_download_at, 0))",
            )
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
            .bind(last)
            .execute(&mut **sqlite)
            .await?;
        }
        for (((bucket_id, key), day), c) in &batch.per_day {
            let day = crate::stats::day_name(*day);
            sqlx::query(
                "INSERT INTO object_stats_daily (bucket_id, key, day, requests, completed, aborted, bytes_sent,
                                                 range_requests, not_modified)
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9 WHERE EXISTS (SELECT 1 FROM buckets WHERE id = ?1)
                 ON CONFLICT (bucket_id, key, day) DO UPDATE SET
                     requests = requests + excluded.requests, completed = completed + excluded.completed,
                     aborted = aborted + excluded.aborted, bytes_sent = bytes_sent + excluded.bytes_sent,
                     range_requests = range_requests + excluded.range_requests,
                     not_modified = not_modified + excluded.not_modified",
            )
            .bind(bucket_id)
            .bind(key.as_ref())
            .bind(day)
            .bind(c.requests as i64)
            .bind(c.completed as i64)
            .bind(c.aborted as i64)
            .bind(c.bytes_sent as i64)
            .bind(c.range_requests as i64)
            .bind(c.not_modified as i64)
            .execute(&mut **sqlite)
            .await?;
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
        let Backend::Sqlite(pool) = &self.backend;
        let sql = format!(
            "SELECT b.name AS bucket, s.key, {COUNTER_COLUMNS}, s.last_download_at
             FROM object_stats s JOIN buckets b ON b.id = s.bucket_id
             WHERE (?1 IS NULL OR s.bucket_id = ?1) AND substr(s.key, 1, length(?2)) = ?2
             ORDER BY {}, b.name, s.key LIMIT ?3",
            order.order_by()
        );
        let rows: Vec<ObjectStatsRow> =
            sqlx::query_as(&sql).bind(bucket_id).bind(prefix).bind(limit.map_or(-1, i64::from)).fetch_all(pool).await?;
        Ok(rows.into_iter().map(ObjectStats::from).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
