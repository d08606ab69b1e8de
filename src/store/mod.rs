//! Durable state: object metadata in the metadata database (`metadata`) and object bytes in content-addressed
//! files: the data dir's (`blobs`), or an S3-compatible object store's (`remote`) with the data dir as its cache
//! (`blob_cache`). [`Store`] puts, deletes, deletes buckets and sweeps; its conditional writes ([`Store::put_if`],
//! [`Store::delete_if`]) are decided in the committing transaction, under the write lock.
//!
//! **Ordering invariant.** A write goes temp file → fsync → (write lock) rename → row → commit, and a delete goes
//! (write lock) row removed → last reference? blob moved aside → commit → blob unlinked. The write lock is
//! `Metadata::lock_blob_refs`: while it is held, no one else adds or drops a blob reference. So a crash at any point
//! leaves either the old object or the new one visible, never a partial one; what it can leave behind is an
//! unreferenced blob or a temp file, which `Store::sweep` removes at start-up, or a retired blob whose delete
//! never committed, which the sweep puts back (its row still references it). The data dir may be shared by live
//! peers (other replicas, on this host or others), so the sweep removes only what no live process is doing
//! (`store::staging`, `timeouts.sweep_grace`; ARCHITECTURE.md, "Shared blob directory"). S3 multipart uploads
//! (`multipart`) follow the same ordering, and Complete commits its object through the same steps as a put.
//!
//! **An object store is never called under the lock**, where one slow call would stall every writer
//! (ARCHITECTURE.md, "The blob-store seam"). A write uploads its blobs before it. A blob whose last reference
//! goes gets a row in `store_blob_retirements` in that commit and stays in the store for g =
//! `timeouts.sweep_grace`, so downloads already reading it finish on every replica. Then the deleting process's
//! delayed task, or any replica's sweep, records under the lock its decision to delete (`deleting_at`) if no row
//! references the blob, sends the delete after the commit, and records that it came back. A put of the same
//! content reads the row before its upload (waiting out a delete in flight) and again under the lock, and commits
//! only if no delete can land after the upload (`store_deletes::may_commit`), else rolls back and uploads again.
//! Why no row ever names a deleted blob:
//! - a decision needs no reference under the lock: a put committed first stops it, one committing later sees it;
//! - a delete is sent within g/4 of its decision and over within g/2 (the store client's timeouts are far
//!   shorter); a put whose first read found it over uploaded after it landed;
//! - a decision's row is kept g after it, and a put takes at most g/2 from its first read to its commit (else it
//!   starts again): a put that finds no decision read after every pruned one had landed;
//! - a part's store object is named for its one upload, whose row commits within g/2; the sweep takes only parts
//!   g old that no row names under the lock, which none can name later.
//!
//! These compare unix seconds of different hosts: g must be many times their skew (the default hour is).

pub mod blob_cache;
pub mod blobs;
pub mod manifest;
pub mod metadata;
pub mod multipart;
pub mod precompress;
pub mod remote;
pub mod sealing;
pub mod secrets_key;
pub mod server_copy;
pub mod staging;
mod store_deletes;

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

pub use blob_cache::{BlobCache, CacheError};
pub use blobs::{BlobStore, BlobWriter, StagedBlob};
pub use metadata::{
    Bucket, BucketChanges, CacheChange, Catchup, ChangeFeed, ChangeKind, DatabaseHealth, Flushed, Grant, GrantedBucket,
    Metadata, MetadataError, MigrationEntry, MigrationState, MigrationStatus, ObjectRecord, ObjectStats, PartRecord,
    Rights, S3KeyRecord, Scope, SigningKey, StatsFlush, StatsOrder, TokenRecord, UploadRecord, UploadSummary, Upsert,
    VariantRecord, WriteTx, part_region,
};
pub use multipart::{CompleteReport, Completion, MultipartError, UploadLimits};

use crate::config::{DatabaseTimeouts, DatabaseUrl};
use crate::header_values::content_coding::ContentCoding;
use crate::names::{BucketName, ObjectAttrs, ObjectKey, Tags};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no such bucket: {0}")]
    NoSuchBucket(String),
    /// A conditional write's [`WriteCondition`] did not hold for the object it would replace.
    #[error("the object does not meet the write's precondition")]
    PreconditionFailed,
    /// `WriteCondition::IfMatch` on a key with no object.
    #[error("no such object")]
    NoSuchKey,
    /// The object store that blobs live in did not take or confirm a blob: nothing was committed.
    #[error(transparent)]
    BlobStoreUnavailable(#[from] remote::RemoteError),
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

/// A precondition on the object a write would replace (S3 conditional writes: `If-None-Match: *`, `If-Match`),
/// checked under the write lock, so of two writers racing for one key exactly one sees it hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WriteCondition {
    #[default]
    Always,
    /// No object may exist under the key.
    IfAbsent,
    /// The current object must have this ETag (quoted): its content ETag (native) or its S3 ETag, which never
    /// look alike; `*` matches any current object.
    IfMatch(String),
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
    pub status: PutStatus,
    /// The codings of the precompressed variants stored with it (`br`, `gzip`), if any.
    pub variants: Vec<&'static str>,
}

/// What a put did to the object, serialized as `created`, `replaced` or `unchanged`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PutStatus {
    Created,
    Replaced,
    Unchanged,
}

impl From<&Upsert> for PutStatus {
    fn from(upsert: &Upsert) -> Self {
        match upsert {
            Upsert::Created => PutStatus::Created,
            Upsert::Unchanged => PutStatus::Unchanged,
            Upsert::Replaced { .. } => PutStatus::Replaced,
        }
    }
}

/// A precompressed variant ready to be stored with its object: the same content in `coding`, staged as a blob.
#[derive(Debug)]
pub struct StagedVariant {
    pub coding: ContentCoding,
    pub blob: StagedBlob,
}

/// What `Store::delete_bucket` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketDeletion {
    /// The bucket is gone, with this many objects and tokens, and this many unfinished multipart uploads.
    Deleted { objects: u64, tokens: u64, uploads: u64 },
    /// Refused without `force`: the bucket still holds this many objects.
    NotEmpty { objects: u64 },
}

/// Objects removed per write transaction by a forced bucket delete: bounds how long the write lock is held and how
/// many retired blobs wait for one commit.
const DELETE_BATCH: u32 = 500;

/// Blobs (or part files) a sweep checks per query: bounds the hashes in memory and a query's cost, however many
/// blobs the data dir holds.
const SWEEP_BATCH: usize = 500;

/// Unreferenced blobs retired (or decided for deletion from an object store) per write transaction: a rename or a
/// few statements each under the lock, so a hold stays within a few milliseconds (2–9 ms for 100 renames on a busy
/// 2-core machine).
const RETIRE_BATCH: usize = 100;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    pub temp_files: usize,
    pub unreferenced_blobs: usize,
    /// Blobs put back from `tmp/`: a delete retired them and then died before its commit.
    pub restored_blobs: usize,
    /// Multipart part files that no upload names (a crash mid-part, or after a Complete or Abort committed).
    pub part_files: usize,
}

pub use crate::config::{PRIVATE_DIR_MODE, PRIVATE_FILE_MODE};

/// The data dir's permission bits when group or others have any access to it (a dir created before the `0700`
/// rule, or by hand): that dir is what keeps other local users from the keys and blobs inside it.
pub fn loose_data_dir_mode(data_dir: &Path) -> std::io::Result<Option<u32>> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data_dir)?.permissions().mode() & 0o777;
    Ok((mode & 0o077 != 0).then_some(mode))
}

