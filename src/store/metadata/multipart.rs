//! S3 multipart uploads (migration 0011): uploads, their parts (each a staged file in `parts/`), and the S3 ETag
//! of objects that a CompleteMultipartUpload committed. No server caches uploads or parts, so their writes are
//! not announced on the change feed; the ETag rows log object changes through their triggers.

use super::{Metadata, MetadataError, WriteTx};
use std::collections::HashSet;

use crate::header_values::checksum::{ChecksumAlgorithm, ChecksumType, ObjectChecksum};
use crate::names::{ObjectAttrs, prefix_upper_bound};

/// An upload in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadRecord {
    pub id: String,
    pub bucket_id: i64,
    pub key: String,
    /// The attributes the object gets on Complete.
    pub attrs: ObjectAttrs,
    pub created_at: i64,
    /// The S3 access key id that started it (migration 0016); `None` for uploads from before, which count for
    /// no key's `limits.max_unfinished_upload_bytes_per_key`.
    pub created_by: Option<String>,
    /// The checksum CreateMultipartUpload asked for (migration 0021): each part carries one of the algorithm,
    /// and Complete makes the object's of this type.
    pub checksum: Option<(ChecksumAlgorithm, ChecksumType)>,
}

/// What the other parts hold, beside the one a part upload would write (see [`Metadata::held_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldBytes {
    /// The upload's other parts.
    pub upload: u64,
    /// Every part of every upload its creator started, but this one; `None` when the upload names no creator.
    pub creator: Option<u64>,
}

/// An upload in progress with what its parts hold (`blobgate uploads list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadSummary {
    pub upload: UploadRecord,
    pub parts: u64,
    pub bytes: u64,
}

/// One uploaded part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartRecord {
    pub part_number: u32,
    pub size: u64,
    /// The file `parts/<staged_name>`.
    pub staged_name: String,
    /// Hex MD5 of the part; its ETag, quoted, is [`PartRecord::etag`].
    pub md5: String,
    pub sha256: String,
    pub created_at: i64,
    /// The part's checksum, presented (and verified) or computed for the upload's algorithm (migration 0021).
    pub checksum: Option<ObjectChecksum>,
}

impl PartRecord {
    /// The part's S3 ETag: its MD5, quoted, as S3 answers UploadPart (clients may check it against their own).
    pub fn etag(&self) -> String {
        format!("\"{}\"", self.md5)
    }
}

const UPLOAD_COLUMNS: &str = "id, bucket_id, key, content_type, cache_control, content_disposition, user_metadata, \
                              tags, created_at, created_by, checksum";
const PART_COLUMNS: &str = "part_number, size, staged_name, md5, sha256, created_at, checksum";

struct UploadRow {
    id: String,
    bucket_id: i64,
    key: String,
    content_type: Option<String>,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    user_metadata: Option<String>,
    tags: Option<String>,
    created_at: i64,
    created_by: Option<String>,
    checksum: Option<String>,
}
from_row!(UploadRow {
    id,
    bucket_id,
    key,
    content_type,
    cache_control,
    content_disposition,
    user_metadata,
    tags,
    created_at,
    created_by,
    checksum
});

impl From<UploadRow> for UploadRecord {
    fn from(r: UploadRow) -> Self {
        UploadRecord {
            id: r.id,
            bucket_id: r.bucket_id,
            key: r.key,
            attrs: ObjectAttrs {
                content_type: r.content_type,
                cache_control: r.cache_control,
                content_disposition: r.content_disposition,
                user_metadata: super::objects::string_map_from_column(r.user_metadata.as_deref()),
                tags: super::objects::string_map_from_column(r.tags.as_deref()),
            },
            created_at: r.created_at,
            created_by: r.created_by,
            checksum: r.checksum.as_deref().and_then(upload_checksum_from_column),
        }
    }
}

/// An upload's `checksum` column: `ALGORITHM TYPE`.
fn upload_checksum_column(checksum: Option<(ChecksumAlgorithm, ChecksumType)>) -> Option<String> {
    checksum.map(|(algorithm, kind)| format!("{} {}", algorithm.name(), kind.name()))
}

fn upload_checksum_from_column(column: &str) -> Option<(ChecksumAlgorithm, ChecksumType)> {
    let (algorithm, kind) = column.split_once(' ')?;
    Some((ChecksumAlgorithm::from_name(algorithm)?, ChecksumType::from_name(kind)?))
}

struct SummaryRow {
    upload: UploadRow,
    parts: i64,
    bytes: i64,
}
from_row!(SummaryRow { parts, bytes } flatten { upload: UploadRow });

