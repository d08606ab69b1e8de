//! The SQLite metadata store: the only module that contains SQL.
//!
//! WAL lets the server read while a CLI writes; a busy timeout turns lock contention into waiting rather than
//! errors; every write transaction starts with `BEGIN IMMEDIATE`, so it takes the write lock up front instead of
//! failing with SQLITE_BUSY half-way when it upgrades from a read.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, Sqlite, SqlitePool, Transaction};

use super::generation::Generation;
use super::sealing::{self, NONCE_LEN, SealError, SecretsKey, is_sealed};
use crate::names::{BucketName, ObjectAttrs, ObjectKey};
use crate::stats::{Batch, Counters};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub id: i64,
    pub name: String,
    pub public: bool,
    pub created_at: i64,
    /// Cache-Control served for the bucket's objects that store none.
    pub default_cache_control: Option<String>,
}

const BUCKET_COLUMNS: &str = "id, name, public, created_at, default_cache_control";
/// Every column of an object row, in the order `object_from_row` reads them.
const OBJECT_COLUMNS: &str =
    "bucket_id, key, sha256, size, content_type, cache_control, content_disposition, created_at, updated_at";

/// The embedded migrations: applied by `open`, compared by `open_read_only`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRecord {
    pub bucket_id: i64,
    pub key: String,
    pub sha256: String,
    pub size: u64,
    pub attrs: ObjectAttrs,
    pub created_at: i64,
    pub updated_at: i64,
}

/// How an upsert changed the object row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upsert {
    Created,
    /// The row already held exactly this content and these attributes: nothing was written.
    Unchanged,
    /// The row was rewritten; `previous_sha256` is the hash it referenced before.
    Replaced {
        previous_sha256: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("bucket {0} already exists")]
    BucketExists(String),
    #[error("no such bucket: {0}")]
    NoSuchBucket(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Sealing(#[from] SealError),
    #[error("signing keys need the secrets key, and none was loaded")]
    NoSecretsKey,
}

#[derive(Clone)]
pub struct Metadata {
    pool: SqlitePool,
    /// Bumped after every commit that may change what a server caches.
    generation: Arc<Generation>,
    /// Opened by `open_read_only`.
    read_only: bool,
    /// Seals signing-key secrets in the database (`store::sealing`); `Store::open` sets it.
    secrets_key: Option<Arc<SecretsKey>>,
}

/// One row of the change log: what a server must evict from its caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheChange {
    pub seq: i64,
    pub kind: String,
    pub bucket_id: Option<i64>,
    pub name: String,
}

impl Metadata {
    /// Opens (creating if needed) the database and applies the embedded migrations.
    pub async fn open(path: &Path, busy_timeout: Duration, generation: Arc<Generation>) -> anyhow::Result<Self> {
        // SQLite would create the database as 0644 minus the umask, and it gives the -wal and -shm files the
        // database's mode: creating it owner-only first (an empty file is an empty database) covers all three.
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(super::PRIVATE_FILE_MODE)
            .open(path)
            .with_context(|| format!("cannot create database {}", path.display()))?;
        let url = format!("sqlite://{}", path.display());
        let options = SqliteConnectOptions::from_str(&url)
            .with_context(|| format!("invalid database path {}", path.display()))?
            .create_if_missing(true)
            // Small pages: the rows are small, lookups go through mmap, and every page SQLite must copy with
            // pread/pwrite (page 1 at connect, stats flushes, checkpoints) costs a quarter of the default.
            // Applies to new databases only; an existing one keeps its page size.
            .page_size(1024)
            .journal_mode(SqliteJournalMode::Wal)
            // NORMAL is durable across process crashes in WAL mode; blob files are fsynced separately.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(busy_timeout)
            // Pages come from a shared mapping instead of pread64 copies into each connection's cache.
            .pragma("mmap_size", "268435456")
            .foreign_keys(true);
        // Few connections: the hot path reads from in-memory caches, and every connection loads the schema
        // with page reads of its own.
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .with_context(|| format!("cannot open database {}", path.display()))?;
        MIGRATOR.run(&pool).await.context("cannot apply database migrations")?;
        Ok(Self { pool, generation, read_only: false, secrets_key: None })
    }

    /// Opens an existing database for reading only (`mode=ro`): no migrations, no writes, no files created, so
    /// it works in a read-only data dir. Check `needs_migration` before trusting the schema.
    ///
    /// Even a read-only SQLite connection creates the `-wal` and `-shm` files of a WAL database when they are
    /// missing (and fails where it cannot). They exist while any process has the database open; when there is no
    /// `-wal`, every commit is in the main file, so it is opened `immutable` and SQLite reads just that file.
    /// (A writer that starts during such a read writes to its own new WAL; only a checkpoint, after 1000 pages
    /// or at its close, touches the main file.)
    pub async fn open_read_only(path: &Path, busy_timeout: Duration) -> anyhow::Result<Self> {
        if !path.is_file() {
            anyhow::bail!("no database at {}", path.display());
        }
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let live_wal = Path::new(&wal).exists();
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .immutable(!live_wal)
            .busy_timeout(busy_timeout)
            .pragma("mmap_size", "268435456");
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .with_context(|| format!("cannot open database {} read-only", path.display()))?;
        // Nothing is written, so nothing needs to reach other processes: a private counter.
        let generation = Arc::new(Generation::private()?);
        Ok(Self { pool, generation, read_only: true, secrets_key: None })
    }

