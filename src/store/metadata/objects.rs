//! Buckets and objects: reads on the pool, writes in a [`WriteTx`]. Listings are keyset pages (a bucket's objects
//! under a prefix from a start key), upserts leave an identical row alone, and S3 user metadata and tags are
//! stored with the object.

use super::thread_reads::ReadRow;
use super::variants::VariantRecord;
use super::{Metadata, MetadataError, WriteTx};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, LazyLock};

use crate::header_values::checksum::ObjectChecksum;
use crate::header_values::cors::{CorsPolicy, CorsRule};
use crate::names::{BucketName, IndexDocument, ObjectAttrs, ObjectKey, Website, prefix_upper_bound};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub id: i64,
    pub name: String,
    pub public: bool,
    pub created_at: i64,
    /// Cache-Control served for the bucket's objects that store none.
    pub default_cache_control: Option<String>,
    /// The bucket's CORS rule, prepared (migration 0008). A stored rule that no longer validates reads as none.
    pub cors: Option<Arc<CorsPolicy>>,
    /// Index and error documents (migration 0017). A stored value that no longer parses reads as none.
    pub website: Website,
}

/// What [`Metadata::update_bucket`] changes: `None` leaves a field as it is, `Some(None)` clears it.
#[derive(Debug, Default, Clone, Copy)]
pub struct BucketChanges<'a> {
    pub public: Option<bool>,
    pub default_cache_control: Option<Option<&'a str>>,
    pub index_document: Option<Option<&'a IndexDocument>>,
    pub error_document: Option<Option<&'a ObjectKey>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRecord {
    pub bucket_id: i64,
    pub key: String,
    pub sha256: String,
    pub size: u64,
    pub attrs: ObjectAttrs,
    pub created_at: i64,
    pub updated_at: i64,
    /// The ETag S3 requests see (`object_s3_etags`, quoted): the MD5 of a single upload, or a multipart upload's
    /// `"<md5 of md5s>-N"`; `None` for an object stored before MD5s were recorded (S3 then sees the native ETag).
    pub s3_etag: Option<String>,
    /// The sizes of the parts of a multipart upload that stored this content, in order; `None` for a single
    /// upload or when not recorded (one part: the whole object).
    pub part_sizes: Option<Vec<u64>>,
    /// The S3 checksum an upload gave or Complete made (migration 0021), stored with the S3 ETag for this
    /// content; `None` when none was (reads then answer the SHA-256 alone: `checksum::answered`).
    pub checksum: Option<ObjectChecksum>,
}

/// Part `number` (from 1) of an object of `size` bytes stored in parts of `sizes`, as (offset, length), and the
/// number of parts; `None` past the last part. An object without recorded parts is one part.
pub fn part_region(sizes: Option<&[u64]>, size: u64, number: u32) -> (Option<(u64, u64)>, u32) {
    let whole = [size];
    let sizes = sizes.unwrap_or(&whole);
    let count = u32::try_from(sizes.len()).unwrap_or(u32::MAX);
    let index = number.checked_sub(1).map(|i| i as usize);
    let region = index.filter(|&i| i < sizes.len()).map(|i| (sizes[..i].iter().sum(), sizes[i]));
    (region, count)
}

impl ObjectRecord {
    /// Part `number` (from 1) as (offset, length) and the number of parts, or `None` past the last part. An
    /// object without recorded parts is one part.
    pub fn part(&self, number: u32) -> (Option<(u64, u64)>, u32) {
        part_region(self.part_sizes.as_deref(), self.size, number)
    }

    /// The ETag S3 requests see: the stored S3 ETag, else (an object stored before those were recorded) the
    /// native one.
    /// Whether `etag` (quoted) is one of this object's validators: its content ETag (the native API's, the quoted
    /// SHA-256) or its S3 ETag (an MD5, or a multipart ETag): 64 hex digits against 32 (or `-N`), never both.
    pub fn has_etag(&self, etag: &str) -> bool {
        self.s3_etag.as_deref() == Some(etag) || crate::header_values::etag_from_sha256(&self.sha256) == etag
    }

    pub fn s3_etag_or_native(&self) -> String {
        self.s3_etag.clone().unwrap_or_else(|| crate::header_values::etag_from_sha256(&self.sha256))
    }
}

/// How an upsert changed the object row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upsert {
    Created,
    /// The row already held exactly this content and these attributes: nothing was written.
    Unchanged,
    /// The row was rewritten; `previous_sha256` is the hash it referenced before.
    Replaced {
        previous_sha256: String,
    },
}

const BUCKET_COLUMNS: &str =
    "id, name, public, created_at, default_cache_control, cors, index_document, error_document";
/// Every column of an object row (`ObjectRow`), read from [`OBJECTS_WITH_S3_ETAG`].
const OBJECT_COLUMNS: &str = "o.bucket_id, o.key, o.sha256, o.size, o.content_type, o.cache_control, \
     o.content_disposition, o.user_metadata, o.tags, o.created_at, o.updated_at, e.etag AS s3_etag, e.part_sizes, \
     e.checksum";
/// Objects (`o`) with their S3 ETag (`e`), if one is stored for their current content.
const OBJECTS_WITH_S3_ETAG: &str = "objects o LEFT JOIN object_s3_etags e \
     ON e.bucket_id = o.bucket_id AND e.key = o.key AND e.sha256 = o.sha256";

struct BucketRow {
    id: i64,
    name: String,
    public: bool,
    created_at: i64,
    default_cache_control: Option<String>,
    cors: Option<String>,
    index_document: Option<String>,
    error_document: Option<String>,
}
from_row!(BucketRow { id, name, public, created_at, default_cache_control, cors, index_document, error_document });