struct PartRow {
    part_number: i64,
    size: i64,
    staged_name: String,
    md5: String,
    sha256: String,
    created_at: i64,
    checksum: Option<String>,
}
from_row!(PartRow { part_number, size, staged_name, md5, sha256, created_at, checksum });

impl From<PartRow> for PartRecord {
    fn from(r: PartRow) -> Self {
        PartRecord {
            part_number: r.part_number as u32,
            size: r.size as u64,
            staged_name: r.staged_name,
            md5: r.md5,
            sha256: r.sha256,
            created_at: r.created_at,
            checksum: r.checksum.as_deref().and_then(ObjectChecksum::from_column),
        }
    }
}

/// The SQL of a keyset page of a bucket's uploads, by key and then by id, with the columns `extra` adds: $1 the
/// bucket id, $2 a key prefix, $3 its upper bound (when `upper`), $4 the key marker, $5 the upload id marker
/// (`""`: after every upload of the key, none: after nothing of it), $6 the limit.
fn uploads_page_sql(extra: &str, upper: bool, after: Option<(&str, Option<&str>)>) -> String {
    let after_clause = match after {
        None => "",
        Some((_, None)) => " AND key > $4",
        Some((_, Some(_))) => " AND (key > $4 OR (key = $4 AND id > $5))",
    };
    let upper_clause = if upper { " AND key < $3" } else { "" };
    format!(
        "SELECT {UPLOAD_COLUMNS}{extra} FROM multipart_uploads
         WHERE bucket_id = $1 AND key >= $2{upper_clause}{after_clause} ORDER BY key, id LIMIT $6"
    )
}

/// The bytes held beside part $2 of upload $1: the upload's other parts, and every part of the uploads creator $3
/// started but that one (none when $3 is NULL). A replaced part so counts once, at its new size.
const HELD_BYTES: &str = "SELECT
    CAST(coalesce((SELECT sum(size) FROM multipart_parts WHERE upload_id = $1 AND part_number <> $2), 0) AS BIGINT),
    CAST(coalesce((SELECT sum(p.size) FROM multipart_parts p JOIN multipart_uploads u ON u.id = p.upload_id
                   WHERE u.created_by = $3 AND NOT (p.upload_id = $1 AND p.part_number = $2)), 0) AS BIGINT)";