    /// Whether the database lacks migrations this binary embeds (a read-only open cannot apply them).
    pub async fn needs_migration(&self) -> bool {
        let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        let applied: Result<i64, _> =
            sqlx::query_scalar("SELECT coalesce(max(version), 0) FROM _sqlx_migrations WHERE success")
                .fetch_one(&self.pool)
                .await;
        applied.map_or(true, |v| v < latest)
    }

    /// Signing-key secrets are sealed with `key` on the way in and opened on the way out.
    pub fn with_secrets_key(mut self, key: SecretsKey) -> Self {
        self.secrets_key = Some(Arc::new(key));
        self
    }

    fn secrets_key(&self) -> Result<&SecretsKey, MetadataError> {
        self.secrets_key.as_deref().ok_or(MetadataError::NoSecretsKey)
    }

    pub fn generation(&self) -> &Arc<Generation> {
        &self.generation
    }

    /// Change-log rows after `seq`, oldest first.
    pub async fn changes_since(&self, seq: i64) -> Result<Vec<CacheChange>, MetadataError> {
        let rows = sqlx::query("SELECT seq, kind, bucket_id, name FROM cache_changes WHERE seq > ?1 ORDER BY seq")
            .bind(seq)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| CacheChange { seq: r.get(0), kind: r.get(1), bucket_id: r.get(2), name: r.get(3) })
            .collect())
    }

    /// The newest change-log sequence number (0 when empty): where a fresh cache starts.
    pub async fn last_change(&self) -> Result<i64, MetadataError> {
        Ok(sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM cache_changes").fetch_one(&self.pool).await?)
    }

    /// Drops change-log rows up to `seq`, once the server has applied them.
    pub async fn prune_changes(&self, seq: i64) -> Result<(), MetadataError> {
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM cache_changes WHERE seq <= ?1").bind(seq).execute(&mut *tx.tx).await?;
        tx.commit_without_bump().await
    }

    /// Folds the WAL into the database file and truncates it, then closes. The next process then starts with
    /// an empty WAL instead of reading this one's frames back.
    pub async fn close(&self) {
        if self.read_only {
            return self.pool.close().await;
        }
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(&self.pool).await {
            tracing::debug!(error = %e, "checkpoint at close failed; SQLite will recover the WAL on the next open");
        }
        self.pool.close().await;
    }

    /// Starts a write transaction holding SQLite's write lock (`BEGIN IMMEDIATE`).
    pub async fn begin_write(&self) -> Result<WriteTx, MetadataError> {
        let tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        Ok(WriteTx { tx, generation: self.generation.clone() })
    }

    pub async fn create_bucket(&self, name: &BucketName, public: bool, now: i64) -> Result<Bucket, MetadataError> {
        let mut tx = self.begin_write().await?;
        let inserted = sqlx::query(
            "INSERT INTO buckets (name, public, created_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO NOTHING RETURNING id",
        )
        .bind(name.as_str())
        .bind(public)
        .bind(now)
        .fetch_optional(&mut *tx.tx)
        .await?;
        let Some(row) = inserted else {
            return Err(MetadataError::BucketExists(name.to_string()));
        };
        tx.commit().await?;
        Ok(Bucket { id: row.get(0), name: name.to_string(), public, created_at: now, default_cache_control: None })
    }

    pub async fn bucket(&self, name: &BucketName) -> Result<Option<Bucket>, MetadataError> {
        let sql = format!("SELECT {BUCKET_COLUMNS} FROM buckets WHERE name = ?1");
        let row = sqlx::query(&sql).bind(name.as_str()).fetch_optional(&self.pool).await?;
        Ok(row.map(|r| bucket_from_row(&r)))
    }

    pub async fn list_buckets(&self) -> Result<Vec<Bucket>, MetadataError> {
        let sql = format!("SELECT {BUCKET_COLUMNS} FROM buckets ORDER BY name");
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        Ok(rows.iter().map(bucket_from_row).collect())
    }

    /// Changes a bucket's access and its default Cache-Control; `None` leaves that field as it is, and
    /// `Some(None)` removes the default. Returns the changed bucket, or `None` when there is no such bucket.
    pub async fn update_bucket(
        &self,
        name: &BucketName,
        public: Option<bool>,
        default_cache_control: Option<Option<&str>>,
    ) -> Result<Option<Bucket>, MetadataError> {
        let mut tx = self.begin_write().await?;
        let sql = format!(
            "UPDATE buckets SET public = coalesce(?2, public),
                 default_cache_control = CASE WHEN ?3 THEN ?4 ELSE default_cache_control END
             WHERE name = ?1 RETURNING {BUCKET_COLUMNS}"
        );
        let row = sqlx::query(&sql)
            .bind(name.as_str())
            .bind(public)
            .bind(default_cache_control.is_some())
            .bind(default_cache_control.flatten())
            .fetch_optional(&mut *tx.tx)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let bucket = bucket_from_row(&row);
        tx.commit().await?;
        Ok(Some(bucket))
    }

    /// The object and its bucket's default Cache-Control, read in one statement so that the two agree.
    pub async fn object_with_bucket_default(
        &self,
        bucket_id: i64,
        key: &str,
    ) -> Result<Option<(ObjectRecord, Option<String>)>, MetadataError> {
        let row = sqlx::query(
            "SELECT o.bucket_id, o.key, o.sha256, o.size, o.content_type, o.cache_control, o.content_disposition,
                    o.created_at, o.updated_at, b.default_cache_control
             FROM objects o JOIN buckets b ON b.id = o.bucket_id WHERE o.bucket_id = ?1 AND o.key = ?2",
        )
        .bind(bucket_id)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| (object_from_row(&r), r.get(9))))
    }

    /// One page of a bucket's objects whose keys start with `prefix`, in key order, after the key `after` (the
    /// last one of the previous page). A keyset scan over the primary key: each page is one index range read,
    /// however far into the bucket it is, and a listing never holds more than a page in memory.
    pub async fn list_objects_page(
        &self,
        bucket_id: i64,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ObjectRecord>, MetadataError> {
        let upper = prefix_upper_bound(prefix);
        let sql = list_objects_sql(after.is_some(), upper.is_some());
        let rows = sqlx::query(&sql)
            .bind(bucket_id)
            .bind(after.unwrap_or(prefix))
            .bind(upper)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(object_from_row).collect())
    }

    pub async fn object_by_key(&self, bucket_id: i64, key: &str) -> Result<Option<ObjectRecord>, MetadataError> {
        let row = sqlx::query(
            "SELECT bucket_id, key, sha256, size, content_type, cache_control, content_disposition,
                    created_at, updated_at
             FROM objects WHERE bucket_id = ?1 AND key = ?2",
        )
        .bind(bucket_id)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| object_from_row(&r)))
    }

    /// How many objects reference the blob, outside any write transaction (for the sweep's first pass).
    pub async fn blob_is_referenced(&self, sha256: &str) -> Result<bool, MetadataError> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM objects WHERE sha256 = ?1")
            .bind(sha256)
            .fetch_one(&self.pool)
            .await?;
        Ok(n > 0)
    }
}

