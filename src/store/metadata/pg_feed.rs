//! The change feed on PostgreSQL: how a replica learns, within a second, what other replicas and CLIs changed.
//!
//! Triggers (migrations/postgres) append every change to a cached table to `cache_changes` in the changing
//! transaction, with `seq` assigned in commit order (under an advisory lock, so a reader that has seen `seq` has
//! seen every smaller one), and `pg_notify('blobgate_changes', seq)` fires at commit. Each `serve` process runs
//! one [`watch`]:
//! - a `PgListener` on a connection of its own (a one-connection pool beside the request pool; it must reach
//!   PostgreSQL directly or through a session-mode pooler, since LISTEN lives in a session) says "look" on every
//!   notification. The payload is only a hint and is not read: the catalog reads the log from its own position.
//! - a lost connection (`try_recv` → `None`, or an error) is reconnected with backoff; once listening again it
//!   says "look", so the catalog catches up from the last id it applied.
//! - a poll of the log's head every [`POLL`] says "look" when the head moved: the safety net for a lost
//!   notification or a listener that has not noticed its connection died. When the head stays ahead of every
//!   notification for two polls in a row, the listener is taken for dead (a peer that vanished without a reset
//!   leaves `try_recv` waiting for hours) and reconnects.
//!
//! The log is pruned by age ([`PG_CHANGE_RETENTION`](super::changes::PG_CHANGE_RETENTION)), not by what one
//! replica applied, since replicas may lag; the horizon row (`cache_changes_horizon.pruned_through`) says how far,
//! and a replica whose position is behind it forgets everything it caches ([`Catchup::Missed`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::Notify;

use super::MetadataError;
use super::changes::{CacheChange, Catchup, ChangeFeed, ChangeRow};

/// The channel the triggers notify at commit.
const CHANNEL: &str = "blobgate_changes";

/// How often the log's head is read when no notification came. Four reads a second of one index entry per replica;
/// a change whose notification was lost is still seen well within 1 s.
pub(super) const POLL: Duration = Duration::from_millis(250);

/// A read of the head, or a connection attempt, that takes longer than this is given up and retried.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Reconnect backoff: doubling from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// Runs for as long as it is polled: tells `feed`'s subscribers to look whenever the log may have moved.
pub(super) async fn watch(feed: &ChangeFeed, pool: &PgPool) {
    let liveness = Liveness::default();
    tokio::join!(listen(feed, pool, &liveness), poll_head(feed, &liveness));
}

/// What the poll knows of the listener: the newest seq a notification named (a hint, used for nothing but this),
/// and a way to make it reconnect (`notify_waiters`: a request made while it is not listening is moot).
#[derive(Default)]
struct Liveness {
    notified: AtomicI64,
    reconnect: Notify,
}

async fn listen(feed: &ChangeFeed, pool: &PgPool, liveness: &Liveness) {
    let mut backoff = BACKOFF.0;
    let mut failures = 0u32;
    loop {
        let mut listener = match tokio::time::timeout(ATTEMPT_TIMEOUT, subscribe(pool)).await {
            Ok(Ok(listener)) => listener,
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                };
                failures += 1;
                if failures == 1 {
                    tracing::warn!(%error, "cannot listen for changes; retrying (the head is polled meanwhile)");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF.1);
                continue;
            }
        };
        if failures > 0 {
            tracing::info!(attempts = failures, "listening for changes again");
        }
        (failures, backoff) = (0, BACKOFF.0);
        // Registered before the catch-up look, so a request the poll makes from here on is not missed.
        let reconnect = liveness.reconnect.notified();
        tokio::pin!(reconnect);
        // Listening from here on: whatever committed before is in the log, so catch up from the last applied id.
        feed.look();
        loop {
            let received = tokio::select! {
                received = listener.try_recv() => received,
                () = &mut reconnect => {
                    tracing::warn!("the change listener heard nothing of changes the head poll found; reconnecting");
                    break;
                }
            };
            match received {
                // The payload names a seq, but notifications can be lost or coalesced: only "look" is trusted.
                Ok(Some(notification)) => {
                    if let Ok(seq) = notification.payload().parse::<i64>() {
                        liveness.notified.fetch_max(seq, Ordering::AcqRel);
                    }
                    feed.look();
                }
                Ok(None) => {
                    tracing::warn!("the change listener lost its connection; reconnecting");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the change listener failed; reconnecting");
                    break;
                }
            }
        }
        // Notifications sent while reconnecting are lost; the catch-up after `subscribe` covers them.
        drop(listener);
    }
}