impl From<BucketRow> for Bucket {
    fn from(r: BucketRow) -> Self {
        Bucket {
            id: r.id,
            name: r.name,
            public: r.public,
            created_at: r.created_at,
            default_cache_control: r.default_cache_control,
            cors: r.cors.as_deref().and_then(CorsPolicy::from_json).map(Arc::new),
            website: Website {
                index_document: r.index_document.as_deref().and_then(|d| IndexDocument::parse(d).ok()),
                error_document: r.error_document.as_deref().and_then(|d| ObjectKey::parse(d).ok()),
            },
        }
    }
}

struct ObjectRow {
    bucket_id: i64,
    key: String,
    sha256: String,
    size: i64,
    content_type: Option<String>,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    user_metadata: Option<String>,
    tags: Option<String>,
    created_at: i64,
    updated_at: i64,
    s3_etag: Option<String>,
    part_sizes: Option<String>,
    checksum: Option<String>,
}
from_row!(ObjectRow {
    bucket_id,
    key,
    sha256,
    size,
    content_type,
    cache_control,
    content_disposition,
    user_metadata,
    tags,
    created_at,
    updated_at,
    s3_etag,
    part_sizes,
    checksum
});

impl From<ObjectRow> for ObjectRecord {
    fn from(r: ObjectRow) -> Self {
        ObjectRecord {
            bucket_id: r.bucket_id,
            key: r.key,
            sha256: r.sha256,
            size: r.size as u64,
            attrs: ObjectAttrs {
                content_type: r.content_type,
                cache_control: r.cache_control,
                content_disposition: r.content_disposition,
                user_metadata: string_map_from_column(r.user_metadata.as_deref()),
                tags: string_map_from_column(r.tags.as_deref()),
            },
            created_at: r.created_at,
            updated_at: r.updated_at,
            s3_etag: r.s3_etag,
            // A column that does not parse (written by hand) is as good as none: the object is one part.
            part_sizes: r.part_sizes.as_deref().and_then(|sizes| sizes.split(',').map(|n| n.parse().ok()).collect()),
            checksum: r.checksum.as_deref().and_then(ObjectChecksum::from_column),
        }
    }
}

/// An object, its bucket's default Cache-Control, and its variants: what a cache miss reads.
pub type ObjectWithDefault = (ObjectRecord, Option<String>, Vec<VariantRecord>);

/// The object lookup of a cache miss: the object with its S3 ETag, its bucket's default Cache-Control, and one
/// row per variant (NULLs when it has none), in encoding order.
static OBJECT_WITH_VARIANTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {OBJECT_COLUMNS}, b.default_cache_control, \
         v.encoding AS variant_encoding, v.sha256 AS variant_sha256, v.size AS variant_size \
         FROM {OBJECTS_WITH_S3_ETAG} JOIN buckets b ON b.id = o.bucket_id \
         LEFT JOIN object_variants v ON v.bucket_id = o.bucket_id AND v.key = o.key \
         WHERE o.bucket_id = $1 AND o.key = $2 ORDER BY v.encoding"
    )
});

/// A row of [`OBJECT_WITH_VARIANTS`].
struct ObjectWithVariantRow {
    object: ObjectRow,
    default_cache_control: Option<String>,
    variant_encoding: Option<String>,
    variant_sha256: Option<String>,
    variant_size: Option<i64>,
}
from_row!(ObjectWithVariantRow { default_cache_control, variant_encoding, variant_sha256, variant_size } flatten { object: ObjectRow });

impl ObjectWithVariantRow {
    /// The object (from the first row: every row repeats it) with its bucket's default and its variants.
    fn assemble(rows: Vec<Self>) -> Option<ObjectWithDefault> {
        let mut variants = Vec::new();
        let mut first = None;
        for row in rows {
            if let (Some(encoding), Some(sha256), Some(size)) =
                (row.variant_encoding, row.variant_sha256, row.variant_size)
            {
                variants.push(VariantRecord { encoding, sha256, size });
            }
            if first.is_none() {
                first = Some((row.object, row.default_cache_control));
            }
        }
        first.map(|(object, default)| (object.into(), default, variants))
    }
}

/// What `upsert_object` compares to decide whether anything changes.
#[derive(PartialEq, Eq)]
struct StoredContent {
    sha256: String,
    size: i64,
    content_type: Option<String>,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    user_metadata: Option<String>,
    tags: Option<String>,
}
from_row!(StoredContent { sha256, size, content_type, cache_control, content_disposition, user_metadata, tags });

/// The `user_metadata` and `tags` columns: a JSON object of names to values, NULL for none (a `BTreeMap` writes
/// its names in order, so equal maps are equal text).
pub(super) fn string_map_column(map: &BTreeMap<String, String>) -> Option<String> {
    (!map.is_empty()).then(|| serde_json::to_string(map).expect("a map of strings serializes"))
}

/// Such a column read back; text that is not such an object (written by hand) reads as none.
pub(super) fn string_map_from_column(column: Option<&str>) -> BTreeMap<String, String> {
    column.and_then(|text| serde_json::from_str(text).ok()).unwrap_or_default()
}

impl Metadata {
    pub async fn create_bucket(&self, name: &BucketName, public: bool, now: i64) -> Result<Bucket, MetadataError> {
        let mut tx = self.begin_write().await?;
        let inserted: Option<i64> = with_tx!(&mut tx.tx, sqlite => sqlx::query_scalar(
            "INSERT INTO buckets (name, public, created_at) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO NOTHING RETURNING id",
        )
        .bind(name.as_str())
        .bind(public)
        .bind(now)
        .fetch_optional(&mut **sqlite)
        .await?);
        let Some(id) = inserted else {
            return Err(MetadataError::BucketExists(name.to_string()));
        };
        tx.commit().await?;
        let (default_cache_control, cors, website) = (None, None, Website::NONE);
        Ok(Bucket { id, name: name.to_string(), public, created_at: now, default_cache_control, cors, website })
    }

