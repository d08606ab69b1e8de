//! Opening the database: connection options, migrations, read-only opens, and closing. PostgreSQL's first
//! connect is bounded, and its refusals are said in one line in the URL's terms (a TLS refusal as what is wrong:
//! the host name, the CA, no TLS offered, a server that wants TLS).

use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};

use super::generation::Generation;
use super::migrations::{self, SchemaError};
use super::thread_reads::ThreadReaders;
use super::{Backend, ChangeFeed, Metadata};
use crate::config::{DatabaseTimeouts, DatabaseUrl, PostgresUrl};

/// How long opening a PostgreSQL database may take (a host that drops packets would otherwise hang a start for
/// the kernel's TCP timeout, minutes), and how long any later wait for a pooled connection may take.
pub const PG_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// SQLite's memory map of the database: the maximum the bundled SQLite is built with (`SQLITE_MAX_MMAP_SIZE` in
/// `.cargo/config.toml`, 1 TiB; SQLite's own default is just under 2 GiB), so a catalog of millions of objects is read
/// through the map, not copied page by page with pread. Address space only: the pages are the page cache's, shared
/// by every connection. A build without that flag clamps it to SQLite's maximum.
pub(super) const SQLITE_MMAP_BYTES: i64 = 1 << 40;

impl Metadata {
    /// Opens (creating if needed) the database and applies the embedded migrations: see `migrations.rs` for the
    /// database this binary refuses, and the newer one it serves. The change feed's counter lives in `data_dir`,
    /// shared with every process that opens it. `timeouts` is a busy timeout alone or [`DatabaseTimeouts`], whose
    /// `acquire` bounds every wait for a pooled connection.
    /// PostgreSQL: the counter is private to this process (see `changes.rs`); several processes may apply the
    /// migrations at once (sqlx's advisory lock serialises them).
    pub async fn open(
        database: &DatabaseUrl,
        data_dir: &Path,
        timeouts: impl Into<DatabaseTimeouts>,
    ) -> anyhow::Result<Self> {
        let timeouts = timeouts.into();
        let (backend, generation, thread_readers) = match database {
            DatabaseUrl::Sqlite(path) => {
                let generation = Generation::open(data_dir)?;
                let readers = Arc::new(ThreadReaders::new(path.clone(), timeouts.busy));
                (Backend::Sqlite(open_sqlite(path, timeouts).await?), generation, Some(readers))
            }
            DatabaseUrl::Postgres(url) => {
                (Backend::Postgres(open_postgres(url, false, timeouts).await?), Generation::local(), None)
            }
        };
        let migrations = migrations::migrate(&backend).await.map_err(|e| match e.downcast::<SchemaError>() {
            Ok(refusal) => migrations::refused(refusal, database),
            Err(e) => e.context(format!("cannot apply the migrations to {database}")),
        })?;
        let feed = ChangeFeed::new(Arc::new(generation), backend.clone());
        Ok(Self {
            feed,
            backend,
            read_only: false,
            secrets_key: None,
            migrations: Arc::new(migrations),
            thread_readers,
        })
    }

    /// Opens an existing database for reading only: no migrations, no writes, no files created, so it works in a
    /// read-only data dir. Its migrations are read (`migrations()`): check them before trusting the schema.
    /// PostgreSQL: every transaction is read-only (`default_transaction_read_only`).
    pub async fn open_read_only(database: &DatabaseUrl, timeouts: impl Into<DatabaseTimeouts>) -> anyhow::Result<Self> {
        let timeouts = timeouts.into();
        let backend = match database {
            DatabaseUrl::Sqlite(path) => Backend::Sqlite(open_sqlite_read_only(path, timeouts).await?),
            DatabaseUrl::Postgres(url) => Backend::Postgres(open_postgres(url, true, timeouts).await?),
        };
        let migrations = Arc::new(Self::read_migrations(&backend).await?);
        // Nothing is written, so nothing needs to reach other processes: a private counter.
        let generation = Arc::new(Generation::local());
        let feed = ChangeFeed::new(generation, backend.clone());
        Ok(Self { feed, backend, read_only: true, secrets_key: None, migrations, thread_readers: None })
    }

