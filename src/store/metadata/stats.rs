//! Per-object download counters: batched adds, and the ranked read behind `blobgate stats` and `GET /stats`.

use std::sync::Arc;

use futures_util::TryStreamExt;

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

/// The eight counters of a totals or ledger row, by their column names.
#[derive(Debug, Clone, Copy)]
struct CounterRow {
    requests: i64,
    completed: i64,
    aborted: i64,
    truncated: i64,
    bytes_sent: i64,
    range_requests: i64,
    not_modified: i64,
    head_requests: i64,
}
from_row!(CounterRow {
    requests,
    completed,
    aborted,
    truncated,
    bytes_sent,
    range_requests,
    not_modified,
    head_requests
});

impl CounterRow {
    fn add(&mut self, other: &CounterRow) {
        self.requests += other.requests;
        self.completed += other.completed;
        self.aborted += other.aborted;
        self.truncated += other.truncated;
        self.bytes_sent += other.bytes_sent;
        self.range_requests += other.range_requests;
        self.not_modified += other.not_modified;
        self.head_requests += other.head_requests;
    }
}

impl From<CounterRow> for Counters {
    fn from(r: CounterRow) -> Self {
        Counters {
            requests: r.requests as u64,
            completed: r.completed as u64,
            aborted: r.aborted as u64,
            truncated: r.truncated as u64,
            bytes_sent: r.bytes_sent as u64,
            range_requests: r.range_requests as u64,
            not_modified: r.not_modified as u64,
            head_requests: r.head_requests as u64,
        }
    }
}

struct ObjectStatsRow {
    bucket: String,
    key: String,
    counters: CounterRow,
    last_download_at: Option<i64>,
}
from_row!(ObjectStatsRow { bucket, key, last_download_at } flatten { counters: CounterRow });