impl Metadata {
    /// Records a new upload.
    pub async fn create_upload(&self, upload: &UploadRecord) -> Result<(), MetadataError> {
        let mut tx = self.begin_write().await?;
        with_tx!(&mut tx.tx, sqlite => sqlx::query(
            "INSERT INTO multipart_uploads (id, bucket_id, key, content_type, cache_control, content_disposition,
                                            created_at, user_metadata, tags, created_by, checksum)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&upload.id)
        .bind(upload.bucket_id)
        .bind(&upload.key)
        .bind(&upload.attrs.content_type)
        .bind(&upload.attrs.cache_control)
        .bind(&upload.attrs.content_disposition)
        .bind(upload.created_at)
        .bind(super::objects::string_map_column(&upload.attrs.user_metadata))
        .bind(super::objects::string_map_column(&upload.attrs.tags))
        .bind(&upload.created_by)
        .bind(upload_checksum_column(upload.checksum))
        .execute(&mut **sqlite)
        .await?.rows_affected());
        tx.commit_without_announcing().await
    }

    /// Claims the upload for one CompleteMultipartUpload (migration 0013): true when no other Complete holds a
    /// claim taken at `stale_before` or later. One conditional UPDATE, so of concurrent Completes on any replicas
    /// exactly one wins.
    pub async fn claim_upload(&self, id: &str, now: i64, stale_before: i64) -> Result<bool, MetadataError> {
        let mut tx = self.begin_write().await?;
        let claimed = with_tx!(&mut tx.tx, tx => sqlx::query(
            "UPDATE multipart_uploads SET completing_since = $2
             WHERE id = $1 AND (completing_since IS NULL OR completing_since < $3)",
        )
        .bind(id)
        .bind(now)
        .bind(stale_before)
        .execute(&mut **tx)
        .await?.rows_affected());
        tx.commit_without_announcing().await?;
        Ok(claimed > 0)
    }

    /// Releases a claim taken at `since` (a Complete that failed), so the upload can be completed again.
    pub async fn release_upload_claim(&self, id: &str, since: i64) -> Result<(), MetadataError> {
        let mut tx = self.begin_write().await?;
        with_tx!(&mut tx.tx, tx => sqlx::query(
            "UPDATE multipart_uploads SET completing_since = NULL WHERE id = $1 AND completing_since = $2",
        )
        .bind(id)
        .bind(since)
        .execute(&mut **tx)
        .await?.rows_affected());
        tx.commit_without_announcing().await
    }

    pub async fn upload(&self, id: &str) -> Result<Option<UploadRecord>, MetadataError> {
        let sql = format!("SELECT {UPLOAD_COLUMNS} FROM multipart_uploads WHERE id = $1");
        let row: Option<UploadRow> =
            with_pool!(&self.backend, pool => sqlx::query_as(&sql).bind(id).fetch_optional(pool).await?);
        Ok(row.map(UploadRecord::from))
    }

    /// Up to `limit` parts of the upload, by number, after `after` (0: from the first).
    pub async fn list_parts(&self, upload_id: &str, after: u32, limit: u32) -> Result<Vec<PartRecord>, MetadataError> {
        let sql = format!(
            "SELECT {PART_COLUMNS} FROM multipart_parts WHERE upload_id = $1 AND part_number > $2
             ORDER BY part_number LIMIT $3"
        );
        let rows: Vec<PartRow> = with_pool!(&self.backend, pool => sqlx::query_as(&sql)
            .bind(upload_id)
            .bind(i64::from(after))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?);
        Ok(rows.into_iter().map(PartRecord::from).collect())
    }

    /// Up to `limit` uploads of a bucket under `prefix`, by key and then by age, after `after` (a key marker,
    /// with an upload id marker or not: S3's `key-marker` / `upload-id-marker`). A keyset read on the index.
    pub async fn list_uploads(
        &self,
        bucket_id: i64,
        prefix: &str,
        after: Option<(&str, Option<&str>)>,
        limit: u32,
    ) -> Result<Vec<UploadRecord>, MetadataError> {
        let upper = prefix_upper_bound(prefix);
        let sql = uploads_page_sql("", upper.is_some(), after);
        let rows: Vec<UploadRow> = with_pool!(&self.backend, pool => sqlx::query_as(&sql)
            .bind(bucket_id)
            .bind(prefix)
            .bind(upper.as_deref())
            .bind(after.map(|a| a.0))
            .bind(after.and_then(|a| a.1))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?);
        Ok(rows.into_iter().map(UploadRecord::from).collect())
    }

    /// Up to `limit` uploads of a bucket with their part counts and bytes, by key and then by age, after `after`
    /// (key, upload id): `list_uploads`'s keyset read, plus two sums over each upload's part rows.
    pub async fn upload_summaries(
        &self,
        bucket_id: i64,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<UploadSummary>, MetadataError> {
        let after = after.map(|(key, id)| (key, Some(id)));
        let totals = ", (SELECT count(*) FROM multipart_parts p WHERE p.upload_id = multipart_uploads.id) AS parts,
                        (SELECT CAST(coalesce(sum(p.size), 0) AS BIGINT) FROM multipart_parts p
                         WHERE p.upload_id = multipart_uploads.id) AS bytes";
        let sql = uploads_page_sql(totals, false, after);
        let rows: Vec<SummaryRow> = with_pool!(&self.backend, pool => sqlx::query_as(&sql)
            .bind(bucket_id)
            .bind("")
            .bind(None::<&str>)
            .bind(after.map(|a| a.0))
            .bind(after.and_then(|a| a.1))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?);
        Ok(rows
            .into_iter()
            .map(|r| UploadSummary { upload: r.upload.into(), parts: r.parts as u64, bytes: r.bytes as u64 })
            .collect())
    }

    /// What is held beside part `part_number` of upload `upload_id` (see [`HELD_BYTES`]). Read outside the write
    /// lock, it serves an early refusal only; `WriteTx::held_bytes` is the one that decides.
    pub async fn held_bytes(
        &self,
        upload_id: &str,
        part_number: u32,
        creator: Option<&str>,
    ) -> Result<HeldBytes, MetadataError> {
        let (upload, by_creator): (i64, i64) = with_pool!(&self.backend, pool => sqlx::query_as(HELD_BYTES)
            .bind(upload_id)
            .bind(i64::from(part_number))
            .bind(creator)
            .fetch_one(pool)
            .await?);
        Ok(HeldBytes { upload: upload as u64, creator: creator.map(|_| by_creator as u64) })
    }

    /// Ids of uploads created before `before` (unix seconds), oldest first: dead uploads to reclaim.
    pub async fn uploads_created_before(&self, before: i64, limit: u32) -> Result<Vec<String>, MetadataError> {
        let ids = with_pool!(&self.backend, pool => sqlx::query_scalar(
            "SELECT id FROM multipart_uploads WHERE created_at < $1 ORDER BY created_at, id LIMIT $2",
        )
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await?);
        Ok(ids)
    }

    /// The S3 ETag a CompleteMultipartUpload gave the object, while the object still has that content.
    pub async fn s3_etag(&self, bucket_id: i64, key: &str) -> Result<Option<String>, MetadataError> {
        let etag = with_pool!(&self.backend, pool => sqlx::query_scalar(
            "SELECT e.etag FROM object_s3_etags e JOIN objects o ON o.bucket_id = e.bucket_id AND o.key = e.key
             WHERE e.bucket_id = $1 AND e.key = $2 AND e.sha256 = o.sha256",
        )
        .bind(bucket_id)
        .bind(key)
        .fetch_optional(pool)
        .await?);
        Ok(etag)
    }
}

