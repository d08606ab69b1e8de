//! S3 multipart uploads: create, put parts, list, abort, complete. Nothing an upload holds is visible until
//! Complete commits the object.
//!
//! **Ordering.** A part is staged in `tmp/` like any upload body (fsynced, named with our pid), then moved to
//! `parts/<name>` under the write lock in the transaction that writes its row; a replaced part's old file is
//! removed after that commit. Complete checks the parts, assembles them into a staged blob in `tmp/` with
//! `copy_file_range` (outside the lock: it may take a while), then under the write lock checks the upload is
//! unchanged, deletes the upload's rows and commits the object exactly as `Store::put` does
//! (`Store::write_object` + `finish_commit`), and only then removes the part files. A crash at any point
//! leaves nothing visible: a dead process's staged files, part files no row names, and blobs no object
//! references are what the start-up sweep removes; an upload that is never completed is aborted by
//! `expire_uploads`, which `serve` runs per `timeouts.multipart_upload_expiry`.
//!
//! **Bounds** ([`UploadLimits`]). A part is checked against what is already held when its row is written, under
//! the write lock in that transaction: its own size, the upload's parts with it (`limits.max_object_bytes`), and
//! every part of the unfinished uploads its upload's creator started (`limits.max_unfinished_upload_bytes_per_key`).
//! Every part install holds that lock, so parts arriving at once on several replicas cannot pass a limit together;
//! a part that replaces one of the same number counts at its new size only. `check_part_room` makes the same
//! checks from a declared length before a body is read, so a client is refused before it sends the bytes.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use md5::{Digest, Md5};

use crate::header_values::checksum::{ChecksumAlgorithm, ChecksumType, ObjectChecksum, multipart_checksum};

use super::{
    Bucket, MetadataError, PartRecord, PutReport, Store, StoreError, UploadRecord, WriteCondition, WriteTx,
    blobs::BlobStore, finish_commit, metadata::HeldBytes, require_bucket, restore_all, unix_now,
};
use crate::names::{BucketName, ObjectAttrs, ObjectKey};

/// Every part but the last must have at least this many bytes (S3's rule).
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// The most bytes one part may have (S3's rule; `limits.max_upload_bytes` may lower it).
pub const MAX_PART_SIZE: u64 = 5 << 30;
/// Part numbers run from 1 to this.
pub const MAX_PART_NUMBER: u32 = 10_000;
/// How long a Complete's claim on its upload holds: past it, a replica that died while assembling no longer
/// keeps the upload from completing.
const COMPLETE_CLAIM_LEASE: Duration = Duration::from_secs(3600);
/// How long a committed CompleteMultipartUpload is remembered, so that a retry of it (its answer lost) gets the
/// same answer, as S3 gives; SDKs retry within seconds.
pub const COMPLETED_UPLOAD_MEMORY: Duration = Duration::from_secs(15 * 60);
/// Uploads reclaimed per transaction by `abort_uploads_older_than`.
const ABORT_BATCH: u32 = 100;

/// Why a multipart operation was refused, named after S3's error codes ([`MultipartError::s3_code`]).
#[derive(Debug, thiserror::Error)]
pub enum MultipartError {
    #[error("no such bucket: {0}")]
    NoSuchBucket(String),
    #[error(
        "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed."
    )]
    NoSuchUpload,
    #[error("Part number must be an integer between 1 and 10000, inclusive (got {0})")]
    InvalidPartNumber(u32),
    #[error("One or more of the specified parts could not be found (part {0}), or its ETag did not match.")]
    InvalidPart(u32),
    #[error("The list of parts was not in ascending order. The parts list must be specified in order by part number.")]
    InvalidPartOrder,
    #[error("The XML you provided did not name any part.")]
    NoParts,
    #[error("Your proposed upload is smaller than the minimum allowed size: part {part_number} has {size} bytes")]
    EntityTooSmall { part_number: u32, size: u64 },
    #[error(
        "Your proposed upload exceeds the maximum allowed size: a part may have at most {limit} bytes ({size} given)"
    )]
    EntityTooLarge { size: u64, limit: u64 },
    #[error(
        "Your proposed upload exceeds the maximum allowed size: its parts would hold {size} bytes, objects at most {limit}"
    )]
    ObjectTooLarge { size: u64, limit: u64 },
    #[error(
        "The unfinished multipart uploads of this upload's access key would hold {held} bytes, more than \
         limits.max_unfinished_upload_bytes_per_key ({limit}): complete or abort unfinished uploads \
         (ListMultipartUploads; an operator lists them with `blobgate uploads list`)"
    )]
    QuotaExceeded { held: u64, limit: u64 },
    #[error("At least one of the pre-conditions you specified did not hold")]
    PreconditionFailed,
    /// Complete's full-object checksum is not the one the parts make.
    #[error("The {0} you specified did not match the calculated checksum.")]
    BadDigest(&'static str),
    #[error("The specified key does not exist.")]
    NoSuchKey,
    /// The object store did not take the assembled blob (or a part copy's source could not be read from it).
    #[error(transparent)]
    BlobStoreUnavailable(super::remote::RemoteError),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl MultipartError {
    /// The S3 error code (`NoSuchUpload` and `NoSuchBucket` are 404, `QuotaExceeded` 403 as in Ceph RGW, `Other`
    /// 500, the rest 400).
    pub fn s3_code(&self) -> &'static str {
        match self {
            MultipartError::NoSuchBucket(_) => "NoSuchBucket",
            MultipartError::NoSuchUpload => "NoSuchUpload",
            MultipartError::InvalidPartNumber(_) => "InvalidArgument",
            MultipartError::InvalidPart(_) => "InvalidPart",
            MultipartError::InvalidPartOrder => "InvalidPartOrder",
            MultipartError::NoParts => "MalformedXML",
            MultipartError::EntityTooSmall { .. } => "EntityTooSmall",
            MultipartError::EntityTooLarge { .. } | MultipartError::ObjectTooLarge { .. } => "EntityTooLarge",
            MultipartError::QuotaExceeded { .. } => "QuotaExceeded",
            MultipartError::PreconditionFailed => "PreconditionFailed",
            MultipartError::BadDigest(_) => "BadDigest",
            MultipartError::NoSuchKey => "NoSuchKey",
            MultipartError::BlobStoreUnavailable(_) => "ServiceUnavailable",
            MultipartError::Other(_) => "InternalError",
        }
    }

    /// The setting whose bound refused a part (`limits.<name>`), if that is why.
    pub fn refusing_limit(&self) -> Option<&'static str> {
        match self {
            MultipartError::EntityTooLarge { .. } => Some("max_upload_bytes"),
            MultipartError::ObjectTooLarge { .. } => Some("max_object_bytes"),
            MultipartError::QuotaExceeded { .. } => Some("max_unfinished_upload_bytes_per_key"),
            _ => None,
        }
    }
}

/// What bounds a multipart upload's parts (from `limits.*`; see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadLimits {
    /// One part: `limits.max_upload_bytes`, at most S3's [`MAX_PART_SIZE`].
    pub max_part_bytes: u64,
    /// An upload's parts together: `limits.max_object_bytes`.
    pub max_object_bytes: u64,
    /// Every part of the unfinished uploads one access key started: `limits.max_unfinished_upload_bytes_per_key`
    /// (`None`: off).
    pub max_unfinished_per_key: Option<u64>,
}

impl UploadLimits {
    /// S3's part maximum only (the tests' form).
    #[cfg(test)]
    pub const NONE: Self =
        UploadLimits { max_part_bytes: MAX_PART_SIZE, max_object_bytes: u64::MAX, max_unfinished_per_key: None };

    pub fn of(limits: &crate::config::Limits) -> Self {
        UploadLimits {
            max_part_bytes: limits.max_upload_bytes.min(MAX_PART_SIZE),
            max_object_bytes: limits.max_object_bytes,
            max_unfinished_per_key: Some(limits.max_unfinished_upload_bytes_per_key).filter(|&n| n > 0),
        }
    }

    /// Whether a part of `size` bytes may join what `held` says the other parts hold.
    fn check(&self, size: u64, held: HeldBytes) -> Result<(), MultipartError> {
        if size > self.max_part_bytes {
            return Err(MultipartError::EntityTooLarge { size, limit: self.max_part_bytes });
        }
        let total = held.upload.saturating_add(size);
        if total > self.max_object_bytes {
            return Err(MultipartError::ObjectTooLarge { size: total, limit: self.max_object_bytes });
        }
        // An upload from before creators were recorded counts for no key.
        match (self.max_unfinished_per_key, held.creator.map(|c| c.saturating_add(size))) {
            (Some(limit), Some(held)) if held > limit => Err(MultipartError::QuotaExceeded { held, limit }),
            _ => Ok(()),
        }
    }
}

impl From<MetadataError> for MultipartError {
    fn from(e: MetadataError) -> Self {
        StoreError::from(e).into()
    }
}

impl From<StoreError> for MultipartError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NoSuchBucket(b) => MultipartError::NoSuchBucket(b),
            StoreError::PreconditionFailed => MultipartError::PreconditionFailed,
            StoreError::NoSuchKey => MultipartError::NoSuchKey,
            StoreError::BlobStoreUnavailable(e) => MultipartError::BlobStoreUnavailable(e),
            StoreError::Other(e) => MultipartError::Other(e),
        }
    }
}

