//! The metadata store: buckets, objects, tokens, signing keys, revoked signatures, download stats and the change
//! feed. The only module that contains SQL.
//!
//! [`Metadata`] is the seam for a second backend: its signatures name no database type, and it has its own write
//! transaction, [`WriteTx`]. Two behaviours that callers rely on are operations of their own:
//! - [`Metadata::lock_blob_refs`]: a write transaction that also holds the blob-reference lock, which the
//!   crash-safety ordering in `store/mod.rs` needs;
//! - [`ChangeFeed`]: how a server learns that another process changed something it caches.
//!
//! Two backends:
//! - SQLite (`Backend::Sqlite`), the embedded default. WAL lets the server read while a CLI writes; a busy
//!   timeout turns lock contention into waiting rather than errors; every write transaction starts with
//!   `BEGIN IMMEDIATE`, so it takes the write lock up front instead of failing with SQLITE_BUSY half-way when it
//!   upgrades from a read.
//! - PostgreSQL (`Backend::Postgres`), shared by any number of replicas. Write transactions run at READ
//!   COMMITTED with concurrent writers, so every read-then-write either runs under the blob-reference lock (an
//!   advisory lock), locks its rows, or is a single `INSERT … ON CONFLICT` / conditional `UPDATE`.
//!
//! The SQL text is shared where the two dialects agree (`$N` placeholders, which sqlx binds by number on both):
//! [`with_pool!`] and [`with_tx!`] run the same code on either backend's connection, each arm type-checked for its
//! own database. Where they differ, the operation matches on the backend.
//!
//! Submodules: `pool` (open, read-only open, close), `migrations` (this binary's migrations against the
//! database's: applied, tolerated, refused), `objects` (buckets and objects), `auth` (tokens, signing keys, revoked
//! signatures), `stats` (download counters), `thread_reads` (SQLite reads on the calling thread), `s3_keys` (S3 access keys, sealed), `variants` (precompressed variants
//! of objects), `multipart` (S3 uploads in progress, their parts, multipart ETags), `copy` (`db copy`), `changes`
//! (the change feed, over the `generation` counter).

/// Runs `$body` with `$pool` bound to the backend's pool; each arm is compiled for its own database, so the SQL text
/// in `$body` is shared by both.
macro_rules! with_pool {
    ($backend:expr, $pool:ident => $body:expr) => {
        match $backend {
            $crate::store::metadata::Backend::Sqlite($pool) => $body,
            $crate::store::metadata::Backend::Postgres($pool) => $body,
        }
    };
}

/// [`with_pool!`] for a write transaction: `$tx` is the backend's `sqlx::Transaction`.
macro_rules! with_tx {
    ($tx:expr, $conn:ident => $body:expr) => {
        match $tx {
            $crate::store::metadata::TxBackend::Sqlite($conn) => $body,
            $crate::store::metadata::TxBackend::Postgres($conn) => $body,
        }
    };
}

/// `from_row!(Row { a, b } flatten { inner: InnerRow })` implements `sqlx::FromRow` for `Row` on both backends'
/// rows: each listed field read from the column of its name, each `flatten` field (optional) read by its own
/// `FromRow` from the same row. What `#[derive(sqlx::FromRow)]` writes, by hand: that derive needs sqlx's `macros`
/// feature, which builds a second copy of sqlx and its TLS and runtime stack for the compiler (ARCHITECTURE.md).
macro_rules! from_row {
    ($name:ident { $($field:ident),* $(,)? } $(flatten { $($inner:ident: $ty:ty),* $(,)? })?) => {
        from_row!(@for ::sqlx::sqlite::SqliteRow; $name { $($field),* } $($($inner: $ty),*)?);
        from_row!(@for ::sqlx::postgres::PgRow; $name { $($field),* } $($($inner: $ty),*)?);
        impl $crate::store::metadata::thread_reads::ReadRow for $name {
            fn columns(names: &mut Vec<&'static str>) {
                $($(<$ty as $crate::store::metadata::thread_reads::ReadRow>::columns(names);)*)?
                $(names.push(stringify!($field));)*
            }

            fn read_columns(row: &::rusqlite::Row<'_>, at: &mut usize) -> ::rusqlite::Result<Self> {
                // Flattened rows first: their columns come first in the statement (`columns` says so).
                $($(let $inner = <$ty as $crate::store::metadata::thread_reads::ReadRow>::read_columns(row, at)?;)*)?
                Ok(Self {
                    $($($inner,)*)?
                    $($field: {
                        *at += 1;
                        row.get(*at - 1)?
                    },)*
                })
            }
        }
    };
    (@for $row:ty; $name:ident { $($field:ident),* } $($inner:ident: $ty:ty),*) => {
        impl<'r> ::sqlx::FromRow<'r, $row> for $name {
            fn from_row(row: &'r $row) -> Result<Self, ::sqlx::Error> {
                use ::sqlx::Row as _;
                Ok(Self {
                    $($field: row.try_get(stringify!($field))?,)*
                    $($inner: <$ty as ::sqlx::FromRow<'r, $row>>::from_row(row)?,)*
                })
            }
        }
    };
}

/// `on_both_backends!(name)` runs the test function `async fn name(backend: TestBackend)` once per backend, as
/// the tests `name::sqlite` and `name::postgres` (PostgreSQL: a fresh database on the test cluster). Also for the
/// tests of `store` and `catalog`: `use crate::store::metadata::{TestBackend, on_both_backends}`.
#[cfg(test)]
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name($crate::store::metadata::TestBackend::Sqlite).await
            }

            #[tokio::test]
            async fn postgres() {
                super::$name($crate::store::metadata::TestBackend::Postgres).await
            }
        }
    };
}

