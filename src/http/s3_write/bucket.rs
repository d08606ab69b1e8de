//! CreateBucket, DeleteBucket, PutBucketCors and DeleteBucketCors. Creating a bucket and deleting one take `admin` on every bucket
//! (`--grant '*:admin'`); CreateBucket of a bucket that exists answers its writers `BucketAlreadyOwnedByYou`, as S3
//! answers the owner, which clients that "make sure the bucket exists" before a copy take as success. A bucket's
//! CORS rule is set and cleared by `admin` on the whole bucket, as `blobgate bucket cors set` and `clear` do.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header::{self, HeaderValue};

use super::super::AdminState;
use super::super::error::ApiError;
use super::super::s3::{S3Error, with_principal};
use crate::auth::sigv4::RequestParts;
use crate::auth::{Access, S3Target};
use crate::names::BucketName;
use crate::s3::buckets::{MAX_CORS_BODY, parse_cors_configuration};
use crate::s3::operation::Operation;
use crate::store::{BucketDeletion, MetadataError, unix_now};

fn already_owned() -> S3Error {
    S3Error::new(
        StatusCode::CONFLICT,
        "BucketAlreadyOwnedByYou",
        "Your previous request to create the named bucket succeeded and you already own it.",
    )
}

/// CreateBucket (`PUT /{bucket}`): the bucket, private. The body (a `CreateBucketConfiguration` naming a region)
/// is not read: this server has one region.
pub(super) async fn create_bucket(
    app: &AdminState,
    request: &RequestParts<'_>,
    name: &BucketName,
) -> Result<Response, S3Error> {
    let existing = app.data.catalog.bucket(name.as_str()).await?;
    if existing.is_some() {
        app.data.auth.s3(request, S3Target::Bucket(existing.as_ref()), Access::Write).await?;
        return Err(already_owned());
    }
    let allowed = app.data.auth.s3(request, S3Target::EveryBucket, Access::Write).await?;
    match app.store.meta.create_bucket(name, false, unix_now()).await {
        Ok(_) => {}
        // Created meanwhile (another request, replica or the CLI).
        Err(MetadataError::BucketExists(_)) => return Err(already_owned()),
        Err(e) => return Err(e.into()),
    }
    tracing::info!(bucket = %name, access_key = %allowed.key.id, "bucket created by CreateBucket");
    let location = HeaderValue::try_from(format!("/{name}")).expect("a bucket name is a valid header value");
    let response = (StatusCode::OK, [(header::LOCATION, location)]).into_response();
    Ok(with_principal(&app.data, response, &allowed))
}

/// DeleteBucket (`DELETE /{bucket}`): an empty bucket only (`BucketNotEmpty` otherwise), with its unfinished
/// uploads and the credentials that grant only it, as `blobgate bucket delete` without `--force`.
pub(super) async fn delete_bucket(
    app: &AdminState,
    request: &RequestParts<'_>,
    name: &BucketName,
) -> Result<Response, S3Error> {
    let allowed = app.data.auth.s3(request, S3Target::EveryBucket, Access::Write).await?;
    match app.store.delete_bucket(name, false).await {
        Ok(BucketDeletion::Deleted { .. }) => {}
        Ok(BucketDeletion::NotEmpty { .. }) => {
            return Err(S3Error::new(
                StatusCode::CONFLICT,
                "BucketNotEmpty",
                "The bucket you tried to delete is not empty",
            ));
        }
        Err(e) => return Err(ApiError::from(e).into()),
    }
    tracing::info!(bucket = %name, access_key = %allowed.key.id, "bucket deleted by DeleteBucket");
    Ok(with_principal(&app.data, StatusCode::NO_CONTENT.into_response(), &allowed))
}

/// PutBucketCors (`PUT /{bucket}?cors`, the bucket's one rule: `s3::buckets`) and DeleteBucketCors (`DELETE
/// /{bucket}?cors`). A document the rule cannot hold is refused whole, and the rule stays as it was.
pub(super) async fn bucket_cors(
    app: &AdminState,
    request: &RequestParts<'_>,
    name: &BucketName,
    operation: Operation,
    body: axum::body::Body,
) -> Result<Response, S3Error> {
    let bucket = app.data.catalog.bucket(name.as_str()).await?;
    let allowed = app.data.auth.s3(request, S3Target::BucketAdmin(bucket.as_ref()), Access::Write).await?;
    bucket.ok_or(crate::auth::AuthError::NoSuchBucket)?;
    let rule = match operation {
        Operation::PutBucketCors => {
            let body = super::small_body(app, &allowed, request.headers, body, MAX_CORS_BODY).await?;
            Some(parse_cors_configuration(&body)?)
        }
        _ => None,
    };
    let updated = app.store.meta.set_bucket_cors(name, rule.as_ref()).await?;
    crate::store::require_bucket(updated, name).map_err(ApiError::from)?;
    tracing::info!(bucket = %name, access_key = %allowed.key.id, ?operation, "bucket CORS rule changed over S3");
    let status = if rule.is_some() { StatusCode::OK } else { StatusCode::NO_CONTENT };
    Ok(with_principal(&app.data, status.into_response(), &allowed))
}