    /// Whether the link to the database may cross a network in clear (see [`plaintext_may_leave_host`]): `serve`
    /// warns of it.
    pub fn link_may_be_plaintext(&self) -> bool {
        match &self.backend {
            Backend::Sqlite(_) => false,
            Backend::Postgres(pool) => {
                let options = pool.connect_options();
                let socket = options.get_socket().is_some() || options.get_host().starts_with('/');
                plaintext_may_leave_host(options.get_host(), socket, options.get_ssl_mode())
            }
        }
    }

    /// Folds the WAL into the database file and truncates it, then closes. The next process then starts with
    /// an empty WAL instead of reading this one's frames back.
    pub async fn close(&self) {
        if let Some(readers) = &self.thread_readers {
            readers.close();
        }
        let pool = match &self.backend {
            Backend::Sqlite(pool) => pool,
            Backend::Postgres(pool) => return pool.close().await,
        };
        if self.read_only {
            return pool.close().await;
        }
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(pool).await {
            tracing::debug!(error = %e, "checkpoint at close failed; SQLite will recover the WAL on the next open");
        }
        pool.close().await;
        // The last connection to close removes the -wal and -shm files, but two of the pool's connections closing
        // at once can each see the other still open and leave them, and sqlx finishes closing them on their own
        // threads after `close` returns. One more connection, opened and closed alone once those are gone, is the
        // last one: a stopped server leaves the database file alone (a backup or a read-only data dir). It is
        // retried for up to a second, and a WAL another process keeps open stays, as it must.
        let options = pool.connect_options();
        let wal = format!("{}-wal", options.get_filename().display());
        for _ in 0..20 {
            if !Path::new(&wal).exists() {
                break;
            }
            match <sqlx::SqliteConnection as sqlx::Connection>::connect_with(&options).await {
                Ok(last) => {
                    if let Err(e) = sqlx::Connection::close(last).await {
                        tracing::debug!(error = %e, "closing the last connection failed; the WAL stays");
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot reopen the database to remove its WAL");
                    break;
                }
            }
            if Path::new(&wal).exists() {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
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
        .pragma("mmap_size", SQLITE_MMAP_BYTES.to_string())
        .foreign_keys(true);
    // Few connections: the hot path reads from in-memory caches, and every connection loads the schema
    // with page reads of its own.
    SqlitePoolOptions::new()
        .max_connections(4)
        // A local file's connection does not go stale, and sqlx's check before each use is one more trip to the
        // connection's thread.
        .test_before_acquire(false)
        .acquire_timeout(timeouts.acquire)
        .connect_with(options)
        .await
        .with_context(|| format!("cannot open database {}", path.display()))
}

/// Connects once, within [`PG_CONNECT_TIMEOUT`], so that a wrong password, an unknown database, an unreachable
/// host or a refused certificate fails at start with its own reason, then opens the pool. Every message names
/// `database.url` and where it points, never the password.
async fn open_postgres(url: &PostgresUrl, read_only: bool, timeouts: DatabaseTimeouts) -> anyhow::Result<sqlx::PgPool> {
    let mut options = PgConnectOptions::from_str(url.expose_secret())
        .map_err(|e| anyhow::anyhow!("database.url is not a valid PostgreSQL URL ({url}): {e}"))?
        .application_name("blobgate");
    let asked = options.get_ssl_mode();
    let root_cert = root_cert(url);
    if let Some(RootCert::File(path)) = &root_cert {
        check_root_cert(Path::new(path))?;
    }
    if matches!(asked, PgSslMode::Require) && root_cert.is_some() {
        // libpq (and sqlx's own documentation) verify the CA when `require` comes with a root certificate; sqlx's
        // code does not, and a URL written for libpq must not get less than it asked for.
        options = options.ssl_mode(PgSslMode::VerifyCa);
    }
    if read_only {
        options = options.options([("default_transaction_read_only", "on")]);
    }
    let refused = |e: sqlx::Error| {
        let why = connect_failure(&e, options.get_host(), asked, root_cert.as_ref());
        anyhow::anyhow!("database.url: cannot connect to {url}: {why}")
    };
    let first = match tokio::time::timeout(PG_CONNECT_TIMEOUT, options.connect()).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(refused(e)),
        Err(_) => {
            anyhow::bail!("database.url: cannot connect to {url}: no answer within {}s", PG_CONNECT_TIMEOUT.as_secs())
        }
    };
    first.close().await.ok();
    PgPoolOptions::new()
        .max_connections(8)
        // Shorter than timeouts.handler: a request during an outage gets its 503 instead of the handler's.
        .acquire_timeout(timeouts.acquire)
        .connect_with(options.clone())
        .await
        .map_err(refused)
}

/// A URL's root certificate (`sslrootcert`, or sqlx's other spellings; the last one counts, as for sqlx): a file,
/// or PEM text in the URL itself.
#[derive(Debug, PartialEq, Eq)]
enum RootCert {
    File(String),
    Inline,
}

fn root_cert(url: &PostgresUrl) -> Option<RootCert> {
    let parsed = url::Url::parse(url.expose_secret()).ok()?;
    let value =
        parsed.query_pairs().filter(|(k, _)| matches!(&**k, "sslrootcert" | "ssl-root-cert" | "ssl-ca")).last()?.1;
    // sqlx's own test for PEM text.
    Some(if value.trim().starts_with("-----BEGIN") { RootCert::Inline } else { RootCert::File(value.into_owned()) })
}

impl std::fmt::Display for RootCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RootCert::File(path) => write!(f, "sslrootcert {path}"),
            RootCert::Inline => f.write_str("sslrootcert"),
        }
    }
}