#[derive(Clone)]
pub struct Store {
    pub meta: Metadata,
    /// The data dir's blob files, staging and parts (with an object store: staging and parts only).
    pub blobs: BlobStore,
    /// With an object store: the cache of its blobs in the data dir, which holds the store's client.
    pub cache: Option<BlobCache>,
    /// Blobs whose last reference a write dropped, to delete from the object store once `grace` has passed and
    /// a check under the blob-reference lock confirms it (`schedule_store_deletes`).
    retired_in_store: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Those blobs, each with when it is due, worked through by one task.
    delete_queue: std::sync::Arc<std::sync::Mutex<DeleteQueue>>,
    /// `timeouts.sweep_grace`: how long a store blob outlives its last reference, among other bounds
    /// (`store_deletes`).
    grace: Duration,
}

/// Store blobs to delete once due, in the order they were retired (so in due order), and whether a task is
/// working through them: one task for them all, however many writes retire blobs.
#[derive(Default)]
struct DeleteQueue {
    due: std::collections::VecDeque<(tokio::time::Instant, String)>,
    worker: bool,
}

/// What a write made sure of before the lock: each blob's retirement row as read at `checked_at`, then each blob in
/// the object store.
pub struct StoredBlobs {
    checked_at: i64,
    rows: Vec<Option<metadata::Retirement>>,
}

/// How many times a write uploads and re-checks its blobs before it gives up (each retry follows a sweep's
/// delete of the same content that raced it).
const STORE_ATTEMPTS: u32 = 3;

impl Store {
    /// `timeouts`: how long a write waits for the database's lock held by another connection or process (a
    /// `Duration` alone), and for a connection (`DatabaseTimeouts::acquire`).
    pub async fn open(
        data_dir: &Path,
        database: &DatabaseUrl,
        timeouts: impl Into<DatabaseTimeouts>,
    ) -> anyhow::Result<Self> {
        let timeouts = timeouts.into();
        crate::config::ensure_data_dir(data_dir)?;
        let blobs = BlobStore::open(data_dir)?;
        let meta = Metadata::open(database, data_dir, timeouts).await?;
        let secrets_key = secrets_key::load_or_create(data_dir, &meta).await?;
        let meta = meta.with_secrets_key(secrets_key);
        let sealed = meta.seal_signing_keys().await.context("cannot seal the signing keys")?;
        if sealed > 0 {
            tracing::info!(sealed, "sealed signing-key secrets that were stored in the clear");
        }
        Ok(Self::with_parts(meta, blobs))
    }

    fn with_parts(meta: Metadata, blobs: BlobStore) -> Self {
        Self {
            meta,
            blobs,
            cache: None,
            retired_in_store: Default::default(),
            delete_queue: Default::default(),
            grace: Duration::from_secs(3600),
        }
    }

    /// Keeps blobs in the object store `settings` names (`blob_store.url`), cached in the data dir; unchanged
    /// when none is named. Makes no request to the store. Only a server (`serving`) owns the cache directory: a
    /// CLI command beside it uploads and reads through the store without touching the server's cache files.
    pub async fn with_blob_store(mut self, settings: &crate::config::Settings, serving: bool) -> anyhow::Result<Self> {
        if let Some(location) = settings.object_store()? {
            let mut remote = remote::RemoteBlobs::new(&location)?;
            if let Some(secrets) = self.meta.secrets() {
                remote = remote.with_manifest_key(manifest::ManifestKey::derive(secrets));
            }
            let (max_bytes, slice_bytes) = (settings.cache.max_bytes, settings.cache.slice_bytes);
            let cache = BlobCache::open(&settings.data_dir, max_bytes, slice_bytes, remote, serving)
                .await
                .context("cannot open the blob cache")?
                .with_max_open_files(settings.cache.max_open_files)
                .with_quarantine_recheck(settings.cache.quarantine_recheck);
            self.cache = Some(cache);
        }
        self.grace = settings.timeouts.sweep_grace;
        Ok(self)
    }