/// A bearer token's stored form: never the token itself, only its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: String,
    pub secret_hash: Vec<u8>,
    pub bucket_id: i64,
    pub bucket_name: String,
    pub prefix: String,
    pub scope: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningKey {
    pub id: String,
    pub secret: Vec<u8>,
    pub created_at: i64,
    pub retired_at: Option<i64>,
}

const TOKEN_COLUMNS: &str =
    "t.id, t.secret_hash, t.bucket_id, b.name, t.prefix, t.scope, t.created_at, t.expires_at, t.revoked_at";

impl Metadata {
    pub async fn create_token(&self, token: &TokenRecord) -> Result<(), MetadataError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO tokens (id, secret_hash, bucket_id, prefix, scope, created_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .bind(&token.id)
        .bind(&token.secret_hash)
        .bind(token.bucket_id)
        .bind(&token.prefix)
        .bind(&token.scope)
        .bind(token.created_at)
        .bind(token.expires_at)
        .execute(&mut *tx.tx)
        .await?;
        tx.commit().await
    }

    pub async fn token(&self, id: &str) -> Result<Option<TokenRecord>, MetadataError> {
        let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens t JOIN buckets b ON b.id = t.bucket_id WHERE t.id = ?1");
        let row = sqlx::query(&sql).bind(id).fetch_optional(&self.pool).await?;
        Ok(row.map(|r| token_from_row(&r)))
    }

