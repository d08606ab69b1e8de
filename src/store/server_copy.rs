//! Server-side copies (S3 CopyObject and UploadPartCopy).
//!
//! An object copy moves no bytes: under the blob-reference lock, the target row is written naming the source's
//! blob and its variants' blobs, which so gain a reference, and the target's old blobs are retired as by a put.
//! Reading the source inside that transaction keeps its blob referenced until the copy commits, so a delete of
//! the source racing the copy leaves either both objects or only the target's old one. A part copy stages the
//! source's range as a new file (the kernel copies it), then stores it like an uploaded part.

use anyhow::Context;

use super::{Store, StoreError, finish_commit, require_bucket, unix_now};
use crate::names::{BucketName, ObjectAttrs, ObjectKey, Tags};
use crate::store::metadata::{ObjectRecord, Upsert};
use crate::store::multipart::{MultipartError, UploadLimits};
use crate::store::{PartRecord, StagedBlob};

/// One of a copy's S3 directives (`x-amz-metadata-directive`, `x-amz-tagging-directive`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Directive<T> {
    /// `COPY`, the default: the source's.
    FromSource,
    /// `REPLACE`: the request's.
    Replace(T),
}

/// The attributes the copy gets: its metadata (all of [`ObjectAttrs`] but the tags) and its tags, each kept from
/// the source or replaced, independently, as S3 does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopiedAttrs {
    pub metadata: Directive<ObjectAttrs>,
    pub tags: Directive<Tags>,
}

impl CopiedAttrs {
    /// Both kept from the source (a copy without directives).
    pub fn from_source() -> Self {
        Self { metadata: Directive::FromSource, tags: Directive::FromSource }
    }

    fn apply(self, source: &ObjectAttrs) -> ObjectAttrs {
        let mut attrs = match self.metadata {
            Directive::FromSource => source.clone(),
            Directive::Replace(attrs) => attrs,
        };
        attrs.tags = match self.tags {
            Directive::FromSource => source.tags.clone(),
            Directive::Replace(tags) => tags,
        };
        attrs
    }
}

/// What a copy found: the source may be missing, or fail the caller's preconditions.
#[derive(Debug)]
pub enum CopyOutcome<T> {
    Copied(T),
    NoSuchKey,
    PreconditionFailed,
}

/// A committed object copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyReport {
    /// Quoted: the source's S3 ETag (its content is the same).
    pub s3_etag: String,
    /// Unix seconds: the target's Last-Modified.
    pub last_modified: i64,
}

/// An object named in a bucket, as a copy's source or target.
#[derive(Debug, Clone, Copy)]
pub struct ObjectName<'a> {
    pub bucket: &'a BucketName,
    pub key: &'a ObjectKey,
}

impl Store {
    /// Copies `source` to `target`, in one write transaction, if `precondition` holds for the source row.
    pub async fn copy_object(
        &self,
        source: ObjectName<'_>,
        target: ObjectName<'_>,
        attrs: CopiedAttrs,
        precondition: impl FnOnce(&ObjectRecord) -> bool,
    ) -> Result<CopyOutcome<CopyReport>, StoreError> {
        let mut tx = self.meta.lock_blob_refs().await?;
        let from = require_bucket(tx.bucket(source.bucket).await?, source.bucket)?;
        let to = if target.bucket == source.bucket {
            from.clone()
        } else {
            require_bucket(tx.bucket(target.bucket).await?, target.bucket)?
        };
        let Some(record) = tx.object_by_key(from.id, source.key.as_str()).await? else {
            return Ok(CopyOutcome::NoSuchKey);
        };
        if !precondition(&record) {
            return Ok(CopyOutcome::PreconditionFailed);
        }
        let variants = tx.variants(from.id, source.key.as_str()).await?;
        let attrs = attrs.apply(&record.attrs);
        let now = unix_now();
        let upsert = tx.upsert_object(to.id, target.key, &record.sha256, record.size, &attrs, now).await?;
        // The variants are the same content in other codings, so they hold for the copy whatever its attributes.
        let mut dropped = tx.replace_variants(to.id, target.key.as_str(), &variants).await?;
        let s3_etag = record.s3_etag_or_native();
        // The checksum goes with the content, as S3's copy keeps it.
        let (sizes, checksum) = (record.part_sizes.as_deref(), record.checksum.as_ref());
        tx.set_s3_etag(to.id, target.key.as_str(), &record.sha256, &s3_etag, sizes, checksum).await?;
        let last_modified = match upsert {
            Upsert::Unchanged => {
                let kept = tx.object_by_key(to.id, target.key.as_str()).await?;
                kept.context("the copy's target row vanished under the write lock")?.updated_at
            }
            Upsert::Replaced { previous_sha256 } => {
                dropped.push(previous_sha256);
                now
            }
            Upsert::Created => now,
        };
        let retired = self.retire_all_unreferenced(&mut tx, dropped).await?;
        finish_commit(tx, retired).await?;
        self.schedule_store_deletes();
        Ok(CopyOutcome::Copied(CopyReport { s3_etag, last_modified }))
    }

