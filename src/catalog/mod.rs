//! In-memory caches of what the data path reads for every request (buckets, objects with their prepared headers,
//! tokens, signing keys, revoked signatures, S3 access keys) and of open blob files, kept coherent with the database.
//!
//! **Coherence.** Every change to those tables, whoever makes it, reaches the metadata's change feed
//! (`store::ChangeFeed`). Before serving from a cache, a request compares the feed's counter with the value the
//! caches were last synchronised at (`feed.current()`, one atomic load); if it moved, the changes since the last
//! applied one are read and exactly the affected entries are evicted. On SQLite the counter is shared by every
//! process on the data dir, so a token revoked by the CLI is refused by the very next request. On PostgreSQL it
//! counts this process's own commits only (it reads its own writes at once); other processes' commits arrive
//! through the feed's watcher, which tells [`Catalog::keep_synced`] to look, and it applies them in the
//! background, so requests never wait on the database for them. `keep_synced` also syncs once a second, for
//! writers that do not announce their commits (someone with the sqlite3 shell). A failed sync never fails a
//! request the caches can answer.
//!
//! **Bounded staleness.** A replica cut off from the database (a network partition, while the CLI and other
//! replicas still reach it) cannot learn of a revocation. So every successful sync notes when it started, a
//! watchdog ([`Catalog::keep_synced`] runs it beside the syncs) compares that with the clock four times a second,
//! and once the caches are older than `database.max_staleness` every lookup a missed change could make wrong
//! fails as [`MetadataError::Stale`] (503): credentials of every kind, and any bucket but a cached public one.
//! Past `database.public_max_staleness` the public buckets and all objects fail too, so the open-file cache never
//! serves a blob whose deletion may have been missed beyond that window. The first sync that succeeds lifts it.
//! Requests pay one relaxed atomic load per lookup for this.
//!
//! **Races.** A miss reads the database and inserts the result. If a change lands between that read and the
//! insert, the insert could resurrect stale data; so the reader notes the feed's counter and the sync epoch before
//! reading, and removes what it inserted if either moved. Syncs bump the epoch before they evict.
//!
//! **Open blobs.** Blobs are immutable, so an open fd and its `fstat` size can be reused by every request for
//! that content: no `open`/`fstat` and no blocking-pool hop on a hit. Entries are dropped when an object that
//! used them changes, and the cache is bounded. A response takes its blob from [`Catalog::response_blob`], the one
//! source for both places blobs live: these open files, or an object store's cache (which keeps its own).
//!
//! The catalog is the server's `auth::CredentialLookup`. Every lookup is a [`Lookup`]: a hit is answered at once,
//! a miss is a boxed trip, so a request's future holds no miss path's state. An object's miss on SQLite is answered
//! at once too: read on the request's thread (`Metadata::object_with_bucket_default_now`), no hop, no await.
//!
//! **Memory.** The object cache is bounded in bytes (`cache.metadata_bytes`), each entry weighed by what it holds
//! ([`ObjectEntry::heap_bytes`]), so a catalog of millions of objects read at random costs its bound, not its
//! size.

pub mod representation;

use std::fs::File;
use std::future::{Future, Ready};
use std::hash::{Hash, Hasher};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::Either;
use quick_cache::Equivalent;
use quick_cache::sync::Cache;

use crate::auth::CredentialLookup;
use crate::file_body::{FillGate, Segment};
use crate::store::{
    BlobCache, BlobStore, Bucket, CacheChange, CacheError, Catchup, ChangeFeed, ChangeKind, Metadata, MetadataError,
    S3KeyRecord, SigningKey, TokenRecord,
};
use crate::throttle::state::LimitTable;
use representation::ObjectEntry;

/// What a cached lookup returns: the answer at once on a hit, or the boxed trip to the database (or the feed's
/// catch-up) that a miss takes. A request's future holds each lookup it awaits, and the driver moves that future
/// once per request: a hit then costs the answer's few words, not the miss path's state.
pub type Lookup<'a, T> = Either<Ready<T>, Pin<Box<dyn Future<Output = T> + Send + 'a>>>;

fn answered<'a, T>(value: T) -> Lookup<'a, T> {
    Either::Left(std::future::ready(value))
}

/// A lookup's answer now if it has one, else its trip to await: a caller that matches on this holds no awaited
/// future for a hit.
pub fn at_once<T>(lookup: Lookup<'_, T>) -> Result<T, Pin<Box<dyn Future<Output = T> + Send + '_>>> {
    match lookup {
        Either::Left(answer) => Ok(answer.into_inner()),
        Either::Right(trip) => Err(trip),
    }
}

fn looked_up<'a, T>(trip: impl Future<Output = T> + Send + 'a) -> Lookup<'a, T> {
    Either::Right(Box::pin(trip))
}

/// Capacities: generous for metadata (a few hundred bytes each), bounded for fds by the process limit.
const BUCKETS: usize = 10_000;
/// The object cache's bound in bytes unless told (`cache.metadata_bytes`'s default).
const OBJECT_BYTES: u64 = 128 << 20;
/// Bytes a cached object costs beyond its entry's own: the cache's slot (key, value, hash and state), its share of
/// the hash table (which grows by doubling) and of the ghosts (CLOCK-PRO remembers recently evicted keys' hashes),
/// the entry's `Arc` pointer. Measured: 10^6 inserts of such keys into quick_cache 0.7, then 10^6 more evicting
/// them, took 82 bytes a key after the first million and 110 after the second (keys' own allocations apart).
const OBJECT_SLOT_BYTES: u64 = 160;
const TOKENS: usize = 50_000;
const SIGNING_KEYS: usize = 1_000;
const REVOKED: usize = 50_000;
const S3_KEYS: usize = 50_000;
/// Unknown access key ids, cached apart from the keys so that a flood of made-up ids evicts only other misses.
const S3_KEY_MISSES: usize = 4_096;

/// Objects by (bucket id, key), and the keys found missing, bounded by what they hold in bytes.
type ObjectCache = Cache<(i64, Arc<str>), Option<Arc<ObjectEntry>>, ObjectWeight>;

/// An object cache bounded at `bytes`. quick_cache's admission (CLOCK-PRO, with a ghost list of recent
/// evictions) takes a key read once into a small probation area, so one scan of many keys read once passes
/// through it and leaves the keys read again and again in place.
fn object_cache(bytes: u64) -> ObjectCache {
    // An object with a short key and no rare attributes weighs some 800 bytes with its slot.
    let typical = 800;
    Cache::with_weighter(usize::try_from(bytes / typical).unwrap_or(usize::MAX).max(16), bytes, ObjectWeight)
}

/// The cache entry of what a miss read: the object, its bucket's default Cache-Control and its variants.
fn cached_entry(
    (record, default, variants): (crate::store::ObjectRecord, Option<String>, Vec<crate::store::VariantRecord>),
) -> Arc<ObjectEntry> {
    Arc::new(ObjectEntry::new(record, default.as_deref()).with_variants(variants))
}

/// The object cache's key for what a miss of `key` read: the key its entry holds (one copy for both), or a new one
/// for a key found missing.
fn object_cache_key(bucket_id: i64, key: &str, found: &Option<Arc<ObjectEntry>>) -> (i64, Arc<str>) {
    (bucket_id, found.as_ref().map_or_else(|| Arc::from(key), |entry| entry.object_ref.key.clone()))
}

/// What an object cache entry holds in bytes: its [`ObjectEntry::weight`] and its key's.
#[derive(Debug, Clone, Copy)]
struct ObjectWeight;

impl quick_cache::Weighter<(i64, Arc<str>), Option<Arc<ObjectEntry>>> for ObjectWeight {
    fn weight(&self, key: &(i64, Arc<str>), entry: &Option<Arc<ObjectEntry>>) -> u64 {
        // A found entry's weight counts the key, which it shares with the cache's; a missing key's is its own.
        let key_bytes = 2 * std::mem::size_of::<usize>() as u64 + 32 + key.1.len() as u64;
        OBJECT_SLOT_BYTES + entry.as_ref().map_or(key_bytes, |e| u64::from(e.weight))
    }
}

static NEXT_CATALOG_ID: AtomicU64 = AtomicU64::new(0);

/// The table of limits a worker thread last read, with the catalog and the limits epoch it was read at.
#[derive(Debug, Default)]
struct SeenLimits {
    catalog: u64,
    epoch: u64,
    table: Option<Arc<LimitTable>>,
}

impl SeenLimits {
    /// The table seen for `catalog` at `epoch` (`Some(None)`: no limit at all), or `None` when it must be read.
    fn table(&self, catalog: u64, epoch: u64) -> Option<Option<Arc<LimitTable>>> {
        (self.catalog == catalog && self.epoch == epoch && self.epoch != u64::MAX).then(|| self.table.clone())
    }
}

