//! Blobs in an S3-compatible object store: one store object per blob, its bytes verbatim, under
//! `PREFIX/ab/cd/<sha256>` (the data dir's layout, so the store stays browsable and `blobs migrate` is a copy).
//!
//! What the store is asked: upload a blob or a part (one PUT, or a multipart upload above
//! [`MULTIPART_PART_BYTES`]) and confirm its size, fetch a range into a file, delete, list (for the sweep), ping
//! (the readiness probe, whose verdict `/readyz` reads). An upload reads the blob it sends, and a fetch writes what arrives into the cache file: both
//! pass blob bytes through memory, and neither is a response.
//!
//! Every call runs on the runtime the client was made on (`RemoteBlobs::new` captures it): the HTTP client's
//! connections live there, and a data worker's single-threaded runtime only awaits the result, so a slow store
//! never holds a worker's event loop. Errors other than "not found" are [`RemoteError::Unavailable`], which the
//! HTTP layer answers with `503` and `Retry-After`.
//!
//! A hung store is a slow dependency, not an outage: each wait on it is bounded (`blob_store.timeouts`: the
//! connect, each call's response head, each idle gap in a body; never a whole transfer), every call passes the
//! circuit breaker (`breaker`), which fails calls at once while the store keeps failing, and at most
//! `blob_store.max_fetches` fetches are in flight.
//!
//! The blob cache reaches the store through [`RemoteFetch`], the one call it makes; its unit tests put an
//! in-memory store with injectable faults there instead (`fake`).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as StorePath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig, WriteMultipart};

use crate::config::{BlobStoreTimeouts, ObjectStoreLocation};

pub mod breaker;
use breaker::{Admission, Breaker, BreakerState, Verdict};

/// Blobs up to this size go in one PUT; larger ones as a multipart upload of parts this size (S3's minimum part
/// is 5 MiB). What one upload holds in memory is this times `UPLOAD_CONCURRENCY`, read from the staged file.
pub const MULTIPART_PART_BYTES: u64 = 8 << 20;
/// Bytes of a fetched range written to its file at once: what one fetch holds in memory, so fills hold at most
/// `blob_store.max_fetches` times this.
const FILL_BATCH: usize = 1 << 20;
/// Parts of one multipart upload in flight at once.
const UPLOAD_CONCURRENCY: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("blob {0} is not in the object store")]
    NotFound(String),
    /// The store did not answer, or answered with an error: a cold read or an upload cannot go on now.
    #[error("the object store is unavailable: {0}")]
    Unavailable(String),
    /// A local file the call reads or writes failed.
    #[error("{0}")]
    Local(#[from] io::Error),
}

impl RemoteError {
    fn from_store(sha256: &str, e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { .. } => RemoteError::NotFound(sha256.to_owned()),
            other => RemoteError::Unavailable(other.to_string()),
        }
    }
}

/// What the blob cache needs of a store: a range of a blob, written into the cache's file at the same offsets.
/// Only fills call it (one boxed future per slice fetched), never a read of what is cached.
pub trait RemoteFetch: Send + Sync + std::fmt::Debug + 'static {
    /// Fetches `range` of the blob `sha256` into `file` at the same offsets. `Ok` carries the bytes written, which
    /// must be the range's length: a store that sends less is an error, and the cache treats any other count as one.
    fn fetch_into<'a>(
        &'a self,
        sha256: &'a str,
        range: Range<u64>,
        file: Arc<File>,
    ) -> BoxFuture<'a, Result<u64, RemoteError>>;
}

#[cfg(test)]
pub(crate) mod fake;

/// What a store call does, as `/metrics` labels its latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOperation {
    Get,
    Head,
    Put,
    Delete,
    List,
}

impl StoreOperation {
    pub const ALL: [StoreOperation; 5] =
        [StoreOperation::Get, StoreOperation::Head, StoreOperation::Put, StoreOperation::Delete, StoreOperation::List];

