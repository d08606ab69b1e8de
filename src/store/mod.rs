//! Durable state: object metadata in SQLite (`metadata`) and object bytes in content-addressed files (`blobs`).
//!
//! **Ordering invariant.** A write goes temp file → fsync → (write lock) rename → row → commit, and a delete goes
//! (write lock) row removed → last reference? blob moved aside → commit → blob unlinked. So a crash at any point
//! leaves either the old object or the new one visible, never a partial one; what it can leave behind is an
//! unreferenced blob or a temp file, which `Store::sweep` removes at start-up.

pub mod blobs;
pub mod generation;
pub mod metadata;

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

pub use blobs::{BlobStore, BlobWriter, StagedBlob};
pub use metadata::{
    Bucket, CacheChange, Metadata, MetadataError, ObjectAttrs, ObjectRecord, ObjectStats, SigningKey, StatsOrder,
    TokenRecord, Upsert,
};

use crate::names::{BucketName, ObjectKey};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no such bucket: {0}")]
    NoSuchBucket(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl From<MetadataError> for StoreError {
    fn from(e: MetadataError) -> Self {
        match e {
            MetadataError::NoSuchBucket(b) => StoreError::NoSuchBucket(b),
            other => StoreError::Other(other.into()),
        }
    }
}

/// What `put` prints and the admin upload answers (the contract's JSON).
#[derive(Debug, Clone, Serialize)]
pub struct PutReport {
    pub bucket: String,
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub sha256: String,
    pub content_type: String,
    /// `created`, `replaced` or `unchanged`.
    pub status: &'static str,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    pub temp_files: usize,
    pub unreferenced_blobs: usize,
}

#[derive(Clone)]
pub struct Store {
    pub meta: Metadata,
    pub blobs: BlobStore,
}

impl Store {
    /// `busy_timeout`: how long a write waits for SQLite's lock held by another connection or process.
    pub async fn open(data_dir: &Path, busy_timeout: Duration) -> anyhow::Result<Self> {
        crate::config::ensure_data_dir(data_dir)?;
        let blobs = BlobStore::open(data_dir)?;
        let generation = std::sync::Arc::new(generation::Generation::open(data_dir)?);
        let meta = Metadata::open(&data_dir.join("blobgate.db"), busy_timeout, generation).await?;
        Ok(Self { meta, blobs })
    }

    /// Makes a staged blob visible as `bucket/key`. Only after the blob is fsynced and renamed and the row is
    /// committed can anyone see the object. A replaced object's blob is removed when nothing else uses it.
    pub async fn put(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        staged: StagedBlob,
        attrs: ObjectAttrs,
    ) -> Result<PutReport, StoreError> {
        let now = unix_now();
        let mut tx = self.meta.begin_write().await?;
        let bucket_row = tx.bucket(bucket).await?.ok_or_else(|| StoreError::NoSuchBucket(bucket.to_string()))?;
        // Under the write lock: no concurrent delete can retire this hash between the rename and the commit.
        let blobs = self.blobs.clone();
        let (staged, installed) = tokio::task::spawn_blocking(move || {
            let r = blobs.install(&staged);
            (staged, r)
        })
        .await
        .context("blob install task failed")?;
        installed?;
        let upsert = tx.upsert_object(bucket_row.id, key, &staged.sha256, staged.size, &attrs, now).await?;
        let retired = match &upsert {
            Upsert::Replaced { previous_sha256 } if *previous_sha256 != staged.sha256 => {
                self.retire_if_unreferenced(&mut tx, previous_sha256).await?
            }
            _ => None,
        };
        finish_commit(tx, retired).await?;
        Ok(PutReport {
            bucket: bucket.to_string(),
            key: key.to_string(),
            size: staged.size,
            etag: crate::http::conditional::etag_from_sha256(&staged.sha256),
            sha256: staged.sha256.clone(),
            content_type: effective_content_type(attrs.content_type.as_deref(), key.as_str()),
            status: match upsert {
                Upsert::Created => "created",
                Upsert::Unchanged => "unchanged",
                Upsert::Replaced { .. } => "replaced",
            },
        })
    }

    /// Deletes `bucket/key`; `Ok(false)` when there was no such object. Removes the blob with its last reference.
    pub async fn delete(&self, bucket: &BucketName, key: &ObjectKey) -> Result<bool, StoreError> {
        let mut tx = self.meta.begin_write().await?;
        let bucket_row = tx.bucket(bucket).await?.ok_or_else(|| StoreError::NoSuchBucket(bucket.to_string()))?;
        let Some(sha) = tx.delete_object(bucket_row.id, key).await? else {
            return Ok(false);
        };
        let retired = self.retire_if_unreferenced(&mut tx, &sha).await?;
        finish_commit(tx, retired).await?;
        Ok(true)
    }

    /// Removes temp leftovers and blobs that no object references (after a crash between rename and commit).
    pub async fn sweep(&self) -> anyhow::Result<SweepReport> {
        let blobs = self.blobs.clone();
        let (temp_files, hashes) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            Ok((blobs.sweep_temp_files()?, blobs.list_hashes()?))
        })
        .await
        .context("sweep task failed")??;
        let mut candidates = Vec::new();
        for sha in hashes {
            if !self.meta.blob_is_referenced(&sha).await? {
                candidates.push(sha);
            }
        }
        let mut unreferenced_blobs = 0;
        if !candidates.is_empty() {
            // Re-check under the write lock: a concurrent put may have just referenced one of them.
            let mut tx = self.meta.begin_write().await?;
            let mut retired = Vec::new();
            for sha in &candidates {
                if let Some(r) = self.retire_if_unreferenced(&mut tx, sha).await? {
                    retired.push(r);
                }
            }
            tx.commit().await?;
            unreferenced_blobs = retired.len();
            retired.into_iter().for_each(blobs::RetiredBlob::discard);
        }
        Ok(SweepReport { temp_files, unreferenced_blobs })
    }

    async fn retire_if_unreferenced(
        &self,
        tx: &mut metadata::WriteTx,
        sha256: &str,
    ) -> anyhow::Result<Option<blobs::RetiredBlob>> {
        if tx.blob_is_referenced(sha256).await? {
            return Ok(None);
        }
        self.blobs.retire(sha256)
    }
}