thread_local! {
    static SEEN_LIMITS: std::cell::RefCell<SeenLimits> =
        const { std::cell::RefCell::new(SeenLimits { catalog: 0, epoch: u64::MAX, table: None }) };
}

/// How often the background sync runs when nothing asked it to look.
const SYNC_TICK: Duration = Duration::from_secs(1);
/// A background sync that has not finished by then is given up (a partition can leave a query hanging until
/// TCP gives up, minutes later); the next round tries again.
const SYNC_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the staleness watchdog compares the last sync with the clock.
const STALENESS_CHECK: Duration = Duration::from_millis(250);

/// How long the caches may go without a successful sync (`database.max_staleness`,
/// `database.public_max_staleness`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StalenessBounds {
    /// Past this, credentials and private (or unknown) buckets are refused.
    pub credentials: Duration,
    /// Past this (and never before `credentials`), everything is refused.
    pub public: Duration,
}

impl Default for StalenessBounds {
    fn default() -> Self {
        let settings = crate::config::DatabaseSettings::default();
        Self { credentials: settings.max_staleness, public: settings.public_max_staleness }
    }
}

impl StalenessBounds {
    /// What caches last synced `age` ago may still answer. Pure.
    pub fn freshness(&self, age: Duration) -> Freshness {
        if age > self.credentials.max(self.public) {
            Freshness::Expired
        } else if age > self.credentials {
            Freshness::PublicOnly
        } else {
            Freshness::Fresh
        }
    }
}

/// What the caches may answer, by the age of their last successful sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Freshness {
    /// Everything.
    Fresh = 0,
    /// Cached public buckets and their objects, without credentials.
    PublicOnly = 1,
    /// Nothing.
    Expired = 2,
}

impl Freshness {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Freshness::Fresh,
            1 => Freshness::PublicOnly,
            _ => Freshness::Expired,
        }
    }
}

/// An open blob and its size from `fstat` on that same fd.
#[derive(Debug)]
pub struct OpenBlob {
    pub file: Arc<File>,
    pub size: u64,
}

/// The blob a response sends, from wherever this server keeps blobs ([`Catalog::response_blob`]), sized before
/// the response's regions are chosen.
#[derive(Debug)]
pub struct ResponseBlob<'a> {
    /// What the response's regions must lie within. In the data dir, the `fstat` size of the fd that will be sent
    /// (a file that shrinks later shows as a short sendfile, never a wrong length); in an object store's cache, the
    /// object row's size (the cache file is sparse until it fills, and what arrives is checked against the blob's
    /// name). A field, not a method: reading it borrows nothing, so a handler's future keeps no room for this value
    /// once `open_for` has taken it.
    pub size: u64,
    from: BlobSource<'a>,
}

#[derive(Debug)]
enum BlobSource<'a> {
    /// The data dir's blob, already open (from the open-blob cache).
    Local(Arc<OpenBlob>),
    /// An object store's blob: opened, and its first region fetched, by [`ResponseBlob::open_for`].
    Cached { cache: &'a BlobCache, sha256: &'a str },
}

/// A blob open for one response: the file its regions are sent from, the size that bounds them, and the gate the
/// driver sends through while the file fills (`None`: every region is in the file already).
pub struct BlobFile {
    pub file: Arc<File>,
    pub size: u64,
    pub fill: Option<Arc<dyn FillGate>>,
}

/// Why a response's blob cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// The data dir's blob is missing or unreadable.
    #[error(transparent)]
    DataDir(io::Error),
    /// From an object store's cache: its file failed, or the store cannot give the blob now.
    #[error(transparent)]
    Cache(#[from] CacheError),
}

impl<'a> ResponseBlob<'a> {
    fn local(blob: Arc<OpenBlob>) -> Self {
        Self { size: blob.size, from: BlobSource::Local(blob) }
    }

    /// The blob open for a response that sends `segments` (none for a HEAD, which fetches nothing): at once from
    /// the data dir; from an object store's cache, once the first region's first slice is there
    /// (`BlobCache::open_for`), boxed so that a data-dir response's future holds no room for that path.
    pub fn open_for(self, segments: &[Segment]) -> Lookup<'a, Result<BlobFile, BlobError>> {
        let size = self.size;
        match self.from {
            BlobSource::Local(blob) => answered(Ok(BlobFile { file: blob.file.clone(), size, fill: None })),
            BlobSource::Cached { cache, sha256 } => {
                let regions: Vec<(u64, u64)> = segments
                    .iter()
                    .filter_map(|s| match s {
                        Segment::Region { offset, len } => Some((*offset, *len)),
                        Segment::Literal(_) => None,
                    })
                    .collect();
                looked_up(async move {
                    let blob = cache.open_for(sha256, size, &regions).await?;
                    let fill = blob.gate.map(|gate| gate as Arc<dyn FillGate>);
                    Ok(BlobFile { file: blob.file, size: blob.size, fill })
                })
            }
        }
    }
}

/// Borrowed form of an object cache key, so lookups do not allocate. Hashes exactly like `(i64, String)`.
struct ObjectLookup<'a>(i64, &'a str);

impl Hash for ObjectLookup<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.0, self.1).hash(state);
    }
}

impl Equivalent<(i64, Arc<str>)> for ObjectLookup<'_> {
    fn equivalent(&self, key: &(i64, Arc<str>)) -> bool {
        self.0 == key.0 && self.1 == &*key.1
    }
}

pub struct Catalog {
    meta: Metadata,
    feed: ChangeFeed,
    blobs: BlobStore,
    /// The feed's counter value the caches were last synchronised at.
    synced: AtomicU64,
    /// Highest change sequence number applied.
    applied: AtomicI64,
    /// Bumped by every sync that evicts, before it evicts (see "Races").
    epoch: AtomicU64,
    /// One sync at a time; others wait and then find nothing left to do.
    sync_lock: tokio::sync::Mutex<()>,
    buckets: Cache<String, Option<Arc<Bucket>>>,
    objects: ObjectCache,
    tokens: Cache<String, Option<Arc<TokenRecord>>>,
    signing_keys: Cache<String, Option<Arc<SigningKey>>>,
    revoked: Cache<String, bool>,
    /// Known keys only; unknown ids go to `s3_key_misses`.
    s3_keys: Cache<String, Option<Arc<S3KeyRecord>>>,
    s3_key_misses: Cache<String, ()>,
    open_blobs: Cache<String, Arc<OpenBlob>>,
    /// Every limit on principals, reloaded whole when one changes (one entry); `last_limits` is what the last load
    /// read, answered while the database cannot be.
    limits: Cache<(), Arc<LimitTable>>,
    last_limits: std::sync::Mutex<Arc<LimitTable>>,
    /// Bumped by every sync that evicts the limits, before it does: while the caches are synced and it has not
    /// moved, a worker's own copy of the table ([`SEEN_LIMITS`]) is the table, found from three atomic loads.
    limits_epoch: AtomicU64,
    /// Tells this catalog's table apart in a thread's [`SEEN_LIMITS`] (tests run several catalogs in one process).
    id: u64,
    /// With an object store: its cache, which keeps its own open files (`open_blobs` stays empty).
    blob_cache: Option<BlobCache>,
    /// See "Bounded staleness": the windows, the clock's origin, when the last successful sync started
    /// (milliseconds since `origin`), and the watchdog's verdict (a [`Freshness`]). Tokio's clock, the one the
    /// watchdog's interval runs on, so a test with time paused moves both (read off the request path only).
    bounds: StalenessBounds,
    origin: tokio::time::Instant,
    synced_at_ms: AtomicU64,
    freshness: AtomicU8,
}

impl Catalog {
    /// Starts with empty caches at the current end of the change feed. `max_open_blobs` bounds cached fds.
    pub async fn new(meta: Metadata, blobs: BlobStore, max_open_blobs: usize) -> Result<Self, MetadataError> {
        let feed = meta.feed().clone();
        let synced = feed.current();
        let applied = feed.last_change().await?;
        Ok(Self {
            bounds: StalenessBounds::default(),
            origin: tokio::time::Instant::now(),
            // Reading the feed's end above was a sync of empty caches.
            synced_at_ms: AtomicU64::new(0),
            freshness: AtomicU8::new(Freshness::Fresh as u8),
            meta,
            feed,
            blobs,
            synced: AtomicU64::new(synced),
            applied: AtomicI64::new(applied),
            epoch: AtomicU64::new(0),
            sync_lock: tokio::sync::Mutex::new(()),
            buckets: Cache::new(BUCKETS),
            objects: object_cache(OBJECT_BYTES),
            tokens: Cache::new(TOKENS),
            signing_keys: Cache::new(SIGNING_KEYS),
            revoked: Cache::new(REVOKED),
            s3_keys: Cache::new(S3_KEYS),
            s3_key_misses: Cache::new(S3_KEY_MISSES),
            open_blobs: Cache::new(max_open_blobs.max(16)),
            limits: Cache::new(2),
            last_limits: Default::default(),
            limits_epoch: AtomicU64::new(0),
            id: NEXT_CATALOG_ID.fetch_add(1, Ordering::Relaxed),
            blob_cache: None,
        })
    }