#[cfg(test)]
pub(crate) use on_both_backends;
#[cfg(test)]
pub(crate) use pool::tests::{TestBackend, database_url as test_database_url};

mod auth;
mod changes;
mod copy;
mod generation;
mod health;
mod limits;
mod migrations;
mod multipart;
mod objects;
mod pg_feed;
mod pool;
mod retirements;
mod s3_keys;
mod stats;
mod thread_reads;
mod variants;

use std::sync::Arc;

use sqlx::{PgPool, Postgres, Sqlite, SqlitePool, Transaction};

pub use auth::{Grant, GrantedBucket, Rights, Scope, SigningKey, TokenRecord};
pub use changes::{CacheChange, Catchup, ChangeFeed, ChangeKind};
pub use copy::CopyError;
pub use health::DatabaseHealth;
pub use migrations::{MigrationEntry, MigrationState, MigrationStatus, SchemaError, SchemaState};
pub use multipart::{HeldBytes, PartRecord, UploadRecord, UploadSummary};
pub use objects::{Bucket, BucketChanges, ObjectRecord, Upsert, part_region};
pub use retirements::Retirement;
pub use s3_keys::S3KeyRecord;
pub use stats::{Flushed, Folded, ObjectStats, StatsFlush, StatsOrder};
pub use variants::VariantRecord;

use crate::store::sealing::{SealError, SecretsKey};

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("bucket {0} already exists")]
    BucketExists(String),
    #[error("no such bucket: {0}")]
    NoSuchBucket(String),
    /// The database cannot be reached (no connection within the pool's acquire timeout, a connection lost or
    /// refused, the server shutting down): the request may succeed later. Made only by `From<sqlx::Error>`.
    #[error("the database is unreachable")]
    Unavailable(#[source] sqlx::Error),
    /// A server's caches have not synced with the database within its staleness window, so they may miss a
    /// revocation or a deletion: what they would answer is refused (made by the catalog, never by SQL).
    #[error("the caches last synced with the database {}s ago, beyond database.max_staleness", age.as_secs())]
    Stale { age: std::time::Duration },
    #[error(transparent)]
    Database(sqlx::Error),
    /// An error of a statement run on a connection of our own, outside sqlx (`thread_reads`).
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Sealing(#[from] SealError),
    #[error("signing keys need the secrets key, and none was loaded")]
    NoSecretsKey,
    /// A stored value this binary cannot read (a row written by hand, or by a newer version).
    #[error("invalid stored value: {0}")]
    Invalid(String),
}

/// The one place a database error is classified: connection-level failures are [`MetadataError::Unavailable`],
/// everything else (a constraint, a bad statement, a lock held past the busy timeout) stays `Database`.
impl From<sqlx::Error> for MetadataError {
    fn from(e: sqlx::Error) -> Self {
        if health::is_connection_failure(&e) { MetadataError::Unavailable(e) } else { MetadataError::Database(e) }
    }
}

impl MetadataError {
    /// Whether this says the database is unreachable, or, to this server, as good as (its caches are stale).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, MetadataError::Unavailable(_) | MetadataError::Stale { .. })
    }

    /// Whether any cause in `error`'s chain says the database is unreachable (a [`MetadataError::Unavailable`],
    /// or a connection-level `sqlx::Error` from opening it).
    pub fn in_chain_is_unavailable(error: &anyhow::Error) -> bool {
        error.chain().any(|cause| {
            cause.downcast_ref::<MetadataError>().is_some_and(MetadataError::is_unavailable)
                || cause.downcast_ref::<sqlx::Error>().is_some_and(health::is_connection_failure)
        })
    }
}

/// The metadata store, over one of the backends. Cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub struct Metadata {
    backend: Backend,
    /// Every commit that may change what a server caches is announced here.
    feed: ChangeFeed,
    /// Opened by `open_read_only`.
    read_only: bool,
    /// Seals signing-key secrets in the database (`store::sealing`); `Store::open` sets it.
    secrets_key: Option<Arc<SecretsKey>>,
    /// The schema's migrations as the open found them (after migrating, for `open`).
    migrations: Arc<MigrationStatus>,
    /// SQLite only: reads on the calling thread, for a cache miss, and the stats' write connection (`thread_reads`).
    thread_readers: Option<Arc<thread_reads::ThreadReaders>>,
}

