//! The data dir's cache of an object store's blobs: `cache/ab/cd/<sha256>.<id>`, one sparse file per blob, filled
//! slice by slice (`cache.slice_bytes`, aligned from offset 0) and sent from by sendfile like any blob file.
//!
//! **What is cached.** A blob's entry knows which of its slices the file holds. A read asks for the slices that
//! cover its regions and no others, so a cold 1 MiB range of a large blob fetches one or two slices. Each slice is
//! fetched by one task on the object store's runtime, whoever else wants it meanwhile (single-flight across the
//! data workers); waiters are woken by a watch channel, and the event loop never waits on the store. A HEAD, or a
//! read of nothing, makes no entry and holds no file.
//!
//! **Sending while filling.** A response's body carries a [`FillGate`]: the driver sends only what has arrived,
//! and waits for the rest, which the gate fetches a few slices ahead of the reader.
//!
//! **Integrity.** A slice is booked (readable) only once it is checked against what was uploaded: the digests of
//! its chunks, hashed as they arrived, against the blob's sealed slice manifest (`store::manifest`), fetched once
//! per entry. A blob stored without a manifest (before manifests, and not yet through `blobs migrate`) is fetched
//! whole and hashed to its name before any of it is booked. A store copy that fails either check is quarantined:
//! its entry dropped, logged once, counted, every read refused (a `503`) without a fetch, until its store copy
//! changes (a HEAD at most every `cache.quarantine_recheck`). A fill that fails or panics releases its slice, and the
//! next read fetches it again.
//!
//! **Eviction.** Beyond `cache.max_bytes`, least recently used entries go whole. An entry a response is sending
//! from (its file shared beyond the cache) or that is being filled is never evicted. A blob larger than half the
//! cache streams through: the slices behind its readers are released (their holes punched) as they are sent, so
//! the bound holds up to the slices in flight and a reader's few slices. Files get a new random id per entry, so
//! an evicted entry's file, unlinked later on the blocking pool, is never a newer entry's.
//!
//! **Restarts.** A blob whose every slice arrived (and was checked) is fsynced and renamed `<sha256>.<id>.c`; at
//! start-up those are adopted (oldest first, within the bound) and anything else in `cache/` is removed.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use tokio::sync::{OnceCell, watch};

use super::manifest::{ChunkDigest, ManifestKey, SliceManifest};
use super::remote::{ChunkCheck, RemoteBlobs, RemoteError, RemoteFetch};
use crate::file_body::FillGate;

/// Slices fetched ahead of a reader that is sending from a filling file.
const READAHEAD_SLICES: u64 = 2;
/// Suffix of a cache file that holds its whole blob.
const COMPLETE_SUFFIX: &str = ".c";
/// How often a quarantined blob's store copy is asked whether it changed, by default (one HEAD, prompted by a read).
pub const DEFAULT_QUARANTINE_RECHECK: Duration = Duration::from_secs(30);
/// Entries whose file stays open by default; older ones are closed (and reopened by path when read again).
pub const DEFAULT_MAX_OPEN_FILES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The blob is not cached (enough) and the store cannot give it now: `503` with `Retry-After`.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("cache: {0}")]
    Local(#[from] io::Error),
}

/// One slice fetch as its waiters see it: how much of the slice has arrived and been checked (from its start),
/// then its outcome.
#[derive(Debug, Clone, Default)]
struct FillResult {
    checked: u64,
    outcome: Option<Result<(), Arc<str>>>,
}

impl FillResult {
    fn done(&self) -> bool {
        self.outcome.is_some()
    }
}

/// What `/metrics` shows of the cache.
#[derive(Debug, Default)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub bytes: AtomicU64,
    /// Store copies that failed their check (a slice against its manifest, a manifest's seal, a whole blob against
    /// its name): each quarantined blob once.
    pub corrupt: AtomicU64,
    /// Blobs quarantined now.
    pub quarantined: AtomicU64,
}

/// How the slices of an entry are checked before they are booked.
#[derive(Debug, Clone)]
enum Verification {
    /// Each slice against the blob's slice manifest, as it arrives.
    Slices(Arc<SliceManifest>),
    /// No manifest (or one of chunks that do not divide a slice): the whole blob against its name, before any of
    /// it is booked.
    Whole,
}

/// The slice a fill task fetches, and where it tells its waiters how far it got.
struct FillSlot {
    sha: String,
    id: u64,
    size: u64,
    slice: u64,
    range: Range<u64>,
    tx: Arc<watch::Sender<FillResult>>,
}

/// Checks a slice's chunks as they arrive against the blob's manifest, once it is known (chunks that come first
/// wait here), and tells the slice's waiters how far the checked bytes reach.
struct SliceChecker {
    cache: Arc<Inner>,
    sha: String,
    id: u64,
    slice: u64,
    start: u64,
    len: u64,
    tx: Arc<watch::Sender<FillResult>>,
    state: Mutex<CheckerState>,
}

#[derive(Default)]
struct CheckerState {
    manifest: Option<Arc<SliceManifest>>,
    /// Chunks that arrived before the manifest: (offset, digest).
    waiting: Vec<(u64, ChunkDigest)>,
    mismatch: Option<String>,
}

impl SliceChecker {
    fn lock(&self) -> MutexGuard<'_, CheckerState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A chunk is in the file; false stops the fetch (it does not match).
    fn on_chunk(&self, chunk_start: u64, digest: &ChunkDigest) -> bool {
        let mut state = self.lock();
        match state.manifest.clone() {
            None => {
                state.waiting.push((chunk_start, *digest));
                true
            }
            Some(manifest) => self.check(&mut state, &manifest, chunk_start, digest),
        }
    }

    /// The manifest is known: the chunks that waited for it are checked.
    fn learn(&self, manifest: Arc<SliceManifest>) {
        let mut state = self.lock();
        let waiting = std::mem::take(&mut state.waiting);
        state.manifest = Some(manifest.clone());
        for (chunk_start, digest) in waiting {
            if !self.check(&mut state, &manifest, chunk_start, &digest) {
                break;
            }
        }
    }

    fn check(
        &self,
        state: &mut CheckerState,
        manifest: &SliceManifest,
        chunk_start: u64,
        digest: &ChunkDigest,
    ) -> bool {
        if state.mismatch.is_some() {
            return false;
        }
        if let Err(e) = manifest.check(chunk_start, std::slice::from_ref(digest)) {
            state.mismatch = Some(e.to_string());
            return false;
        }
        let checked = (chunk_start + manifest.chunk_bytes()).min(self.start + self.len) - self.start;
        if let Some(entry) = self.cache.lock().entries.get_mut(&self.sha).filter(|e| e.id == self.id) {
            entry.checked.insert(self.slice, checked);
        }
        self.tx.send_modify(|fill| fill.checked = checked);
        true
    }

    fn mismatch(&self) -> Option<String> {
        self.lock().mismatch.clone()
    }
}

/// Why a fill failed.
#[derive(Debug)]
enum FillFailure {
    /// The store, or the cache file: the next read tries again.
    Failed(String),
    /// The store's copy is not what was uploaded: the blob is quarantined.
    Corrupt(String),
}

#[derive(Debug, Clone)]
pub struct BlobCache(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    max_bytes: u64,
    slice_bytes: u64,
    /// Entries whose file stays open; older ones are closed (and reopened by path when read again).
    max_open_files: std::sync::atomic::AtomicUsize,
    /// How often a read of a quarantined blob asks the store whether its copy changed.
    quarantine_recheck: Mutex<Duration>,
    /// The server's cache (`cache/`), kept across restarts; else a CLI command's, removed when it ends.
    owner: bool,
    /// The store's client, for what others do with it (`BlobCache::remote`).
    remote: RemoteBlobs,
    /// Where fills fetch from: `remote`, or a unit test's fake.
    fetch: Arc<dyn RemoteFetch>,
    /// Opens slice manifests; without it every blob is checked whole.
    manifest_key: Option<Arc<ManifestKey>>,
    /// The chunk a fill hashes by before its blob's manifest is known (the one uploads write).
    manifest_chunk: u64,
    /// What a response that sends nothing from its blob (a HEAD) is given: `/dev/null`, opened once.
    nothing: Arc<File>,
    runtime: tokio::runtime::Handle,
    state: Mutex<State>,
    counters: CacheCounters,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Recency: the tick of each entry's last use → its hash.
    lru: BTreeMap<u64, String>,
    tick: u64,
    /// Bytes of slices present, plus those being fetched.
    bytes: u64,
    open_files: usize,
    quarantined: HashMap<String, Quarantine>,
}

/// A blob whose store copy failed its check.
#[derive(Debug)]
struct Quarantine {
    /// The store copy's version when it failed (`None` until a HEAD said).
    version: Option<String>,
    checked: tokio::time::Instant,
    checking: bool,
    why: String,
}

#[derive(Debug)]
struct Entry {
    size: u64,
    /// This entry's file: `<sha>.<id>` while it fills, `<sha>.<id>.c` once whole.
    path: PathBuf,
    id: u64,
    file: Option<Arc<File>>,
    present: Vec<u64>,
    missing_slices: u64,
    filling: HashMap<u64, watch::Receiver<FillResult>>,
    /// Of slices being fetched, the bytes from their start that have arrived and been checked: sent from before the
    /// whole slice is there.
    checked: HashMap<u64, u64>,
    /// Bytes of the slices present.
    bytes: u64,
    tick: u64,
    /// How its slices are checked: found out by its first fill (its manifest fetched once).
    verification: Arc<OnceCell<Verification>>,
    /// Without a manifest: the fill of the whole blob, in flight.
    whole_fill: Option<watch::Receiver<FillResult>>,
}

impl Entry {
    fn new(size: u64, path: PathBuf, id: u64, file: Option<Arc<File>>, slice_bytes: u64) -> Self {
        let slices = size.div_ceil(slice_bytes);
        Entry {
            size,
            path,
            id,
            file,
            present: vec![0; slices.div_ceil(64) as usize],
            missing_slices: slices,
            filling: HashMap::new(),
            checked: HashMap::new(),
            bytes: 0,
            tick: 0,
            verification: Arc::default(),
            whole_fill: None,
        }
    }

    /// An entry whose file holds the whole blob, checked (adopted at start-up, or an upload's staged file).
    fn whole(size: u64, path: PathBuf, id: u64, slice_bytes: u64) -> Self {
        let mut entry = Entry::new(size, path, id, None, slice_bytes);
        (0..size.div_ceil(slice_bytes)).for_each(|s| entry.set(s));
        entry.missing_slices = 0;
        entry.bytes = size;
        entry
    }

    fn has(&self, slice: u64) -> bool {
        self.present[(slice / 64) as usize] & (1 << (slice % 64)) != 0
    }

    fn set(&mut self, slice: u64) {
        self.present[(slice / 64) as usize] |= 1 << (slice % 64);
    }

    fn clear(&mut self, slice: u64) {
        self.present[(slice / 64) as usize] &= !(1 << (slice % 64));
    }

    /// A response or a fill holds the file: evicting the entry would take bytes from under it.
    fn in_use(&self) -> bool {
        !self.filling.is_empty()
            || self.whole_fill.is_some()
            || self.file.as_ref().is_some_and(|f| Arc::strong_count(f) > 1)
    }
}

/// A cached blob's file, opened for a response, with what it needs to send while slices arrive.
#[derive(Debug)]
pub struct CachedBlob {
    pub file: Arc<File>,
    pub size: u64,
    /// What the driver asks before each send; `None` when every region asked for was cached when the request came
    /// (or there was none).
    pub gate: Option<Arc<CacheGate>>,
}