    pub fn label(self) -> &'static str {
        match self {
            StoreOperation::Get => "get",
            StoreOperation::Head => "head",
            StoreOperation::Put => "put",
            StoreOperation::Delete => "delete",
            StoreOperation::List => "list",
        }
    }
}

/// Told each store call's operation and how long it took (a fetch: until its last byte); the server passes the
/// metrics layer's recorder, which this layer cannot name.
pub type CallObserver = fn(StoreOperation, Duration);

/// The object store's client, with the prefix blobs live under.
#[derive(Debug, Clone)]
pub struct RemoteBlobs {
    store: Arc<AmazonS3>,
    prefix: Arc<str>,
    runtime: tokio::runtime::Handle,
    location: Arc<str>,
    timeouts: BlobStoreTimeouts,
    health: Arc<Health>,
    /// Fetches in flight, at most `blob_store.max_fetches`.
    fetches: Arc<tokio::sync::Semaphore>,
    max_fetches: usize,
}

/// What the clones of one client share of the store's health.
#[derive(Debug)]
struct Health {
    breaker: Mutex<Breaker>,
    /// Calls the open breaker refused.
    refused: AtomicU64,
    /// The last readiness probe's verdict (`/readyz`).
    reachable: AtomicBool,
    observer: OnceLock<CallObserver>,
}