impl From<ObjectStatsRow> for ObjectStats {
    fn from(r: ObjectStatsRow) -> Self {
        ObjectStats { bucket: r.bucket, key: r.key, counters: r.counters.into(), last_download_at: r.last_download_at }
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
    /// flush whose commit did succeed adds nothing (see [`Flushed::AlreadyWritten`]). They are appended to the
    /// ledger, one row per object and day (with the object's latest download that day), and read with the totals
    /// until [`Metadata::fold_stats`] adds them in. Rows of a bucket deleted since the downloads are dropped (they
    /// would violate the foreign key and fail the whole batch, again at every retry). Appends never conflict, so
    /// replicas flushing at once wait for no row.
    ///
    /// SQLite: on a write connection of our own, on a blocking thread ([`append_on_thread`]); through the pool
    /// only if that connection cannot open.
    pub async fn record_download_stats(
        &self,
        flush: &StatsFlush,
        batch: &Arc<Batch>,
    ) -> Result<Flushed, MetadataError> {
        if let Some(readers) = &self.thread_readers {
            let (flush, batch) = (flush.clone(), Arc::clone(batch));
            if let Some(written) = readers.write_on_blocking_thread(move |c| append_on_thread(c, &flush, &batch)).await
            {
                return Ok(written?);
            }
        }
        let numbered = matches!(self.backend, Backend::Postgres(_));
        let per_day: Vec<_> = batch.per_day.iter().collect();
        let mut tx = self.begin_write().await?;
        let now = crate::stats::unix_now();
        let marked = with_tx!(&mut tx.tx, conn => sqlx::query(MARK_FLUSH)
            .bind(&flush.writer)
            .bind(flush.seq)
            .bind(now)
            .execute(&mut **conn)
            .await?.rows_affected());
        if marked == 0 {
            return Ok(Flushed::AlreadyWritten);
        }
        if flush.seq == 1 {
            with_tx!(&mut tx.tx, conn => sqlx::query(FORGET_OLD_MARKS)
                .bind(now - FLUSH_MARK_LIFETIME_SECS)
                .execute(&mut **conn)
                .await?.rows_affected());
        }
        // Appended to the ledger, LEDGER_ROWS_PER_STATEMENT rows a statement: a batch of distinct objects writes
        // the pages at the ledger's end, not a page of each total's tree per object (`fold_stats` moves them there
        // in key order).
        let days = DayNames::of(batch);
        for chunk in per_day.chunks(LEDGER_ROWS_PER_STATEMENT) {
            let sql = ledger_insert(chunk.len(), numbered);
            with_tx!(&mut tx.tx, conn => {
                let mut query = sqlx::query(&sql);
                for (((bucket_id, key), day), (c, last)) in chunk {
                    query = query
                        .bind(bucket_id)
                        .bind(key.as_ref())
                        .bind(days.name(*day))
                        .bind(c.requests as i64)
                        .bind(c.completed as i64)
                        .bind(c.aborted as i64)
                        .bind(c.truncated as i64)
                        .bind(c.bytes_sent as i64)
                        .bind(c.range_requests as i64)
                        .bind(c.not_modified as i64)
                        .bind(c.head_requests as i64)
                        .bind(*last);
                }
                query.execute(&mut **conn).await?.rows_affected()
            });
        }
        tx.commit_without_announcing().await?;
        Ok(Flushed::Written)
    }

    /// Per-object stats, optionally for one bucket and key prefix, highest first by `order`: the folded totals
    /// plus the ledger's rows not folded yet.
    pub async fn object_stats(
        &self,
        bucket_id: Option<i64>,
        prefix: &str,
        order: StatsOrder,
        limit: Option<u32>,
    ) -> Result<Vec<ObjectStats>, MetadataError> {
        let wanted = "($1 IS NULL OR bucket_id = $1) AND substr(key, 1, length($2)) = $2";
        let sql = format!(
            "SELECT b.name AS bucket, s.key, {COUNTER_COLUMNS}, s.last_download_at
             FROM ({}) s JOIN buckets b ON b.id = s.bucket_id
             ORDER BY {}, b.name, s.key LIMIT $3",
            totals_with_ledger(wanted),
            order.order_by()
        );
        // No limit: the largest one, which both dialects take (SQLite's -1 is an error to PostgreSQL).
        let limit = limit.map_or(i64::MAX, i64::from);
        let rows: Vec<ObjectStatsRow> = with_pool!(&self.backend, pool =>
            sqlx::query_as(&sql).bind(bucket_id).bind(prefix).bind(limit).fetch_all(pool).await?);
        Ok(rows.into_iter().map(ObjectStats::from).collect())
    }

    /// Moves the ledger's rows into `object_stats` and `object_stats_daily`, in key order, [`FOLD_CHUNK_ROWS`] at
    /// a time, each chunk its own short write transaction that also moves the fold's cursor (`stats_fold`), so
    /// that readers, a fold that stopped halfway (a crash, a lost connection) and one resuming it all agree on
    /// what is folded: nothing is counted twice or lost. Then deletes the folded rows, in batches. Rows flushed
    /// meanwhile wait for the next fold. Page writes: a total's page is written once per fold for all the objects
    /// on it, where upserts at every flush wrote it once per object. One process folds at a time (a second one
    /// finds the cursor moved and stops). `serve` runs it once a minute.
    pub async fn fold_stats(&self) -> Result<Folded, MetadataError> {
        self.fold_stats_stopping_after(usize::MAX).await
    }

    /// [`Metadata::fold_stats`], stopping (as a crash would) after `chunks` chunks if it gets that far.
    async fn fold_stats_stopping_after(&self, chunks: usize) -> Result<Folded, MetadataError> {
        let mut folded = Folded::default();
        let Some(mut fold) = self.begin_fold().await? else { return Ok(folded) };
        let started = std::time::Instant::now();
        if fold.phase == "folding" && !self.fold_ledger(&mut fold, &mut folded, chunks).await? {
            return Ok(folded);
        }
        folded.folding = started.elapsed();
        let started = std::time::Instant::now();
        folded.deleted = self.delete_folded(fold.upto).await?;
        folded.deleting = started.elapsed();
        Ok(folded)
    }

    /// The fold to do: one left halfway, else a new one over every row in the ledger, else `None`.
    async fn begin_fold(&self) -> Result<Option<FoldState>, MetadataError> {
        let mut tx = self.begin_write().await?;
        if let TxBackend::Postgres(conn) = &mut tx.tx {
            // Identity values are drawn in insert order, not commit order: wait for the flushes in flight, so that
            // no row at or below `upto` commits after it is chosen (flushes wait for this transaction in turn).
            sqlx::query("LOCK TABLE stats_ledger IN SHARE ROW EXCLUSIVE MODE").execute(&mut **conn).await?;
        }
        let state: FoldState = with_tx!(&mut tx.tx, conn => sqlx::query_as(
            "SELECT upto, phase, done_bucket, done_key FROM stats_fold WHERE id = 1"
        ).fetch_one(&mut **conn).await?);
        if state.phase != "idle" {
            return Ok(Some(state));
        }
        let last: Option<i64> = with_tx!(&mut tx.tx, conn =>
            sqlx::query_scalar("SELECT max(id) FROM stats_ledger").fetch_one(&mut **conn).await?);
        let Some(upto) = last else { return Ok(None) };
        with_tx!(&mut tx.tx, conn => sqlx::query(
            "UPDATE stats_fold SET upto = $1, phase = 'folding', done_bucket = -1, done_key = '' WHERE id = 1"
        ).bind(upto).execute(&mut **conn).await?.rows_affected());
        tx.commit_without_announcing().await?;
        Ok(Some(FoldState { upto, phase: "folding".into(), done_bucket: -1, done_key: String::new() }))
    }

    /// Folds the rows up to `fold.upto` of the keys past its cursor, streamed in key order (one read, sorted by
    /// the database), then marks them all folded. `false`: another process moved the cursor, so it folds (or, on
    /// SQLite, the scan failed: the next fold resumes from the cursor).
    ///
    /// SQLite: the ledger is scanned on a blocking thread through a read connection of its own, and handed over a
    /// chunk at a time: sqlx hands each row from its connection's thread to the reading task, two thread switches
    /// a row, which were most of a fold's CPU. PostgreSQL's rows come in batches over the socket.
    async fn fold_ledger(
        &self,
        fold: &mut FoldState,
        folded: &mut Folded,
        max_chunks: usize,
    ) -> Result<bool, MetadataError> {
        let (upto, after_bucket, after_key) = (fold.upto, fold.done_bucket, fold.done_key.clone());
        if let Some(connection) = self.thread_readers.as_ref().and_then(|readers| readers.open_for_scan()) {
            let (sender, mut chunks) = tokio::sync::mpsc::channel(1);
            let scan =
                tokio::task::spawn_blocking(move || scan_ledger(&connection, upto, after_bucket, &after_key, &sender));
            let mut first = true;
            while let Some(chunk) = chunks.recv().await {
                if !std::mem::take(&mut first) {
                    tokio::time::sleep(super::BETWEEN_WRITE_BATCHES).await;
                }
                // Returning drops `chunks`, which stops the scan at its next chunk.
                if folded.chunks >= max_chunks || !self.fold_chunk(fold, chunk, folded).await? {
                    return Ok(false);
                }
            }
            let scanned = scan.await.map_err(|e| e.to_string()).and_then(|read| read.map_err(|e| e.to_string()));
            if let Err(error) = scanned {
                tracing::warn!(%error, "the stats fold's scan of the ledger failed; the next fold resumes");
                return Ok(false);
            }
        } else {
            let mut chunk: Vec<LedgerRow> = Vec::new();
            macro_rules! stream_from {
                ($pool:expr) => {{
                    let mut rows = sqlx::query_as::<_, LedgerRow>(LEDGER_SCAN)
                        .bind(upto)
                        .bind(after_bucket)
                        .bind(&after_key)
                        .fetch($pool);
                    while let Some(row) = rows.try_next().await? {
                        if ends_chunk(&chunk, &row) {
                            let full = std::mem::take(&mut chunk);
                            if folded.chunks >= max_chunks || !self.fold_chunk(fold, full, folded).await? {
                                return Ok(false);
                            }
                            tokio::time::sleep(super::BETWEEN_WRITE_BATCHES).await;
                        }
                        chunk.push(row);
                    }
                }};
            }
            with_pool!(&self.backend, pool => stream_from!(pool));
            if folded.chunks >= max_chunks || (!chunk.is_empty() && !self.fold_chunk(fold, chunk, folded).await?) {
                return Ok(false);
            }
        }
        let mut tx = self.begin_write().await?;
        let marked = with_tx!(&mut tx.tx, conn => sqlx::query(
            "UPDATE stats_fold SET phase = 'deleting'
             WHERE id = 1 AND phase = 'folding' AND upto = $1 AND done_bucket = $2 AND done_key = $3"
        ).bind(fold.upto).bind(fold.done_bucket).bind(&fold.done_key).execute(&mut **conn).await?.rows_affected());
        if marked != 1 {
            return Ok(false);
        }
        tx.commit_without_announcing().await?;
        fold.phase = "deleting".into();
        Ok(true)
    }

    /// Adds one chunk of ledger sums (whole objects, in key order) to the totals and moves the cursor past it, in
    /// one transaction. `false`: the cursor was not where this fold left it (another process folds). SQLite: on the
    /// store's write connection on a blocking thread ([`fold_chunk_on_thread`]), as the appends are.
    async fn fold_chunk(
        &self,
        fold: &mut FoldState,
        chunk: Vec<LedgerRow>,
        folded: &mut Folded,
    ) -> Result<bool, MetadataError> {
        let Some(last) = chunk.last().map(|l| (l.bucket_id, l.key.clone())) else { return Ok(true) };
        let objects = per_object_sums(&chunk);
        let both = Arc::new((chunk, objects));
        let on_thread = match &self.thread_readers {
            Some(readers) => {
                let (both, cursor) = (Arc::clone(&both), (fold.upto, fold.done_bucket, fold.done_key.clone()));
                readers.write_on_blocking_thread(move |c| fold_chunk_on_thread(c, &cursor, &both.0, &both.1)).await
            }
            None => None,
        };
        let moved = match on_thread {
            Some(moved) => moved?,
            None => self.fold_chunk_through_pool(fold, &both.0, &both.1).await?,
        };
        if !moved {
            return Ok(false);
        }
        fold.done_bucket = last.0;
        fold.done_key = last.1;
        folded.rows += both.0.len() as u64;
        folded.objects += both.1.len() as u64;
        folded.chunks += 1;
        Ok(true)
    }

    /// [`Metadata::fold_chunk`]'s transaction through the pool (PostgreSQL; SQLite without a write connection).
    async fn fold_chunk_through_pool(
        &self,
        fold: &FoldState,
        chunk: &[LedgerRow],
        objects: &[LedgerRow],
    ) -> Result<bool, MetadataError> {
        // The later of two timestamps: SQLite's two-argument max, PostgreSQL's greatest.
        let (later, numbered) = match &self.backend {
            Backend::Sqlite(_) => ("max", false),
            Backend::Postgres(_) => ("greatest", true),
        };
        let last = chunk.last().expect("a chunk has rows");
        let mut tx = self.begin_write().await?;
        let moved = with_tx!(&mut tx.tx, conn => sqlx::query(MOVE_FOLD_CURSOR)
        .bind(last.bucket_id)
        .bind(&last.key)
        .bind(fold.upto)
        .bind(fold.done_bucket)
        .bind(&fold.done_key)
        .execute(&mut **conn)
        .await?.rows_affected());
        if moved != 1 {
            return Ok(false);
        }
        for rows in objects.chunks(STATS_ROWS_PER_STATEMENT) {
            let sql = per_object_upsert(later, rows.len(), numbered);
            with_tx!(&mut tx.tx, conn => {
                let mut query = sqlx::query(&sql);
                for r in rows {
                    let c = &r.counters;
                    query = query
                        .bind(r.bucket_id)
                        .bind(&r.key)
                        .bind(c.requests)
                        .bind(c.completed)
                        .bind(c.aborted)
                        .bind(c.truncated)
                        .bind(c.bytes_sent)
                        .bind(c.range_requests)
                        .bind(c.not_modified)
                        .bind(c.head_requests)
                        .bind(r.last_download_at);
                }
                query.execute(&mut **conn).await?.rows_affected()
            });
        }
        for rows in chunk.chunks(STATS_ROWS_PER_STATEMENT) {
            let sql = per_day_upsert(rows.len(), numbered);
            with_tx!(&mut tx.tx, conn => {
                let mut query = sqlx::query(&sql);
                for r in rows {
                    let c = &r.counters;
                    query = query
                        .bind(r.bucket_id)
                        .bind(&r.key)
                        .bind(&r.day)
                        .bind(c.requests)
                        .bind(c.completed)
                        .bind(c.aborted)
                        .bind(c.bytes_sent)
                        .bind(c.range_requests)
                        .bind(c.not_modified);
                }
                query.execute(&mut **conn).await?.rows_affected()
            });
        }
        tx.commit_without_announcing().await?;
        Ok(true)
    }

    /// Deletes the folded rows (up to `upto`), consecutive ids [`FOLD_DELETE_BATCH`] at a time, each range its
    /// own transaction, then marks the fold done.
    async fn delete_folded(&self, upto: i64) -> Result<u64, MetadataError> {
        let first: Option<i64> = with_pool!(&self.backend, pool =>
            sqlx::query_scalar("SELECT min(id) FROM stats_ledger").fetch_one(pool).await?);
        let mut from = first.unwrap_or(upto + 1);
        let mut deleted = 0;
        loop {
            let through = upto.min(from.saturating_add(FOLD_DELETE_BATCH - 1));
            let mut tx = self.begin_write().await?;
            deleted += with_tx!(&mut tx.tx, conn => sqlx::query(
                "DELETE FROM stats_ledger WHERE id >= $1 AND id <= $2
                 AND EXISTS (SELECT 1 FROM stats_fold WHERE id = 1 AND phase = 'deleting' AND upto = $3)"
            ).bind(from).bind(through).bind(upto).execute(&mut **conn).await?.rows_affected());
            if through == upto {
                // Idle only once no folded row is left: another process deleting at once may hold some of these
                // rows uncommitted (readers must go on leaving them out; a later fold marks the fold done when it
                // finds none).
                with_tx!(&mut tx.tx, conn => sqlx::query(
                    "UPDATE stats_fold SET phase = 'idle', done_bucket = -1, done_key = ''
                     WHERE id = 1 AND phase = 'deleting' AND upto = $1
                       AND NOT EXISTS (SELECT 1 FROM stats_ledger WHERE id <= $1)"
                ).bind(upto).execute(&mut **conn).await?.rows_affected());
                tx.commit_without_announcing().await?;
                return Ok(deleted);
            }
            tx.commit_without_announcing().await?;
            from = through + 1;
            tokio::time::sleep(super::BETWEEN_WRITE_BATCHES).await;
        }
    }
}

/// What one [`Metadata::fold_stats`] did: ledger rows (object-days) and objects added to the totals, in how many
/// transactions, and rows deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Folded {
    pub rows: u64,
    pub objects: u64,
    /// Write transactions that added rows.
    pub chunks: usize,
    pub deleted: u64,
    /// How long adding and deleting took, pauses between transactions included.
    pub folding: std::time::Duration,
    pub deleting: std::time::Duration,
}