    pub async fn bucket(&self, name: &BucketName) -> Result<Option<Bucket>, MetadataError> {
        let sql = format!("SELECT {BUCKET_COLUMNS} FROM buckets WHERE name = $1");
        let row: Option<BucketRow> =
            with_pool!(&self.backend, pool => sqlx::query_as(&sql).bind(name.as_str()).fetch_optional(pool).await?);
        Ok(row.map(Bucket::from))
    }

    pub async fn list_buckets(&self) -> Result<Vec<Bucket>, MetadataError> {
        let sql = format!("SELECT {BUCKET_COLUMNS} FROM buckets ORDER BY name");
        let rows: Vec<BucketRow> = with_pool!(&self.backend, pool => sqlx::query_as(&sql).fetch_all(pool).await?);
        Ok(rows.into_iter().map(Bucket::from).collect())
    }

    /// Changes a bucket's access, its default Cache-Control and its index and error documents, in one statement.
    /// Returns the changed bucket, or `None` when there is no such bucket.
    pub async fn update_bucket(
        &self,
        name: &BucketName,
        changes: BucketChanges<'_>,
    ) -> Result<Option<Bucket>, MetadataError> {
        let BucketChanges { public, default_cache_control, index_document, error_document } = changes;
        let mut tx = self.begin_write().await?;
        let sql = format!(
            "UPDATE buckets SET public = coalesce($2, public),
                 default_cache_control = CASE WHEN $3 THEN $4 ELSE default_cache_control END,
                 index_document = CASE WHEN $5 THEN $6 ELSE index_document END,
                 error_document = CASE WHEN $7 THEN $8 ELSE error_document END
             WHERE name = $1 RETURNING {BUCKET_COLUMNS}"
        );
        let row: Option<BucketRow> = with_tx!(&mut tx.tx, sqlite => sqlx::query_as(&sql)
            .bind(name.as_str())
            .bind(public)
            .bind(default_cache_control.is_some())
            .bind(default_cache_control.flatten())
            .bind(index_document.is_some())
            .bind(index_document.flatten().map(IndexDocument::as_str))
            .bind(error_document.is_some())
            .bind(error_document.flatten().map(ObjectKey::as_str))
            .fetch_optional(&mut **sqlite)
            .await?);
        commit_bucket_update(tx, row).await
    }

    /// Sets (`Some`) or clears (`None`) a bucket's CORS rule, which must be valid. Returns the changed bucket, or
    /// `None` when there is no such bucket.
    pub async fn set_bucket_cors(
        &self,
        name: &BucketName,
        rule: Option<&CorsRule>,
    ) -> Result<Option<Bucket>, MetadataError> {
        let mut tx = self.begin_write().await?;
        let sql = format!("UPDATE buckets SET cors = $2 WHERE name = $1 RETURNING {BUCKET_COLUMNS}");
        let row: Option<BucketRow> = with_tx!(&mut tx.tx, sqlite => sqlx::query_as(&sql)
            .bind(name.as_str())
            .bind(rule.map(CorsRule::to_json))
            .fetch_optional(&mut **sqlite)
            .await?);
        commit_bucket_update(tx, row).await
    }

    /// The object, its bucket's default Cache-Control and its variants, read by one statement (a row per variant,
    /// or one without), so that they agree (a put that replaces the object and its variants is either wholly seen
    /// or not at all: one statement reads one snapshot on both backends) and a miss costs one trip to the
    /// database: no transaction around it, and on PostgreSQL one prepared round trip.
    pub async fn object_with_bucket_default(
        &self,
        bucket_id: i64,
        key: &str,
    ) -> Result<Option<ObjectWithDefault>, MetadataError> {
        let rows: Vec<ObjectWithVariantRow> = with_pool!(&self.backend, pool => {
            sqlx::query_as(OBJECT_WITH_VARIANTS.as_str()).bind(bucket_id).bind(key).fetch_all(pool).await?
        });
        Ok(ObjectWithVariantRow::assemble(rows))
    }

    /// [`Metadata::object_with_bucket_default`] on the calling thread, without awaiting (SQLite: `thread_reads`);
    /// `None` when the backend cannot (PostgreSQL) or the read failed, and the caller then awaits that one.
    pub fn object_with_bucket_default_now(&self, bucket_id: i64, key: &str) -> Option<Option<ObjectWithDefault>> {
        self.thread_readers.as_ref()?.read("object", |connection| {
            let mut statement = connection.prepare_cached(&OBJECT_WITH_VARIANTS)?;
            debug_assert!(ObjectWithVariantRow::matches(&statement), "columns out of the row's order");
            let rows = statement.query_map((bucket_id, key), ObjectWithVariantRow::read_row)?;
            Ok(ObjectWithVariantRow::assemble(rows.collect::<Result<Vec<_>, _>>()?))
        })
    }

