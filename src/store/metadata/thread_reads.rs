//! SQLite reads on the calling thread: a read-only connection of its own per thread that reads (the runtime's
//! workers), for the lookup a cache miss makes. sqlx runs each SQLite connection on a worker thread of its own and
//! hands it every statement over a channel, so a read through the pool costs two thread hops and their wake-ups;
//! here it costs the B-tree probes alone, through the same memory map. Such a read never waits: the connection has
//! no busy timeout, WAL readers do not wait for writers, and a read that fails for any reason (busy while the
//! WAL index is rebuilt, a connection that cannot open) answers `None`, and the caller reads through the pool.
//! A long scan (the stats fold's read of the ledger) takes a connection of its own to a blocking thread, and the
//! stats flush's appends to the ledger and the fold's chunks go through the one write connection kept here, on
//! blocking threads too.
//! rusqlite for the connection, on the same `libsqlite3-sys` as sqlx: one SQLite in the binary.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use thread_local::ThreadLocal;

/// The per-thread read connections to one database file, and one write connection.
pub(super) struct ThreadReaders {
    path: PathBuf,
    /// Each thread's, locked by that thread alone but for [`ThreadReaders::close`] (an uncontended lock).
    connections: ThreadLocal<Mutex<Option<Connection>>>,
    /// The write connection, opened at the first write; a write waits for the lock up to `busy`, as the pool's do.
    writer: Mutex<Option<Connection>>,
    busy: Duration,
    closed: AtomicBool,
}

impl ThreadReaders {
    pub(super) fn new(path: PathBuf, busy: Duration) -> Self {
        Self { path, connections: ThreadLocal::new(), writer: Mutex::new(None), busy, closed: AtomicBool::new(false) }
    }

    /// Closes every thread's connection, and no read opens one after: the database's last connection then is the
    /// pool's, whose close folds and removes the WAL.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for connection in self.connections.iter() {
            drop(connection.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
        }
        drop(self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
    }

    /// `write` on the write connection, on the calling thread, which may wait (a blocking thread): `None` once
    /// closed or if the connection cannot open, and the caller writes through the pool. A write that fails leaves
    /// the connection as it was (its transaction rolled back) for the next.
    pub(super) fn write<T>(
        &self,
        write: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Option<rusqlite::Result<T>> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let mut slot = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_none() {
            *slot = open_for_write(&self.path, self.busy)
                .map_err(|e| tracing::debug!(error = %e, "cannot open a write connection; through the pool"))
                .ok();
        }
        Some(write(slot.as_mut()?))
    }

    /// [`ThreadReaders::write`] on a blocking thread, for an async caller. `None`: nothing was written (closed, no
    /// connection, or the runtime shutting down before it ran), and the caller writes through the pool.
    pub(super) async fn write_on_blocking_thread<T: Send + 'static>(
        self: &Arc<Self>,
        write: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Option<rusqlite::Result<T>> {
        let readers = Arc::clone(self);
        match tokio::task::spawn_blocking(move || readers.write(write)).await {
            Ok(written) => written,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(_) => None,
            },
        }
    }

    /// A read-only connection of the caller's own, for a long read on a blocking thread (the stats fold's scan of
    /// the ledger), or `None` once closed or if it cannot open. It is the caller's to drop.
    pub(super) fn open_for_scan(&self) -> Option<Connection> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        open(&self.path).map_err(|e| tracing::debug!(error = %e, "cannot open a read connection for a scan")).ok()
    }

    /// `read` on this thread's connection (opened at its first read), or `None` if it failed.
    pub(super) fn read<T>(&self, what: &str, read: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Option<T> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let cell = self.connections.get_or(|| Mutex::new(None));
        // A read never calls back into another on the same thread; if one did, it would take the pool instead.
        let mut slot = cell.try_lock().ok()?;
        if slot.is_none() {
            *slot = open(&self.path)
                .map_err(|e| tracing::debug!(error = %e, "cannot open a thread's read connection"))
                .ok();
        }
        let connection = slot.as_ref()?;
        read(connection)
            .map_err(|e| tracing::debug!(error = %e, what, "a read on this thread failed; through the pool"))
            .ok()
    }
}

fn open(path: &std::path::Path) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection = Connection::open_with_flags(path, flags)?;
    connection.pragma_update(None, "mmap_size", super::pool::SQLITE_MMAP_BYTES)?;
    // No busy timeout (SQLite's default): a busy read fails at once, and the caller goes through the pool.
    connection.set_prepared_statement_cache_capacity(8);
    Ok(connection)
}

/// The pool's settings for a writer (`pool::open_sqlite`): the database is in WAL mode already.
fn open_for_write(path: &std::path::Path, busy: Duration) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection = Connection::open_with_flags(path, flags)?;
    connection.pragma_update(None, "mmap_size", super::pool::SQLITE_MMAP_BYTES)?;
    connection.pragma_update(None, "synchronous", "NORMAL")?;
    connection.pragma_update(None, "foreign_keys", true)?;
    connection.busy_timeout(busy)?;
    connection.set_prepared_statement_cache_capacity(8);
    Ok(connection)
}

/// A row type that reads itself from a rusqlite row by column position (`from_row!` writes it beside
/// `sqlx::FromRow`): a flattened row's columns first, then the type's own fields in their order. By position, not by
/// name as sqlx does: rusqlite finds a name by comparing it with each column's in turn, eighteen times for an
/// object's row. [`ReadRow::matches`] checks a statement's order.
pub(super) trait ReadRow: Sized {
    /// The column names this type reads, in the order it reads them.
    fn columns(names: &mut Vec<&'static str>);

    /// Reads the type from the columns at `*at` onwards, moving `at` past them.
    fn read_columns(row: &rusqlite::Row<'_>, at: &mut usize) -> rusqlite::Result<Self>;

    fn read_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Self::read_columns(row, &mut 0)
    }

    /// Whether `statement` answers exactly these columns in this order (asserted at each such read in debug builds,
    /// and by the tests of each statement read this way).
    fn matches(statement: &rusqlite::Statement<'_>) -> bool {
        let mut names = Vec::new();
        Self::columns(&mut names);
        statement.column_names() == names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_opens_its_connection_once_and_a_missing_database_answers_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let missing = ThreadReaders::new(path.clone(), Duration::from_secs(5));
        assert_eq!(missing.read("probe", |c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))), None);
        let writer = Connection::open(&path).unwrap();
        writer.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (v INTEGER); INSERT INTO t VALUES (7);").unwrap();
        let readers = ThreadReaders::new(path, Duration::from_secs(5));
        let read = || readers.read("t", |c| c.query_row("SELECT v FROM t", [], |r| r.get::<_, i64>(0)));
        assert_eq!(read(), Some(7));
        writer.execute("UPDATE t SET v = 8", []).unwrap();
        assert_eq!(read(), Some(8), "each read sees the last commit");
        // A write lock held open does not keep a WAL reader from the last commit, nor make it wait.
        writer.execute_batch("BEGIN IMMEDIATE; UPDATE t SET v = 9;").unwrap();
        assert_eq!(read(), Some(8));
        writer.execute_batch("COMMIT").unwrap();
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(read(), Some(9), "another thread, its own connection"));
        });
        assert!(readers.read("a write", |c| c.execute("UPDATE t SET v = 1", [])).is_none(), "read-only");
        readers.close();
        assert_eq!(read(), None, "closed: through the pool");
        assert!(readers.connections.iter().all(|c| c.lock().unwrap().is_none()), "every thread's closed");
    }
}
