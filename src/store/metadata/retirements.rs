//! `store_blob_retirements`: object-store blobs whose last reference went, and the sweep's decisions to delete
//! them (the protocol is in `store/mod.rs`). Every write here runs under the blob-reference lock.

use super::{Metadata, MetadataError, WriteTx};

/// A store blob's retirement row: unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retirement {
    /// When its last reference went (or a sweep first found it unreferenced).
    pub retired_at: i64,
    /// When a sweep last decided to delete it.
    pub deleting_at: Option<i64>,
    /// When that delete was over: came back from the store, failed, or was given up unsent.
    pub deleted_at: Option<i64>,
}

const SELECT_RETIREMENT: &str =
    "SELECT retired_at, deleting_at, deleted_at FROM store_blob_retirements WHERE sha256 = $1";

impl From<(i64, Option<i64>, Option<i64>)> for Retirement {
    fn from((retired_at, deleting_at, deleted_at): (i64, Option<i64>, Option<i64>)) -> Self {
        Self { retired_at, deleting_at, deleted_at }
    }
}

impl Metadata {
    /// The blob's retirement row, read outside any transaction (a put reads it before its upload).
    pub async fn store_blob_retirement(&self, sha256: &str) -> Result<Option<Retirement>, MetadataError> {
        let row: Option<(i64, Option<i64>, Option<i64>)> = with_pool!(&self.backend, pool => {
            sqlx::query_as(SELECT_RETIREMENT).bind(sha256).fetch_optional(pool).await?
        });
        Ok(row.map(Retirement::from))
    }
}

impl WriteTx {
    /// The blob's last reference went at `now`: it waits out the grace period from now. A pending delete
    /// decision stays, as the tombstone the puts check.
    pub async fn retire_store_blob(&mut self, sha256: &str, now: i64) -> Result<(), MetadataError> {
        with_tx!(&mut self.tx, tx => sqlx::query(
            "INSERT INTO store_blob_retirements (sha256, retired_at) VALUES ($1, $2)
             ON CONFLICT (sha256) DO UPDATE SET retired_at = excluded.retired_at",
        )
        .bind(sha256)
        .bind(now)
        .execute(&mut **tx)
        .await
        .map(drop)?);
        Ok(())
    }

    pub async fn store_blob_retirement(&mut self, sha256: &str) -> Result<Option<Retirement>, MetadataError> {
        let row: Option<(i64, Option<i64>, Option<i64>)> = with_tx!(&mut self.tx, tx => {
            sqlx::query_as(SELECT_RETIREMENT).bind(sha256).fetch_optional(&mut **tx).await?
        });
        Ok(row.map(Retirement::from))
    }

    /// Records a sweep's decision, at `now`, to delete the blob (a blob no write retired, such as a crashed put's
    /// upload, gets its row here).
    pub async fn mark_store_blob_deleting(&mut self, sha256: &str, now: i64) -> Result<(), MetadataError> {
        with_tx!(&mut self.tx, tx => sqlx::query(
            "INSERT INTO store_blob_retirements (sha256, retired_at, deleting_at) VALUES ($1, $2, $2)
             ON CONFLICT (sha256) DO UPDATE SET deleting_at = excluded.deleting_at, deleted_at = NULL",
        )
        .bind(sha256)
        .bind(now)
        .execute(&mut **tx)
        .await
        .map(drop)?);
        Ok(())
    }

    /// The delete decided at `deleting_at` is over at `now` (unless a later decision replaced it).
    pub async fn mark_store_blob_deleted(
        &mut self,
        sha256: &str,
        deleting_at: i64,
        now: i64,
    ) -> Result<(), MetadataError> {
        with_tx!(&mut self.tx, tx => sqlx::query(
            "UPDATE store_blob_retirements SET deleted_at = $3 WHERE sha256 = $1 AND deleting_at = $2",
        )
        .bind(sha256)
        .bind(deleting_at)
        .bind(now)
        .execute(&mut **tx)
        .await
        .map(drop)?);
        Ok(())
    }

    /// A put referenced the blob again before any delete was decided: it no longer waits to be deleted.
    pub async fn unretire_store_blob(&mut self, sha256: &str) -> Result<(), MetadataError> {
        with_tx!(&mut self.tx, tx => sqlx::query(
            "DELETE FROM store_blob_retirements WHERE sha256 = $1 AND deleting_at IS NULL",
        )
        .bind(sha256)
        .execute(&mut **tx)
        .await
        .map(drop)?);
        Ok(())
    }