impl BlobCache {
    /// The cache in `<data_dir>/cache`. A server's (`owner`) adopts the whole blobs a previous run left and removes
    /// the rest; anyone else's (a CLI command beside a server) starts empty, in a directory of its own, and keeps
    /// nothing: it must not touch the server's files.
    pub async fn open(
        data_dir: &Path,
        max_bytes: u64,
        slice_bytes: u64,
        remote: RemoteBlobs,
        owner: bool,
    ) -> anyhow::Result<Self> {
        let fetch = Arc::new(remote.clone());
        let key = remote.manifest_key().cloned();
        let manifests = (key, super::manifest::CHUNK_BYTES);
        Self::open_with(data_dir, max_bytes, slice_bytes, remote, fetch, manifests, owner).await
    }

    /// [`BlobCache::open`], its fills fetching from `fetch` and opening manifests with `manifest_key`.
    async fn open_with(
        data_dir: &Path,
        max_bytes: u64,
        slice_bytes: u64,
        remote: RemoteBlobs,
        fetch: Arc<dyn RemoteFetch>,
        (manifest_key, manifest_chunk): (Option<ManifestKey>, u64),
        owner: bool,
    ) -> anyhow::Result<Self> {
        let dir = if owner {
            data_dir.join("cache")
        } else {
            // Named as a staging file is: if the command is killed, the server's sweep removes it.
            data_dir.join("tmp").join(super::blobs::new_stage_name())
        };
        let scan_dir = dir.clone();
        let adopted = if owner {
            tokio::task::spawn_blocking(move || adopt_complete_files(&scan_dir)).await??
        } else {
            Vec::new()
        };
        let nothing = Arc::new(File::open("/dev/null")?);
        let inner = Inner {
            dir,
            max_bytes,
            slice_bytes,
            max_open_files: DEFAULT_MAX_OPEN_FILES.into(),
            quarantine_recheck: Mutex::new(DEFAULT_QUARANTINE_RECHECK),
            owner,
            remote,
            fetch,
            manifest_key: manifest_key.map(Arc::new),
            manifest_chunk,
            nothing,
            runtime: tokio::runtime::Handle::current(),
            state: Mutex::new(State::default()),
            counters: CacheCounters::default(),
        };
        let cache = Self(Arc::new(inner));
        if !owner {
            return Ok(cache);
        }
        let evicted = {
            let mut state = cache.0.lock();
            for (sha, path, size) in adopted {
                let id = id_of(&path);
                state.bytes += size;
                state.insert(sha, Entry::whole(size, path, id, slice_bytes));
            }
            cache.0.evict(&mut state)
        };
        cache.0.unlink_later(evicted);
        cache.0.publish_bytes();
        Ok(cache)
    }

    /// At most `max_open_files` entries keep their file open (`cache.max_open_files`); responses sending from
    /// others hold theirs meanwhile.
    pub fn with_max_open_files(self, max_open_files: usize) -> Self {
        self.0.max_open_files.store(max_open_files.max(1), Ordering::Relaxed);
        self
    }

    /// A read of a quarantined blob asks the store whether its copy changed at most this often.
    pub fn with_quarantine_recheck(self, every: Duration) -> Self {
        *self.0.quarantine_recheck.lock().unwrap_or_else(|p| p.into_inner()) = every;
        self
    }

    pub fn remote(&self) -> &RemoteBlobs {
        &self.0.remote
    }

    pub fn counters(&self) -> &CacheCounters {
        &self.0.counters
    }

    pub fn slice_bytes(&self) -> u64 {
        self.0.slice_bytes
    }