    /// Stores staged blobs in the object store, if blobs live in one (before the write lock: an upload may be
    /// long, and a blob in the store without a row is what the sweep removes). First waits out a sweep's delete of
    /// the same content in flight, which could land after the upload. `blobs_still_stored` checks the answer.
    pub async fn upload_blobs(&self, staged: &[&StagedBlob]) -> Result<Option<StoredBlobs>, StoreError> {
        let Some(cache) = &self.cache else { return Ok(None) };
        let (checked_at, rows) = loop {
            let checked_at = unix_now();
            let mut rows = Vec::with_capacity(staged.len());
            for blob in staged {
                rows.push(self.meta.store_blob_retirement(&blob.sha256).await?);
            }
            // Bounded: a delete lapses (`store_deletes::lapse`) if its sweeper never says it came back.
            if rows.iter().flatten().all(|r| store_deletes::delete_over(r, checked_at, self.grace)) {
                break (checked_at, rows);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        for blob in staged {
            // A quarantined store copy (it failed its check) is replaced by this sound one.
            let replace = cache.is_quarantined(&blob.sha256);
            cache.remote().upload_checked(blob.path().to_owned(), &blob.sha256, blob.size, replace).await?;
            if replace {
                cache.lift_quarantine(&blob.sha256);
            }
        }
        Ok(Some(StoredBlobs { checked_at, rows }))
    }

    /// Under the write lock, without a store call: whether no sweep's delete can have landed after `stored` read
    /// the blobs' rows (`store_deletes::may_commit`). If so, the blobs are no longer waiting to be deleted;
    /// if not, the caller rolls back and uploads again.
    async fn blobs_still_stored(
        &self,
        tx: &mut WriteTx,
        staged: &[&StagedBlob],
        stored: Option<&StoredBlobs>,
    ) -> Result<bool, StoreError> {
        let Some(stored) = stored else { return Ok(true) };
        let now = unix_now();
        for (blob, before) in staged.iter().zip(&stored.rows) {
            let after = tx.store_blob_retirement(&blob.sha256).await?;
            if !store_deletes::may_commit(before.as_ref(), stored.checked_at, after.as_ref(), now, self.grace) {
                let sha256 = blob.sha256.as_str();
                tracing::info!(sha256, "a store delete of this content may have raced its upload; uploading it again");
                return Ok(false);
            }
        }
        for blob in staged {
            tx.unretire_store_blob(&blob.sha256).await?;
        }
        Ok(true)
    }

    /// Under the write lock, after `blobs_still_stored`: each staged blob becomes a whole cache entry.
    async fn adopt_blobs(&self, staged: &[&StagedBlob]) {
        let Some(cache) = &self.cache else { return };
        for blob in staged {
            cache.adopt(&blob.sha256, blob.size, blob.path().to_owned()).await;
        }
    }

    /// Deletes from the object store, once `grace` has passed, the blobs this process's writes left unreferenced
    /// (so that every download already reading one finishes, on every replica), each only if still unreferenced
    /// then. Runs in the background, one task in all; what fails, or a restart forgets, is left to the sweep.
    fn schedule_store_deletes(&self) {
        let Some(cache) = self.cache.clone() else { return };
        let retired = std::mem::take(&mut *self.retired_in_store.lock().unwrap_or_else(|p| p.into_inner()));
        if retired.is_empty() {
            return;
        }
        // A second more: the rows count in whole seconds.
        let due = tokio::time::Instant::now() + self.grace + Duration::from_secs(1);
        let mut queue = self.delete_queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.due.extend(retired.into_iter().map(|sha| (due, sha)));
        if std::mem::replace(&mut queue.worker, true) {
            return;
        }
        let (meta, grace, queue) = (self.meta.clone(), self.grace, self.delete_queue.clone());
        tokio::spawn(async move {
            loop {
                let next = {
                    let mut queue = queue.lock().unwrap_or_else(|p| p.into_inner());
                    let next = queue.due.front().map(|(due, _)| *due);
                    // Decided under the queue's lock, so that a write adding to it sees no worker and starts one.
                    queue.worker = next.is_some();
                    next
                };
                let Some(due) = next else { return };
                tokio::time::sleep_until(due).await;
                let batch: Vec<String> = {
                    let mut queue = queue.lock().unwrap_or_else(|p| p.into_inner());
                    let now = tokio::time::Instant::now();
                    // A batch per lock hold: a forced bucket delete may have made a million blobs due at once.
                    let ready = queue.due.iter().take_while(|(due, _)| *due <= now).take(RETIRE_BATCH).count();
                    queue.due.drain(..ready).map(|(_, sha)| sha).collect()
                };
                if let Err(e) = delete_retired(&meta, &cache, &batch, grace).await {
                    let error = format!("{e:#}");
                    tracing::warn!(error, "could not delete unreferenced blobs from the object store; the sweep will");
                }
            }
        });
    }

    /// Opens an existing data dir for reading only: creates no directory or file, writes nothing (see
    /// `Metadata::open_read_only`). A database without a schema, or from another line of releases, is refused in
    /// one line (`MigrationStatus::check`), before anything reads a table. One that needs a migration is opened for
    /// writing instead, so that the first command after an upgrade works where it may write and says why where it
    /// may not.
    pub async fn open_read_only(
        data_dir: &Path,
        database: &DatabaseUrl,
        timeouts: impl Into<DatabaseTimeouts>,
    ) -> anyhow::Result<Self> {
        let timeouts = timeouts.into();
        let mut meta = Metadata::open_read_only(database, timeouts).await?;
        let status = meta.migrations();
        if let Err(e) = status.check(database) {
            meta.close().await;
            return Err(e);
        }
        if status.pending().next().is_some() {
            meta.close().await;
            return Self::open(data_dir, database, timeouts)
                .await
                .context("the database must be migrated to this version first, which needs write access");
        }
        if let Some(key) = secrets_key::load_existing(data_dir, &meta).await? {
            meta = meta.with_secrets_key(key);
        }
        Ok(Self::with_parts(meta, BlobStore::at(data_dir)))
    }

    /// Makes a staged blob visible as `bucket/key`. Only after the blob is fsynced and renamed and the row is
    /// committed can anyone see the object. A replaced object's blob is removed when nothing else uses it, and so
    /// are its variants (a plain put leaves the object with none).
    pub async fn put(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        staged: StagedBlob,
        attrs: ObjectAttrs,
    ) -> Result<PutReport, StoreError> {
        self.put_with_variants(bucket, key, staged, attrs, Vec::new()).await
    }

    /// `put`, with the object's precompressed variants (each the same content in another coding), which replace
    /// whatever variants it had, in the same transaction: the object and its variants change together.
    pub async fn put_with_variants(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        staged: StagedBlob,
        attrs: ObjectAttrs,
        variants: Vec<StagedVariant>,
    ) -> Result<PutReport, StoreError> {
        self.put_if(bucket, key, staged, attrs, variants, &WriteCondition::Always).await
    }

    /// `put_with_variants` if `condition` holds for the object it would replace, else `PreconditionFailed` (or
    /// `NoSuchKey` for `IfMatch` on an absent key) and nothing changes.
    pub async fn put_if(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        staged: StagedBlob,
        attrs: ObjectAttrs,
        variants: Vec<StagedVariant>,
        condition: &WriteCondition,
    ) -> Result<PutReport, StoreError> {
        let mut all = vec![&staged];
        all.extend(variants.iter().map(|v| &v.blob));
        let mut attempt = 1;
        let (mut tx, bucket_row) = loop {
            let stored = self.upload_blobs(&all).await?;
            let mut tx = self.meta.lock_blob_refs().await?;
            let bucket_row = require_bucket(tx.bucket(bucket).await?, bucket)?;
            check_write_condition(&mut tx, &bucket_row, key, condition).await?;
            if self.blobs_still_stored(&mut tx, &all, stored.as_ref()).await? {
                break (tx, bucket_row);
            }
            drop(tx);
            attempt = next_store_attempt(attempt)?;
        };
        let (report, retired) = self.write_object(&mut tx, &bucket_row, key, staged, attrs, variants).await?;
        finish_commit(tx, retired).await?;
        self.schedule_store_deletes();
        Ok(report)
    }

    /// The steps of a put inside its write transaction (which must hold `lock_blob_refs`): install the staged
    /// blobs, write the object and variant rows, retire the blobs nothing references any more. The caller
    /// commits with `finish_commit`, which unlinks the retired blobs after the commit or puts them back if it
    /// fails. Shared by `put_with_variants` and CompleteMultipartUpload, so both keep the same ordering.
    async fn write_object(
        &self,
        tx: &mut WriteTx,
        bucket_row: &Bucket,
        key: &ObjectKey,
        staged: StagedBlob,
        attrs: ObjectAttrs,
        variants: Vec<StagedVariant>,
    ) -> Result<(PutReport, Vec<blobs::RetiredBlob>), StoreError> {
        let now = unix_now();
        let (staged, variants) = if self.cache.is_some() {
            let mut all = vec![&staged];
            all.extend(variants.iter().map(|v| &v.blob));
            self.adopt_blobs(&all).await;
            (staged, variants)
        } else {
            // Under the write lock: no concurrent delete can retire these hashes between the rename and the commit.
            let blobs = self.blobs.clone();
            let (staged, variants, installed) = tokio::task::spawn_blocking(move || {
                let r = blobs.install(&staged).and_then(|()| variants.iter().try_for_each(|v| blobs.install(&v.blob)));
                (staged, variants, r)
            })
            .await
            .context("blob install task failed")?;
            installed?;
            (staged, variants)
        };
        let upsert = tx.upsert_object(bucket_row.id, key, &staged.sha256, staged.size, &attrs, now).await?;
        let records: Vec<VariantRecord> = variants
            .iter()
            .map(|v| VariantRecord {
                encoding: v.coding.token().to_owned(),
                sha256: v.blob.sha256.clone(),
                size: i64::try_from(v.blob.size).expect("blob sizes fit in i64"),
            })
            .collect();
        // The S3 ETag of a single upload is its MD5 (as S3's); CompleteMultipartUpload, whose assembled blob has
        // none, records the parts' ETag instead. Either way S3 reads see the ETag the upload answered.
        if let Some(md5) = &staged.md5 {
            let (etag, checksum) = (format!("\"{md5}\""), staged.checksum.as_ref());
            tx.set_s3_etag(bucket_row.id, key.as_str(), &staged.sha256, &etag, None, checksum).await?;
        }
        let mut dropped = tx.replace_variants(bucket_row.id, key.as_str(), &records).await?;
        if let Upsert::Replaced { previous_sha256 } = &upsert {
            dropped.push(previous_sha256.clone());
        }
        let retired = self.retire_all_unreferenced(tx, dropped).await?;
        let report = PutReport {
            bucket: bucket_row.name.clone(),
            key: key.to_string(),
            size: staged.size,
            etag: crate::header_values::etag_from_sha256(&staged.sha256),
            sha256: staged.sha256.clone(),
            content_type: effective_content_type(attrs.content_type.as_deref(), key.as_str()),
            status: PutStatus::from(&upsert),
            variants: variants.iter().map(|v| v.coding.token()).collect(),
        };
        Ok((report, retired))
    }

    /// Deletes `bucket/key`; `Ok(false)` when there was no such object. Removes the blob with its last reference.
    pub async fn delete(&self, bucket: &BucketName, key: &ObjectKey) -> Result<bool, StoreError> {
        self.delete_if(bucket, key, &WriteCondition::Always).await
    }

    /// `delete` if `condition` holds for the current object (S3 conditional deletes: `If-Match`), checked under
    /// the write lock; else `PreconditionFailed` (or `NoSuchKey` for `IfMatch` on an absent key) and nothing
    /// changes.
    pub async fn delete_if(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        condition: &WriteCondition,
    ) -> Result<bool, StoreError> {
        let mut tx = self.meta.lock_blob_refs().await?;
        let bucket_row = require_bucket(tx.bucket(bucket).await?, bucket)?;
        check_write_condition(&mut tx, &bucket_row, key, condition).await?;
        let Some(hashes) = tx.delete_object(bucket_row.id, key).await? else {
            return Ok(false);
        };
        let retired = self.retire_all_unreferenced(&mut tx, hashes).await?;
        finish_commit(tx, retired).await?;
        self.schedule_store_deletes();
        Ok(true)
    }

    /// Replaces an object's S3 tags (PutObjectTagging; an empty set is DeleteObjectTagging). Its content, ETag
    /// and Last-Modified stay. `false` when there is no such object.
    pub async fn set_tags(&self, bucket: &BucketName, key: &ObjectKey, tags: &Tags) -> Result<bool, StoreError> {
        let mut tx = self.meta.begin_write().await?;
        let bucket_row = require_bucket(tx.bucket(bucket).await?, bucket)?;
        let found = tx.set_object_tags(bucket_row.id, key, tags).await?;
        tx.commit().await?;
        Ok(found)
    }

    /// Deletes a bucket, refused while it has objects unless `force`. Forced, its objects go in batches, each
    /// like `delete` (rows removed and unreferenced blobs retired under the write lock, unlinked after the
    /// commit), so a crash part-way leaves a smaller bucket and never a row without its blob; running it again
    /// finishes the job. The last transaction checks the bucket is empty (a put may have raced) and removes it
    /// with its tokens, download stats and unfinished multipart uploads (as S3 deletes a bucket that holds only
    /// those), whose part files are removed after the commit.
    pub async fn delete_bucket(&self, bucket: &BucketName, force: bool) -> Result<BucketDeletion, StoreError> {
        let mut objects = 0;
        loop {
            let mut tx = self.meta.lock_blob_refs().await?;
            let row = require_bucket(tx.bucket(bucket).await?, bucket)?;
            if !force {
                let present = tx.object_count(row.id).await?;
                if present > 0 {
                    return Ok(BucketDeletion::NotEmpty { objects: present });
                }
            }
            let (deleted, hashes) = tx.delete_objects_batch(row.id, DELETE_BATCH).await?;
            if deleted == 0 {
                let (uploads, part_files) = tx.delete_bucket_uploads(row.id).await?;
                let tokens = tx.delete_empty_bucket(row.id).await?;
                tx.commit().await?;
                self.remove_part_files(part_files).await;
                return Ok(BucketDeletion::Deleted { objects, tokens, uploads });
            }
            objects += deleted;
            let retired = self.retire_all_unreferenced(&mut tx, hashes).await?;
            finish_commit(tx, retired).await?;
            self.schedule_store_deletes();
        }
    }

    /// Removes temp leftovers and blobs that no object references (after a crash between rename and commit), and
    /// puts back blobs retired by a delete that never committed: [`Store::sweep_at_start`] then
    /// [`Store::sweep_blobs`], as a server does (the second in the background).
    pub async fn sweep(&self, grace: Duration) -> anyhow::Result<SweepReport> {
        let at_start = self.sweep_at_start(grace).await?;
        let blobs = self.sweep_blobs(grace).await?;
        Ok(SweepReport {
            temp_files: at_start.temp_files,
            restored_blobs: at_start.restored_blobs,
            unreferenced_blobs: blobs.unreferenced_blobs,
            part_files: blobs.part_files,
        })
    }

    /// What must be done before serving, and is cheap: it looks only at `tmp/`, never at the blobs. Removes temp
    /// files no live process is writing, and puts back blobs retired by a delete that never committed (a row still
    /// references them), else unlinks them. Safe beside live peers sharing the data dir: a temp file goes only
    /// when its owner is a dead process on this host or it has been idle for `grace`.
    pub async fn sweep_at_start(&self, grace: Duration) -> anyhow::Result<SweepReport> {
        let blobs = self.blobs.clone();
        let (mut temp_files, retired) =
            tokio::task::spawn_blocking(move || blobs.sweep_temp_files(grace)).await.context("sweep task failed")??;
        let mut restored_blobs = 0;
        // In batches, each under the write lock: there no delete is between its retire and its commit. A retired
        // blob whose hash a row still references was retired by a transaction that rolled back (its process
        // died): restore it. Otherwise its delete committed, and only the unlink was left to do.
        let mut retired = retired.into_iter().peekable();
        while retired.peek().is_some() {
            let batch: Vec<blobs::RetiredBlob> = retired.by_ref().take(RETIRE_BATCH).collect();
            let hashes: Vec<String> = batch.iter().map(|r| r.sha256().to_owned()).collect();
            let mut tx = self.meta.lock_blob_refs().await?;
            let referenced = tx.referenced_blobs(&hashes).await?;
            for r in batch {
                if referenced.contains(r.sha256()) && !r.blob_present() {
                    r.restore().context("cannot restore a retired blob that is still referenced")?;
                    restored_blobs += 1;
                } else if r.discard() {
                    temp_files += 1;
                }
            }
            tx.commit().await?;
        }
        Ok(SweepReport { temp_files, restored_blobs, ..SweepReport::default() })
    }

    /// Removes blobs that no object references and part files that no upload names: a server runs it in the
    /// background, at start and now and then (`serve`), as its time grows with the number of blobs. The walk goes
    /// [`SWEEP_BATCH`] blobs at a time: one query outside any transaction finds the unreferenced ones, then write
    /// transactions of at most [`RETIRE_BATCH`] re-check and retire them, so no lock hold grows with their number. Safe beside
    /// live peers: a blob goes only when idle for `grace` and still unreferenced under the blob-reference lock.
    pub async fn sweep_blobs(&self, grace: Duration) -> anyhow::Result<SweepReport> {
        // The walk runs on a blocking thread and hands over one batch at a time (at most two wait).
        let (batches, mut received) = tokio::sync::mpsc::channel(1);
        let blobs = self.blobs.clone();
        let walk = tokio::task::spawn_blocking(move || {
            blobs.idle_hash_batches(grace, SWEEP_BATCH, |batch| batches.blocking_send(batch).is_ok())
        });
        let mut unreferenced_blobs = 0;
        while let Some(batch) = received.recv().await {
            unreferenced_blobs += self.sweep_blob_batch(batch).await?;
        }
        walk.await.context("sweep task failed")??;
        let part_files = self.sweep_part_files().await?;
        Ok(SweepReport { unreferenced_blobs, part_files, ..SweepReport::default() })
    }

    /// One batch of [`Store::sweep_blobs`]: returns how many of `hashes` it removed.
    async fn sweep_blob_batch(&self, hashes: Vec<String>) -> anyhow::Result<usize> {
        let referenced = self.meta.referenced_blobs(&hashes).await?;
        let candidates: Vec<String> = hashes.into_iter().filter(|sha| !referenced.contains(sha)).collect();
        let mut removed = 0;
        for batch in candidates.chunks(RETIRE_BATCH) {
            removed += self.retire_batch(batch).await?;
            tokio::time::sleep(metadata::BETWEEN_WRITE_BATCHES).await;
        }
        Ok(removed)
    }

    /// Retires and unlinks each of `candidates` that is still unreferenced, in one write transaction.
    async fn retire_batch(&self, candidates: &[String]) -> anyhow::Result<usize> {
        // Re-check under the write lock: a concurrent put may have just referenced one of them.
        let mut tx = self.meta.lock_blob_refs().await?;
        let referenced = tx.referenced_blobs(candidates).await?;
        let mut retired = Vec::new();
        for sha in candidates.iter().filter(|sha| !referenced.contains(*sha)) {
            match self.retire_unreferenced(&mut tx, sha).await {
                Ok(r) => retired.extend(r),
                Err(e) => {
                    restore_all(retired)?;
                    return Err(e);
                }
            }
        }
        match tx.commit().await {
            Ok(()) => Ok(retired.into_iter().map(blobs::RetiredBlob::discard).filter(|removed| *removed).count()),
            Err(e) => {
                restore_all(retired)?;
                Err(e).context("cannot commit the sweep's batch")
            }
        }
    }

    /// Deletes the object store's blobs that no row references, that were written more than `grace` ago (a
    /// younger one may be a replica's upload whose row is on its way) and whose last reference went more than
    /// `grace` ago (`delete_retired`), and parts no part row names written as long ago.
    /// Returns how many it deleted. A server runs it in the background after start-up (a listing of a large store
    /// takes a while, and a store that is down must not keep the server from serving what it has cached).
    pub async fn sweep_object_store(&self, grace: Duration) -> anyhow::Result<usize> {
        let Some(cache) = &self.cache else { return Ok(0) };
        let now = std::time::SystemTime::now();
        // The names on a page written more than `grace` ago.
        let old = |page: Vec<(String, std::time::SystemTime)>| -> Vec<String> {
            let is_old = |(_, written): &(String, std::time::SystemTime)| {
                staging::may_sweep_unreferenced_blob(now.duration_since(*written).ok(), grace)
            };
            page.into_iter().filter(is_old).map(|(name, _)| name).collect()
        };
        let mut deleted = 0;
        // Parts of multipart uploads that no part row names (a crash between the part's upload and its row), a
        // page of the listing at a time.
        let mut parts = remote::Listing::parts();
        while let Some(page) = cache.remote().next_page(&mut parts).await? {
            for batch in old(page).chunks(SWEEP_BATCH) {
                let mut tx = self.meta.lock_blob_refs().await?;
                let referenced = tx.referenced_part_files(batch).await?;
                tx.commit_without_announcing().await?;
                let orphans = batch.iter().filter(|name| !referenced.contains(*name));
                // Outside the lock: a part's name is new to its one upload, and its row commits within
                // `store_deletes::max_put_span` of that upload, so a part this old without a row never gets one.
                for name in orphans {
                    cache.remote().delete_part(name).await?;
                    deleted += 1;
                }
            }
        }
        // A page of the listing at a time, a batch per query, a smaller one per lock hold (`delete_retired`): the
        // memory and every lock hold are bounded however many blobs the store holds.
        let mut blobs = remote::Listing::blobs();
        while let Some(page) = cache.remote().next_page(&mut blobs).await? {
            for batch in old(page).chunks(SWEEP_BATCH) {
                let referenced = self.meta.referenced_blobs(batch).await?;
                let candidates: Vec<String> = batch.iter().filter(|sha| !referenced.contains(*sha)).cloned().collect();
                for candidates in candidates.chunks(RETIRE_BATCH) {
                    deleted += delete_retired(&self.meta, cache, candidates, grace).await?;
                    tokio::time::sleep(metadata::BETWEEN_WRITE_BATCHES).await;
                }
            }
        }
        Ok(deleted)
    }

    /// Retires each of `hashes` (deduplicated) that nothing references any more. On an error the ones already
    /// retired go back before it is returned: the rows come back with the rollback, so must their blobs.
    async fn retire_all_unreferenced(
        &self,
        tx: &mut WriteTx,
        mut hashes: Vec<String>,
    ) -> anyhow::Result<Vec<blobs::RetiredBlob>> {
        hashes.sort_unstable();
        hashes.dedup();
        let mut retired = Vec::new();
        for sha in &hashes {
            match self.retire_if_unreferenced(tx, sha).await {
                Ok(r) => retired.extend(r),
                Err(e) => {
                    restore_all(retired)?;
                    return Err(e);
                }
            }
        }
        Ok(retired)
    }

    async fn retire_if_unreferenced(
        &self,
        tx: &mut WriteTx,
        sha256: &str,
    ) -> anyhow::Result<Option<blobs::RetiredBlob>> {
        if tx.blob_is_referenced(sha256).await? {
            return Ok(None);
        }
        self.retire_unreferenced(tx, sha256).await
    }

    /// Retires a blob that a check under the blob-reference lock, in `tx`, found unreferenced.
    async fn retire_unreferenced(&self, tx: &mut WriteTx, sha256: &str) -> anyhow::Result<Option<blobs::RetiredBlob>> {
        if self.cache.is_some() {
            // Deleted from the object store `grace` after the commit (`schedule_store_deletes`, or the sweep).
            tx.retire_store_blob(sha256, unix_now()).await?;
            self.retired_in_store.lock().unwrap_or_else(|p| p.into_inner()).push(sha256.to_owned());
            return Ok(None);
        }
        self.blobs.retire(sha256)
    }
}

/// Deletes from the object store (and the cache) each of `hashes` that no row references and that may go
/// (`store_deletes::may_decide`: retired `grace` ago, no delete of it in flight). The decision is recorded under
/// the blob-reference lock; the deletes run after it is released, each sent only before
/// `store_deletes::send_deadline`, and each recorded as over (come back, failed, or not sent after a failure or past
/// that deadline). Returns how many it deleted.
async fn delete_retired(
    meta: &Metadata,
    cache: &BlobCache,
    hashes: &[String],
    grace: Duration,
) -> anyhow::Result<usize> {
    let decided_at = unix_now();
    let mut tx = meta.lock_blob_refs().await?;
    let referenced = tx.referenced_blobs(hashes).await?;
    let mut decided = Vec::new();
    for sha in hashes.iter().filter(|sha| !referenced.contains(*sha)) {
        let row = tx.store_blob_retirement(sha).await?;
        if store_deletes::may_decide(row.as_ref(), decided_at, grace) {
            tx.mark_store_blob_deleting(sha, decided_at).await?;
            decided.push(sha);
        }
    }
    tx.prune_store_blob_retirements(store_deletes::prune_before(decided_at, grace)).await?;
    tx.commit_without_announcing().await?;
    let (mut deleted, mut failed) = (0, None);
    for sha in decided {
        let late = unix_now() > decided_at.saturating_add(store_deletes::send_deadline(grace));
        if !late && failed.is_none() {
            match cache.remote().delete(sha).await {
                Ok(()) => {
                    cache.forget(sha);
                    deleted += 1;
                }
                Err(e) => failed = Some(e),
            }
        }
        // Over, whether it came back, failed or was never sent: a put of the same content need not wait for it.
        // What is left is decided again by a later sweep.
        let mut tx = meta.begin_write().await?;
        tx.mark_store_blob_deleted(sha, decided_at, unix_now()).await?;
        tx.commit_without_announcing().await?;
    }
    match failed {
        Some(e) => Err(e).context("cannot delete an unreferenced blob from the object store"),
        None => Ok(deleted),
    }
}

/// The next attempt's number after a write's blobs were found deleted under it, or the error past the last.
fn next_store_attempt(attempt: u32) -> Result<u32, StoreError> {
    if attempt >= STORE_ATTEMPTS {
        return Err(StoreError::BlobStoreUnavailable(remote::RemoteError::Unavailable(
            "sweeps kept deleting this content while it was uploaded".into(),
        )));
    }
    Ok(attempt + 1)
}

/// Commits, then deletes the retired blobs; if the commit fails they go back so no row loses its bytes.
async fn finish_commit(tx: WriteTx, retired: impl IntoIterator<Item = blobs::RetiredBlob>) -> Result<(), StoreError> {
    match tx.commit().await {
        Ok(()) => {
            for r in retired {
                r.discard();
            }
            Ok(())
        }
        Err(e) => {
            restore_all(retired)?;
            Err(e.into())
        }
    }
}

/// Puts every retired blob back, trying them all; the first failure is the error.
fn restore_all(retired: impl IntoIterator<Item = blobs::RetiredBlob>) -> anyhow::Result<()> {
    let mut first_error = None;
    for r in retired {
        if let Err(e) = r.restore() {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e).context("cannot restore a retired blob after a failed commit"),
        None => Ok(()),
    }
}

/// The stored type, else a guess from the key's extension, else `application/octet-stream`.
pub fn effective_content_type(stored: Option<&str>, key: &str) -> String {
    stored.unwrap_or_else(|| guessed_content_type(key)).to_owned()
}

/// The type a key's extension names (a static name from mime_guess's table), else application/octet-stream.
pub fn guessed_content_type(key: &str) -> &'static str {
    mime_guess::from_path(key).first_raw().unwrap_or("application/octet-stream")
}

/// Checks a conditional write's precondition inside its write transaction (which holds the write lock).
async fn check_write_condition(
    tx: &mut WriteTx,
    bucket: &Bucket,
    key: &ObjectKey,
    condition: &WriteCondition,
) -> Result<(), StoreError> {
    if *condition == WriteCondition::Always {
        return Ok(());
    }
    let current = tx.object_by_key(bucket.id, key.as_str()).await?;
    match (condition, current) {
        (WriteCondition::IfAbsent, None) => Ok(()),
        (WriteCondition::IfMatch(_), None) => Err(StoreError::NoSuchKey),
        (WriteCondition::IfMatch(tag), Some(current)) if tag == "*" || current.has_etag(tag) => Ok(()),
        _ => Err(StoreError::PreconditionFailed),
    }
}

/// The bucket a lookup found, or `NoSuchBucket`: the one bucket-exists check, for lookups in a transaction or not.
pub fn require_bucket(found: Option<Bucket>, name: &BucketName) -> Result<Bucket, StoreError> {
    found.ok_or_else(|| StoreError::NoSuchBucket(name.to_string()))
}

/// The one wall clock in unix seconds (it lives in `stats`, the lowest layer that needs it).
pub use crate::stats::unix_now;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::metadata::{TestBackend, on_both_backends};