/// The ledger's object-days up to `$1` of the keys past (`$2`, `$3`), summed, in key order; the columns in
/// [`LedgerRow`]'s order for the thread's read by position (its counters first).
const LEDGER_SCAN: &str = "SELECT CAST(sum(requests) AS BIGINT) AS requests,
        CAST(sum(completed) AS BIGINT) AS completed, CAST(sum(aborted) AS BIGINT) AS aborted,
        CAST(sum(truncated) AS BIGINT) AS truncated, CAST(sum(bytes_sent) AS BIGINT) AS bytes_sent,
        CAST(sum(range_requests) AS BIGINT) AS range_requests, CAST(sum(not_modified) AS BIGINT) AS not_modified,
        CAST(sum(head_requests) AS BIGINT) AS head_requests,
        bucket_id, key, day, max(last_download_at) AS last_download_at
    FROM stats_ledger WHERE id <= $1 AND (bucket_id, key) > ($2, $3)
    GROUP BY bucket_id, key, day ORDER BY bucket_id, key, day";

/// Whether `row` starts the next chunk after `chunk`: the chunk is full and `row` is another object's (the cursor
/// names whole objects, so an object's days never straddle two chunks).
fn ends_chunk(chunk: &[LedgerRow], row: &LedgerRow) -> bool {
    chunk.len() >= FOLD_CHUNK_ROWS && chunk.last().is_some_and(|l| (l.bucket_id, &l.key) != (row.bucket_id, &row.key))
}