impl RemoteBlobs {
    /// A client for `location`, its calls run on the current runtime. Makes no request.
    pub fn new(location: &ObjectStoreLocation) -> anyhow::Result<Self> {
        use anyhow::Context;
        // reqwest's rustls has no provider of its own here: ring, as the rest of the process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let options = client_options(location)?;
        // Few, quick retries: a request waits on them, and an outage should become a 503 soon.
        let retry = RetryConfig { max_retries: 2, retry_timeout: Duration::from_secs(10), ..RetryConfig::default() };
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&location.bucket)
            .with_region(&location.region)
            .with_virtual_hosted_style_request(!location.path_style)
            .with_client_options(options)
            .with_retry(retry);
        if let Some(endpoint) = &location.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        match (&location.access_key_id, &location.secret_access_key) {
            (Some(id), Some(secret)) => builder = builder.with_access_key_id(id).with_secret_access_key(secret),
            _ => builder = builder.with_skip_signature(true),
        }
        let store = builder.build().with_context(|| format!("cannot configure the object store {location}"))?;
        Ok(Self::with_client(
            store,
            &location.prefix,
            location.to_string(),
            location.timeouts,
            location.breaker,
            location.max_fetches,
        ))
    }

    /// Around a configured client, with the limits of `blob_store`.
    fn with_client(
        store: AmazonS3,
        prefix: &str,
        location: String,
        timeouts: BlobStoreTimeouts,
        breaker: crate::config::BreakerSettings,
        max_fetches: usize,
    ) -> Self {
        Self {
            store: Arc::new(store),
            prefix: Arc::from(prefix),
            runtime: tokio::runtime::Handle::current(),
            location: Arc::from(location),
            timeouts,
            health: Arc::new(Health {
                breaker: Mutex::new(Breaker::new(breaker.failures, breaker.cool_down)),
                refused: AtomicU64::new(0),
                reachable: AtomicBool::new(true),
                observer: OnceLock::new(),
            }),
            fetches: Arc::new(tokio::sync::Semaphore::new(max_fetches)),
            max_fetches,
        }
    }

    /// Has `observer` told of every call from now on (once; a second observer is ignored).
    pub fn observe_calls(&self, observer: CallObserver) {
        let _ = self.health.observer.set(observer);
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        lock(&self.health.breaker).state(Instant::now())
    }

    /// Calls the open breaker refused so far.
    pub fn refused_calls(&self) -> u64 {
        self.health.refused.load(Ordering::Relaxed)
    }

    /// The last readiness probe's verdict: whether the store answered ([`RemoteBlobs::probe`]).
    pub fn is_reachable(&self) -> bool {
        self.health.reachable.load(Ordering::Acquire)
    }

    /// Pings the store and publishes the verdict [`RemoteBlobs::is_reachable`] reads; returns the result and
    /// whether the verdict changed (so the caller logs an outage where it starts and ends).
    pub async fn probe(&self) -> (Result<(), RemoteError>, bool) {
        let result = self.ping().await;
        let up = result.is_ok();
        let was = self.health.reachable.swap(up, Ordering::AcqRel);
        (result, was != up)
    }

    /// How the store is named in messages and `/readyz`: `s3://bucket/prefix at endpoint`.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The store object of a blob.
    pub fn key_of(&self, sha256: &str) -> StorePath {
        debug_assert!(super::blobs::is_blob_hash(sha256));
        let relative = format!("{}/{}/{sha256}", &sha256[0..2], &sha256[2..4]);
        if self.prefix.is_empty() {
            StorePath::from(relative)
        } else {
            StorePath::from(format!("{}/{relative}", self.prefix))
        }
    }

    /// Runs `call` on the client's runtime and waits for it from wherever we are, if the circuit breaker lets it
    /// through. Its verdict reaches the breaker from the spawned task, so a caller that goes away (a cancelled
    /// request) still reports the call, a probe above all.
    async fn run<T: Send + 'static>(
        &self,
        operation: StoreOperation,
        call: impl Future<Output = Result<T, RemoteError>> + Send + 'static,
    ) -> Result<T, RemoteError> {
        let admission = lock(&self.health.breaker).admit(Instant::now());
        if let Admission::Refused { retry_in } = admission {
            self.health.refused.fetch_add(1, Ordering::Relaxed);
            let threshold = lock(&self.health.breaker).threshold();
            return Err(RemoteError::Unavailable(format!(
                "the object store's circuit breaker is open after {threshold} failed calls in a row; calls fail at \
                 once for another {:.1}s",
                retry_in.as_secs_f64()
            )));
        }
        let health = self.health.clone();
        self.runtime
            .spawn(async move {
                let started = Instant::now();
                let result = call.await;
                let verdict = match &result {
                    Ok(_) | Err(RemoteError::NotFound(_)) => Verdict::Answered,
                    Err(RemoteError::Unavailable(_)) => Verdict::Failed,
                    Err(RemoteError::Local(_)) => Verdict::Unknown,
                };
                lock(&health.breaker).record(admission, verdict, Instant::now());
                if let Some(observe) = health.observer.get() {
                    observe(operation, started.elapsed());
                }
                result
            })
            .await
            .map_err(|e| RemoteError::Unavailable(format!("object store task failed: {e}")))?
    }

    /// The stored size of a blob, `None` when the store has no such object.
    pub async fn size_of(&self, sha256: &str) -> Result<Option<u64>, RemoteError> {
        let (store, key, sha, t) = (self.store.clone(), self.key_of(sha256), sha256.to_owned(), self.timeouts);
        self.run(StoreOperation::Head, async move {
            match within(t.first_byte, "HEAD", store.head(&key)).await? {
                Ok(meta) => Ok(Some(meta.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(RemoteError::from_store(&sha, e)),
            }
        })
        .await
    }

    /// Stores the local file `path` (the blob `sha256`, `size` bytes) unless the store already holds it with that
    /// size (content-addressed: same name, same bytes), then checks the stored size. One PUT up to
    /// [`MULTIPART_PART_BYTES`], a multipart upload above. Returns whether it uploaded.
    pub async fn upload(&self, path: PathBuf, sha256: &str, size: u64) -> Result<bool, RemoteError> {
        if self.size_of(sha256).await? == Some(size) {
            return Ok(false);
        }
        self.upload_to(path, self.key_of(sha256), sha256, size).await?;
        Ok(true)
    }

    /// The store object of an S3 multipart upload's part (`PREFIX/parts/<name>`): parts live in the store too, so
    /// an upload's parts and its Complete may reach different replicas.
    pub fn part_key(&self, name: &str) -> StorePath {
        debug_assert!(super::blobs::is_part_name(name));
        if self.prefix.is_empty() {
            StorePath::from(format!("parts/{name}"))
        } else {
            StorePath::from(format!("{}/parts/{name}", self.prefix))
        }
    }

    /// Stores the part file `path` (`size` bytes) as the part `name`.
    pub async fn upload_part(&self, path: PathBuf, name: &str, size: u64) -> Result<(), RemoteError> {
        self.upload_to(path, self.part_key(name), name, size).await
    }

    /// Fetches the part `name` (`size` bytes) into `file`.
    pub async fn fetch_part(&self, name: &str, size: u64, file: Arc<File>) -> Result<u64, RemoteError> {
        if size == 0 {
            return Ok(0);
        }
        self.fetch_key_into(self.part_key(name), name, 0..size, file).await
    }

    /// Deletes the part `name`'s store object; one already gone is no error.
    pub async fn delete_part(&self, name: &str) -> Result<(), RemoteError> {
        self.delete_key(self.part_key(name), name).await
    }

    /// Every part in the store with when it was written.
    pub async fn list_parts(&self) -> Result<Vec<(String, SystemTime)>, RemoteError> {
        let prefix = if self.prefix.is_empty() {
            StorePath::from("parts")
        } else {
            StorePath::from(format!("{}/parts", self.prefix))
        };
        self.list_named(Some(prefix), super::blobs::is_part_name).await
    }

    async fn upload_to(&self, path: PathBuf, key: StorePath, what: &str, size: u64) -> Result<(), RemoteError> {
        let (store, sha, t) = (self.store.clone(), what.to_owned(), self.timeouts);
        // One PUT (of a blob or a part, at most MULTIPART_PART_BYTES) may take idle_read beyond its first byte.
        let part = t.first_byte + t.idle_read;
        self.run(StoreOperation::Put, async move {
            let file =
                Arc::new(tokio::task::spawn_blocking(move || File::open(path)).await.map_err(io::Error::other)??);
            if size <= MULTIPART_PART_BYTES {
                let bytes = read_at(file, 0, size).await?;
                within(part, "PUT", store.put(&key, PutPayload::from(bytes)))
                    .await?
                    .map_err(|e| RemoteError::from_store(&sha, e))?;
            } else {
                let upload = within(t.first_byte, "multipart upload", store.put_multipart(&key))
                    .await?
                    .map_err(|e| RemoteError::from_store(&sha, e))?;
                let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_PART_BYTES as usize);
                let mut offset = 0;
                while offset < size {
                    let len = (size - offset).min(MULTIPART_PART_BYTES);
                    within(part, "upload part", writer.wait_for_capacity(UPLOAD_CONCURRENCY))
                        .await?
                        .map_err(|e| RemoteError::from_store(&sha, e))?;
                    writer.put(read_at(file.clone(), offset, len).await?);
                    offset += len;
                }
                within(part, "upload part", writer.finish()).await?.map_err(|e| RemoteError::from_store(&sha, e))?;
            }
            let stored = within(t.first_byte, "HEAD", store.head(&key))
                .await?
                .map_err(|e| RemoteError::from_store(&sha, e))?
                .size;
            if stored != size {
                return Err(RemoteError::Unavailable(format!("{sha} stored with {stored} bytes, not {size}")));
            }
            Ok(())
        })
        .await
    }

    async fn fetch_key_into(
        &self,
        key: StorePath,
        what: &str,
        range: Range<u64>,
        file: Arc<File>,
    ) -> Result<u64, RemoteError> {
        let (store, sha, t) = (self.store.clone(), what.to_owned(), self.timeouts);
        let permit = self.fetch_permit().await?;
        self.run(StoreOperation::Get, async move {
            let _permit = permit;
            let options = object_store::GetOptions { range: Some(range.clone().into()), ..Default::default() };
            let result = within(t.first_byte, "GET", store.get_opts(&key, options))
                .await?
                .map_err(|e| RemoteError::from_store(&sha, e))?;
            let mut stream = result.into_stream();
            let mut at = range.start;
            // Written a whole batch at a time, each one write of FILL_BATCH bytes from the range's start: one
            // blocking-pool hop per batch, and the page cache gets the file in large pieces. Written as the network
            // delivers them (often under 64 KiB, at any offset), the cached file was held in ten times as many
            // folios and cost ~1.2x the CPU to send (docs/measurements.md, "Object store").
            let mut pending = bytes::BytesMut::with_capacity(FILL_BATCH);
            loop {
                let next = within(t.idle_read, "GET body", stream.next()).await?;
                let done = next.is_none();
                if let Some(chunk) = next {
                    let chunk = chunk.map_err(|e| RemoteError::from_store(&sha, e))?;
                    if at + (pending.len() + chunk.len()) as u64 > range.end {
                        return Err(RemoteError::Unavailable(format!("{sha}: the store sent more than asked")));
                    }
                    pending.extend_from_slice(&chunk);
                }
                while pending.len() >= FILL_BATCH || (done && !pending.is_empty()) {
                    let batch = pending.split_to(pending.len().min(FILL_BATCH)).freeze();
                    let (f, start, len) = (file.clone(), at, batch.len() as u64);
                    tokio::task::spawn_blocking(move || f.write_all_at(&batch, start))
                        .await
                        .map_err(io::Error::other)??;
                    at += len;
                }
                if done {
                    break;
                }
            }
            if at != range.end {
                return Err(RemoteError::Unavailable(format!(
                    "blob {sha}: the store sent {} of {} bytes asked",
                    at - range.start,
                    range.end - range.start
                )));
            }
            Ok(at - range.start)
        })
        .await
    }

    /// Deletes a blob's store object; one already gone is no error.
    pub async fn delete(&self, sha256: &str) -> Result<(), RemoteError> {
        self.delete_key(self.key_of(sha256), sha256).await
    }

    async fn delete_key(&self, key: StorePath, what: &str) -> Result<(), RemoteError> {
        let (store, sha, t) = (self.store.clone(), what.to_owned(), self.timeouts);
        self.run(StoreOperation::Delete, async move {
            match within(t.first_byte, "DELETE", store.delete(&key)).await? {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(RemoteError::from_store(&sha, e)),
            }
        })
        .await
    }

    /// Every blob in the store with when it was last written; other objects under the prefix are ignored.
    pub async fn list(&self) -> Result<Vec<(String, SystemTime)>, RemoteError> {
        let prefix = (!self.prefix.is_empty()).then(|| StorePath::from(&*self.prefix));
        self.list_named(prefix, super::blobs::is_blob_hash).await
    }

    /// The objects under `prefix` whose last path segment `named` accepts, with when each was written.
    async fn list_named(
        &self,
        prefix: Option<StorePath>,
        named: fn(&str) -> bool,
    ) -> Result<Vec<(String, SystemTime)>, RemoteError> {
        let (store, t) = (self.store.clone(), self.timeouts);
        self.run(StoreOperation::List, async move {
            let mut listing = store.list(prefix.as_ref());
            let mut found = Vec::new();
            // Each page is a request of its own: the bound is per item, which a page's first item waits out.
            while let Some(meta) = within(t.first_byte, "LIST", listing.next()).await? {
                let meta = meta.map_err(|e| RemoteError::Unavailable(e.to_string()))?;
                if let Some(name) = meta.location.filename().filter(|n| named(n)) {
                    found.push((name.to_owned(), SystemTime::from(meta.last_modified)));
                }
            }
            Ok(found)
        })
        .await
    }

    /// Whether the store answers: a listing of at most one key (the readiness probe).
    pub async fn ping(&self) -> Result<(), RemoteError> {
        let (store, t) = (self.store.clone(), self.timeouts);
        let prefix = (!self.prefix.is_empty()).then(|| StorePath::from(&*self.prefix));
        self.run(StoreOperation::List, async move {
            within(t.first_byte, "LIST", store.list_with_delimiter(prefix.as_ref()))
                .await?
                .map_err(|e| RemoteError::Unavailable(e.to_string()))?;
            Ok(())
        })
        .await
    }
}

