//! The S3 listing routes: ListBuckets, GetBucketLocation, ListObjects V1 and V2, written by `s3::xml` (small
//! bodies from memory). A listing page is planned by `s3::listing` over the store's keyset pages, so it costs
//! O(max-keys) rows however deep it starts.

use axum::response::Response;
use http::StatusCode;

use super::DataState;
use super::s3::{Query, S3Error, xml_response};
use crate::auth::AllowedS3Request;
use crate::catalog::Catalog;
use crate::header_values::cors::{self, CorsPolicy};
use crate::header_values::etag_from_sha256;
use crate::s3::listing::{self, Fetch, Source, Start};
use crate::s3::request::{ListParams, ListVersion};
use crate::s3::xml::{self, ListedBucket, ListedObject, Owner};
use crate::store::{Bucket, MetadataError};

/// The one owner we name: the gateway (objects have no per-user owner here).
fn owner() -> Owner {
    Owner { id: "blobgate".into(), display_name: "blobgate".into() }
}

/// ListBuckets' page of `buckets` (sorted by name) as `params` ask for it.
pub fn list_buckets_xml(
    buckets: &[impl std::ops::Deref<Target = Bucket>],
    params: &crate::s3::buckets::ListBucketsParams,
) -> String {
    let (page, next) = params.page(buckets, |b| b.name.as_str());
    let listed: Vec<ListedBucket> =
        page.iter().map(|b| ListedBucket { name: b.name.clone(), created_at: b.created_at }).collect();
    xml::list_buckets(&owner(), &listed, next.as_deref(), params.prefix.as_deref())
}

/// GetBucketAcl's and GetObjectAcl's answer: the one owner, with full control.
pub fn owner_full_control_xml() -> String {
    xml::owner_full_control(&owner())
}

/// GetBucketCors' answer: the bucket's rule, with the methods, request headers and exposed headers it means.
pub fn cors_configuration_xml(policy: &CorsPolicy) -> String {
    let rule = &policy.rule;
    let mut expose_headers: Vec<&str> = cors::DEFAULT_EXPOSED.to_vec();
    expose_headers.extend(rule.expose_headers.iter().map(String::as_str));
    xml::cors_configuration(&xml::CorsRuleView {
        origins: &rule.origins,
        methods: &policy.methods(),
        allowed_headers: &policy.allowed_headers(),
        expose_headers,
        max_age: rule.max_age,
    })
}

pub fn location_xml(region: &str) -> String {
    xml::location_constraint(region)
}

/// ListObjects V1 (`GET /{bucket}`) or V2 (`?list-type=2`). A key with a prefix lists under that prefix only: a
/// request for a shorter (or another) prefix is refused, as a token's prefix refuses keys outside it.
pub async fn list_objects(
    app: &DataState,
    bucket: &Bucket,
    allowed: &AllowedS3Request,
    query: &Query,
    raw_query: Option<&str>,
) -> Result<Response, S3Error> {
    let version = match query.get("list-type") {
        None => ListVersion::V1,
        Some("2") => ListVersion::V2,
        Some(_) => return Err(S3Error::new(StatusCode::BAD_REQUEST, "InvalidArgument", "Invalid List Type specified")),
    };
    let params = ListParams::from_query(version, raw_query.unwrap_or(""))?;
    if !allowed.key.rights.may_list(bucket.id, &params.prefix) {
        return Err(crate::auth::AuthError::Forbidden.into());
    }
    let mut source = StoreSource { catalog: &app.catalog, bucket_id: bucket.id };
    let page = listing::list_page(&mut source, params.query()).await?;
    let body = match version {
        ListVersion::V1 => xml::list_objects_v1(&bucket.name, &params, &page, &owner()),
        ListVersion::V2 => xml::list_objects_v2(&bucket.name, &params, &page, &owner()),
    };
    Ok(xml_response(body))
}

/// The store's keyset listing, through the catalog (uncached).
struct StoreSource<'a> {
    catalog: &'a Catalog,
    bucket_id: i64,
}

impl Source for StoreSource<'_> {
    type Item = ListedObject;
    type Error = MetadataError;

    async fn fetch(&mut self, prefix: &str, fetch: &Fetch) -> Result<Vec<ListedObject>, MetadataError> {
        let rows = match &fetch.start {
            Start::After(key) => self.catalog.list_objects_page(self.bucket_id, prefix, Some(key), fetch.limit).await?,
            Start::AtLeast(key) => {
                self.catalog.list_objects_page_from(self.bucket_id, prefix, key, fetch.limit).await?
            }
        };
        Ok(rows
            .into_iter()
            .map(|r| ListedObject {
                // The ETag GetObject answers S3 requests with (`ObjectEntry::s3_etag`).
                etag: r.s3_etag.unwrap_or_else(|| etag_from_sha256(&r.sha256)),
                key: r.key,
                last_modified: r.updated_at,
                size: r.size,
            })
            .collect())
    }
}