    /// Opens the cached blob `sha256` of `size` bytes for a response that will send `regions` (offset, length),
    /// after fetching (and checking) the slice of the first region's first byte (so a store that is down is a
    /// `503`, not a truncated `200`); the rest arrives while the body is sent, through the returned gate. A
    /// response that sends nothing (a HEAD) makes no entry and fetches nothing.
    pub async fn open_for(&self, sha256: &str, size: u64, regions: &[(u64, u64)]) -> Result<CachedBlob, CacheError> {
        let Some(&(offset, _)) = regions.iter().find(|(_, len)| *len > 0) else {
            return Ok(CachedBlob { file: self.0.nothing.clone(), size, gate: None });
        };
        if let Some(why) = self.0.quarantined(sha256) {
            return Err(RemoteError::Unavailable(why).into());
        }
        let (file, id) = self.0.entry_file(sha256, size).await?;
        let gate = Arc::new(CacheGate { cache: self.0.clone(), sha256: sha256.to_owned(), id, file: file.clone() });
        let hit = {
            let state = self.0.lock();
            let entry = state.entries.get(sha256).filter(|e| e.id == id);
            entry.is_some_and(|e| {
                regions.iter().filter(|(_, len)| *len > 0).all(|&(offset, len)| {
                    let (first, last) = (offset / self.0.slice_bytes, (offset + len - 1) / self.0.slice_bytes);
                    (first..=last).all(|s| e.has(s))
                })
            })
        };
        let counter = if hit { &self.0.counters.hits } else { &self.0.counters.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        gate.wait_at(offset).await.map_err(|e| RemoteError::Unavailable(e.to_string()))?;
        // A blob too large to keep streams through: its reader needs the gate to release what it has sent.
        let streams = size > self.0.max_bytes / 2;
        Ok(CachedBlob { file, size, gate: (!hit || streams).then_some(gate) })
    }

    /// Reads `len` bytes from `offset` into the cache, each slice checked, and returns the file holding them (a
    /// server-side copy's source). The caller reads them while it holds the file.
    pub async fn fill_range(&self, sha256: &str, size: u64, offset: u64, len: u64) -> Result<Arc<File>, CacheError> {
        let blob = self.open_for(sha256, size, &[(offset, len)]).await?;
        let Some(gate) = blob.gate else { return Ok(blob.file) };
        if len > 0 {
            let (first, last) = (offset / self.0.slice_bytes, (offset + len - 1) / self.0.slice_bytes);
            for slice in first..=last {
                gate.wait_slice(slice).await.map_err(|e| RemoteError::Unavailable(e.to_string()))?;
            }
        }
        Ok(blob.file)
    }

    /// Makes a blob just uploaded from `source` (a staged file in the data dir) a whole cache entry, so the first
    /// read of a fresh upload fetches nothing; the LRU's oldest entries make room for it. The file is hard-linked,
    /// so the caller's staged copy is untouched. A blob larger than half the cache is not kept: it would stream
    /// through a read anyway.
    pub async fn adopt(&self, sha256: &str, size: u64, source: PathBuf) {
        if !self.0.owner || self.0.lock().entries.contains_key(sha256) || size > self.0.max_bytes / 2 {
            return;
        }
        let id = random_id();
        let target = self.0.path_for(sha256, id, true);
        let linked = tokio::task::spawn_blocking({
            let target = target.clone();
            move || -> io::Result<()> {
                fs::create_dir_all(target.parent().expect("cache paths have a parent"))?;
                fs::hard_link(&source, &target)
            }
        })
        .await;
        if !matches!(linked, Ok(Ok(()))) {
            return;
        }
        let evicted = {
            let mut state = self.0.lock();
            if state.entries.contains_key(sha256) {
                drop(state);
                self.0.unlink_later(vec![target]);
                return;
            }
            state.bytes += size;
            state.insert(sha256.to_owned(), Entry::whole(size, target, id, self.0.slice_bytes));
            // A blob uploaded again replaces a quarantined store copy.
            if state.quarantined.remove(sha256).is_some() {
                self.0.counters.quarantined.store(state.quarantined.len() as u64, Ordering::Relaxed);
            }
            self.0.evict(&mut state)
        };
        self.0.unlink_later(evicted);
        self.0.publish_bytes();
    }

    /// Drops a blob from the cache (its last reference is gone); a response sending from it keeps its file.
    pub fn forget(&self, sha256: &str) {
        let path = {
            let mut state = self.0.lock();
            match state.entries.get(sha256) {
                Some(e) if !e.in_use() => state.remove(sha256).map(|e| e.path),
                _ => None,
            }
        };
        self.0.unlink_later(path.into_iter().collect());
        self.0.publish_bytes();
    }

    /// Whether the whole blob is in the cache (tests, and what `/metrics` cannot say per blob).
    pub fn holds_whole(&self, sha256: &str) -> bool {
        self.0.lock().entries.get(sha256).is_some_and(|e| e.missing_slices == 0)
    }

    /// Lifts a quarantine: the blob was uploaded again, so the next read fetches and checks the new copy.
    pub fn lift_quarantine(&self, sha256: &str) {
        let mut state = self.0.lock();
        if state.quarantined.remove(sha256).is_some() {
            self.0.counters.quarantined.store(state.quarantined.len() as u64, Ordering::Relaxed);
            tracing::info!(sha256, "a quarantined blob was uploaded again; it will be fetched and checked again");
        }
    }

    /// Whether the blob's store copy failed its check and is refused until it changes.
    pub fn is_quarantined(&self, sha256: &str) -> bool {
        self.0.lock().quarantined.contains_key(sha256)
    }

    /// Entries, and entries whose file is open (tests and `/metrics`).
    pub fn entry_counts(&self) -> (usize, usize) {
        let state = self.0.lock();
        (state.entries.len(), state.open_files)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.owner {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn path_for(&self, sha256: &str, id: u64, complete: bool) -> PathBuf {
        let suffix = if complete { COMPLETE_SUFFIX } else { "" };
        self.dir.join(&sha256[0..2]).join(&sha256[2..4]).join(format!("{sha256}.{id:016x}{suffix}"))
    }

    fn publish_bytes(&self) {
        let bytes = self.lock().bytes;
        self.counters.bytes.store(bytes, Ordering::Relaxed);
    }

    /// Why `sha256` is refused, if it is quarantined; a read past [`QUARANTINE_RECHECK`] since the last look asks
    /// the store (in the background) whether its copy changed.
    fn quarantined(self: &Arc<Self>, sha256: &str) -> Option<String> {
        let mut state = self.lock();
        let quarantine = state.quarantined.get_mut(sha256)?;
        let why = format!("blob {sha256} is quarantined: {}", quarantine.why);
        let now = tokio::time::Instant::now();
        let every = *self.quarantine_recheck.lock().unwrap_or_else(|p| p.into_inner());
        if !quarantine.checking && now.duration_since(quarantine.checked) >= every {
            quarantine.checking = true;
            quarantine.checked = now;
            self.check_quarantine(sha256);
        }
        Some(why)
    }

    /// Asks the store for the version of a quarantined blob's copy: the first answer is the rotten copy's; a later
    /// different one (the blob was uploaded again, or repaired) lifts the quarantine, and the next read fetches and
    /// checks again.
    fn check_quarantine(self: &Arc<Self>, sha256: &str) {
        let (cache, sha) = (self.clone(), sha256.to_owned());
        self.runtime.spawn(async move {
            let version = cache.fetch.version(&sha).await;
            let mut state = cache.lock();
            let Some(quarantine) = state.quarantined.get_mut(&sha) else { return };
            quarantine.checking = false;
            let Ok(version) = version else { return };
            match &quarantine.version {
                None => quarantine.version = Some(version.unwrap_or_default()),
                Some(old) if *old == version.clone().unwrap_or_default() => {}
                Some(_) => {
                    state.quarantined.remove(&sha);
                    cache.counters.quarantined.store(state.quarantined.len() as u64, Ordering::Relaxed);
                    tracing::info!(sha256 = %sha, "a quarantined blob's store copy changed; it will be fetched and checked again");
                }
            }
        });
    }

    /// Quarantines `sha256` (its store copy failed a check) and drops the entry `id`; logged and counted once.
    fn quarantine(self: &Arc<Self>, sha256: &str, id: u64, why: &str) {
        let (newly, path) = {
            let mut state = self.lock();
            let newly = !state.quarantined.contains_key(sha256);
            if newly {
                let quarantine = Quarantine {
                    version: None,
                    checked: tokio::time::Instant::now(),
                    checking: true,
                    why: why.to_owned(),
                };
                state.quarantined.insert(sha256.to_owned(), quarantine);
                self.counters.quarantined.store(state.quarantined.len() as u64, Ordering::Relaxed);
            }
            let ours = state.entries.get(sha256).is_some_and(|e| e.id == id);
            (newly, ours.then(|| state.remove(sha256)).flatten().map(|e| e.path))
        };
        if newly {
            tracing::error!(
                sha256,
                why,
                "the object store's copy of a blob is not what was uploaded; quarantined (503) until it changes"
            );
            self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
            self.check_quarantine(sha256);
        }
        self.unlink_later(path.into_iter().collect());
        self.publish_bytes();
    }

    /// The open file of `sha256`'s entry, making the entry (a sparse file of `size` bytes) or reopening its file
    /// off the event loop when needed.
    async fn entry_file(&self, sha256: &str, size: u64) -> Result<(Arc<File>, u64), CacheError> {
        for _ in 0..4 {
            let found = {
                let mut state = self.lock();
                let tick = state.next_tick();
                match state.entries.get_mut(sha256) {
                    Some(entry) if entry.size == size => {
                        let (old, id) = (entry.tick, entry.id);
                        entry.tick = tick;
                        let file = entry.file.clone();
                        let path = entry.path.clone();
                        state.lru.remove(&old);
                        state.lru.insert(tick, sha256.to_owned());
                        Some((file, path, id))
                    }
                    Some(_) => {
                        return Err(CacheError::Local(io::Error::other(format!(
                            "blob {sha256} is cached with another size than its row's {size}"
                        ))));
                    }
                    None => None,
                }
            };
            match found {
                Some((Some(file), _, id)) => return Ok((file, id)),
                Some((None, path, id)) => {
                    let opened =
                        tokio::task::spawn_blocking(move || OpenOptions::new().read(true).write(true).open(path))
                            .await
                            .map_err(io::Error::other)?;
                    let Ok(opened) = opened else { continue }; // renamed once whole meanwhile: look again
                    let mut state = self.lock();
                    let Some(entry) = state.entries.get_mut(sha256).filter(|e| e.id == id) else { continue };
                    let file = match &entry.file {
                        Some(file) => file.clone(),
                        None => {
                            let file = Arc::new(opened);
                            entry.file = Some(file.clone());
                            state.open_files += 1;
                            self.close_old_files(&mut state);
                            file
                        }
                    };
                    return Ok((file, id));
                }
                None => {
                    let id = random_id();
                    let path = self.path_for(sha256, id, size == 0);
                    let created = tokio::task::spawn_blocking({
                        let path = path.clone();
                        move || -> io::Result<File> {
                            fs::create_dir_all(path.parent().expect("cache paths have a parent"))?;
                            let file = OpenOptions::new()
                                .read(true)
                                .write(true)
                                .create_new(true)
                                .mode(super::PRIVATE_FILE_MODE)
                                .open(&path)?;
                            file.set_len(size)?;
                            Ok(file)
                        }
                    })
                    .await
                    .map_err(io::Error::other)??;
                    let file = Arc::new(created);
                    let mut state = self.lock();
                    if state.entries.contains_key(sha256) {
                        // Another request made it meanwhile: use that one.
                        drop(state);
                        self.unlink_later(vec![path]);
                        continue;
                    }
                    state.open_files += 1;
                    state.insert(sha256.to_owned(), Entry::new(size, path, id, Some(file.clone()), self.slice_bytes));
                    self.close_old_files(&mut state);
                    return Ok((file, id));
                }
            }
        }
        Err(CacheError::Local(io::Error::other(format!("blob {sha256}: its cache entry kept changing"))))
    }

    /// Closes the files of the least recently used entries beyond `max_open_files` that nothing is using.
    fn close_old_files(&self, state: &mut State) {
        let max_open_files = self.max_open_files.load(Ordering::Relaxed);
        if state.open_files <= max_open_files {
            return;
        }
        let mut excess = state.open_files - max_open_files;
        let State { entries, lru, open_files, .. } = state;
        for sha in lru.values() {
            if excess == 0 {
                break;
            }
            if let Some(entry) = entries.get_mut(sha)
                && entry.file.is_some()
                && !entry.in_use()
            {
                entry.file = None;
                *open_files -= 1;
                excess -= 1;
            }
        }
    }

    /// Removes least recently used entries nothing is using until the cache is within its bound; returns their
    /// files, to unlink off the event loop.
    fn evict(&self, state: &mut State) -> Vec<PathBuf> {
        let mut victims: Vec<String> = Vec::new();
        if state.bytes <= self.max_bytes {
            return Vec::new();
        }
        let mut over = state.bytes - self.max_bytes;
        for sha in state.lru.values() {
            if over == 0 {
                break;
            }
            if let Some(entry) = state.entries.get(sha)
                && !entry.in_use()
            {
                over = over.saturating_sub(entry.bytes);
                victims.push(sha.clone());
            }
        }
        victims.into_iter().filter_map(|sha| state.remove(&sha)).map(|e| e.path).collect()
    }

    fn unlink_later(&self, paths: Vec<PathBuf>) {
        if paths.is_empty() {
            return;
        }
        self.runtime.spawn_blocking(move || {
            for path in paths {
                // The entry may have become whole (renamed) after its path was read.
                let whole = whole_path(&path);
                for p in [&path, &whole] {
                    match fs::remove_file(p) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => {
                            tracing::warn!(path = %p.display(), error = %e, "could not remove an evicted cache file")
                        }
                    }
                }
            }
        });
    }

    /// The receiver of `slice`'s fill for the entry `(sha256, id)`: the one in flight, or a new one started here.
    /// `Ok(None)` when the slice is already there.
    fn fill_receiver(
        self: &Arc<Self>,
        sha256: &str,
        id: u64,
        file: &Arc<File>,
        slice: u64,
    ) -> Result<Option<watch::Receiver<FillResult>>, io::Error> {
        if let Some(why) = self.quarantined(sha256) {
            return Err(io::Error::other(why));
        }
        let (rx, evicted) = {
            let mut state = self.lock();
            let Some(entry) = state.entries.get_mut(sha256).filter(|e| e.id == id) else {
                return Err(io::Error::other(format!("blob {sha256}: its cache entry was dropped")));
            };
            if entry.has(slice) {
                return Ok(None);
            }
            if let Some(rx) = entry.filling.get(&slice) {
                return Ok(Some(rx.clone()));
            }
            let start = slice * self.slice_bytes;
            let range = start..(start + self.slice_bytes).min(entry.size);
            let (tx, rx) = watch::channel(FillResult::default());
            let tx = Arc::new(tx);
            entry.filling.insert(slice, rx.clone());
            let (size, verification) = (entry.size, entry.verification.clone());
            state.bytes += range.end - range.start;
            let evicted = self.evict(&mut state);
            let (cache, sha, file) = (self.clone(), sha256.to_owned(), file.clone());
            self.runtime.spawn(async move {
                let len = range.end - range.start;
                let slot = FillSlot { sha: sha.clone(), id, size, slice, range, tx: tx.clone() };
                let fill = cache.clone().fill_slice(slot, file, verification);
                // A fill that panics releases its slice as one that fails does: the next read tries again.
                let outcome = match std::panic::AssertUnwindSafe(fill).catch_unwind().await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(FillFailure::Failed(format!("blob {sha}: the fill of slice {slice} panicked"))),
                };
                let outcome = match outcome {
                    Ok(()) => Ok(()),
                    Err(FillFailure::Failed(why)) => {
                        cache.settle(&sha, id, slice, len, false);
                        Err(why)
                    }
                    Err(FillFailure::Corrupt(why)) => {
                        cache.settle(&sha, id, slice, len, false);
                        cache.quarantine(&sha, id, &why);
                        Err(format!("blob {sha}: the object store's copy is not what was uploaded ({why})"))
                    }
                };
                tx.send_modify(|fill| fill.outcome = Some(outcome.map_err(Arc::from)));
            });
            (rx, evicted)
        };
        self.unlink_later(evicted);
        Ok(Some(rx))
    }

    /// Fetches and checks one slice of the entry `(sha, id)` and books it; on failure the caller releases it. Each
    /// chunk that arrives and matches the manifest may be sent at once (`Entry::checked`).
    async fn fill_slice(
        self: Arc<Self>,
        slot: FillSlot,
        file: Arc<File>,
        verification: Arc<OnceCell<Verification>>,
    ) -> Result<(), FillFailure> {
        let FillSlot { sha, id, size, slice, range, tx } = slot;
        let len = range.end - range.start;
        let known = verification.get().cloned();
        if let Some(Verification::Whole) = known {
            return self.fill_through_whole(&sha, id, size, slice, len, &file).await;
        }
        // The slice is fetched while the manifest is (on a cold entry): chunks that arrive before it wait in the
        // checker, so the first byte costs one round trip to the store, not two.
        let chunk_bytes = match &known {
            Some(Verification::Slices(manifest)) => manifest.chunk_bytes(),
            _ => self.manifest_chunk,
        };
        let checker = Arc::new(SliceChecker {
            cache: self.clone(),
            sha: sha.clone(),
            id,
            slice,
            start: range.start,
            len,
            tx,
            state: Mutex::new(CheckerState::default()),
        });
        if let Some(Verification::Slices(manifest)) = &known {
            checker.learn(manifest.clone());
        }
        let on_chunk = {
            let checker = checker.clone();
            move |chunk_start: u64, digest: &ChunkDigest| checker.on_chunk(chunk_start, digest)
        };
        let check = ChunkCheck { chunk_bytes, on_chunk: Arc::new(on_chunk) };
        let fetch = self.fetch.fetch_into(&sha, range.clone(), file.clone(), Some(check));
        let learn = async {
            if let Some(known) = known {
                return Ok(known);
            }
            let learned = verification.get_or_try_init(|| self.verification_of(&sha, size)).await?.clone();
            if let Verification::Slices(manifest) = &learned
                && manifest.chunk_bytes() == chunk_bytes
            {
                checker.learn(manifest.clone());
            }
            Ok::<_, FillFailure>(learned)
        };
        let (learned, fetched) = tokio::join!(learn, fetch);
        let manifest = match learned? {
            Verification::Whole => return self.fill_through_whole(&sha, id, size, slice, len, &file).await,
            // Another chunking than the one hashed: the next read fetches the slice by the manifest's.
            Verification::Slices(manifest) if manifest.chunk_bytes() != chunk_bytes => {
                return Err(FillFailure::Failed(format!("blob {sha}: its manifest's chunks are not this fetch's")));
            }
            Verification::Slices(manifest) => manifest,
        };
        if let Some(why) = checker.mismatch() {
            return Err(FillFailure::Corrupt(why));
        }
        let fetched = fetched.map_err(|e| FillFailure::Failed(e.to_string()))?;
        // Bytes not written would be booked as the blob's: never.
        if fetched.written != len {
            return Err(FillFailure::Failed(format!(
                "blob {sha}: the store wrote {} of the {len} bytes of slice {slice}",
                fetched.written
            )));
        }
        self.counters.fetched_bytes.fetch_add(len, Ordering::Relaxed);
        if fetched.digests.len() as u64 != len.div_ceil(manifest.chunk_bytes()) {
            return Err(FillFailure::Failed(format!("blob {sha}: slice {slice} came without its chunks' digests")));
        }
        manifest.check(range.start, &fetched.digests).map_err(|e| FillFailure::Corrupt(e.to_string()))?;
        self.settle(&sha, id, slice, len, true);
        Ok(())
    }

    /// A slice of a blob without a manifest: the whole blob is fetched by one fill, and checked whole; this
    /// slice's reservation is part of the whole's.
    async fn fill_through_whole(
        self: &Arc<Self>,
        sha: &str,
        id: u64,
        size: u64,
        slice: u64,
        len: u64,
        file: &Arc<File>,
    ) -> Result<(), FillFailure> {
        self.unreserve(len);
        let outcome = match self.whole_receiver(sha, id, size, file) {
            Some(mut rx) => rx.wait_for(FillResult::done).await.ok().and_then(|fill| fill.outcome.clone()),
            None => Some(Err(Arc::from(format!("blob {sha}: its cache entry was dropped")))),
        };
        let mut state = self.lock();
        state.bytes += len; // released again by `settle` on failure
        if let Some(entry) = state.entries.get_mut(sha).filter(|e| e.id == id)
            && matches!(outcome, Some(Ok(())))
        {
            entry.filling.remove(&slice);
            state.bytes -= len;
            return Ok(());
        }
        drop(state);
        Err(FillFailure::Failed(match outcome {
            Some(Err(why)) => why.to_string(),
            _ => format!("blob {sha}: the whole blob's fill ended without an outcome"),
        }))
    }

    /// How an entry's slices are checked: its manifest, fetched and opened; none (or no key) means whole.
    async fn verification_of(&self, sha: &str, size: u64) -> Result<Verification, FillFailure> {
        let Some(key) = &self.manifest_key else { return Ok(Verification::Whole) };
        match self.fetch.manifest(sha).await {
            Ok(None) => Ok(Verification::Whole),
            Ok(Some(sealed)) => match SliceManifest::open(&sealed, key, sha, size) {
                Ok(manifest) if self.slice_bytes % manifest.chunk_bytes() == 0 => {
                    Ok(Verification::Slices(Arc::new(manifest)))
                }
                Ok(_) => Ok(Verification::Whole),
                Err(e) => Err(FillFailure::Corrupt(e.to_string())),
            },
            Err(e) => Err(FillFailure::Failed(e.to_string())),
        }
    }

    /// The fill of the whole blob of the entry `(sha, id)` (a blob without a manifest): the one in flight, or one
    /// started here, which fetches the blob in one range, hashes it to its name and only then books every slice.
    fn whole_receiver(
        self: &Arc<Self>,
        sha: &str,
        id: u64,
        size: u64,
        file: &Arc<File>,
    ) -> Option<watch::Receiver<FillResult>> {
        let mut state = self.lock();
        let entry = state.entries.get_mut(sha).filter(|e| e.id == id)?;
        if let Some(rx) = &entry.whole_fill {
            return Some(rx.clone());
        }
        let (tx, rx) = watch::channel(FillResult::default());
        if size > self.max_bytes / 2 {
            // Checked whole, it would have to be kept whole: more than the cache gives one blob.
            let why = format!(
                "blob {sha} was stored without a slice manifest and is too large for the cache to check whole; run `blobgate blobs migrate`"
            );
            tx.send_modify(|fill| fill.outcome = Some(Err(Arc::from(why))));
            return Some(rx);
        }
        entry.whole_fill = Some(rx.clone());
        let reserved = size - entry.bytes;
        state.bytes += reserved;
        let evicted = self.evict(&mut state);
        drop(state);
        self.unlink_later(evicted);
        let (cache, sha, file) = (self.clone(), sha.to_owned(), file.clone());
        self.runtime.spawn(async move {
            let fill = async {
                let fetched = cache.fetch.fetch_into(&sha, 0..size, file.clone(), None).await;
                match fetched {
                    Ok(f) if f.written == size => {}
                    Ok(f) => {
                        return Err(FillFailure::Failed(format!(
                            "blob {sha}: the store wrote {} of {size}",
                            f.written
                        )));
                    }
                    Err(e) => return Err(FillFailure::Failed(e.to_string())),
                }
                cache.counters.fetched_bytes.fetch_add(size, Ordering::Relaxed);
                hashes_to(file.clone(), sha.clone()).await.map_err(FillFailure::Corrupt)
            };
            let outcome = match std::panic::AssertUnwindSafe(fill).catch_unwind().await {
                Ok(outcome) => outcome,
                Err(_) => Err(FillFailure::Failed(format!("blob {sha}: the fill of the whole blob panicked"))),
            };
            let whole = {
                let mut state = cache.lock();
                let entry = state.entries.get_mut(&sha).filter(|e| e.id == id);
                match (entry, &outcome) {
                    (Some(entry), Ok(())) => {
                        entry.whole_fill = None;
                        (0..size.div_ceil(cache.slice_bytes)).for_each(|s| entry.set(s));
                        entry.missing_slices = 0;
                        entry.bytes = size;
                        Some((entry.path.clone(), entry.file.clone()))
                    }
                    (Some(entry), Err(_)) => {
                        entry.whole_fill = None;
                        state.bytes -= reserved;
                        None
                    }
                    (None, _) => {
                        state.bytes -= reserved;
                        None
                    }
                }
            };
            cache.publish_bytes();
            if let Some((path, Some(file))) = whole {
                cache.rename_whole(&sha, id, path, file);
            }
            let outcome = match outcome {
                Ok(()) => Ok(()),
                Err(FillFailure::Failed(why)) => Err(why),
                Err(FillFailure::Corrupt(why)) => {
                    cache.quarantine(&sha, id, &why);
                    Err(format!("blob {sha}: the object store's copy does not match its SHA-256 ({why})"))
                }
            };
            tx.send_modify(|fill| fill.outcome = Some(outcome.map_err(Arc::from)));
        });
        Some(rx)
    }

    fn unreserve(&self, len: u64) {
        self.lock().bytes -= len;
        self.publish_bytes();
    }

    /// Books a fill's outcome: the slice is present, or its reserved bytes are released. A blob whose every slice
    /// is now present is synced and renamed whole.
    fn settle(self: &Arc<Self>, sha256: &str, id: u64, slice: u64, len: u64, arrived: bool) {
        let whole = {
            let mut state = self.lock();
            let Some(entry) = state.entries.get_mut(sha256).filter(|e| e.id == id) else {
                state.bytes -= len;
                drop(state);
                self.publish_bytes();
                return;
            };
            entry.filling.remove(&slice);
            let checked = entry.checked.remove(&slice).unwrap_or(0);
            if !arrived {
                state.bytes -= len;
                // Part of the slice was sent from; a new fetch would write over it under a response still
                // sending: the entry goes, and its responses keep their file.
                if checked > 0 {
                    let path = state.remove(sha256).map(|e| e.path);
                    drop(state);
                    self.unlink_later(path.into_iter().collect());
                    self.publish_bytes();
                    return;
                }
                None
            } else {
                entry.set(slice);
                entry.bytes += len;
                entry.missing_slices -= 1;
                // A blob that streams through loses its slices behind its readers: never adopted whole.
                let keeps = entry.size <= self.max_bytes / 2;
                (entry.missing_slices == 0 && keeps).then(|| (entry.path.clone(), entry.file.clone()))
            }
        };
        self.publish_bytes();
        if let Some((path, Some(file))) = whole {
            self.rename_whole(sha256, id, path, file);
        }
    }

    /// A whole, checked entry's file is synced and renamed `.c`, so a restart adopts it.
    fn rename_whole(self: &Arc<Self>, sha256: &str, id: u64, path: PathBuf, file: Arc<File>) {
        let (cache, sha) = (self.clone(), sha256.to_owned());
        self.runtime.spawn_blocking(move || {
            let target = whole_path(&path);
            if file.sync_all().is_ok() && fs::rename(&path, &target).is_ok() {
                let mut state = cache.lock();
                if let Some(entry) = state.entries.get_mut(&sha).filter(|e| e.id == id) {
                    entry.path = target;
                }
            }
        });
    }

    /// After a reader of a blob too large to keep has sent up to `offset`: the slices wholly behind it are
    /// released, their holes punched, so the entry never holds much more than what is being sent.
    fn release_behind(self: &Arc<Self>, sha256: &str, id: u64, file: &Arc<File>, offset: u64) {
        let punched: Vec<Range<u64>> = {
            let mut state = self.lock();
            let Some(entry) = state.entries.get_mut(sha256).filter(|e| e.id == id) else { return };
            if entry.size <= self.max_bytes / 2 {
                return;
            }
            let behind = offset / self.slice_bytes;
            let mut released = Vec::new();
            for slice in 0..behind {
                if entry.has(slice) {
                    entry.clear(slice);
                    let start = slice * self.slice_bytes;
                    let end = (start + self.slice_bytes).min(entry.size);
                    entry.bytes -= end - start;
                    entry.missing_slices += 1;
                    released.push(start..end);
                }
            }
            let freed: u64 = released.iter().map(|r| r.end - r.start).sum();
            state.bytes -= freed;
            released
        };
        if punched.is_empty() {
            return;
        }
        self.publish_bytes();
        let file = file.clone();
        self.runtime.spawn_blocking(move || {
            use nix::fcntl::{FallocateFlags, fallocate};
            for range in punched {
                let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
                if let Err(e) = fallocate(&*file, flags, range.start as i64, (range.end - range.start) as i64) {
                    tracing::warn!(error = %e, "could not release a streamed slice of a cache file");
                }
            }
        });
    }
}

/// Whether the whole of `file` hashes to `sha256` (read off the event loop, from the page cache the fill left).
async fn hashes_to(file: Arc<File>, sha256: String) -> Result<(), String> {
    let hashed = tokio::task::spawn_blocking(move || -> io::Result<String> {
        use sha2::{Digest, Sha256};
        use std::os::unix::fs::FileExt;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut offset = 0;
        loop {
            match file.read_at(&mut buf, offset) {
                Ok(0) => break,
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(hex::encode(hasher.finalize()))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("cannot read the cached copy: {e}"))?;
    if hashed == sha256 { Ok(()) } else { Err(format!("it hashes to {hashed}")) }
}

impl State {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn insert(&mut self, sha256: String, mut entry: Entry) {
        entry.tick = self.next_tick();
        self.lru.insert(entry.tick, sha256.clone());
        self.entries.insert(sha256, entry);
    }

    fn remove(&mut self, sha256: &str) -> Option<Entry> {
        let entry = self.entries.remove(sha256)?;
        self.lru.remove(&entry.tick);
        self.bytes -= entry.bytes;
        if entry.file.is_some() {
            self.open_files -= 1;
        }
        Some(entry)
    }
}

/// A response's view of its cache entry: what has arrived, and waiting for (and fetching) the rest. It holds the
/// entry's file, so the entry is not evicted while the response lives.
#[derive(Debug)]
pub struct CacheGate {
    cache: Arc<Inner>,
    sha256: String,
    id: u64,
    file: Arc<File>,
}

impl CacheGate {
    /// Waits until the whole of `slice` is there.
    async fn wait_slice(&self, slice: u64) -> io::Result<()> {
        self.wait_until(slice, u64::MAX).await
    }

    /// Waits until the byte at `offset` is there and checked (its chunk, without the rest of its slice).
    async fn wait_at(&self, offset: u64) -> io::Result<()> {
        let slice_bytes = self.cache.slice_bytes;
        self.wait_until(offset / slice_bytes, offset % slice_bytes + 1).await
    }

    /// Waits until `slice` is there, or its first `checked` bytes are.
    async fn wait_until(&self, slice: u64, checked: u64) -> io::Result<()> {
        let Some(mut rx) = self.cache.fill_receiver(&self.sha256, self.id, &self.file, slice)? else {
            return Ok(());
        };
        let fill = rx.wait_for(|fill| fill.done() || fill.checked >= checked).await.map_err(io::Error::other)?.clone();
        match fill.outcome {
            Some(Err(e)) if fill.checked < checked => Err(io::Error::other(e.to_string())),
            _ => Ok(()),
        }
    }
}

impl FillGate for CacheGate {
    fn ready(&self, offset: u64, len: u64) -> u64 {
        let slice_bytes = self.cache.slice_bytes;
        let (ready, ahead, streams) = {
            let state = self.cache.lock();
            let Some(entry) = state.entries.get(&self.sha256).filter(|e| e.id == self.id) else { return 0 };
            let mut ready = 0;
            let mut slice = offset / slice_bytes;
            while ready < len && slice * slice_bytes < entry.size && entry.has(slice) {
                ready = ((slice + 1) * slice_bytes).min(entry.size) - offset;
                slice += 1;
            }
            // Then what has been checked of the slice being fetched.
            if ready < len
                && let Some(&checked) = entry.checked.get(&slice)
            {
                ready = (slice * slice_bytes + checked).saturating_sub(offset).max(ready);
            }
            // Within the region: a range never fetches beyond the slices that cover it.
            let last = (offset + len).min(entry.size).saturating_sub(1) / slice_bytes;
            let ahead: Vec<u64> = (slice..=(slice + READAHEAD_SLICES).min(last))
                .filter(|s| !entry.has(*s) && !entry.filling.contains_key(s))
                .collect();
            (ready.min(len), ahead, entry.size > self.cache.max_bytes / 2)
        };
        if streams {
            self.cache.release_behind(&self.sha256, self.id, &self.file, offset);
        }
        for s in ahead {
            let _ = self.cache.fill_receiver(&self.sha256, self.id, &self.file, s);
        }
        ready
    }

    fn wait(&self, offset: u64) -> std::pin::Pin<Box<dyn Future<Output = io::Result<()>> + Send>> {
        let gate =
            CacheGate { cache: self.cache.clone(), sha256: self.sha256.clone(), id: self.id, file: self.file.clone() };
        Box::pin(async move { gate.wait_at(offset).await })
    }
}

fn whole_path(path: &Path) -> PathBuf {
    path.with_extension(format!("{}{COMPLETE_SUFFIX}", path.extension().and_then(|e| e.to_str()).unwrap_or_default()))
}

fn random_id() -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    u64::from_le_bytes(bytes)
}

/// The id in a cache file's name `<sha>.<id>[.c]`.
fn id_of(path: &Path) -> u64 {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name.split('.').nth(1).and_then(|id| u64::from_str_radix(id, 16).ok()).unwrap_or_else(random_id)
}

/// Start-up: the whole blobs a previous run left (hash, path, size), oldest first; everything else in `dir`
/// (files that were filling, a duplicate of a blob) is removed.
fn adopt_complete_files(dir: &Path) -> anyhow::Result<Vec<(String, PathBuf, u64)>> {
    let mut found: Vec<(SystemTime, String, PathBuf, u64)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    if !dir.exists() {
        return Ok(Vec::new());
    }
    for entry in walkdir::WalkDir::new(dir).min_depth(3).max_depth(3) {
        let entry = entry?;
        if !entry.file_type().is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let sha = name.split('.').next().unwrap_or_default().to_owned();
        let whole = name.ends_with(COMPLETE_SUFFIX) && super::blobs::is_blob_hash(&sha);
        if whole && seen.insert(sha.clone()) {
            let meta = entry.metadata()?;
            found.push((meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), sha, entry.into_path(), meta.len()));
        } else {
            let _ = fs::remove_file(entry.path());
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, sha, path, size)| (sha, path, size)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BlobStoreSettings, ObjectStoreLocation};
    use crate::store::remote::fake::{FakeRemote, Gate, Step, never_asked};
    use std::ops::Range;
    use std::os::unix::fs::FileExt;
    use std::time::Duration;

    /// Small slices, so that a blob of a few KiB spans several.
    const SLICE: u64 = 1024;

    /// A cache whose store is never asked: these tests only adopt whole blobs (no fetch).
    async fn cache(dir: &Path, max_bytes: u64) -> BlobCache {
        let manifests = (Some(FakeRemote::manifest_key()), crate::store::remote::fake::CHUNK);
        BlobCache::open_with(dir, max_bytes, 1 << 20, never_asked(), FakeRemote::new(), manifests, true).await.unwrap()
    }

    /// A server's cache in `dir`, of `SLICE`-byte slices, whose fills fetch from `fake`.
    async fn faked(dir: &Path, max_bytes: u64, fake: &Arc<FakeRemote>) -> BlobCache {
        let manifests = (Some(FakeRemote::manifest_key()), crate::store::remote::fake::CHUNK);
        BlobCache::open_with(dir, max_bytes, SLICE, never_asked(), fake.clone(), manifests, true).await.unwrap()
    }

    fn staged(dir: &Path, n: u8, len: usize) -> (String, PathBuf) {
        let sha = format!("{n:02x}{}", "0".repeat(62));
        let path = dir.join(format!("staged-{n}"));
        fs::write(&path, vec![n; len]).unwrap();
        (sha, path)
    }

    /// `len` bytes that differ from slice to slice and from seed to seed.
    fn blob_bytes(len: u64, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31) ^ ((i / SLICE) as u8).wrapping_mul(7) ^ seed).collect()
    }

