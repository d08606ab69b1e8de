//! `PUT` and `DELETE /{bucket}/{key}`, on either listener (the data listener's unless `listen_read_only`).
//!
//! An upload streams the request body into a staged blob, hashing as it goes. The object becomes visible only
//! when the blob is fsynced and renamed and its row committed (`Store::put`). A client abort, a short body (the driver
//! reports it as a body error), a body that sends nothing for `timeouts.body_idle` (408) or a size-limit breach
//! drops the staged blob, which removes its temp file: nothing becomes visible and nothing is left behind.
//!
//! Uploads are bounded: at most `limits.max_concurrent_uploads` at once. One beyond waits its turn for up to
//! `timeouts.upload_queue` without reading its body, then gets 503 with `Retry-After`. The body is written in
//! batches, each one short call on the blocking pool. An upload holds no thread while it waits for its client,
//! and its temp file is created with its first batch, so stalled uploads hold neither threads nor files, and
//! cannot delay other uploads.
//!
//! Body chunks hold their share of the body budget (`limits.upload_buffer_bytes`) until they are written. So an
//! upload never waits for more body while it holds chunks and no write is in flight: it writes whatever it holds
//! at once, and a batch fills only while the previous one is being written. Were it to wait for a fuller batch,
//! uploads holding part-filled batches could take the whole budget and wait for each other forever.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{self, HeaderMap};
use http::{StatusCode, Uri};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use super::AdminState;
use super::error::ApiError;
use crate::header_values::upload_digest::DeclaredDigests;
use crate::names::{parse_attrs, parse_object_path};
use crate::store::{BlobStore, BlobWriter, StagedBlob};

/// One of the `limits.max_concurrent_uploads` places, held while a body is staged or an object assembled.
pub(super) struct UploadPlace<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    _counted: crate::metrics::OwnedGaugeGuard,
}

/// Takes an upload place: at once when one is free, else in arrival order within `timeouts.upload_queue`, else
/// `TooManyUploads` (503 with `Retry-After`). Nothing of the body is read while it waits.
pub(super) async fn upload_place(app: &AdminState) -> Result<UploadPlace<'_>, ApiError> {
    let permit = match app.uploads.try_acquire() {
        Ok(permit) => permit,
        Err(_) => {
            let _waiting = crate::metrics::upload_waiting();
            match tokio::time::timeout(app.settings.timeouts.upload_queue, app.uploads.acquire()).await {
                Ok(Ok(permit)) => permit,
                // Timed out, or the semaphore closed (it never is).
                _ => {
                    crate::metrics::upload_refused();
                    return Err(ApiError::TooManyUploads);
                }
            }
        }
    };
    Ok(UploadPlace { _permit: permit, _counted: crate::metrics::upload_in_progress() })
}

/// The most body bytes gathered while a batch is being written; the next write takes them all. With one batch
/// being written while the next is received, an upload buffers at most about twice this.
const WRITE_BATCH: usize = 512 * 1024;

/// A native `PUT`: the object, or an error; counted in `blobgate_uploads_total{api="native"}` either way.
pub async fn put_object(State(app): State<AdminState>, uri: Uri, headers: HeaderMap, body: Body) -> Response {
    let (response, stored) = match store_body(&app, &uri, &headers, body).await {
        Ok(report) => {
            let size = report.size;
            ((StatusCode::CREATED, axum::Json(report)).into_response(), size)
        }
        Err(e) => (e.into_response(), 0),
    };
    crate::metrics::upload_finished(crate::metrics::UploadApi::Native, response.status(), stored);
    response
}