    pub async fn list_tokens(&self) -> Result<Vec<TokenRecord>, MetadataError> {
        let sql = format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens t JOIN buckets b ON b.id = t.bucket_id ORDER BY t.created_at, t.id"
        );
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        Ok(rows.iter().map(token_from_row).collect())
    }

    /// Marks a token revoked; `false` when there is no such live token.
    pub async fn revoke_token(&self, id: &str, now: i64) -> Result<bool, MetadataError> {
        self.stamp_once("UPDATE tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL", id, now).await
    }

    /// Runs an update that sets a timestamp on one row unless it is already set; true when a row changed.
    async fn stamp_once(&self, sql: &'static str, id: &str, now: i64) -> Result<bool, MetadataError> {
        let mut tx = self.begin_write().await?;
        let changed = sqlx::query(sql).bind(id).bind(now).execute(&mut *tx.tx).await?.rows_affected();
        tx.commit().await?;
        Ok(changed == 1)
    }

    pub async fn create_signing_key(&self, key: &SigningKey) -> Result<(), MetadataError> {
        let sealed = sealing::seal(self.secrets_key()?, &key.id, &key.secret, fresh_nonce()?);
        let mut tx = self.begin_write().await?;
        sqlx::query("INSERT INTO signing_keys (id, secret, created_at) VALUES (?1, ?2, ?3)")
            .bind(&key.id)
            .bind(&sealed)
            .bind(key.created_at)
            .execute(&mut *tx.tx)
            .await?;
        tx.commit().await
    }

    /// The newest key that is not retired: the one new links are signed with.
    pub async fn newest_signing_key(&self) -> Result<Option<SigningKey>, MetadataError> {
        let row = sqlx::query(
            "SELECT id, secret, created_at, retired_at FROM signing_keys WHERE retired_at IS NULL
             ORDER BY created_at DESC, rowid DESC LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| self.signing_key_from_row(&r)).transpose()
    }

    pub async fn signing_key(&self, id: &str) -> Result<Option<SigningKey>, MetadataError> {
        let row = sqlx::query("SELECT id, secret, created_at, retired_at FROM signing_keys WHERE id = ?1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| self.signing_key_from_row(&r)).transpose()
    }

    pub async fn list_signing_keys(&self) -> Result<Vec<SigningKey>, MetadataError> {
        let rows =
            sqlx::query("SELECT id, secret, created_at, retired_at FROM signing_keys ORDER BY created_at, rowid")
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| self.signing_key_from_row(r)).collect()
    }

    /// Seals every signing key still stored in the clear (rows from before sealing), and checks that every sealed
    /// one opens with this secrets key, so a wrong key file fails at start rather than on a request. Returns how
    /// many rows it sealed.
    pub async fn seal_signing_keys(&self) -> Result<usize, MetadataError> {
        let key = self.secrets_key()?;
        let stored = self.stored_signing_secrets(&self.pool).await?;
        if stored.iter().all(|(_, s)| is_sealed(s)) {
            for (id, s) in &stored {
                sealing::open(key, id, s)?;
            }
            return Ok(0);
        }
        let mut tx = self.begin_write().await?;
        // The plaintext must not stay behind in the page's free space.
        sqlx::query("PRAGMA secure_delete = ON").execute(&mut *tx.tx).await?;
        let mut sealed = 0;
        for (id, s) in self.stored_signing_secrets(&mut *tx.tx).await? {
            let secret = sealing::open(key, &id, &s)?;
            if !is_sealed(&s) {
                sqlx::query("UPDATE signing_keys SET secret = ?2 WHERE id = ?1")
                    .bind(&id)
                    .bind(sealing::seal(key, &id, &secret, fresh_nonce()?))
                    .execute(&mut *tx.tx)
                    .await?;
                sealed += 1;
            }
        }
        sqlx::query("PRAGMA secure_delete = OFF").execute(&mut *tx.tx).await?;
        tx.commit().await?;
        Ok(sealed)
    }

    /// Whether any signing key is stored sealed: then a missing secrets key file is an error, not a fresh start.
    pub async fn has_sealed_signing_keys(&self) -> Result<bool, MetadataError> {
        Ok(self.stored_signing_secrets(&self.pool).await?.iter().any(|(_, s)| is_sealed(s)))
    }

    async fn stored_signing_secrets<'e>(
        &self,
        executor: impl sqlx::SqliteExecutor<'e>,
    ) -> Result<Vec<(String, Vec<u8>)>, MetadataError> {
        let rows = sqlx::query("SELECT id, secret FROM signing_keys").fetch_all(executor).await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    fn signing_key_from_row(&self, r: &sqlx::sqlite::SqliteRow) -> Result<SigningKey, MetadataError> {
        let id: String = r.get(0);
        let stored: Vec<u8> = r.get(1);
        let secret = sealing::open(self.secrets_key()?, &id, &stored)?;
        Ok(SigningKey { id, secret, created_at: r.get(2), retired_at: r.get(3) })
    }

    pub async fn retire_signing_key(&self, id: &str, now: i64) -> Result<bool, MetadataError> {
        self.stamp_once("UPDATE signing_keys SET retired_at = ?2 WHERE id = ?1 AND retired_at IS NULL", id, now).await
    }

    /// Revokes one signed URL by its signature; expired entries are pruned on the way.
    pub async fn revoke_signature(&self, signature: &str, expires_at: i64, now: i64) -> Result<(), MetadataError> {
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM revoked_signatures WHERE expires_at < ?1").bind(now).execute(&mut *tx.tx).await?;
        sqlx::query(
            "INSERT INTO revoked_signatures (signature, expires_at, revoked_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (signature) DO NOTHING",
        )
        .bind(signature)
        .bind(expires_at)
        .bind(now)
        .execute(&mut *tx.tx)
        .await?;
        tx.commit().await
    }

    pub async fn signature_revoked(&self, signature: &str) -> Result<bool, MetadataError> {
        let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM revoked_signatures WHERE signature = ?1")
            .bind(signature)
            .fetch_optional(&self.pool)
            .await?;
        Ok(found.is_some())
    }
}