    #[test]
    fn content_type_prefers_stored_then_extension() {
        assert_eq!(effective_content_type(Some("text/x-a"), "a.html"), "text/x-a");
        assert_eq!(effective_content_type(None, "dir/a.html"), "text/html");
        assert_eq!(effective_content_type(None, "a.tar.gz"), "application/gzip");
        assert_eq!(effective_content_type(None, "noext"), "application/octet-stream");
    }

    async fn store(backend: TestBackend) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = metadata::test_database_url(backend, dir.path()).await;
        let store = Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        store.meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        (dir, store)
    }

    /// Two replicas (two stores, each with its own pool, on one database and data dir) replacing one key at once:
    /// the blob-reference lock orders them, so every replaced blob is retired and exactly the winner's is left.
    #[tokio::test]
    async fn postgres_replicas_putting_one_key_at_once_leave_only_the_winners_blob() {
        let dir = tempfile::tempdir().unwrap();
        let url = metadata::test_database_url(TestBackend::Postgres, dir.path()).await;
        let a = Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        let b = Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        let name = BucketName::parse("bkt").unwrap();
        let bucket = a.meta.create_bucket(&name, false, 0).await.unwrap();
        let key = ObjectKey::parse("k").unwrap();
        for round in 0..20 {
            let from_a = a.blobs.stage_bytes(format!("a{round}").as_bytes());
            let from_b = b.blobs.stage_bytes(format!("b{round}").as_bytes());
            let (put_a, put_b) = tokio::join!(
                a.put(&name, &key, from_a, ObjectAttrs::default()),
                b.put(&name, &key, from_b, ObjectAttrs::default())
            );
            put_a.unwrap();
            put_b.unwrap();
            let row = a.meta.object_by_key(bucket.id, "k").await.unwrap().expect("the object");
            assert_eq!(a.blobs.list_hashes().unwrap(), vec![row.sha256], "round {round}: one blob, the row's");
        }
    }

    on_both_backends!(identical_content_is_stored_once_and_removed_with_its_last_reference);
    async fn identical_content_is_stored_once_and_removed_with_its_last_reference(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let b = BucketName::parse("bkt").unwrap();
        let (k1, k2) = (ObjectKey::parse("one").unwrap(), ObjectKey::parse("two").unwrap());
        let r1 = store.put(&b, &k1, store.blobs.stage_bytes(b"same"), ObjectAttrs::default()).await.unwrap();
        let r2 = store.put(&b, &k2, store.blobs.stage_bytes(b"same"), ObjectAttrs::default()).await.unwrap();
        assert_eq!(r1.sha256, r2.sha256);
        assert_eq!(store.blobs.list_hashes().unwrap(), vec![r1.sha256.clone()]);
        assert!(store.delete(&b, &k1).await.unwrap());
        assert!(store.blobs.path_of(&r1.sha256).exists());
        assert!(store.delete(&b, &k2).await.unwrap());
        assert!(!store.blobs.path_of(&r1.sha256).exists());
        assert!(!store.delete(&b, &k2).await.unwrap());
    }

    on_both_backends!(conditional_puts_hold_under_the_write_lock_and_refusals_leave_nothing);
    async fn conditional_puts_hold_under_the_write_lock_and_refusals_leave_nothing(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let b = BucketName::parse("bkt").unwrap();
        let k = ObjectKey::parse("lock").unwrap();
        let put = |bytes: &'static [u8], condition: WriteCondition| {
            let staged = store.blobs.stage_bytes(bytes);
            let (b, k, store) = (&b, &k, &store);
            async move { store.put_if(b, k, staged, ObjectAttrs::default(), Vec::new(), &condition).await }
        };
        let etag_of = |bytes: &[u8]| {
            use md5::Digest;
            format!("\"{}\"", hex::encode(md5::Md5::digest(bytes)))
        };
        assert!(matches!(put(b"x", WriteCondition::IfMatch("*".into())).await, Err(StoreError::NoSuchKey)));
        put(b"one", WriteCondition::IfAbsent).await.unwrap();
        assert!(matches!(put(b"two", WriteCondition::IfAbsent).await, Err(StoreError::PreconditionFailed)));
        let stale = WriteCondition::IfMatch(etag_of(b"zero"));
        assert!(matches!(put(b"two", stale).await, Err(StoreError::PreconditionFailed)));
        put(b"two", WriteCondition::IfMatch(etag_of(b"one"))).await.unwrap();
        put(b"three", WriteCondition::IfMatch("*".into())).await.unwrap();
        let row = store.meta.object_by_key(1, "lock").await.unwrap().unwrap();
        assert_eq!(row.s3_etag_or_native(), etag_of(b"three"));
        assert_eq!(store.blobs.list_hashes().unwrap(), vec![row.sha256], "refused and replaced blobs are gone");
        let tmp: Vec<_> = std::fs::read_dir(dir.path().join("tmp")).unwrap().collect();
        assert!(tmp.is_empty(), "refused puts left staged files: {tmp:?}");
    }

    on_both_backends!(conditional_deletes_delete_only_the_object_they_name);
    async fn conditional_deletes_delete_only_the_object_they_name(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let b = BucketName::parse("bkt").unwrap();
        let k = ObjectKey::parse("k").unwrap();
        let etag_of = |bytes: &[u8]| {
            use md5::Digest;
            format!("\"{}\"", hex::encode(md5::Md5::digest(bytes)))
        };
        let if_match = |tag: &str| WriteCondition::IfMatch(tag.to_owned());
        assert!(matches!(store.delete_if(&b, &k, &if_match("*")).await, Err(StoreError::NoSuchKey)));
        store.put(&b, &k, store.blobs.stage_bytes(b"v1"), ObjectAttrs::default()).await.unwrap();
        let stale = etag_of(b"v0");
        assert!(matches!(store.delete_if(&b, &k, &if_match(&stale)).await, Err(StoreError::PreconditionFailed)));
        assert!(store.meta.object_by_key(1, "k").await.unwrap().is_some(), "a refused delete kept the object");
        assert_eq!(store.blobs.list_hashes().unwrap().len(), 1);
        assert!(store.delete_if(&b, &k, &if_match(&etag_of(b"v1"))).await.unwrap());
        assert!(store.meta.object_by_key(1, "k").await.unwrap().is_none());
        assert!(store.blobs.list_hashes().unwrap().is_empty(), "the deleted object's blob went");
        store.put(&b, &k, store.blobs.stage_bytes(b"v2"), ObjectAttrs::default()).await.unwrap();
        assert!(store.delete_if(&b, &k, &if_match("*")).await.unwrap(), "* matches any current object");
    }

    on_both_backends!(reput_is_unchanged_and_replace_drops_the_old_blob);
    async fn reput_is_unchanged_and_replace_drops_the_old_blob(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let b = BucketName::parse("bkt").unwrap();
        let k = ObjectKey::parse("k").unwrap();
        let first = store.put(&b, &k, store.blobs.stage_bytes(b"v1"), ObjectAttrs::default()).await.unwrap();
        assert_eq!(first.status, PutStatus::Created);
        let again = store.put(&b, &k, store.blobs.stage_bytes(b"v1"), ObjectAttrs::default()).await.unwrap();
        assert_eq!(again.status, PutStatus::Unchanged);
        let second = store.put(&b, &k, store.blobs.stage_bytes(b"v2"), ObjectAttrs::default()).await.unwrap();
        assert_eq!(second.status, PutStatus::Replaced);
        assert_eq!(serde_json::to_value(second.status).unwrap(), "replaced", "the JSON spelling");
        assert_eq!(store.blobs.list_hashes().unwrap(), vec![second.sha256]);
    }

    fn variant(store: &Store, coding: ContentCoding, bytes: &[u8]) -> StagedVariant {
        StagedVariant { coding, blob: store.blobs.stage_bytes(bytes) }
    }

    on_both_backends!(variants_are_part_of_their_object_on_replace_and_delete);
    async fn variants_are_part_of_their_object_on_replace_and_delete(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let b = BucketName::parse("bkt").unwrap();
        let (k, other) = (ObjectKey::parse("app.js").unwrap(), ObjectKey::parse("other.js").unwrap());
        let id = store.meta.bucket(&b).await.unwrap().unwrap().id;
        let vs = vec![variant(&store, ContentCoding::Br, b"br-1"), variant(&store, ContentCoding::Gzip, b"gz-1")];
        let first = store
            .put_with_variants(&b, &k, store.blobs.stage_bytes(b"plain-1"), ObjectAttrs::default(), vs)
            .await
            .unwrap();
        let stored = store.meta.variants(id, k.as_str()).await.unwrap();
        assert_eq!(stored.iter().map(|v| v.encoding.as_str()).collect::<Vec<_>>(), ["br", "gzip"]);
        let (br_1, gz_1) = (stored[0].sha256.clone(), stored[1].sha256.clone());
        assert_eq!(stored[0].size, 4);
        assert_eq!(store.blobs.list_hashes().unwrap().len(), 3);
        // Another object shares the first gzip variant's bytes as its own content: that blob must stay.
        store.put(&b, &other, store.blobs.stage_bytes(b"gz-1"), ObjectAttrs::default()).await.unwrap();

        // Replacing with new variants retires the old ones nothing else uses; the shared one stays.
        let vs = vec![variant(&store, ContentCoding::Br, b"br-2")];
        store.put_with_variants(&b, &k, store.blobs.stage_bytes(b"plain-2"), ObjectAttrs::default(), vs).await.unwrap();
        let stored = store.meta.variants(id, k.as_str()).await.unwrap();
        assert_eq!(stored.len(), 1);
        assert!(!store.blobs.path_of(&first.sha256).exists(), "the old identity blob went");
        assert!(!store.blobs.path_of(&br_1).exists(), "the old br blob went");
        assert!(store.blobs.path_of(&gz_1).exists(), "the gzip blob is still another object's content");
        let br_2 = stored[0].sha256.clone();

        // A plain put leaves the object with no variants.
        store.put(&b, &k, store.blobs.stage_bytes(b"plain-2"), ObjectAttrs::default()).await.unwrap();
        assert!(store.meta.variants(id, k.as_str()).await.unwrap().is_empty());
        assert!(!store.blobs.path_of(&br_2).exists());

        // Delete takes the variants and their blobs with the object.
        let vs = vec![variant(&store, ContentCoding::Br, b"br-3")];
        store.put_with_variants(&b, &k, store.blobs.stage_bytes(b"plain-3"), ObjectAttrs::default(), vs).await.unwrap();
        let br_3 = store.meta.variants(id, k.as_str()).await.unwrap()[0].sha256.clone();
        assert!(store.delete(&b, &k).await.unwrap());
        assert!(store.meta.variants(id, k.as_str()).await.unwrap().is_empty());
        assert!(!store.blobs.path_of(&br_3).exists());
        assert_eq!(store.blobs.list_hashes().unwrap(), vec![gz_1.clone()], "only the other object's blob is left");

        // A forced bucket delete counts objects, not blobs, and removes variant blobs too.
        let vs = vec![variant(&store, ContentCoding::Br, b"br-4"), variant(&store, ContentCoding::Gzip, b"gz-4")];
        store.put_with_variants(&b, &k, store.blobs.stage_bytes(b"plain-4"), ObjectAttrs::default(), vs).await.unwrap();
        assert_eq!(
            store.delete_bucket(&b, true).await.unwrap(),
            BucketDeletion::Deleted { objects: 2, tokens: 0, uploads: 0 }
        );
        assert!(store.blobs.list_hashes().unwrap().is_empty());
    }

    on_both_backends!(the_sweep_keeps_variant_blobs);
    async fn the_sweep_keeps_variant_blobs(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let b = BucketName::parse("bkt").unwrap();
        let k = ObjectKey::parse("app.js").unwrap();
        let vs = vec![variant(&store, ContentCoding::Br, b"br")];
        store.put_with_variants(&b, &k, store.blobs.stage_bytes(b"plain"), ObjectAttrs::default(), vs).await.unwrap();
        let report = store.sweep(Duration::ZERO).await.unwrap();
        assert_eq!(report.unreferenced_blobs, 0, "a variant's blob is referenced");
        assert_eq!(store.blobs.list_hashes().unwrap().len(), 2);
    }

    on_both_backends!(unknown_bucket_leaves_nothing_behind);
    async fn unknown_bucket_leaves_nothing_behind(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let err = store
            .put(
                &BucketName::parse("nope").unwrap(),
                &ObjectKey::parse("k").unwrap(),
                store.blobs.stage_bytes(b"x"),
                ObjectAttrs::default(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::NoSuchBucket(_)));
        assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
        assert!(store.blobs.list_hashes().unwrap().is_empty());
    }

    on_both_backends!(bucket_delete_needs_force_and_keeps_blobs_other_buckets_use);
    async fn bucket_delete_needs_force_and_keeps_blobs_other_buckets_use(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let (b, other) = (BucketName::parse("bkt").unwrap(), BucketName::parse("other").unwrap());
        store.meta.create_bucket(&other, false, 0).await.unwrap();
        let k = ObjectKey::parse("k").unwrap();
        let shared = store.put(&other, &k, store.blobs.stage_bytes(b"shared"), ObjectAttrs::default()).await.unwrap();
        let mut own = Vec::new();
        // More objects than one batch, two of them sharing a blob within the bucket.
        for i in 0..(DELETE_BATCH + 3) {
            let key = ObjectKey::parse(&format!("k{i:04}")).unwrap();
            let bytes = match i {
                0 => b"shared".to_vec(),
                1 | 2 => b"twice".to_vec(),
                _ => format!("object {i}").into_bytes(),
            };
            own.push(
                store.put(&b, &key, store.blobs.stage_bytes(&bytes), ObjectAttrs::default()).await.unwrap().sha256,
            );
        }
        let objects = u64::from(DELETE_BATCH + 3);
        assert_eq!(store.delete_bucket(&b, false).await.unwrap(), BucketDeletion::NotEmpty { objects });
        assert!(store.meta.bucket(&b).await.unwrap().is_some(), "refused: nothing deleted");
        assert_eq!(
            store.delete_bucket(&b, true).await.unwrap(),
            BucketDeletion::Deleted { objects, tokens: 0, uploads: 0 }
        );
        assert!(store.meta.bucket(&b).await.unwrap().is_none());
        assert_eq!(store.blobs.list_hashes().unwrap(), vec![shared.sha256.clone()], "only the other bucket's is left");
        assert!(own.iter().filter(|sha| **sha != shared.sha256).all(|sha| !store.blobs.path_of(sha).exists()));
        let err = store.delete_bucket(&b, true).await.unwrap_err();
        assert!(matches!(err, StoreError::NoSuchBucket(_)));
    }

    on_both_backends!(sweep_restores_a_blob_whose_delete_never_committed);
    async fn sweep_restores_a_blob_whose_delete_never_committed(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let b = BucketName::parse("bkt").unwrap();
        let (kept, gone) = (ObjectKey::parse("kept").unwrap(), ObjectKey::parse("gone").unwrap());
        let kept_sha =
            store.put(&b, &kept, store.blobs.stage_bytes(b"kept"), ObjectAttrs::default()).await.unwrap().sha256;
        let gone_sha =
            store.put(&b, &gone, store.blobs.stage_bytes(b"gone"), ObjectAttrs::default()).await.unwrap().sha256;
        // A delete that died after retiring its blob and before committing: the row stays, the blob is aside.
        std::mem::forget(store.blobs.retire(&kept_sha).unwrap().unwrap());
        // One whose commit went through but that died before the unlink.
        std::mem::forget(store.blobs.retire(&gone_sha).unwrap().unwrap());
        store.delete(&b, &gone).await.unwrap();
        let report = store.sweep(Duration::ZERO).await.unwrap();
        assert_eq!((report.restored_blobs, report.temp_files), (1, 1));
        assert!(store.blobs.path_of(&kept_sha).is_file(), "the referenced blob is back");
        assert!(!store.blobs.path_of(&gone_sha).exists());
        assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    on_both_backends!(sweep_removes_blobs_installed_without_a_row);
    async fn sweep_removes_blobs_installed_without_a_row(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let staged = store.blobs.stage_bytes(b"orphan");
        store.blobs.install(&staged).unwrap();
        let report = store.sweep(Duration::ZERO).await.unwrap();
        assert_eq!(report.unreferenced_blobs, 1);
        assert!(store.blobs.list_hashes().unwrap().is_empty());
    }

    /// Writes a blob file under a made-up hash, with no row (as a crash between rename and commit leaves one).
    fn plant_blob(store: &Store, i: usize) -> String {
        let sha = format!("{i:064x}");
        let path = store.blobs.path_of(&sha);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"nobody refers to me").unwrap();
        sha
    }

    on_both_backends!(referenced_blobs_are_found_in_one_query_through_objects_and_variants);
    async fn referenced_blobs_are_found_in_one_query_through_objects_and_variants(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let b = BucketName::parse("bkt").unwrap();
        let k = ObjectKey::parse("app.js").unwrap();
        let vs = vec![variant(&store, ContentCoding::Br, b"br")];
        let row = store
            .put_with_variants(&b, &k, store.blobs.stage_bytes(b"plain"), ObjectAttrs::default(), vs)
            .await
            .unwrap();
        let id = store.meta.bucket(&b).await.unwrap().unwrap().id;
        let br = store.meta.variants(id, "app.js").await.unwrap()[0].sha256.clone();
        let nobody = "0".repeat(64);
        let asked = vec![nobody.clone(), row.sha256.clone(), br.clone(), row.sha256.clone()];
        let expected: std::collections::HashSet<String> = [row.sha256.clone(), br].into();
        assert_eq!(store.meta.referenced_blobs(&asked).await.unwrap(), expected);
        let mut tx = store.meta.lock_blob_refs().await.unwrap();
        assert_eq!(tx.referenced_blobs(&asked).await.unwrap(), expected);
        assert!(tx.referenced_blobs(&[nobody]).await.unwrap().is_empty());
        assert!(tx.referenced_blobs(&[]).await.unwrap().is_empty());
    }

    on_both_backends!(the_start_up_sweep_leaves_the_blobs_to_the_background_sweep_which_goes_in_batches);
    async fn the_start_up_sweep_leaves_the_blobs_to_the_background_sweep_which_goes_in_batches(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let b = BucketName::parse("bkt").unwrap();
        let kept = store
            .put(&b, &ObjectKey::parse("kept").unwrap(), store.blobs.stage_bytes(b"kept"), ObjectAttrs::default())
            .await
            .unwrap()
            .sha256;
        // Several batches' worth, and a last one that is not full.
        let planted: Vec<String> = (0..3 * SWEEP_BATCH + 7).map(|i| plant_blob(&store, i)).collect();
        let started = std::time::Instant::now();
        assert_eq!(store.sweep_at_start(Duration::ZERO).await.unwrap(), SweepReport::default());
        let at_start = started.elapsed();
        assert_eq!(store.blobs.list_hashes().unwrap().len(), planted.len() + 1, "start-up walks no blob");

        let mut batches = Vec::new();
        store
            .blobs
            .idle_hash_batches(Duration::ZERO, SWEEP_BATCH, |batch| {
                batches.push(batch.len());
                true
            })
            .unwrap();
        assert_eq!(batches, [SWEEP_BATCH, SWEEP_BATCH, SWEEP_BATCH, 8], "the planted blobs and the kept one");
        // One full batch alone: its query, then its re-checks and retires, RETIRE_BATCH per write lock hold.
        let started = std::time::Instant::now();
        assert_eq!(store.sweep_blob_batch(planted[..SWEEP_BATCH].to_vec()).await.unwrap(), SWEEP_BATCH);
        let one_batch = started.elapsed();
        let report = store.sweep_blobs(Duration::ZERO).await.unwrap();
        assert_eq!(report, SweepReport { unreferenced_blobs: planted.len() - SWEEP_BATCH, ..SweepReport::default() });
        assert_eq!(store.blobs.list_hashes().unwrap(), vec![kept], "the referenced blob stays, the rest went");
        eprintln!("{backend:?}: start-up sweep {at_start:?}; {SWEEP_BATCH} blobs checked and retired in {one_batch:?}");
    }

    on_both_backends!(the_sweep_leaves_unreferenced_blobs_younger_than_the_grace_period);
    async fn the_sweep_leaves_unreferenced_blobs_younger_than_the_grace_period(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let staged = store.blobs.stage_bytes(b"a peer's, its row on the way");
        store.blobs.install(&staged).unwrap();
        let report = store.sweep(Duration::from_secs(3600)).await.unwrap();
        assert_eq!(report, SweepReport::default());
        let path = store.blobs.path_of(&staged.sha256);
        assert!(path.is_file());
        let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(an_hour_ago).unwrap();
        assert_eq!(store.sweep(Duration::from_secs(3600)).await.unwrap().unreferenced_blobs, 1);
        assert!(!path.exists());
    }

    on_both_backends!(the_secrets_key_file_is_required_once_keys_are_sealed_with_it);
    async fn the_secrets_key_file_is_required_once_keys_are_sealed_with_it(backend: TestBackend) {
        let dir = tempfile::tempdir().unwrap();
        let url = metadata::test_database_url(backend, dir.path()).await;
        let store = Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        let key = SigningKey { id: "k1".into(), secret: vec![7; 32], created_at: 0, retired_at: None };
        store.meta.create_signing_key(&key).await.unwrap();
        drop(store);
        let path = dir.path().join(secrets_key::SECRETS_KEY_FILE);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, PRIVATE_FILE_MODE);
        let original = std::fs::read(&path).unwrap();

        std::fs::remove_file(&path).unwrap();
        let err =
            Store::open(dir.path(), &url, Duration::from_secs(5)).await.err().expect("refused without the key file");
        assert!(format!("{err:#}").contains("is missing"), "{err:#}");
        assert!(!path.exists(), "no new key is made over sealed keys");

        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
        let err = Store::open(dir.path(), &url, Duration::from_secs(5)).await.err().expect("refused with another key");
        assert!(format!("{err:#}").contains("does not open with this secrets key"), "{err:#}");

        std::fs::write(&path, &original).unwrap();
        let store = Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        assert_eq!(store.meta.signing_key("k1").await.unwrap(), Some(key));
    }
}