/// Records a flush's mark, unless this writer's mark is already at or past it (then the statement changes no row).
const MARK_FLUSH: &str = "INSERT INTO stats_flush_marks AS m (writer, last_seq, updated_at) VALUES ($1, $2, $3)
     ON CONFLICT (writer) DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at
     WHERE m.last_seq < excluded.last_seq";
const FORGET_OLD_MARKS: &str = "DELETE FROM stats_flush_marks WHERE updated_at < $1";

/// The `YYYY-MM-DD` names of a batch's days (a day or two), each made once.
struct DayNames(Vec<(i64, String)>);

impl DayNames {
    fn of(batch: &Batch) -> Self {
        let mut names: Vec<(i64, String)> = Vec::new();
        for (_, day) in batch.per_day.keys() {
            if !names.iter().any(|(d, _)| d == day) {
                names.push((*day, crate::stats::day_name(*day)));
            }
        }
        DayNames(names)
    }

    fn name(&self, day: i64) -> &str {
        self.0.iter().find(|(d, _)| *d == day).map_or("", |(_, name)| name.as_str())
    }
}

/// SQLite: [`Metadata::record_download_stats`] on our own write connection, on this (blocking) thread. Each
/// value is bound straight from the batch: through sqlx, every key was copied into the statement's arguments,
/// and every statement crossed to the connection's thread and back.
fn append_on_thread(
    connection: &mut rusqlite::Connection,
    flush: &StatsFlush,
    batch: &Batch,
) -> rusqlite::Result<Flushed> {
    let tx = connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let now = crate::stats::unix_now();
    // Dropping `tx` without a commit rolls back.
    if tx.prepare_cached(MARK_FLUSH)?.execute(rusqlite::params![flush.writer, flush.seq, now])? == 0 {
        return Ok(Flushed::AlreadyWritten);
    }
    if flush.seq == 1 {
        tx.prepare_cached(FORGET_OLD_MARKS)?.execute([now - FLUSH_MARK_LIFETIME_SECS])?;
    }
    let days = DayNames::of(batch);
    let per_day: Vec<_> = batch.per_day.iter().collect();
    for chunk in per_day.chunks(LEDGER_ROWS_PER_STATEMENT) {
        let mut statement = tx.prepare_cached(&ledger_insert(chunk.len(), false))?;
        let mut column = 0;
        let mut bind = |value: &dyn rusqlite::ToSql| {
            column += 1;
            statement.raw_bind_parameter(column, value)
        };
        for (((bucket_id, key), day), (c, last)) in chunk {
            bind(bucket_id)?;
            bind(&key.as_ref())?;
            bind(&days.name(*day))?;
            for counter in [
                c.requests,
                c.completed,
                c.aborted,
                c.truncated,
                c.bytes_sent,
                c.range_requests,
                c.not_modified,
                c.head_requests,
            ] {
                bind(&(counter as i64))?;
            }
            bind(last)?;
        }
        statement.raw_execute()?;
    }
    tx.commit()?;
    Ok(Flushed::Written)
}