/// One object's row of `object_stats`, with its bucket's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStats {
    pub bucket: String,
    pub key: String,
    pub counters: Counters,
    pub last_download_at: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsOrder {
    Bytes,
    Requests,
}

const COUNTER_COLUMNS: &str =
    "requests, completed, aborted, truncated, bytes_sent, range_requests, not_modified, head_requests";

impl Metadata {
    /// Adds a batch of download counters in one write transaction. Rows of a bucket deleted since the downloads
    /// are dropped (they would violate the foreign key and fail the whole batch, again at every retry).
    pub async fn record_download_stats(&self, batch: &Batch) -> Result<(), MetadataError> {
        let mut tx = self.begin_write().await?;
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
            .execute(&mut *tx.tx)
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
            .execute(&mut *tx.tx)
            .await?;
        }
        tx.commit_without_bump().await
    }

    /// Per-object stats, optionally for one bucket and key prefix, highest first by `order`.
    pub async fn object_stats(
        &self,
        bucket_id: Option<i64>,
        prefix: &str,
        order: StatsOrder,
        limit: Option<u32>,
    ) -> Result<Vec<ObjectStats>, MetadataError> {
        let order_by = match order {
            StatsOrder::Bytes => "s.bytes_sent DESC, s.requests DESC",
            StatsOrder::Requests => "s.requests DESC, s.bytes_sent DESC",
        };
        let sql = format!(
            "SELECT b.name, s.key, {COUNTER_COLUMNS}, s.last_download_at
             FROM object_stats s JOIN buckets b ON b.id = s.bucket_id
             WHERE (?1 IS NULL OR s.bucket_id = ?1) AND substr(s.key, 1, length(?2)) = ?2
             ORDER BY {order_by}, b.name, s.key LIMIT ?3"
        );
        let rows = sqlx::query(&sql)
            .bind(bucket_id)
            .bind(prefix)
            .bind(limit.map_or(-1, i64::from))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| ObjectStats {
                bucket: r.get(0),
                key: r.get(1),
                counters: Counters {
                    requests: r.get::<i64, _>(2) as u64,
                    completed: r.get::<i64, _>(3) as u64,
                    aborted: r.get::<i64, _>(4) as u64,
                    truncated: r.get::<i64, _>(5) as u64,
                    bytes_sent: r.get::<i64, _>(6) as u64,
                    range_requests: r.get::<i64, _>(7) as u64,
                    not_modified: r.get::<i64, _>(8) as u64,
                    head_requests: r.get::<i64, _>(9) as u64,
                },
                last_download_at: r.get(10),
            })
            .collect())
    }
}

/// A write transaction. Dropping it without `commit` rolls back.
pub struct WriteTx {
    tx: Transaction<'static, Sqlite>,
    generation: Arc<Generation>,
}

impl WriteTx {
    /// Commits, then tells every server sharing the data dir that something changed.
    pub async fn commit(self) -> Result<(), MetadataError> {
        self.tx.commit().await?;
        self.generation.bump();
        Ok(())
    }

    /// For writes to tables no server caches (download stats, the change log itself).
    async fn commit_without_bump(self) -> Result<(), MetadataError> {
        Ok(self.tx.commit().await?)
    }

    pub async fn bucket(&mut self, name: &BucketName) -> Result<Option<Bucket>, MetadataError> {
        let sql = format!("SELECT {BUCKET_COLUMNS} FROM buckets WHERE name = ?1");
        let row = sqlx::query(&sql).bind(name.as_str()).fetch_optional(&mut *self.tx).await?;
        Ok(row.map(|r| bucket_from_row(&r)))
    }