    /// The object cache bounded at `bytes` (`cache.metadata_bytes`) instead of the default. Before first use.
    pub fn with_metadata_bytes(self, bytes: u64) -> Self {
        Self { objects: object_cache(bytes), ..self }
    }

    /// Blobs read through an object store's cache instead of from the data dir.
    pub fn with_blob_cache(self, blob_cache: Option<BlobCache>) -> Self {
        Self { blob_cache, ..self }
    }

    pub fn blob_cache(&self) -> Option<&BlobCache> {
        self.blob_cache.as_ref()
    }

    /// The blob `sha256` for a response, sized, from wherever this server keeps blobs: the data dir's, open (a hit
    /// in the open-blob cache, or opened off the event loop), or an object store's, named in its cache with
    /// `row_size`, the size its object row gives, and opened by [`ResponseBlob::open_for`] once the response knows
    /// its regions.
    pub fn response_blob<'a>(
        &'a self,
        sha256: &'a str,
        row_size: u64,
    ) -> Lookup<'a, Result<ResponseBlob<'a>, BlobError>> {
        match &self.blob_cache {
            Some(cache) => answered(Ok(ResponseBlob { size: row_size, from: BlobSource::Cached { cache, sha256 } })),
            None => match self.open_blobs.get(sha256) {
                Some(hit) => answered(Ok(ResponseBlob::local(hit))),
                None => looked_up(async move {
                    self.open_blob_from_disk(sha256).await.map(ResponseBlob::local).map_err(BlobError::DataDir)
                }),
            },
        }
    }

    /// The same catalog with other staleness windows (`database.max_staleness`, `database.public_max_staleness`).
    pub fn with_staleness_bounds(self, bounds: StalenessBounds) -> Self {
        Self { bounds, ..self }
    }

    /// A bucket by name. While the caches are stale, only a cached public bucket is answered (see "Bounded
    /// staleness"); anything else, present or absent, is [`MetadataError::Stale`].
    pub fn bucket<'a>(&'a self, name: &'a str) -> Lookup<'a, Result<Option<Arc<Bucket>>, MetadataError>> {
        match self.freshness() {
            Freshness::Fresh => {}
            Freshness::PublicOnly => {
                return answered(match self.buckets.get(name) {
                    Some(Some(bucket)) if bucket.public => Ok(Some(bucket)),
                    _ => Err(self.stale()),
                });
            }
            Freshness::Expired => return answered(Err(self.stale())),
        }
        if let Some(hit) = self.cached(&self.buckets, name) {
            return answered(Ok(hit));
        }
        looked_up(self.read_through(
            &self.buckets,
            name,
            |_| name.to_owned(),
            || async {
                match crate::names::BucketName::parse(name) {
                    Ok(n) => Ok(self.meta.bucket(&n).await?.map(Arc::new)),
                    Err(_) => Ok(None),
                }
            },
        ))
    }

    /// An object with its prepared headers. Past the public window nothing is answered: a deletion may have been
    /// missed (before it, only a public bucket's objects get here, since `bucket` refuses the others).
    pub fn object<'a>(
        &'a self,
        bucket_id: i64,
        key: &'a str,
    ) -> Lookup<'a, Result<Option<Arc<ObjectEntry>>, MetadataError>> {
        if self.freshness() == Freshness::Expired {
            return answered(Err(self.stale()));
        }
        if let Some(hit) = self.cached(&self.objects, &ObjectLookup(bucket_id, key)) {
            return answered(Ok(hit));
        }
        if let Some(found) = self.object_now(bucket_id, key) {
            return answered(Ok(found));
        }
        looked_up(async move {
            let lookup = ObjectLookup(bucket_id, key);
            self.read_through(
                &self.objects,
                &lookup,
                |found| object_cache_key(bucket_id, key, found),
                || async {
                    // The bucket's default is read with the object, not taken from a cached bucket that a
                    // concurrent change may already have replaced.
                    let found = self.meta.object_with_bucket_default(bucket_id, key).await?;
                    Ok(found.map(cached_entry))
                },
            )
            .await
        })
    }

    /// A miss read on this thread, as `read_through` reads one, when the backend can (SQLite) and the caches need
    /// no catch-up with the feed first; `None` sends the caller to the awaited path.
    fn object_now(&self, bucket_id: i64, key: &str) -> Option<Option<Arc<ObjectEntry>>> {
        if self.feed.current() != self.synced.load(Ordering::Acquire) {
            return None;
        }
        let stamp = self.stamp();
        let found = self.meta.object_with_bucket_default_now(bucket_id, key)?.map(cached_entry);
        self.insert_unless_moved(
            &self.objects,
            stamp,
            object_cache_key(bucket_id, key, &found),
            &ObjectLookup(bucket_id, key),
            &found,
        );
        Some(found)
    }

    pub fn token<'a>(&'a self, id: &'a str) -> Lookup<'a, Result<Option<Arc<TokenRecord>>, MetadataError>> {
        self.credential(&self.tokens, id, || async { Ok(self.meta.token(id).await?.map(Arc::new)) })
    }

    pub fn signing_key<'a>(&'a self, id: &'a str) -> Lookup<'a, Result<Option<Arc<SigningKey>>, MetadataError>> {
        self.credential(&self.signing_keys, id, || async { Ok(self.meta.signing_key(id).await?.map(Arc::new)) })
    }

    pub fn signature_revoked<'a>(&'a self, signature: &'a str) -> Lookup<'a, Result<bool, MetadataError>> {
        self.credential(&self.revoked, signature, || self.meta.signature_revoked(signature))
    }

    /// Every limit on principals. Never refused: while the database cannot be read, the table last read (a limit
    /// is not a credential, and an anonymous read of a public bucket must not fail for it).
    /// `None`: no limit at all.
    pub fn limits(&self) -> Lookup<'_, Option<Arc<LimitTable>>> {
        let epoch = self.limits_epoch.load(Ordering::Acquire);
        let synced = self.feed.current() == self.synced.load(Ordering::Acquire);
        if synced && let Some(seen) = SEEN_LIMITS.with_borrow(|seen| seen.table(self.id, epoch)) {
            return answered(seen);
        }
        let some = |table: Arc<LimitTable>| (!table.is_empty()).then_some(table);
        if let Some(hit) = self.cached(&self.limits, &()) {
            // Seen at `epoch`: a sync that evicts it bumps the epoch first, so a late store cannot hide a change.
            // The thread's own copy: its reference count is touched by this thread alone, request after request.
            let own = some(hit).map(|table| Arc::new(LimitTable::clone(&table)));
            SEEN_LIMITS.with_borrow_mut(|seen| *seen = SeenLimits { catalog: self.id, epoch, table: own.clone() });
            return answered(own);
        }
        looked_up(async move {
            let fetch = || async { Ok(Arc::new(LimitTable::new(self.meta.limits().await?))) };
            let table = match self.read_through(&self.limits, &(), |_| (), fetch).await {
                Ok(table) => {
                    *self.last_limits.lock().unwrap_or_else(|p| p.into_inner()) = table.clone();
                    table
                }
                Err(e) => {
                    tracing::warn!(error = %e, "limits not read; the last ones read apply");
                    self.last_limits.lock().unwrap_or_else(|p| p.into_inner()).clone()
                }
            };
            some(table)
        })
    }

    /// A credential-table lookup: refused while the caches are too stale for credentials, else a hit at once or
    /// the boxed `read_through`.
    fn credential<'a, V, Fut>(
        &'a self,
        cache: &'a Cache<String, V>,
        key: &'a str,
        fetch: impl FnOnce() -> Fut + Send + 'a,
    ) -> Lookup<'a, Result<V, MetadataError>>
    where
        V: Clone + Send + Sync + 'a,
        Fut: Future<Output = Result<V, MetadataError>> + Send + 'a,
    {
        if let Err(stale) = self.require_fresh() {
            return answered(Err(stale));
        }
        if let Some(hit) = self.cached(cache, key) {
            return answered(Ok(hit));
        }
        looked_up(self.read_through(cache, key, |_| key.to_owned(), fetch))
    }

    /// An S3 access key by id, its secret opened. An id not of our keys' shape is absent without a lookup; other
    /// unknown ids are cached as absent in their own bounded cache (`S3_KEY_MISSES`), so misses never evict known
    /// keys. Otherwise the protocol of `read_through`.
    pub fn s3_key<'a>(&'a self, id: &'a str) -> Lookup<'a, Result<Option<Arc<S3KeyRecord>>, MetadataError>> {
        // An id we could never have issued needs no lookup, nor a place in either cache.
        if !crate::auth::access_key::is_access_key_id(id) {
            return answered(Ok(None));
        }
        if let Err(stale) = self.require_fresh() {
            return answered(Err(stale));
        }
        if let Some(hit) = self.cached(&self.s3_keys, id) {
            return answered(Ok(hit));
        }
        if self.cached(&self.s3_key_misses, id).is_some() {
            return answered(Ok(None));
        }
        looked_up(async move {
            self.fresh().await;
            if let Some(hit) = self.s3_keys.get(id) {
                return Ok(hit);
            }
            if self.s3_key_misses.get(id).is_some() {
                return Ok(None);
            }
            self.s3_key_from_store(id).await
        })
    }

    async fn s3_key_from_store(&self, id: &str) -> Result<Option<Arc<S3KeyRecord>>, MetadataError> {
        let stamp = self.stamp();
        let found = self.meta.s3_key(id).await?.map(Arc::new);
        match &found {
            Some(_) => self.s3_keys.insert(id.to_owned(), found.clone()),
            None => self.s3_key_misses.insert(id.to_owned(), ()),
        }
        if self.stamp() != stamp {
            self.s3_keys.remove(id);
            self.s3_key_misses.remove(id);
        }
        Ok(found)
    }

    /// Every bucket, by name (a ListBuckets of a grant of every bucket), straight from the database: like
    /// listings, not cached.
    pub async fn list_buckets(&self) -> Result<Vec<Bucket>, MetadataError> {
        self.meta.list_buckets().await
    }

    /// One keyset page of a bucket's objects (S3 listings), straight from the database: listings are not cached,
    /// and each page is one index range read however deep it is.
    pub async fn list_objects_page(
        &self,
        bucket_id: i64,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<crate::store::ObjectRecord>, MetadataError> {
        self.meta.list_objects_page(bucket_id, prefix, after, limit).await
    }

    /// The same from the key `from`, inclusive (how a listing seeks past a common prefix).
    pub async fn list_objects_page_from(
        &self,
        bucket_id: i64,
        prefix: &str,
        from: &str,
        limit: u32,
    ) -> Result<Vec<crate::store::ObjectRecord>, MetadataError> {
        self.meta.list_objects_page_from(bucket_id, prefix, from, limit).await
    }

    /// A hit that needs no catch-up with the change feed first: what a request runs, with no await.
    fn cached<K, Q, V, W>(&self, cache: &Cache<K, V, W>, lookup: &Q) -> Option<V>
    where
        K: Eq + Hash + Clone,
        Q: Hash + Equivalent<K> + ?Sized,
        V: Clone,
        W: quick_cache::Weighter<K, V> + Clone,
    {
        if self.feed.current() == self.synced.load(Ordering::Acquire) { cache.get(lookup) } else { None }
    }

    /// The one cache protocol, shared by every cached table: catch up with the change feed if its counter
    /// moved, serve a hit, else read the database and insert, removing the insert again if a change landed
    /// meanwhile (see "Races" in the module doc). Callers try [`Catalog::cached`] first and box this.
    async fn read_through<K, Q, V, W, F, Fut>(
        &self,
        cache: &Cache<K, V, W>,
        lookup: &Q,
        owned_key: impl FnOnce(&V) -> K,
        fetch: F,
    ) -> Result<V, MetadataError>
    where
        K: Eq + Hash + Clone,
        Q: Hash + Equivalent<K> + ?Sized,
        V: Clone,
        W: quick_cache::Weighter<K, V> + Clone,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<V, MetadataError>>,
    {
        self.fresh().await;
        if let Some(hit) = cache.get(lookup) {
            return Ok(hit);
        }
        let stamp = self.stamp();
        let found = fetch().await?;
        self.insert_unless_moved(cache, stamp, owned_key(&found), lookup, &found);
        Ok(found)
    }

    /// Inserts what a miss read, and removes it again if a change landed since `stamp` was taken before the read
    /// (see "Races" in the module doc).
    fn insert_unless_moved<K, Q, V, W>(&self, cache: &Cache<K, V, W>, stamp: (u64, u64), key: K, lookup: &Q, found: &V)
    where
        K: Eq + Hash + Clone,
        Q: Hash + Equivalent<K> + ?Sized,
        V: Clone,
        W: quick_cache::Weighter<K, V> + Clone,
    {
        cache.insert(key, found.clone());
        if self.stamp() != stamp {
            cache.remove(lookup);
        }
    }

    /// The open blob for `sha256`, opening it (off the event loop) on a miss. Failures are never cached.
    pub fn open_blob<'a>(&'a self, sha256: &'a str) -> Lookup<'a, io::Result<Arc<OpenBlob>>> {
        match self.open_blobs.get(sha256) {
            Some(hit) => answered(Ok(hit)),
            None => looked_up(self.open_blob_from_disk(sha256)),
        }
    }

    async fn open_blob_from_disk(&self, sha256: &str) -> io::Result<Arc<OpenBlob>> {
        let blobs = self.blobs.clone();
        let sha = sha256.to_owned();
        let opened = tokio::task::spawn_blocking(move || -> io::Result<OpenBlob> {
            let file = blobs.open_blob(&sha)?;
            let size = file.metadata()?.len();
            Ok(OpenBlob { file: Arc::new(file), size })
        })
        .await
        .map_err(io::Error::other)??;
        let opened = Arc::new(opened);
        self.open_blobs.insert(sha256.to_owned(), opened.clone());
        Ok(opened)
    }

    /// Applies changes if the feed's counter moved since the last sync. A sync that fails (the database went
    /// away) does not fail the request: it is answered from the caches as they are, the counter is taken as seen
    /// so that later requests do not wait on the database again, and [`keep_synced`](Self::keep_synced) applies
    /// the changes once the database answers (the applied position did not move).
    async fn fresh(&self) {
        let generation = self.feed.current();
        if generation != self.synced.load(Ordering::Acquire)
            && let Err(e) = Box::pin(self.sync()).await
        {
            tracing::warn!(error = %e, "cache sync failed; serving from the caches until the database answers");
            self.synced.fetch_max(generation, Ordering::AcqRel);
        }
    }

    /// Reads the changes after the last applied one and evicts what they name; forgets everything when the log
    /// no longer holds them all.
    pub async fn sync(&self) -> Result<(), MetadataError> {
        let _one_at_a_time = self.sync_lock.lock().await;
        // Every commit before this instant is seen by the read below: what "synced at" means.
        let started = self.elapsed_ms();
        // Read the counter first: every commit it counts is then visible to the read below.
        let generation = self.feed.current();
        let applied = self.applied.load(Ordering::Acquire);
        match self.feed.changes_since(applied).await? {
            Catchup::Changes(changes) => {
                if let Some(last) = changes.last() {
                    self.epoch.fetch_add(1, Ordering::AcqRel);
                    for change in &changes {
                        self.evict(change);
                    }
                    self.applied.store(last.seq, Ordering::Release);
                }
            }
            Catchup::Missed { resume_at } => {
                tracing::warn!(
                    applied,
                    resume_at,
                    "the change log was pruned past this server's position; clearing all caches"
                );
                self.epoch.fetch_add(1, Ordering::AcqRel);
                self.clear();
                self.applied.store(resume_at, Ordering::Release);
            }
        }
        self.synced.store(generation, Ordering::Release);
        self.synced_at_ms.fetch_max(started, Ordering::AcqRel);
        // Caught up: serve again at once rather than at the watchdog's next look.
        if self.freshness() != Freshness::Fresh {
            self.check_staleness();
        }
        Ok(())
    }

    /// Keeps the caches synced in the background, for as long as it is polled: whenever the feed says to look
    /// (other replicas' commits, seen by the PostgreSQL watcher), and once a second for writers that announce
    /// nothing (someone with the sqlite3 shell). A failed sync is retried on the next round; requests go on
    /// being answered from the caches meanwhile, within the staleness windows, which a watchdog running beside
    /// the syncs enforces (see "Bounded staleness").
    pub async fn keep_synced(&self) {
        self.keep_synced_every(SYNC_TICK).await
    }

    /// [`keep_synced`](Self::keep_synced) with another tick: the tests use an hour, so that a sync after the first
    /// can only be the feed's doing.
    async fn keep_synced_every(&self, tick: Duration) {
        tokio::join!(self.sync_loop(tick), self.watch_staleness());
    }

    async fn sync_loop(&self, tick: Duration) {
        let mut looks = self.feed.subscribe();
        let mut tick = tokio::time::interval(tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                // Never `Err`: the sender lives in `self.feed`.
                _ = looks.changed() => {}
            }
            let synced = match tokio::time::timeout(SYNC_TIMEOUT, self.sync()).await {
                Ok(result) => result,
                Err(_) => Err(MetadataError::no_answer_within(SYNC_TIMEOUT)),
            };
            match synced {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("cache sync works again");
                }
                Ok(()) => {}
                // Once per outage at warn: the tick would repeat it every second.
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "cache sync failed; serving from the caches, retrying every second");
                }
                Err(e) => tracing::debug!(error = %e, "cache sync failed again"),
            }
        }
    }

    /// Every [`STALENESS_CHECK`], compares the last successful sync with the clock and publishes the verdict;
    /// independent of the syncs, so a sync that hangs cannot keep a stale cache serving.
    async fn watch_staleness(&self) {
        let mut tick = tokio::time::interval(STALENESS_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.check_staleness();
        }
    }

    /// Publishes what the caches may answer now, logging a change.
    fn check_staleness(&self) {
        let age = self.sync_age();
        let now = self.bounds.freshness(age);
        let before = Freshness::from_u8(self.freshness.swap(now as u8, Ordering::AcqRel));
        if now == before {
            return;
        }
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        match now {
            Freshness::Fresh => {
                tracing::info!(age_ms, "the caches are in sync with the database again; serving all requests")
            }
            Freshness::PublicOnly => tracing::warn!(
                age_ms,
                "the caches have not synced with the database within database.max_staleness: refusing credentials \
                 and private buckets (503) until they do, since a revocation may have been missed"
            ),
            Freshness::Expired => tracing::warn!(
                age_ms,
                "the caches have not synced with the database within database.max_staleness nor \
                 database.public_max_staleness: refusing every request (503) until they do"
            ),
        }
    }

    /// How long ago the last successful sync started.
    pub fn sync_age(&self) -> Duration {
        let synced = self.synced_at_ms.load(Ordering::Acquire);
        Duration::from_millis(self.elapsed_ms().saturating_sub(synced))
    }

    /// What the caches may answer, as the watchdog last judged.
    pub fn freshness(&self) -> Freshness {
        Freshness::from_u8(self.freshness.load(Ordering::Relaxed))
    }

    fn require_fresh(&self) -> Result<(), MetadataError> {
        if self.freshness() == Freshness::Fresh { Ok(()) } else { Err(self.stale()) }
    }

    #[cold]
    fn stale(&self) -> MetadataError {
        MetadataError::Stale { age: Duration::from_secs(self.sync_age().as_secs()) }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The applied change-feed position, for pruning.
    pub fn applied(&self) -> i64 {
        self.applied.load(Ordering::Acquire)
    }

    fn evict(&self, change: &CacheChange) {
        match (&change.kind, change.bucket_id) {
            (ChangeKind::Bucket, bucket_id) => {
                self.buckets.remove(change.name.as_str());
                // Cached objects carry headers from their bucket (its default Cache-Control). Rows logged before
                // migration 0006 have no id; bucket changes are rare, so then all objects go.
                match bucket_id {
                    Some(id) => self.objects.retain(|(object_bucket, _), _| *object_bucket != id),
                    None => self.objects.clear(),
                }
            }
            (ChangeKind::Object, Some(bucket_id)) => {
                let removed = self.objects.remove(&ObjectLookup(bucket_id, &change.name));
                // The old content's fd may belong to a blob that is now deleted: let it close.
                if let Some((_, Some(entry))) = removed {
                    self.open_blobs.remove(entry.sha256());
                    for v in entry.variants() {
                        self.open_blobs.remove(v.sha256.as_str());
                    }
                }
            }
            (ChangeKind::Token, _) => {
                self.tokens.remove(change.name.as_str());
            }
            (ChangeKind::SigningKey, _) => {
                self.signing_keys.remove(change.name.as_str());
            }
            (ChangeKind::RevokedSignature, _) => {
                self.revoked.remove(change.name.as_str());
            }
            (ChangeKind::S3Key, _) => {
                self.s3_keys.remove(change.name.as_str());
                self.s3_key_misses.remove(change.name.as_str());
            }
            (ChangeKind::Limit, _) => {
                self.limits_epoch.fetch_add(1, Ordering::AcqRel);
                self.limits.clear();
            }
            (kind, _) => {
                // An unknown kind comes from a newer schema: be safe and forget everything.
                tracing::warn!(kind = kind.as_str(), "unknown cache change kind; clearing all caches");
                self.clear();
            }
        }
    }

    fn clear(&self) {
        self.buckets.clear();
        self.objects.clear();
        self.tokens.clear();
        self.signing_keys.clear();
        self.revoked.clear();
        self.s3_keys.clear();
        self.s3_key_misses.clear();
        self.open_blobs.clear();
        self.limits_epoch.fetch_add(1, Ordering::AcqRel);
        self.limits.clear();
    }

    fn stamp(&self) -> (u64, u64) {
        (self.feed.current(), self.epoch.load(Ordering::Acquire))
    }
}

