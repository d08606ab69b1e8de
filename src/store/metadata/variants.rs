//! Precompressed variants of objects: one row per (object, encoding), each naming a blob like an object row does.
//! Written and removed only inside the object's own write transaction (`WriteTx`), so a variant never outlives or
//! predates its object.

use super::{Metadata, MetadataError, WriteTx};

/// One stored variant: the object's content in `encoding`, as the blob `sha256` of `size` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantRecord {
    /// The `Content-Encoding` token: `br` or `gzip` (the table's CHECK allows no other).
    pub encoding: String,
    pub sha256: String,
    pub size: i64,
}
from_row!(VariantRecord { encoding, sha256, size });

pub(super) const SELECT_VARIANTS: &str =
    "SELECT encoding, sha256, size FROM object_variants WHERE bucket_id = $1 AND key = $2 ORDER BY encoding";

impl Metadata {
    /// The object's variants, by encoding (none for an object without, or for no object).
    pub async fn variants(&self, bucket_id: i64, key: &str) -> Result<Vec<VariantRecord>, MetadataError> {
        Ok(
            with_pool!(&self.backend, pool => sqlx::query_as(SELECT_VARIANTS).bind(bucket_id).bind(key).fetch_all(pool).await?),
        )
    }
}

impl Metadata {
    /// `(key, encoding)` of every variant of the objects keyed from `first` to `last` inclusive, by key: one
    /// listing page's variants in one range read of the table's key order (the listing's own).
    pub async fn variant_codings_between(
        &self,
        bucket_id: i64,
        first: &str,
        last: &str,
    ) -> Result<Vec<(String, String)>, MetadataError> {
        Ok(with_pool!(&self.backend, pool => sqlx::query_as(
            "SELECT key, encoding FROM object_variants WHERE bucket_id = $1 AND key >= $2 AND key <= $3 \
             ORDER BY key, encoding",
        )
        .bind(bucket_id)
        .bind(first)
        .bind(last)
        .fetch_all(pool)
        .await?))
    }
}

impl WriteTx {
    /// The object's variants, read inside the transaction.
    pub async fn variants(&mut self, bucket_id: i64, key: &str) -> Result<Vec<VariantRecord>, MetadataError> {
        Ok(
            with_tx!(&mut self.tx, tx => sqlx::query_as(SELECT_VARIANTS).bind(bucket_id).bind(key).fetch_all(&mut **tx).await?),
        )
    }

    /// Replaces the object's variants with `variants` (none: the object has none). Returns the hashes the old
    /// rows referenced, for the caller to retire when nothing references them any more.
    pub async fn replace_variants(
        &mut self,
        bucket_id: i64,
        key: &str,
        variants: &[VariantRecord],
    ) -> Result<Vec<String>, MetadataError> {
        let old = self.delete_variants(bucket_id, key).await?;
        for v in variants {
            with_tx!(&mut self.tx, tx => sqlx::query(
                "INSERT INTO object_variants (bucket_id, key, encoding, sha256, size) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(bucket_id)
            .bind(key)
            .bind(&v.encoding)
            .bind(&v.sha256)
            .bind(v.size)
            .execute(&mut **tx)
            .await?.rows_affected());
        }
        Ok(old)
    }

    /// Removes the object's variants; returns the hashes they referenced.
    pub async fn delete_variants(&mut self, bucket_id: i64, key: &str) -> Result<Vec<String>, MetadataError> {
        let hashes: Vec<String> = with_tx!(&mut self.tx, tx => sqlx::query_scalar(
            "DELETE FROM object_variants WHERE bucket_id = $1 AND key = $2 RETURNING sha256",
        )
        .bind(bucket_id)
        .bind(key)
        .fetch_all(&mut **tx)
        .await?);
        Ok(hashes)
    }
}
