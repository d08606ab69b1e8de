//! The change feed: how a server learns that any process changed something it caches.
//!
//! SQLite: triggers (migrations 0004, 0006, 0007) log every change to a cached table in `cache_changes`, whoever
//! makes it; every commit through [`WriteTx::commit`](super::WriteTx::commit) then bumps the shared generation
//! counter (`generation.rs`, a memory-mapped file in the data dir). A reader compares the counter with the value
//! it last synchronised at (one atomic load) and reads the new log rows only when it moved.
//!
//! PostgreSQL: the triggers of `migrations/postgres` log the same rows, under an advisory lock so that `seq`
//! values are assigned in commit order, and `NOTIFY blobgate_changes` at commit. The counter is process-local for
//! now: commits through this process move it.

use std::sync::Arc;
use std::time::Duration;

use super::generation::Generation;
use super::{Backend, MetadataError};

/// PostgreSQL: how long a change stays in the log, so that every replica has applied it before it is pruned.
pub const PG_CHANGE_RETENTION: Duration = Duration::from_secs(600);

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
        let rows: Vec<ChangeRow> = with_pool!(&self.backend, pool =>
            sqlx::query_as("SELECT seq, kind, bucket_id, name FROM cache_changes WHERE seq > $1 ORDER BY seq")
                .bind(seq)
                .fetch_all(pool)
                .await?);
        Ok(rows.into_iter().map(CacheChange::from).collect())
    }

    /// The newest change's sequence number (0 when there is none): where a fresh reader starts. PostgreSQL: at
    /// least the pruning horizon, even when every row was pruned.
    pub async fn last_change(&self) -> Result<i64, MetadataError> {
        Ok(match &self.backend {
            Backend::Sqlite(pool) => {
                sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM cache_changes").fetch_one(pool).await?
            }
            Backend::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT greatest(coalesce(max(seq), 0), (SELECT pruned_through FROM cache_changes_horizon))
                     FROM cache_changes",
                )
                .fetch_one(pool)
                .await?
            }
        })
    }

    /// Drops changes up to `seq`, once the server has applied them. Announces nothing: no cache depends on it.
    /// PostgreSQL: other replicas may not have applied them yet, so only changes older than
    /// [`PG_CHANGE_RETENTION`] go, and `cache_changes_horizon` is raised past them in the same statement: a reader
    /// behind it must flush its whole cache.
    pub async fn prune(&self, seq: i64) -> Result<(), MetadataError> {
        match &self.backend {
            Backend::Sqlite(pool) => {
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                sqlx::query("DELETE FROM cache_changes WHERE seq <= $1").bind(seq).execute(&mut *tx).await?;
                tx.commit().await?;
            }
            Backend::Postgres(pool) => {
                sqlx::query(
                    "WITH gone AS (
                         DELETE FROM cache_changes WHERE seq <= $1 AND created_at < now() - make_interval(secs => $2)
                         RETURNING seq)
                     UPDATE cache_changes_horizon
                     SET pruned_through = greatest(pruned_through, (SELECT max(seq) FROM gone)) WHERE id = 1",
                )
                .bind(seq)
                .bind(PG_CHANGE_RETENTION.as_secs_f64())
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::BucketName;
    use crate::store::metadata::pool::tests::database;

    async fn horizon(pool: &sqlx::PgPool) -> i64 {
        sqlx::query_scalar("SELECT pruned_through FROM cache_changes_horizon").fetch_one(pool).await.unwrap()
    }

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

    /// Every kind of change, as the log names it: (kind, bucket_id, name).
    async fn log_of_every_change(backend: super::super::TestBackend) -> Vec<(String, Option<i64>, String)> {
        use crate::names::{ObjectAttrs, ObjectKey};
        use crate::store::metadata::{Scope, SigningKey, TokenRecord, VariantRecord};
        let (_dir, meta) = database(backend).await;
        let meta = meta.with_secrets_key(crate::store::sealing::SecretsKey::from_bytes([3; 32]));
        let start = meta.feed().last_change().await.unwrap();
        let name = BucketName::parse("bkt").unwrap();
        let bucket = meta.create_bucket(&name, false, 0).await.unwrap();
        meta.update_bucket(&name, Some(true), None).await.unwrap();
        let key = ObjectKey::parse("k").unwrap();
        let variant = VariantRecord { encoding: "br".into(), sha256: "b".repeat(64), size: 1 };
        let mut tx = meta.begin_write().await.unwrap();
        tx.upsert_object(bucket.id, &key, &"a".repeat(64), 2, &ObjectAttrs::default(), 0).await.unwrap();
        tx.replace_variants(bucket.id, "k", std::slice::from_ref(&variant)).await.unwrap();
        tx.upsert_object(bucket.id, &key, &"c".repeat(64), 2, &ObjectAttrs::default(), 1).await.unwrap();
        tx.commit().await.unwrap();
        let token = TokenRecord {
            id: "tok".into(),
            secret_hash: vec![0; 32],
            bucket_id: bucket.id,
            bucket_name: "bkt".into(),
            prefix: String::new(),
            scope: Scope::Read,
            created_at: 0,
            expires_at: None,
            revoked_at: None,
        };
        meta.create_token(&token).await.unwrap();
        meta.revoke_token("tok", 1).await.unwrap();
        let signing = SigningKey { id: "key".into(), secret: vec![1; 32], created_at: 0, retired_at: None };
        meta.create_signing_key(&signing).await.unwrap();
        meta.retire_signing_key("key", 1).await.unwrap();
        meta.revoke_signature("sig", 10, 1).await.unwrap();
        let mut tx = meta.begin_write().await.unwrap();
        tx.delete_object(bucket.id, &key).await.unwrap();
        tx.delete_empty_bucket(bucket.id).await.unwrap();
        tx.commit().await.unwrap();
        let changes = meta.feed().changes_since(start).await.unwrap();
        changes.into_iter().map(|c| (c.kind.as_str().to_owned(), c.bucket_id, c.name)).collect()
    }

    #[tokio::test]
    async fn both_backends_log_the_same_rows_for_every_change() {
        use super::super::TestBackend;
        let sqlite = log_of_every_change(TestBackend::Sqlite).await;
        let postgres = log_of_every_change(TestBackend::Postgres).await;
        let row = |kind: &str, bucket: Option<i64>, name: &str| (kind.to_owned(), bucket, name.to_owned());
        let expected = vec![
            row("bucket", Some(1), "bkt"),
            row("bucket", Some(1), "bkt"),
            row("bucket", Some(1), "bkt"),
            row("object", Some(1), "k"),
            row("object", Some(1), "k"),
            row("object", Some(1), "k"),
            row("object", Some(1), "k"),
            row("token", None, "tok"),
            row("token", None, "tok"),
            row("signing_key", None, "key"),
            row("signing_key", None, "key"),
            row("revoked_signature", None, "sig"),
            row("object", Some(1), "k"),
            row("object", Some(1), "k"),
            row("token", None, "tok"),
            row("bucket", Some(1), "bkt"),
        ];
        assert_eq!(sqlite, expected, "SQLite");
        assert_eq!(postgres, expected, "PostgreSQL");
    }

    backend_tests! {
        async fn a_commit_moves_the_feed_and_logs_what_changed(backend) {
            let (_dir, meta) = database(backend).await;
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
            if let Backend::Postgres(pool) = &meta.backend {
                // Other replicas may not have applied a change this young: it stays.
                assert_eq!(feed.changes_since(start).await.unwrap(), changes, "a young change is kept");
                assert_eq!(horizon(pool).await, 0);
                sqlx::query("UPDATE cache_changes SET created_at = now() - interval '1 hour'")
                    .execute(pool)
                    .await
                    .unwrap();
                feed.prune(changes[0].seq).await.unwrap();
                assert_eq!(horizon(pool).await, changes[0].seq, "the horizon moves with what was pruned");
                assert_eq!(feed.last_change().await.unwrap(), changes[0].seq, "an empty log starts past the horizon");
            }
            assert!(feed.changes_since(start).await.unwrap().is_empty());
        }
    }
}