/// Removes a temp file when dropped (forgotten once the file has been moved into place).
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What a Complete asks for.
#[derive(Debug, Clone, Copy)]
pub struct Completion<'a> {
    pub upload_id: &'a str,
    /// The parts to assemble, by number and ETag, in ascending order.
    pub parts: &'a [(u32, String)],
    /// `limits.max_object_bytes`: a larger object is `ObjectTooLarge`, refused before anything is assembled. (The
    /// parts were held to it as they came; this catches a limit lowered since.)
    pub max_object_bytes: u64,
    /// What the key's current object must be for the commit to happen.
    pub condition: &'a WriteCondition,
    /// The object's full checksum the request presented (`x-amz-checksum-*` on Complete): one of the upload's
    /// algorithm that differs from what the parts make is `BadDigest`, and nothing is assembled.
    pub checksum: Option<&'a ObjectChecksum>,
}

impl<'a> Completion<'a> {
    /// No limit on the object's size and no precondition (the tests' form).
    #[cfg(test)]
    pub fn unbounded(upload_id: &'a str, parts: &'a [(u32, String)]) -> Self {
        Completion { upload_id, parts, max_object_bytes: u64::MAX, condition: &WriteCondition::Always, checksum: None }
    }
}

/// What Complete did: the object's put report, and its S3 ETag.
#[derive(Debug, Clone)]
pub struct CompleteReport {
    pub put: PutReport,
    /// The object's checksum, made from its parts' as the upload asked (`checksum::multipart_checksum`).
    pub checksum: Option<ObjectChecksum>,
    /// `"<hex MD5 of the concatenated binary part MD5s>-<parts>"`, quoted, as S3 computes it. Stored with the
    /// object (`Metadata::s3_etag`) while the object keeps this content.
    pub s3_etag: String,
}

/// The ETag S3 gives a multipart object: the MD5 of the parts' binary MD5s, then `-` and the part count, quoted.
pub fn multipart_etag<'a>(part_md5s: impl IntoIterator<Item = &'a str>) -> anyhow::Result<String> {
    let mut hasher = Md5::new();
    let mut count = 0usize;
    for md5 in part_md5s {
        hasher.update(hex::decode(md5).with_context(|| format!("a part MD5 is not hex: {md5:?}"))?);
        count += 1;
    }
    Ok(format!("\"{}-{count}\"", hex::encode(hasher.finalize())))
}

/// The object checksum of an upload created with `algorithm` and `kind`, from the chosen parts' checksums; none
/// when a part has none of the algorithm (an UploadPartCopy's: its bytes are copied, never read by us), rather than
/// refusing a Complete S3 would take (S3 computes it).
fn upload_checksum(algorithm: ChecksumAlgorithm, kind: ChecksumType, chosen: &[&PartRecord]) -> Option<ObjectChecksum> {
    let parts: Option<Vec<_>> =
        chosen.iter().map(|p| p.checksum.filter(|c| c.algorithm == algorithm).map(|c| (c, p.size))).collect();
    multipart_checksum(algorithm, kind, &parts?)
}

/// How often `Store::expire_uploads` looks: an eighth of the expiry, between 1 s and 1 h, so an upload lives at
/// most an eighth (or an hour) past its expiry.
pub fn expiry_check_every(expiry: Duration) -> Duration {
    (expiry / 8).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// An ETag as clients send it back (quoted or not, any case), for comparing.
fn bare_etag(etag: &str) -> String {
    etag.trim().trim_matches('"').to_ascii_lowercase()
}

/// A new upload id: the creation time in nanoseconds, then randomness, as 32 hex digits, so ids sort by age.
fn new_upload_id() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).expect("the OS random source is available");
    format!("{:016x}{}", nanos as u64, hex::encode(random))
}

impl Store {
    /// Starts an upload of `bucket/key`, by the access key `created_by`; the object gets `attrs` when it completes.
    pub async fn create_upload(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        attrs: ObjectAttrs,
        created_by: Option<&str>,
        checksum: Option<(ChecksumAlgorithm, ChecksumType)>,
    ) -> Result<UploadRecord, MultipartError> {
        let bucket_row = require_bucket(self.meta.bucket(bucket).await?, bucket)?;
        let upload = UploadRecord {
            id: new_upload_id(),
            bucket_id: bucket_row.id,
            key: key.to_string(),
            attrs,
            created_at: unix_now(),
            created_by: created_by.map(str::to_owned),
            checksum,
        };
        self.meta.create_upload(&upload).await?;
        Ok(upload)
    }

    /// The upload `upload_id` of `bucket/key`; any other upload, or none, is `NoSuchUpload`.
    pub async fn upload_of(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        upload_id: &str,
    ) -> Result<(Bucket, UploadRecord), MultipartError> {
        let bucket_row = require_bucket(self.meta.bucket(bucket).await?, bucket)?;
        let upload = self.meta.upload(upload_id).await?;
        let upload = upload.filter(|u| u.bucket_id == bucket_row.id && u.key == key.as_str());
        Ok((bucket_row, upload.ok_or(MultipartError::NoSuchUpload)?))
    }

    /// The ETag a CompleteMultipartUpload of `upload_id` answered when it committed `bucket/key` from the same
    /// part list: a retry whose first answer was lost gets it again, within [`COMPLETED_UPLOAD_MEMORY`] and while
    /// the object is still the one that Complete made (not replaced, not deleted). `None`: S3's `NoSuchUpload`.
    /// Another part list is not a retry of that Complete: it too gets `None`.
    pub async fn completed_upload(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        upload_id: &str,
        parts: &[(u32, String)],
    ) -> Result<Option<String>, MultipartError> {
        let Some(bucket_row) = self.meta.bucket(bucket).await? else { return Ok(None) };
        let since = unix_now().saturating_sub(COMPLETED_UPLOAD_MEMORY.as_secs() as i64);
        let Some(etag) = self.meta.completed_upload(upload_id, bucket_row.id, key.as_str(), since).await? else {
            return Ok(None);
        };
        // The ETag is the MD5 of the part MD5s in order: the same list gives the same ETag.
        let bare: Vec<String> = parts.iter().map(|(_, etag)| bare_etag(etag)).collect();
        let asked = multipart_etag(bare.iter().map(String::as_str));
        Ok(asked.is_ok_and(|asked| asked == etag).then_some(etag))
    }

    /// Whether part `part_number` of `size` bytes (when the request declares it) would fit within `limits`,
    /// judged outside the write lock: the early refusal, before a body is read or a range copied, of what
    /// `put_part` would refuse (it decides). Returns the upload; another upload's id, or none, is `NoSuchUpload`.
    pub async fn check_part_room(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        upload_id: &str,
        part_number: u32,
        size: Option<u64>,
        limits: &UploadLimits,
    ) -> Result<UploadRecord, MultipartError> {
        let (_, upload) = self.upload_of(bucket, key, upload_id).await?;
        if let Some(size) = size {
            let held = self.meta.held_bytes(upload_id, part_number, upload.created_by.as_deref()).await?;
            limits.check(size, held)?;
        }
        Ok(upload)
    }

    /// Stores a part, staged by a `BlobWriter` (its MD5 is the part's ETag), if it fits within `limits`. A part
    /// with the same number is replaced, and its file removed once the new row is committed.
    pub async fn put_part(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        upload_id: &str,
        part_number: u32,
        staged: super::StagedBlob,
        limits: &UploadLimits,
    ) -> Result<PartRecord, MultipartError> {
        if !(1..=MAX_PART_NUMBER).contains(&part_number) {
            return Err(MultipartError::InvalidPartNumber(part_number));
        }
        let name = BlobStore::new_part_name();
        let uploaded_at = unix_now();
        // With an object store, the part goes there first (before the lock, as a blob does), so that any replica
        // can complete the upload; the local file is this replica's cache of it.
        if let Some(cache) = &self.cache {
            let path = staged.path().to_owned();
            cache.remote().upload_part(path, &name, staged.size).await.map_err(MultipartError::BlobStoreUnavailable)?;
        }
        let stored =
            self.put_part_as(bucket, key, upload_id, part_number, staged, limits, (name.clone(), uploaded_at)).await;
        if stored.is_err() && self.cache.is_some() {
            self.remove_part_files(vec![name]).await;
        }
        stored
    }