    /// The object's row, read outside any transaction (the source of a part copy, checked before its range is
    /// staged).
    pub async fn object(&self, bucket: &BucketName, key: &ObjectKey) -> Result<Option<ObjectRecord>, StoreError> {
        let Some(found) = self.meta.bucket(bucket).await? else { return Ok(None) };
        Ok(self.meta.object_by_key(found.id, key.as_str()).await?)
    }

    /// Stages `len` bytes of `source` (a row `object` returned) from `offset` as part `part_number` of an upload,
    /// bounded as an uploaded part is. `None` when the source was deleted since its row was read.
    pub async fn copy_part(
        &self,
        source: &ObjectRecord,
        (offset, len): (u64, u64),
        target: ObjectName<'_>,
        upload_id: &str,
        part_number: u32,
        limits: &UploadLimits,
    ) -> Result<Option<PartRecord>, MultipartError> {
        // An unknown upload, or a range that cannot fit, is refused before anything is staged.
        self.check_part_room(target.bucket, target.key, upload_id, part_number, Some(len), limits).await?;
        let blobs = self.blobs.clone();
        let sha256 = source.sha256.clone();
        // From an object store, the range is read into the cache first and copied from the cache file.
        let cached = match &self.cache {
            Some(cache) => Some(cache.fill_range(&sha256, source.size, offset, len).await.map_err(cache_error)?),
            None => None,
        };
        let staged: Option<StagedBlob> =
            tokio::task::spawn_blocking(move || blobs.stage_range(&sha256, cached.as_deref(), offset, len))
                .await
                .context("part copy task failed")??;
        let Some(staged) = staged else { return Ok(None) };
        Ok(Some(self.put_part(target.bucket, target.key, upload_id, part_number, staged, limits).await?))
    }
}

