//! Blobs in an S3-compatible object store: one store object per blob, its bytes verbatim, under
//! `PREFIX/ab/cd/<sha256>` (the data dir's layout, so the store stays browsable and `blobs migrate` is a copy).
//!
//! What the store is asked: upload a blob or a part (one PUT, or a multipart upload above
//! [`MULTIPART_PART_BYTES`]) and confirm its size, fetch a range into a file, delete, list (for the sweep), ping
//! (the readiness probe, whose verdict `/readyz` reads). Beside each blob goes its sealed slice manifest
//! (`<blob key>.slices`, `store::manifest`), hashed from the bytes as they are uploaded, which the cache checks each
//! fetched slice against. An upload reads the blob it sends, and a fetch writes what arrives into the cache file: both
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

use super::manifest::{CHUNK_BYTES, ChunkDigest, ChunkHasher, ManifestKey, SliceManifest};
use crate::config::{BlobStoreTimeouts, ObjectStoreLocation, StoreCredentials};

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
    /// The store refused the credentials: says which settings gave them, never their values.
    #[error("{0}")]
    Refused(String),
    /// A local file the call reads or writes failed.
    #[error("{0}")]
    Local(#[from] io::Error),
}

impl RemoteError {
    /// `e` of a call about `sha256`, made with the credentials of `source` (settings' names, for the message).
    fn from_store(sha256: &str, source: &str, e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { .. } => RemoteError::NotFound(sha256.to_owned()),
            other => RemoteError::unavailable(source, other),
        }
    }

    /// `e` as unavailability; a refusal of the credentials says which settings gave them, in one line, and neither
    /// the response (S3 echoes the request it could not verify) nor a secret.
    fn unavailable(source: &str, e: object_store::Error) -> Self {
        match refusal(&e) {
            Some(code) => RemoteError::Refused(format!(
                "the object store refused the credentials of {source} ({code}): check them and the bucket's policy"
            )),
            None => RemoteError::Unavailable(e.to_string().replace('\n', " ")),
        }
    }
}

/// Whether the store refused the request's credentials, and how: S3's error code, or the status of a response
/// without a body (a HEAD's).
fn refusal(e: &object_store::Error) -> Option<&'static str> {
    const CODES: [&str; 6] = [
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AccessDenied",
    ];
    let text = e.to_string();
    if let Some(code) = CODES.into_iter().find(|code| text.contains(code)) {
        return Some(code);
    }
    match e {
        object_store::Error::PermissionDenied { .. } => Some("403 Forbidden"),
        object_store::Error::Unauthenticated { .. } => Some("401 Unauthorized"),
        _ if text.contains("403 Forbidden") => Some("403 Forbidden"),
        _ => None,
    }
}

/// How a fetch hashes what it writes: each `chunk_bytes` from the range's start, and `on_chunk` told of each chunk
/// once it is in the file (its offset and digest), which may stop the fetch by answering false (a chunk that does
/// not match what was uploaded).
#[derive(Clone)]
pub struct ChunkCheck {
    pub chunk_bytes: u64,
    pub on_chunk: OnChunk,
}

/// Told of a chunk in the file (its offset, its digest); false stops the fetch.
pub type OnChunk = Arc<dyn Fn(u64, &ChunkDigest) -> bool + Send + Sync>;

impl std::fmt::Debug for ChunkCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkCheck").field("chunk_bytes", &self.chunk_bytes).finish_non_exhaustive()
    }
}

impl ChunkCheck {
    /// Tells `on_chunk` of the chunks `hasher` completed since it last did; false if one was refused.
    pub fn report(&self, range_start: u64, hasher: &mut ChunkHasher) -> bool {
        hasher
            .new_digests()
            .iter()
            .all(|(i, digest)| (self.on_chunk)(range_start + *i as u64 * self.chunk_bytes, digest))
    }
}

/// What a fetch wrote, and the digests of the chunks it wrote, hashed as they arrived.
#[derive(Debug, Default)]
pub struct Fetched {
    /// Bytes written: the range's length, else the cache treats it as a failure.
    pub written: u64,
    /// With a chunk size asked for: the SHA-256 of each chunk of the range, from its start.
    pub digests: Vec<ChunkDigest>,
}

