//! The change feed: how a server learns that any process changed something it caches.
//!
//! SQLite: triggers (migrations 0004, 0006, 0007, 0010) log every change to a cached table in `cache_changes`, whoever
//! makes it; every commit through [`WriteTx::commit`](super::WriteTx::commit) then bumps the shared generation
//! counter (`generation.rs`, a memory-mapped file in the data dir). A reader compares the counter with the value
//! it last synchronised at (one atomic load) and reads the new log rows only when it moved.

use std::sync::Arc;

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
    /// `name` is the S3 access key id (migration 0010).
    S3Key,
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
            "s3_key" => ChangeKind::S3Key,
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
            ChangeKind::S3Key => "s3_key",
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
struct ChangeRow {
    seq: i64,
    kind: String,
    bucket_id: Option<i64>,
    name: String,
}

impl From<ChangeRow> for CacheChange {
    fn from(r: ChangeRow) -> Self {
        CacheChange { seq: r.seq, kind: ChangeKind::parse(&r.kind), bucket_id: r.bucket_id, name: r.name }
    }
}

/// The change feed of one database. Cheap to clone.
#[derive(Clone)]
pub struct ChangeFeed {
    /// Bumped after every commit that may change what a server caches.
    generation: Arc<Generation>,
    backend: Backend,
}

impl ChangeFeed {
    pub(super) fn new(generation: Arc<Generation>, backend: Backend) -> Self {
        Self { generation, backend }
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

    /// Changes after `seq`, oldest first.
    pub async fn changes_since(&self, seq: i64) -> Result<Vec<CacheChange>, MetadataError> {
        let Backend::Sqlite(pool) = &self.backend;
        let rows: Vec<ChangeRow> =
            sqlx::query_as("SELECT seq, kind, bucket_id, name FROM cache_changes WHERE seq > ?1 ORDER BY seq")
                .bind(seq)
                .fetch_all(pool)
                .await?;
        Ok(rows.into_iter().map(CacheChange::from).collect())
    }

    /// The newest change's sequence number (0 when there is none): where a fresh reader starts.
    pub async fn last_change(&self) -> Result<i64, MetadataError> {
        let Backend::Sqlite(pool) = &self.backend;
        Ok(sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM cache_changes").fetch_one(pool).await?)
    }

    /// Drops changes up to `seq`, once the server has applied them. Announces nothing: no cache depends on it.
    pub async fn prune(&self, seq: i64) -> Result<(), MetadataError> {
        let Backend::Sqlite(pool) = &self.backend;
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("DELETE FROM cache_changes WHERE seq <= ?1").bind(seq).execute(&mut *tx).await?;
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
        for stored in ["bucket", "object", "token", "signing_key", "revoked_signature", "s3_key"] {
            let kind = ChangeKind::parse(stored);
            assert!(!matches!(kind, ChangeKind::Unknown(_)), "{stored}");
            assert_eq!(kind.as_str(), stored);
        }
        assert_eq!(ChangeKind::parse("s4_key"), ChangeKind::Unknown("s4_key".into()));
        assert_eq!(ChangeKind::parse("s4_key").as_str(), "s4_key");
    }

    #[tokio::test]
    async fn a_commit_moves_the_feed_and_logs_what_changed() {
        let (_dir, meta) = database().await;
        let feed = meta.feed().clone();
        let (before, start) = (feed.current(), feed.last_change().await.unwrap());
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        assert_ne!(feed.current(), before, "the commit was announced");
        let changes = feed.changes_since(start).await.unwrap();
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(
            (&changes[0].kind, changes[0].bucket_id, changes[0].name.as_str()),
            (&ChangeKind::Bucket, Some(bucket.id), "bkt")
        );
        feed.prune(changes[0].seq).await.unwrap();
        assert!(feed.changes_since(start).await.unwrap().is_empty());
    }
}