/// sqlx reads the file at each connection and calls a missing one an I/O error, and an empty one no CA at all:
/// both are said here, once, at start.
fn check_root_cert(path: &Path) -> anyhow::Result<()> {
    let pem = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("database.url: sslrootcert {} cannot be read: {e}", path.display()))?;
    if memchr::memmem::find(&pem, b"-----BEGIN CERTIFICATE-----").is_none() {
        anyhow::bail!("database.url: sslrootcert {} holds no PEM certificate", path.display());
    }
    Ok(())
}

/// Why a connection failed, on one line. TLS refusals say what is wrong in the URL's terms: `asked` is the
/// `sslmode` the URL gave (or sqlx's default, `prefer`).
fn connect_failure(e: &sqlx::Error, host: &str, asked: PgSslMode, root_cert: Option<&RootCert>) -> String {
    use rustls::CertificateError as Cert;
    // sqlx's words when the server answers the TLS request with "no".
    if matches!(e, sqlx::Error::Tls(inner) if inner.to_string() == "server does not support TLS") {
        return format!("the server does not offer TLS, which sslmode={} requires", ssl_mode_name(asked));
    }
    // pg_hba.conf refusing a login without TLS (hostssl lines only); PostgreSQL 12 and later end it so.
    if let sqlx::Error::Database(db) = e {
        if !requires_tls(asked) && db.code().as_deref() == Some("28000") && db.message().ends_with("no encryption") {
            return format!("{} (the server accepts TLS only: set sslmode=verify-full)", one_line(e));
        }
    }
    // A refused handshake comes back as the socket's I/O error around rustls's.
    let tls = match e {
        sqlx::Error::Io(io) => io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        sqlx::Error::Tls(inner) => inner.downcast_ref::<rustls::Error>(),
        _ => None,
    };
    match tls {
        Some(rustls::Error::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. })) => {
            match asked {
                PgSslMode::VerifyFull => format!("the server's certificate does not match host {host}"),
                // sqlx 0.8 forgives only rustls's older name-mismatch error (sqlx#3793, fixed in 0.9), so
                // verify-ca checks the name as well.
                _ => format!(
                    "the server's certificate does not match host {host} (checked under sslmode={} too)",
                    ssl_mode_name(asked)
                ),
            }
        }
        Some(rustls::Error::InvalidCertificate(Cert::UnknownIssuer)) => match root_cert {
            Some(root) => format!("the server's certificate is not signed by {root}"),
            None => "the server's certificate is not signed by a trusted CA (name the CA that signed it with \
                     sslrootcert=FILE)"
                .to_owned(),
        },
        Some(rustls::Error::InvalidCertificate(other)) => format!("the server's certificate is refused: {other}"),
        _ => one_line(e),
    }
}

fn ssl_mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// Whether the password and query results may cross a network in clear, where an on-path attacker reads and
/// changes them: TLS is not required (`sslmode` absent or `prefer`, which takes TLS only when the server offers it
/// and checks no certificate; `allow` and `disable`, which never use it) and the host is not this machine
/// (loopback, or a Unix socket). Pure: the host is not resolved.
fn plaintext_may_leave_host(host: &str, socket: bool, mode: PgSslMode) -> bool {
    if socket || requires_tls(mode) {
        return false;
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.trim_end_matches('.').eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.to_canonical().is_loopback());
    !loopback
}

