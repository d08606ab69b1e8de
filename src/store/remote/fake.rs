//! An object store in memory for unit tests of what sits on [`RemoteFetch`]: blobs by name (forged copies
//! included), every fetch logged with its range, and faults scripted per fetch: refuse, write part of the range
//! and fail or claim success, hold on a [`Gate`] the test opens (a slow, stalled or hung store).
//!
//! Each blob `put` gets a slice manifest sealed with the fake's own key ([`FakeRemote::manifest_key`]), of
//! [`CHUNK`]-byte chunks; a forged copy keeps the manifest of the bytes it replaced, as a store whose objects were
//! changed but not the manifests (which the attacker cannot seal).
//!
//! Fetches are numbered from 1 in the order they start. A fetch runs the script set for its number, else the next
//! one set for its range, else the one set for every fetch, else none: it writes its whole range.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::{ChunkCheck, Fetched, RemoteBlobs, RemoteError, RemoteFetch};
use crate::store::manifest::{ChunkHasher, ManifestKey, SliceManifest};
use crate::store::sealing::SecretsKey;

/// The chunk the fake's manifests digest: a unit test's slice (1 KiB) holds four.
pub const CHUNK: u64 = 256;

/// One step of a fetch's script. Once the steps run out, the rest of the range is written and the fetch succeeds.
#[derive(Debug, Clone)]
pub enum Step {
    /// Write the next bytes of the range (fewer if the range ends first).
    Write(u64),
    /// Wait until the gate is open.
    Hold(Gate),
    /// Fail now, as a store that refuses or a connection cut mid-body.
    Fail,
    /// Succeed now, reporting only the bytes written so far: a client that misses a short body.
    Lie,
    /// Panic, as a bug in a fill would.
    Panic,
}

/// Opened once by the test; every fetch holding on it then goes on.
#[derive(Debug, Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Self(Arc::new(watch::channel(false).0))
    }
}

impl Gate {
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    /// Whether the gate opened within an hour: on a test's paused clock, that hour passes at once when nothing
    /// else can run, so a test that forgot to open it fails instead of hanging.
    async fn passed(&self) -> bool {
        let mut rx = self.0.subscribe();
        let opened = rx.wait_for(|open| *open);
        tokio::time::timeout(Duration::from_secs(3600), opened).await.is_ok()
    }
}

#[derive(Debug)]
pub struct FakeRemote {
    state: Mutex<State>,
    /// How many fetches have started: what a test waits on to know a fetch is in flight.
    started: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    blobs: HashMap<String, Arc<[u8]>>,
    scripts: HashMap<u64, Vec<Step>>,
    /// Scripts by (blob, range), each for one fetch, in the order set.
    by_range: Vec<(String, Range<u64>, Vec<Step>)>,
    every: Option<Vec<Step>>,
    /// Every fetch started, in order: (blob, range).
    log: Vec<(String, Range<u64>)>,
    /// Sealed manifests by blob.
    manifests: HashMap<String, Vec<u8>>,
    /// Each blob's store copy's version, bumped by every put.
    versions: HashMap<String, u64>,
    manifest_fetches: usize,
    version_asks: usize,
    in_flight: usize,
    most_in_flight: usize,
}

