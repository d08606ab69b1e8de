//! `PUT` and `DELETE /{bucket}/{key}` on the admin listener.
//!
//! An upload streams the request body into a staged blob on a blocking thread, hashing as it goes. The object
//! becomes visible only when the blob is fsynced and renamed and its row committed (`Store::put`). A client
//! abort, a short body (hyper reports it as a body error) or a size-limit breach drops the staged blob, which
//! removes its temp file: nothing becomes visible and nothing is left behind.

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{self, HeaderMap};
use http::{StatusCode, Uri};
use tokio::sync::mpsc;

use super::AppState;
use super::error::ApiError;
use crate::names::{parse_attrs, parse_object_path};
use crate::store::StagedBlob;

pub async fn put_object(
    State(app): State<AppState>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (bucket_name, key) = parse_object_path(uri.path())?;
    let bucket = app.store.meta.bucket(&bucket_name).await?;
    crate::auth::authorize_write(&app, bucket.as_ref(), &key, &headers).await?;
    if bucket.is_none() {
        return Err(ApiError::NoSuchBucket);
    }
    let text = |name: header::HeaderName| -> Result<Option<String>, ApiError> {
        headers
            .get(&name)
            .map(|v| v.to_str().map(str::to_owned).map_err(|_| ApiError::BadRequest(format!("{name} is not ASCII"))))
            .transpose()
    };
    let attrs =
        parse_attrs(text(header::CONTENT_TYPE)?, text(header::CACHE_CONTROL)?, text(header::CONTENT_DISPOSITION)?)?;
    let limit = app.settings.limits.max_upload_bytes;
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge(format!("objects are limited to {limit} bytes")));
    }
    let staged = stage_body(&app, body, limit).await?;
    if declared.is_some_and(|n| n != staged.size) {
        return Err(ApiError::BadRequest("body length differs from Content-Length".into()));
    }
    let report = app.store.put(&bucket_name, &key, staged, attrs).await?;
    Ok((StatusCode::CREATED, axum::Json(report)).into_response())
}

pub async fn delete_object(State(app): State<AppState>, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
    let (bucket_name, key) = parse_object_path(uri.path())?;
    let bucket = app.store.meta.bucket(&bucket_name).await?;
    crate::auth::authorize_write(&app, bucket.as_ref(), &key, &headers).await?;
    if bucket.is_none() {
        return Err(ApiError::NoSuchBucket);
    }
    if app.store.delete(&bucket_name, &key).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::NotFound)
    }
}

/// Streams the body to a blocking writer thread through a small bounded channel (back-pressure: a slow disk
/// slows the client, not our memory).
async fn stage_body(app: &AppState, body: Body, limit: u64) -> Result<StagedBlob, ApiError> {
    let mut writer = app.store.blobs.writer().map_err(storage_error)?;
    let (tx, mut rx) = mpsc::channel::<Bytes>(8);
    let sink = tokio::task::spawn_blocking(move || -> std::io::Result<StagedBlob> {
        while let Some(chunk) = rx.blocking_recv() {
            writer.write(&chunk)?;
        }
        writer.finish()
    });
    let mut stream = body.into_data_stream();
    let mut received: u64 = 0;
    let mut failure = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => {
                received += chunk.len() as u64;
                if received > limit {
                    failure = Some(ApiError::PayloadTooLarge(format!("objects are limited to {limit} bytes")));
                    break;
                }
                if tx.send(chunk).await.is_err() {
                    break; // the writer failed; its error is reported below
                }
            }
            Err(e) => {
                failure = Some(ApiError::BadRequest(format!("upload interrupted: {e}")));
                break;
            }
        }
    }
    drop(tx);
    let written = sink.await.map_err(|e| ApiError::Internal(anyhow::anyhow!("upload writer task failed: {e}")))?;
    if let Some(e) = failure {
        // Dropping the staged blob (if the writer finished) removes its temp file.
        drop(written);
        return Err(e);
    }
    written.map_err(storage_error)
}

fn storage_error(e: std::io::Error) -> ApiError {
    if e.kind() == std::io::ErrorKind::StorageFull || e.kind() == std::io::ErrorKind::QuotaExceeded {
        ApiError::InsufficientStorage
    } else {
        ApiError::Internal(anyhow::Error::new(e).context("cannot write the upload to the data dir"))
    }
}