impl Metadata {
    /// The ETag a CompleteMultipartUpload of `upload_id` on `bucket_id/key` answered at `since` or later
    /// (migration 0022), while that object is still the one it committed: same content, same S3 ETag.
    pub async fn completed_upload(
        &self,
        upload_id: &str,
        bucket_id: i64,
        key: &str,
        since: i64,
    ) -> Result<Option<String>, MetadataError> {
        let etag = with_pool!(&self.backend, pool => sqlx::query_scalar(
            "SELECT c.etag FROM multipart_completions c
             JOIN objects o ON o.bucket_id = c.bucket_id AND o.key = c.key AND o.sha256 = c.sha256
             JOIN object_s3_etags e ON e.bucket_id = c.bucket_id AND e.key = c.key
                 AND e.sha256 = c.sha256 AND e.etag = c.etag
             WHERE c.upload_id = $1 AND c.bucket_id = $2 AND c.key = $3 AND c.completed_at >= $4",
        )
        .bind(upload_id)
        .bind(bucket_id)
        .bind(key)
        .bind(since)
        .fetch_optional(pool)
        .await?);
        Ok(etag)
    }
}

impl WriteTx {
    /// Remembers a committed CompleteMultipartUpload (see [`Metadata::completed_upload`]), and forgets those
    /// from before `forget_before`.
    pub async fn record_completion(
        &mut self,
        upload_id: &str,
        (bucket_id, key): (i64, &str),
        (sha256, etag): (&str, &str),
        now: i64,
        forget_before: i64,
    ) -> Result<(), MetadataError> {
        // At most a batch per completion: a burst of completions long ago must not all go in one write.
        with_tx!(&mut self.tx, tx => sqlx::query(
            "DELETE FROM multipart_completions WHERE upload_id IN
                 (SELECT upload_id FROM multipart_completions WHERE completed_at < $1 LIMIT $2)",
        )
            .bind(forget_before)
            .bind(super::PRUNE_ON_WRITE)
            .execute(&mut **tx)
            .await?
            .rows_affected());
        with_tx!(&mut self.tx, tx => sqlx::query(
            "INSERT INTO multipart_completions (upload_id, bucket_id, key, sha256, etag, completed_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(upload_id)
        .bind(bucket_id)
        .bind(key)
        .bind(sha256)
        .bind(etag)
        .bind(now)
        .execute(&mut **tx)
        .await?
        .rows_affected());
        Ok(())
    }

    pub async fn upload(&mut self, id: &str) -> Result<Option<UploadRecord>, MetadataError> {
        let sql = format!("SELECT {UPLOAD_COLUMNS} FROM multipart_uploads WHERE id = $1");
        let row: Option<UploadRow> =
            with_tx!(&mut self.tx, tx => sqlx::query_as(&sql).bind(id).fetch_optional(&mut **tx).await?);
        Ok(row.map(UploadRecord::from))
    }

    /// Every part of the upload, by number.
    pub async fn parts(&mut self, upload_id: &str) -> Result<Vec<PartRecord>, MetadataError> {
        let sql = format!("SELECT {PART_COLUMNS} FROM multipart_parts WHERE upload_id = $1 ORDER BY part_number");
        let rows: Vec<PartRow> =
            with_tx!(&mut self.tx, tx => sqlx::query_as(&sql).bind(upload_id).fetch_all(&mut **tx).await?);
        Ok(rows.into_iter().map(PartRecord::from).collect())
    }

    /// Inserts the part, or replaces the one with its number; returns the replaced part's file name.
    pub async fn upsert_part(&mut self, upload_id: &str, part: &PartRecord) -> Result<Option<String>, MetadataError> {
        let number = i64::from(part.part_number);
        // Read, then write: `Store::put_part` holds the blob-reference lock, so no other install of a part runs
        // between them on either backend.
        let previous: Option<String> = with_tx!(&mut self.tx, tx => sqlx::query_scalar(
            "SELECT staged_name FROM multipart_parts WHERE upload_id = $1 AND part_number = $2")
            .bind(upload_id)
            .bind(number)
            .fetch_optional(&mut **tx)
            .await?);
        with_tx!(&mut self.tx, tx => sqlx::query(
            "INSERT INTO multipart_parts (upload_id, part_number, size, staged_name, md5, sha256, created_at, checksum)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (upload_id, part_number) DO UPDATE SET
                 size = excluded.size, staged_name = excluded.staged_name, md5 = excluded.md5,
                 sha256 = excluded.sha256, created_at = excluded.created_at, checksum = excluded.checksum",
        )
        .bind(upload_id)
        .bind(number)
        .bind(i64::try_from(part.size).expect("part sizes fit in i64"))
        .bind(&part.staged_name)
        .bind(&part.md5)
        .bind(&part.sha256)
        .bind(part.created_at)
        .bind(part.checksum.map(|c| c.column()))
        .execute(&mut **tx)
        .await?.rows_affected());
        Ok(previous)
    }

    /// Deletes the upload with its parts; returns the part files they named (none: no such upload).
    pub async fn delete_upload(&mut self, id: &str) -> Result<Option<Vec<String>>, MetadataError> {
        let names: Vec<String> = with_tx!(&mut self.tx, tx =>
            sqlx::query_scalar("DELETE FROM multipart_parts WHERE upload_id = $1 RETURNING staged_name")
                .bind(id)
                .fetch_all(&mut **tx)
                .await?);
        let deleted = with_tx!(&mut self.tx, tx =>
            sqlx::query("DELETE FROM multipart_uploads WHERE id = $1").bind(id).execute(&mut **tx).await?.rows_affected());
        Ok((deleted > 0).then_some(names))
    }

    /// [`Metadata::held_bytes`] in this transaction: under the write lock, which every part install holds, the
    /// sums cannot change before the part's row is written.
    pub async fn held_bytes(
        &mut self,
        upload_id: &str,
        part_number: u32,
        creator: Option<&str>,
    ) -> Result<HeldBytes, MetadataError> {
        let (upload, by_creator): (i64, i64) = with_tx!(&mut self.tx, tx => sqlx::query_as(HELD_BYTES)
            .bind(upload_id)
            .bind(i64::from(part_number))
            .bind(creator)
            .fetch_one(&mut **tx)
            .await?);
        Ok(HeldBytes { upload: upload as u64, creator: creator.map(|_| by_creator as u64) })
    }

    /// Deletes every upload of the bucket with its parts (a bucket delete); returns how many uploads went and the
    /// part files their parts named.
    pub async fn delete_bucket_uploads(&mut self, bucket_id: i64) -> Result<(u64, Vec<String>), MetadataError> {
        let names: Vec<String> = with_tx!(&mut self.tx, tx => sqlx::query_scalar(
            "DELETE FROM multipart_parts WHERE upload_id IN (SELECT id FROM multipart_uploads WHERE bucket_id = $1)
             RETURNING staged_name",
        )
        .bind(bucket_id)
        .fetch_all(&mut **tx)
        .await?);
        let uploads = with_tx!(&mut self.tx, tx => sqlx::query("DELETE FROM multipart_uploads WHERE bucket_id = $1")
            .bind(bucket_id)
            .execute(&mut **tx)
            .await?
            .rows_affected());
        Ok((uploads, names))
    }

    /// Whether any part row names the file `parts/<name>` (for the sweep, under the write lock).
    /// Which of `names` a part row names, in one query (the sweep's check of a batch of part files).
    pub async fn referenced_part_files(&mut self, names: &[String]) -> Result<HashSet<String>, MetadataError> {
        if names.is_empty() {
            return Ok(HashSet::new());
        }
        let list: Vec<String> = (1..=names.len()).map(|i| format!("${i}")).collect();
        let sql = format!("SELECT staged_name FROM multipart_parts WHERE staged_name IN ({})", list.join(", "));
        let found: Vec<String> = with_tx!(&mut self.tx, tx => {
            let mut query = sqlx::query_scalar(&sql);
            for name in names {
                query = query.bind(name);
            }
            query.fetch_all(&mut **tx).await?
        });
        Ok(found.into_iter().collect())
    }

    pub async fn part_file_is_referenced(&mut self, name: &str) -> Result<bool, MetadataError> {
        let found: bool = with_tx!(&mut self.tx, tx =>
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM multipart_parts WHERE staged_name = $1)")
                .bind(name)
                .fetch_one(&mut **tx)
                .await?);
        Ok(found)
    }