async fn store_body(
    app: &AdminState,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<crate::store::PutReport, ApiError> {
    let (bucket_name, key) = parse_object_path(uri.path())?;
    let bucket = app.store.meta.bucket(&bucket_name).await?;
    let credentials = crate::auth::credentials(headers, None)?;
    let asker = writer(&credentials);
    app.data.auth.write(bucket.as_ref(), &key, credentials).await?;
    // Held until the body is stored: a concurrency limit counts uploads in progress too.
    let admitted = super::throttling::admit(&app.data, &asker, bucket_name.as_str()).await?;
    let body = super::throttling::paced_body(body, admitted.write_pace.clone());
    crate::store::require_bucket(bucket, &bucket_name)?;
    ApiError::require_length(headers)?;
    let text = |name: header::HeaderName| -> Result<Option<String>, ApiError> {
        headers
            .get(&name)
            .map(|v| v.to_str().map(str::to_owned).map_err(|_| ApiError::BadRequest(format!("{name} is not ASCII"))))
            .transpose()
    };
    let attrs =
        parse_attrs(text(header::CONTENT_TYPE)?, text(header::CACHE_CONTROL)?, text(header::CONTENT_DISPOSITION)?)?;
    // The write's precondition and the body's declared digests, as S3's PutObject takes them: refused before the
    // body is read when malformed, checked before anything commits.
    let condition = super::conditional::write_condition(headers).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let declared = DeclaredDigests::from_headers(headers)?;
    let limit = app.settings.limits.max_body_bytes();
    let length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if length.is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge(format!("objects are limited to {limit} bytes")));
    }
    let _place = upload_place(app).await?;
    let staged = stage_body(app, body, limit, &mut Plain).await?;
    if length.is_some_and(|n| n != staged.size) {
        return Err(ApiError::BadRequest("body length differs from Content-Length".into()));
    }
    declared.check(staged.md5.as_deref(), &staged.sha256)?;
    // RFC 9110 §13.1.1: If-Match on a key with no object fails (412), as any other mismatch does.
    match app.store.put_if(&bucket_name, &key, staged, attrs, Vec::new(), &condition).await {
        Err(crate::store::StoreError::NoSuchKey) => Err(ApiError::PreconditionFailed),
        stored => Ok(stored?),
    }
}

pub async fn delete_object(State(app): State<AdminState>, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
    let (bucket_name, key) = parse_object_path(uri.path())?;
    let bucket = app.store.meta.bucket(&bucket_name).await?;
    let credentials = crate::auth::credentials(&headers, None)?;
    let asker = writer(&credentials);
    app.data.auth.write(bucket.as_ref(), &key, credentials).await?;
    let _held = super::throttling::admit(&app.data, &asker, bucket_name.as_str()).await?;
    crate::store::require_bucket(bucket, &bucket_name)?;
    if app.store.delete(&bucket_name, &key).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::NotFound)
    }
}

/// What an upload body goes through on its way to disk: the native API stores it as sent; S3 decodes aws-chunked
/// framing and checks checksums (`s3_write`). `data` gets each received chunk and pushes the object bytes it
/// holds (sub-slices, never copies) onto `out`; `end` is called once the body has ended, before anything is
/// fsynced, and refuses a body that did not verify.
pub(super) trait BodyFilter {
    type Error: From<ApiError>;
    /// Body bytes gathered before they go to disk in one blocking call.
    const BATCH: usize = WRITE_BATCH;
    fn data(&mut self, chunk: Bytes, out: &mut Vec<Bytes>) -> Result<(), Self::Error>;
    fn end(&mut self) -> Result<(), Self::Error>;
}

/// The native body: stored as sent.
struct Plain;

impl BodyFilter for Plain {
    type Error = ApiError;

    fn data(&mut self, chunk: Bytes, out: &mut Vec<Bytes>) -> Result<(), ApiError> {
        out.push(chunk);
        Ok(())
    }

    fn end(&mut self) -> Result<(), ApiError> {
        Ok(())
    }
}

/// Streams the body into a staged blob, through `filter`. Each wait for body bytes is bounded by
/// `timeouts.body_idle`, and each `body_idle` window must bring `limits.min_upload_rate` bytes per second on
/// average. `limit` bounds the bytes received.
pub(super) async fn stage_body<F: BodyFilter>(
    app: &AdminState,
    body: Body,
    limit: u64,
    filter: &mut F,
) -> Result<StagedBlob, F::Error> {
    let mut body = PacedBody::new(app, body);
    let mut staging = Staging::new(app.store.blobs.clone(), F::BATCH);
    let mut received: u64 = 0;
    let mut pieces = Vec::new();
    let failure: F::Error = loop {
        let deadline = body.deadline();
        let next = loop {
            // A finished write starts the next one with what gathered meanwhile, while we wait for the client.
            tokio::select! {
                next = body.next_by(deadline) => break next,
                written = staging.write_done(), if staging.is_writing() => {
                    if let Err(e) = written {
                        break Err(e);
                    }
                }
            }
        };
        let chunk = match next {
            Err(e) => break e.into(),
            Ok(None) => match filter.end() {
                Ok(()) => return Ok(staging.finish().await?),
                Err(e) => break e,
            },
            Ok(Some(chunk)) => chunk,
        };
        received += chunk.len() as u64;
        if received > limit {
            break ApiError::PayloadTooLarge(format!("objects are limited to {limit} bytes")).into();
        }
        if let Err(e) = filter.data(chunk, &mut pieces) {
            break e;
        }
        let mut pushed = Ok(());
        for piece in pieces.drain(..) {
            if pushed.is_ok() {
                pushed = staging.push(piece).await;
            }
        }
        if let Err(e) = pushed {
            break e.into();
        }
    };
    staging.abandon().await;
    Err(failure)
}