    /// One page of a bucket's objects whose keys start with `prefix`, in key order, after the key `after` (the
    /// last one of the previous page). A keyset scan over the primary key: each page is one index range read,
    /// however far into the bucket it is, and a listing never holds more than a page in memory.
    pub async fn list_objects_page(
        &self,
        bucket_id: i64,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ObjectRecord>, MetadataError> {
        let upper = prefix_upper_bound(prefix);
        let sql = list_objects_sql(after.is_some(), upper.is_some());
        let rows: Vec<ObjectRow> = with_pool!(&self.backend, pool => sqlx::query_as(&sql)
            .bind(bucket_id)
            .bind(after.unwrap_or(prefix))
            .bind(upper.as_deref())
            .bind(i64::from(limit))
            .bind(prefix)
            .fetch_all(pool)
            .await?);
        Ok(rows.into_iter().map(ObjectRecord::from).collect())
    }

    /// `list_objects_page`, starting at the key `from` inclusive (which must not sort below `prefix`): how the S3
    /// listing skips past a whole common prefix, by seeking to its successor, in one index range read.
    pub async fn list_objects_page_from(
        &self,
        bucket_id: i64,
        prefix: &str,
        from: &str,
        limit: u32,
    ) -> Result<Vec<ObjectRecord>, MetadataError> {
        let upper = prefix_upper_bound(prefix);
        let sql = list_objects_sql(false, upper.is_some());
        let rows: Vec<ObjectRow> = with_pool!(&self.backend, pool => sqlx::query_as(&sql)
            .bind(bucket_id)
            .bind(from.max(prefix))
            .bind(upper.as_deref())
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?);
        Ok(rows.into_iter().map(ObjectRecord::from).collect())
    }

    pub async fn object_by_key(&self, bucket_id: i64, key: &str) -> Result<Option<ObjectRecord>, MetadataError> {
        let sql = format!("SELECT {OBJECT_COLUMNS} FROM {OBJECTS_WITH_S3_ETAG} WHERE o.bucket_id = $1 AND o.key = $2");
        let row: Option<ObjectRow> = with_pool!(&self.backend, pool => sqlx::query_as(&sql).bind(bucket_id).bind(key).fetch_optional(pool).await?);
        Ok(row.map(ObjectRecord::from))
    }

    /// Which of `hashes` an object or a variant references, in one query outside any write transaction (the
    /// sweep's first pass over a batch of blob files).
    pub async fn referenced_blobs(&self, hashes: &[String]) -> Result<HashSet<String>, MetadataError> {
        if hashes.is_empty() {
            return Ok(HashSet::new());
        }
        let sql = referenced_blobs_sql(hashes.len());
        let found: Vec<String> = with_pool!(&self.backend, pool => {
            let mut query = sqlx::query_scalar(&sql);
            for sha in hashes {
                query = query.bind(sha);
            }
            query.fetch_all(pool).await?
        });
        Ok(found.into_iter().collect())
    }

    /// How many objects reference the blob, outside any write transaction (for the sweep's first pass).
    pub async fn blob_is_referenced(&self, sha256: &str) -> Result<bool, MetadataError> {
        let n: i64 = with_pool!(&self.backend, pool => sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM objects WHERE sha256 = $1) + (SELECT count(*) FROM object_variants WHERE sha256 = $1)",
        )
        .bind(sha256)
        .fetch_one(pool)
        .await?);
        Ok(n > 0)
    }
}

impl WriteTx {
    /// The object row with its S3 ETag, read inside the transaction (under the blob-reference lock, its blob
    /// stays referenced until the commit).
    pub async fn object_by_key(&mut self, bucket_id: i64, key: &str) -> Result<Option<ObjectRecord>, MetadataError> {
        let sql = format!("SELECT {OBJECT_COLUMNS} FROM {OBJECTS_WITH_S3_ETAG} WHERE o.bucket_id = $1 AND o.key = $2");
        let row: Option<ObjectRow> = with_tx!(&mut self.tx, tx => sqlx::query_as(&sql)
            .bind(bucket_id)
            .bind(key)
            .fetch_optional(&mut **tx)
            .await?);
        Ok(row.map(ObjectRecord::from))
    }

    pub async fn bucket(&mut self, name: &BucketName) -> Result<Option<Bucket>, MetadataError> {
        let sql = format!("SELECT {BUCKET_COLUMNS} FROM buckets WHERE name = $1");
        let row: Option<BucketRow> =
            with_tx!(&mut self.tx, tx => sqlx::query_as(&sql).bind(name.as_str()).fetch_optional(&mut **tx).await?);
        Ok(row.map(Bucket::from))
    }

    pub async fn object_count(&mut self, bucket_id: i64) -> Result<u64, MetadataError> {
        let n: i64 = with_tx!(&mut self.tx, tx => sqlx::query_scalar("SELECT count(*) FROM objects WHERE bucket_id = $1")
            .bind(bucket_id)
            .fetch_one(&mut **tx)
            .await?);
        Ok(n as u64)
    }

    /// Deletes up to `limit` objects of a bucket, first keys first, with their variants; returns how many objects
    /// went and the hashes they referenced (objects' and variants').
    pub async fn delete_objects_batch(
        &mut self,
        bucket_id: i64,
        limit: u32,
    ) -> Result<(u64, Vec<String>), MetadataError> {
        // The same first keys from both tables: variants first, while their objects still name the keys.
        let mut deleted = Vec::with_capacity(2);
        for table in ["object_variants", "objects"] {
            let sql = format!(
                "DELETE FROM {table} WHERE bucket_id = $1
                     AND key IN (SELECT key FROM objects WHERE bucket_id = $1 ORDER BY key LIMIT $2)
                 RETURNING sha256"
            );
            let hashes: Vec<String> = with_tx!(&mut self.tx, tx => sqlx::query_scalar(&sql)
                .bind(bucket_id)
                .bind(i64::from(limit))
                .fetch_all(&mut **tx)
                .await?);
            deleted.push(hashes);
        }
        let (object_hashes, mut hashes) = (deleted.pop().unwrap_or_default(), deleted.pop().unwrap_or_default());
        let objects = object_hashes.len() as u64;
        hashes.extend(object_hashes);
        Ok((objects, hashes))
    }

