//! The change feed: how a server learns that any process changed something it caches.
//!
//! Triggers (SQLite: migrations 0004, 0006, 0007; PostgreSQL: migrations/postgres) log every change to a cached
//! table in `cache_changes`, whoever makes it; every commit through [`WriteTx::commit`](super::WriteTx::commit)
//! then bumps the generation counter (`generation.rs`). A reader compares the counter with the value it last
//! synchronised at (one atomic load) and reads the new log rows only when it moved.
//! - SQLite: the counter is a memory-mapped file in the data dir, shared by every process, so it counts every
//!   commit; [`ChangeFeed::watch`] has nothing to do.
//! - PostgreSQL: the counter is process-local and counts this process's commits; [`ChangeFeed::watch`] runs the
//!   watcher (`pg_feed.rs`), which moves [`ChangeFeed::subscribe`] when other processes' commits may be in the log.

use std::sync::Arc;

use tokio::sync::watch;

use super::generation::Generation;
use super::{Backend, MetadataError};

/// What a change-log row names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeKind {
    /// `name` is the bucket's name, `bucket_id` its id (absent in rows logged before migration 0006).
    Bucket,
    /// `name` is the key, `bucket_id` the object's bucket.
    Object,
    /// `name` is the token id.
    Token,
    /// `name` is the key id.
    SigningKey,
    /// `name` is the signature.
    RevokedSignature,
    /// A kind this binary does not know (from a newer schema), as stored.
    Unknown(String),
}

impl ChangeKind {
    /// The stored spelling (the triggers write it).
    pub fn parse(stored: &str) -> Self {
        match stored {
            "bucket" => ChangeKind::Bucket,
            "object" => ChangeKind::Object,
            "token" => ChangeKind::Token,
            "signing_key" => ChangeKind::SigningKey,
            "revoked_signature" => ChangeKind::RevokedSignature,
            other => ChangeKind::Unknown(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            ChangeKind::Bucket => "bucket",
            ChangeKind::Object => "object",
            ChangeKind::Token => "token",
            ChangeKind::SigningKey => "signing_key",
            ChangeKind::RevokedSignature => "revoked_signature",
            ChangeKind::Unknown(stored) => stored,
        }
    }
}

/// One row of the change log: what a server must evict from its caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheChange {
    pub seq: i64,
    pub kind: ChangeKind,
    pub bucket_id: Option<i64>,
    pub name: String,
}

#[derive(sqlx::FromRow)]
pub(super) struct ChangeRow {
    pub(super) seq: i64,
    kind: String,
    bucket_id: Option<i64>,
    name: String,
}

impl From<ChangeRow> for CacheChange {
    fn from(r: ChangeRow) -> Self {
        CacheChange { seq: r.seq, kind: ChangeKind::parse(&r.kind), bucket_id: r.bucket_id, name: r.name }
    }
}

/// What [`ChangeFeed::changes_since`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Catchup {
    /// Every change after the position asked for, oldest first.
    Changes(Vec<CacheChange>),
    /// Changes after the position were pruned before this reader read them: it must forget everything it
    /// caches, and continue from `resume_at`.
    Missed { resume_at: i64 },
}

/// The change feed of one database. Cheap to clone.
#[derive(Clone)]
pub struct ChangeFeed {
    /// Bumped after every commit that may change what a server caches (SQLite: by any process; PostgreSQL:
    /// by this one).
    generation: Arc<Generation>,
    /// Moved whenever there may be changes to read that `generation` does not count (PostgreSQL: another
    /// process's commits, seen by the watcher). The value means nothing; a change means "look".
    looks: Arc<watch::Sender<u64>>,
    backend: Backend,
}

impl ChangeFeed {
    pub(super) fn new(generation: Arc<Generation>, backend: Backend) -> Self {
        Self { generation, looks: Arc::new(watch::channel(0).0), backend }
    }

    /// Resolves whenever the feed may hold changes that [`current`](Self::current) does not count (commits by
    /// other replicas, seen by the watcher). A server's caches sync in the background on each one.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.looks.subscribe()
    }

    /// Asks subscribers to look at the log (the watcher calls it; so do tests that stand in for one).
    pub(crate) fn look(&self) {
        self.looks.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A counter that moves after every announced commit, by any process: one atomic load, for the hot path.
    /// Read it before `changes_since`, and every commit it counts is visible to that read.
    #[inline]
    pub fn current(&self) -> u64 {
        self.generation.current()
    }

    /// Called after a commit: every reader that sees the new `current` can see that commit.
    pub(super) fn announce(&self) {
        self.generation.bump();
    }

    /// Changes after `seq`, oldest first, or word that some of them were pruned before they were read. SQLite
    /// prunes only what this server applied, so it never misses.
    pub async fn changes_since(&self, seq: i64) -> Result<Catchup, MetadataError> {
        let Backend::Sqlite(pool) = &self.backend;
        let rows: Vec<ChangeRow> =
            sqlx::query_as("SELECT seq, kind, bucket_id, name FROM cache_changes WHERE seq > $1 ORDER BY seq")
                .bind(seq)
                .fetch_all(pool)
                .await?;
        Ok(Catchup::Changes(rows.into_iter().map(CacheChange::from).collect()))
    }

    /// The newest change's sequence number (0 when there is none): where a fresh reader starts.
    pub async fn last_change(&self) -> Result<i64, MetadataError> {
        let Backend::Sqlite(pool) = &self.backend;
        Ok(sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM cache_changes").fetch_one(pool).await?)
    }

    /// Runs the watcher a `serve` process needs to hear of other processes' commits, for as long as it is
    /// polled. SQLite: none is needed (the shared counter counts them), so it returns at once.
    pub async fn watch(&self) {
        let Backend::Sqlite(_) = &self.backend;
    }

    /// Prunes the change log. SQLite: changes up to `applied`, once the server has applied them. Announces
    /// nothing: no cache depends on it.
    pub async fn prune(&self, applied: i64) -> Result<(), MetadataError> {
        let Backend::Sqlite(pool) = &self.backend;
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("DELETE FROM cache_changes WHERE seq <= $1").bind(applied).execute(&mut *tx).await?;
        Ok(tx.commit().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::BucketName;
    use crate::store::metadata::pool::tests::database;

    #[test]
    fn change_kinds_keep_their_stored_spelling() {
        for stored in ["bucket", "object", "token", "signing_key", "revoked_signature"] {
            let kind = ChangeKind::parse(stored);
            assert!(!matches!(kind, ChangeKind::Unknown(_)), "{stored}");
            assert_eq!(kind.as_str(), stored);
        }
        assert_eq!(ChangeKind::parse("s3_key"), ChangeKind::Unknown("s3_key".into()));
        assert_eq!(ChangeKind::parse("s3_key").as_str(), "s3_key");
    }

    #[tokio::test]
    async fn a_commit_moves_the_feed_and_logs_what_changed() {
        let (_dir, meta) = database().await;
        let feed = meta.feed().clone();
        let (before, start) = (feed.current(), feed.last_change().await.unwrap());
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        assert_ne!(feed.current(), before, "the commit was announced");
        let Catchup::Changes(changes) = feed.changes_since(start).await.unwrap() else { panic!("SQLite never misses") };
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(
            (&changes[0].kind, changes[0].bucket_id, changes[0].name.as_str()),
            (&ChangeKind::Bucket, Some(bucket.id), "bkt")
        );
        feed.prune(changes[0].seq).await.unwrap();
        assert_eq!(feed.changes_since(start).await.unwrap(), Catchup::Changes(vec![]));
    }
}