    /// Slice `n` of a blob of `size` bytes.
    fn slice(n: u64, size: u64) -> Range<u64> {
        n * SLICE..((n + 1) * SLICE).min(size)
    }

    fn span(bytes: &[u8], offset: u64, len: u64) -> &[u8] {
        &bytes[offset as usize..(offset + len) as usize]
    }

    /// What a response sends of `blob`, `len` bytes from `offset`, sent as the driver sends it: only what the gate
    /// says has arrived, waiting for the rest. The bytes sent, and the error that ended it early.
    async fn send(blob: &CachedBlob, offset: u64, len: u64) -> (Vec<u8>, Option<io::Error>) {
        let mut sent = Vec::new();
        let (mut at, end) = (offset, offset + len);
        while at < end {
            // As `http::object`: a response that was a hit has no gate to ask.
            let ready = match &blob.gate {
                None => end - at,
                Some(gate) => gate.ready(at, end - at),
            };
            if ready == 0 {
                if let Err(e) = blob.gate.as_ref().expect("a gate while not all there").wait(at).await {
                    return (sent, Some(e));
                }
                continue;
            }
            let mut buf = vec![0; ready as usize];
            blob.file.read_exact_at(&mut buf, at).unwrap();
            sent.extend_from_slice(&buf);
            at += ready;
        }
        (sent, None)
    }