/// A cache that could not read a part copy's source from the object store.
fn cache_error(e: super::CacheError) -> MultipartError {
    match e {
        super::CacheError::Remote(e) => MultipartError::BlobStoreUnavailable(e),
        super::CacheError::Local(e) => {
            MultipartError::Other(anyhow::Error::new(e).context("cannot cache the copy's source"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::header_values::content_coding::ContentCoding;
    use crate::store::metadata::{TestBackend, on_both_backends, test_database_url};
    use crate::store::{Completion, PutStatus, StagedVariant};

    async fn store(backend: TestBackend) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = test_database_url(backend, dir.path()).await;
        let store = Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        for name in ["bkt", "other"] {
            store.meta.create_bucket(&BucketName::parse(name).unwrap(), false, 0).await.unwrap();
        }
        (dir, store)
    }

    fn names(bucket: &str, key: &str) -> (BucketName, ObjectKey) {
        (BucketName::parse(bucket).unwrap(), ObjectKey::parse(key).unwrap())
    }

    async fn row(store: &Store, (bucket, key): &(BucketName, ObjectKey)) -> Option<ObjectRecord> {
        store.object(bucket, key).await.unwrap()
    }

    on_both_backends!(a_copy_shares_its_sources_blob_and_variants_and_outlives_it);
    async fn a_copy_shares_its_sources_blob_and_variants_and_outlives_it(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let src = names("bkt", "src");
        let dst = names("other", "dst");
        let attrs = ObjectAttrs { content_type: Some("text/x-a".into()), ..ObjectAttrs::default() };
        let gzip = StagedVariant { coding: ContentCoding::Gzip, blob: store.blobs.stage_bytes(b"gz") };
        store.put_with_variants(&src.0, &src.1, store.blobs.stage_bytes(b"body"), attrs, vec![gzip]).await.unwrap();
        let source = row(&store, &src).await.unwrap();
        let copied = store
            .copy_object(
                ObjectName { bucket: &src.0, key: &src.1 },
                ObjectName { bucket: &dst.0, key: &dst.1 },
                CopiedAttrs::from_source(),
                |_| true,
            )
            .await
            .unwrap();
        let CopyOutcome::Copied(report) = copied else { panic!("copied: {copied:?}") };
        assert_eq!(Some(report.s3_etag), source.s3_etag, "the S3 ETag is the source's MD5");
        let copy = row(&store, &dst).await.unwrap();
        assert_eq!(
            (copy.sha256.as_str(), copy.attrs.content_type.as_deref()),
            (source.sha256.as_str(), Some("text/x-a"))
        );
        let dst_bucket = store.meta.bucket(&dst.0).await.unwrap().unwrap();
        let variants = store.meta.variants(dst_bucket.id, "dst").await.unwrap();
        assert_eq!(variants.iter().map(|v| v.encoding.as_str()).collect::<Vec<_>>(), ["gzip"]);
        assert_eq!(store.blobs.list_hashes().unwrap().len(), 2, "no bytes were copied");

        assert!(store.delete(&src.0, &src.1).await.unwrap());
        assert_eq!(store.blobs.list_hashes().unwrap().len(), 2, "the copy still references both blobs");
        assert!(store.delete(&dst.0, &dst.1).await.unwrap());
        assert!(store.blobs.list_hashes().unwrap().is_empty(), "the last reference took the blobs");
    }

    on_both_backends!(a_copy_replacing_an_object_retires_its_old_blob_and_refusals_change_nothing);
    async fn a_copy_replacing_an_object_retires_its_old_blob_and_refusals_change_nothing(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let (src, dst) = (names("bkt", "src"), names("bkt", "dst"));
        let tagged = ObjectAttrs {
            content_type: Some("text/x-a".into()),
            tags: [("team".to_owned(), "build".to_owned())].into(),
            ..ObjectAttrs::default()
        };
        store.put(&src.0, &src.1, store.blobs.stage_bytes(b"new"), tagged).await.unwrap();
        let old = store.put(&dst.0, &dst.1, store.blobs.stage_bytes(b"old"), ObjectAttrs::default()).await.unwrap();
        assert_eq!(old.status, PutStatus::Created);
        let source = ObjectName { bucket: &src.0, key: &src.1 };
        let target = ObjectName { bucket: &dst.0, key: &dst.1 };
        let refused = store.copy_object(source, target, CopiedAttrs::from_source(), |_| false).await.unwrap();
        assert!(matches!(refused, CopyOutcome::PreconditionFailed));
        let (absent, _) = names("bkt", "absent");
        let missing = ObjectName { bucket: &absent, key: &ObjectKey::parse("absent").unwrap() };
        assert!(matches!(
            store.copy_object(missing, target, CopiedAttrs::from_source(), |_| true).await.unwrap(),
            CopyOutcome::NoSuchKey
        ));
        assert_eq!(row(&store, &dst).await.unwrap().sha256, old.sha256, "a refused copy changed nothing");

        // Metadata replaced, tags kept: the two directives are independent.
        let replaced = CopiedAttrs {
            metadata: Directive::Replace(ObjectAttrs { cache_control: Some("no-store".into()), ..Default::default() }),
            tags: Directive::FromSource,
        };
        let copied = store.copy_object(source, target, replaced, |_| true).await.unwrap();
        assert!(matches!(copied, CopyOutcome::Copied(_)));
        let copy = row(&store, &dst).await.unwrap();
        assert_eq!(copy.sha256, row(&store, &src).await.unwrap().sha256);
        assert_eq!(copy.attrs.cache_control.as_deref(), Some("no-store"));
        assert_eq!(copy.attrs.tags, [("team".to_owned(), "build".to_owned())].into(), "the source's tags");
        // And the other way round.
        let retagged = CopiedAttrs {
            metadata: Directive::FromSource,
            tags: Directive::Replace([("new".to_owned(), "tag".to_owned())].into()),
        };
        assert!(matches!(store.copy_object(source, target, retagged, |_| true).await.unwrap(), CopyOutcome::Copied(_)));
        let copy = row(&store, &dst).await.unwrap();
        assert_eq!(copy.attrs.content_type.as_deref(), Some("text/x-a"), "the source's metadata");
        assert_eq!(copy.attrs.tags, [("new".to_owned(), "tag".to_owned())].into());
        assert_eq!(store.blobs.list_hashes().unwrap(), vec![copy.sha256], "the replaced content's blob went");
    }

    on_both_backends!(copies_racing_the_sources_delete_never_leave_a_row_without_its_blob);
    /// Copies racing deletes of their source, on one store: each copy either commits a row whose blob exists or
    /// finds no source; no row is ever left naming a removed blob.
    async fn copies_racing_the_sources_delete_never_leave_a_row_without_its_blob(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let src = names("bkt", "src");
        for round in 0..20u32 {
            let body = format!("round {round}");
            store.put(&src.0, &src.1, store.blobs.stage_bytes(body.as_bytes()), ObjectAttrs::default()).await.unwrap();
            let dst = names("bkt", &format!("copy-{round}"));
            let source = ObjectName { bucket: &src.0, key: &src.1 };
            let target = ObjectName { bucket: &dst.0, key: &dst.1 };
            let (copied, deleted) = tokio::join!(
                store.copy_object(source, target, CopiedAttrs::from_source(), |_| true),
                store.delete(&src.0, &src.1)
            );
            assert!(deleted.unwrap());
            match copied.unwrap() {
                CopyOutcome::Copied(_) => {
                    let copy = row(&store, &dst).await.unwrap();
                    assert!(store.blobs.path_of(&copy.sha256).exists(), "round {round}: the copy's blob");
                }
                CopyOutcome::NoSuchKey => assert!(row(&store, &dst).await.is_none()),
                CopyOutcome::PreconditionFailed => unreachable!(),
            }
        }
    }

    on_both_backends!(a_part_copy_stages_the_range_and_completes_byte_exact);
    async fn a_part_copy_stages_the_range_and_completes_byte_exact(backend: TestBackend) {
        let (_dir, store) = store(backend).await;
        let src = names("bkt", "src");
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        store.put(&src.0, &src.1, store.blobs.stage_bytes(&bytes), ObjectAttrs::default()).await.unwrap();
        let source = row(&store, &src).await.unwrap();
        let dst = names("bkt", "dst");
        let upload = store.create_upload(&dst.0, &dst.1, ObjectAttrs::default(), None, None).await.unwrap();
        let target = ObjectName { bucket: &dst.0, key: &dst.1 };
        let copied = store.copy_part(&source, (1000, 5000), target, &upload.id, 1, &UploadLimits::NONE).await.unwrap();
        let Some(part) = copied else { panic!("copied: {copied:?}") };
        assert_eq!(part.size, 5000);
        use md5::Digest;
        assert_eq!(part.md5, hex::encode(md5::Md5::digest(&bytes[1000..6000])));
        let report = store
            .complete_upload(&dst.0, &dst.1, Completion::unbounded(&upload.id, &[(1, part.etag())]))
            .await
            .unwrap();
        let blob = std::fs::read(store.blobs.path_of(&report.put.sha256)).unwrap();
        assert!(blob == bytes[1000..6000], "the part holds exactly the range");

        assert!(store.delete(&src.0, &src.1).await.unwrap());
        let gone = store.create_upload(&dst.0, &dst.1, ObjectAttrs::default(), None, None).await.unwrap();
        let copied = store.copy_part(&source, (0, 10), target, &gone.id, 1, &UploadLimits::NONE).await.unwrap();
        assert!(copied.is_none(), "a source deleted since its row was read");
        let unknown = store.copy_part(&source, (0, 10), target, "0".repeat(32).as_str(), 1, &UploadLimits::NONE).await;
        assert!(matches!(unknown, Err(MultipartError::NoSuchUpload)));
    }

    on_both_backends!(a_part_copy_is_bounded_like_a_part_before_anything_is_staged);
    async fn a_part_copy_is_bounded_like_a_part_before_anything_is_staged(backend: TestBackend) {
        let (dir, store) = store(backend).await;
        let src = names("bkt", "src");
        store.put(&src.0, &src.1, store.blobs.stage_bytes(&[7; 1000]), ObjectAttrs::default()).await.unwrap();
        let source = row(&store, &src).await.unwrap();
        let dst = names("bkt", "dst");
        let upload = store.create_upload(&dst.0, &dst.1, ObjectAttrs::default(), Some("AKBGA"), None).await.unwrap();
        let target = ObjectName { bucket: &dst.0, key: &dst.1 };
        let copy = |range, limits| store.copy_part(&source, range, target, &upload.id, 1, limits);
        let part_limit = UploadLimits { max_part_bytes: 500, ..UploadLimits::NONE };
        let object_limit = UploadLimits { max_object_bytes: 500, ..UploadLimits::NONE };
        let key_cap = UploadLimits { max_unfinished_per_key: Some(500), ..UploadLimits::NONE };
        for (limits, code) in
            [(&part_limit, "EntityTooLarge"), (&object_limit, "EntityTooLarge"), (&key_cap, "QuotaExceeded")]
        {
            let err = copy((0, 501), limits).await.unwrap_err();
            assert_eq!(err.s3_code(), code, "{err:?}");
            assert!(std::fs::read_dir(dir.path().join("tmp")).unwrap().next().is_none(), "nothing staged");
        }
        assert_eq!(copy((0, 500), &key_cap).await.unwrap().map(|p| p.size), Some(500));
    }
}