/// What the blob cache needs of a store: a range of a blob, written into the cache's file at the same offsets, the
/// blob's sealed slice manifest, and the version of its store copy. Only fills call it (one boxed future per slice
/// fetched), never a read of what is cached.
pub trait RemoteFetch: Send + Sync + std::fmt::Debug + 'static {
    /// Fetches `range` of the blob `sha256` into `file` at the same offsets, hashing and reporting each chunk of it
    /// as `check` asks. A store that sends less than the range is an error, and so is a chunk `check` refuses.
    fn fetch_into<'a>(
        &'a self,
        sha256: &'a str,
        range: Range<u64>,
        file: Arc<File>,
        check: Option<ChunkCheck>,
    ) -> BoxFuture<'a, Result<Fetched, RemoteError>>;

    /// The sealed slice manifest of the blob `sha256`; `None` when the store has none (a blob stored before
    /// manifests).
    fn manifest<'a>(&'a self, sha256: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, RemoteError>>;

    /// What tells one store copy of the blob from another (its ETag and modification time); `None` if absent.
    fn version<'a>(&'a self, sha256: &'a str) -> BoxFuture<'a, Result<Option<String>, RemoteError>>;
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

/// Objects looked at for one page of a [`Listing`]: an S3 ListObjectsV2 answers at most 1,000 keys.
pub const LIST_PAGE: usize = 1000;

/// A page of a store listing: what it found, and where the next page starts (`None`: this was the last).
#[derive(Debug)]
struct ListPage {
    found: Vec<(String, SystemTime)>,
    next: Option<String>,
}

/// How far a listing of the store's blobs or parts has gone: [`RemoteBlobs::next_page`] reads it a page at a time.
#[derive(Debug)]
pub struct Listing {
    parts: bool,
    /// Where the next page starts; `None` before the first.
    after: Option<String>,
    done: bool,
}

impl Listing {
    /// The blobs in the store (other objects under the prefix are skipped).
    pub fn blobs() -> Self {
        Listing { parts: false, after: None, done: false }
    }

    /// The parts of multipart uploads in the store.
    pub fn parts() -> Self {
        Listing { parts: true, after: None, done: false }
    }
}