/// The authoriser's lookups, from the coherent caches.
impl CredentialLookup for Catalog {
    fn token<'a>(
        &'a self,
        id: &'a str,
    ) -> impl Future<Output = Result<Option<Arc<TokenRecord>>, MetadataError>> + Send + 'a {
        Catalog::token(self, id)
    }

    fn signing_key<'a>(
        &'a self,
        id: &'a str,
    ) -> impl Future<Output = Result<Option<Arc<SigningKey>>, MetadataError>> + Send + 'a {
        Catalog::signing_key(self, id)
    }

    fn signature_revoked<'a>(
        &'a self,
        signature: &'a str,
    ) -> impl Future<Output = Result<bool, MetadataError>> + Send + 'a {
        Catalog::signature_revoked(self, signature)
    }

    fn s3_key<'a>(
        &'a self,
        id: &'a str,
    ) -> impl Future<Output = Result<Option<Arc<S3KeyRecord>>, MetadataError>> + Send + 'a {
        Catalog::s3_key(self, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DatabaseUrl;
    use crate::names::{BucketName, ObjectAttrs, ObjectKey};
    use crate::store::metadata::{TestBackend, on_both_backends};
    use crate::store::{Rights, Scope, Store};

    async fn open_store(dir: &std::path::Path) -> Store {
        Store::open(dir, &DatabaseUrl::in_data_dir(dir), std::time::Duration::from_secs(5)).await.unwrap()
    }

    async fn setup() -> (tempfile::TempDir, Store, Catalog) {
        setup_on(TestBackend::Sqlite).await
    }

    async fn setup_on(backend: TestBackend) -> (tempfile::TempDir, Store, Catalog) {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::store::metadata::test_database_url(backend, dir.path()).await;
        let store = Store::open(dir.path(), &url, std::time::Duration::from_secs(5)).await.unwrap();
        store.meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let catalog = Catalog::new(store.meta.clone(), store.blobs.clone(), 64).await.unwrap();
        (dir, store, catalog)
    }

    /// A cached object as a lookup would make it: `key` in bucket 1.
    fn entry(key: &str) -> Option<Arc<ObjectEntry>> {
        let record = crate::store::ObjectRecord {
            bucket_id: 1,
            key: key.to_owned(),
            sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into(),
            size: 4096,
            attrs: ObjectAttrs::default(),
            created_at: 1_700_000_000,
            updated_at: 1_700_000_000,
            s3_etag: Some("\"d41d8cd98f00b204e9800998ecf8427e\"".into()),
            part_sizes: None,
            checksum: None,
        };
        Some(Arc::new(ObjectEntry::new(record, None)))
    }

    /// A lookup through `cache` as the catalog makes one: a hit, or a miss that inserts.
    fn read(cache: &ObjectCache, key: &str) -> bool {
        let hit = cache.get(&ObjectLookup(1, key)).is_some();
        if !hit {
            cache.insert((1, Arc::from(key)), entry(key));
        }
        hit
    }

    #[test]
    fn the_object_cache_holds_its_bound_in_bytes_whatever_it_is_fed() {
        let bound = 1 << 20;
        let cache = object_cache(bound);
        for i in 0..20_000 {
            read(&cache, &format!("builds/{i:07}/artifact.tar.gz"));
        }
        assert!(cache.weight() <= bound, "{} > {bound}", cache.weight());
        // Entries of about 2 KB as weighed: most of the bound in use, none over it.
        let weight = u64::from(entry("builds/0000000/artifact.tar.gz").unwrap().weight) + OBJECT_SLOT_BYTES;
        assert!(cache.len() as u64 >= bound / weight / 2, "{} entries of {weight} bytes", cache.len());
        // Allocator overhead and the cache slot counted in: still under half the ~5 KB of two header maps.
        assert!(weight < 2560, "{weight}");
    }

    #[test]
    fn one_scan_of_keys_read_once_leaves_the_keys_read_again_and_again_cached() {
        let cache = object_cache(1 << 20);
        let hot: Vec<String> = (0..150).map(|i| format!("hot/{i}")).collect();
        for _ in 0..3 {
            for key in &hot {
                read(&cache, key);
            }
        }
        // A listing-driven sync, a crawler: each key once, twenty times what the cache holds.
        for i in 0..20_000 {
            read(&cache, &format!("scan/{i}"));
            if i % 50 == 0 {
                // The hot set keeps being read meanwhile, as a CI fleet's common dependencies are.
                read(&cache, &hot[(i / 50) % hot.len()]);
            }
        }
        let hits = hot.iter().filter(|key| cache.get(&ObjectLookup(1, key.as_str())).is_some()).count();
        assert!(hits * 10 >= hot.len() * 9, "{hits} of {} hot keys still cached", hot.len());
    }

    fn default_cache_control(value: Option<&str>) -> crate::store::BucketChanges<'_> {
        crate::store::BucketChanges { default_cache_control: Some(value), ..Default::default() }
    }

    async fn put(store: &Store, key: &str, bytes: &[u8]) {
        let staged = store.blobs.stage_bytes(bytes);
        let b = BucketName::parse("bkt").unwrap();
        store.put(&b, &ObjectKey::parse(key).unwrap(), staged, ObjectAttrs::default()).await.unwrap();
    }

    #[tokio::test]
    async fn a_miss_on_sqlite_is_read_on_the_requests_thread_and_answered_without_awaiting() {
        let (_dir, store, catalog) = setup().await;
        let bucket = catalog.bucket("bkt").await.unwrap().expect("bucket");
        put(&store, "k", b"one").await;
        // The put's change is applied by the next lookup, which awaits; after it the caches are in step.
        let _ = catalog.object(bucket.id, "other").await.unwrap();
        for key in ["k", "absent"] {
            let answer = at_once(catalog.object(bucket.id, key)).unwrap_or_else(|_| panic!("{key}: a trip"));
            assert_eq!(answer.unwrap().map(|e| e.size), (key == "k").then_some(3), "{key}");
        }
        put(&store, "k", b"second").await;
        let changed = catalog.object(bucket.id, "k").await.unwrap().unwrap();
        assert_eq!(changed.size, 6, "the change evicted it and the next read saw it");
    }

    on_both_backends!(writes_are_seen_by_the_next_read);
    async fn writes_are_seen_by_the_next_read(backend: TestBackend) {
        let (_dir, store, catalog) = setup_on(backend).await;
        let bucket = catalog.bucket("bkt").await.unwrap().expect("bucket");
        assert!(catalog.object(bucket.id, "k").await.unwrap().is_none(), "absent objects are cached as absent");
        put(&store, "k", b"one").await;
        let first = catalog.object(bucket.id, "k").await.unwrap().expect("the insert evicted the negative entry");
        assert_eq!(first.size, 3);
        put(&store, "k", b"second").await;
        let second = catalog.object(bucket.id, "k").await.unwrap().unwrap();
        assert_eq!(second.size, 6, "a replaced object is re-read");
        store.delete(&BucketName::parse("bkt").unwrap(), &ObjectKey::parse("k").unwrap()).await.unwrap();
        assert!(catalog.object(bucket.id, "k").await.unwrap().is_none(), "a deleted object is gone");
    }

    on_both_backends!(variants_are_cached_with_their_object_and_follow_its_changes);
    async fn variants_are_cached_with_their_object_and_follow_its_changes(backend: TestBackend) {
        use crate::header_values::content_coding::ContentCoding;
        let (_dir, store, catalog) = setup_on(backend).await;
        let bucket = catalog.bucket("bkt").await.unwrap().expect("bucket");
        let stage = |bytes: &[u8]| store.blobs.stage_bytes(bytes);
        let (b, k) = (BucketName::parse("bkt").unwrap(), ObjectKey::parse("app.js").unwrap());
        let variants = vec![crate::store::StagedVariant { coding: ContentCoding::Br, blob: stage(b"br bytes") }];
        store.put_with_variants(&b, &k, stage(b"plain bytes"), ObjectAttrs::default(), variants).await.unwrap();
        let entry = catalog.object(bucket.id, "app.js").await.unwrap().unwrap();
        assert!(entry.available().br && !entry.available().gzip);
        let br = entry.variant(ContentCoding::Br).expect("the br variant");
        assert_ne!(br.etag.as_str(), &*entry.etag(), "each representation has its own ETag");
        assert_eq!(catalog.open_blob(&br.sha256).await.unwrap().size, 8);
        // Cached: the same entry until the object changes.
        assert!(Arc::ptr_eq(&entry, &catalog.object(bucket.id, "app.js").await.unwrap().unwrap()));
        put(&store, "app.js", b"plain bytes").await;
        let replaced = catalog.object(bucket.id, "app.js").await.unwrap().unwrap();
        assert!(!replaced.available().any(), "a plain put dropped the variants, and the change feed said so");
        assert!(replaced.variant(ContentCoding::Br).is_none());
    }

    on_both_backends!(the_s3_etag_is_cached_with_its_object_and_follows_its_changes);
    async fn the_s3_etag_is_cached_with_its_object_and_follows_its_changes(backend: TestBackend) {
        use md5::Digest;
        let (_dir, store, catalog) = setup_on(backend).await;
        let bucket = catalog.bucket("bkt").await.unwrap().expect("bucket");
        let md5_of = |bytes: &[u8]| format!("\"{}\"", hex::encode(md5::Md5::digest(bytes)));
        put(&store, "k", b"one").await;
        let entry = catalog.object(bucket.id, "k").await.unwrap().unwrap();
        assert_eq!(*entry.s3_etag(), md5_of(b"one"), "a put records its MD5");
        assert_ne!(*entry.s3_etag(), *entry.etag());
        // A multipart ETag for the same content (a Complete of the same bytes): the cached entry is evicted.
        let mut tx = store.meta.lock_blob_refs().await.unwrap();
        tx.set_s3_etag(bucket.id, "k", entry.sha256(), "\"abc-2\"", None, None).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(catalog.object(bucket.id, "k").await.unwrap().unwrap().s3_etag().to_string(), "\"abc-2\"");
        put(&store, "k", b"one").await;
        let entry = catalog.object(bucket.id, "k").await.unwrap().unwrap();
        assert_eq!(*entry.s3_etag(), md5_of(b"one"), "a single put's ETag is its MD5 again, as in S3");
        put(&store, "k", b"two").await;
        assert_eq!(catalog.object(bucket.id, "k").await.unwrap().unwrap().s3_etag().to_string(), md5_of(b"two"));
    }

    #[tokio::test]
    async fn a_bucket_default_reaches_cached_objects_at_once() {
        let (dir, store, catalog) = setup().await;
        put(&store, "k", b"bytes").await;
        let bucket = catalog.bucket("bkt").await.unwrap().unwrap();
        let cached = catalog.object(bucket.id, "k").await.unwrap().unwrap();
        assert_eq!(cached.fields(true, false).get(&http::header::CACHE_CONTROL), None);
        let other = open_store(dir.path()).await;
        let name = BucketName::parse("bkt").unwrap();
        other.meta.update_bucket(&name, default_cache_control(Some("max-age=9"))).await.unwrap();
        let entry = catalog.object(bucket.id, "k").await.unwrap().unwrap();
        assert_eq!(
            entry.fields(true, false).get(&http::header::CACHE_CONTROL),
            Some(&b"max-age=9"[..]),
            "the cached entry was evicted"
        );
        other.meta.update_bucket(&name, default_cache_control(None)).await.unwrap();
        let entry = catalog.object(bucket.id, "k").await.unwrap().unwrap();
        assert_eq!(entry.fields(true, false).get(&http::header::CACHE_CONTROL), None);
    }

    #[tokio::test]
    async fn revocation_by_another_connection_is_seen_at_once() {
        let (dir, store, catalog) = setup().await;
        let bucket = catalog.bucket("bkt").await.unwrap().unwrap();
        let token = TokenRecord {
            id: "0123456789ab".into(),
            secret_hash: vec![0; 32],
            rights: Rights::whole_bucket(bucket.id, "bkt", Scope::Read),
        };
        store.meta.create_token(&token).await.unwrap();
        assert!(catalog.token(&token.id).await.unwrap().unwrap().rights.revoked_at.is_none());
        // A second Store on the same data dir stands for the CLI in another process.
        let other = open_store(dir.path()).await;
        assert!(other.meta.revoke_token(&token.id, 5).await.unwrap());
        assert_eq!(catalog.token(&token.id).await.unwrap().unwrap().rights.revoked_at, Some(5));
    }

    #[tokio::test]
    async fn an_s3_key_revoked_by_another_connection_is_seen_at_once() {
        let (dir, store, catalog) = setup().await;
        let bucket = catalog.bucket("bkt").await.unwrap().unwrap();
        assert!(catalog.s3_key("AKBGAAAAAAAAAAAAAAAA").await.unwrap().is_none(), "unknown ids are cached as absent");
        let key = S3KeyRecord {
            id: "AKBGAAAAAAAAAAAAAAAA".into(),
            secret: "s".repeat(40),
            rights: Rights::whole_bucket(bucket.id, "bkt", Scope::Read),
        };
        store.meta.create_s3_key(&key).await.unwrap();
        let cached = catalog.s3_key(&key.id).await.unwrap().expect("the insert evicted the negative entry");
        assert_eq!(cached.secret, key.secret, "the secret opened");
        let other = open_store(dir.path()).await;
        assert!(other.meta.revoke_s3_key(&key.id, 7).await.unwrap());
        assert_eq!(catalog.s3_key(&key.id).await.unwrap().unwrap().rights.revoked_at, Some(7));
    }

    #[tokio::test]
    async fn unknown_access_key_ids_never_evict_known_keys() {
        let (_dir, store, catalog) = setup().await;
        let bucket = catalog.bucket("bkt").await.unwrap().unwrap();
        let key = S3KeyRecord {
            id: "AKBGKNOWNKNOWNKNOWN2".into(),
            secret: "s".repeat(40),
            rights: Rights::whole_bucket(bucket.id, "bkt", Scope::Read),
        };
        store.meta.create_s3_key(&key).await.unwrap();
        assert!(catalog.s3_key(&key.id).await.unwrap().is_some());
        for n in 0..S3_KEY_MISSES * 2 {
            // Base32 letters only: `n` in hex, with the digits 0-9 spelt A-J and a-f spelt K-P.
            let letters: String = format!("{n:012x}")
                .bytes()
                .map(|b| if b.is_ascii_digit() { (b - b'0' + b'A') as char } else { (b - b'a' + b'K') as char })
                .collect();
            assert!(catalog.s3_key(&format!("AKBGMISS{letters}")).await.unwrap().is_none());
        }
        assert_eq!(catalog.s3_keys.len(), 1, "misses are not cached with the keys");
        assert!(catalog.s3_keys.get(key.id.as_str()).is_some(), "the known key is still cached");
        assert!(catalog.s3_key_misses.len() <= S3_KEY_MISSES, "the miss cache is bounded");
        // Ids of another shape are not looked up or cached at all.
        catalog.s3_key_misses.clear();
        for junk in ["", "AKIAIOSFODNN7EXAMPLE", "AKBGaaaaaaaaaaaaaaaa", &"A".repeat(4000)] {
            assert!(catalog.s3_key(junk).await.unwrap().is_none(), "{junk}");
        }
        assert_eq!((catalog.s3_keys.len(), catalog.s3_key_misses.len()), (1, 0));
    }

    on_both_backends!(changes_without_a_bump_are_applied_by_an_explicit_sync);
    async fn changes_without_a_bump_are_applied_by_an_explicit_sync(backend: TestBackend) {
        let (_dir, store, catalog) = setup_on(backend).await;
        assert!(catalog.bucket("new-bucket").await.unwrap().is_none());
        store.meta.create_bucket(&BucketName::parse("new-bucket").unwrap(), true, 0).await.unwrap();
        // Pretend the writer did not bump (an old binary, or the sqlite3 shell): the counter looks unchanged.
        catalog.synced.store(store.meta.feed().current(), Ordering::Release);
        assert!(catalog.bucket("new-bucket").await.unwrap().is_none(), "stale until a sync");
        catalog.sync().await.unwrap();
        assert!(catalog.bucket("new-bucket").await.unwrap().is_some());
    }

    on_both_backends!(index_and_error_documents_reach_the_cached_bucket_through_the_change_log);
    /// The change log covers the index and error documents (migration 0017), so another writer's change reaches a
    /// server's cached bucket: shown here without the counter's help, by the log alone.
    async fn index_and_error_documents_reach_the_cached_bucket_through_the_change_log(backend: TestBackend) {
        use crate::names::{IndexDocument, Website};
        let (_dir, store, catalog) = setup_on(backend).await;
        assert_eq!(catalog.bucket("bkt").await.unwrap().unwrap().website, Website::NONE);
        let (index, error) = (IndexDocument::parse("index.html").unwrap(), ObjectKey::parse("404.html").unwrap());
        let set = crate::store::BucketChanges {
            index_document: Some(Some(&index)),
            error_document: Some(Some(&error)),
            ..Default::default()
        };
        store.meta.update_bucket(&BucketName::parse("bkt").unwrap(), set).await.unwrap();
        catalog.synced.store(store.meta.feed().current(), Ordering::Release);
        assert_eq!(catalog.bucket("bkt").await.unwrap().unwrap().website, Website::NONE, "stale until a sync");
        catalog.sync().await.unwrap();
        let website = catalog.bucket("bkt").await.unwrap().unwrap().website.clone();
        assert_eq!(website, Website { index_document: Some(index), error_document: Some(error) });
    }

    on_both_backends!(a_look_from_the_feed_syncs_in_the_background);
    async fn a_look_from_the_feed_syncs_in_the_background(backend: TestBackend) {
        let (_dir, store, catalog) = setup_on(backend).await;
        let mut catalog = catalog;
        // A second on the staleness clock, so that every sync from here on notes a start later than any before.
        catalog.origin -= Duration::from_secs(1);
        let catalog = Arc::new(catalog);
        assert!(catalog.bucket("new-bucket").await.unwrap().is_none());
        let synced_before = catalog.synced_at_ms.load(Ordering::Acquire);
        let follower = tokio::spawn({
            let catalog = catalog.clone();
            // No tick after the first: only the look can make the sync this test waits for.
            async move { catalog.keep_synced_every(Duration::from_secs(3600)).await }
        });
        // The round the follower starts with is the immediate tick; wait until its sync is done (it notes when it
        // started). The deadline bounds a hang only.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while catalog.synced_at_ms.load(Ordering::Acquire) == synced_before {
            assert!(std::time::Instant::now() < deadline, "the follower's first sync never finished");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        store.meta.create_bucket(&BucketName::parse("new-bucket").unwrap(), true, 0).await.unwrap();
        // As for another replica's commit: this process's counter did not move.
        catalog.synced.store(store.meta.feed().current(), Ordering::Release);
        let before = catalog.applied();
        store.meta.feed().look();
        // The deadline bounds a hang only: with no tick, any sync is the look's.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while catalog.applied() == before {
            assert!(std::time::Instant::now() < deadline, "the look was not acted on (and there is no tick)");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(catalog.bucket("new-bucket").await.unwrap().is_some(), "the negative entry was evicted");
        follower.abort();
    }

    on_both_backends!(a_failed_sync_does_not_fail_a_request_answered_from_the_caches);
    async fn a_failed_sync_does_not_fail_a_request_answered_from_the_caches(backend: TestBackend) {
        let (_dir, store, catalog) = setup_on(backend).await;
        let bucket = catalog.bucket("bkt").await.unwrap().unwrap();
        // Something committed, so the next read syncs first; then the database goes away.
        store.meta.create_bucket(&BucketName::parse("other").unwrap(), false, 0).await.unwrap();
        assert_ne!(catalog.synced.load(Ordering::Acquire), store.meta.feed().current());
        store.meta.close().await;
        let cached = catalog.bucket("bkt").await.expect("answered from the cache").unwrap();
        assert_eq!(cached.id, bucket.id);
        assert_eq!(catalog.synced.load(Ordering::Acquire), store.meta.feed().current(), "later reads do not retry");
        assert!(catalog.sync().await.is_err(), "the changes are still to be applied");
        assert!(catalog.bucket("never-cached").await.is_err(), "a miss needs the database");
    }

    #[test]
    fn staleness_windows_grade_what_the_caches_may_answer() {
        let secs = Duration::from_secs;
        let bounds = StalenessBounds { credentials: secs(30), public: secs(3600) };
        for (age, want) in [
            (secs(0), Freshness::Fresh),
            (secs(30), Freshness::Fresh),
            (secs(31), Freshness::PublicOnly),
            (secs(3600), Freshness::PublicOnly),
            (secs(3601), Freshness::Expired),
        ] {
            assert_eq!(bounds.freshness(age), want, "{age:?}");
        }
        // A public window below the credentials' one (`0s`) fails public objects with the rest, never before.
        let strict = StalenessBounds { credentials: secs(30), public: Duration::ZERO };
        assert_eq!(strict.freshness(secs(30)), Freshness::Fresh);
        assert_eq!(strict.freshness(secs(31)), Freshness::Expired);
        for v in 0..=3 {
            assert_eq!(Freshness::from_u8(v) as u8, v.min(2));
        }
    }

    /// The watchdog's bound, on tokio's paused clock: a verdict never comes before its window has passed, and
    /// always by one check after it (what a cut-off replica's log shows as the age when it turned).
    #[tokio::test]
    async fn the_watchdog_turns_within_one_check_after_each_window() {
        let (_dir, _store, catalog) = setup().await;
        let (credentials, public) = (Duration::from_secs(3), Duration::from_secs(8));
        let catalog = Arc::new(catalog.with_staleness_bounds(StalenessBounds { credentials, public }));
        // Only the watchdog runs from here on (no sync, no IO), so paused time moves only when this test sleeps.
        tokio::time::pause();
        let synced = tokio::time::Instant::now();
        catalog.synced_at_ms.store(catalog.elapsed_ms(), Ordering::Release);
        let watchdog = tokio::spawn({
            let catalog = catalog.clone();
            async move { catalog.watch_staleness().await }
        });
        let just = Duration::from_millis(1);
        for (at, want) in [
            (credentials, Freshness::Fresh),
            (credentials + STALENESS_CHECK + just, Freshness::PublicOnly),
            (public, Freshness::PublicOnly),
            (public + STALENESS_CHECK + just, Freshness::Expired),
        ] {
            tokio::time::sleep_until(synced + at).await;
            assert_eq!(catalog.freshness(), want, "{at:?} after the last sync");
        }
        watchdog.abort();
    }

    on_both_backends!(stale_caches_refuse_credentials_and_private_buckets_then_everything_until_a_sync);
    async fn stale_caches_refuse_credentials_and_private_buckets_then_everything_until_a_sync(backend: TestBackend) {
        let (_dir, store, catalog) = setup_on(backend).await;
        let secs = Duration::from_secs;
        let mut catalog = catalog.with_staleness_bounds(StalenessBounds { credentials: secs(10), public: secs(100) });
        store.meta.create_bucket(&BucketName::parse("pub").unwrap(), true, 0).await.unwrap();
        store.meta.create_bucket(&BucketName::parse("pub-uncached").unwrap(), true, 0).await.unwrap();
        put(&store, "k", b"bytes").await;
        let private = catalog.bucket("bkt").await.unwrap().unwrap();
        let public = catalog.bucket("pub").await.unwrap().unwrap();
        assert!(catalog.token("0123456789ab").await.unwrap().is_none());
        fn stale<T>(r: Result<T, MetadataError>) -> bool {
            matches!(r, Err(MetadataError::Stale { .. }))
        }

        // The last sync was 11 s ago: credentials and private (or unknown) buckets are refused.
        catalog.origin -= secs(11);
        catalog.check_staleness();
        assert_eq!(catalog.freshness(), Freshness::PublicOnly);
        assert!(stale(catalog.token("0123456789ab").await));
        assert!(stale(catalog.signing_key("k1").await));
        assert!(stale(catalog.signature_revoked("00").await));
        assert!(stale(catalog.s3_key("AKBGAAAAAAAAAAAAAAAA").await));
        assert!(stale(catalog.bucket("bkt").await), "a private bucket");
        assert!(stale(catalog.bucket("absent").await), "an absent one, alike");
        assert!(stale(catalog.bucket("pub-uncached").await), "a public bucket not in the cache");
        assert_eq!(catalog.bucket("pub").await.unwrap().unwrap().id, public.id, "a cached public bucket");
        assert!(catalog.object(private.id, "k").await.unwrap().is_some(), "objects, reached only through `bucket`");
        let error = catalog.token("0123456789ab").await.unwrap_err();
        assert!(error.is_unavailable() && error.to_string().contains("11s ago"), "{error}");

        // 101 s: nothing at all.
        catalog.origin -= secs(90);
        catalog.check_staleness();
        assert_eq!(catalog.freshness(), Freshness::Expired);
        assert!(stale(catalog.bucket("pub").await));
        assert!(stale(catalog.object(private.id, "k").await));

        // A sync that succeeds lifts it at once.
        catalog.sync().await.unwrap();
        assert_eq!(catalog.freshness(), Freshness::Fresh);
        assert!(catalog.sync_age() < secs(1));
        assert!(catalog.bucket("bkt").await.unwrap().is_some());
        assert!(catalog.token("0123456789ab").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn postgres_another_replica_change_reaches_the_cache_in_the_background_and_a_pruned_log_flushes() {
        let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let url = crate::store::metadata::test_database_url(TestBackend::Postgres, dir.path()).await;
        let timeout = std::time::Duration::from_secs(5);
        // Another replica has a data dir of its own: sharing this one would share its generation counter, which
        // tells this catalog of the change at its next read without the feed.
        let (here, elsewhere) = (
            Store::open(dir.path(), &url, timeout).await.unwrap(),
            Store::open(other_dir.path(), &url, timeout).await.unwrap(),
        );
        let name = BucketName::parse("bkt").unwrap();
        let bucket = here.meta.create_bucket(&name, false, 0).await.unwrap();
        let catalog = Arc::new(Catalog::new(here.meta.clone(), here.blobs.clone(), 64).await.unwrap());
        let feed = here.meta.feed().clone();
        let watcher = tokio::spawn({
            let feed = feed.clone();
            async move { feed.watch().await }
        });
        let follower = tokio::spawn({
            let catalog = catalog.clone();
            // No tick after the first: the revocation can only arrive through the feed.
            async move { catalog.keep_synced_every(Duration::from_secs(3600)).await }
        });
        let token = TokenRecord {
            id: "0123456789ab".into(),
            secret_hash: vec![0; 32],
            rights: Rights::whole_bucket(bucket.id, "bkt", Scope::Read),
        };
        here.meta.create_token(&token).await.unwrap();
        assert!(catalog.token(&token.id).await.unwrap().unwrap().rights.revoked_at.is_none());
        let counter = feed.current();
        assert!(elsewhere.meta.revoke_token(&token.id, 5).await.unwrap());
        let revoked = std::time::Instant::now();
        while catalog.token(&token.id).await.unwrap().unwrap().rights.revoked_at.is_none() {
            // A hang bound only: with no tick, the feed is the only way in.
            assert!(
                revoked.elapsed() < std::time::Duration::from_secs(30),
                "the revocation never came through the feed"
            );
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        assert_eq!(feed.current(), counter, "applied in the background: requests never synced for it");
        watcher.abort();
        follower.abort();

        // With nobody syncing, a change arrives and is pruned before this replica read it: the next sync flushes.
        assert!(catalog.bucket("bkt").await.unwrap().unwrap().default_cache_control.is_none());
        elsewhere.meta.update_bucket(&name, default_cache_control(Some("max-age=9"))).await.unwrap();
        crate::store::metadata::test_age_change_log(&elsewhere.meta).await;
        elsewhere.meta.feed().prune(0).await.unwrap();
        assert!(catalog.bucket("bkt").await.unwrap().unwrap().default_cache_control.is_none(), "still cached");
        catalog.sync().await.unwrap();
        let reread = catalog.bucket("bkt").await.unwrap().unwrap();
        assert_eq!(reread.default_cache_control.as_deref(), Some("max-age=9"), "the flush forgot the stale entry");
        assert!(catalog.token(&token.id).await.unwrap().unwrap().rights.revoked_at.is_some());
    }

    on_both_backends!(open_blobs_are_reused_and_failures_are_not_cached);
    async fn open_blobs_are_reused_and_failures_are_not_cached(backend: TestBackend) {
        let (_dir, store, catalog) = setup_on(backend).await;
        put(&store, "k", b"bytes").await;
        let bucket = catalog.bucket("bkt").await.unwrap().unwrap();
        let entry = catalog.object(bucket.id, "k").await.unwrap().unwrap();
        let a = catalog.open_blob(entry.sha256()).await.unwrap();
        let b = catalog.open_blob(entry.sha256()).await.unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.size, 5);
        let missing = "f".repeat(64);
        assert!(catalog.open_blob(&missing).await.is_err());
        assert!(catalog.open_blobs.get(missing.as_str()).is_none());
    }
}