fn requires_tls(mode: PgSslMode) -> bool {
    matches!(mode, PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull)
}

/// An error's message on one line (the server's messages may carry a detail line).
fn one_line(e: &sqlx::Error) -> String {
    e.to_string().lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

/// `mode=ro`. Even a read-only SQLite connection creates the `-wal` and `-shm` files of a WAL database when they
/// are missing (and fails where it cannot). They exist while any process has the database open; when there is no
/// `-wal`, every commit is in the main file, so it is opened `immutable` and SQLite reads just that file.
/// (A writer that starts during such a read writes to its own new WAL; only a checkpoint, after 1000 pages
/// or at its close, touches the main file.)
async fn open_sqlite_read_only(path: &Path, timeouts: DatabaseTimeouts) -> anyhow::Result<sqlx::SqlitePool> {
    if !path.is_file() {
        anyhow::bail!(migrations::no_database_at(path));
    }
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let live_wal = Path::new(&wal).exists();
    let options = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .immutable(!live_wal)
        .busy_timeout(timeouts.busy)
        .pragma("mmap_size", SQLITE_MMAP_BYTES.to_string());
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

    /// Whether the database lacks migrations this binary embeds (a read-only open cannot apply them).
    fn has_pending(meta: &Metadata) -> bool {
        meta.migrations().pending().next().is_some()
    }

    /// Which backend a test runs on (see `on_both_backends!`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum TestBackend {
        Sqlite,
        Postgres,
    }

    /// A fresh database as `Store::open` makes it, with a temp data dir: SQLite in that dir, or a new database
    /// on the test cluster (`BLOBGATE_TEST_POSTGRES_URL`, which `scripts/test` sets).
    pub async fn database(backend: TestBackend) -> (tempfile::TempDir, Metadata) {
        let dir = tempfile::tempdir().unwrap();
        let url = database_url(backend, dir.path()).await;
        let meta = Metadata::open(&url, dir.path(), Duration::from_secs(5)).await.unwrap();
        (dir, meta)
    }

    /// Where `database` puts a test's database (PostgreSQL: a new, empty one).
    pub async fn database_url(backend: TestBackend, data_dir: &Path) -> DatabaseUrl {
        match backend {
            TestBackend::Sqlite => DatabaseUrl::in_data_dir(data_dir),
            TestBackend::Postgres => DatabaseUrl::parse(&fresh_postgres_database().await).unwrap(),
        }
    }

    /// A new database on the test cluster: its URL.
    pub async fn fresh_postgres_database() -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let server = std::env::var("BLOBGATE_TEST_POSTGRES_URL").unwrap_or_else(|_| {
            panic!(
                "BLOBGATE_TEST_POSTGRES_URL is not set: run the tests with scripts/test, which starts a throw-away \
                 PostgreSQL cluster (or `scripts/pg-cluster start DIR` and export the URL it prints)"
            )
        });
        let mut random = [0u8; 4];
        getrandom::fill(&mut random).unwrap();
        let name = format!(
            "unit_{}_{}_{:08x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            u32::from_ne_bytes(random)
        );
        let mut conn = sqlx::PgConnection::connect(&server).await.expect("cannot connect to the test cluster");
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.unwrap();
        conn.close().await.unwrap();
        let (base, _) = server.rsplit_once('/').expect("the server URL ends in /DATABASE");
        format!("{base}/{name}")
    }

    /// SQLite clamps `mmap_size` to the maximum it was built with, and says what it took: the pool's connections
    /// and the threads' read connections map the whole of a 10^7-object catalog (3 GB), past SQLite's default
    /// maximum of just under 2 GiB.
    #[tokio::test]
    async fn the_memory_map_reaches_past_sqlites_default_maximum() {
        let (_dir, meta) = database(TestBackend::Sqlite).await;
        let super::Backend::Sqlite(pool) = &meta.backend else { unreachable!("an SQLite store") };
        let pooled: i64 = sqlx::query_scalar("PRAGMA mmap_size").fetch_one(pool).await.unwrap();
        assert_eq!(pooled, SQLITE_MMAP_BYTES, "LIBSQLITE3_FLAGS in .cargo/config.toml sets SQLITE_MAX_MMAP_SIZE");
        const { assert!(SQLITE_MMAP_BYTES > 0x7fff_0000) };
        let readers = meta.thread_readers.as_ref().unwrap();
        let on_thread = readers.read("mmap", |c| c.query_row("PRAGMA mmap_size", [], |r| r.get::<_, i64>(0)));
        assert_eq!(on_thread, Some(SQLITE_MMAP_BYTES));
    }

    #[tokio::test]
    async fn a_read_only_open_refuses_writes() {
        let (writer_dir, meta) = database(TestBackend::Sqlite).await;
        meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        // `close` folds the WAL into the database file. Which of the pool's connections closes last, and so
        // whether the -wal file is gone when `close` returns, is up to their threads: read the database file
        // alone, in a directory of its own, as a read-only data dir after a clean shutdown holds it.
        meta.close().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(writer_dir.path().join("blobgate.db"), dir.path().join("blobgate.db")).unwrap();
        let url = DatabaseUrl::in_data_dir(dir.path());
        let reader = Metadata::open_read_only(&url, Duration::from_secs(5)).await.unwrap();
        assert!(!has_pending(&reader));
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
    async fn a_postgres_read_only_open_refuses_writes_and_applies_no_migrations() {
        let dir = tempfile::tempdir().unwrap();
        let url = database_url(TestBackend::Postgres, dir.path()).await;
        let fresh = Metadata::open_read_only(&url, Duration::from_secs(5)).await.unwrap();
        assert!(has_pending(&fresh), "an empty database needs the migrations");
        fresh.close().await;
        let meta = Metadata::open(&url, dir.path(), Duration::from_secs(5)).await.unwrap();
        meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        meta.close().await;
        let reader = Metadata::open_read_only(&url, Duration::from_secs(5)).await.unwrap();
        assert!(!has_pending(&reader));
        assert_eq!(reader.list_buckets().await.unwrap().len(), 1);
        let err = reader.create_bucket(&BucketName::parse("new").unwrap(), false, 0).await.unwrap_err();
        assert!(err.to_string().contains("read-only transaction"), "{err}");
        reader.close().await;
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "nothing in the data dir");
    }

    #[test]
    fn plaintext_is_warned_of_only_off_this_host_without_tls_required() {
        use PgSslMode::*;
        for mode in [Disable, Allow, Prefer] {
            for host in ["db.internal", "10.0.0.7", "[2001:db8::1]", "localhost.example", "127.0.0.1.example"] {
                assert!(plaintext_may_leave_host(host, false, mode), "{host} {mode:?}");
            }
            for host in ["localhost", "LOCALHOST.", "127.0.0.1", "127.1.2.3", "::1", "[::1]", "::ffff:127.0.0.1"] {
                assert!(!plaintext_may_leave_host(host, false, mode), "{host} {mode:?}");
            }
            assert!(!plaintext_may_leave_host("/run/postgresql", true, mode), "a Unix socket");
        }
        for mode in [Require, VerifyCa, VerifyFull] {
            assert!(!plaintext_may_leave_host("db.internal", false, mode), "{mode:?}");
        }
    }

    #[test]
    fn the_root_certificate_is_read_from_the_url_in_any_of_sqlxs_spellings() {
        let root = |url: &str| match DatabaseUrl::parse(url).unwrap() {
            DatabaseUrl::Postgres(url) => root_cert(&url),
            DatabaseUrl::Sqlite(_) => unreachable!(),
        };
        let file = |path: &str| Some(RootCert::File(path.to_owned()));
        assert_eq!(root("postgres://u:p@db/bg?sslmode=verify-full"), None);
        assert_eq!(root("postgres://u:p@db/bg?sslmode=verify-full&sslrootcert=/etc/ca.pem"), file("/etc/ca.pem"));
        assert_eq!(root("postgres://u:p@db/bg?ssl-ca=%2Fetc%2Fca.pem"), file("/etc/ca.pem"));
        assert_eq!(root("postgres://u:p@db/bg?sslrootcert=a.pem&ssl-root-cert=b.pem"), file("b.pem"));
        assert_eq!(root("postgres://u:p@db/bg?sslrootcert=-----BEGIN%20CERTIFICATE-----x"), Some(RootCert::Inline));
    }

    #[test]
    fn certificate_refusals_say_what_is_wrong() {
        use rustls::CertificateError as Cert;
        let refused = |cert: Cert| {
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(cert),
            ))
        };
        let file = RootCert::File("/etc/ca.pem".into());
        let why = |e: &sqlx::Error, root: Option<&RootCert>| connect_failure(e, "db", PgSslMode::VerifyFull, root);
        assert_eq!(
            why(&refused(Cert::NotValidForName), Some(&file)),
            "the server's certificate does not match host db"
        );
        assert_eq!(
            connect_failure(&refused(Cert::NotValidForName), "db", PgSslMode::VerifyCa, Some(&file)),
            "the server's certificate does not match host db (checked under sslmode=verify-ca too)"
        );
        assert_eq!(
            why(&refused(Cert::UnknownIssuer), Some(&file)),
            "the server's certificate is not signed by sslrootcert /etc/ca.pem"
        );
        assert!(why(&refused(Cert::UnknownIssuer), None).contains("not signed by a trusted CA"));
        assert!(why(&refused(Cert::Expired), None).starts_with("the server's certificate is refused: "));
        let no_tls = sqlx::Error::Tls("server does not support TLS".into());
        assert_eq!(
            connect_failure(&no_tls, "db", PgSslMode::Require, None),
            "the server does not offer TLS, which sslmode=require requires"
        );
    }

    /// Whether `task` is blocked on a lock: waits until a session of `meta`'s database is seen waiting on one
    /// (`pg_stat_activity`; the 30 s deadline bounds a hang only), then says whether the task is still unfinished.
    /// A task that finishes first was not waiting.
    async fn still_waiting<T>(meta: &Metadata, task: &tokio::task::JoinHandle<T>) -> bool {
        let Backend::Postgres(pool) = &meta.backend else { unreachable!("a PostgreSQL test") };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            if waiting > 0 {
                return !task.is_finished();
            }
            if task.is_finished() {
                return false;
            }
            assert!(std::time::Instant::now() < deadline, "no session waits on a lock, and the task has not finished");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn postgres_change_log_rows_are_numbered_in_commit_order() {
        let (_dir, meta) = database(TestBackend::Postgres).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let start = meta.feed().last_change().await.unwrap();
        let mut first = meta.begin_write().await.unwrap();
        let key = crate::names::ObjectKey::parse("k").unwrap();
        first.upsert_object(bucket.id, &key, &"a".repeat(64), 1, &Default::default(), 0).await.unwrap();
        // A second writer of the log (another connection, as another replica's) waits for the first to commit.
        let second = tokio::spawn({
            let meta = meta.clone();
            async move { meta.create_bucket(&BucketName::parse("second").unwrap(), false, 0).await.unwrap() }
        });
        assert!(still_waiting(&meta, &second).await, "the second writer did not wait for the change-log lock");
        first.commit().await.unwrap();
        second.await.unwrap();
        let crate::store::Catchup::Changes(changes) = meta.feed().changes_since(start).await.unwrap() else {
            panic!("nothing was pruned")
        };
        let logged: Vec<&str> = changes.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(logged, ["k", "second"], "{changes:?}");
        assert!(changes[0].seq < changes[1].seq);
    }

    #[tokio::test]
    async fn postgres_blob_ref_lock_excludes_other_connections() {
        let (_dir, meta) = database(TestBackend::Postgres).await;
        let held = meta.lock_blob_refs().await.unwrap();
        let waiter = tokio::spawn({
            let meta = meta.clone();
            async move { meta.lock_blob_refs().await.unwrap().commit().await.unwrap() }
        });
        assert!(still_waiting(&meta, &waiter).await, "a second lock_blob_refs did not wait");
        drop(held);
        waiter.await.unwrap();
        // A plain write transaction does not take it.
        let _held = meta.lock_blob_refs().await.unwrap();
        meta.begin_write().await.unwrap().commit().await.unwrap();
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
        assert!(!has_pending(&store.meta));
        assert!(store.meta.list_buckets().await.unwrap().is_empty(), "the new column exists");
        store.meta.close().await;
        let again = Store::open_read_only(&data, &database, Duration::from_secs(5)).await.unwrap();
        assert!(!has_pending(&again.meta), "an up-to-date database opens read-only");
        again.meta.close().await;
    }
}