    /// Records the S3 ETag of the object `bucket_id/key` with content `sha256` (write it with the object row). The
    /// same ETag again writes nothing, so it announces no change (the triggers log only rows written).
    pub async fn set_s3_etag(
        &mut self,
        bucket_id: i64,
        key: &str,
        sha256: &str,
        etag: &str,
        part_sizes: Option<&[u64]>,
        checksum: Option<&ObjectChecksum>,
    ) -> Result<(), MetadataError> {
        let part_sizes = part_sizes.map(|sizes| sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(","));
        with_tx!(&mut self.tx, tx => sqlx::query(
            "INSERT INTO object_s3_etags (bucket_id, key, sha256, etag, part_sizes, checksum)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (bucket_id, key) DO UPDATE SET sha256 = excluded.sha256, etag = excluded.etag,
                 part_sizes = excluded.part_sizes, checksum = excluded.checksum
             WHERE object_s3_etags.sha256 <> excluded.sha256 OR object_s3_etags.etag <> excluded.etag
                 OR object_s3_etags.checksum IS DISTINCT FROM excluded.checksum",
        )
        .bind(bucket_id)
        .bind(key)
        .bind(sha256)
        .bind(etag)
        .bind(part_sizes)
        .bind(checksum.map(ObjectChecksum::column))
        .execute(&mut **tx)
        .await?.rows_affected());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{BucketName, ObjectKey};
    use crate::store::metadata::pool::tests::{TestBackend, database};

    fn upload(id: &str, bucket_id: i64, key: &str, created_at: i64) -> UploadRecord {
        UploadRecord {
            id: id.into(),
            bucket_id,
            key: key.into(),
            attrs: ObjectAttrs::default(),
            created_at,
            created_by: None,
            checksum: None,
        }
    }

    fn part(n: u32, name: &str) -> PartRecord {
        PartRecord {
            part_number: n,
            size: u64::from(n) * 10,
            staged_name: name.into(),
            md5: "d".repeat(32),
            sha256: "e".repeat(64),
            created_at: 5,
            checksum: None,
        }
    }

    on_both_backends!(uploads_and_parts_read_back_and_replace);
    async fn uploads_and_parts_read_back_and_replace(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let mut u = upload("u1", bucket.id, "k", 3);
        u.attrs.content_type = Some("text/plain".into());
        meta.create_upload(&u).await.unwrap();
        assert_eq!(meta.upload("u1").await.unwrap(), Some(u));
        assert_eq!(meta.upload("nope").await.unwrap(), None);

        let mut tx = meta.begin_write().await.unwrap();
        assert_eq!(tx.upsert_part("u1", &part(2, "p2")).await.unwrap(), None);
        assert_eq!(tx.upsert_part("u1", &part(1, "p1")).await.unwrap(), None);
        assert_eq!(tx.upsert_part("u1", &part(2, "p2b")).await.unwrap().as_deref(), Some("p2"), "replaced");
        assert!(tx.part_file_is_referenced("p2b").await.unwrap());
        assert!(!tx.part_file_is_referenced("p2").await.unwrap());
        tx.commit().await.unwrap();

        let parts = meta.list_parts("u1", 0, 10).await.unwrap();
        assert_eq!(parts, vec![part(1, "p1"), part(2, "p2b")]);
        assert_eq!(parts[0].etag(), format!("\"{}\"", "d".repeat(32)));
        assert_eq!(meta.list_parts("u1", 1, 10).await.unwrap(), vec![part(2, "p2b")]);
        assert_eq!(meta.list_parts("u1", 0, 1).await.unwrap(), vec![part(1, "p1")]);

        let mut tx = meta.begin_write().await.unwrap();
        let mut names = tx.delete_upload("u1").await.unwrap().unwrap();
        names.sort();
        assert_eq!(names, ["p1", "p2b"]);
        assert_eq!(tx.delete_upload("u1").await.unwrap(), None);
        tx.commit().await.unwrap();
        assert!(meta.list_parts("u1", 0, 10).await.unwrap().is_empty());
    }

    on_both_backends!(a_part_number_outside_1_to_10000_is_refused_by_the_schema);
    async fn a_part_number_outside_1_to_10000_is_refused_by_the_schema(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        meta.create_upload(&upload("u1", bucket.id, "k", 0)).await.unwrap();
        for n in [0, 10_001] {
            let mut tx = meta.begin_write().await.unwrap();
            assert!(tx.upsert_part("u1", &part(n, "p")).await.is_err(), "{n}");
        }
        let mut tx = meta.begin_write().await.unwrap();
        assert!(tx.upsert_part("nope", &part(1, "p")).await.is_err(), "a part needs its upload");
    }

    on_both_backends!(uploads_list_by_key_then_age_under_a_prefix);
    async fn uploads_list_by_key_then_age_under_a_prefix(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let other = meta.create_bucket(&BucketName::parse("other").unwrap(), false, 0).await.unwrap();
        for (id, key) in [("02", "a/x"), ("01", "a/x"), ("03", "a/y"), ("04", "b"), ("05", "a")] {
            meta.create_upload(&upload(id, bucket.id, key, 0)).await.unwrap();
        }
        meta.create_upload(&upload("06", other.id, "a/x", 0)).await.unwrap();
        let ids = |v: Vec<UploadRecord>| v.into_iter().map(|u| u.id).collect::<Vec<_>>();
        assert_eq!(ids(meta.list_uploads(bucket.id, "", None, 10).await.unwrap()), ["05", "01", "02", "03", "04"]);
        assert_eq!(ids(meta.list_uploads(bucket.id, "a/", None, 10).await.unwrap()), ["01", "02", "03"]);
        assert_eq!(ids(meta.list_uploads(bucket.id, "a/", Some(("a/x", None)), 10).await.unwrap()), ["03"]);
        assert_eq!(ids(meta.list_uploads(bucket.id, "", Some(("a/x", Some("01"))), 2).await.unwrap()), ["02", "03"]);
        assert_eq!(ids(meta.list_uploads(bucket.id, "", None, 2).await.unwrap()), ["05", "01"]);
    }

    on_both_backends!(held_bytes_sum_the_other_parts_of_the_upload_and_of_its_creator);
    async fn held_bytes_sum_the_other_parts_of_the_upload_and_of_its_creator(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let by = |id: &str, creator: Option<&str>| UploadRecord {
            created_by: creator.map(str::to_owned),
            ..upload(id, bucket.id, "k", 0)
        };
        for u in [by("a1", Some("AKBGA")), by("a2", Some("AKBGA")), by("b1", Some("AKBGB")), by("old", None)] {
            meta.create_upload(&u).await.unwrap();
            assert_eq!(meta.upload(&u.id).await.unwrap(), Some(u), "created_by reads back");
        }
        let mut tx = meta.begin_write().await.unwrap();
        // part(n, _) has 10·n bytes.
        for (id, n) in [("a1", 1), ("a1", 2), ("a2", 3), ("b1", 4), ("old", 5)] {
            tx.upsert_part(id, &part(n, &format!("{id}-{n}"))).await.unwrap();
        }
        assert_eq!(tx.held_bytes("a1", 2, Some("AKBGA")).await.unwrap(), HeldBytes { upload: 10, creator: Some(40) });
        assert_eq!(tx.held_bytes("a1", 9, Some("AKBGA")).await.unwrap(), HeldBytes { upload: 30, creator: Some(60) });
        assert_eq!(tx.held_bytes("old", 1, None).await.unwrap(), HeldBytes { upload: 50, creator: None }, "no key");
        tx.commit().await.unwrap();
        assert_eq!(meta.held_bytes("b1", 1, Some("AKBGB")).await.unwrap(), HeldBytes { upload: 40, creator: Some(40) });
        let none = HeldBytes { upload: 0, creator: Some(0) };
        assert_eq!(meta.held_bytes("nope", 1, Some("AKBGC")).await.unwrap(), none);
    }

    on_both_backends!(upload_summaries_page_a_buckets_uploads_with_their_parts_and_bytes);
    async fn upload_summaries_page_a_buckets_uploads_with_their_parts_and_bytes(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let other = meta.create_bucket(&BucketName::parse("other").unwrap(), false, 0).await.unwrap();
        for (id, key) in [("02", "a"), ("01", "a"), ("03", "b")] {
            meta.create_upload(&upload(id, bucket.id, key, 0)).await.unwrap();
        }
        meta.create_upload(&upload("04", other.id, "a", 0)).await.unwrap();
        let mut tx = meta.begin_write().await.unwrap();
        for (id, n) in [("02", 1), ("02", 2), ("03", 3), ("04", 4)] {
            tx.upsert_part(id, &part(n, &format!("{id}-{n}"))).await.unwrap();
        }
        tx.commit().await.unwrap();
        let rows = |v: Vec<UploadSummary>| v.into_iter().map(|s| (s.upload.id, s.parts, s.bytes)).collect::<Vec<_>>();
        let all = meta.upload_summaries(bucket.id, None, 10).await.unwrap();
        assert_eq!(rows(all), [("01".into(), 0, 0), ("02".into(), 2, 30), ("03".into(), 1, 30)]);
        assert_eq!(rows(meta.upload_summaries(bucket.id, None, 1).await.unwrap()), [("01".into(), 0, 0)]);
        let next = meta.upload_summaries(bucket.id, Some(("a", "01")), 10).await.unwrap();
        assert_eq!(rows(next), [("02".into(), 2, 30), ("03".into(), 1, 30)]);
        assert_eq!(
            rows(meta.upload_summaries(bucket.id, Some(("a", "02")), 10).await.unwrap()),
            [("03".into(), 1, 30)]
        );
        assert_eq!(rows(meta.upload_summaries(other.id, None, 10).await.unwrap()), [("04".into(), 1, 40)]);
    }

    on_both_backends!(deleting_a_buckets_uploads_returns_their_part_files);
    async fn deleting_a_buckets_uploads_returns_their_part_files(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let other = meta.create_bucket(&BucketName::parse("other").unwrap(), false, 0).await.unwrap();
        for (id, b) in [("u1", bucket.id), ("u2", bucket.id), ("u3", other.id)] {
            meta.create_upload(&upload(id, b, "k", 0)).await.unwrap();
        }
        let mut tx = meta.begin_write().await.unwrap();
        for (id, n) in [("u1", 1), ("u1", 2), ("u3", 1)] {
            tx.upsert_part(id, &part(n, &format!("{id}-{n}"))).await.unwrap();
        }
        let (uploads, mut names) = tx.delete_bucket_uploads(bucket.id).await.unwrap();
        names.sort();
        assert_eq!((uploads, names), (2, vec!["u1-1".to_owned(), "u1-2".to_owned()]));
        tx.commit().await.unwrap();
        assert_eq!(meta.upload("u1").await.unwrap(), None);
        assert!(meta.upload("u3").await.unwrap().is_some(), "another bucket's upload stays");
    }

    on_both_backends!(old_uploads_are_found_oldest_first);
    async fn old_uploads_are_found_oldest_first(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        for (id, at) in [("a", 30), ("b", 10), ("c", 20), ("d", 100)] {
            meta.create_upload(&upload(id, bucket.id, "k", at)).await.unwrap();
        }
        assert_eq!(meta.uploads_created_before(50, 10).await.unwrap(), ["b", "c", "a"]);
        assert_eq!(meta.uploads_created_before(50, 1).await.unwrap(), ["b"]);
    }

    on_both_backends!(an_s3_etag_lives_only_as_long_as_its_content);
    async fn an_s3_etag_lives_only_as_long_as_its_content(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let key = ObjectKey::parse("k").unwrap();
        let (sha_a, sha_b) = ("a".repeat(64), "b".repeat(64));
        let mut tx = meta.begin_write().await.unwrap();
        tx.upsert_object(bucket.id, &key, &sha_a, 1, &ObjectAttrs::default(), 0).await.unwrap();
        tx.set_s3_etag(bucket.id, "k", &sha_a, "\"x-2\"", None, None).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(meta.s3_etag(bucket.id, "k").await.unwrap().as_deref(), Some("\"x-2\""));

        // New metadata, same content: the ETag stays. New content: it goes.
        let attrs = ObjectAttrs { content_type: Some("text/plain".into()), ..ObjectAttrs::default() };
        let mut tx = meta.begin_write().await.unwrap();
        tx.upsert_object(bucket.id, &key, &sha_a, 1, &attrs, 1).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(meta.s3_etag(bucket.id, "k").await.unwrap().as_deref(), Some("\"x-2\""));
        let mut tx = meta.begin_write().await.unwrap();
        tx.upsert_object(bucket.id, &key, &sha_b, 1, &attrs, 2).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(meta.s3_etag(bucket.id, "k").await.unwrap(), None);

        // Deleting the object takes its ETag row with it.
        let mut tx = meta.begin_write().await.unwrap();
        tx.set_s3_etag(bucket.id, "k", &sha_b, "\"y-3\"", None, None).await.unwrap();
        tx.delete_object(bucket.id, &key).await.unwrap();
        tx.commit().await.unwrap();
        let rows: i64 = with_pool!(&meta.backend, pool =>
            sqlx::query_scalar("SELECT count(*) FROM object_s3_etags").fetch_one(pool).await.unwrap());
        assert_eq!(rows, 0);
    }
}
