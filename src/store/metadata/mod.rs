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
//! Submodules: `pool` (open, migrations, read-only open, close), `objects` (buckets and objects), `auth` (tokens,
//! signing keys, revoked signatures), `stats` (download counters), `variants`
//! (precompressed variants of objects), `copy` (`db copy`), `changes` (the change feed, over the
//! `generation` counter).

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

/// A test run once per backend: `backend_tests! { async fn name(backend) { … } }` makes the module `name` with
/// the tests `sqlite` and `postgres`, each running the body with `backend` set to its [`TestBackend`]. For the
/// tests of `store` and `catalog` too: `crate::store::metadata::backend_tests!`.
#[cfg(test)]
macro_rules! backend_tests {
    ($(async fn $name:ident($backend:ident) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::store::metadata::TestBackend;

            async fn run($backend: TestBackend) $body

            #[tokio::test]
            async fn sqlite() {
                run(TestBackend::Sqlite).await
            }

            #[tokio::test]
            async fn postgres() {
                run(TestBackend::Postgres).await
            }
        }
    )*};
}

#[cfg(test)]
pub(crate) use backend_tests;
#[cfg(test)]
pub(crate) use pool::tests::{TestBackend, database_url as test_database_url};

mod auth;
mod changes;
mod copy;
mod generation;
mod objects;
mod pool;
mod stats;
mod variants;

use std::sync::Arc;

use sqlx::{PgPool, Postgres, Sqlite, SqlitePool, Transaction};

pub use auth::{Scope, SigningKey, TokenRecord};
pub use changes::{CacheChange, ChangeFeed, ChangeKind};
pub use copy::CopyError;
pub use objects::{Bucket, ObjectRecord, Upsert};
pub use stats::{ObjectStats, StatsOrder};
pub use variants::VariantRecord;

use crate::store::sealing::{SealError, SecretsKey};

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
    /// A stored value this binary cannot read (a row written by hand, or by a newer version).
    #[error("invalid stored value: {0}")]
    Invalid(String),
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
}

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

impl Metadata {
    /// Signing-key secrets are sealed with `key` on the way in and opened on the way out.
    pub fn with_secrets_key(mut self, key: SecretsKey) -> Self {
        self.secrets_key = Some(Arc::new(key));
        self
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
    async fn commit_without_announcing(self) -> Result<(), MetadataError> {
        with_tx!(self.tx, tx => tx.commit().await?);
        Ok(())
    }
}
