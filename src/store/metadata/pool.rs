//! Opening the database: connection options, migrations, read-only opens, and closing.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::Context;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::generation::Generation;
use super::{Backend, ChangeFeed, Metadata};
use crate::config::{DatabaseTimeouts, DatabaseUrl};

/// The embedded migrations: applied by `open`, compared by `open_read_only`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

impl Metadata {
    /// Opens (creating if needed) the database and applies the embedded migrations. The change feed's counter
    /// lives in `data_dir`, shared with every process that opens it. `timeouts` is a busy timeout alone or
    /// [`DatabaseTimeouts`], whose `acquire` bounds every wait for a connection.
    pub async fn open(
        database: &DatabaseUrl,
        data_dir: &Path,
        timeouts: impl Into<DatabaseTimeouts>,
    ) -> anyhow::Result<Self> {
        let timeouts = timeouts.into();
        let DatabaseUrl::Sqlite(path) = database;
        let generation = Arc::new(Generation::open(data_dir)?);
        let pool = open_sqlite(path, timeouts).await?;
        MIGRATOR.run(&pool).await.context("cannot apply database migrations")?;
        let backend = Backend::Sqlite(pool);
        Ok(Self { feed: ChangeFeed::new(generation, backend.clone()), backend, read_only: false, secrets_key: None })
    }

    /// Opens an existing database for reading only: no migrations, no writes, no files created, so it works in a
    /// read-only data dir. Check `needs_migration` before trusting the schema.
    pub async fn open_read_only(database: &DatabaseUrl, timeouts: impl Into<DatabaseTimeouts>) -> anyhow::Result<Self> {
        let DatabaseUrl::Sqlite(path) = database;
        let pool = open_sqlite_read_only(path, timeouts.into()).await?;
        // Nothing is written, so nothing needs to reach other processes: a private counter.
        let generation = Arc::new(Generation::private()?);
        let backend = Backend::Sqlite(pool);
        Ok(Self { feed: ChangeFeed::new(generation, backend.clone()), backend, read_only: true, secrets_key: None })
    }

    /// Whether the database lacks migrations this binary embeds (a read-only open cannot apply them).
    pub async fn needs_migration(&self) -> bool {
        let Backend::Sqlite(pool) = &self.backend;
        let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        let applied: Result<i64, _> =
            sqlx::query_scalar("SELECT coalesce(max(version), 0) FROM _sqlx_migrations WHERE success")
                .fetch_one(pool)
                .await;
        applied.map_or(true, |v| v < latest)
    }

    /// Folds the WAL into the database file and truncates it, then closes. The next process then starts with
    /// an empty WAL instead of reading this one's frames back.
    pub async fn close(&self) {
        let Backend::Sqlite(pool) = &self.backend;
        if self.read_only {
            return pool.close().await;
        }
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(pool).await {
            tracing::debug!(error = %e, "checkpoint at close failed; SQLite will recover the WAL on the next open");
        }
        pool.close().await;
    }
}

async fn open_sqlite(path: &Path, timeouts: DatabaseTimeouts) -> anyhow::Result<sqlx::SqlitePool> {
    // SQLite would create the database as 0644 minus the umask, and it gives the -wal and -shm files the
    // database's mode: creating it owner-only first (an empty file is an empty database) covers all three.
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(crate::store::PRIVATE_FILE_MODE)
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
        .busy_timeout(timeouts.busy)
        // Pages come from a shared mapping instead of pread64 copies into each connection's cache.
        .pragma("mmap_size", "268435456")
        .foreign_keys(true);
    // Few connections: the hot path reads from in-memory caches, and every connection loads the schema
    // with page reads of its own.
    SqlitePoolOptions::new()
        .max_connections(4)
        .acquire_timeout(timeouts.acquire)
        .connect_with(options)
        .await
        .with_context(|| format!("cannot open database {}", path.display()))
}

/// `mode=ro`. Even a read-only SQLite connection creates the `-wal` and `-shm` files of a WAL database when they
/// are missing (and fails where it cannot). They exist while any process has the database open; when there is no
/// `-wal`, every commit is in the main file, so it is opened `immutable` and SQLite reads just that file.
/// (A writer that starts during such a read writes to its own new WAL; only a checkpoint, after 1000 pages
/// or at its close, touches the main file.)
async fn open_sqlite_read_only(path: &Path, timeouts: DatabaseTimeouts) -> anyhow::Result<sqlx::SqlitePool> {
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
        .busy_timeout(timeouts.busy)
        .pragma("mmap_size", "268435456");
    SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(timeouts.acquire)
        .connect_with(options)
        .await
        .with_context(|| format!("cannot open database {} read-only", path.display()))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::names::BucketName;
    use crate::store::Store;
    use std::time::Duration;

    /// A fresh database in a temp dir, as `Store::open` makes it.
    pub(in crate::store::metadata) async fn database() -> (tempfile::TempDir, Metadata) {
        let dir = tempfile::tempdir().unwrap();
        let url = DatabaseUrl::in_data_dir(dir.path());
        let meta = Metadata::open(&url, dir.path(), Duration::from_secs(5)).await.unwrap();
        (dir, meta)
    }

    #[tokio::test]
    async fn a_read_only_open_refuses_writes() {
        let (dir, meta) = database().await;
        meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        meta.close().await;
        let url = DatabaseUrl::in_data_dir(dir.path());
        let wal = dir.path().join("blobgate.db-wal");
        // The pool's connection threads finish closing (and remove the WAL) just after `close` returns.
        for _ in 0..250 {
            if !wal.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!wal.exists(), "the writer's WAL outlived it");
        let reader = Metadata::open_read_only(&url, Duration::from_secs(5)).await.unwrap();
        assert!(!reader.needs_migration().await);
        assert_eq!(reader.list_buckets().await.unwrap().len(), 1);
        let err = reader.create_bucket(&BucketName::parse("new").unwrap(), false, 0).await.unwrap_err();
        assert!(err.to_string().contains("readonly"), "{err}");
        reader.close().await;
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!files.iter().any(|f| f.to_string_lossy().ends_with("-wal")), "the reader made a WAL: {files:?}");
        let none = DatabaseUrl::Sqlite(dir.path().join("none.db"));
        let err = Metadata::open_read_only(&none, Duration::from_secs(5)).await.err().unwrap();
        assert!(err.to_string().contains("no database at"), "{err}");
        assert!(!dir.path().join("none.db").exists());
    }

    #[tokio::test]
    async fn a_read_only_open_of_an_older_database_migrates_it_first() {
        // A database made by an older binary: the first five migrations only.
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old-migrations");
        std::fs::create_dir(&old).unwrap();
        for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations")).unwrap() {
            let entry = entry.unwrap();
            if entry.file_name().to_string_lossy().as_ref() < "0006" {
                std::fs::copy(entry.path(), old.join(entry.file_name())).unwrap();
            }
        }
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let url = format!("sqlite://{}?mode=rwc", data.join("blobgate.db").display());
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path()).await.unwrap().run(&pool).await.unwrap();
        pool.close().await;

        let database = DatabaseUrl::in_data_dir(&data);
        let store = Store::open_read_only(&data, &database, Duration::from_secs(5)).await.unwrap();
        assert!(!store.meta.needs_migration().await);
        assert!(store.meta.list_buckets().await.unwrap().is_empty(), "the new column exists");
        store.meta.close().await;
        let again = Store::open_read_only(&data, &database, Duration::from_secs(5)).await.unwrap();
        assert!(!again.meta.needs_migration().await, "an up-to-date database opens read-only");
        again.meta.close().await;
    }
}