    pub async fn object_count(&mut self, bucket_id: i64) -> Result<u64, MetadataError> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM objects WHERE bucket_id = ?1")
            .bind(bucket_id)
            .fetch_one(&mut *self.tx)
            .await?;
        Ok(n as u64)
    }

    /// Deletes up to `limit` objects of a bucket, first keys first; returns the hashes they referenced.
    pub async fn delete_objects_batch(&mut self, bucket_id: i64, limit: u32) -> Result<Vec<String>, MetadataError> {
        let hashes = sqlx::query_scalar(
            "DELETE FROM objects WHERE bucket_id = ?1
                 AND key IN (SELECT key FROM objects WHERE bucket_id = ?1 ORDER BY key LIMIT ?2)
             RETURNING sha256",
        )
        .bind(bucket_id)
        .bind(i64::from(limit))
        .fetch_all(&mut *self.tx)
        .await?;
        Ok(hashes)
    }

    /// Deletes an empty bucket with its tokens (explicitly, so the change log names each one) and, by cascade,
    /// its download stats. Returns how many tokens went with it.
    pub async fn delete_empty_bucket(&mut self, bucket_id: i64) -> Result<u64, MetadataError> {
        let tokens =
            sqlx::query("DELETE FROM tokens WHERE bucket_id = ?1").bind(bucket_id).execute(&mut *self.tx).await?;
        sqlx::query("DELETE FROM buckets WHERE id = ?1").bind(bucket_id).execute(&mut *self.tx).await?;
        Ok(tokens.rows_affected())
    }

    /// Inserts or replaces the object row. A row that already holds the same hash and attributes is left as it
    /// is, so importing the same tree twice changes nothing (not even Last-Modified).
    pub async fn upsert_object(
        &mut self,
        bucket_id: i64,
        key: &ObjectKey,
        sha256: &str,
        size: u64,
        attrs: &ObjectAttrs,
        now: i64,
    ) -> Result<Upsert, MetadataError> {
        let existing = sqlx::query(
            "SELECT sha256, size, content_type, cache_control, content_disposition
             FROM objects WHERE bucket_id = ?1 AND key = ?2",
        )
        .bind(bucket_id)
        .bind(key.as_str())
        .fetch_optional(&mut *self.tx)
        .await?;
        let size = i64::try_from(size).expect("object sizes fit in i64");
        let outcome = match existing {
            Some(row) => {
                let same = row.get::<String, _>(0) == sha256
                    && row.get::<i64, _>(1) == size
                    && row.get::<Option<String>, _>(2) == attrs.content_type
                    && row.get::<Option<String>, _>(3) == attrs.cache_control
                    && row.get::<Option<String>, _>(4) == attrs.content_disposition;
                if same {
                    return Ok(Upsert::Unchanged);
                }
                Upsert::Replaced { previous_sha256: row.get(0) }
            }
            None => Upsert::Created,
        };
        sqlx::query(
            "INSERT INTO objects (bucket_id, key, sha256, size, content_type, cache_control, content_disposition,
                                  created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)
             ON CONFLICT (bucket_id, key) DO UPDATE SET
                 sha256 = excluded.sha256, size = excluded.size, content_type = excluded.content_type,
                 cache_control = excluded.cache_control, content_disposition = excluded.content_disposition,
                 updated_at = excluded.updated_at",
        )
        .bind(bucket_id)
        .bind(key.as_str())
        .bind(sha256)
        .bind(size)
        .bind(&attrs.content_type)
        .bind(&attrs.cache_control)
        .bind(&attrs.content_disposition)
        .bind(now)
        .execute(&mut *self.tx)
        .await?;
        Ok(outcome)
    }

    /// Deletes the object row; returns the hash it referenced, or `None` when there was no such object.
    pub async fn delete_object(&mut self, bucket_id: i64, key: &ObjectKey) -> Result<Option<String>, MetadataError> {
        let sha = sqlx::query_scalar("DELETE FROM objects WHERE bucket_id = ?1 AND key = ?2 RETURNING sha256")
            .bind(bucket_id)
            .bind(key.as_str())
            .fetch_optional(&mut *self.tx)
            .await?;
        Ok(sha)
    }

    pub async fn blob_is_referenced(&mut self, sha256: &str) -> Result<bool, MetadataError> {
        let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM objects WHERE sha256 = ?1 LIMIT 1")
            .bind(sha256)
            .fetch_optional(&mut *self.tx)
            .await?;
        Ok(found.is_some())
    }
}

fn bucket_from_row(r: &sqlx::sqlite::SqliteRow) -> Bucket {
    Bucket { id: r.get(0), name: r.get(1), public: r.get(2), created_at: r.get(3), default_cache_control: r.get(4) }
}

/// The page query of `list_objects_page`. ?2 is the lower bound (inclusive: the prefix; exclusive: the last key
/// of the previous page), ?3 the exclusive upper bound of keys with the prefix, ?4 the page size.
fn list_objects_sql(after: bool, upper: bool) -> String {
    let lower = if after { "key > ?2" } else { "key >= ?2" };
    let upper = if upper { " AND key < ?3" } else { "" };
    format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket_id = ?1 AND {lower}{upper} ORDER BY key LIMIT ?4")
}

/// The least string above every string that starts with `prefix` (`None`: no such bound, for `""`). Keys compare
/// as UTF-8 bytes (SQLite's BINARY collation), which orders like code points, so this turns "starts with" into
/// a range the primary key can answer: bump the last character that can be bumped and drop what follows.
fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            '\u{D7FF}' => Some('\u{E000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

fn token_from_row(r: &sqlx::sqlite::SqliteRow) -> TokenRecord {
    TokenRecord {
        id: r.get(0),
        secret_hash: r.get(1),
        bucket_id: r.get(2),
        bucket_name: r.get(3),
        prefix: r.get(4),
        scope: r.get(5),
        created_at: r.get(6),
        expires_at: r.get(7),
        revoked_at: r.get(8),
    }
}

/// A fresh nonce for sealing a secret.
fn fresh_nonce() -> Result<[u8; NONCE_LEN], MetadataError> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))?;
    Ok(nonce)
}