/// The pause between two write transactions of a maintenance task that goes in batches (the change-log prune,
/// the sweep's retires): longer than the sleeps of SQLite's busy handler up to 25 ms into a wait, so a writer
/// waiting for the lock (a request's, the CLI's) gets it between two batches instead of sleeping past the gap.
pub const BETWEEN_WRITE_BATCHES: std::time::Duration = std::time::Duration::from_millis(30);

/// The database behind [`Metadata`]. An enum rather than a trait object: every operation is a plain `match`
/// (statically dispatched, and async methods need no boxing), and adding a backend makes the compiler name every
/// operation that lacks it.
#[derive(Clone)]
enum Backend {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// A write transaction. Dropping it without `commit` rolls back.
pub struct WriteTx {
    tx: TxBackend,
    feed: ChangeFeed,
}

enum TxBackend {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

/// PostgreSQL: the advisory lock (`pg_advisory_xact_lock`) that is the blob-reference lock ("blobrefs").
const BLOB_REFS_LOCK: i64 = 0x626c_6f62_7265_6673;

/// Expired rows a write prunes on its way (old multipart completions, revoked signatures past their expiry, store
/// delete tombstones): a bound on what one write adds to its transaction, however many expired at once; the rest
/// go with the next writes, each of which adds one row at most.
const PRUNE_ON_WRITE: i64 = 100;

/// PostgreSQL: makes every logged change look two hours old, past the retention, as if written that long ago.
#[cfg(test)]
pub async fn test_age_change_log(meta: &Metadata) {
    let Backend::Postgres(pool) = &meta.backend else { panic!("a PostgreSQL test") };
    sqlx::query("UPDATE cache_changes SET created_at = now() - interval '2 hours'").execute(pool).await.unwrap();
}

impl Metadata {
    /// Signing-key secrets are sealed with `key` on the way in and opened on the way out.
    pub fn with_secrets_key(mut self, key: SecretsKey) -> Self {
        self.secrets_key = Some(Arc::new(key));
        self
    }

    /// The secrets key, if this open has one (what the object store's slice manifests are sealed with).
    pub fn secrets(&self) -> Option<&SecretsKey> {
        self.secrets_key.as_deref()
    }

    fn secrets_key(&self) -> Result<&SecretsKey, MetadataError> {
        self.secrets_key.as_deref().ok_or(MetadataError::NoSecretsKey)
    }

    /// Where a server learns about changes made by any process (see [`ChangeFeed`]).
    pub fn feed(&self) -> &ChangeFeed {
        &self.feed
    }

    /// Starts a write transaction. SQLite: `BEGIN IMMEDIATE`, which takes the database's write lock up front.
    /// PostgreSQL: `BEGIN` (READ COMMITTED); concurrent writers are expected.
    pub async fn begin_write(&self) -> Result<WriteTx, MetadataError> {
        let tx = match &self.backend {
            Backend::Sqlite(pool) => TxBackend::Sqlite(pool.begin_with("BEGIN IMMEDIATE").await?),
            Backend::Postgres(pool) => TxBackend::Postgres(pool.begin().await?),
        };
        Ok(WriteTx { tx, feed: self.feed.clone() })
    }

    /// Starts a write transaction that also holds the blob-reference lock until it ends: while it is open, no
    /// other transaction (in this process or another) adds or drops a reference to a blob. `Store` relies on it
    /// to install, retire and restore blob files against the references it reads in the transaction (the
    /// crash-safety ordering in `store/mod.rs`). SQLite: the write lock of `BEGIN IMMEDIATE` is that lock, since
    /// SQLite has one writer at a time. PostgreSQL: a transaction-scoped advisory lock, taken first thing, so
    /// every replica's blob-reference changes are ordered as SQLite's single writer orders them.
    pub async fn lock_blob_refs(&self) -> Result<WriteTx, MetadataError> {
        let mut tx = self.begin_write().await?;
        if let TxBackend::Postgres(pg) = &mut tx.tx {
            sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(BLOB_REFS_LOCK).execute(&mut **pg).await?;
        }
        Ok(tx)
    }
}

impl WriteTx {
    /// Commits, then tells every server sharing the data dir that something changed.
    pub async fn commit(self) -> Result<(), MetadataError> {
        with_tx!(self.tx, tx => tx.commit().await?);
        self.feed.announce();
        Ok(())
    }

    /// For writes to tables no server caches (download stats, the change log itself).
    pub(in crate::store) async fn commit_without_announcing(self) -> Result<(), MetadataError> {
        with_tx!(self.tx, tx => tx.commit().await?);
        Ok(())
    }
}