    /// Drops the tombstones of deletes decided before `before`, but for blobs retired again since, at most a batch
    /// of them (the rest go with the next call); returns how many.
    pub async fn prune_store_blob_retirements(&mut self, before: i64) -> Result<u64, MetadataError> {
        let done = with_tx!(&mut self.tx, tx => sqlx::query(
            "DELETE FROM store_blob_retirements WHERE sha256 IN (SELECT sha256 FROM store_blob_retirements
                 WHERE deleting_at < $1 AND retired_at <= deleting_at LIMIT $2)",
        )
        .bind(before)
        .bind(super::PRUNE_ON_WRITE)
        .execute(&mut **tx)
        .await?
        .rows_affected());
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::metadata::{TestBackend, pool::tests::database};

    on_both_backends!(a_decision_outlives_a_new_retirement_and_is_pruned_only_once_old);
    async fn a_decision_outlives_a_new_retirement_and_is_pruned_only_once_old(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let row = |retired_at, deleting_at, deleted_at| Some(Retirement { retired_at, deleting_at, deleted_at });
        let mut tx = meta.lock_blob_refs().await.unwrap();
        tx.retire_store_blob(&a, 100).await.unwrap();
        tx.retire_store_blob(&b, 100).await.unwrap();
        tx.unretire_store_blob(&b).await.unwrap();
        tx.mark_store_blob_deleting(&a, 200).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(meta.store_blob_retirement(&a).await.unwrap(), row(100, Some(200), None));
        assert_eq!(meta.store_blob_retirement(&b).await.unwrap(), None, "a put took it back before any decision");

        let mut tx = meta.lock_blob_refs().await.unwrap();
        tx.mark_store_blob_deleted(&a, 199, 201).await.unwrap();
        assert_eq!(tx.store_blob_retirement(&a).await.unwrap(), row(100, Some(200), None), "another decision's");
        tx.mark_store_blob_deleted(&a, 200, 201).await.unwrap();
        // Retired again (a put referenced it, a delete dropped it): the decision stays, the tombstone puts check.
        tx.retire_store_blob(&a, 300).await.unwrap();
        tx.unretire_store_blob(&a).await.unwrap();
        assert_eq!(tx.store_blob_retirement(&a).await.unwrap(), row(300, Some(200), Some(201)));
        assert_eq!(tx.prune_store_blob_retirements(1000).await.unwrap(), 0, "retired since its decision: kept");
        tx.mark_store_blob_deleting(&a, 400).await.unwrap();
        assert_eq!(tx.store_blob_retirement(&a).await.unwrap(), row(300, Some(400), None), "a new decision");
        assert_eq!(tx.prune_store_blob_retirements(400).await.unwrap(), 0, "not yet old");
        assert_eq!(tx.prune_store_blob_retirements(401).await.unwrap(), 1);
        tx.mark_store_blob_deleting(&b, 500).await.unwrap();
        assert_eq!(tx.store_blob_retirement(&b).await.unwrap(), row(500, Some(500), None), "never retired: a leftover");
        tx.commit().await.unwrap();
        assert_eq!(meta.store_blob_retirement(&a).await.unwrap(), None);
    }

    on_both_backends!(a_prune_drops_at_most_a_batch_of_tombstones_per_write);
    async fn a_prune_drops_at_most_a_batch_of_tombstones_per_write(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let old = super::super::PRUNE_ON_WRITE as u64 + 7;
        let mut tx = meta.lock_blob_refs().await.unwrap();
        for i in 0..old {
            let sha = format!("{i:064x}");
            tx.retire_store_blob(&sha, 100).await.unwrap();
            tx.mark_store_blob_deleting(&sha, 200).await.unwrap();
        }
        assert_eq!(tx.prune_store_blob_retirements(300).await.unwrap(), super::super::PRUNE_ON_WRITE as u64);
        assert_eq!(tx.prune_store_blob_retirements(300).await.unwrap(), 7, "the rest with the next write");
        assert_eq!(tx.prune_store_blob_retirements(300).await.unwrap(), 0);
        tx.commit().await.unwrap();
    }
}