impl FakeRemote {
    pub fn new() -> Arc<Self> {
        Arc::new(Self { state: Mutex::default(), started: watch::channel(0).0 })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The key the fake's manifests are sealed with: the cache's.
    pub fn manifest_key() -> ManifestKey {
        ManifestKey::derive(&SecretsKey::from_bytes([7; 32]))
    }

    /// Stores `bytes` under their SHA-256, which it returns, with their sealed slice manifest.
    pub fn put(&self, bytes: &[u8]) -> String {
        let sha = self.put_without_manifest(bytes);
        let mut hasher = ChunkHasher::new(CHUNK);
        hasher.update(bytes);
        let manifest = SliceManifest::new(bytes.len() as u64, CHUNK, hasher.finish()).unwrap();
        self.lock().manifests.insert(sha.clone(), manifest.seal(&Self::manifest_key(), &sha));
        sha
    }

    /// Stores `bytes` under their SHA-256 without a manifest (a blob stored before manifests).
    pub fn put_without_manifest(&self, bytes: &[u8]) -> String {
        let sha = hex::encode(Sha256::digest(bytes));
        self.lock().manifests.remove(&sha);
        self.put_as(&sha, bytes);
        sha
    }

    /// Stores `bytes` under `sha256`, whatever they hash to, leaving its manifest as it is: a forged or rotten copy.
    pub fn put_as(&self, sha256: &str, bytes: &[u8]) {
        let mut state = self.lock();
        state.blobs.insert(sha256.to_owned(), Arc::from(bytes));
        *state.versions.entry(sha256.to_owned()).or_default() += 1;
    }

    /// Replaces the manifest of `sha256` with one of `bytes` sealed with another key: a forged manifest.
    pub fn forge_manifest(&self, sha256: &str, bytes: &[u8]) {
        let mut hasher = ChunkHasher::new(CHUNK);
        hasher.update(bytes);
        let manifest = SliceManifest::new(bytes.len() as u64, CHUNK, hasher.finish()).unwrap();
        let forged = manifest.seal(&ManifestKey::derive(&SecretsKey::from_bytes([8; 32])), sha256);
        self.lock().manifests.insert(sha256.to_owned(), forged);
    }

    /// How many manifests were fetched, and how many times a version was asked for.
    pub fn manifest_and_version_asks(&self) -> (usize, usize) {
        let state = self.lock();
        (state.manifest_fetches, state.version_asks)
    }

    /// Runs `steps` as the `n`th fetch (from 1).
    pub fn script(&self, n: u64, steps: Vec<Step>) {
        self.lock().scripts.insert(n, steps);
    }

    /// Runs `steps` as the next fetch of `range` of `sha256` (that has no script by number).
    pub fn script_for(&self, sha256: &str, range: Range<u64>, steps: Vec<Step>) {
        self.lock().by_range.push((sha256.to_owned(), range, steps));
    }

    /// Runs `steps` as every fetch that has no script of its own (`None`: a sound store again).
    pub fn script_every(&self, steps: Option<Vec<Step>>) {
        self.lock().every = steps;
    }

    /// The `n`th fetch fails without writing.
    pub fn fail(&self, n: u64) {
        self.script(n, vec![Step::Fail]);
    }

    /// The `n`th fetch waits, before writing, until the returned gate is opened.
    pub fn hold(&self, n: u64) -> Gate {
        let gate = Gate::default();
        self.script(n, vec![Step::Hold(gate.clone())]);
        gate
    }

    /// Every fetch from now on fails (`false`: none does).
    pub fn set_down(&self, down: bool) {
        self.script_every(down.then(|| vec![Step::Fail]));
    }

    /// Waits until `n` fetches have started; panics after an hour (at once on a paused clock with nothing to run).
    pub async fn started(&self, n: u64) {
        let mut rx = self.started.subscribe();
        let started = tokio::time::timeout(Duration::from_secs(3600), rx.wait_for(|started| *started >= n)).await;
        assert!(started.is_ok(), "fake: {} fetches started, not {n}", self.fetch_count());
    }

    /// Every fetch started so far, in order: (blob, range).
    pub fn fetches(&self) -> Vec<(String, Range<u64>)> {
        self.lock().log.clone()
    }

    /// How many fetches have started.
    pub fn fetch_count(&self) -> usize {
        self.lock().log.len()
    }

    /// How many fetches of exactly this range of `sha256` have started.
    pub fn fetches_of(&self, sha256: &str, range: Range<u64>) -> usize {
        self.lock().log.iter().filter(|(sha, r)| sha == sha256 && *r == range).count()
    }

    /// The most fetches that were in flight at once.
    pub fn most_in_flight(&self) -> usize {
        self.lock().most_in_flight
    }

    async fn run(
        &self,
        sha256: &str,
        range: Range<u64>,
        file: Arc<File>,
        check: Option<ChunkCheck>,
        hasher: &mut Option<ChunkHasher>,
    ) -> Result<u64, RemoteError> {
        let (bytes, steps, n) = {
            let mut state = self.lock();
            state.log.push((sha256.to_owned(), range.clone()));
            let n = state.log.len() as u64;
            let by_range = state.by_range.iter().position(|(sha, r, _)| sha == sha256 && *r == range);
            let steps = match state.scripts.remove(&n) {
                Some(steps) => steps,
                None => match by_range {
                    Some(i) => state.by_range.remove(i).2,
                    None => state.every.clone().unwrap_or_default(),
                },
            };
            (state.blobs.get(sha256).cloned(), steps, n)
        };
        self.started.send_modify(|started| *started += 1);
        let Some(bytes) = bytes else { return Err(RemoteError::NotFound(sha256.to_owned())) };
        let end = range.end.min(bytes.len() as u64);
        let mut at = range.start;
        let mut write = |at: &mut u64, upto: u64| -> Result<(), RemoteError> {
            let upto = upto.min(end);
            if upto > *at {
                let written = &bytes[*at as usize..upto as usize];
                file.write_all_at(written, *at)?;
                if let Some(hasher) = hasher.as_mut() {
                    hasher.update(written);
                    if upto == range.end {
                        hasher.end();
                    }
                    if let Some(check) = &check
                        && !check.report(range.start, hasher)
                    {
                        return Err(RemoteError::Unavailable(format!("fake: {sha256}: a chunk was refused")));
                    }
                }
                *at = upto;
            }
            Ok(())
        };
        for step in steps {
            match step {
                Step::Write(len) => {
                    let upto = at + len;
                    write(&mut at, upto)?
                }
                Step::Panic => panic!("fake: fetch {n} panics"),
                Step::Hold(gate) => {
                    if !gate.passed().await {
                        return Err(RemoteError::Unavailable(format!("fake: fetch {n} held, its gate never opened")));
                    }
                }
                Step::Fail => {
                    return Err(RemoteError::Unavailable(format!("fake: fetch of {sha256} {range:?} failed")));
                }
                Step::Lie => return Ok(at - range.start),
            }
        }
        write(&mut at, end)?;
        if at != range.end {
            return Err(RemoteError::Unavailable(format!(
                "blob {sha256}: the store sent {} of {} bytes asked",
                at - range.start,
                range.end - range.start
            )));
        }
        Ok(at - range.start)
    }
}

impl RemoteFetch for FakeRemote {
    fn fetch_into<'a>(
        &'a self,
        sha256: &'a str,
        range: Range<u64>,
        file: Arc<File>,
        check: Option<ChunkCheck>,
    ) -> BoxFuture<'a, Result<Fetched, RemoteError>> {
        Box::pin(async move {
            {
                let mut state = self.lock();
                state.in_flight += 1;
                state.most_in_flight = state.most_in_flight.max(state.in_flight);
            }
            // Counted out however the fetch ends, dropped (a cancelled fill) included.
            let _in_flight = InFlight(self);
            let mut hasher = check.as_ref().map(|c| ChunkHasher::new(c.chunk_bytes));
            let written = self.run(sha256, range, file, check, &mut hasher).await?;
            Ok(Fetched { written, digests: hasher.map(ChunkHasher::finish).unwrap_or_default() })
        })
    }

    fn manifest<'a>(&'a self, sha256: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, RemoteError>> {
        Box::pin(async move {
            let mut state = self.lock();
            state.manifest_fetches += 1;
            if state.every.as_ref().is_some_and(|steps| matches!(steps.first(), Some(Step::Fail))) {
                return Err(RemoteError::Unavailable("fake: the store is down".into()));
            }
            Ok(state.manifests.get(sha256).cloned())
        })
    }

    fn version<'a>(&'a self, sha256: &'a str) -> BoxFuture<'a, Result<Option<String>, RemoteError>> {
        Box::pin(async move {
            let mut state = self.lock();
            state.version_asks += 1;
            Ok(state.versions.get(sha256).map(|v| format!("v{v}")))
        })
    }
}