/// A listener on a connection of its own: a new one-connection pool beside the request pool, so the LISTEN session
/// is never a request-pool connection (which another task could be handed, or the pool recycle), a busy request
/// pool never delays reconnecting, and a dead connection's clean-up (sqlx sends `UNLISTEN *` on drop, which can
/// hang on a vanished peer) never holds the next listener's slot.
async fn subscribe(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let dedicated = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(ATTEMPT_TIMEOUT)
        .connect_lazy_with((*pool.connect_options()).clone());
    let mut listener = PgListener::connect_with(&dedicated).await?;
    // A lost connection comes back as `None` at once, so that reconnecting and catching up happen here, in one
    // place, and never silently inside sqlx.
    listener.eager_reconnect(false);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// The safety net: reads the log's head every [`POLL`] and says "look" when it moved. A head that no
/// notification has named for two polls in a row means the listener is not hearing them: it reconnects.
async fn poll_head(feed: &ChangeFeed, liveness: &Liveness) {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = None;
    let mut unheard = None;
    loop {
        tick.tick().await;
        let head = match tokio::time::timeout(ATTEMPT_TIMEOUT, feed.last_change()).await {
            Ok(Ok(head)) => head,
            // The listener reports outages; the next tick retries.
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot read the change log's head");
                continue;
            }
            Err(_) => {
                tracing::debug!("reading the change log's head timed out");
                continue;
            }
        };
        if seen != Some(head) {
            // The first poll has no notification to compare with.
            if seen.is_none() {
                liveness.notified.fetch_max(head, Ordering::AcqRel);
            }
            seen = Some(head);
            feed.look();
        }
        let notified = liveness.notified.load(Ordering::Acquire);
        unheard = match unheard {
            // Still unheard a poll later: the notification is not merely in flight. (Only a listener that is
            // listening is told; one that is reconnecting catches up anyway.)
            Some(earlier) if notified < earlier => {
                liveness.reconnect.notify_waiters();
                liveness.notified.fetch_max(head, Ordering::AcqRel);
                None
            }
            _ if notified >= head => None,
            _ => Some(head),
        };
    }
}

/// Changes after `seq`, or [`Catchup::Missed`] when the log was pruned past `seq`.
pub(super) async fn changes_since(pool: &PgPool, seq: i64) -> Result<Catchup, MetadataError> {
    // The rows first, then the horizon, in two snapshots: a prune that commits between them makes the horizon
    // look newer than the rows (a needless flush), never older (a silent miss).
    let rows: Vec<ChangeRow> =
        sqlx::query_as("SELECT seq, kind, bucket_id, name FROM cache_changes WHERE seq > $1 ORDER BY seq")
            .bind(seq)
            .fetch_all(pool)
            .await?;
    let pruned_through = horizon(pool).await?;
    if pruned_through > seq {
        let newest = rows.last().map_or(pruned_through, |r| r.seq.max(pruned_through));
        return Ok(Catchup::Missed { resume_at: newest });
    }
    Ok(Catchup::Changes(rows.into_iter().map(CacheChange::from).collect()))
}

async fn horizon(pool: &PgPool) -> Result<i64, MetadataError> {
    let pruned: Option<i64> = sqlx::query_scalar("SELECT pruned_through FROM cache_changes_horizon WHERE id = 1")
        .fetch_optional(pool)
        .await?;
    Ok(pruned.unwrap_or(0))
}