    #[allow(clippy::too_many_arguments)]
    async fn put_part_as(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        upload_id: &str,
        part_number: u32,
        staged: super::StagedBlob,
        limits: &UploadLimits,
        (name, uploaded_at): (String, i64),
    ) -> Result<PartRecord, MultipartError> {
        let md5 = staged.md5.clone().context("a part must be staged by a BlobWriter, which computes its MD5")?;
        let mut tx = self.meta.lock_blob_refs().await?;
        // The store sweep takes a part without a row once it is `grace` old: this one's row must come well before.
        if self.cache.is_some()
            && unix_now().saturating_sub(uploaded_at) > super::store_deletes::max_put_span(self.grace)
        {
            return Err(MultipartError::BlobStoreUnavailable(super::remote::RemoteError::Unavailable(
                "the part's upload took too long to be committed safely; send it again".into(),
            )));
        }
        let bucket_row = require_bucket(tx.bucket(bucket).await?, bucket)?;
        let upload = tx.upload(upload_id).await?;
        let Some(upload) = upload.filter(|u| u.bucket_id == bucket_row.id && u.key == key.as_str()) else {
            return Err(MultipartError::NoSuchUpload);
        };
        // Decided here, in the transaction that writes the row: no other part is installed meanwhile.
        let held = tx.held_bytes(upload_id, part_number, upload.created_by.as_deref()).await?;
        limits.check(staged.size, held)?;
        let part = PartRecord {
            part_number,
            size: staged.size,
            staged_name: name,
            md5,
            sha256: staged.sha256.clone(),
            created_at: unix_now(),
            checksum: staged.checksum,
        };
        // Under the write lock, so the sweep (which checks under it too) never takes the file for an orphan.
        let blobs = self.blobs.clone();
        let name = part.staged_name.clone();
        tokio::task::spawn_blocking(move || blobs.install_part(&staged, &name))
            .await
            .context("part install task failed")??;
        let committed = async {
            let previous = tx.upsert_part(upload_id, &part).await?;
            tx.commit_without_announcing().await?;
            Ok::<_, MetadataError>(previous)
        }
        .await;
        match committed {
            Ok(previous) => {
                if let Some(previous) = previous {
                    self.remove_part_files(vec![previous]).await;
                }
                Ok(part)
            }
            Err(e) => {
                self.remove_part_files(vec![part.staged_name]).await;
                Err(e.into())
            }
        }
    }

    /// Up to `limit` parts of the upload after part number `after`, and whether more follow.
    pub async fn list_parts(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        upload_id: &str,
        after: u32,
        limit: u32,
    ) -> Result<(Vec<PartRecord>, bool), MultipartError> {
        self.upload_of(bucket, key, upload_id).await?;
        let mut parts = self.meta.list_parts(upload_id, after, limit.saturating_add(1)).await?;
        let truncated = parts.len() > limit as usize;
        parts.truncate(limit as usize);
        Ok((parts, truncated))
    }

    /// Up to `limit` uploads in progress in `bucket` under `prefix`, by key then age, after `after` (key marker,
    /// upload id marker), and whether more follow.
    pub async fn list_uploads(
        &self,
        bucket: &BucketName,
        prefix: &str,
        after: Option<(&str, Option<&str>)>,
        limit: u32,
    ) -> Result<(Vec<UploadRecord>, bool), MultipartError> {
        let bucket_row = require_bucket(self.meta.bucket(bucket).await?, bucket)?;
        let mut uploads = self.meta.list_uploads(bucket_row.id, prefix, after, limit.saturating_add(1)).await?;
        let truncated = uploads.len() > limit as usize;
        uploads.truncate(limit as usize);
        Ok((uploads, truncated))
    }

    /// Aborts the upload: its rows go, then its part files.
    pub async fn abort_upload(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        upload_id: &str,
    ) -> Result<(), MultipartError> {
        self.upload_of(bucket, key, upload_id).await?;
        if !self.abort_upload_by_id(upload_id).await? {
            return Err(MultipartError::NoSuchUpload);
        }
        Ok(())
    }

    /// Aborts uploads started more than `age` ago (S3's AbortIncompleteMultipartUpload rule); returns how many.
    pub async fn abort_uploads_older_than(&self, age: Duration) -> Result<u64, MultipartError> {
        let before = unix_now().saturating_sub(i64::try_from(age.as_secs()).unwrap_or(i64::MAX));
        self.abort_uploads_created_before(before).await
    }

