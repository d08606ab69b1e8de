//! The change feed: how a server learns that any process changed something it caches.
//!
//! Triggers (SQLite: migrations 0004, 0006, 0007, 0010; PostgreSQL: migrations/postgres) log every change to a cached
//! table in `cache_changes`, whoever makes it; every commit through [`WriteTx::commit`](super::WriteTx::commit)
//! then bumps the generation counter (`generation.rs`). A reader compares the counter with the value it last
//! synchronised at (one atomic load) and reads the new log rows only when it moved.
//! - SQLite: the counter is a memory-mapped file in the data dir, shared by every process, so it counts every
//!   commit; [`ChangeFeed::watch`] has nothing to do.
//! - PostgreSQL: the triggers of `migrations/postgres` log under an advisory lock, so that `seq` values are
//!   assigned in commit order, and `NOTIFY blobgate_changes` at commit. The counter is process-local and counts
//!   this process's commits; [`ChangeFeed::watch`] runs the watcher (`pg_feed.rs`), which moves
//!   [`ChangeFeed::subscribe`] when other processes' commits may be in the log.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::generation::Generation;
use super::{Backend, MetadataError, pg_feed};

/// PostgreSQL: how long a change stays in the log. Replicas apply a change within a second while they reach the
/// database; this is for one cut off from it (a network partition, a database restart) to catch up row by row
/// when it returns. One that was away longer flushes its caches instead. An hour of changes is small (a row is
/// under 100 bytes, and changes are administrative: uploads, revocations).
pub const PG_CHANGE_RETENTION: Duration = Duration::from_secs(60 * 60);

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
    /// `name` is the limit's principal, `KIND:NAME` (migration 0024): servers reload every limit.
    Limit,
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
            "limit" => ChangeKind::Limit,
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
            ChangeKind::Limit => "limit",
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

pub(super) struct ChangeRow {
    pub(super) seq: i64,
    kind: String,
    bucket_id: Option<i64>,
    name: String,
}
from_row!(ChangeRow { seq, kind, bucket_id, name });

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
        match &self.backend {
            Backend::Sqlite(pool) => {
                let rows: Vec<ChangeRow> =
                    sqlx::query_as("SELECT seq, kind, bucket_id, name FROM cache_changes WHERE seq > $1 ORDER BY seq")
                        .bind(seq)
                        .fetch_all(pool)
                        .await?;
                Ok(Catchup::Changes(rows.into_iter().map(CacheChange::from).collect()))
            }
            Backend::Postgres(pool) => pg_feed::changes_since(pool, seq).await,
        }
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

    /// Runs the watcher a `serve` process needs to hear of other processes' commits, for as long as it is
    /// polled. SQLite: none is needed (the shared counter counts them), so it returns at once. PostgreSQL:
    /// `pg_feed::watch`.
    pub async fn watch(&self) {
        if let Backend::Postgres(pool) = &self.backend {
            pg_feed::watch(self, pool).await;
        }
    }

    /// Prunes the change log, in batches of [`PRUNE_BATCH`] rows, each its own transaction, so that a log of
    /// millions of rows (a bulk load or an `import` leaves two per object) never holds the write lock for long;
    /// returns the rows deleted. Announces nothing: no cache depends on it. SQLite: changes up to `applied`, once
    /// the server has applied them. PostgreSQL: other replicas may lag, so by age, whatever `applied` says:
    /// changes older than [`PG_CHANGE_RETENTION`] go and `cache_changes_horizon` is raised past each batch in the
    /// same statement; a reader behind it flushes its whole cache (`pg_feed::prune`).
    pub async fn prune(&self, applied: i64) -> Result<u64, MetadataError> {
        match &self.backend {
            Backend::Sqlite(pool) => {
                let mut deleted = 0;
                loop {
                    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                    let batch = sqlx::query(
                        "DELETE FROM cache_changes WHERE seq IN \
                         (SELECT seq FROM cache_changes WHERE seq <= $1 ORDER BY seq LIMIT $2)",
                    )
                    .bind(applied)
                    .bind(PRUNE_BATCH)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    tx.commit().await?;
                    deleted += batch;
                    if batch < PRUNE_BATCH as u64 {
                        return Ok(deleted);
                    }
                    // Writers waiting for the lock go between batches: a pause longer than SQLite's busy handler
                    // sleeps between its tries, or a writer of another process would sleep through the gap.
                    tokio::time::sleep(super::BETWEEN_WRITE_BATCHES).await;
                }
            }
            Backend::Postgres(pool) => pg_feed::prune(pool, PG_CHANGE_RETENTION, PRUNE_BATCH).await,
        }
    }
}