impl RemoteBlobs {
    /// A place among the `blob_store.max_fetches` fetches in flight, waited for at most `timeouts.first_byte`:
    /// beyond, the store is as slow as one that does not answer.
    async fn fetch_permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, RemoteError> {
        match tokio::time::timeout(self.timeouts.first_byte, self.fetches.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(closed)) => Err(RemoteError::Unavailable(closed.to_string())),
            Err(_) => Err(RemoteError::Unavailable(format!(
                "{} fetches from the object store in flight (blob_store.max_fetches) for {:?}",
                self.max_fetches, self.timeouts.first_byte
            ))),
        }
    }
}

/// The connection settings of the store's HTTP client: `blob_store.timeouts.connect`, no bound on a whole request
/// (a large range may take long; `within` bounds each wait instead, and not reqwest's read timeout, which would
/// also cut a PUT whose body takes longer than it to send), the endpoint's scheme and `ca_bundle`.
fn client_options(location: &ObjectStoreLocation) -> anyhow::Result<ClientOptions> {
    use anyhow::Context;
    let mut options = ClientOptions::new()
        .with_connect_timeout(location.timeouts.connect)
        .with_timeout_disabled()
        .with_pool_idle_timeout(Duration::from_secs(30));
    if let Some(endpoint) = &location.endpoint {
        options = options.with_allow_http(endpoint.starts_with("http://"));
    }
    if let Some(path) = &location.ca_bundle {
        let pem =
            std::fs::read(path).with_context(|| format!("cannot read blob_store.ca_bundle {}", path.display()))?;
        let certificates = object_store::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("blob_store.ca_bundle {} is not PEM certificates", path.display()))?;
        for certificate in certificates {
            options = options.with_root_certificate(certificate);
        }
    }
    Ok(options)
}