/// The object store's client, with the prefix blobs live under.
#[derive(Debug, Clone)]
pub struct RemoteBlobs {
    store: Arc<AmazonS3>,
    prefix: Arc<str>,
    runtime: tokio::runtime::Handle,
    location: Arc<str>,
    /// Seals the slice manifests uploads write, and opens those fills read; `None` without a secrets key.
    manifest_key: Option<Arc<ManifestKey>>,
    /// The settings the credentials came from, for messages.
    credentials: &'static str,
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
        builder = with_credentials(builder, &location.credentials);
        let store = builder.build().with_context(|| format!("cannot configure the object store {location}"))?;
        Ok(Self::with_client(
            store,
            &location.prefix,
            location.to_string(),
            location.timeouts,
            location.breaker,
            location.max_fetches,
            location.credentials.source(),
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
        credentials: &'static str,
    ) -> Self {
        Self {
            store: Arc::new(store),
            prefix: Arc::from(prefix),
            runtime: tokio::runtime::Handle::current(),
            location: Arc::from(location),
            manifest_key: None,
            credentials,
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

    /// Uploads write sealed slice manifests with `key`, and the cache checks slices against them.
    pub fn with_manifest_key(mut self, key: ManifestKey) -> Self {
        self.manifest_key = Some(Arc::new(key));
        self
    }

    pub fn manifest_key(&self) -> Option<&ManifestKey> {
        self.manifest_key.as_deref()
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

    /// The store object of a blob's sealed slice manifest.
    fn manifest_path(&self, sha256: &str) -> StorePath {
        StorePath::from(format!("{}.slices", self.key_of(sha256)))
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
                    // A refused key is an answer: the store is there, and failing fast would not help it.
                    Ok(_) | Err(RemoteError::NotFound(_) | RemoteError::Refused(_)) => Verdict::Answered,
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
        let who = self.credentials;
        let (store, key, sha, t) = (self.store.clone(), self.key_of(sha256), sha256.to_owned(), self.timeouts);
        self.run(StoreOperation::Head, async move {
            match within(t.first_byte, "HEAD", store.head(&key)).await? {
                Ok(meta) => Ok(Some(meta.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(RemoteError::from_store(&sha, who, e)),
            }
        })
        .await
    }

    /// Stores the local file `path` (the blob `sha256`, `size` bytes) unless the store already holds it with that
    /// size (content-addressed: same name, same bytes), then checks the stored size. One PUT up to
    /// [`MULTIPART_PART_BYTES`], a multipart upload above. Its slice manifest goes with it (also when the blob
    /// was there without one). Returns whether it uploaded the blob.
    pub async fn upload(&self, path: PathBuf, sha256: &str, size: u64) -> Result<bool, RemoteError> {
        self.upload_checked(path, sha256, size, false).await
    }

    /// [`RemoteBlobs::upload`], and with `replace` the blob goes whatever the store holds: its copy there failed
    /// its check (the cache quarantined it), and a sound one is at hand.
    pub async fn upload_checked(
        &self,
        path: PathBuf,
        sha256: &str,
        size: u64,
        replace: bool,
    ) -> Result<bool, RemoteError> {
        if !replace && self.size_of(sha256).await? == Some(size) {
            if self.manifest_key.is_some() && !self.has_manifest(sha256).await? {
                let digests = hash_file(path, CHUNK_BYTES).await?;
                self.put_manifest(sha256, size, digests).await?;
            }
            return Ok(false);
        }
        let digests = self.upload_to(path, self.key_of(sha256), sha256, size).await?;
        self.put_manifest(sha256, size, digests).await?;
        Ok(true)
    }

    /// Stores the slice manifest of the blob `sha256` (`digests` of its [`CHUNK_BYTES`] chunks), sealed; nothing
    /// without a key.
    async fn put_manifest(&self, sha256: &str, size: u64, digests: Vec<ChunkDigest>) -> Result<(), RemoteError> {
        let Some(key) = &self.manifest_key else { return Ok(()) };
        let manifest = SliceManifest::new(size, CHUNK_BYTES, digests)
            .map_err(|e| RemoteError::Local(io::Error::other(format!("blob {sha256}: {e}"))))?;
        let sealed = Bytes::from(manifest.seal(key, sha256));
        let (store, path, sha) = (self.store.clone(), self.manifest_path(sha256), sha256.to_owned());
        let (who, t) = (self.credentials, self.timeouts);
        self.run(StoreOperation::Put, async move {
            within(t.first_byte + t.idle, "PUT", store.put(&path, PutPayload::from(sealed)))
                .await?
                .map_err(|e| RemoteError::from_store(&sha, who, e))?;
            Ok(())
        })
        .await
    }

    async fn has_manifest(&self, sha256: &str) -> Result<bool, RemoteError> {
        let (store, path, sha) = (self.store.clone(), self.manifest_path(sha256), sha256.to_owned());
        let (who, t) = (self.credentials, self.timeouts);
        self.run(StoreOperation::Head, async move {
            match within(t.first_byte, "HEAD", store.head(&path)).await? {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(RemoteError::from_store(&sha, who, e)),
            }
        })
        .await
    }

    /// The sealed slice manifest of a blob, `None` when the store has none.
    pub async fn fetch_manifest(&self, sha256: &str) -> Result<Option<Vec<u8>>, RemoteError> {
        let (store, path, sha) = (self.store.clone(), self.manifest_path(sha256), sha256.to_owned());
        let (who, t) = (self.credentials, self.timeouts);
        self.run(StoreOperation::Get, async move {
            let result = match within(t.first_byte, "GET", store.get(&path)).await? {
                Ok(result) => result,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(RemoteError::from_store(&sha, who, e)),
            };
            // A manifest is 32 bytes per MiB of blob: bounded well before this.
            if result.meta.size > 64 << 20 {
                return Err(RemoteError::Unavailable(format!(
                    "blob {sha}: its manifest is {} bytes",
                    result.meta.size
                )));
            }
            let bytes = within(t.idle, "GET", result.bytes()).await?;
            Ok(Some(bytes.map_err(|e| RemoteError::from_store(&sha, who, e))?.to_vec()))
        })
        .await
    }

    /// Writes the slice manifest of a blob the store holds without one (stored before manifests): the blob is
    /// fetched into a scratch file in `scratch_dir`, hashed whole and by chunk, and the manifest is stored only if
    /// the whole hashes to its name.
    pub async fn write_missing_manifest(
        &self,
        sha256: &str,
        scratch_dir: &std::path::Path,
    ) -> Result<ManifestRepair, RemoteError> {
        if self.manifest_key.is_none() || self.has_manifest(sha256).await? {
            return Ok(ManifestRepair::Present);
        }
        let Some(size) = self.size_of(sha256).await? else { return Err(RemoteError::NotFound(sha256.to_owned())) };
        let scratch = scratch_dir.join(super::blobs::new_stage_name());
        let file = {
            let scratch = scratch.clone();
            tokio::task::spawn_blocking(move || {
                std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(scratch)
            })
            .await
            .map_err(io::Error::other)??
        };
        let fetched = self.fetch_key_into(self.key_of(sha256), sha256, 0..size, Arc::new(file), None).await;
        let hashed = match fetched {
            Ok(_) => hash_whole_and_chunks(scratch.clone(), CHUNK_BYTES).await,
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&scratch);
        let (whole, digests) = hashed?;
        if whole != sha256 {
            return Ok(ManifestRepair::Corrupt);
        }
        self.put_manifest(sha256, size, digests).await?;
        Ok(ManifestRepair::Written)
    }

    /// The version of a blob's store copy (ETag, size and modification time), `None` when the store has none.
    pub async fn version_of(&self, sha256: &str) -> Result<Option<String>, RemoteError> {
        let (store, key, sha) = (self.store.clone(), self.key_of(sha256), sha256.to_owned());
        let (who, t) = (self.credentials, self.timeouts);
        self.run(StoreOperation::Head, async move {
            match within(t.first_byte, "HEAD", store.head(&key)).await? {
                Ok(meta) => {
                    Ok(Some(format!("{}/{}/{}", meta.e_tag.unwrap_or_default(), meta.size, meta.last_modified)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(RemoteError::from_store(&sha, who, e)),
            }
        })
        .await
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
        self.upload_to(path, self.part_key(name), name, size).await.map(drop)
    }

    /// Fetches the part `name` (`size` bytes) into `file`.
    pub async fn fetch_part(&self, name: &str, size: u64, file: Arc<File>) -> Result<u64, RemoteError> {
        if size == 0 {
            return Ok(0);
        }
        self.fetch_key_into(self.part_key(name), name, 0..size, file, None).await.map(|f| f.written)
    }

    /// Deletes the part `name`'s store object; one already gone is no error.
    pub async fn delete_part(&self, name: &str) -> Result<(), RemoteError> {
        self.delete_key(self.part_key(name), name).await
    }

    /// The next page of `listing` (names with when each was last written), or `None` once it is over.
    pub async fn next_page(&self, listing: &mut Listing) -> Result<Option<Vec<(String, SystemTime)>>, RemoteError> {
        if listing.done {
            return Ok(None);
        }
        let page = if listing.parts {
            let prefix = if self.prefix.is_empty() {
                StorePath::from("parts")
            } else {
                StorePath::from(format!("{}/parts", self.prefix))
            };
            self.list_page(Some(prefix), super::blobs::is_part_name, listing.after.as_deref()).await?
        } else {
            let prefix = (!self.prefix.is_empty()).then(|| StorePath::from(&*self.prefix));
            self.list_page(prefix, super::blobs::is_blob_hash, listing.after.as_deref()).await?
        };
        listing.done = page.next.is_none();
        listing.after = page.next;
        Ok(Some(page.found))
    }

    /// Uploads `path` as `key`; returns the digests of its [`CHUNK_BYTES`] chunks, hashed as they were read.
    async fn upload_to(
        &self,
        path: PathBuf,
        key: StorePath,
        what: &str,
        size: u64,
    ) -> Result<Vec<ChunkDigest>, RemoteError> {
        let (store, sha, t) = (self.store.clone(), what.to_owned(), self.timeouts);
        let who = self.credentials;
        // One PUT (of a blob or a part, at most MULTIPART_PART_BYTES) may take idle beyond its first byte.
        let part = t.first_byte + t.idle;
        self.run(StoreOperation::Put, async move {
            let file =
                Arc::new(tokio::task::spawn_blocking(move || File::open(path)).await.map_err(io::Error::other)??);
            let mut hasher = ChunkHasher::new(CHUNK_BYTES);
            if size <= MULTIPART_PART_BYTES {
                let bytes;
                (bytes, hasher) = read_at(file, 0, size, hasher).await?;
                within(part, "PUT", store.put(&key, PutPayload::from(bytes)))
                    .await?
                    .map_err(|e| RemoteError::from_store(&sha, who, e))?;
            } else {
                let upload = within(t.first_byte, "multipart upload", store.put_multipart(&key))
                    .await?
                    .map_err(|e| RemoteError::from_store(&sha, who, e))?;
                let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_PART_BYTES as usize);
                let mut offset = 0;
                while offset < size {
                    let len = (size - offset).min(MULTIPART_PART_BYTES);
                    within(part, "upload part", writer.wait_for_capacity(UPLOAD_CONCURRENCY))
                        .await?
                        .map_err(|e| RemoteError::from_store(&sha, who, e))?;
                    let bytes;
                    (bytes, hasher) = read_at(file.clone(), offset, len, hasher).await?;
                    writer.put(bytes);
                    offset += len;
                }
                within(part, "upload part", writer.finish())
                    .await?
                    .map_err(|e| RemoteError::from_store(&sha, who, e))?;
            }
            let stored = within(t.first_byte, "HEAD", store.head(&key))
                .await?
                .map_err(|e| RemoteError::from_store(&sha, who, e))?
                .size;
            if stored != size {
                return Err(RemoteError::Unavailable(format!("{sha} stored with {stored} bytes, not {size}")));
            }
            Ok(hasher.finish())
        })
        .await
    }

    async fn fetch_key_into(
        &self,
        key: StorePath,
        what: &str,
        range: Range<u64>,
        file: Arc<File>,
        check: Option<ChunkCheck>,
    ) -> Result<Fetched, RemoteError> {
        let (store, sha, t) = (self.store.clone(), what.to_owned(), self.timeouts);
        let who = self.credentials;
        let permit = self.fetch_permit().await?;
        self.run(StoreOperation::Get, async move {
            let _permit = permit;
            let options = object_store::GetOptions { range: Some(range.clone().into()), ..Default::default() };
            let result = within(t.first_byte, "GET", store.get_opts(&key, options))
                .await?
                .map_err(|e| RemoteError::from_store(&sha, who, e))?;
            let mut stream = result.into_stream();
            let mut at = range.start;
            // Written a whole batch at a time, each one write of FILL_BATCH bytes from the range's start: one
            // blocking-pool hop per batch, and the page cache gets the file in large pieces. Written as the network
            // delivers them (often under 64 KiB, at any offset), the cached file was held in ten times as many
            // folios and cost ~1.2x the CPU to send (docs/measurements.md, "Object store").
            let mut pending = bytes::BytesMut::with_capacity(FILL_BATCH);
            // Hashed beside the write, on the blocking pool, from the same buffer.
            let mut hasher = check.as_ref().map(|c| ChunkHasher::new(c.chunk_bytes));
            let refused = || RemoteError::Unavailable(format!("blob {sha}: a chunk does not match what was uploaded"));
            loop {
                let next = within(t.idle, "GET body", stream.next()).await?;
                let done = next.is_none();
                if let Some(chunk) = next {
                    let chunk = chunk.map_err(|e| RemoteError::from_store(&sha, who, e))?;
                    if at + (pending.len() + chunk.len()) as u64 > range.end {
                        return Err(RemoteError::Unavailable(format!("{sha}: the store sent more than asked")));
                    }
                    pending.extend_from_slice(&chunk);
                }
                while pending.len() >= FILL_BATCH || (done && !pending.is_empty()) {
                    let batch = pending.split_to(pending.len().min(FILL_BATCH)).freeze();
                    let (f, start, len, mut h) = (file.clone(), at, batch.len() as u64, hasher.take());
                    let (check, range_start) = (check.clone(), range.start);
                    let (h, accepted) = tokio::task::spawn_blocking(move || -> io::Result<_> {
                        if let Some(h) = &mut h {
                            h.update(&batch);
                        }
                        f.write_all_at(&batch, start)?;
                        // Each chunk is reported once it is in the file: from then on it may be sent.
                        let accepted = match (&check, &mut h) {
                            (Some(check), Some(h)) => check.report(range_start, h),
                            _ => true,
                        };
                        Ok((h, accepted))
                    })
                    .await
                    .map_err(io::Error::other)??;
                    hasher = h;
                    if !accepted {
                        return Err(refused());
                    }
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
            let mut digests = Vec::new();
            if let Some(mut hasher) = hasher {
                hasher.end();
                if let Some(check) = &check
                    && !check.report(range.start, &mut hasher)
                {
                    return Err(refused());
                }
                digests = hasher.finish();
            }
            Ok(Fetched { written: at - range.start, digests })
        })
        .await
    }

    /// Deletes a blob's store object and its slice manifest; one already gone is no error.
    pub async fn delete(&self, sha256: &str) -> Result<(), RemoteError> {
        let who = self.credentials;
        let keys = [self.key_of(sha256), self.manifest_path(sha256)];
        let (store, sha, t) = (self.store.clone(), sha256.to_owned(), self.timeouts);
        // One request for both (S3's DeleteObjects), so a blob never goes without its manifest going too.
        self.run(StoreOperation::Delete, async move {
            let keys = futures_util::stream::iter(keys.into_iter().map(Ok)).boxed();
            let deleted: Vec<_> = within(t.first_byte, "DELETE", store.delete_stream(keys).collect()).await?;
            for result in deleted {
                match result {
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(RemoteError::from_store(&sha, who, e)),
                }
            }
            Ok(())
        })
        .await
    }

    async fn delete_key(&self, key: StorePath, what: &str) -> Result<(), RemoteError> {
        let who = self.credentials;
        let (store, sha, t) = (self.store.clone(), what.to_owned(), self.timeouts);
        self.run(StoreOperation::Delete, async move {
            match within(t.first_byte, "DELETE", store.delete(&key)).await? {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(RemoteError::from_store(&sha, who, e)),
            }
        })
        .await
    }

    /// One page of the objects under `prefix` in name order, after the object `after` (a [`ListPage::next`]): at
    /// most [`LIST_PAGE`] objects looked at (one request to an S3 store), those whose last path segment `named`
    /// accepts kept. A listing of a store of millions of blobs thus holds a page in memory, never all of it.
    async fn list_page(
        &self,
        prefix: Option<StorePath>,
        named: fn(&str) -> bool,
        after: Option<&str>,
    ) -> Result<ListPage, RemoteError> {
        let who = self.credentials;
        let (store, t) = (self.store.clone(), self.timeouts);
        let after = after.map(StorePath::from);
        self.run(StoreOperation::List, async move {
            let mut listing = match &after {
                Some(after) => store.list_with_offset(prefix.as_ref(), after),
                None => store.list(prefix.as_ref()),
            };
            let (mut found, mut seen, mut last) = (Vec::new(), 0, None);
            // An S3 page is a request of its own: the bound is per item, which a page's first item waits out.
            while seen < LIST_PAGE {
                let Some(meta) = within(t.first_byte, "LIST", listing.next()).await? else {
                    return Ok(ListPage { found, next: None });
                };
                let meta = meta.map_err(|e| RemoteError::unavailable(who, e))?;
                seen += 1;
                if let Some(name) = meta.location.filename().filter(|n| named(n)) {
                    found.push((name.to_owned(), SystemTime::from(meta.last_modified)));
                }
                last = Some(meta.location);
            }
            Ok(ListPage { found, next: last.map(|l| l.to_string()) })
        })
        .await
    }

    /// Whether the store answers: a listing of at most one key (the readiness probe).
    pub async fn ping(&self) -> Result<(), RemoteError> {
        let who = self.credentials;
        let (store, t) = (self.store.clone(), self.timeouts);
        let prefix = (!self.prefix.is_empty()).then(|| StorePath::from(&*self.prefix));
        self.run(StoreOperation::List, async move {
            within(t.first_byte, "LIST", store.list_with_delimiter(prefix.as_ref()))
                .await?
                .map_err(|e| RemoteError::unavailable(who, e))?;
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
        check: Option<ChunkCheck>,
    ) -> BoxFuture<'a, Result<Fetched, RemoteError>> {
        Box::pin(self.fetch_key_into(self.key_of(sha256), sha256, range, file, check))
    }

    fn manifest<'a>(&'a self, sha256: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, RemoteError>> {
        Box::pin(self.fetch_manifest(sha256))
    }

    fn version<'a>(&'a self, sha256: &'a str) -> BoxFuture<'a, Result<Option<String>, RemoteError>> {
        Box::pin(self.version_of(sha256))
    }
}

/// The builder with `credentials` handed to `object_store`'s own provider for them (static, web identity, container,
/// instance metadata), or unsigned.
fn with_credentials(builder: AmazonS3Builder, credentials: &StoreCredentials) -> AmazonS3Builder {
    use object_store::aws::AmazonS3ConfigKey as Key;
    match credentials {
        StoreCredentials::Static { access_key_id, secret_access_key, session_token, .. } => {
            let builder = builder.with_access_key_id(access_key_id).with_secret_access_key(secret_access_key);
            match session_token {
                Some(token) => builder.with_token(token),
                None => builder,
            }
        }
        StoreCredentials::WebIdentity { token_file, role_arn, session_name, sts_endpoint } => {
            let mut builder =
                builder.with_config(Key::WebIdentityTokenFile, token_file).with_config(Key::RoleArn, role_arn);
            if let Some(name) = session_name {
                builder = builder.with_config(Key::RoleSessionName, name);
            }
            if let Some(endpoint) = sts_endpoint {
                builder = builder.with_config(Key::StsEndpoint, endpoint);
            }
            builder
        }
        StoreCredentials::ContainerRelative { uri } => builder.with_config(Key::ContainerCredentialsRelativeUri, uri),
        StoreCredentials::ContainerFull { uri, token_file } => builder
            .with_config(Key::ContainerCredentialsFullUri, uri)
            .with_config(Key::ContainerAuthorizationTokenFile, token_file),
        // With none of the above, `object_store` asks the instance metadata service (IMDSv2).
        StoreCredentials::InstanceMetadata => builder,
        StoreCredentials::Anonymous => builder.with_skip_signature(true),
    }
}

/// What [`RemoteBlobs::write_missing_manifest`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestRepair {
    Present,
    Written,
    /// The store's copy does not hash to the blob's name: no manifest was written.
    Corrupt,
}

/// The SHA-256 of a local file and the digests of its chunks, read once on the blocking pool.
async fn hash_whole_and_chunks(path: PathBuf, chunk_bytes: u64) -> Result<(String, Vec<ChunkDigest>), RemoteError> {
    let hashed = tokio::task::spawn_blocking(move || -> io::Result<(String, Vec<ChunkDigest>)> {
        use sha2::Digest;
        use std::io::Read;
        let mut file = File::open(path)?;
        let (mut whole, mut chunks) = (sha2::Sha256::new(), ChunkHasher::new(chunk_bytes));
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match file.read(&mut buf) {
                Ok(0) => return Ok((hex::encode(whole.finalize()), chunks.finish())),
                Ok(n) => {
                    whole.update(&buf[..n]);
                    chunks.update(&buf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .map_err(io::Error::other)??;
    Ok(hashed)
}

/// `len` bytes of `file` from `offset`, read and hashed on the blocking pool (an upload's body: it has to pass
/// through memory to go over HTTP).
async fn read_at(
    file: Arc<File>,
    offset: u64,
    len: u64,
    mut hasher: ChunkHasher,
) -> Result<(Bytes, ChunkHasher), RemoteError> {
    let (bytes, hasher) = tokio::task::spawn_blocking(move || -> io::Result<(Vec<u8>, ChunkHasher)> {
        let mut buf = vec![0u8; usize::try_from(len).map_err(io::Error::other)?];
        file.read_exact_at(&mut buf, offset)?;
        hasher.update(&buf);
        Ok((buf, hasher))
    })
    .await
    .map_err(io::Error::other)??;
    Ok((Bytes::from(bytes), hasher))
}

/// The digests of a local file's chunks (a blob the store holds without a manifest), read on the blocking pool.
async fn hash_file(path: PathBuf, chunk_bytes: u64) -> Result<Vec<ChunkDigest>, RemoteError> {
    let digests = tokio::task::spawn_blocking(move || -> io::Result<Vec<ChunkDigest>> {
        use std::io::Read;
        let mut file = File::open(path)?;
        let mut hasher = ChunkHasher::new(chunk_bytes);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match file.read(&mut buf) {
                Ok(0) => return Ok(hasher.finish()),
                Ok(n) => hasher.update(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .map_err(io::Error::other)??;
    Ok(digests)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(text: &str) -> object_store::Error {
        object_store::Error::Generic { store: "S3", source: text.into() }
    }

    #[test]
    fn a_refusal_of_the_credentials_names_their_settings_in_one_line_and_nothing_of_the_response() {
        let source = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY";
        let body = "Server returned non-2xx status code: 403 Forbidden: <Error><Code>SignatureDoesNotMatch</Code>\n\
                    <StringToSign>AWS4-HMAC-SHA256\n20261206T000000Z</StringToSign></Error>";
        let RemoteError::Refused(line) = RemoteError::from_store("ab", source, generic(body)) else { panic!() };
        assert_eq!(
            line,
            "the object store refused the credentials of AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY \
             (SignatureDoesNotMatch): check them and the bucket's policy"
        );
        let head = object_store::Error::PermissionDenied { path: "k".into(), source: "403 Forbidden".into() };
        assert!(
            matches!(RemoteError::from_store("ab", source, head), RemoteError::Refused(l) if l.contains("(403 Forbidden)"))
        );
        for code in ["InvalidAccessKeyId", "ExpiredToken", "AccessDenied"] {
            let e = RemoteError::from_store("ab", source, generic(&format!("<Code>{code}</Code>")));
            assert!(matches!(&e, RemoteError::Refused(l) if l.contains(code)), "{e:?}");
        }
        let down = RemoteError::from_store("ab", source, generic("connection refused\nretried"));
        assert!(matches!(&down, RemoteError::Unavailable(l) if !l.contains('\n')), "{down:?}");
        let missing = object_store::Error::NotFound { path: "k".into(), source: "404".into() };
        assert!(matches!(RemoteError::from_store("ab", source, missing), RemoteError::NotFound(s) if s == "ab"));
    }

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
        use object_store::client::HttpError;
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
        fake::answering("s3://stalled", 1, || {
            Ok(http::Response::builder()
                .status(206)
                .header("content-length", "10")
                .header("content-range", "bytes 0-9/10")
                .header("last-modified", "Thu, 01 Jan 1970 00:00:00 GMT")
                .header("etag", "\"stalled\"")
                .body(object_store::client::HttpResponseBody::new(FourBytesThenNothing(false)))
                .unwrap())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_mid_way_fails_after_the_idle_timeout_and_frees_its_place() {
        let remote = stalling_mid_body();
        let file = Arc::new(tempfile::tempfile().unwrap());
        let started = tokio::time::Instant::now();
        let error = remote.fetch_into(SHA, 0..10, file.clone(), None).await.unwrap_err();
        assert!(matches!(&error, RemoteError::Unavailable(why) if why.contains("GET body")), "{error}");
        assert!(started.elapsed() >= remote.timeouts.idle, "not before the timeout");
        assert!(started.elapsed() < remote.timeouts.first_byte + remote.timeouts.idle * 2, "bounded by idleness");
        assert_eq!(remote.fetches.available_permits(), 1, "the fetch's place is free again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fetch_waits_for_a_place_at_most_the_first_byte_timeout() {
        let remote = fake::never_asked();
        let taken = remote.fetches.clone().acquire_many_owned(remote.max_fetches as u32).await.unwrap();
        let file = Arc::new(tempfile::tempfile().unwrap());
        let started = tokio::time::Instant::now();
        let error = remote.fetch_into(SHA, 0..10, file, None).await.unwrap_err();
        assert!(matches!(&error, RemoteError::Unavailable(why) if why.contains("max_fetches")), "{error}");
        assert!(started.elapsed() >= remote.timeouts.first_byte, "it waited for a place first");
        assert_eq!(remote.breaker_state(), BreakerState::Closed, "no store call was made");
        drop(taken);
    }
}