/// A request body read under the upload pace rules: each chunk within `timeouts.body_idle` (else `BodyTimeout`,
/// 408), and each `body_idle` window at `limits.min_upload_rate` on average (else `BodyTooSlow`); both counted.
pub(super) struct PacedBody {
    stream: axum::body::BodyDataStream,
    pace: BodyPace,
    idle: Duration,
    min_rate: u64,
}

impl PacedBody {
    pub(super) fn new(app: &AdminState, body: Body) -> Self {
        let (idle, min_rate) = (app.settings.timeouts.body_idle, app.settings.limits.min_upload_rate);
        Self { stream: body.into_data_stream(), pace: BodyPace::new(min_rate, idle, Instant::now()), idle, min_rate }
    }

    /// When the next chunk is due, counted from now.
    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.idle
    }

    /// The next chunk (`None` at the body's end), due by `deadline`. Cancel-safe.
    pub(super) async fn next_by(&mut self, deadline: Instant) -> Result<Option<Bytes>, ApiError> {
        let chunk = match tokio::time::timeout_at(deadline, self.stream.next()).await {
            Err(_elapsed) => {
                crate::metrics::upload_body_timeout();
                return Err(ApiError::BodyTimeout);
            }
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => return Err(ApiError::BadRequest(format!("upload interrupted: {e}"))),
            Ok(Some(Ok(chunk))) => chunk,
        };
        if !self.pace.keeps_up(chunk.len() as u64, Instant::now()) {
            crate::metrics::upload_body_timeout();
            return Err(ApiError::BodyTooSlow(self.min_rate));
        }
        Ok(Some(chunk))
    }
}

/// The minimum body rate, judged once per window of `window` (the body idle timeout): a window that ends with
/// fewer than `min_rate` bytes per second fails. Pure, so it is tested without a clock.
struct BodyPace {
    min_rate: u64,
    window: Duration,
    window_start: Instant,
    window_bytes: u64,
}

impl BodyPace {
    fn new(min_rate: u64, window: Duration, now: Instant) -> Self {
        Self { min_rate, window, window_start: now, window_bytes: 0 }
    }

    /// Counts `bytes` that arrived at `now`; false once a whole window brought too few.
    fn keeps_up(&mut self, bytes: u64, now: Instant) -> bool {
        self.window_bytes += bytes;
        let elapsed = now.duration_since(self.window_start);
        if self.min_rate == 0 || elapsed < self.window {
            return true;
        }
        let needed = (self.min_rate as f64 * elapsed.as_secs_f64()) as u64;
        let kept_up = self.window_bytes >= needed;
        (self.window_start, self.window_bytes) = (now, 0);
        kept_up
    }
}

/// An upload's temp file, written from the blocking pool one batch at a time, with at most one batch being
/// written while the next one is received (back-pressure: a slow disk slows the client, not our memory). What it
/// holds is written as soon as no write is in flight (see the module doc): batches grow only while the disk is
/// busy, up to `batch_size`.
struct Staging {
    blobs: BlobStore,
    /// Created by the first batch written, so a body that never fills a batch holds no file until it ends.
    writer: Option<BlobWriter>,
    /// The batch being written; it hands the writer back when done.
    writing: Option<JoinHandle<std::io::Result<BlobWriter>>>,
    batch: Vec<Bytes>,
    batched: usize,
    batch_size: usize,
}

impl Staging {
    fn new(blobs: BlobStore, batch_size: usize) -> Self {
        Self { blobs, writer: None, writing: None, batch: Vec::new(), batched: 0, batch_size }
    }