    /// A GET of `len` bytes from `offset`: the blob opened for it, then sent.
    async fn get(cache: &BlobCache, sha: &str, size: u64, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let blob = cache.open_for(sha, size, &[(offset, len)]).await.map_err(|e| format!("before the head: {e}"))?;
        match send(&blob, offset, len).await {
            (sent, None) => Ok(sent),
            (sent, Some(e)) => Err(format!("after {} bytes: {e}", sent.len())),
        }
    }

    /// Waits until `cond` holds. On the paused clock time passes only while nothing can run (a blocking-pool job
    /// in flight holds it), so this waits for events, and fails at once when none is coming.
    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !cond() {
            assert!(tokio::time::Instant::now() < deadline, "never happened: {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn until_gone(path: &Path) {
        until(&format!("{} is unlinked", path.display()), || !path.exists()).await;
    }

    /// Waits until `sha`'s entry is whole on disk (renamed `.c`) and its file is held by `responses` and nothing
    /// else (the fsync and rename that follow the last slice are done).
    async fn until_settled(cache: &BlobCache, sha: &str, responses: usize) {
        until(&format!("{sha} is whole and settled"), || {
            let state = cache.0.lock();
            state.entries.get(sha).is_some_and(|e| {
                e.missing_slices == 0
                    && e.filling.is_empty()
                    && e.path.to_string_lossy().ends_with(COMPLETE_SUFFIX)
                    // The entry's, and a response's blob and gate each.
                    && e.file.as_ref().is_none_or(|f| Arc::strong_count(f) == 1 + 2 * responses)
            })
        })
        .await;
    }

    fn counts(cache: &BlobCache) -> (u64, u64) {
        let c = cache.counters();
        (c.hits.load(Ordering::Relaxed), c.misses.load(Ordering::Relaxed))
    }

    fn cached_bytes(cache: &BlobCache) -> u64 {
        let bytes = cache.0.lock().bytes;
        assert_eq!(cache.counters().bytes.load(Ordering::Relaxed), bytes, "what /metrics shows is the count");
        bytes
    }

    fn path_of(cache: &BlobCache, sha: &str) -> PathBuf {
        cache.0.lock().entries[sha].path.clone()
    }

    /// The log lines written on this thread (a current-thread runtime's tasks included) while the guard lives.
    fn capture_logs() -> (tracing::subscriber::DefaultGuard, Arc<Mutex<Vec<u8>>>) {
        // A global subscriber that keeps nothing: without one, a test thread with no subscriber that reaches a
        // log line first has tracing cache "never" for it, in the whole process (`cargo test` runs tests as
        // threads of one process).
        static GLOBAL: std::sync::Once = std::sync::Once::new();
        GLOBAL.call_once(|| {
            let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
        });
        #[derive(Clone)]
        struct Writer(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Writer {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let logs = Arc::new(Mutex::new(Vec::new()));
        let writer = Writer(logs.clone());
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
        (tracing::subscriber::set_default(subscriber), logs)
    }

    #[tokio::test]
    async fn least_recently_used_blobs_go_beyond_the_bound_but_never_one_being_sent() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(dir.path(), 3 << 20).await;
        let mut blobs = Vec::new();
        for n in 0..3 {
            let (sha, path) = staged(dir.path(), n, 1 << 20);
            cache.adopt(&sha, 1 << 20, path).await;
            blobs.push(sha);
        }
        assert!(blobs.iter().all(|sha| cache.holds_whole(sha)));
        // A HEAD sends nothing: neither a hit nor a miss.
        drop(cache.open_for(&blobs[0], 1 << 20, &[]).await.unwrap());
        let counts = |c: &CacheCounters| (c.hits.load(Ordering::Relaxed), c.misses.load(Ordering::Relaxed));
        assert_eq!(counts(cache.counters()), (0, 0));
        // Blob 0 is read (so recently used) and its response still holds it.
        let held = cache.open_for(&blobs[0], 1 << 20, &[(0, 1 << 20)]).await.unwrap();
        assert!(held.gate.is_none());
        assert_eq!(counts(cache.counters()), (1, 0));
        let first_path = cache.0.lock().entries[&blobs[1]].path.clone();
        let (sha, path) = staged(dir.path(), 3, 1 << 20);
        cache.adopt(&sha, 1 << 20, path).await;
        assert!(cache.holds_whole(&blobs[0]), "in use and recently used");
        assert!(!cache.holds_whole(&blobs[1]), "the least recently used goes");
        assert!(cache.holds_whole(&blobs[2]) && cache.holds_whole(&sha));
        assert_eq!(cache.counters().bytes.load(Ordering::Relaxed), 3 << 20);
        until_gone(&first_path).await;

        // Over the bound with everything else in use: the held blob stays even when it is the oldest.
        let others: Vec<_> = [&blobs[2], &sha]
            .into_iter()
            .map(|s| futures_util::FutureExt::now_or_never(cache.open_for(s, 1 << 20, &[])))
            .collect();
        drop(others);
        let (big, path) = staged(dir.path(), 4, 2 << 20);
        cache.adopt(&big, 2 << 20, path).await;
        assert!(cache.holds_whole(&blobs[0]), "a response is sending from it");
        let mut bytes = [0u8; 4];
        use std::os::unix::fs::FileExt;
        held.file.read_exact_at(&mut bytes, 1000).unwrap();
        assert_eq!(bytes, [0; 4]);
        drop(held);
    }

    #[tokio::test]
    async fn whole_blobs_survive_a_restart_and_partial_files_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let cache_a = cache(dir.path(), 8 << 20).await;
        let (sha, path) = staged(dir.path(), 7, 3000);
        cache_a.adopt(&sha, 3000, path).await;
        drop(cache_a);
        let partial = dir.path().join("cache/ab/cd").join(format!("{}.{:016x}", "ab".repeat(32), 5));
        fs::create_dir_all(partial.parent().unwrap()).unwrap();
        fs::write(&partial, b"half").unwrap();

        let cache_b = cache(dir.path(), 8 << 20).await;
        assert!(cache_b.holds_whole(&sha));
        assert!(!partial.exists(), "a file that was filling is removed");
        let blob = cache_b.open_for(&sha, 3000, &[(0, 3000)]).await.unwrap();
        assert!(blob.gate.is_none());
        let mut bytes = vec![0u8; 3000];
        std::os::unix::fs::FileExt::read_exact_at(&*blob.file, &mut bytes, 0).unwrap();
        assert_eq!(bytes, vec![7; 3000]);
        let hits = cache_b.counters().hits.load(Ordering::Relaxed);
        assert_eq!(hits, 1);
    }

    #[tokio::test]
    async fn a_commands_cache_keeps_nothing_of_the_servers() {
        let dir = tempfile::tempdir().unwrap();
        let server = cache(dir.path(), 8 << 20).await;
        let (sha, path) = staged(dir.path(), 9, 100);
        server.adopt(&sha, 100, path.clone()).await;
        let settings =
            BlobStoreSettings { endpoint: Some("http://127.0.0.1:9".into()), anonymous: true, ..Default::default() };
        let remote = RemoteBlobs::new(&ObjectStoreLocation::parse("s3://unused", &settings).unwrap()).unwrap();
        let command = BlobCache::open(dir.path(), 8 << 20, 1 << 20, remote, false).await.unwrap();
        command.adopt(&sha, 100, path).await;
        assert!(!command.holds_whole(&sha), "a command adopts nothing");
        drop(command);
        drop(server);
        let server = cache(dir.path(), 8 << 20).await;
        assert!(server.holds_whole(&sha), "the server's file was left alone");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cold_read_fetches_the_slices_its_regions_cover_once_and_a_warm_one_nothing() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let size = 10 * SLICE + 7;
        let bytes = blob_bytes(size, 1);
        let sha = fake.put(&bytes);
        let cache = faked(dir.path(), 1 << 20, &fake).await;

        // An unaligned range across slices 3 and 4: those two, the first before the head.
        let (offset, len) = (3 * SLICE + 100, SLICE);
        assert_eq!(get(&cache, &sha, size, offset, len).await.unwrap(), span(&bytes, offset, len));
        assert_eq!(fake.fetches(), [(sha.clone(), slice(3, size)), (sha.clone(), slice(4, size))]);

        // Two regions (a multi-range): the slice of each, none between them.
        let regions = [(10, 20), (8 * SLICE + 1, 30)];
        let blob = cache.open_for(&sha, size, &regions).await.unwrap();
        for (offset, len) in regions {
            assert_eq!(send(&blob, offset, len).await.0, span(&bytes, offset, len));
        }
        drop(blob);
        assert_eq!(fake.fetches()[2..], [(sha.clone(), slice(0, size)), (sha.clone(), slice(8, size))]);

        // The whole blob: each slice not yet cached, once.
        assert_eq!(get(&cache, &sha, size, 0, size).await.unwrap(), bytes);
        for n in 0..=10 {
            assert_eq!(fake.fetches_of(&sha, slice(n, size)), 1, "slice {n}: {:?}", fake.fetches());
        }
        assert_eq!(fake.fetch_count(), 11);
        assert_eq!(cache.counters().fetched_bytes.load(Ordering::Relaxed), size);
        until_settled(&cache, &sha, 0).await;
        assert!(cache.holds_whole(&sha));
        assert_eq!(cached_bytes(&cache), size);

        // Warm: a hit, and nothing fetched.
        let blob = cache.open_for(&sha, size, &[(offset, len)]).await.unwrap();
        assert!(blob.gate.is_none());
        assert_eq!(send(&blob, offset, len).await.0, span(&bytes, offset, len));
        assert_eq!(fake.fetch_count(), 11);
        assert_eq!(counts(&cache), (1, 3));
    }

    /// Readers on four threads at once, as the data workers are.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_readers_of_a_cold_blob_share_one_fetch_per_slice() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let size = 3 * SLICE + 5;
        let bytes = Arc::new(blob_bytes(size, 2));
        let sha = fake.put(&bytes);
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let gate = fake.hold(1);
        let readers: Vec<_> = (0..32)
            .map(|_| {
                let (cache, sha) = (cache.clone(), sha.clone());
                tokio::spawn(async move {
                    let blob = cache.open_for(&sha, size, &[(0, size)]).await.unwrap();
                    (blob.gate.is_none(), send(&blob, 0, size).await)
                })
            })
            .collect();
        // Each reader counts its miss, then waits for the first slice (or starts its fetch) without a pause.
        until("32 readers wait for the first slice", || counts(&cache).1 == 32).await;
        fake.started(1).await;
        assert_eq!(fake.fetches(), [(sha.clone(), slice(0, size))], "one fetch while 32 readers wait");
        gate.open();
        for reader in readers {
            let (hit, (sent, error)) = reader.await.unwrap();
            assert!(!hit && error.is_none(), "{error:?}");
            assert!(sent == *bytes, "every reader gets the blob");
        }
        for n in 0..4 {
            assert_eq!(fake.fetches_of(&sha, slice(n, size)), 1, "slice {n}: {:?}", fake.fetches());
        }
        assert_eq!(fake.fetch_count(), 4);
        assert!(fake.most_in_flight() <= 1 + READAHEAD_SLICES as usize, "{}", fake.most_in_flight());
        assert_eq!(counts(&cache), (0, 32));
    }