/// Moves the fold's cursor past a chunk, if it is where this fold left it (else another process folds).
const MOVE_FOLD_CURSOR: &str = "UPDATE stats_fold SET done_bucket = $1, done_key = $2
     WHERE id = 1 AND phase = 'folding' AND upto = $3 AND done_bucket = $4 AND done_key = $5";

/// SQLite: [`Metadata::fold_chunk`]'s transaction on the store's write connection, on this (blocking) thread:
/// the cursor moved (`false` if it was not where `cursor` says), the objects' totals and their days' upserted.
fn fold_chunk_on_thread(
    connection: &mut rusqlite::Connection,
    (upto, done_bucket, done_key): &(i64, i64, String),
    chunk: &[LedgerRow],
    objects: &[LedgerRow],
) -> rusqlite::Result<bool> {
    let last = chunk.last().expect("a chunk has rows");
    let tx = connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let moved = tx.prepare_cached(MOVE_FOLD_CURSOR)?.execute(rusqlite::params![
        last.bucket_id,
        last.key,
        upto,
        done_bucket,
        done_key
    ])?;
    if moved != 1 {
        return Ok(false);
    }
    for rows in objects.chunks(STATS_ROWS_PER_STATEMENT) {
        execute_for_rows(&tx, &per_object_upsert("max", rows.len(), false), rows, |r| {
            let c = &r.counters;
            [
                &r.bucket_id,
                &r.key,
                &c.requests,
                &c.completed,
                &c.aborted,
                &c.truncated,
                &c.bytes_sent,
                &c.range_requests,
                &c.not_modified,
                &c.head_requests,
                &r.last_download_at,
            ]
        })?;
    }
    for rows in chunk.chunks(STATS_ROWS_PER_STATEMENT) {
        execute_for_rows(&tx, &per_day_upsert(rows.len(), false), rows, |r| {
            let c = &r.counters;
            [
                &r.bucket_id,
                &r.key,
                &r.day,
                &c.requests,
                &c.completed,
                &c.aborted,
                &c.bytes_sent,
                &c.range_requests,
                &c.not_modified,
            ]
        })?;
    }
    tx.commit()?;
    Ok(true)
}

/// Runs `sql`, whose parameters are `N` for each of `rows` in turn, with the values `values` gives for each.
fn execute_for_rows<'r, const N: usize>(
    tx: &rusqlite::Transaction<'_>,
    sql: &str,
    rows: &'r [LedgerRow],
    values: impl Fn(&'r LedgerRow) -> [&'r dyn rusqlite::ToSql; N],
) -> rusqlite::Result<()> {
    let mut statement = tx.prepare_cached(sql)?;
    let mut column = 0;
    for row in rows {
        for value in values(row) {
            column += 1;
            statement.raw_bind_parameter(column, value)?;
        }
    }
    statement.raw_execute()?;
    Ok(())
}