    async fn push(&mut self, chunk: Bytes) -> Result<(), ApiError> {
        self.batched += chunk.len();
        self.batch.push(chunk);
        if self.writing.is_some() && self.batched < self.batch_size {
            return Ok(());
        }
        self.wait_for_write().await?;
        self.start_write();
        Ok(())
    }

    fn is_writing(&self) -> bool {
        self.writing.is_some()
    }

    /// Waits for the write in flight, then starts the next with what gathered meanwhile. Cancel-safe: dropped
    /// while waiting, the write stays in flight.
    async fn write_done(&mut self) -> Result<(), ApiError> {
        let Some(writing) = self.writing.as_mut() else { return Ok(()) };
        let written = writing.await;
        self.writing = None;
        self.writer = Some(joined(written)?);
        if !self.batch.is_empty() {
            self.start_write();
        }
        Ok(())
    }

    fn start_write(&mut self) {
        let (writer, batch, blobs) = self.take_batch();
        self.writing = Some(tokio::task::spawn_blocking(move || write_batch(&blobs, writer, &batch)));
    }

    /// Writes what is left and fsyncs.
    async fn finish(mut self) -> Result<StagedBlob, ApiError> {
        self.wait_for_write().await?;
        let (writer, batch, blobs) = self.take_batch();
        joined(tokio::task::spawn_blocking(move || write_batch(&blobs, writer, &batch)?.finish()).await)
    }

    /// Waits for the batch in flight, then drops the writer, which removes the temp file.
    async fn abandon(mut self) {
        let _ = self.wait_for_write().await;
        drop(self.writer.take());
    }

    async fn wait_for_write(&mut self) -> Result<(), ApiError> {
        if let Some(writing) = self.writing.take() {
            self.writer = Some(joined(writing.await)?);
        }
        Ok(())
    }

    fn take_batch(&mut self) -> (Option<BlobWriter>, Vec<Bytes>, BlobStore) {
        self.batched = 0;
        (self.writer.take(), std::mem::take(&mut self.batch), self.blobs.clone())
    }
}

/// On the blocking pool: creates the temp file if this is the first batch, then appends the batch.
fn write_batch(blobs: &BlobStore, writer: Option<BlobWriter>, batch: &[Bytes]) -> std::io::Result<BlobWriter> {
    let mut writer = match writer {
        Some(writer) => writer,
        None => blobs.writer()?,
    };
    for chunk in batch {
        writer.write(chunk)?;
    }
    Ok(writer)
}

fn joined<T>(result: Result<std::io::Result<T>, JoinError>) -> Result<T, ApiError> {
    result.map_err(|e| ApiError::Internal(anyhow::anyhow!("upload writer task failed: {e}")))?.map_err(storage_error)
}

fn storage_error(e: std::io::Error) -> ApiError {
    if e.kind() == std::io::ErrorKind::StorageFull || e.kind() == std::io::ErrorKind::QuotaExceeded {
        ApiError::InsufficientStorage
    } else {
        ApiError::Internal(anyhow::Error::new(e).context("cannot write the upload to the data dir"))
    }
}

/// Who a native write is for limits: writes need a token, so the address never counts (`UNSPECIFIED`).
fn writer<'a>(credentials: &crate::auth::Credentials<'a>) -> super::throttling::Asker<'a> {
    super::throttling::Asker::of(credentials, std::net::Ipv4Addr::UNSPECIFIED.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_below_the_minimum_rate_fails_at_the_end_of_its_window() {
        let start = Instant::now();
        let at = |secs: f64| start + Duration::from_secs_f64(secs);
        let window = Duration::from_secs(2);
        // A byte now and then: fine within the first window, refused once a window has passed.
        let mut trickle = BodyPace::new(500, window, start);
        assert!(trickle.keeps_up(1, at(1.0)));
        assert!(!trickle.keeps_up(1, at(2.5)));
        // A steady 1 KB/s body keeps up across many windows.
        let mut steady = BodyPace::new(500, window, start);
        assert!((1..=20).all(|s| steady.keeps_up(1000, at(s as f64))));
        // Off means off.
        let mut off = BodyPace::new(0, window, start);
        assert!(off.keeps_up(0, at(100.0)));
    }
}