    #[tokio::test(start_paused = true)]
    async fn while_the_store_is_down_what_is_cached_is_served_and_the_rest_refused() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let size = 3 * SLICE;
        let (warm, part, cold) = (blob_bytes(size, 14), blob_bytes(size, 15), blob_bytes(size, 16));
        let (warm_sha, part_sha, cold_sha) = (fake.put(&warm), fake.put(&part), fake.put(&cold));
        assert_eq!(get(&cache, &warm_sha, size, 0, size).await.unwrap(), warm);
        assert_eq!(get(&cache, &part_sha, size, 0, 10).await.unwrap(), span(&part, 0, 10));
        let fetched = fake.fetch_count();

        fake.set_down(true);
        assert_eq!(get(&cache, &warm_sha, size, 0, size).await.unwrap(), warm, "a cached blob is served");
        assert_eq!(get(&cache, &part_sha, size, 5, 100).await.unwrap(), span(&part, 5, 100), "so is a cached range");
        let error = get(&cache, &part_sha, size, 0, size).await.unwrap_err();
        assert!(error.starts_with(&format!("after {SLICE} bytes")), "the rest of a blob is not: {error}");
        let error = get(&cache, &cold_sha, size, 0, 1).await.unwrap_err();
        assert!(error.starts_with("before the head"), "a cold read is refused before its head (a 503): {error}");
        assert_eq!(cached_bytes(&cache), size + SLICE, "nothing reserved stays");