/// Change-log rows deleted per transaction by [`ChangeFeed::prune`]: a few milliseconds of SQLite's write lock.
pub const PRUNE_BATCH: i64 = 2_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::BucketName;
    use crate::store::metadata::TestBackend;
    use crate::store::metadata::pool::tests::database;

    async fn horizon(pool: &sqlx::PgPool) -> i64 {
        sqlx::query_scalar("SELECT pruned_through FROM cache_changes_horizon").fetch_one(pool).await.unwrap()
    }

    #[test]
    fn change_kinds_keep_their_stored_spelling() {
        for stored in ["bucket", "object", "token", "signing_key", "revoked_signature", "s3_key", "limit"] {
            let kind = ChangeKind::parse(stored);
            assert!(!matches!(kind, ChangeKind::Unknown(_)), "{stored}");
            assert_eq!(kind.as_str(), stored);
        }
        assert_eq!(ChangeKind::parse("s4_key"), ChangeKind::Unknown("s4_key".into()));
        assert_eq!(ChangeKind::parse("s4_key").as_str(), "s4_key");
    }

    /// Every kind of change, as the log names it: (kind, bucket_id, name).
    async fn log_of_every_change(backend: TestBackend) -> Vec<(String, Option<i64>, String)> {
        use crate::names::{ObjectAttrs, ObjectKey};
        use crate::store::metadata::{Rights, S3KeyRecord, Scope, SigningKey, TokenRecord, VariantRecord};
        let (_dir, meta) = database(backend).await;
        let meta = meta.with_secrets_key(crate::store::sealing::SecretsKey::from_bytes([3; 32]));
        let start = meta.feed().last_change().await.unwrap();
        let name = BucketName::parse("bkt").unwrap();
        let bucket = meta.create_bucket(&name, false, 0).await.unwrap();
        meta.update_bucket(&name, crate::store::BucketChanges { public: Some(true), ..Default::default() })
            .await
            .unwrap();
        let key = ObjectKey::parse("k").unwrap();
        let variant = VariantRecord { encoding: "br".into(), sha256: "b".repeat(64), size: 1 };
        let mut tx = meta.begin_write().await.unwrap();
        tx.upsert_object(bucket.id, &key, &"a".repeat(64), 2, &ObjectAttrs::default(), 0).await.unwrap();
        tx.replace_variants(bucket.id, "k", std::slice::from_ref(&variant)).await.unwrap();
        tx.set_s3_etag(bucket.id, "k", &"a".repeat(64), "\"a-2\"", None, None).await.unwrap();
        // New content: the ETag row goes (logged too).
        tx.upsert_object(bucket.id, &key, &"c".repeat(64), 2, &ObjectAttrs::default(), 1).await.unwrap();
        tx.set_s3_etag(bucket.id, "k", &"c".repeat(64), "\"c-2\"", None, None).await.unwrap();
        tx.commit().await.unwrap();
        let token = TokenRecord {
            id: "tok".into(),
            secret_hash: vec![0; 32],
            rights: Rights::whole_bucket(bucket.id, "bkt", Scope::Read),
        };
        meta.create_token(&token).await.unwrap();
        meta.revoke_token("tok", 1).await.unwrap();
        let signing = SigningKey { id: "key".into(), secret: vec![1; 32], created_at: 0, retired_at: None };
        meta.create_signing_key(&signing).await.unwrap();
        meta.retire_signing_key("key", 1).await.unwrap();
        meta.revoke_signature("sig", 10, 1).await.unwrap();
        let s3_key = S3KeyRecord {
            id: "AKID".into(),
            secret: "s".repeat(40),
            rights: Rights::whole_bucket(bucket.id, "bkt", Scope::Read),
        };
        meta.create_s3_key(&s3_key).await.unwrap();
        meta.revoke_s3_key("AKID", 1).await.unwrap();
        let mut tx = meta.begin_write().await.unwrap();
        tx.delete_object(bucket.id, &key).await.unwrap();
        tx.delete_empty_bucket(bucket.id).await.unwrap();
        tx.commit().await.unwrap();
        let Catchup::Changes(changes) = meta.feed().changes_since(start).await.unwrap() else {
            panic!("nothing was pruned")
        };
        changes.into_iter().map(|c| (c.kind.as_str().to_owned(), c.bucket_id, c.name)).collect()
    }

    #[tokio::test]
    async fn both_backends_log_the_same_rows_for_every_change() {
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
            row("object", Some(1), "k"), // the S3 ETag set,
            row("object", Some(1), "k"), // dropped with its content,
            row("object", Some(1), "k"), // set again
            row("token", None, "tok"),   // inserted,
            row("token", None, "tok"),   // its grant,
            row("token", None, "tok"),   // the one-grant columns older releases read,
            row("token", None, "tok"),   // revoked
            row("signing_key", None, "key"),
            row("signing_key", None, "key"),
            row("revoked_signature", None, "sig"),
            row("s3_key", None, "AKID"),
            row("s3_key", None, "AKID"),
            row("s3_key", None, "AKID"),
            row("s3_key", None, "AKID"),
            row("object", Some(1), "k"),
            row("object", Some(1), "k"),
            row("object", Some(1), "k"), // the ETag row, gone with its object
            row("token", None, "tok"),   // its grant, gone with the bucket,
            row("token", None, "tok"),   // and the token, which granted nothing else
            row("s3_key", None, "AKID"),
            row("s3_key", None, "AKID"),
            row("bucket", Some(1), "bkt"),
        ];
        assert_eq!(sqlite, expected, "SQLite");
        assert_eq!(postgres, expected, "PostgreSQL");
    }

    on_both_backends!(a_long_log_is_pruned_whole_in_batches);
    async fn a_long_log_is_pruned_whole_in_batches(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let feed = meta.feed().clone();
        let rows = 2 * PRUNE_BATCH + 7;
        let fill = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
                    INSERT INTO cache_changes (kind, name) SELECT 'object', 'k' FROM n";
        match &meta.backend {
            Backend::Sqlite(pool) => drop(sqlx::query(fill).bind(rows).execute(pool).await.unwrap()),
            Backend::Postgres(pool) => {
                sqlx::query(fill).bind(rows).execute(pool).await.unwrap();
                let age = "UPDATE cache_changes SET created_at = now() - interval '2 hours'";
                sqlx::query(age).execute(pool).await.unwrap();
            }
        }
        let last = feed.last_change().await.unwrap();
        assert_eq!(feed.prune(i64::MAX).await.unwrap(), rows as u64, "every row, over three batches");
        let count = "SELECT count(*) FROM cache_changes";
        let left: i64 = match &meta.backend {
            Backend::Sqlite(pool) => sqlx::query_scalar(count).fetch_one(pool).await.unwrap(),
            Backend::Postgres(pool) => {
                assert_eq!(horizon(pool).await, last, "the horizon is past the whole log");
                sqlx::query_scalar(count).fetch_one(pool).await.unwrap()
            }
        };
        assert_eq!(left, 0);
        assert_eq!(feed.prune(i64::MAX).await.unwrap(), 0, "nothing is left");
    }

    on_both_backends!(a_commit_moves_the_feed_and_logs_what_changed);
    async fn a_commit_moves_the_feed_and_logs_what_changed(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let feed = meta.feed().clone();
        let (before, start) = (feed.current(), feed.last_change().await.unwrap());
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        assert_ne!(feed.current(), before, "the commit was announced");
        let Catchup::Changes(changes) = feed.changes_since(start).await.unwrap() else { panic!("nothing was pruned") };
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(
            (&changes[0].kind, changes[0].bucket_id, changes[0].name.as_str()),
            (&ChangeKind::Bucket, Some(bucket.id), "bkt")
        );
        feed.prune(changes[0].seq).await.unwrap();
        if let Backend::Postgres(pool) = &meta.backend {
            // Other replicas may not have applied a change this young: it stays.
            let kept = feed.changes_since(start).await.unwrap();
            assert_eq!(kept, Catchup::Changes(changes.clone()), "a young change is kept");
            assert_eq!(horizon(pool).await, 0);
            sqlx::query("UPDATE cache_changes SET created_at = now() - interval '2 hours'")
                .execute(pool)
                .await
                .unwrap();
            feed.prune(changes[0].seq).await.unwrap();
            assert_eq!(horizon(pool).await, changes[0].seq, "the horizon moves with what was pruned");
            assert_eq!(feed.last_change().await.unwrap(), changes[0].seq, "an empty log starts past the horizon");
            let missed = Catchup::Missed { resume_at: changes[0].seq };
            assert_eq!(feed.changes_since(start).await.unwrap(), missed, "a reader behind the horizon flushes");
            let at_horizon = feed.changes_since(changes[0].seq).await.unwrap();
            assert_eq!(at_horizon, Catchup::Changes(vec![]), "a reader at the horizon misses nothing");
        } else {
            assert_eq!(feed.changes_since(start).await.unwrap(), Catchup::Changes(vec![]));
        }
    }
}