/// Commits, then deletes the retired blob; if the commit fails the blob goes back so no row loses its bytes.
async fn finish_commit(tx: metadata::WriteTx, retired: Option<blobs::RetiredBlob>) -> Result<(), StoreError> {
    match tx.commit().await {
        Ok(()) => {
            if let Some(r) = retired {
                r.discard();
            }
            Ok(())
        }
        Err(e) => {
            if let Some(r) = retired {
                r.restore().context("cannot restore a retired blob after a failed commit")?;
            }
            Err(e.into())
        }
    }
}

/// The stored type, else a guess from the key's extension, else `application/octet-stream`.
pub fn effective_content_type(stored: Option<&str>, key: &str) -> String {
    if let Some(t) = stored {
        return t.to_owned();
    }
    mime_guess::from_path(key).first_raw().map(str::to_owned).unwrap_or_else(|| "application/octet-stream".to_owned())
}

pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_type_prefers_stored_then_extension() {
        assert_eq!(effective_content_type(Some("text/x-a"), "a.html"), "text/x-a");
        assert_eq!(effective_content_type(None, "dir/a.html"), "text/html");
        assert_eq!(effective_content_type(None, "a.tar.gz"), "application/gzip");
        assert_eq!(effective_content_type(None, "noext"), "application/octet-stream");
    }

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Duration::from_secs(5)).await.unwrap();
        store.meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        (dir, store)
    }

    fn stage(store: &Store, bytes: &[u8]) -> StagedBlob {
        let mut w = store.blobs.writer().unwrap();
        w.write(bytes).unwrap();
        w.finish().unwrap()
    }

    #[tokio::test]
    async fn identical_content_is_stored_once_and_removed_with_its_last_reference() {
        let (_dir, store) = store().await;
        let b = BucketName::parse("bkt").unwrap();
        let (k1, k2) = (ObjectKey::parse("one").unwrap(), ObjectKey::parse("two").unwrap());
        let r1 = store.put(&b, &k1, stage(&store, b"same"), ObjectAttrs::default()).await.unwrap();
        let r2 = store.put(&b, &k2, stage(&store, b"same"), ObjectAttrs::default()).await.unwrap();
        assert_eq!(r1.sha256, r2.sha256);
        assert_eq!(store.blobs.list_hashes().unwrap(), vec![r1.sha256.clone()]);
        assert!(store.delete(&b, &k1).await.unwrap());
        assert!(store.blobs.path_of(&r1.sha256).exists());
        assert!(store.delete(&b, &k2).await.unwrap());
        assert!(!store.blobs.path_of(&r1.sha256).exists());
        assert!(!store.delete(&b, &k2).await.unwrap());
    }

    #[tokio::test]
    async fn reput_is_unchanged_and_replace_drops_the_old_blob() {
        let (_dir, store) = store().await;
        let b = BucketName::parse("bkt").unwrap();
        let k = ObjectKey::parse("k").unwrap();
        let first = store.put(&b, &k, stage(&store, b"v1"), ObjectAttrs::default()).await.unwrap();
        assert_eq!(first.status, "created");
        let again = store.put(&b, &k, stage(&store, b"v1"), ObjectAttrs::default()).await.unwrap();
        assert_eq!(again.status, "unchanged");
        let second = store.put(&b, &k, stage(&store, b"v2"), ObjectAttrs::default()).await.unwrap();
        assert_eq!(second.status, "replaced");
        assert_eq!(store.blobs.list_hashes().unwrap(), vec![second.sha256]);
    }

    #[tokio::test]
    async fn unknown_bucket_leaves_nothing_behind() {
        let (dir, store) = store().await;
        let err = store
            .put(
                &BucketName::parse("nope").unwrap(),
                &ObjectKey::parse("k").unwrap(),
                stage(&store, b"x"),
                ObjectAttrs::default(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::NoSuchBucket(_)));
        assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
        assert!(store.blobs.list_hashes().unwrap().is_empty());
    }

    #[tokio::test]
    async fn sweep_removes_blobs_installed_without_a_row() {
        let (_dir, store) = store().await;
        let staged = stage(&store, b"orphan");
        store.blobs.install(&staged).unwrap();
        let report = store.sweep().await.unwrap();
        assert_eq!(report.unreferenced_blobs, 1);
        assert!(store.blobs.list_hashes().unwrap().is_empty());
    }
}