    /// Deletes an empty bucket with the tokens and S3 keys that grant only it (explicitly, so the change log names
    /// each one, in the same order on both backends) and, by cascade, its download stats, multipart uploads and
    /// the grants other credentials held on it. Returns how many tokens went with it.
    pub async fn delete_empty_bucket(&mut self, bucket_id: i64) -> Result<u64, MetadataError> {
        // Credentials whose every grant is on this bucket go with it; the others lose its grants (cascade).
        let mut deleted = [0; 2];
        for (count, t) in deleted.iter_mut().zip([&super::auth::TOKENS, &super::s3_keys::S3_KEYS]) {
            let sql = format!(
                "DELETE FROM {table} WHERE id IN (SELECT {owner} FROM {grants} WHERE bucket_id = $1)
                 AND NOT EXISTS (SELECT 1 FROM {grants} o
                                 WHERE o.{owner} = {table}.id AND (o.bucket_id IS NULL OR o.bucket_id <> $1))",
                table = t.table,
                grants = t.grants,
                owner = t.owner,
            );
            *count = with_tx!(&mut self.tx, tx =>
                sqlx::query(&sql).bind(bucket_id).execute(&mut **tx).await?.rows_affected());
        }
        with_tx!(&mut self.tx, tx =>
            sqlx::query("DELETE FROM buckets WHERE id = $1").bind(bucket_id).execute(&mut **tx).await?.rows_affected());
        Ok(deleted[0])
    }

    /// Inserts or replaces the object row. A row that already holds the same hash and attributes is left as it
    /// is, so importing the same tree twice changes nothing (not even Last-Modified). The read and the write are
    /// not atomic on their own: callers hold the blob-reference lock (`Metadata::lock_blob_refs`), which orders
    /// them against every other writer of object rows (PostgreSQL's READ COMMITTED included).
    pub async fn upsert_object(
        &mut self,
        bucket_id: i64,
        key: &ObjectKey,
        sha256: &str,
        size: u64,
        attrs: &ObjectAttrs,
        now: i64,
    ) -> Result<Upsert, MetadataError> {
        let existing: Option<StoredContent> = with_tx!(&mut self.tx, tx => sqlx::query_as(
            "SELECT sha256, size, content_type, cache_control, content_disposition, user_metadata, tags
             FROM objects WHERE bucket_id = $1 AND key = $2",
        )
        .bind(bucket_id)
        .bind(key.as_str())
        .fetch_optional(&mut **tx)
        .await?);
        let size = i64::try_from(size).expect("object sizes fit in i64");
        let wanted = StoredContent {
            sha256: sha256.to_owned(),
            size,
            content_type: attrs.content_type.clone(),
            cache_control: attrs.cache_control.clone(),
            content_disposition: attrs.content_disposition.clone(),
            user_metadata: string_map_column(&attrs.user_metadata),
            tags: string_map_column(&attrs.tags),
        };
        let outcome = match existing {
            Some(stored) if stored == wanted => return Ok(Upsert::Unchanged),
            Some(stored) => Upsert::Replaced { previous_sha256: stored.sha256 },
            None => Upsert::Created,
        };
        with_tx!(&mut self.tx, tx => sqlx::query(
            "INSERT INTO objects (bucket_id, key, sha256, size, content_type, cache_control, content_disposition,
                                  user_metadata, tags, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $9, $10, $8, $8)
             ON CONFLICT (bucket_id, key) DO UPDATE SET
                 sha256 = excluded.sha256, size = excluded.size, content_type = excluded.content_type,
                 cache_control = excluded.cache_control, content_disposition = excluded.content_disposition,
                 user_metadata = excluded.user_metadata, tags = excluded.tags, updated_at = excluded.updated_at",
        )
        .bind(bucket_id)
        .bind(key.as_str())
        .bind(sha256)
        .bind(size)
        .bind(&attrs.content_type)
        .bind(&attrs.cache_control)
        .bind(&attrs.content_disposition)
        .bind(now)
        .bind(&wanted.user_metadata)
        .bind(&wanted.tags)
        .execute(&mut **tx)
        .await?.rows_affected());
        Ok(outcome)
    }

    /// Replaces an object's tags in place (its content, ETag and Last-Modified stay); `false` when there is no
    /// such object. The update is logged like any, so caches drop the entry.
    pub async fn set_object_tags(
        &mut self,
        bucket_id: i64,
        key: &ObjectKey,
        tags: &BTreeMap<String, String>,
    ) -> Result<bool, MetadataError> {
        let updated = with_tx!(&mut self.tx, tx => sqlx::query(
            "UPDATE objects SET tags = $1 WHERE bucket_id = $2 AND key = $3",
        )
        .bind(string_map_column(tags))
        .bind(bucket_id)
        .bind(key.as_str())
        .execute(&mut **tx)
        .await?.rows_affected());
        Ok(updated > 0)
    }

    /// Deletes the object row with its variants; returns the hashes they referenced (the object's first), or `None`
    /// when there was no such object.
    pub async fn delete_object(
        &mut self,
        bucket_id: i64,
        key: &ObjectKey,
    ) -> Result<Option<Vec<String>>, MetadataError> {
        let variant_hashes = self.delete_variants(bucket_id, key.as_str()).await?;
        let sha: Option<String> = with_tx!(&mut self.tx, tx => sqlx::query_scalar(
            "DELETE FROM objects WHERE bucket_id = $1 AND key = $2 RETURNING sha256",
        )
        .bind(bucket_id)
        .bind(key.as_str())
        .fetch_optional(&mut **tx)
        .await?);
        Ok(sha.map(|sha| std::iter::once(sha).chain(variant_hashes).collect()))
    }

    /// [`Metadata::referenced_blobs`] inside the transaction (under the blob-reference lock: the re-check of a
    /// batch before its blobs are retired).
    pub async fn referenced_blobs(&mut self, hashes: &[String]) -> Result<HashSet<String>, MetadataError> {
        if hashes.is_empty() {
            return Ok(HashSet::new());
        }
        let sql = referenced_blobs_sql(hashes.len());
        let found: Vec<String> = with_tx!(&mut self.tx, tx => {
            let mut query = sqlx::query_scalar(&sql);
            for sha in hashes {
                query = query.bind(sha);
            }
            query.fetch_all(&mut **tx).await?
        });
        Ok(found.into_iter().collect())
    }

    pub async fn blob_is_referenced(&mut self, sha256: &str) -> Result<bool, MetadataError> {
        // A variant's blob is a reference like an object's.
        let found: bool = with_tx!(&mut self.tx, tx => sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM objects WHERE sha256 = $1)
                 OR EXISTS (SELECT 1 FROM object_variants WHERE sha256 = $1)",
        )
        .bind(sha256)
        .fetch_one(&mut **tx)
        .await?);
        Ok(found)
    }
}

