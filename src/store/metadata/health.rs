//! Whether the database answers: the probe behind `GET /readyz`, and the one classification of database errors
//! into "unreachable" and the rest.
//!
//! A server runs [`Metadata::ping`] in the background about once a second and keeps the last result in a
//! [`DatabaseHealth`]; `/readyz` reads that flag, so it answers at once even while the database hangs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{Backend, Metadata, MetadataError};

/// The last probe's verdict, shared by the probe task (which writes it) and `/readyz` (which reads it).
#[derive(Debug)]
pub struct DatabaseHealth {
    reachable: AtomicBool,
}

impl DatabaseHealth {
    /// Starts as reachable: it is made after the database was opened (and migrated).
    pub fn new() -> Self {
        Self { reachable: AtomicBool::new(true) }
    }

    pub fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Acquire)
    }

    /// Records a probe's result; returns whether it changed the verdict (so the caller logs transitions only).
    pub fn set_reachable(&self, reachable: bool) -> bool {
        self.reachable.swap(reachable, Ordering::AcqRel) != reachable
    }
}

impl Default for DatabaseHealth {
    fn default() -> Self {
        Self::new()
    }
}

impl Metadata {
    /// One round trip (`SELECT 1`) through the pool, as a request would make it. No answer `within` is
    /// [`MetadataError::Unavailable`], like a refused or lost connection.
    pub async fn ping(&self, within: Duration) -> Result<(), MetadataError> {
        let answer = async {
            match &self.backend {
                Backend::Sqlite(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
                Backend::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
            }
        };
        match tokio::time::timeout(within, answer).await {
            Ok(answer) => answer.map_err(MetadataError::from),
            Err(_) => Err(MetadataError::no_answer_within(within)),
        }
    }
}

impl MetadataError {
    /// The database did not answer in time: unreachable, as far as the caller can tell.
    pub fn no_answer_within(within: Duration) -> Self {
        let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no answer within {within:?}"));
        MetadataError::Unavailable(sqlx::Error::Io(timed_out))
    }
}

/// Connection-level failures: the pool found no connection in time or was closed, the socket failed, TLS or the
/// protocol broke (a server that went away mid-message), or the server said it is shutting down or cannot take
/// connections now. A statement the database refused is none of these.
pub(super) fn is_connection_failure(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        // SQLSTATE class 08 (connection exception) and 57P01-57P03 (admin/crash shutdown, cannot connect now):
        // what PostgreSQL sends as it stops or starts. SQLite's codes are numbers and never match.
        sqlx::Error::Database(db) => {
            db.code().is_some_and(|code| code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::metadata::TestBackend;
    use crate::store::metadata::pool::tests::database;

    #[test]
    fn connection_failures_are_unavailable_and_statement_errors_are_not() {
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        for e in [sqlx::Error::PoolTimedOut, sqlx::Error::PoolClosed, refused, sqlx::Error::Protocol("eof".into())] {
            assert!(MetadataError::from(e).is_unavailable());
        }
        for e in [sqlx::Error::RowNotFound, sqlx::Error::ColumnNotFound("x".into())] {
            assert!(!MetadataError::from(e).is_unavailable());
        }
        let wrapped = anyhow::Error::from(MetadataError::from(sqlx::Error::PoolTimedOut)).context("cannot put");
        assert!(MetadataError::in_chain_is_unavailable(&wrapped));
        assert!(!MetadataError::in_chain_is_unavailable(&anyhow::anyhow!("disk full")));
    }

    on_both_backends!(a_ping_answers_while_the_database_is_open_and_fails_unavailable_once_it_is_closed);
    async fn a_ping_answers_while_the_database_is_open_and_fails_unavailable_once_it_is_closed(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        meta.ping(Duration::from_secs(1)).await.unwrap();
        meta.close().await;
        let err = meta.ping(Duration::from_secs(1)).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
    }

    on_both_backends!(a_refused_statement_is_not_unavailable);
    async fn a_refused_statement_is_not_unavailable(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let err = match &meta.backend {
            Backend::Sqlite(pool) => sqlx::query("SELECT * FROM no_such_table").execute(pool).await.unwrap_err(),
            Backend::Postgres(pool) => sqlx::query("SELECT * FROM no_such_table").execute(pool).await.unwrap_err(),
        };
        let err = MetadataError::from(err);
        assert!(!err.is_unavailable(), "{err:?}");
    }

    #[test]
    fn health_reports_transitions_only() {
        let health = DatabaseHealth::new();
        assert!(health.is_reachable());
        assert!(!health.set_reachable(true));
        assert!(health.set_reachable(false));
        assert!(!health.set_reachable(false));
        assert!(!health.is_reachable());
        assert!(health.set_reachable(true));
    }
}