/// `call`'s output, or `Unavailable` once the store has kept it waiting `limit` (`what` names the wait).
async fn within<T>(limit: Duration, what: &str, call: impl Future<Output = T>) -> Result<T, RemoteError> {
    tokio::time::timeout(limit, call).await.map_err(|_| {
        RemoteError::Unavailable(format!(
            "the object store sent nothing for {} ({what})",
            humantime::format_duration(limit)
        ))
    })
}

fn lock(breaker: &Mutex<Breaker>) -> std::sync::MutexGuard<'_, Breaker> {
    // The state machine cannot panic half-way; a poisoned lock still holds a consistent state.
    breaker.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl RemoteFetch for RemoteBlobs {
    /// Chunk by chunk as the range arrives, written on the blocking pool.
    fn fetch_into<'a>(
        &'a self,
        sha256: &'a str,
        range: Range<u64>,
        file: Arc<File>,
    ) -> BoxFuture<'a, Result<u64, RemoteError>> {
        Box::pin(self.fetch_key_into(self.key_of(sha256), sha256, range, file))
    }
}

/// `len` bytes of `file` from `offset`, read on the blocking pool (an upload's body: it has to pass through memory
/// to go over HTTP).
async fn read_at(file: Arc<File>, offset: u64, len: u64) -> Result<Bytes, RemoteError> {
    let bytes = tokio::task::spawn_blocking(move || -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; usize::try_from(len).map_err(io::Error::other)?];
        file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    })
    .await
    .map_err(io::Error::other)??;
    Ok(Bytes::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[tokio::test]
    async fn failed_calls_open_the_breaker_and_then_fail_at_once_counted() {
        let remote = fake::never_asked();
        let threshold = crate::config::BreakerSettings::default().failures;
        for _ in 0..threshold {
            let error = remote.size_of(SHA).await.unwrap_err();
            assert!(matches!(&error, RemoteError::Unavailable(why) if !why.contains("breaker")), "{error}");
        }
        assert_eq!(remote.breaker_state(), BreakerState::Open);
        assert_eq!(remote.refused_calls(), 0);
        let error = remote.delete(SHA).await.unwrap_err();
        assert!(matches!(&error, RemoteError::Unavailable(why) if why.contains("circuit breaker is open")), "{error}");
        let (probe, changed) = remote.probe().await;
        assert!(probe.is_err() && changed && !remote.is_reachable(), "the probe's verdict is published");
        assert_eq!(remote.refused_calls(), 2);
    }

    /// A client of a store that answers every request with the head of a 10-byte object and 4 bytes of its body,
    /// then nothing more (a store hung mid-body).
    fn stalling_mid_body() -> RemoteBlobs {
        use object_store::aws::AmazonS3Builder;
        use object_store::client::{HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService};

        #[derive(Debug)]
        struct Stall;
        impl HttpConnector for Stall {
            fn connect(&self, _: &ClientOptions) -> object_store::Result<HttpClient> {
                Ok(HttpClient::new(Stall))
            }
        }
        impl HttpService for Stall {
            fn call<'life0, 'async_trait>(
                &'life0 self,
                _: HttpRequest,
            ) -> std::pin::Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                let response = http::Response::builder()
                    .status(206)
                    .header("content-length", "10")
                    .header("content-range", "bytes 0-9/10")
                    .header("last-modified", "Thu, 01 Jan 1970 00:00:00 GMT")
                    .header("etag", "\"stalled\"")
                    .body(object_store::client::HttpResponseBody::new(FourBytesThenNothing(false)))
                    .unwrap();
                Box::pin(std::future::ready(Ok(response)))
            }
        }
        struct FourBytesThenNothing(bool);
        impl http_body::Body for FourBytesThenNothing {
            type Data = Bytes;
            type Error = HttpError;
            fn poll_frame(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
                if std::mem::replace(&mut self.0, true) {
                    std::task::Poll::Pending
                } else {
                    std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(b"four")))))
                }
            }
        }

        let store = AmazonS3Builder::new()
            .with_bucket_name("stalled")
            .with_region("us-east-1")
            .with_endpoint("http://127.0.0.1:9")
            .with_allow_http(true)
            .with_skip_signature(true)
            .with_retry(RetryConfig { max_retries: 0, ..RetryConfig::default() })
            .with_http_connector(Stall)
            .build()
            .unwrap();
        let defaults = crate::config::BlobStoreSettings::default();
        RemoteBlobs::with_client(store, "", "s3://stalled".into(), defaults.timeouts, defaults.breaker, 1)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_mid_way_fails_after_the_idle_read_timeout_and_frees_its_place() {
        let remote = stalling_mid_body();
        let file = Arc::new(tempfile::tempfile().unwrap());
        let started = tokio::time::Instant::now();
        let error = remote.fetch_into(SHA, 0..10, file.clone()).await.unwrap_err();
        assert!(matches!(&error, RemoteError::Unavailable(why) if why.contains("GET body")), "{error}");
        assert!(started.elapsed() >= remote.timeouts.idle_read, "not before the timeout");
        assert!(started.elapsed() < remote.timeouts.first_byte + remote.timeouts.idle_read * 2, "bounded by idleness");
        assert_eq!(remote.fetches.available_permits(), 1, "the fetch's place is free again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fetch_waits_for_a_place_at_most_the_first_byte_timeout() {
        let remote = fake::never_asked();
        let taken = remote.fetches.clone().acquire_many_owned(remote.max_fetches as u32).await.unwrap();
        let file = Arc::new(tempfile::tempfile().unwrap());
        let started = tokio::time::Instant::now();
        let error = remote.fetch_into(SHA, 0..10, file).await.unwrap_err();
        assert!(matches!(&error, RemoteError::Unavailable(why) if why.contains("max_fetches")), "{error}");
        assert!(started.elapsed() >= remote.timeouts.first_byte, "it waited for a place first");
        assert_eq!(remote.breaker_state(), BreakerState::Closed, "no store call was made");
        drop(taken);
    }
}