/// The hashes among `$1..$n` that an object or a variant references (both indexed by sha256). A full batch
/// always has the same `n`, so a sweep prepares one statement, and another for its last, shorter batch.
fn referenced_blobs_sql(n: usize) -> String {
    let list: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
    let list = list.join(", ");
    format!(
        "SELECT sha256 FROM objects WHERE sha256 IN ({list}) UNION SELECT sha256 FROM object_variants WHERE sha256 IN ({list})"
    )
}

/// The page query of `list_objects_page`. $2 is the lower bound (inclusive: the prefix; exclusive: the last key
/// of the previous page), $3 the exclusive upper bound of keys with the prefix, $4 the page size, $5 the prefix:
/// with a last key, the prefix still bounds the page from below (a last key from below the prefix, which the
/// listings never pass, lists nothing outside it).
fn list_objects_sql(after: bool, upper: bool) -> String {
    let lower = if after { "o.key > $2 AND o.key >= $5" } else { "o.key >= $2" };
    let upper = if upper { " AND o.key < $3" } else { "" };
    format!(
        "SELECT {OBJECT_COLUMNS} FROM {OBJECTS_WITH_S3_ETAG}
         WHERE o.bucket_id = $1 AND {lower}{upper} ORDER BY o.key LIMIT $4"
    )
}

/// Commits a bucket update that returned `row` (the changed bucket, or `None` when there was no such bucket, in
/// which case nothing changed and the transaction is dropped).
async fn commit_bucket_update(tx: WriteTx, row: Option<BucketRow>) -> Result<Option<Bucket>, MetadataError> {
    let Some(row) = row else {
        return Ok(None);
    };
    tx.commit().await?;
    Ok(Some(row.into()))
}

#[cfg(test)]
mod tests {
    use sqlx::Row;

    use crate::store::metadata::Backend;

    use super::*;

    #[test]
    fn a_part_is_a_region_of_the_object_and_an_object_without_parts_is_one() {
        let record = |size, part_sizes| ObjectRecord {
            bucket_id: 1,
            key: "k".into(),
            sha256: "a".repeat(64),
            size,
            attrs: ObjectAttrs::default(),
            created_at: 0,
            updated_at: 0,
            s3_etag: None,
            part_sizes,
            checksum: None,
        };
        let multi = record(12, Some(vec![5, 5, 2]));
        assert_eq!(multi.part(1), (Some((0, 5)), 3));
        assert_eq!(multi.part(3), (Some((10, 2)), 3));
        assert_eq!(multi.part(4), (None, 3));
        assert_eq!(multi.part(0), (None, 3));
        let single = record(9, None);
        assert_eq!(single.part(1), (Some((0, 9)), 1));
        assert_eq!(single.part(2), (None, 1));
    }
    use crate::store::metadata::pool::tests::{TestBackend, database};

    #[tokio::test]
    async fn an_object_page_is_one_primary_key_range() {
        let (_dir, meta) = database(TestBackend::Sqlite).await;
        let Backend::Sqlite(pool) = &meta.backend else { unreachable!("an SQLite store") };
        for (after, upper, plan) in [
            (false, false, "(bucket_id=? AND key>?)"),
            (true, false, "(bucket_id=? AND key>?)"),
            (false, true, "(bucket_id=? AND key>? AND key<?)"),
            (true, true, "(bucket_id=? AND key>? AND key<?)"),
        ] {
            let sql = format!("EXPLAIN QUERY PLAN {}", list_objects_sql(after, upper));
            let rows = sqlx::query(&sql).bind(1).bind("a").bind("b").bind(10).fetch_all(pool).await.unwrap();
            let details: Vec<String> = rows.iter().map(|r| r.get::<String, _>(3)).collect();
            // The page's range, and for each row one primary-key look-up of its S3 ETag.
            assert_eq!(details.len(), 2, "{details:?}");
            assert!(details[0].starts_with("SEARCH o USING PRIMARY KEY"), "{details:?}");
            assert!(details[0].ends_with(plan), "{details:?}");
            assert!(details[1].starts_with("SEARCH e USING PRIMARY KEY (bucket_id=? AND key=?)"), "{details:?}");
            assert!(!details.iter().any(|d| d.contains("TEMP B-TREE")), "no sort: {details:?}");
        }
    }

