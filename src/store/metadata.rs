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
use crate::auth::sealing::{self, NONCE_LEN, SealError, SecretsKey, is_sealed};
use crate::metrics::downloads::{Batch, Counters};
use crate::names::{BucketName, ObjectKey};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub id: i64,
    pub name: String,
    pub public: bool,
    pub created_at: i64,
}

/// What the caller chooses about an object besides its bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectAttrs {
    pub content_type: Option<String>,
    pub cache_control: Option<String>,
    pub content_disposition: Option<String>,
}

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
    /// Seals signing-key secrets in the database (`auth::sealing`); `Store::open` sets it.
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
        sqlx::migrate!("./migrations").run(&pool).await.context("cannot apply database migrations")?;
        Ok(Self { pool, generation, secrets_key: None })
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
        Ok(Bucket { id: row.get(0), name: name.to_string(), public, created_at: now })
    }

    pub async fn bucket(&self, name: &BucketName) -> Result<Option<Bucket>, MetadataError> {
        let row = sqlx::query("SELECT id, name, public, created_at FROM buckets WHERE name = ?1")
            .bind(name.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| bucket_from_row(&r)))
    }

    pub async fn list_buckets(&self) -> Result<Vec<Bucket>, MetadataError> {
        let rows =
            sqlx::query("SELECT id, name, public, created_at FROM buckets ORDER BY name").fetch_all(&self.pool).await?;
        Ok(rows.iter().map(bucket_from_row).collect())
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
    /// Adds a batch of download counters in one write transaction.
    pub async fn record_download_stats(&self, batch: &Batch) -> Result<(), MetadataError> {
        let mut tx = self.begin_write().await?;
        for ((bucket_id, key), (c, last)) in &batch.per_object {
            sqlx::query(
                "INSERT INTO object_stats (bucket_id, key, requests, completed, aborted, truncated, bytes_sent,
                                           range_requests, not_modified, head_requests, last_download_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
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
            let day = crate::metrics::downloads::day_name(*day);
            sqlx::query(
                "INSERT INTO object_stats_daily (bucket_id, key, day, requests, completed, aborted, bytes_sent,
                                                 range_requests, not_modified)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
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
        let row = sqlx::query("SELECT id, name, public, created_at FROM buckets WHERE name = ?1")
            .bind(name.as_str())
            .fetch_optional(&mut *self.tx)
            .await?;
        Ok(row.map(|r| bucket_from_row(&r)))
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
    Bucket { id: r.get(0), name: r.get(1), public: r.get(2), created_at: r.get(3) }
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