    /// Runs until dropped: every [`expiry_check_every`]`(expiry)` (the first at once), aborts the uploads
    /// started more than `expiry` ago and tells `expired` how many it aborted. Safe beside replicas doing the
    /// same on one database: each abort deletes the upload's rows under the blob-reference lock and removes its
    /// part files only if it was the one that deleted them, so an upload is aborted (and counted) once. An error
    /// (the database away) is logged and the next round retries.
    pub async fn expire_uploads(self, expiry: Duration, expired: impl Fn(u64)) {
        let mut tick = tokio::time::interval(expiry_check_every(expiry));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.abort_uploads_older_than(expiry).await {
                Ok(0) => {}
                Ok(count) => {
                    tracing::info!(count, expiry = %humantime::format_duration(expiry), "aborted expired multipart uploads");
                    expired(count);
                }
                Err(e) => tracing::warn!(error = %e, "aborting expired multipart uploads failed; will retry"),
            }
        }
    }

    /// Aborts uploads created before `before` (unix seconds); returns how many.
    pub async fn abort_uploads_created_before(&self, before: i64) -> Result<u64, MultipartError> {
        let mut aborted = 0;
        loop {
            let ids = self.meta.uploads_created_before(before, ABORT_BATCH).await?;
            for id in &ids {
                aborted += u64::from(self.abort_upload_by_id(id).await?);
            }
            if ids.len() < ABORT_BATCH as usize {
                return Ok(aborted);
            }
        }
    }

    async fn abort_upload_by_id(&self, upload_id: &str) -> Result<bool, MultipartError> {
        let mut tx = self.meta.lock_blob_refs().await?;
        let Some(names) = tx.delete_upload(upload_id).await? else {
            return Ok(false);
        };
        tx.commit_without_announcing().await?;
        self.remove_part_files(names).await;
        Ok(true)
    }

    /// Completes an upload as `completion` says: assembles the named parts into one blob and commits it as
    /// `bucket/key`, as a put does. Parts uploaded but not named are discarded with the upload.
    pub async fn complete_upload(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        completion: Completion<'_>,
    ) -> Result<CompleteReport, MultipartError> {
        self.complete_upload_hooked(bucket, key, completion, |_| Ok(())).await
    }

    /// [`Store::complete_upload`], with `before_commit` called in the transaction just before it commits (the tests
    /// fail it there, as a crash would).
    async fn complete_upload_hooked(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        completion: Completion<'_>,
        before_commit: impl FnOnce(&mut WriteTx) -> anyhow::Result<()>,
    ) -> Result<CompleteReport, MultipartError> {
        let Completion { upload_id, parts, max_object_bytes, condition, checksum: presented } = completion;
        if parts.is_empty() {
            return Err(MultipartError::NoParts);
        }
        if parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(MultipartError::InvalidPartOrder);
        }
        let (_, upload) = self.upload_of(bucket, key, upload_id).await?;
        let uploaded = self.meta.list_parts(upload_id, 0, MAX_PART_NUMBER).await?;
        let chosen = match choose_parts(&uploaded, parts, max_object_bytes) {
            // An Abort between reading the upload and its parts takes both at once: the upload is gone, not a part.
            Err(MultipartError::InvalidPart(_))
                if matches!(self.upload_of(bucket, key, upload_id).await, Err(MultipartError::NoSuchUpload)) =>
            {
                return Err(MultipartError::NoSuchUpload);
            }
            chosen => chosen?,
        };
        let s3_etag = multipart_etag(chosen.iter().map(|p| p.md5.as_str()))?;
        let checksum = upload.checksum.and_then(|(algorithm, kind)| upload_checksum(algorithm, kind, &chosen));
        if let (Some(presented), Some(made)) = (presented, checksum)
            && made.kind == ChecksumType::FullObject
            && presented.algorithm == made.algorithm
            && presented.digest() != made.digest()
        {
            return Err(MultipartError::BadDigest(made.algorithm.name()));
        }

        // One Complete at a time per upload, on every replica: the others get NoSuchUpload (S3's answer once the
        // upload is completed), and none assembles a second copy.
        let claimed_at = unix_now();
        let stale_before = claimed_at.saturating_sub(COMPLETE_CLAIM_LEASE.as_secs() as i64);
        if !self.meta.claim_upload(upload_id, claimed_at, stale_before).await? {
            return Err(MultipartError::NoSuchUpload);
        }
        let completed = self
            .assemble_and_commit(bucket, key, upload, &chosen, (&s3_etag, checksum.as_ref()), condition, before_commit)
            .await;
        if completed.is_err() {
            // The upload stays as it was (or is gone, if aborted meanwhile): a later Complete may try again.
            if let Err(e) = self.meta.release_upload_claim(upload_id, claimed_at).await {
                tracing::warn!(error = %e, "cannot release a Complete's claim; it lapses after the lease");
            }
        }
        Ok(CompleteReport { put: completed?, checksum, s3_etag })
    }

    /// The claimed part of Complete: assembles the chosen parts into a staged blob and commits it. A failed
    /// assembly is judged under the lock: an upload aborted or a part replaced meanwhile (its file removed) is
    /// the client's `NoSuchUpload` / `InvalidPart`, never an internal error.
    #[allow(clippy::too_many_arguments)]
    async fn assemble_and_commit(
        &self,
        bucket: &BucketName,
        key: &ObjectKey,
        upload: UploadRecord,
        chosen: &[&PartRecord],
        (s3_etag, checksum): (&str, Option<&ObjectChecksum>),
        condition: &WriteCondition,
        before_commit: impl FnOnce(&mut WriteTx) -> anyhow::Result<()>,
    ) -> Result<PutReport, MultipartError> {
        let upload_id = upload.id.as_str();
        let blobs = self.blobs.clone();
        let files: Vec<(String, u64)> = chosen.iter().map(|p| (p.staged_name.clone(), p.size)).collect();
        // Parts another replica took are fetched from the object store first.
        self.fetch_missing_parts(&files).await?;
        let assembled = tokio::task::spawn_blocking(move || blobs.assemble(&files))
            .await
            .context("assemble task failed")?
            .context("cannot assemble the parts");
        let mut attempt = 1;
        let mut tx = loop {
            let stored = match &assembled {
                Ok(staged) => self.upload_blobs(&[staged]).await?,
                Err(_) => None,
            };
            let mut tx = self.meta.lock_blob_refs().await?;
            let still = match &assembled {
                Ok(staged) => self.blobs_still_stored(&mut tx, &[staged], stored.as_ref()).await?,
                Err(_) => true,
            };
            if still {
                break tx;
            }
            drop(tx);
            attempt = super::next_store_attempt(attempt)?;
        };
        let bucket_row = require_bucket(tx.bucket(bucket).await?, bucket)?;
        // Aborted, completed or changed by a part upload since the parts were read: assemble nothing stale.
        if !tx.upload(upload_id).await?.is_some_and(|u| u.bucket_id == bucket_row.id && u.key == key.as_str()) {
            return Err(MultipartError::NoSuchUpload);
        }
        let now_parts = tx.parts(upload_id).await?;
        if let Some(changed) = chosen
            .iter()
            .find(|p| !now_parts.iter().any(|q| q.part_number == p.part_number && q.staged_name == p.staged_name))
        {
            return Err(MultipartError::InvalidPart(changed.part_number));
        }
        // A failed precondition leaves the upload as it is, for a Complete without it (or after a change) to finish.
        super::check_write_condition(&mut tx, &bucket_row, key, condition).await?;
        let staged = assembled?;
        let part_files = tx.delete_upload(upload_id).await?.unwrap_or_default();
        let (put, retired) = self.write_object(&mut tx, &bucket_row, key, staged, upload.attrs, Vec::new()).await?;
        let last_steps = async {
            let part_sizes: Vec<u64> = chosen.iter().map(|p| p.size).collect();
            tx.set_s3_etag(bucket_row.id, key.as_str(), &put.sha256, s3_etag, Some(&part_sizes), checksum).await?;
            let now = unix_now();
            let forget_before = now.saturating_sub(COMPLETED_UPLOAD_MEMORY.as_secs() as i64);
            let object = (bucket_row.id, key.as_str());
            tx.record_completion(upload_id, object, (&put.sha256, s3_etag), now, forget_before).await?;
            before_commit(&mut tx)
        };
        if let Err(e) = last_steps.await {
            restore_all(retired)?;
            return Err(e.into());
        }
        finish_commit(tx, retired).await?;
        self.schedule_store_deletes();
        self.remove_part_files(part_files).await;
        Ok(put)
    }

    /// With an object store: fetches into `parts/` each of `files` (name, size) this replica does not hold.
    async fn fetch_missing_parts(&self, files: &[(String, u64)]) -> Result<(), MultipartError> {
        let Some(cache) = &self.cache else { return Ok(()) };
        for (name, size) in files {
            let blobs = self.blobs.clone();
            let part = blobs.part_path(name);
            let present = tokio::task::spawn_blocking(move || part.is_file()).await.context("part check failed")?;
            if present {
                continue;
            }
            let blobs = self.blobs.clone();
            let (file, temp) = tokio::task::spawn_blocking(move || blobs.stage_part_fetch())
                .await
                .context("part fetch failed")?
                .context("cannot create a temp file for a fetched part")?;
            // The temp file goes if anything below fails.
            let cleanup = TempFile(temp.clone());
            let file = Arc::new(file);
            cache.remote().fetch_part(name, *size, file.clone()).await.map_err(MultipartError::BlobStoreUnavailable)?;
            let (blobs, name) = (self.blobs.clone(), name.clone());
            tokio::task::spawn_blocking(move || {
                file.sync_all().context("cannot sync a fetched part")?;
                blobs.install_fetched_part(&temp, &name)
            })
            .await
            .context("part install failed")??;
            std::mem::forget(cleanup);
        }
        Ok(())
    }

    /// Removes part files no row names any more (best effort: what fails is left to the sweep), and with an
    /// object store their store objects too.
    pub(super) async fn remove_part_files(&self, names: Vec<String>) {
        if names.is_empty() {
            return;
        }
        if let Some(cache) = self.cache.clone() {
            let names = names.clone();
            tokio::spawn(async move {
                for name in names {
                    if let Err(e) = cache.remote().delete_part(&name).await {
                        tracing::warn!(part = name, error = %e, "could not delete a part from the object store; the sweep will");
                    }
                }
            });
        }
        let blobs = self.blobs.clone();
        let removed = tokio::task::spawn_blocking(move || names.iter().for_each(|n| blobs.remove_part(n))).await;
        if let Err(e) = removed {
            tracing::warn!(error = %e, "part file removal task failed; the next sweep removes them");
        }
    }

    /// Removes part files that no part row names (a crash between staging and commit, or after a commit that
    /// replaced or dropped them). Checked under the write lock, which every part install holds, one batch of
    /// names per hold.
    pub(super) async fn sweep_part_files(&self) -> anyhow::Result<usize> {
        let blobs = self.blobs.clone();
        let names =
            tokio::task::spawn_blocking(move || blobs.list_part_names()).await.context("sweep task failed")??;
        let mut count = 0;
        for batch in names.chunks(super::SWEEP_BATCH) {
            let mut tx = self.meta.lock_blob_refs().await?;
            let referenced = tx.referenced_part_files(batch).await?;
            let orphans: Vec<String> = batch.iter().filter(|n| !referenced.contains(*n)).cloned().collect();
            // Removed while the lock is held: a part install (which holds it) cannot be between rename and commit.
            let blobs = self.blobs.clone();
            count += orphans.len();
            tokio::task::spawn_blocking(move || orphans.iter().for_each(|n| blobs.remove_part(n)))
                .await
                .context("sweep task failed")?;
            tx.commit_without_announcing().await?;
        }
        Ok(count)
    }
}