/// Reads the columns of `OBJECT_COLUMNS`, in that order.
fn object_from_row(r: &sqlx::sqlite::SqliteRow) -> ObjectRecord {
    ObjectRecord {
        bucket_id: r.get(0),
        key: r.get(1),
        sha256: r.get(2),
        size: r.get::<i64, _>(3) as u64,
        attrs: ObjectAttrs { content_type: r.get(4), cache_control: r.get(5), content_disposition: r.get(6) },
        created_at: r.get(7),
        updated_at: r.get(8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_bound_is_exactly_starts_with() {
        assert_eq!(prefix_upper_bound(""), None);
        assert_eq!(prefix_upper_bound("a/").as_deref(), Some("a0"));
        assert_eq!(prefix_upper_bound("\u{D7FF}").as_deref(), Some("\u{E000}"), "surrogates are skipped");
        assert_eq!(prefix_upper_bound("x\u{10FFFF}").as_deref(), Some("y"), "a maximal last character is dropped");
        assert_eq!(prefix_upper_bound("\u{10FFFF}"), None);
        let keys =
            ["a", "a/", "a/b", "a/\u{10FFFF}z", "a0", "a.", "ab", "é", "é/x", "ê", "\u{10FFFF}", "z", "x\u{10FFFF}"];
        for prefix in ["", "a", "a/", "é", "x\u{10FFFF}", "\u{10FFFF}", "zz"] {
            let upper = prefix_upper_bound(prefix);
            for key in keys {
                // Byte order, as SQLite's BINARY collation compares.
                let in_range = key.as_bytes() >= prefix.as_bytes()
                    && upper.as_deref().is_none_or(|u| key.as_bytes() < u.as_bytes());
                assert_eq!(in_range, key.starts_with(prefix), "prefix {prefix:?}, key {key:?}");
            }
        }
    }

    async fn database() -> (tempfile::TempDir, Metadata) {
        let dir = tempfile::tempdir().unwrap();
        let generation = Arc::new(Generation::open(dir.path()).unwrap());
        let meta = Metadata::open(&dir.path().join("blobgate.db"), Duration::from_secs(5), generation).await.unwrap();
        (dir, meta)
    }

    #[tokio::test]
    async fn an_object_page_is_one_primary_key_range() {
        let (_dir, meta) = database().await;
        for (after, upper, plan) in [
            (false, false, "(bucket_id=? AND key>?)"),
            (true, false, "(bucket_id=? AND key>?)"),
            (false, true, "(bucket_id=? AND key>? AND key<?)"),
            (true, true, "(bucket_id=? AND key>? AND key<?)"),
        ] {
            let sql = format!("EXPLAIN QUERY PLAN {}", list_objects_sql(after, upper));
            let rows = sqlx::query(&sql).bind(1).bind("a").bind("b").bind(10).fetch_all(&meta.pool).await.unwrap();
            let details: Vec<String> = rows.iter().map(|r| r.get::<String, _>(3)).collect();
            assert_eq!(details.len(), 1, "{details:?}");
            assert!(details[0].starts_with("SEARCH objects USING PRIMARY KEY"), "{details:?}");
            assert!(details[0].ends_with(plan), "{details:?}");
            assert!(!details.iter().any(|d| d.contains("TEMP B-TREE")), "no sort: {details:?}");
        }
    }

    #[tokio::test]
    async fn pages_follow_on_from_the_last_key() {
        let (_dir, meta) = database().await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let other = meta.create_bucket(&BucketName::parse("other").unwrap(), false, 0).await.unwrap();
        let keys = ["a", "a/1", "a/2", "a/3", "a0", "b"];
        let mut tx = meta.begin_write().await.unwrap();
        for (i, key) in keys.iter().enumerate() {
            let key = ObjectKey::parse(key).unwrap();
            tx.upsert_object(bucket.id, &key, &"0".repeat(64), 0, &ObjectAttrs::default(), i as i64).await.unwrap();
            tx.upsert_object(other.id, &key, &"0".repeat(64), 0, &ObjectAttrs::default(), 0).await.unwrap();
        }
        tx.commit().await.unwrap();
        let list = |prefix: &'static str, page: u32| {
            let meta = meta.clone();
            async move {
                let (mut all, mut after) = (Vec::new(), None::<String>);
                loop {
                    let rows = meta.list_objects_page(bucket.id, prefix, after.as_deref(), page).await.unwrap();
                    assert!(rows.len() <= page as usize);
                    all.extend(rows.iter().map(|r| r.key.clone()));
                    if rows.len() < page as usize {
                        return all;
                    }
                    after = rows.last().map(|r| r.key.clone());
                }
            }
        };
        assert_eq!(list("", 2).await, keys);
        assert_eq!(list("", 100).await, keys);
        assert_eq!(list("a/", 1).await, ["a/1", "a/2", "a/3"]);
        assert_eq!(list("a", 3).await, ["a", "a/1", "a/2", "a/3", "a0"]);
        assert!(list("c", 2).await.is_empty());
    }

    #[tokio::test]
    async fn a_read_only_open_refuses_writes() {
        let (dir, meta) = database().await;
        meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        meta.close().await;
        let path = dir.path().join("blobgate.db");
        let wal = dir.path().join("blobgate.db-wal");
        // The pool's connection threads finish closing (and remove the WAL) just after `close` returns.
        for _ in 0..250 {
            if !wal.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!wal.exists(), "the writer's WAL outlived it");
        let reader = Metadata::open_read_only(&path, Duration::from_secs(5)).await.unwrap();
        assert!(!reader.needs_migration().await);
        assert_eq!(reader.list_buckets().await.unwrap().len(), 1);
        let err = reader.create_bucket(&BucketName::parse("new").unwrap(), false, 0).await.unwrap_err();
        assert!(err.to_string().contains("readonly"), "{err}");
        reader.close().await;
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!files.iter().any(|f| f.to_string_lossy().ends_with("-wal")), "the reader made a WAL: {files:?}");
        let err = Metadata::open_read_only(&dir.path().join("none.db"), Duration::from_secs(5)).await.err().unwrap();
        assert!(err.to_string().contains("no database at"), "{err}");
        assert!(!dir.path().join("none.db").exists());
    }

    #[tokio::test]
    async fn bucket_updates_change_only_what_they_name() {
        let (_dir, meta) = database().await;
        let name = BucketName::parse("bkt").unwrap();
        meta.create_bucket(&name, false, 0).await.unwrap();
        let b = meta.update_bucket(&name, None, Some(Some("max-age=60"))).await.unwrap().unwrap();
        assert_eq!((b.public, b.default_cache_control.as_deref()), (false, Some("max-age=60")));
        let b = meta.update_bucket(&name, Some(true), None).await.unwrap().unwrap();
        assert_eq!((b.public, b.default_cache_control.as_deref()), (true, Some("max-age=60")));
        let b = meta.update_bucket(&name, Some(false), Some(None)).await.unwrap().unwrap();
        assert_eq!((b.public, b.default_cache_control.as_deref()), (false, None));
        assert_eq!(meta.bucket(&name).await.unwrap().unwrap(), b);
        assert!(meta.update_bucket(&BucketName::parse("nope").unwrap(), Some(true), None).await.unwrap().is_none());
    }

    /// Every byte of the database and its WAL, where a secret would show if it were stored in the clear.
    fn database_bytes(dir: &Path) -> Vec<u8> {
        ["blobgate.db", "blobgate.db-wal"].iter().flat_map(|f| std::fs::read(dir.join(f)).unwrap_or_default()).collect()
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[tokio::test]
    async fn signing_secrets_are_sealed_in_the_database_and_old_plaintext_rows_get_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path(), Duration::from_secs(5)).await.unwrap();
        let fresh = SigningKey { id: "knew".into(), secret: vec![0x5a; 32], created_at: 1, retired_at: None };
        store.meta.create_signing_key(&fresh).await.unwrap();
        // A row written before sealing existed: the 32 raw bytes.
        let legacy = SigningKey { id: "kold".into(), secret: vec![0xa5; 32], created_at: 0, retired_at: None };
        sqlx::query("INSERT INTO signing_keys (id, secret, created_at) VALUES (?1, ?2, ?3)")
            .bind(&legacy.id)
            .bind(&legacy.secret)
            .bind(legacy.created_at)
            .execute(&store.meta.pool)
            .await
            .unwrap();
        assert_eq!(store.meta.list_signing_keys().await.unwrap(), vec![legacy.clone(), fresh.clone()]);
        assert!(!contains(&database_bytes(dir.path()), &fresh.secret), "a new secret is sealed");
        store.meta.close().await;
        assert!(contains(&database_bytes(dir.path()), &legacy.secret), "the legacy row is still in the clear");

        // The next open seals the legacy row; both still read back as they were.
        let store = crate::store::Store::open(dir.path(), Duration::from_secs(5)).await.unwrap();
        assert_eq!(store.meta.seal_signing_keys().await.unwrap(), 0, "already sealed at open");
        assert_eq!(store.meta.signing_key("kold").await.unwrap(), Some(legacy.clone()));
        assert_eq!(store.meta.newest_signing_key().await.unwrap(), Some(fresh.clone()));
        store.meta.close().await;
        assert!(!contains(&database_bytes(dir.path()), &legacy.secret), "the legacy secret is gone from the file");
    }
}