/// SQLite: reads [`LEDGER_SCAN`] on this (blocking) thread and sends it a chunk at a time, until the rows end or
/// the fold stops listening.
fn scan_ledger(
    connection: &rusqlite::Connection,
    upto: i64,
    after_bucket: i64,
    after_key: &str,
    chunks: &tokio::sync::mpsc::Sender<Vec<LedgerRow>>,
) -> rusqlite::Result<()> {
    use super::thread_reads::ReadRow;
    let mut statement = connection.prepare(LEDGER_SCAN)?;
    debug_assert!(LedgerRow::matches(&statement), "LEDGER_SCAN's columns in LedgerRow's order");
    let mut rows = statement.query(rusqlite::params![upto, after_bucket, after_key])?;
    let mut chunk = Vec::new();
    while let Some(row) = rows.next()? {
        let row = LedgerRow::read_row(row)?;
        if ends_chunk(&chunk, &row) && chunks.blocking_send(std::mem::take(&mut chunk)).is_err() {
            return Ok(());
        }
        chunk.push(row);
    }
    if !chunk.is_empty() {
        let _ = chunks.blocking_send(chunk);
    }
    Ok(())
}

/// Ledger rows (object-days, whole objects) a fold adds to the totals per write transaction: some milliseconds of
/// SQLite's write lock, the keys in order so that neighbours share pages.
const FOLD_CHUNK_ROWS: usize = 1_000;
/// Ledger ids deleted per transaction once folded: consecutive rows, so consecutive pages.
const FOLD_DELETE_BATCH: i64 = 5_000;

/// `stats_fold`'s one row: where the fold is (see migration 0023).
struct FoldState {
    upto: i64,
    phase: String,
    done_bucket: i64,
    done_key: String,
}
from_row!(FoldState { upto, phase, done_bucket, done_key });

/// An object-day's sums of ledger rows, as the fold reads them.
#[derive(Debug, Clone)]
struct LedgerRow {
    bucket_id: i64,
    key: String,
    day: String,
    counters: CounterRow,
    last_download_at: Option<i64>,
}
from_row!(LedgerRow { bucket_id, key, day, last_download_at } flatten { counters: CounterRow });

/// Each object's sums over its days (`day` left as the first's), from rows in key order.
fn per_object_sums(rows: &[LedgerRow]) -> Vec<LedgerRow> {
    let mut objects: Vec<LedgerRow> = Vec::new();
    for r in rows {
        match objects.last_mut() {
            Some(o) if (o.bucket_id, &o.key) == (r.bucket_id, &r.key) => {
                o.counters.add(&r.counters);
                o.last_download_at = o.last_download_at.max(r.last_download_at);
            }
            _ => objects.push(r.clone()),
        }
    }
    objects
}

/// Per-object totals with the ledger's rows not folded yet (`stats_fold` says which are), of the objects
/// `wanted` (a condition on `bucket_id` and `key`): a table of `object_stats`' columns.
pub(super) fn totals_with_ledger(wanted: &str) -> String {
    format!(
        "SELECT bucket_id, key, CAST(sum(requests) AS BIGINT) AS requests,
                CAST(sum(completed) AS BIGINT) AS completed, CAST(sum(aborted) AS BIGINT) AS aborted,
                CAST(sum(truncated) AS BIGINT) AS truncated, CAST(sum(bytes_sent) AS BIGINT) AS bytes_sent,
                CAST(sum(range_requests) AS BIGINT) AS range_requests,
                CAST(sum(not_modified) AS BIGINT) AS not_modified,
                CAST(sum(head_requests) AS BIGINT) AS head_requests, max(last_download_at) AS last_download_at
         FROM (SELECT bucket_id, key, {COUNTER_COLUMNS}, last_download_at FROM object_stats WHERE {wanted}
               UNION ALL
               SELECT bucket_id, key, {COUNTER_COLUMNS}, last_download_at FROM stats_ledger
               WHERE {wanted} AND {NOT_FOLDED}) t
         GROUP BY bucket_id, key"
    )
}

/// Per-object-day counters with the ledger's rows not folded yet: a table of `object_stats_daily`'s columns.
pub(super) fn daily_with_ledger() -> String {
    format!(
        "SELECT bucket_id, key, day, CAST(sum(requests) AS BIGINT) AS requests,
                CAST(sum(completed) AS BIGINT) AS completed, CAST(sum(aborted) AS BIGINT) AS aborted,
                CAST(sum(bytes_sent) AS BIGINT) AS bytes_sent, CAST(sum(range_requests) AS BIGINT) AS range_requests,
                CAST(sum(not_modified) AS BIGINT) AS not_modified
         FROM (SELECT bucket_id, key, day, requests, completed, aborted, bytes_sent, range_requests, not_modified
               FROM object_stats_daily
               UNION ALL
               SELECT bucket_id, key, day, requests, completed, aborted, bytes_sent, range_requests, not_modified
               FROM stats_ledger WHERE {NOT_FOLDED}) t
         GROUP BY bucket_id, key, day"
    )
}

/// A ledger row not folded yet: past the fold's `upto`, or below it with the fold still short of its key. (A
/// correlated read of `stats_fold`'s one row.)
const NOT_FOLDED: &str = "NOT EXISTS (SELECT 1 FROM stats_fold f WHERE f.id = 1 AND stats_ledger.id <= f.upto
         AND (f.phase = 'deleting'
              OR (f.phase = 'folding' AND (stats_ledger.bucket_id, stats_ledger.key) <= (f.done_bucket, f.done_key))))";

/// Rows of a ledger append: 12 parameters each, 6,000 a statement, far below either backend's limit (SQLite's
/// 32,766, PostgreSQL's 65,535): each statement is a round trip to sqlx's SQLite thread.
const LEDGER_ROWS_PER_STATEMENT: usize = 500;
/// Rows of a totals upsert statement: 11 parameters each.
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