    /// The thread's read takes columns by position: every field of a row with all of them set reads back as the
    /// pool's read (by name) has it, and the statement's columns are in the row's order.
    #[tokio::test]
    async fn a_read_on_the_thread_is_the_pools_read_field_for_field() {
        let (_dir, meta) = database(TestBackend::Sqlite).await;
        let name = BucketName::parse("bkt").unwrap();
        let bucket = meta.create_bucket(&name, false, 0).await.unwrap();
        let changes = BucketChanges { default_cache_control: Some(Some("max-age=60")), ..Default::default() };
        meta.update_bucket(&name, changes).await.unwrap();
        let attrs = ObjectAttrs {
            content_type: Some("text/plain".into()),
            cache_control: Some("no-cache".into()),
            content_disposition: Some("attachment".into()),
            user_metadata: [("a".to_owned(), "1".to_owned())].into(),
            tags: [("t".to_owned(), "2".to_owned())].into(),
        };
        let sha = "ab".repeat(32);
        let key = ObjectKey::parse("dir/k.txt").unwrap();
        let mut tx = meta.begin_write().await.unwrap();
        tx.upsert_object(bucket.id, &key, &sha, 12, &attrs, 7).await.unwrap();
        let checksum = ObjectChecksum::sha256_hex(&sha).unwrap();
        tx.set_s3_etag(bucket.id, "dir/k.txt", &sha, "\"e-2\"", Some(&[8, 4]), Some(&checksum)).await.unwrap();
        let variants = [("br", "cd"), ("gzip", "ef")].map(|(encoding, hex)| VariantRecord {
            encoding: encoding.into(),
            sha256: hex.repeat(32),
            size: 5,
        });
        tx.replace_variants(bucket.id, "dir/k.txt", &variants).await.unwrap();
        tx.commit().await.unwrap();

        let by_name = meta.object_with_bucket_default(bucket.id, "dir/k.txt").await.unwrap();
        let by_position = meta.object_with_bucket_default_now(bucket.id, "dir/k.txt").expect("read on the thread");
        assert_eq!(by_position, by_name);
        let (record, default, read_variants) = by_position.unwrap();
        assert_eq!((record.size, record.attrs, default), (12, attrs, Some("max-age=60".to_owned())));
        assert_eq!((record.part_sizes, read_variants), (Some(vec![8, 4]), variants.to_vec()));
        assert_eq!(meta.object_with_bucket_default_now(bucket.id, "absent"), Some(None));

        let readers = meta.thread_readers.as_ref().unwrap();
        let matches =
            readers.read("columns", |c| Ok(ObjectWithVariantRow::matches(&c.prepare(&OBJECT_WITH_VARIANTS)?)));
        assert_eq!(matches, Some(true), "the statement's columns are in the row's order");
    }