        // Back: the next reads fetch what they need, once.
        fake.set_down(false);
        fake.fail(fake.fetch_count() as u64 + 1);
        assert!(get(&cache, &cold_sha, size, 0, size).await.is_err(), "one more refusal");
        assert_eq!(get(&cache, &cold_sha, size, 0, size).await.unwrap(), cold);
        assert_eq!(get(&cache, &part_sha, size, 0, size).await.unwrap(), part);
        let after: Vec<_> = fake.fetches()[fetched..].iter().filter(|(sha, _)| *sha == part_sha).cloned().collect();
        assert_eq!(after.len(), 2 + 2, "slices 1 and 2 tried while down, then fetched: {after:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_fetch_reaches_every_waiter_and_the_next_read_fetches_again() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let size = 3 * SLICE;
        let bytes = blob_bytes(size, 3);
        let sha = fake.put(&bytes);
        let cache = faked(dir.path(), 1 << 20, &fake).await;

        // The first slice, before the head: every request waiting for it is refused (a 503).
        let gate = Gate::default();
        fake.script(1, vec![Step::Hold(gate.clone()), Step::Fail]);
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (cache, sha) = (cache.clone(), sha.clone());
                tokio::spawn(async move { cache.open_for(&sha, size, &[(0, size)]).await.map(|_| ()) })
            })
            .collect();
        until("3 readers wait for the first slice", || counts(&cache).1 == 3).await;
        gate.open();
        for reader in readers {
            let error = reader.await.unwrap().unwrap_err();
            assert!(matches!(error, CacheError::Remote(RemoteError::Unavailable(_))), "{error:?}");
            assert!(error.to_string().contains("fake: fetch of"), "the store's error: {error}");
        }
        assert_eq!(fake.fetch_count(), 1);
        // Nothing poisoned: the slice's reservation is released, and the next read fetches it again.
        assert_eq!(cached_bytes(&cache), 0);
        assert!(cache.0.lock().entries[&sha].filling.is_empty());
        assert_eq!(get(&cache, &sha, size, 0, SLICE).await.unwrap(), span(&bytes, 0, SLICE));
        assert_eq!(fake.fetches_of(&sha, slice(0, size)), 2);

        // A slice a response waits for while it is sent: both waiting responses end there, after what arrived.
        let later = Gate::default();
        fake.script_for(&sha, slice(2, size), vec![Step::Hold(later.clone()), Step::Fail]);
        let (a, b) = (
            cache.open_for(&sha, size, &[(0, size)]).await.unwrap(),
            cache.open_for(&sha, size, &[(SLICE, size - SLICE)]).await.unwrap(),
        );
        let ((sent_a, error_a), (sent_b, error_b), ()) =
            tokio::join!(send(&a, 0, size), send(&b, SLICE, size - SLICE), async {
                fake.started(4).await;
                later.open();
            });
        assert_eq!(sent_a, span(&bytes, 0, 2 * SLICE));
        assert_eq!(sent_b, span(&bytes, SLICE, SLICE));
        assert!(error_a.unwrap().to_string().contains("fake: fetch of"));
        assert!(error_b.unwrap().to_string().contains("fake: fetch of"));
        // The next read of it fetches it again.
        assert_eq!(send(&a, 2 * SLICE, SLICE).await.0, span(&bytes, 2 * SLICE, SLICE));
        assert_eq!(fake.fetches_of(&sha, slice(2, size)), 2);
        assert_eq!(fake.fetches_of(&sha, slice(1, size)), 1);
        drop((a, b));
        until_settled(&cache, &sha, 0).await;
        assert_eq!(cached_bytes(&cache), size);

        // A blob the store does not have: refused before the head too.
        let missing = "ab".repeat(32);
        let error = cache.open_for(&missing, 10, &[(0, 10)]).await.unwrap_err();
        assert!(error.to_string().contains("is not in the object store"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fetch_that_writes_less_than_its_slice_is_a_failure_and_is_fetched_again() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let size = 2 * SLICE;
        let bytes = blob_bytes(size, 4);
        let sha = fake.put(&bytes);
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        for (what, steps) in [
            ("cut mid-body", vec![Step::Write(100), Step::Fail]),
            ("paused mid-body, then cut", vec![Step::Write(100), Step::Hold(Gate::default()), Step::Fail]),
            ("a short body taken for the whole", vec![Step::Write(100), Step::Lie]),
        ] {
            if let Some(Step::Hold(gate)) = steps.get(1) {
                gate.open();
            }
            fake.script_for(&sha, slice(0, size), steps);
            let error = get(&cache, &sha, size, 0, size).await.unwrap_err();
            assert!(error.starts_with("before the head"), "{what}: {error}");
            assert_eq!(cached_bytes(&cache), 0, "{what}");
        }
        assert_eq!(get(&cache, &sha, size, 0, size).await.unwrap(), bytes);
        assert_eq!(fake.fetches_of(&sha, slice(0, size)), 4);
        assert_eq!(cache.counters().corrupt.load(Ordering::Relaxed), 0);

        // A store copy shorter than the blob: its last slice never arrives whole.
        let short = blob_bytes(2 * SLICE, 5);
        let sha = fake.put(&short);
        fake.put_as(&sha, &short[..(SLICE + 10) as usize]);
        let error = get(&cache, &sha, 2 * SLICE, 0, 2 * SLICE).await.unwrap_err();
        assert!(error.contains(&format!("after {SLICE} bytes")) && error.contains("sent 10 of 1024"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn forged_store_copies_are_never_served_whatever_the_range_and_are_quarantined_until_they_change() {
        let (_logging, logs) = capture_logs();
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let corrupt = || cache.counters().corrupt.load(Ordering::Relaxed);
        let rotten = |bytes: &[u8], at: u64| {
            let mut rotten = bytes.to_vec();
            rotten[at as usize] ^= 0x5a;
            rotten
        };
        let size = 4 * SLICE + 100;
        let bytes = blob_bytes(size, 7);
        let sha = fake.put(&bytes);
        // The last slice forged, the rest sound.
        fake.put_as(&sha, &rotten(&bytes, size - 2));

        // A whole read: the sound slices are sent, then it ends where the forged one would start.
        let blob = cache.open_for(&sha, size, &[(0, size)]).await.unwrap();
        let (sent, error) = send(&blob, 0, size).await;
        let error = error.unwrap().to_string();
        assert!(error.contains("not what was uploaded") || error.contains("quarantined"), "{error}");
        assert!(sent.len() as u64 <= 4 * SLICE && sent == bytes[..sent.len()], "{} bytes sent", sent.len());
        drop(blob);
        assert_eq!(corrupt(), 1);
        assert!(cache.is_quarantined(&sha));
        assert_eq!(cache.counters().quarantined.load(Ordering::Relaxed), 1);

        // Every shape of read is refused before its head, and nothing is fetched again while it is quarantined:
        // a resume from mid-blob, a suffix, a range within the sound slices, a multi-range, a copy's source.
        let fetched = fake.fetch_count();
        for regions in
            [vec![(SLICE + 5, size - SLICE - 5)], vec![(size - 1000, 1000)], vec![(0, 10)], vec![(0, 1), (size - 1, 1)]]
        {
            let error = cache.open_for(&sha, size, &regions).await.unwrap_err();
            assert!(error.to_string().contains("is quarantined"), "{regions:?}: {error}");
        }
        assert!(cache.fill_range(&sha, size, 0, size).await.unwrap_err().to_string().contains("quarantined"));
        assert_eq!(fake.fetch_count(), fetched, "no fetch in a loop");
        let (_, asks) = fake.manifest_and_version_asks();
        assert_eq!(asks, 1, "the quarantined copy's version, once");

        // Past the recheck period a read asks the store (once) whether its copy changed: it did not.
        tokio::time::sleep(DEFAULT_QUARANTINE_RECHECK).await;
        assert!(cache.open_for(&sha, size, &[(0, 10)]).await.is_err());
        until("the version is asked again", || fake.manifest_and_version_asks().1 == 2).await;
        assert!(cache.open_for(&sha, size, &[(0, 10)]).await.is_err());
        assert_eq!(fake.manifest_and_version_asks().1, 2);
        assert_eq!(fake.fetch_count(), fetched);

        // Repaired in the store: at the next recheck the quarantine lifts, and the blob is served whole, checked.
        fake.put(&bytes);
        tokio::time::sleep(DEFAULT_QUARANTINE_RECHECK).await;
        assert!(cache.open_for(&sha, size, &[(0, 10)]).await.is_err());
        until("the quarantine lifts", || !cache.is_quarantined(&sha)).await;
        assert_eq!(get(&cache, &sha, size, 0, size).await.unwrap(), bytes);
        assert_eq!(cache.counters().quarantined.load(Ordering::Relaxed), 0);

        // A forged first slice: a suffix range alone is sound and served; a read of the first slice is refused.
        let early = blob_bytes(3 * SLICE, 8);
        let early_sha = fake.put(&early);
        fake.put_as(&early_sha, &rotten(&early, 3));
        let suffix = get(&cache, &early_sha, 3 * SLICE, 2 * SLICE, SLICE).await.unwrap();
        assert_eq!(suffix, span(&early, 2 * SLICE, SLICE), "a sound slice of a forged copy is the uploaded bytes");
        let error = get(&cache, &early_sha, 3 * SLICE, 0, 3 * SLICE).await.unwrap_err();
        assert!(error.starts_with("before the head"), "{error}");
        assert_eq!(corrupt(), 2);

        // A forged manifest (sealed with another key) quarantines its blob too.
        let other = blob_bytes(SLICE, 9);
        let other_sha = fake.put(&other);
        fake.forge_manifest(&other_sha, &other);
        let error = get(&cache, &other_sha, SLICE, 0, SLICE).await.unwrap_err();
        assert!(error.contains("not sealed with this server's key"), "{error}");
        assert_eq!(corrupt(), 3);

        let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
        let lines: Vec<_> = logs.lines().filter(|l| l.contains("not what was uploaded; quarantined")).collect();
        assert_eq!(lines.len(), 3, "one error line per quarantine:\n{logs}");
        assert!(lines[0].contains(&sha) && lines[1].contains(&early_sha) && lines[2].contains(&other_sha), "{logs}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_blob_without_a_manifest_is_checked_whole_before_any_byte_is_read() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let size = 3 * SLICE + 10;
        let bytes = blob_bytes(size, 20);
        let sha = fake.put_without_manifest(&bytes);
        // A small range of a sound blob: the whole blob is fetched (in one range) and hashed first. The slice was
        // asked for while the manifest was looked for (a cold entry's first fill does both at once); unbooked.
        assert_eq!(get(&cache, &sha, size, SLICE, 10).await.unwrap(), span(&bytes, SLICE, 10));
        assert_eq!(fake.fetches(), [(sha.clone(), slice(1, size)), (sha.clone(), 0..size)]);
        until_settled(&cache, &sha, 0).await;
        assert_eq!(cached_bytes(&cache), size);

        // A rotten one: not one byte, whatever the range; quarantined.
        let rotten_bytes = blob_bytes(size, 21);
        let rotten = fake.put_without_manifest(&rotten_bytes);
        let mut forged = rotten_bytes.clone();
        forged[size as usize - 1] ^= 1;
        fake.put_as(&rotten, &forged);
        for (offset, len) in [(0, 10), (SLICE, SLICE)] {
            let error = get(&cache, &rotten, size, offset, len).await.unwrap_err();
            assert!(error.starts_with("before the head"), "{error}");
        }
        assert!(cache.is_quarantined(&rotten));
        assert_eq!(cache.counters().corrupt.load(Ordering::Relaxed), 1);
        assert_eq!(fake.fetches_of(&rotten, 0..size), 1, "{:?}", fake.fetches());
        until("nothing of it stays reserved", || cached_bytes(&cache) == size).await;

        // Larger than the cache can check whole: refused, naming the fix.
        let small = faked(&dir.path().join("small"), 2 * SLICE, &fake).await;
        let error = get(&small, &sha, size, 0, 10).await.unwrap_err();
        assert!(error.contains("blobs migrate"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn each_chunk_of_a_slice_is_sent_once_it_has_arrived_and_matched() {
        use crate::store::remote::fake::CHUNK;
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let size = 2 * SLICE;
        let bytes = blob_bytes(size, 23);
        let sha = fake.put(&bytes);
        // Two chunks and a bit of the first slice arrive, then the store pauses.
        let gate = Gate::default();
        fake.script_for(&sha, slice(0, size), vec![Step::Write(2 * CHUNK + 10), Step::Hold(gate.clone())]);
        let blob = cache.open_for(&sha, size, &[(0, size)]).await.unwrap();
        let fill = blob.gate.as_ref().unwrap();
        assert_eq!(fill.ready(0, size), 2 * CHUNK, "the checked chunks, not the bytes past them");
        assert_eq!(fill.ready(CHUNK + 5, 10), 10);
        assert_eq!(fill.ready(2 * CHUNK, 10), 0);
        let mut sent = vec![0; 2 * CHUNK as usize];
        blob.file.read_exact_at(&mut sent, 0).unwrap();
        assert_eq!(sent, span(&bytes, 0, 2 * CHUNK));
        gate.open();
        assert_eq!(send(&blob, 0, size).await.0, bytes);

        // A forged chunk mid-slice: what was checked before it may have been sent; the rest never is.
        let other = blob_bytes(size, 24);
        let other_sha = fake.put(&other);
        let mut forged = other.clone();
        forged[(3 * CHUNK + 1) as usize] ^= 1;
        fake.put_as(&other_sha, &forged);
        let blob = cache.open_for(&other_sha, size, &[(0, size)]).await.unwrap();
        let (sent, error) = send(&blob, 0, size).await;
        assert!(error.is_some() && sent.len() as u64 <= 3 * CHUNK, "{} bytes sent", sent.len());
        assert_eq!(sent, span(&other, 0, sent.len() as u64));
        assert!(cache.is_quarantined(&other_sha));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fill_that_panics_releases_its_slice_and_the_next_read_fetches_it_again() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let size = 2 * SLICE;
        let bytes = blob_bytes(size, 22);
        let sha = fake.put(&bytes);
        fake.script_for(&sha, slice(0, size), vec![Step::Write(10), Step::Panic]);
        let error = get(&cache, &sha, size, 0, size).await.unwrap_err();
        assert!(error.contains("panicked"), "{error}");
        assert_eq!(cached_bytes(&cache), 0);
        assert!(cache.0.lock().entries[&sha].filling.is_empty(), "nothing poisoned");
        assert_eq!(get(&cache, &sha, size, 0, size).await.unwrap(), bytes);
        assert_eq!(fake.fetches_of(&sha, slice(0, size)), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_copys_source_is_filled_in_whole_and_never_from_a_rotten_copy() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let size = 5 * SLICE;
        let bytes = blob_bytes(size, 9);
        let sha = fake.put(&bytes);
        let file = cache.fill_range(&sha, size, SLICE + 5, 2 * SLICE).await.unwrap();
        let mut copied = vec![0; 2 * SLICE as usize];
        file.read_exact_at(&mut copied, SLICE + 5).unwrap();
        assert_eq!(copied, span(&bytes, SLICE + 5, 2 * SLICE));
        let fetched: Vec<_> = fake.fetches().into_iter().map(|(_, range)| range).collect();
        assert_eq!(fetched, [slice(1, size), slice(2, size), slice(3, size)]);

        // Rotten in the middle of the range: the copy fails; one before the range does not touch it.
        let sound = blob_bytes(size, 10);
        let sha = fake.put(&sound);
        let mut rotten = sound.clone();
        rotten[(2 * SLICE + 7) as usize] ^= 1;
        fake.put_as(&sha, &rotten);
        let error = cache.fill_range(&sha, size, SLICE, 3 * SLICE).await.unwrap_err();
        assert!(error.to_string().contains("not what was uploaded"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_sends_what_has_arrived_and_fetches_a_few_slices_ahead_within_the_region() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let size = 8 * SLICE;
        let bytes = blob_bytes(size, 11);
        let sha = fake.put(&bytes);
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let gates: Vec<Gate> = (1..=3)
            .map(|n| {
                let gate = Gate::default();
                fake.script_for(&sha, slice(n, size), vec![Step::Hold(gate.clone())]);
                gate
            })
            .collect();
        let blob = cache.open_for(&sha, size, &[(0, size)]).await.unwrap();
        let gate = blob.gate.as_ref().unwrap();
        // What arrived is the first slice; asking fetches the next `READAHEAD_SLICES` + 1 behind it.
        assert_eq!(gate.ready(0, size), SLICE);
        fake.started(4).await;
        let ranges = |fake: &FakeRemote| fake.fetches().into_iter().map(|(_, r)| r).collect::<Vec<_>>();
        assert_eq!(ranges(&fake), (0..4).map(|n| slice(n, size)).collect::<Vec<_>>());
        assert_eq!(gate.ready(SLICE, size - SLICE), 0);
        assert_eq!(fake.fetch_count(), 4, "slices in flight are not asked for again");

        // Slice 2 arrives before slice 1: nothing more can be sent from slice 1, two slices from slice 2.
        gates[1].open();
        gate.wait(2 * SLICE).await.unwrap();
        assert_eq!(gate.ready(SLICE, size - SLICE), 0);
        assert_eq!(gate.ready(2 * SLICE, SLICE), SLICE, "no further than asked");
        gates[0].open();
        gates[2].open();
        assert_eq!(send(&blob, 0, size).await.0, bytes);
        for n in 0..8 {
            assert_eq!(fake.fetches_of(&sha, slice(n, size)), 1, "slice {n}: {:?}", fake.fetches());
        }
        drop(blob);

        // A range fetches only the slices it covers, ahead or not.
        let other = blob_bytes(size, 12);
        let other_sha = fake.put(&other);
        let before = fake.fetch_count();
        let (offset, len) = (5 * SLICE + 10, 20);
        let blob = cache.open_for(&other_sha, size, &[(offset, len)]).await.unwrap();
        assert_eq!(blob.gate.as_ref().unwrap().ready(offset, len), len);
        let (offset, len) = (2 * SLICE, 2 * SLICE);
        assert_eq!(get(&cache, &other_sha, size, offset, len).await.unwrap(), span(&other, offset, len));
        assert_eq!(ranges(&fake)[before..], [slice(5, size), slice(2, size), slice(3, size)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_or_an_empty_read_fetches_nothing() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let size = 2 * SLICE;
        let sha = fake.put(&blob_bytes(size, 13));
        let blob = cache.open_for(&sha, size, &[]).await.unwrap();
        assert_eq!(blob.size, size);
        drop(cache.open_for(&sha, size, &[(5, 0)]).await.unwrap());
        let empty = fake.put(b"");
        let blob = cache.open_for(&empty, 0, &[(0, 0)]).await.unwrap();
        assert_eq!(blob.file.metadata().unwrap().len(), 0);
        assert_eq!(fake.fetch_count(), 0);
        assert_eq!(counts(&cache), (0, 0), "neither a hit nor a miss");
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_keeps_the_bound_and_spares_entries_being_sent_or_filled() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let max = 4 * SLICE;
        let cache = faked(dir.path(), max, &fake).await;
        let size = 2 * SLICE;
        let blobs: Vec<(String, Vec<u8>)> = (0..8)
            .map(|n| {
                let bytes = blob_bytes(size, 20 + n);
                (fake.put(&bytes), bytes)
            })
            .collect();
        let [a, b, c, d, e, f, g, h] = [0, 1, 2, 3, 4, 5, 6, 7].map(|n| blobs[n].0.as_str());
        let read = async |sha: &str| {
            let blob = cache.open_for(sha, size, &[(0, size)]).await.unwrap();
            let (sent, error) = send(&blob, 0, size).await;
            assert!(error.is_none() && sent == blobs.iter().find(|(s, _)| s == sha).unwrap().1);
            blob
        };

        drop(read(a).await);
        until_settled(&cache, a, 0).await;
        // b stays in use: a response is sending from it.
        let held_b = read(b).await;
        until_settled(&cache, b, 1).await;
        assert_eq!(cached_bytes(&cache), max);
        let a_path = path_of(&cache, a);

        // c's first slice goes over the bound: the least recently used entry goes, whole.
        drop(read(c).await);
        assert!(!cache.0.lock().entries.contains_key(a));
        assert_eq!(cached_bytes(&cache), max);
        until_gone(&a_path).await;
        until_settled(&cache, c, 0).await;
        // d: b is now the least recently used, but in use: c goes instead.
        drop(read(d).await);
        assert!(cache.holds_whole(b) && cache.holds_whole(d) && !cache.0.lock().entries.contains_key(c));
        assert_eq!(cached_bytes(&cache), max);
        until_settled(&cache, d, 0).await;

        // With every entry in use, the bound gives way: the cache holds what its responses send.
        let held_d = cache.open_for(d, size, &[(0, size)]).await.unwrap();
        let held_e = read(e).await;
        assert_eq!(cached_bytes(&cache), 6 * SLICE);
        until_settled(&cache, e, 1).await;
        drop((held_b, held_d, held_e));
        // The next fill brings it back within the bound.
        drop(read(f).await);
        assert!(cached_bytes(&cache) <= max, "{} bytes cached", cached_bytes(&cache));
        until_settled(&cache, f, 0).await;

        // An entry being filled is not evicted either, however old.
        let gate = Gate::default();
        fake.script_for(g, slice(0, size), vec![Step::Hold(gate.clone())]);
        let filling = tokio::spawn({
            let (cache, g) = (cache.clone(), g.to_owned());
            async move { get(&cache, &g, size, 0, size).await }
        });
        until("g's first slice is being fetched", || fake.fetches_of(g, slice(0, size)) == 1).await;
        drop(read(h).await);
        // h settled first: were it still settling when a's fill ends, a would be the one entry free to go.
        until_settled(&cache, h, 0).await;
        drop(read(a).await);
        assert!(cache.0.lock().entries.contains_key(g), "filling");
        gate.open();
        assert!(filling.await.unwrap().unwrap() == blobs[6].1);

        // a came back as a new entry: its evicted file's unlink did not take the new one.
        let new_a = path_of(&cache, a);
        assert_ne!(new_a.with_extension(""), a_path.with_extension(""));
        until_settled(&cache, a, 0).await;
        assert!(path_of(&cache, a).exists());
        assert!(cache.holds_whole(a));
    }

    #[tokio::test(start_paused = true)]
    async fn whole_blobs_filled_from_the_store_survive_a_restart_the_newest_within_the_bound() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let size = 2 * SLICE;
        let blobs: Vec<(String, Vec<u8>)> = (0..3)
            .map(|n| {
                let bytes = blob_bytes(size, 30 + n);
                (fake.put(&bytes), bytes)
            })
            .collect();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut paths = Vec::new();
        for (n, (sha, bytes)) in blobs.iter().enumerate() {
            assert!(get(&cache, sha, size, 0, size).await.unwrap() == *bytes);
            until_settled(&cache, sha, 0).await;
            let path = path_of(&cache, sha);
            // Filled in this order, but last used the other way round.
            let used = t0 + Duration::from_secs(3600 * (3 - n as u64));
            File::options().write(true).open(&path).unwrap().set_modified(used).unwrap();
            paths.push(path);
        }
        // A blob of which one slice arrived.
        let partial = blob_bytes(3 * SLICE, 33);
        let partial_sha = fake.put(&partial);
        get(&cache, &partial_sha, 3 * SLICE, 0, 10).await.unwrap();
        let partial_path = path_of(&cache, &partial_sha);
        drop(cache);

        // A store that has nothing: what is read must come from the cache.
        let empty = FakeRemote::new();
        let cache = faked(dir.path(), 2 * size, &empty).await;
        assert!(!cache.holds_whole(&blobs[2].0), "the oldest goes beyond the bound");
        until_gone(&paths[2]).await;
        until_gone(&partial_path).await;
        for (sha, bytes) in &blobs[..2] {
            assert!(cache.holds_whole(sha));
            assert!(get(&cache, sha, size, 0, size).await.unwrap() == *bytes);
        }
        assert_eq!(empty.fetch_count(), 0);
        assert_eq!(counts(&cache), (2, 0));
        assert_eq!(cached_bytes(&cache), 2 * size);
    }

    #[tokio::test(start_paused = true)]
    async fn forget_drops_an_entry_but_not_from_under_a_response() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let size = 2 * SLICE + 1;
        let bytes = blob_bytes(size, 40);
        let sha = fake.put(&bytes);
        let held = cache.open_for(&sha, size, &[(0, size)]).await.unwrap();
        cache.forget(&sha);
        assert_eq!(send(&held, 0, size).await.0, bytes, "a response sending from it goes on");
        until_settled(&cache, &sha, 1).await;
        let path = path_of(&cache, &sha);
        drop(held);
        cache.forget(&sha);
        assert!(!cache.holds_whole(&sha));
        assert_eq!(cached_bytes(&cache), 0);
        until_gone(&path).await;
        assert_eq!(get(&cache, &sha, size, 0, size).await.unwrap(), bytes);
        assert_eq!(fake.fetches_of(&sha, slice(0, size)), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn files_beyond_the_open_file_limit_are_closed_and_reopened_when_read() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await.with_max_open_files(1);
        let size = SLICE + 1;
        let (a, b) = (blob_bytes(size, 41), blob_bytes(size, 42));
        let (a_sha, b_sha) = (fake.put(&a), fake.put(&b));
        assert_eq!(get(&cache, &a_sha, size, 0, size).await.unwrap(), a);
        until_settled(&cache, &a_sha, 0).await;
        assert_eq!(get(&cache, &b_sha, size, 0, size).await.unwrap(), b);
        assert!(cache.0.lock().entries[&a_sha].file.is_none(), "the least recently used file is closed");
        assert_eq!(cache.0.lock().open_files, 1);
        until_settled(&cache, &b_sha, 0).await;
        // Reopened by its whole file's name, and a hit.
        let blob = cache.open_for(&a_sha, size, &[(0, size)]).await.unwrap();
        assert!(blob.gate.is_none());
        assert_eq!(send(&blob, 0, size).await.0, a);
        assert_eq!(fake.fetch_count(), 4);
        assert!(cache.0.lock().entries[&b_sha].file.is_none());
        assert_eq!(cache.0.lock().open_files, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_row_of_another_size_than_the_cached_blob_is_refused() {
        let (dir, fake) = (tempfile::tempdir().unwrap(), FakeRemote::new());
        let cache = faked(dir.path(), 1 << 20, &fake).await;
        let bytes = blob_bytes(100, 43);
        let sha = fake.put(&bytes);
        assert_eq!(get(&cache, &sha, 100, 0, 100).await.unwrap(), bytes);
        let error = cache.open_for(&sha, 101, &[(0, 101)]).await.unwrap_err();
        assert!(matches!(error, CacheError::Local(_)) && error.to_string().contains("another size"), "{error}");
    }
}