/// Drops changes older than `retention` and moves the horizon past them, `batch` rows per statement, each
/// deleting a prefix of the log and raising the horizon to its end together, so a reader sees both or neither.
/// Safe with any number of replicas pruning at once: `seq` follows commit order, so every row up to the newest
/// old one is committed, and the horizon only ever grows (`greatest`). Rows are cut at a `seq`, not by
/// `created_at` alone: a long transaction's row can be older than a row with a smaller `seq`, and the horizon must
/// name a prefix of the log. Returns the rows deleted.
pub(super) async fn prune(pool: &PgPool, retention: Duration, batch: i64) -> Result<u64, MetadataError> {
    let cutoff: Option<i64> =
        sqlx::query_scalar("SELECT max(seq) FROM cache_changes WHERE created_at < now() - make_interval(secs => $1)")
            .bind(retention.as_secs_f64())
            .fetch_one(pool)
            .await?;
    let Some(cutoff) = cutoff else { return Ok(0) };
    let mut deleted = 0;
    loop {
        let (rows, through): (i64, Option<i64>) = sqlx::query_as(
            "WITH gone AS ( \
                 DELETE FROM cache_changes WHERE seq IN \
                     (SELECT seq FROM cache_changes WHERE seq <= $1 ORDER BY seq LIMIT $2) \
                 RETURNING seq \
             ), moved AS ( \
                 UPDATE cache_changes_horizon \
                 SET pruned_through = greatest(pruned_through, (SELECT max(seq) FROM gone)) \
                 WHERE id = 1 AND EXISTS (SELECT 1 FROM gone) \
             ) \
             SELECT count(*), max(seq) FROM gone",
        )
        .bind(cutoff)
        .bind(batch)
        .fetch_one(pool)
        .await?;
        deleted += rows as u64;
        if rows < batch || through.is_none() {
            // The last batch: the horizon reaches the cutoff even when its rows were gone already.
            sqlx::query("UPDATE cache_changes_horizon SET pruned_through = greatest(pruned_through, $1) WHERE id = 1")
                .bind(cutoff)
                .execute(pool)
                .await?;
            return Ok(deleted);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::config::DatabaseUrl;
    use crate::names::BucketName;
    use crate::store::metadata::Metadata;
    use crate::store::metadata::pool::tests::fresh_postgres_database;

    /// Two opens of one new database: a replica that runs the watcher, and another process that writes.
    async fn replica_and_writer() -> (tempfile::TempDir, Metadata, Metadata) {
        let dir = tempfile::tempdir().unwrap();
        let url = DatabaseUrl::parse(&fresh_postgres_database().await).unwrap();
        let replica = Metadata::open(&url, dir.path(), Duration::from_secs(5)).await.unwrap();
        let writer = Metadata::open(&url, dir.path(), Duration::from_secs(5)).await.unwrap();
        (dir, replica, writer)
    }

    fn pool(meta: &Metadata) -> &PgPool {
        match &meta.backend {
            super::super::Backend::Postgres(pool) => pool,
            _ => unreachable!("a PostgreSQL test"),
        }
    }

    /// Waits (at most `within`) for the next "look", and takes it.
    async fn next_look(looks: &mut tokio::sync::watch::Receiver<u64>, within: Duration) {
        tokio::time::timeout(within, looks.changed())
            .await
            .unwrap_or_else(|_| panic!("no look within {within:?}"))
            .unwrap();
    }

    /// Runs one half of the watcher alone, so that every look it gives is that half's.
    fn spawn_listen(replica: &Metadata) -> tokio::task::JoinHandle<()> {
        let (feed, pool) = (replica.feed().clone(), pool(replica).clone());
        tokio::spawn(async move { listen(&feed, &pool, &Liveness::default()).await })
    }

    fn spawn_poll(replica: &Metadata) -> tokio::task::JoinHandle<()> {
        let feed = replica.feed().clone();
        tokio::spawn(async move { poll_head(&feed, &Liveness::default()).await })
    }

    async fn listener_pids(meta: &Metadata) -> Vec<i32> {
        sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'",
        )
        .fetch_all(pool(meta))
        .await
        .unwrap()
    }

    /// Waits until `n` more reads of the log's head have started, as the database saw them (the newest
    /// `query_start` of the head query, across sessions, moved `n` times; the 30 s deadline bounds a hang only).
    /// The poll reads one at a time, so once read `k + 1` has started, read `k`'s verdict is in.
    async fn head_reads(meta: &Metadata, n: usize) {
        let newest = || async {
            let started: Option<f64> = sqlx::query_scalar(
                "SELECT extract(epoch FROM max(query_start))::float8 FROM pg_stat_activity \
                 WHERE datname = current_database() AND query LIKE $1",
            )
            .bind("SELECT greatest(coalesce(max(seq), 0)%")
            .fetch_one(pool(meta))
            .await
            .unwrap();
            started
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let (mut last, mut seen) = (newest().await, 0);
        while seen < n {
            assert!(Instant::now() < deadline, "{seen} of {n} head reads within 30 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = newest().await;
            if now != last {
                (last, seen) = (now, seen + 1);
            }
        }
    }

    /// Waits until exactly one LISTEN session other than `not` exists; returns it.
    async fn listening(meta: &Metadata, not: &[i32]) -> Vec<i32> {
        // Bounds a hang only: a reconnect under load may take a while.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let pids = listener_pids(meta).await;
            if pids.len() == 1 && pids != not {
                return pids;
            }
            assert!(Instant::now() < deadline, "no new LISTEN session: {pids:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn another_process_commit_is_notified_as_a_look_and_not_a_bump() {
        let (_dir, replica, writer) = replica_and_writer().await;
        let feed = replica.feed().clone();
        let mut looks = feed.subscribe();
        let listener = spawn_listen(&replica);
        // Its first look says it is listening.
        next_look(&mut looks, Duration::from_secs(30)).await;
        let counter = feed.current();
        writer.create_bucket(&BucketName::parse("elsewhere").unwrap(), false, 0).await.unwrap();
        next_look(&mut looks, Duration::from_secs(30)).await;
        assert_eq!(feed.current(), counter, "another process's commit does not move this process's counter");
        replica.create_bucket(&BucketName::parse("here").unwrap(), false, 0).await.unwrap();
        assert_ne!(feed.current(), counter, "this process's own commit does");
        listener.abort();
    }

    #[tokio::test]
    async fn a_change_without_a_notification_is_found_by_the_head_poll() {
        let (_dir, replica, writer) = replica_and_writer().await;
        let mut looks = replica.feed().subscribe();
        let poller = spawn_poll(&replica);
        // The first poll looks (it has seen no head yet); later ones only when the head moves: three more reads
        // start, so at least two of them have read the unmoved head and given their verdict.
        next_look(&mut looks, Duration::from_secs(30)).await;
        head_reads(&writer, 3).await;
        assert!(!looks.has_changed().unwrap(), "an unmoved head is no reason to look");
        // Logged behind the triggers' back: no NOTIFY, as if the notification were lost.
        sqlx::query("INSERT INTO cache_changes (kind, name) VALUES ('token', 'abc')")
            .execute(pool(&writer))
            .await
            .unwrap();
        next_look(&mut looks, Duration::from_secs(30)).await;
        poller.abort();
    }

    #[tokio::test]
    async fn a_lost_listener_connection_reconnects_and_catches_up() {
        let (_dir, replica, writer) = replica_and_writer().await;
        let mut looks = replica.feed().subscribe();
        let listener = spawn_listen(&replica);
        next_look(&mut looks, Duration::from_secs(30)).await;
        let before = listening(&writer, &[]).await;
        sqlx::query("SELECT pg_terminate_backend($1)").bind(before[0]).execute(pool(&writer)).await.unwrap();
        // Nothing was committed: this look is the catch-up of a listener that is listening again.
        next_look(&mut looks, Duration::from_secs(30)).await;
        let after = listening(&writer, &before).await;
        writer.create_bucket(&BucketName::parse("after").unwrap(), false, 0).await.unwrap();
        next_look(&mut looks, Duration::from_secs(30)).await;
        assert_eq!(listener_pids(&writer).await, after, "the same session got the notification");
        listener.abort();
    }

    #[tokio::test]
    async fn a_listener_that_hears_nothing_of_what_the_poll_finds_reconnects() {
        let (_dir, replica, writer) = replica_and_writer().await;
        let watcher = tokio::spawn({
            let feed = replica.feed().clone();
            async move { feed.watch().await }
        });
        let before = listening(&writer, &[]).await;
        // Notified changes keep it: its notifications match the head.
        for name in ["one", "two"] {
            writer.create_bucket(&BucketName::parse(name).unwrap(), false, 0).await.unwrap();
        }
        // Four reads of the head start after those commits: at least three compared it with what was heard.
        head_reads(&writer, 4).await;
        assert_eq!(listener_pids(&writer).await, before, "a listener that hears the changes stays");
        // A change it cannot hear of (logged without NOTIFY) stands for a connection that died silently.
        sqlx::query("INSERT INTO cache_changes (kind, name) VALUES ('token', 'abc')")
            .execute(pool(&writer))
            .await
            .unwrap();
        listening(&writer, &before).await;
        watcher.abort();
    }

    #[tokio::test]
    async fn pruning_keeps_young_changes_and_moves_the_horizon_past_old_ones() {
        let (_dir, replica, writer) = replica_and_writer().await;
        let feed = replica.feed().clone();
        let start = feed.last_change().await.unwrap();
        for name in ["one", "two", "three"] {
            writer.create_bucket(&BucketName::parse(name).unwrap(), false, 0).await.unwrap();
        }
        let Catchup::Changes(all) = feed.changes_since(start).await.unwrap() else { panic!("nothing pruned yet") };
        assert_eq!(all.len(), 3);
        // The first two are old; the second's row looks younger than the third's (a long transaction): the cut is
        // at the newest old seq, so the log stays a suffix and the horizon names a prefix.
        sqlx::query("UPDATE cache_changes SET created_at = now() - interval '3 hours' WHERE seq = $1")
            .bind(all[0].seq)
            .execute(pool(&writer))
            .await
            .unwrap();
        sqlx::query("UPDATE cache_changes SET created_at = now() - interval '2 hours' WHERE seq = $1")
            .bind(all[1].seq)
            .execute(pool(&writer))
            .await
            .unwrap();
        // Two replicas pruning at once.
        let (a, b) = tokio::join!(feed.prune(0), writer.feed().prune(0));
        a.unwrap();
        b.unwrap();
        assert_eq!(horizon(pool(&writer)).await.unwrap(), all[1].seq);
        assert_eq!(feed.changes_since(all[1].seq).await.unwrap(), Catchup::Changes(vec![all[2].clone()]));
        assert_eq!(
            feed.changes_since(all[0].seq).await.unwrap(),
            Catchup::Missed { resume_at: all[2].seq },
            "a reader behind the horizon is told to flush, and resumes after what it read"
        );
        feed.prune(0).await.unwrap();
        assert_eq!(horizon(pool(&writer)).await.unwrap(), all[1].seq, "the young change stays");
    }
}