struct InFlight<'a>(&'a FakeRemote);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.lock().in_flight -= 1;
    }
}

/// A client of a store that is never asked, for a cache whose fills go to a [`FakeRemote`]: every request is refused
/// before it is sent. Made without an HTTP client, whose TLS roots take ~0.1 s to load in a debug build.
pub fn never_asked() -> RemoteBlobs {
    use object_store::client::HttpErrorKind;
    let defaults = crate::config::BlobStoreSettings::default();
    answering("s3://unused (never asked)", defaults.max_fetches, || {
        let refused = std::io::Error::other("a test's client of a store that is never asked");
        Err(object_store::client::HttpError::new(HttpErrorKind::Connect, refused))
    })
}

/// A client (with `blob_store`'s default timeouts and breaker) of a store whose every answer is `answer()`.
pub fn answering(location: &str, max_fetches: usize, answer: CannedAnswer) -> RemoteBlobs {
    use object_store::RetryConfig;
    use object_store::aws::AmazonS3Builder;
    let store = AmazonS3Builder::new()
        .with_bucket_name("unused")
        .with_region("us-east-1")
        .with_endpoint("http://127.0.0.1:9")
        .with_allow_http(true)
        .with_skip_signature(true)
        .with_retry(RetryConfig { max_retries: 0, ..RetryConfig::default() })
        .with_http_connector(Canned(answer))
        .build()
        .unwrap();
    let defaults = crate::config::BlobStoreSettings::default();
    let unsigned = "blob_store.anonymous (unsigned requests)";
    RemoteBlobs::with_client(store, "", location.into(), defaults.timeouts, defaults.breaker, max_fetches, unsigned)
}

type CannedAnswer = fn() -> Result<object_store::client::HttpResponse, object_store::client::HttpError>;

/// An HTTP client that answers without a network.
#[derive(Debug, Clone, Copy)]
struct Canned(CannedAnswer);

impl object_store::client::HttpConnector for Canned {
    fn connect(&self, _: &object_store::ClientOptions) -> object_store::Result<object_store::client::HttpClient> {
        Ok(object_store::client::HttpClient::new(*self))
    }
}

// `HttpService` is an `async_trait`: its method, as the macro writes it.
impl object_store::client::HttpService for Canned {
    fn call<'life0, 'async_trait>(
        &'life0 self,
        _: object_store::client::HttpRequest,
    ) -> std::pin::Pin<
        Box<
            dyn Future<Output = Result<object_store::client::HttpResponse, object_store::client::HttpError>>
                + Send
                + 'async_trait,
        >,
    >
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(std::future::ready((self.0)()))
    }
}