    on_both_backends!(pages_follow_on_from_the_last_key);
    async fn pages_follow_on_from_the_last_key(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let other = meta.create_bucket(&BucketName::parse("other").unwrap(), false, 0).await.unwrap();
        // Byte order ("B" before "a", "é" last), whatever the database's default collation.
        let keys = ["B", "a", "a/1", "a/2", "a/3", "a0", "b", "é"];
        let mut tx = meta.begin_write().await.unwrap();
        for (i, key) in keys.iter().enumerate() {
            let key = ObjectKey::parse(key).unwrap();
            tx.upsert_object(bucket.id, &key, &"0".repeat(64), 0, &ObjectAttrs::default(), i as i64).await.unwrap();
            tx.upsert_object(other.id, &key, &"0".repeat(64), 0, &ObjectAttrs::default(), 0).await.unwrap();
        }
        tx.commit().await.unwrap();
        let list = |prefix: &'static str, page: u32| {
            let meta = meta.clone();
            async move {
                let (mut all, mut after) = (Vec::new(), None::<String>);
                loop {
                    let rows = meta.list_objects_page(bucket.id, prefix, after.as_deref(), page).await.unwrap();
                    assert!(rows.len() <= page as usize);
                    all.extend(rows.iter().map(|r| r.key.clone()));
                    if rows.len() < page as usize {
                        return all;
                    }
                    after = rows.last().map(|r| r.key.clone());
                }
            }
        };
        assert_eq!(list("", 2).await, keys);
        assert_eq!(list("", 100).await, keys);
        assert_eq!(list("a/", 1).await, ["a/1", "a/2", "a/3"]);
        assert_eq!(list("a", 3).await, ["a", "a/1", "a/2", "a/3", "a0"]);
        assert!(list("c", 2).await.is_empty());
        // A last key from below the prefix (the listings never pass one) still lists only keys with the prefix.
        let below = meta.list_objects_page(bucket.id, "a/", Some("B"), 10).await.unwrap();
        assert_eq!(below.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["a/1", "a/2", "a/3"]);
    }

    on_both_backends!(rows_read_back_as_written);
    async fn rows_read_back_as_written(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), true, 7).await.unwrap();
        let key = ObjectKey::parse("dir/k.txt").unwrap();
        let attrs = ObjectAttrs {
            content_type: Some("text/plain".into()),
            cache_control: None,
            content_disposition: Some("attachment".into()),
            user_metadata: [("mtime".to_owned(), "1700000000.5".to_owned()), ("a-b".to_owned(), "x, y".to_owned())]
                .into(),
            tags: [("team".to_owned(), "build".to_owned()), ("empty".to_owned(), String::new())].into(),
        };
        let mut tx = meta.begin_write().await.unwrap();
        assert_eq!(tx.upsert_object(bucket.id, &key, &"a".repeat(64), 42, &attrs, 9).await.unwrap(), Upsert::Created);
        tx.commit().await.unwrap();
        let want = ObjectRecord {
            bucket_id: bucket.id,
            key: key.to_string(),
            sha256: "a".repeat(64),
            size: 42,
            attrs,
            created_at: 9,
            updated_at: 9,
            s3_etag: None,
            part_sizes: None,
            checksum: None,
        };
        assert_eq!(meta.object_by_key(bucket.id, key.as_str()).await.unwrap(), Some(want.clone()));
        assert_eq!(
            meta.object_with_bucket_default(bucket.id, key.as_str()).await.unwrap(),
            Some((want.clone(), None, Vec::new()))
        );
        assert_eq!(meta.list_buckets().await.unwrap(), vec![bucket.clone()]);

        // The S3 ETag of the current content is read with the row, by every read of it.
        let mut tx = meta.begin_write().await.unwrap();
        tx.set_s3_etag(bucket.id, key.as_str(), &"a".repeat(64), "\"x-2\"", None, None).await.unwrap();
        tx.commit().await.unwrap();
        let want = ObjectRecord { s3_etag: Some("\"x-2\"".into()), ..want };
        assert_eq!(meta.object_by_key(bucket.id, key.as_str()).await.unwrap(), Some(want.clone()));
        assert_eq!(
            meta.object_with_bucket_default(bucket.id, key.as_str()).await.unwrap(),
            Some((want.clone(), None, Vec::new()))
        );
        assert_eq!(meta.list_objects_page(bucket.id, "dir/", None, 5).await.unwrap(), vec![want.clone()]);
        assert_eq!(meta.list_objects_page_from(bucket.id, "", "dir/", 5).await.unwrap(), vec![want.clone()]);

        // Tags change in place: the content, the S3 ETag and the times stay; an absent object is reported.
        let mut tx = meta.begin_write().await.unwrap();
        let retagged = [("k".to_owned(), "v".to_owned())].into();
        assert!(tx.set_object_tags(bucket.id, &key, &retagged).await.unwrap());
        assert!(!tx.set_object_tags(bucket.id, &ObjectKey::parse("absent").unwrap(), &retagged).await.unwrap());
        tx.commit().await.unwrap();
        let mut want = want;
        want.attrs.tags = retagged;
        assert_eq!(meta.object_by_key(bucket.id, key.as_str()).await.unwrap(), Some(want.clone()));
        let mut tx = meta.begin_write().await.unwrap();
        assert!(tx.set_object_tags(bucket.id, &key, &Default::default()).await.unwrap());
        tx.commit().await.unwrap();
        want.attrs.tags.clear();
        assert_eq!(meta.object_by_key(bucket.id, key.as_str()).await.unwrap(), Some(want));
    }

    on_both_backends!(bucket_updates_change_only_what_they_name);
    async fn bucket_updates_change_only_what_they_name(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let name = BucketName::parse("bkt").unwrap();
        meta.create_bucket(&name, false, 0).await.unwrap();
        let change =
            |public, default_cache_control| BucketChanges { public, default_cache_control, ..Default::default() };
        let b = meta.update_bucket(&name, change(None, Some(Some("max-age=60")))).await.unwrap().unwrap();
        assert_eq!((b.public, b.default_cache_control.as_deref()), (false, Some("max-age=60")));
        let b = meta.update_bucket(&name, change(Some(true), None)).await.unwrap().unwrap();
        assert_eq!((b.public, b.default_cache_control.as_deref()), (true, Some("max-age=60")));
        let b = meta.update_bucket(&name, change(Some(false), Some(None))).await.unwrap().unwrap();
        assert_eq!((b.public, b.default_cache_control.as_deref()), (false, None));
        assert_eq!(meta.bucket(&name).await.unwrap().unwrap(), b);
        let nope = BucketName::parse("nope").unwrap();
        assert!(meta.update_bucket(&nope, change(Some(true), None)).await.unwrap().is_none());

        // The documents likewise, each on its own.
        let (index, error) = (IndexDocument::parse("index.html").unwrap(), ObjectKey::parse("404.html").unwrap());
        let both = BucketChanges {
            index_document: Some(Some(&index)),
            error_document: Some(Some(&error)),
            ..Default::default()
        };
        let b = meta.update_bucket(&name, both).await.unwrap().unwrap();
        assert_eq!(b.website, Website { index_document: Some(index.clone()), error_document: Some(error.clone()) });
        assert_eq!((b.public, b.default_cache_control.as_deref()), (false, None), "the rest stays");
        let b = meta.update_bucket(&name, change(Some(true), None)).await.unwrap().unwrap();
        assert_eq!(b.website.index_document.as_ref(), Some(&index));
        let off = BucketChanges { index_document: Some(None), ..Default::default() };
        let b = meta.update_bucket(&name, off).await.unwrap().unwrap();
        assert_eq!(b.website, Website { index_document: None, error_document: Some(error) });
        assert_eq!(meta.bucket(&name).await.unwrap().unwrap(), b);
    }

    on_both_backends!(a_page_can_start_at_a_key_inclusive);
    async fn a_page_can_start_at_a_key_inclusive(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let mut tx = meta.begin_write().await.unwrap();
        for key in ["a", "a/1", "a/2", "a/3", "a0", "b"] {
            let key = ObjectKey::parse(key).unwrap();
            tx.upsert_object(bucket.id, &key, &"0".repeat(64), 0, &ObjectAttrs::default(), 0).await.unwrap();
        }
        tx.commit().await.unwrap();
        let from = |prefix: &'static str, from: &'static str| {
            let meta = meta.clone();
            async move {
                let rows = meta.list_objects_page_from(bucket.id, prefix, from, 10).await.unwrap();
                rows.into_iter().map(|r| r.key).collect::<Vec<_>>()
            }
        };
        assert_eq!(from("", "a0").await, ["a0", "b"], "inclusive");
        assert_eq!(from("a/", "a/2").await, ["a/2", "a/3"]);
        assert_eq!(from("a/", "").await, ["a/1", "a/2", "a/3"], "never below the prefix");
        assert!(from("a/", "a0").await.is_empty());
    }
}