/// The append of `rows` object-days' counters to the ledger; rows of a bucket deleted meanwhile are dropped (the
/// join).
fn ledger_insert(rows: usize, numbered: bool) -> String {
    format!(
        "WITH v (bucket_id, key, day, requests, completed, aborted, truncated, bytes_sent, range_requests,
                 not_modified, head_requests, last_download_at) AS (VALUES {})
         INSERT INTO stats_ledger (bucket_id, key, day, requests, completed, aborted, truncated, bytes_sent,
                                   range_requests, not_modified, head_requests, last_download_at)
         SELECT v.bucket_id, v.key, v.day, v.requests, v.completed, v.aborted, v.truncated, v.bytes_sent,
                v.range_requests, v.not_modified, v.head_requests, v.last_download_at
         FROM v JOIN buckets b ON b.id = v.bucket_id",
        value_rows(rows, 12, numbered)
    )
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
        batch.per_day.insert(((bucket.id, Arc::from("a")), 20_000), (counters, Some(5)));
        let flush = |writer: &str, seq| StatsFlush { writer: writer.into(), seq };
        let batch = Arc::new(batch);
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
            let day = Counters { requests: 1, completed: 1, bytes_sent: i as u64, ..Counters::default() };
            for d in [20_000, 20_001] {
                batch.per_day.insert(((bucket.id, key.clone()), d), (day, Some(i as i64)));
            }
        }
        let counters = Counters { requests: 1, ..Counters::default() };
        batch.per_day.insert(((bucket.id + 1000, Arc::from("gone")), 20_000), (counters, None));
        let flush = StatsFlush { writer: "w".into(), seq: 1 };
        let batch = Arc::new(batch);
        assert_eq!(meta.record_download_stats(&flush, &batch).await.unwrap(), Flushed::Written);
        let rows = meta.object_stats(None, "", StatsOrder::Bytes, None).await.unwrap();
        assert_eq!(rows.len(), objects, "every object once, the deleted bucket's row dropped");
        for row in &rows {
            let i: u64 = row.key[1..].parse().unwrap();
            assert_eq!((row.counters.requests, row.counters.bytes_sent), (2, 2 * i), "{row:?}");
            assert_eq!(row.last_download_at, Some(i as i64));
        }
        meta.fold_stats().await.unwrap();
        let flush = StatsFlush { writer: "w".into(), seq: 2 };
        meta.record_download_stats(&flush, &batch).await.unwrap();
        let rows = meta.object_stats(None, "k0236", StatsOrder::Bytes, None).await.unwrap();
        assert_eq!((rows[0].counters.requests, rows[0].counters.bytes_sent), (4, 944), "added to what was stored");
        meta.fold_stats().await.unwrap();
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
                        batch.per_day.insert(((bucket.id, Arc::from(key)), 20_000), (counters, Some(writer * 100 + n)));
                    }
                    let flush = StatsFlush { writer: format!("w{writer}"), seq: n + 1 };
                    let batch = Arc::new(batch);
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

    /// Flushes one batch: `objects` objects `k00000`…, each downloaded once on each of `days` days (`bytes`
    /// bytes each time, its latest download at `at`).
    async fn flush_downloads(
        meta: &Metadata,
        bucket_id: i64,
        writer: &str,
        seq: i64,
        objects: usize,
        days: i64,
        at: i64,
    ) {
        let mut batch = Batch::default();
        for i in 0..objects {
            let key: Arc<str> = Arc::from(format!("k{i:05}"));
            let day =
                Counters { requests: 1, completed: 1, bytes_sent: i as u64, head_requests: 1, ..Counters::default() };
            for d in 0..days {
                batch.per_day.insert(((bucket_id, key.clone()), 20_000 + d), (day, Some(at)));
            }
        }
        let flush = StatsFlush { writer: writer.into(), seq };
        let batch = Arc::new(batch);
        assert_eq!(meta.record_download_stats(&flush, &batch).await.unwrap(), Flushed::Written);
    }

    /// Every object's (requests, bytes, head requests, last download) as readers see them, and the daily rows'
    /// (count, requests) once folded.
    async fn seen(meta: &Metadata) -> Vec<(String, u64, u64, u64, Option<i64>)> {
        let mut rows: Vec<_> = meta
            .object_stats(None, "", StatsOrder::Bytes, None)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.key, r.counters.requests, r.counters.bytes_sent, r.counters.head_requests, r.last_download_at))
            .collect();
        rows.sort();
        rows
    }

    async fn ledger_and_fold(meta: &Metadata) -> (i64, String) {
        let rows: i64 = with_pool!(&meta.backend, pool =>
            sqlx::query_scalar("SELECT count(*) FROM stats_ledger").fetch_one(pool).await.unwrap());
        let phase: String = with_pool!(&meta.backend, pool =>
            sqlx::query_scalar("SELECT phase FROM stats_fold").fetch_one(pool).await.unwrap());
        (rows, phase)
    }

    async fn daily(meta: &Metadata) -> (i64, i64) {
        with_pool!(&meta.backend, pool => sqlx::query_as(
            "SELECT count(*), CAST(coalesce(sum(requests), 0) AS BIGINT) FROM object_stats_daily"
        ).fetch_one(pool).await.unwrap())
    }

    fn expected(objects: usize, times: u64, at: i64) -> Vec<(String, u64, u64, u64, Option<i64>)> {
        (0..objects).map(|i| (format!("k{i:05}"), times, times * i as u64, times, Some(at))).collect()
    }

    on_both_backends!(a_fold_moves_the_ledger_into_the_totals_in_chunks_and_readers_count_every_row_once);
    async fn a_fold_moves_the_ledger_into_the_totals_in_chunks_and_readers_count_every_row_once(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        assert_eq!(meta.fold_stats().await.unwrap().rows, 0, "an empty ledger: nothing to do");
        // Two days an object, so chunks end on whole objects, and two flushes.
        let objects = FOLD_CHUNK_ROWS + FOLD_CHUNK_ROWS / 2 + 7;
        flush_downloads(&meta, bucket.id, "w", 1, objects, 2, 50).await;
        flush_downloads(&meta, bucket.id, "w", 2, objects, 2, 60).await;
        assert_eq!(seen(&meta).await, expected(objects, 4, 60), "read from the ledger alone");
        let folded = meta.fold_stats().await.unwrap();
        assert_eq!(
            (folded.rows, folded.objects, folded.deleted),
            (2 * objects as u64, objects as u64, 4 * objects as u64)
        );
        assert_eq!(folded.chunks, 4, "{FOLD_CHUNK_ROWS} object-days a chunk, whole objects: {folded:?}");
        assert_eq!(ledger_and_fold(&meta).await, (0, "idle".into()));
        assert_eq!(seen(&meta).await, expected(objects, 4, 60), "read from the totals alone");
        assert_eq!(daily(&meta).await, (2 * objects as i64, 4 * objects as i64));
        // More downloads: read with the totals, then added to them.
        flush_downloads(&meta, bucket.id, "w", 3, objects, 1, 70).await;
        assert_eq!(seen(&meta).await, expected(objects, 5, 70));
        meta.fold_stats().await.unwrap();
        assert_eq!(seen(&meta).await, expected(objects, 5, 70));
        assert_eq!(daily(&meta).await, (2 * objects as i64, 5 * objects as i64));
        // A bucket's deletion takes its rows, folded or not.
        flush_downloads(&meta, bucket.id, "w", 4, 3, 1, 80).await;
        let mut tx = meta.begin_write().await.unwrap();
        tx.delete_empty_bucket(bucket.id).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(seen(&meta).await, vec![]);
        assert_eq!(ledger_and_fold(&meta).await, (0, "idle".into()));
    }

    on_both_backends!(a_fold_stopped_halfway_is_resumed_and_downloads_flushed_meanwhile_count_once);
    async fn a_fold_stopped_halfway_is_resumed_and_downloads_flushed_meanwhile_count_once(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let objects = 2 * FOLD_CHUNK_ROWS + 11;
        flush_downloads(&meta, bucket.id, "w", 1, objects, 1, 50).await;
        // Stopped after one chunk, as a crash would stop it: its cursor is past the first chunk's keys.
        let first = meta.fold_stats_stopping_after(1).await.unwrap();
        assert_eq!((first.chunks, first.deleted), (1, 0));
        assert_eq!(ledger_and_fold(&meta).await, (objects as i64, "folding".into()));
        assert_eq!(
            seen(&meta).await,
            expected(objects, 1, 50),
            "folded keys from the totals, the rest from the ledger"
        );
        // Downloads flushed meanwhile, of keys on both sides of the cursor: the next fold leaves them for later.
        flush_downloads(&meta, bucket.id, "w", 2, objects, 1, 60).await;
        assert_eq!(seen(&meta).await, expected(objects, 2, 60));
        let resumed = meta.fold_stats().await.unwrap();
        assert_eq!(resumed.rows, (objects - FOLD_CHUNK_ROWS) as u64, "only what the first did not: {resumed:?}");
        assert_eq!(resumed.deleted, objects as u64);
        assert_eq!(ledger_and_fold(&meta).await, (objects as i64, "idle".into()), "the later flush is left");
        assert_eq!(seen(&meta).await, expected(objects, 2, 60));
        meta.fold_stats().await.unwrap();
        assert_eq!(ledger_and_fold(&meta).await, (0, "idle".into()));
        assert_eq!(seen(&meta).await, expected(objects, 2, 60));
        assert_eq!(daily(&meta).await, (objects as i64, 2 * objects as i64));
    }

    on_both_backends!(folds_and_flushes_of_several_processes_at_once_lose_and_double_nothing);
    async fn folds_and_flushes_of_several_processes_at_once_lose_and_double_nothing(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let (objects, flushes) = (FOLD_CHUNK_ROWS + 300, 8);
        let mut tasks = Vec::new();
        for writer in 0..2 {
            let meta = meta.clone();
            tasks.push(tokio::spawn(async move {
                for seq in 1..=flushes {
                    flush_downloads(&meta, bucket.id, &format!("w{writer}"), seq, objects, 1, 7).await;
                }
            }));
        }
        for _ in 0..2 {
            let meta = meta.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..6 {
                    meta.fold_stats().await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(seen(&meta).await, expected(objects, 2 * flushes as u64, 7));
        while ledger_and_fold(&meta).await != (0, "idle".into()) {
            meta.fold_stats().await.unwrap();
        }
        assert_eq!(seen(&meta).await, expected(objects, 2 * flushes as u64, 7));
        assert_eq!(daily(&meta).await, (objects as i64, 2 * flushes * objects as i64));
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