/// The uploaded parts that `wanted` names, in its order: each must exist with the ETag given, every part but
/// the last must have at least `MIN_PART_SIZE` bytes, and together at most `max_object_bytes`.
fn choose_parts<'a>(
    uploaded: &'a [PartRecord],
    wanted: &[(u32, String)],
    max_object_bytes: u64,
) -> Result<Vec<&'a PartRecord>, MultipartError> {
    let mut chosen = Vec::with_capacity(wanted.len());
    for (number, etag) in wanted {
        let part = uploaded
            .iter()
            .find(|p| p.part_number == *number && p.md5 == bare_etag(etag))
            .ok_or(MultipartError::InvalidPart(*number))?;
        chosen.push(part);
    }
    if let Some(small) = chosen[..chosen.len() - 1].iter().find(|p| p.size < MIN_PART_SIZE) {
        return Err(MultipartError::EntityTooSmall { part_number: small.part_number, size: small.size });
    }
    let size = chosen.iter().fold(0u64, |sum, p| sum.saturating_add(p.size));
    if size > max_object_bytes {
        return Err(MultipartError::ObjectTooLarge { size, limit: max_object_bytes });
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use sha2::Sha256;

    use super::*;
    use crate::store::BucketDeletion;
    use crate::store::metadata::{TestBackend, on_both_backends, test_database_url};

    const BUCKET: &str = "bkt";

    async fn store(backend: TestBackend) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = test_database_url(backend, dir.path()).await;
        let store = Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        store.meta.create_bucket(&BucketName::parse(BUCKET).unwrap(), false, 0).await.unwrap();
        (dir, store)
    }

    /// Two stores on one database and one data dir, as two replicas are, with the bucket.
    async fn two_replicas(backend: TestBackend) -> (tempfile::TempDir, Store, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = test_database_url(backend, dir.path()).await;
        let first = Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        let second = Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        first.meta.create_bucket(&BucketName::parse(BUCKET).unwrap(), false, 0).await.unwrap();
        (dir, first, second)
    }

    fn names(key: &str) -> (BucketName, ObjectKey) {
        (BucketName::parse(BUCKET).unwrap(), ObjectKey::parse(key).unwrap())
    }

    /// `len` bytes of a pattern that differs by `seed`.
    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    async fn put(store: &Store, key: &str, upload: &str, number: u32, content: &[u8]) -> PartRecord {
        let (b, k) = names(key);
        let mut w = store.blobs.writer().unwrap();
        w.write(content).unwrap();
        store.put_part(&b, &k, upload, number, w.finish().unwrap(), &UploadLimits::NONE).await.unwrap()
    }

    fn stage(store: &Store, content: &[u8]) -> crate::store::StagedBlob {
        let mut w = store.blobs.writer().unwrap();
        w.write(content).unwrap();
        w.finish().unwrap()
    }

    fn files(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    fn hex_md5(content: &[u8]) -> String {
        hex::encode(Md5::digest(content))
    }

    #[test]
    fn the_multipart_etag_is_the_md5_of_the_part_md5s() {
        let parts = [hex_md5(b"a"), hex_md5(b"b")];
        assert_eq!(parts[0], "0cc175b9c0f1b6a831c399e269772661");
        let etag = multipart_etag(parts.iter().map(String::as_str)).unwrap();
        // python3: hashlib.md5(md5(b'a').digest() + md5(b'b').digest()).hexdigest()
        assert_eq!(etag, "\"96e024ba2074fe77e8e965ba43a704be-2\"");
        assert!(multipart_etag(["zz"]).is_err());
    }

    on_both_backends!(parts_complete_into_one_object_visible_only_then);
    async fn parts_complete_into_one_object_visible_only_then(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let (b, k) = names("big.bin");
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        assert_eq!(upload.id.len(), 32);
        let one = bytes(MIN_PART_SIZE as usize, 1);
        let two_old = bytes(MIN_PART_SIZE as usize + 7, 2);
        let two = bytes(MIN_PART_SIZE as usize + 3, 3);
        let three = bytes(1000, 4);
        let p3 = put(&store, "big.bin", &upload.id, 3, &three).await;
        let p1 = put(&store, "big.bin", &upload.id, 1, &one).await;
        put(&store, "big.bin", &upload.id, 2, &two_old).await;
        let p2 = put(&store, "big.bin", &upload.id, 2, &two).await;
        assert_eq!(p1.etag(), format!("\"{}\"", hex_md5(&one)), "a part's ETag is its quoted MD5");
        assert_eq!(p2.size, two.len() as u64);
        assert_eq!(files(&dir.path().join("parts")).len(), 3, "the replaced part's file went");
        let (listed, truncated) = store.list_parts(&b, &k, &upload.id, 0, 2).await.unwrap();
        assert_eq!((listed.iter().map(|p| p.part_number).collect::<Vec<_>>(), truncated), (vec![1, 2], true));

        // Nothing is visible before Complete.
        let bucket_id = store.meta.bucket(&b).await.unwrap().unwrap().id;
        assert!(store.meta.object_by_key(bucket_id, k.as_str()).await.unwrap().is_none());
        assert!(store.meta.list_objects_page(bucket_id, "", None, 10).await.unwrap().is_empty());
        assert!(store.blobs.list_hashes().unwrap().is_empty());

        let wanted = vec![(1, p1.etag()), (2, p2.md5.to_uppercase()), (3, p3.etag())];
        let report = store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &wanted)).await.unwrap();
        let whole = [one.as_slice(), &two, &three].concat();
        assert_eq!(report.put.sha256, hex::encode(Sha256::digest(&whole)));
        assert_eq!(report.put.size, whole.len() as u64);
        assert_eq!(std::fs::read(store.blobs.path_of(&report.put.sha256)).unwrap(), whole);
        let want_etag = multipart_etag([hex_md5(&one), hex_md5(&two), hex_md5(&three)].iter().map(String::as_str));
        assert_eq!(report.s3_etag, want_etag.unwrap());
        assert!(report.s3_etag.ends_with("-3\""));
        assert_eq!(store.meta.s3_etag(bucket_id, k.as_str()).await.unwrap(), Some(report.s3_etag.clone()));
        let object = store.meta.object_by_key(bucket_id, k.as_str()).await.unwrap().unwrap();
        assert_eq!((object.sha256, object.size), (report.put.sha256.clone(), whole.len() as u64));

        assert!(files(&dir.path().join("parts")).is_empty(), "the parts went with the upload");
        assert!(files(&dir.path().join("tmp")).is_empty());
        assert!(matches!(store.upload_of(&b, &k, &upload.id).await, Err(MultipartError::NoSuchUpload)));
        assert_eq!(
            store.sweep(Duration::ZERO).await.unwrap(),
            crate::store::SweepReport::default(),
            "nothing left over"
        );
    }

    fn crc32c(content: &[u8]) -> ObjectChecksum {
        let mut summer = crate::header_values::checksum::Checksummer::new(ChecksumAlgorithm::Crc32c);
        summer.update(content);
        ObjectChecksum::of(&summer.finish()).unwrap()
    }

    /// An upload of `sums.bin` asking for CRC32C of `kind`, its parts sent with their checksum or without, completed.
    async fn complete_with_checksums(store: &Store, kind: ChecksumType, parts: &[(&[u8], bool)]) -> CompleteReport {
        let (b, k) = names("sums.bin");
        let checksum = Some((ChecksumAlgorithm::Crc32c, kind));
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, checksum).await.unwrap();
        let mut wanted = Vec::new();
        for (number, (content, with_checksum)) in (1..).zip(parts) {
            let mut staged = stage(store, content);
            staged.checksum = with_checksum.then(|| crc32c(content));
            let part = store.put_part(&b, &k, &upload.id, number, staged, &UploadLimits::NONE).await.unwrap();
            assert_eq!(part.checksum, with_checksum.then(|| crc32c(content)), "a part keeps its checksum");
            wanted.push((number, part.etag()));
        }
        let listed = store.meta.upload(&upload.id).await.unwrap().unwrap();
        assert_eq!(listed.checksum, checksum, "the upload keeps what it asked for");
        store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &wanted)).await.unwrap()
    }

    on_both_backends!(complete_makes_the_object_checksum_from_its_parts_and_keeps_it_with_the_object);
    async fn complete_makes_the_object_checksum_from_its_parts_and_keeps_it_with_the_object(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let (one, two) = (bytes(MIN_PART_SIZE as usize, 5), bytes(1000, 6));
        let bucket_id = store.meta.bucket(&names("sums.bin").0).await.unwrap().unwrap().id;
        let stored = || async { store.meta.object_by_key(bucket_id, "sums.bin").await.unwrap().unwrap().checksum };
        let sized = [(crc32c(&one), one.len() as u64), (crc32c(&two), two.len() as u64)];

        let report = complete_with_checksums(&store, ChecksumType::Composite, &[(&one, true), (&two, true)]).await;
        let composite = multipart_checksum(ChecksumAlgorithm::Crc32c, ChecksumType::Composite, &sized);
        assert_eq!(report.checksum, composite);
        assert!(report.checksum.unwrap().value().ends_with("-2"));
        assert_eq!(stored().await, composite, "stored with the object, read back with its row");

        let report = complete_with_checksums(&store, ChecksumType::FullObject, &[(&one, true), (&two, true)]).await;
        let whole = crc32c(&[one.as_slice(), &two].concat());
        assert_eq!(report.checksum.map(|c| c.value()), Some(whole.value()), "the parts' CRCs make the whole one");
        assert_eq!(stored().await.map(|c| (c.kind, c.value())), Some((ChecksumType::FullObject, whole.value())));

        // A wrong full-object checksum on Complete: BadDigest, and the object stays as it was.
        let (b, k) = names("sums.bin");
        let full = Some((ChecksumAlgorithm::Crc32c, ChecksumType::FullObject));
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, full).await.unwrap();
        let mut staged = stage(&store, &two);
        staged.checksum = Some(crc32c(&two));
        let part = store.put_part(&b, &k, &upload.id, 1, staged, &UploadLimits::NONE).await.unwrap();
        let (wanted, wrong) = (vec![(1, part.etag())], crc32c(b"other"));
        let completion = Completion { checksum: Some(&wrong), ..Completion::unbounded(&upload.id, &wanted) };
        let err = store.complete_upload(&b, &k, completion).await.unwrap_err();
        assert!(matches!(err, MultipartError::BadDigest("CRC32C")), "{err:?}");
        assert_eq!(stored().await.map(|c| c.value()), Some(whole.value()), "nothing changed");
        let right = crc32c(&two);
        let completion = Completion { checksum: Some(&right), ..Completion::unbounded(&upload.id, &wanted) };
        store.complete_upload(&b, &k, completion).await.unwrap();
        assert_eq!(stored().await.map(|c| c.value()), Some(right.value()));

        // A part without one (an UploadPartCopy's): the object keeps no checksum but its SHA-256, as before.
        let report = complete_with_checksums(&store, ChecksumType::Composite, &[(&one, true), (&two, false)]).await;
        assert_eq!(report.checksum, None);
        assert_eq!(stored().await, None);
    }

    on_both_backends!(complete_keeps_the_upload_attrs_and_replaces_like_a_put);
    async fn complete_keeps_the_upload_attrs_and_replaces_like_a_put(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let (b, k) = names("doc.txt");
        let old = stage(&store, b"old");
        let first = store.put(&b, &k, old, ObjectAttrs::default()).await.unwrap();
        let attrs = ObjectAttrs { content_type: Some("text/x-mine".into()), ..ObjectAttrs::default() };
        let upload = store.create_upload(&b, &k, attrs, None, None).await.unwrap();
        let p = put(&store, "doc.txt", &upload.id, 1, b"new content").await;
        let report = store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &[(1, p.etag())])).await.unwrap();
        assert_eq!(report.put.status, crate::store::PutStatus::Replaced);
        assert_eq!(report.put.content_type, "text/x-mine");
        assert!(!store.blobs.path_of(&first.sha256).exists(), "the replaced blob went, as with a put");
        let bucket_id = store.meta.bucket(&b).await.unwrap().unwrap().id;
        assert_eq!(store.meta.s3_etag(bucket_id, k.as_str()).await.unwrap(), Some(report.s3_etag));
        // A native put of other content: the multipart ETag no longer describes the object; its MD5 does.
        store.put(&b, &k, stage(&store, b"native"), ObjectAttrs::default()).await.unwrap();
        let md5 = format!("\"{}\"", hex::encode(Md5::digest(b"native")));
        assert_eq!(store.meta.s3_etag(bucket_id, k.as_str()).await.unwrap(), Some(md5));
    }

    on_both_backends!(a_committed_complete_is_remembered_while_its_object_stays);
    async fn a_committed_complete_is_remembered_while_its_object_stays(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let (b, k) = names("done.bin");
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let p1 = put(&store, "done.bin", &upload.id, 1, &bytes(MIN_PART_SIZE as usize, 1)).await;
        let p2 = put(&store, "done.bin", &upload.id, 2, b"tail").await;
        let parts = [(1, p1.etag()), (2, p2.etag())];
        let report = store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &parts)).await.unwrap();
        let again = store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &parts)).await;
        assert!(matches!(again, Err(MultipartError::NoSuchUpload)), "the upload itself is gone");
        let remembered = store.completed_upload(&b, &k, &upload.id, &parts).await.unwrap();
        assert_eq!(remembered.as_deref(), Some(report.s3_etag.as_str()));
        let unquoted = [(1, p1.etag().trim_matches('"').to_uppercase()), (2, p2.etag())];
        assert_eq!(store.completed_upload(&b, &k, &upload.id, &unquoted).await.unwrap(), remembered);
        assert_eq!(store.completed_upload(&b, &k, &upload.id, &parts[..1]).await.unwrap(), None, "other parts");
        let (_, other_key) = names("other.bin");
        assert_eq!(store.completed_upload(&b, &other_key, &upload.id, &parts).await.unwrap(), None);
        assert_eq!(store.completed_upload(&b, &k, "no-such-upload", &parts).await.unwrap(), None);
        let bucket_id = store.meta.bucket(&b).await.unwrap().unwrap().id;
        let now = unix_now();
        let found = |since| store.meta.completed_upload(&upload.id, bucket_id, k.as_str(), since);
        assert!(found(now - 1).await.unwrap().is_some());
        assert_eq!(found(now + 1).await.unwrap(), None, "remembered for a bounded time only");
        // The same content put again is another object: its S3 ETag is its MD5, and the Complete is not replayed.
        let content = [bytes(MIN_PART_SIZE as usize, 1), b"tail".to_vec()].concat();
        store.put(&b, &k, stage(&store, &content), ObjectAttrs::default()).await.unwrap();
        assert_eq!(store.completed_upload(&b, &k, &upload.id, &parts).await.unwrap(), None, "overwritten");
    }

    on_both_backends!(bad_part_lists_are_refused_and_store_nothing);
    async fn bad_part_lists_are_refused_and_store_nothing(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let (b, k) = names("k");
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let p1 = put(&store, "k", &upload.id, 1, &bytes(100, 1)).await;
        let p2 = put(&store, "k", &upload.id, 2, &bytes(100, 2)).await;
        let cases: Vec<(Vec<(u32, String)>, &str)> = vec![
            (vec![], "MalformedXML"),
            (vec![(2, p2.etag()), (1, p1.etag())], "InvalidPartOrder"),
            (vec![(1, p1.etag()), (1, p1.etag())], "InvalidPartOrder"),
            (vec![(1, p1.etag()), (3, p2.etag())], "InvalidPart"),
            (vec![(1, p2.etag())], "InvalidPart"),
            (vec![(1, "\"not-it\"".into())], "InvalidPart"),
            (vec![(1, p1.etag()), (2, p2.etag())], "EntityTooSmall"),
        ];
        for (parts, code) in cases {
            let err = store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &parts)).await.unwrap_err();
            assert_eq!(err.s3_code(), code, "{parts:?}: {err}");
        }
        let other_key = ObjectKey::parse("other").unwrap();
        for (key, id) in [(&k, "nope"), (&other_key, upload.id.as_str())] {
            let err = store.complete_upload(&b, key, Completion::unbounded(id, &[(1, p1.etag())])).await.unwrap_err();
            assert_eq!(err.s3_code(), "NoSuchUpload");
        }
        let err = store
            .complete_upload(&BucketName::parse("nob").unwrap(), &k, Completion::unbounded(&upload.id, &[]))
            .await
            .unwrap_err();
        assert_eq!(err.s3_code(), "MalformedXML", "the part list is checked first");
        let bucket_id = store.meta.bucket(&b).await.unwrap().unwrap().id;
        assert!(store.meta.object_by_key(bucket_id, "k").await.unwrap().is_none());
        assert!(store.blobs.list_hashes().unwrap().is_empty());
        assert!(files(&dir.path().join("tmp")).is_empty());
        assert_eq!(store.list_parts(&b, &k, &upload.id, 0, 10).await.unwrap().0.len(), 2, "the upload is intact");
        // The last part alone may be small.
        store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &[(2, p2.etag())])).await.unwrap();
    }

    on_both_backends!(put_part_checks_the_number_and_the_upload);
    async fn put_part_checks_the_number_and_the_upload(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let (b, k) = names("k");
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let staged = |store: &Store| {
            let mut w = store.blobs.writer().unwrap();
            w.write(b"hello").unwrap();
            w.finish().unwrap()
        };
        for n in [0, MAX_PART_NUMBER + 1] {
            let err = store.put_part(&b, &k, &upload.id, n, staged(&store), &UploadLimits::NONE).await.unwrap_err();
            assert_eq!(err.s3_code(), "InvalidArgument", "{n}");
        }
        let other = ObjectKey::parse("other").unwrap();
        for (key, id) in [(&k, "nope"), (&other, upload.id.as_str())] {
            let err = store.put_part(&b, key, id, 1, staged(&store), &UploadLimits::NONE).await.unwrap_err();
            assert_eq!(err.s3_code(), "NoSuchUpload");
        }
        assert!(files(&dir.path().join("tmp")).is_empty(), "refused parts leave no staged file");
        assert!(files(&dir.path().join("parts")).is_empty());
        let part =
            store.put_part(&b, &k, &upload.id, MAX_PART_NUMBER, staged(&store), &UploadLimits::NONE).await.unwrap();
        assert_eq!(part.etag(), "\"5d41402abc4b2a76b9719d911017c592\"", "md5(hello)");
    }

    on_both_backends!(abort_removes_the_parts_and_old_uploads_are_reclaimed);
    async fn abort_removes_the_parts_and_old_uploads_are_reclaimed(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let (b, k) = names("k");
        let kept = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let aborted = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        put(&store, "k", &kept.id, 1, b"keep").await;
        put(&store, "k", &aborted.id, 1, b"one").await;
        put(&store, "k", &aborted.id, 2, b"two").await;
        let (uploads, truncated) = store.list_uploads(&b, "", None, 10).await.unwrap();
        assert_eq!(
            (uploads.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(), truncated),
            (vec![&*kept.id, &*aborted.id], false)
        );
        store.abort_upload(&b, &k, &aborted.id).await.unwrap();
        assert_eq!(files(&dir.path().join("parts")).len(), 1);
        assert!(matches!(store.abort_upload(&b, &k, &aborted.id).await, Err(MultipartError::NoSuchUpload)));

        assert_eq!(store.abort_uploads_older_than(Duration::from_secs(3600)).await.unwrap(), 0, "still young");
        assert_eq!(store.abort_uploads_created_before(kept.created_at).await.unwrap(), 0, "not before itself");
        // An hour on, as a dead client's upload would be.
        assert_eq!(store.abort_uploads_created_before(kept.created_at + 3600).await.unwrap(), 1);
        assert!(files(&dir.path().join("parts")).is_empty());
        assert!(store.list_uploads(&b, "", None, 10).await.unwrap().0.is_empty());
    }

    #[test]
    fn expiry_is_checked_an_eighth_of_it_apart_within_1s_and_1h() {
        assert_eq!(expiry_check_every(Duration::from_secs(7 * 24 * 3600)), Duration::from_secs(3600));
        assert_eq!(expiry_check_every(Duration::from_secs(80)), Duration::from_secs(10));
        assert_eq!(expiry_check_every(Duration::from_secs(2)), Duration::from_secs(1));
    }

    on_both_backends!(replicas_expiring_uploads_at_once_abort_each_old_upload_once);
    async fn replicas_expiring_uploads_at_once_abort_each_old_upload_once(backend: TestBackend) {
        let (dir, first, second) = two_replicas(backend).await;
        let (b, k) = names("k");
        let young = first.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        put(&first, "k", &young.id, 1, b"young").await;
        let mut old = Vec::new();
        for i in 0..3 {
            // Started ten minutes ago, as a dead client's uploads would have been.
            let upload = UploadRecord {
                id: new_upload_id(),
                bucket_id: young.bucket_id,
                key: "k".into(),
                attrs: ObjectAttrs::default(),
                created_at: young.created_at - 600,
                created_by: None,
                checksum: None,
            };
            first.meta.create_upload(&upload).await.unwrap();
            put(&first, "k", &upload.id, 1, &bytes(100, i)).await;
            put(&second, "k", &upload.id, 2, &bytes(100, i + 10)).await;
            old.push(upload);
        }
        assert_eq!(files(&dir.path().join("parts")).len(), 7);

        // Both look at once: a round of `expire_uploads` on each, run together. Each upload was aborted, and
        // counted, once.
        let expiry = Duration::from_secs(300);
        let rounds = tokio::join!(first.abort_uploads_older_than(expiry), second.abort_uploads_older_than(expiry));
        assert_eq!(rounds.0.unwrap() + rounds.1.unwrap(), 3);
        let (left, _) = second.list_uploads(&b, "", None, 10).await.unwrap();
        assert_eq!(left.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(), [young.id.as_str()], "the young one stays");
        assert_eq!(files(&dir.path().join("parts")).len(), 1, "the old uploads' part files are gone");
        for upload in &old {
            let err = second.list_parts(&b, &k, &upload.id, 0, 10).await.unwrap_err();
            assert_eq!(err.s3_code(), "NoSuchUpload");
        }
    }

    on_both_backends!(a_complete_that_dies_before_its_commit_leaves_nothing_visible);
    async fn a_complete_that_dies_before_its_commit_leaves_nothing_visible(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let (b, k) = names("k");
        let before = store.put(&b, &k, stage(&store, b"before"), ObjectAttrs::default());
        let before = before.await.unwrap();
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let p = put(&store, "k", &upload.id, 1, b"after").await;
        let wanted = [(1, p.etag())];
        let err = store
            .complete_upload_hooked(&b, &k, Completion::unbounded(&upload.id, &wanted), |_| {
                Err(anyhow::anyhow!("killed"))
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("killed"));
        let bucket_id = store.meta.bucket(&b).await.unwrap().unwrap().id;
        let object = store.meta.object_by_key(bucket_id, "k").await.unwrap().unwrap();
        assert_eq!(object.sha256, before.sha256, "the old object is still the one visible");
        assert!(store.blobs.path_of(&before.sha256).is_file(), "its retired blob was put back");
        let md5 = format!("\"{}\"", hex::encode(Md5::digest(b"before")));
        assert_eq!(store.meta.s3_etag(bucket_id, "k").await.unwrap(), Some(md5), "the old object's S3 ETag stays");
        assert_eq!(store.list_parts(&b, &k, &upload.id, 0, 10).await.unwrap().0, vec![p.clone()], "upload intact");
        // What a crash there leaves: the assembled blob installed without a row. The sweep takes it.
        let report = store.sweep(Duration::ZERO).await.unwrap();
        assert_eq!((report.unreferenced_blobs, report.part_files), (1, 0));
        assert_eq!(store.blobs.list_hashes().unwrap(), vec![before.sha256.clone()]);
        // And the client's retry completes.
        store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &wanted)).await.unwrap();
        assert!(files(&dir.path().join("parts")).is_empty());
    }

    on_both_backends!(one_complete_at_a_time_claims_the_upload);
    async fn one_complete_at_a_time_claims_the_upload(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let (b, k) = names("k");
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let p = put(&store, "k", &upload.id, 1, b"claimed").await;
        let wanted = [(1, p.etag())];
        // Another Complete (on any replica) holds the claim: this one assembles nothing.
        let now = unix_now();
        assert!(store.meta.claim_upload(&upload.id, now, now - 10).await.unwrap());
        assert!(!store.meta.claim_upload(&upload.id, now, now - 10).await.unwrap(), "exactly one claim wins");
        let err = store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &wanted)).await.unwrap_err();
        assert!(matches!(err, MultipartError::NoSuchUpload), "{err:?}");
        assert!(store.blobs.list_hashes().unwrap().is_empty(), "nothing assembled");
        // Two at once: one completes, the other is NoSuchUpload, neither an internal error.
        store.meta.release_upload_claim(&upload.id, now).await.unwrap();
        let (x, y) = tokio::join!(
            store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &wanted)),
            store.complete_upload(&b, &k, Completion::unbounded(&upload.id, &wanted))
        );
        let outcomes = [x, y].map(|r| r.map(|_| ()).map_err(|e| e.s3_code()));
        assert!(outcomes.contains(&Ok(())) && outcomes.contains(&Err("NoSuchUpload")), "{outcomes:?}");

        // A claim older than the lease (its replica died while assembling) is taken over.
        let stale = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let p = put(&store, "k", &stale.id, 1, b"stale").await;
        let long_ago = now - COMPLETE_CLAIM_LEASE.as_secs() as i64 - 1;
        assert!(store.meta.claim_upload(&stale.id, long_ago, long_ago - 10).await.unwrap());
        store.complete_upload(&b, &k, Completion::unbounded(&stale.id, &[(1, p.etag())])).await.unwrap();
    }

    on_both_backends!(an_upload_aborted_during_assembly_is_no_such_upload_and_a_replaced_part_invalid_part);
    async fn an_upload_aborted_during_assembly_is_no_such_upload_and_a_replaced_part_invalid_part(
        backend: TestBackend,
    ) {
        let (_dir, store) = store(backend).await;
        let (b, k) = names("k");
        // The parts as Complete read them, then an Abort (rows and files gone) before the assembly runs.
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let p = put(&store, "k", &upload.id, 1, b"aborted").await;
        store.abort_upload(&b, &k, &upload.id).await.unwrap();
        let err = store
            .assemble_and_commit(&b, &k, upload, &[&p], ("\"x-1\"", None), &WriteCondition::Always, |_| Ok(()))
            .await
            .unwrap_err();
        assert!(matches!(err, MultipartError::NoSuchUpload), "{err:?}");
        // A part replaced meanwhile: its old file is gone.
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let old = put(&store, "k", &upload.id, 1, b"old").await;
        put(&store, "k", &upload.id, 1, b"new").await;
        let err = store
            .assemble_and_commit(&b, &k, upload, &[&old], ("\"x-1\"", None), &WriteCondition::Always, |_| Ok(()))
            .await
            .unwrap_err();
        assert!(matches!(err, MultipartError::InvalidPart(1)), "{err:?}");
        let bucket_id = store.meta.bucket(&b).await.unwrap().unwrap().id;
        assert!(store.meta.object_by_key(bucket_id, "k").await.unwrap().is_none(), "nothing committed");
    }

    on_both_backends!(parts_adding_up_to_more_than_the_limit_are_entity_too_large);
    async fn parts_adding_up_to_more_than_the_limit_are_entity_too_large(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let (b, k) = names("k");
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let one = put(&store, "k", &upload.id, 1, &bytes(MIN_PART_SIZE as usize, 1)).await;
        let two = put(&store, "k", &upload.id, 2, &bytes(10, 2)).await;
        let wanted = [(1, one.etag()), (2, two.etag())];
        let err = store
            .complete_upload(
                &b,
                &k,
                Completion { max_object_bytes: MIN_PART_SIZE + 9, ..Completion::unbounded(&upload.id, &wanted) },
            )
            .await
            .unwrap_err();
        assert!(matches!(err, MultipartError::ObjectTooLarge { size, .. } if size == MIN_PART_SIZE + 10), "{err:?}");
        assert_eq!(err.s3_code(), "EntityTooLarge");
        assert!(store.blobs.list_hashes().unwrap().is_empty(), "nothing assembled");
        store
            .complete_upload(
                &b,
                &k,
                Completion { max_object_bytes: MIN_PART_SIZE + 10, ..Completion::unbounded(&upload.id, &wanted) },
            )
            .await
            .unwrap();
    }

    on_both_backends!(the_sweep_removes_part_files_no_upload_names);
    async fn the_sweep_removes_part_files_no_upload_names(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let (b, k) = names("k");
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let live = put(&store, "k", &upload.id, 1, b"live").await;
        // A crash after a part's file was moved in but before its row committed, or after a Complete or Abort
        // committed but before the files were removed: files no row names.
        let parts = dir.path().join("parts");
        for _ in 0..2 {
            std::fs::write(parts.join(BlobStore::new_part_name()), b"orphan").unwrap();
        }
        std::fs::write(parts.join("not-a-part-name"), b"left alone").unwrap();
        // A crash mid-part or mid-assembly: a staged file of a dead process.
        std::fs::write(dir.path().join("tmp").join("stage-0-dead"), b"partial").unwrap();
        let report = store.sweep(Duration::ZERO).await.unwrap();
        assert_eq!((report.part_files, report.temp_files), (2, 1));
        assert_eq!(files(&parts), vec![live.staged_name.clone(), "not-a-part-name".to_owned()]);
        assert!(store.list_parts(&b, &k, &upload.id, 0, 10).await.is_ok());
    }

    on_both_backends!(the_sweep_checks_part_files_a_batch_at_a_time);
    async fn the_sweep_checks_part_files_a_batch_at_a_time(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let (b, k) = names("k");
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        let live = put(&store, "k", &upload.id, 1, b"live").await;
        let parts = dir.path().join("parts");
        let orphans = 2 * crate::store::SWEEP_BATCH + 3;
        for _ in 0..orphans {
            std::fs::write(parts.join(BlobStore::new_part_name()), b"orphan").unwrap();
        }
        assert_eq!(store.sweep_at_start(Duration::ZERO).await.unwrap().part_files, 0, "parts go in the background");
        assert_eq!(store.sweep_blobs(Duration::ZERO).await.unwrap().part_files, orphans);
        assert_eq!(files(&parts), vec![live.staged_name]);
    }

    on_both_backends!(deleting_a_bucket_aborts_its_uploads_and_removes_their_part_files);
    async fn deleting_a_bucket_aborts_its_uploads_and_removes_their_part_files(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let (b, k) = names("k");
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), None, None).await.unwrap();
        put(&store, "k", &upload.id, 1, b"x").await;
        put(&store, "k", &upload.id, 2, b"y").await;
        // With an object, a delete without force is refused and aborts nothing.
        store.put(&b, &k, stage(&store, b"object"), ObjectAttrs::default()).await.unwrap();
        assert!(matches!(store.delete_bucket(&b, false).await.unwrap(), BucketDeletion::NotEmpty { objects: 1 }));
        assert!(store.meta.upload(&upload.id).await.unwrap().is_some());
        store.delete(&b, &k).await.unwrap();
        // Without objects, unfinished uploads do not keep the bucket (as in S3): they go with it, files and all.
        let deleted = store.delete_bucket(&b, false).await.unwrap();
        assert_eq!(deleted, BucketDeletion::Deleted { objects: 0, tokens: 0, uploads: 1 });
        assert_eq!(store.meta.upload(&upload.id).await.unwrap(), None);
        assert!(files(&dir.path().join("parts")).is_empty(), "the part files went at once");
        assert_eq!(store.sweep(Duration::ZERO).await.unwrap().part_files, 0);
    }

    fn limits(max_part_bytes: u64, max_object_bytes: u64, per_key: Option<u64>) -> UploadLimits {
        UploadLimits { max_part_bytes, max_object_bytes, max_unfinished_per_key: per_key }
    }

    async fn put_within(
        store: &Store,
        key: &str,
        upload: &str,
        number: u32,
        len: usize,
        limits: &UploadLimits,
    ) -> Result<PartRecord, MultipartError> {
        let (b, k) = names(key);
        store.put_part(&b, &k, upload, number, stage(store, &bytes(len, number as u8)), limits).await
    }

    on_both_backends!(
        a_part_that_would_take_its_upload_past_the_object_limit_is_refused_and_a_replaced_part_counts_once
    );
    async fn a_part_that_would_take_its_upload_past_the_object_limit_is_refused_and_a_replaced_part_counts_once(
        backend: TestBackend,
    ) {
        let (dir, store) = store(backend).await;
        let (b, k) = names("k");
        let upload = store.create_upload(&b, &k, ObjectAttrs::default(), Some("AKBGONE"), None).await.unwrap();
        let bounds = limits(100, 250, None);
        put_within(&store, "k", &upload.id, 1, 100, &bounds).await.unwrap();
        put_within(&store, "k", &upload.id, 2, 100, &bounds).await.unwrap();
        let err = put_within(&store, "k", &upload.id, 3, 60, &bounds).await.unwrap_err();
        assert!(matches!(err, MultipartError::ObjectTooLarge { size: 260, limit: 250 }), "{err:?}");
        assert_eq!((err.s3_code(), err.refusing_limit()), ("EntityTooLarge", Some("max_object_bytes")));
        let err = put_within(&store, "k", &upload.id, 3, 101, &bounds).await.unwrap_err();
        assert!(matches!(err, MultipartError::EntityTooLarge { size: 101, limit: 100 }), "{err:?}");
        assert_eq!(err.refusing_limit(), Some("max_upload_bytes"));
        assert_eq!(files(&dir.path().join("parts")).len(), 2, "the earlier parts stay, the refused ones left none");
        assert!(files(&dir.path().join("tmp")).is_empty());
        // Part 2 again: it replaces itself, so 100 + 100 still; then part 3 makes exactly the limit.
        put_within(&store, "k", &upload.id, 2, 100, &bounds).await.unwrap();
        put_within(&store, "k", &upload.id, 3, 50, &bounds).await.unwrap();
        let (parts, _) = store.list_parts(&b, &k, &upload.id, 0, 10).await.unwrap();
        assert_eq!(parts.iter().map(|p| p.size).sum::<u64>(), 250);

        // The early check, from a declared length, answers as the store would; without one it only finds the upload.
        let room = |n, size| store.check_part_room(&b, &k, &upload.id, n, size, &bounds);
        assert!(matches!(room(4, Some(1)).await, Err(MultipartError::ObjectTooLarge { size: 251, .. })));
        assert!(matches!(room(3, Some(50)).await, Ok(u) if u.id == upload.id), "a replacement of the same size fits");
        assert!(room(4, None).await.is_ok());
        let err = store.check_part_room(&b, &k, "nope", 1, Some(1), &bounds).await.unwrap_err();
        assert!(matches!(err, MultipartError::NoSuchUpload), "{err:?}");
    }

    on_both_backends!(one_keys_unfinished_parts_are_capped_and_other_keys_and_old_uploads_are_not);
    async fn one_keys_unfinished_parts_are_capped_and_other_keys_and_old_uploads_are_not(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let (b, k) = names("k");
        let bounds = limits(1000, 1000, Some(300));
        let start = |by: Option<&'static str>| store.create_upload(&b, &k, ObjectAttrs::default(), by, None);
        let (first, second) = (start(Some("AKBGA")).await.unwrap(), start(Some("AKBGA")).await.unwrap());
        let (other_key, from_before) = (start(Some("AKBGB")).await.unwrap(), start(None).await.unwrap());
        put_within(&store, "k", &first.id, 1, 100, &bounds).await.unwrap();
        put_within(&store, "k", &first.id, 2, 100, &bounds).await.unwrap();
        let err = put_within(&store, "k", &second.id, 1, 150, &bounds).await.unwrap_err();
        assert!(matches!(err, MultipartError::QuotaExceeded { held: 350, limit: 300 }), "{err:?}");
        assert_eq!(
            (err.s3_code(), err.refusing_limit()),
            ("QuotaExceeded", Some("max_unfinished_upload_bytes_per_key"))
        );
        let room = store.check_part_room(&b, &k, &second.id, 1, Some(150), &bounds).await;
        assert!(matches!(room, Err(MultipartError::QuotaExceeded { .. })), "the early check agrees: {room:?}");
        put_within(&store, "k", &second.id, 1, 100, &bounds).await.unwrap();
        // A replaced part counts once; another key, and an upload that names no key, are not held to A's bytes.
        put_within(&store, "k", &first.id, 2, 100, &bounds).await.unwrap();
        put_within(&store, "k", &other_key.id, 1, 300, &bounds).await.unwrap();
        put_within(&store, "k", &from_before.id, 1, 900, &bounds).await.unwrap();
        assert!(put_within(&store, "k", &second.id, 2, 1, &bounds).await.is_err(), "A holds 300");
        // Aborting (or completing) frees what an upload held.
        store.abort_upload(&b, &k, &first.id).await.unwrap();
        put_within(&store, "k", &second.id, 2, 200, &bounds).await.unwrap();
        // Off: no cap.
        put_within(&store, "k", &second.id, 3, 500, &limits(1000, 10_000, None)).await.unwrap();
    }

    on_both_backends!(parts_on_two_replicas_at_once_cannot_pass_a_limit_together);
    /// Ten parts at once, of two uploads by one key, on two stores sharing one database (two replicas): the check
    /// and the row are one transaction under the write lock, so exactly as many are taken as fit.
    async fn parts_on_two_replicas_at_once_cannot_pass_a_limit_together(backend: TestBackend) {
        let (_dir, first, second) = two_replicas(backend).await;
        let (b, k) = names("k");
        let upload = first.create_upload(&b, &k, ObjectAttrs::default(), Some("AKBGA"), None).await.unwrap();
        let other = first.create_upload(&b, &k, ObjectAttrs::default(), Some("AKBGA"), None).await.unwrap();
        let bounds = limits(100, 250, Some(350));
        let (replicas, mut parts) = ([&first, &second], Vec::new());
        for n in 1..=5u32 {
            let store = replicas[n as usize % 2];
            parts.push(put_within(store, "k", &upload.id, n, 100, &bounds));
            parts.push(put_within(store, "k", &other.id, n, 100, &bounds));
        }
        let outcomes = futures_util::future::join_all(parts).await;
        let taken = outcomes.iter().filter(|r| r.is_ok()).count();
        assert_eq!(taken, 3, "the key's cap holds three parts: {outcomes:?}");
        let one = first.meta.held_bytes(&upload.id, 0, Some("AKBGA")).await.unwrap();
        let two = first.meta.held_bytes(&other.id, 0, Some("AKBGA")).await.unwrap();
        assert_eq!((one.creator, one.upload + two.upload), (Some(300), 300));
        assert!(one.upload <= 250 && two.upload <= 250, "each upload within the object limit: {one:?} {two:?}");
    }
}
