//! What one replica counts per principal, shared by its data workers: a request bucket, the places left among the
//! requests in progress and byte buckets, each a compare-and-swap on one atomic, no lock. A principal's counters
//! live in a bounded map, and a named principal's also in the limits table that found them there (each worker's
//! copy reaches them without the map, through a hold of its own); a limit changed by `limits set` starts them
//! again. A named principal's counters are sharded per worker (see [`Shard`]).

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use quanta::Instant;

use quick_cache::Equivalent;

use crate::file_body::{Pace, Share};

use super::{LimitKind, LimitSet, RequestRate, Subject, Throttled, address_group, whole_secs_at_least_one};

/// Every limit stored, as the catalog loaded it: one lookup per principal kind. A named principal's entry keeps
/// the counters its first request found, so the next ones reach them without a look in the replica's map.
#[derive(Debug, Default, Clone)]
pub struct LimitTable {
    default: Option<LimitSet>,
    anonymous: Option<LimitSet>,
    tokens: foldhash::HashMap<Box<str>, Named>,
    s3_keys: foldhash::HashMap<Box<str>, Named>,
    buckets: foldhash::HashMap<Box<str>, Named>,
}

/// A limit set on a token, an S3 key or a bucket, and this table's hold on its counters in the [`Throttle`] (by
/// its id) once used.
#[derive(Debug)]
struct Named {
    limits: LimitSet,
    counters: OnceLock<(u64, Arc<Hold>)>,
}

/// A copy starts without a hold: a worker's copy of the table takes one of its own, on its own shard.
impl Clone for Named {
    fn clone(&self) -> Named {
        Named { limits: self.limits, counters: OnceLock::new() }
    }
}

/// The limit that covers a principal itself, where it was set, and its counters' slot when it was set on the
/// principal by name (the default and anonymous limits count each principal or group apart).
#[derive(Debug, Clone, Copy)]
struct Own<'t> {
    limits: &'t LimitSet,
    scope: &'static str,
    slot: Option<&'t OnceLock<(u64, Arc<Hold>)>>,
}

impl LimitTable {
    pub fn new(rows: impl IntoIterator<Item = (Subject, LimitSet)>) -> LimitTable {
        let mut table = LimitTable::default();
        let named = |limits| Named { limits, counters: OnceLock::new() };
        for (subject, limits) in rows {
            match subject {
                Subject::Default => table.default = Some(limits),
                Subject::Anonymous => table.anonymous = Some(limits),
                Subject::Token(id) => _ = table.tokens.insert(id.into(), named(limits)),
                Subject::S3Key(id) => _ = table.s3_keys.insert(id.into(), named(limits)),
                Subject::Bucket(name) => _ = table.buckets.insert(name.into(), named(limits)),
            }
        }
        table
    }

    /// No limit at all: every request passes without a look at any counter.
    pub fn is_empty(&self) -> bool {
        self.default.is_none()
            && self.anonymous.is_none()
            && self.tokens.is_empty()
            && self.s3_keys.is_empty()
            && self.buckets.is_empty()
    }

    /// `who` as a worker shares its sends: a key for who it is (an anonymous client's address group) and the
    /// weight its limit gives it (default 1).
    pub fn share(&self, who: &Who<'_>) -> Share {
        Self::share_under(self.own(who), who)
    }

    /// [`share`](Self::share) once `who`'s own limit is found.
    fn share_under(own: Option<Own<'_>>, who: &Who<'_>) -> Share {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut hasher = foldhash::fast::FixedState::with_seed(0x5eed).build_hasher();
        match who {
            Who::Token(id) => (0u8, *id).hash(&mut hasher),
            Who::S3Key(id) => (1u8, *id).hash(&mut hasher),
            Who::Signer(id) => (2u8, *id).hash(&mut hasher),
            Who::Anonymous(ip) => {
                let prefixes = own.map_or((32, 64), |own| own.limits.prefixes());
                (3u8, address_group(*ip, prefixes)).hash(&mut hasher)
            }
        }
        Share { key: hasher.finish(), weight: own.and_then(|own| own.limits.weight).unwrap_or(1) }
    }

    /// The limit that covers `who` itself: its own, else the default.
    fn own(&self, who: &Who<'_>) -> Option<Own<'_>> {
        let own = match who {
            Who::Token(id) => self.tokens.get(*id).map(|n| named(n, "token")),
            Who::S3Key(id) => self.s3_keys.get(*id).map(|n| named(n, "s3-key")),
            Who::Anonymous(_) => self.anonymous.as_ref().map(|limits| Own { limits, scope: "anonymous", slot: None }),
            Who::Signer(_) => None,
        };
        own.or_else(|| self.default.as_ref().map(|limits| Own { limits, scope: "default", slot: None }))
    }

    fn bucket(&self, name: &str) -> Option<Own<'_>> {
        self.buckets.get(name).map(|n| named(n, "bucket"))
    }
}

fn named<'t>(named: &'t Named, scope: &'static str) -> Own<'t> {
    Own { limits: &named.limits, scope, slot: Some(&named.counters) }
}

/// Who a request is, as far as limits go: known once it is authorised.
#[derive(Debug, Clone, Copy)]
pub enum Who<'a> {
    /// A bearer token, by its id.
    Token(&'a str),
    /// An S3 access key (a SigV4 request or URL).
    S3Key(&'a str),
    /// A native signed URL, by the id of the key that signed it: covered by the default limit.
    Signer(&'a str),
    /// No credentials: the client's address.
    Anonymous(IpAddr),
}

/// A rate with a burst (bytes or requests a second), its counts kept in each shard of a [`Counters`] as the instant
/// that shard was (or will be) empty: a take is one compare-and-swap and no lock. A sharded limit's rate and burst
/// are divided between its shards; the time to fill a burst is the same.
#[derive(Debug)]
struct Rate {
    /// Per shard.
    per_sec: f64,
    /// `per_sec` a nanosecond, and a unit's nanoseconds: multiplied, not divided, on every take.
    per_nano: f64,
    nanos_each: f64,
    /// The burst, as the time the rate takes to fill it (nanoseconds).
    burst_nanos: f64,
    /// The least a take gives (unless less is wanted), so that a low byte rate still sends chunks worth a syscall.
    quantum: f64,
}

impl Rate {
    /// `per_sec` with `burst`, divided between `shards`; `quantum` is the least a take gives before the division.
    fn new(per_sec: f64, burst: f64, quantum: f64, shards: usize) -> Rate {
        let per_sec = per_sec.max(1e-9);
        let shards = shards as f64;
        let shard_rate = per_sec / shards;
        Rate {
            per_sec: shard_rate,
            per_nano: shard_rate / 1e9,
            nanos_each: 1e9 / shard_rate,
            burst_nanos: burst / per_sec * 1e9,
            quantum: quantum.min(burst / shards),
        }
    }

    /// A byte rate: the least a grant gives is a fiftieth of a second's worth, from 4 KiB to 256 KiB.
    fn bytes(per_sec: u64, burst: u64, shards: usize) -> Rate {
        let per_sec = per_sec.max(1) as f64;
        Rate::new(per_sec, burst as f64, (per_sec / 50.0).clamp(4096.0, 256.0 * 1024.0), shards)
    }

    /// A shard's count when the bucket starts: full.
    fn full(&self) -> AtomicI64 {
        AtomicI64::new(-(self.burst_nanos as i64))
    }

    /// Up to `want` from the shard whose empty instant is `empty_at`, at least a quantum's (or `want`) worth; else
    /// how long until that many are there. `now` is nanoseconds since the counters' origin.
    fn take(&self, empty_at: &AtomicI64, want: u64, now: f64) -> Result<u64, Duration> {
        let least = self.quantum.min(want as f64);
        let mut seen = empty_at.load(Ordering::Acquire);
        loop {
            // What was given beyond the burst is not kept: the bucket is never emptier than full at `now`.
            let from = (seen as f64).max(now - self.burst_nanos);
            let available = (now - from) * self.per_nano;
            if available < least {
                return Err(Duration::from_secs_f64((least - available) / self.per_sec));
            }
            // `available` is at least `least`, so positive: the cast truncates, as floor would.
            let granted = (available as u64).min(want);
            let taken = from + granted as f64 * self.nanos_each;
            match empty_at.compare_exchange_weak(seen, taken as i64, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(granted),
                Err(current) => seen = current,
            }
        }
    }

    fn give_back(&self, empty_at: &AtomicI64, units: u64) {
        self.give_back_part(empty_at, units as f64);
    }

    fn give_back_part(&self, empty_at: &AtomicI64, units: f64) {
        let nanos = (units * self.nanos_each) as i64;
        if nanos > 0 {
            empty_at.fetch_sub(nanos, Ordering::AcqRel);
        }
    }

    /// Everything the shard holds, whole or not (none when its count is ahead of `now`).
    fn take_all(&self, empty_at: &AtomicI64, now: f64) -> f64 {
        let mut seen = empty_at.load(Ordering::Acquire);
        loop {
            let from = (seen as f64).max(now - self.burst_nanos);
            if from >= now {
                return 0.0;
            }
            match empty_at.compare_exchange_weak(seen, now as i64, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return (now as i64 as f64 - from) * self.per_nano,
                Err(current) => seen = current,
            }
        }
    }
}

/// One shard of a principal's counts, on a cache line of its own: a data worker takes from its own shard, so two
/// workers serving one principal do not pass the line to each other request after request; a shard that runs out
/// takes from the others before it refuses, so the sum is the limit.
#[derive(Debug)]
#[repr(align(128))]
struct Shard {
    requests: AtomicI64,
    read: AtomicI64,
    write: AtomicI64,
    /// Places left among the requests in progress (a concurrency limit).
    places: AtomicU32,
}

/// How many shards a named principal's counters have: one per CPU (the data workers, at most), up to 64.
static SHARDS: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 64)));

/// Below these a limit is kept in one shard: a small burst or place count divided between workers would refuse
/// one worker's requests early (a shard takes only whole requests and quanta) and move counts between shards.
const SHARD_LEAST_REQUESTS: f64 = 16.0;
const SHARD_LEAST_PLACES: u32 = 16;
const SHARD_LEAST_BYTES: u64 = 64 << 10;

thread_local! {
    /// This thread's shard, modulo a counters' shard count: data workers are spread over them.
    static SHARD_OF_THREAD: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// One request's hold on counters that cover it: the shard it takes from and gives back to. A named principal's
/// hold is one per data worker, kept in that worker's copy of the limits table: cloned and dropped request after
/// request, its reference count stays on the worker's own cache line (the counters' would pass between workers),
/// and so do its leases: requests, read bytes and places taken from the shard ahead of need, a few at a time
/// (`Leases`), so that most requests take from the hold alone, without the clock.
#[derive(Debug)]
#[repr(align(128))]
struct Hold {
    counters: Arc<Counters>,
    shard: usize,
    leased: Leased,
}

/// What a hold has taken from its shard and not used yet.
#[derive(Debug, Default)]
struct Leased {
    requests: AtomicU64,
    read: AtomicU64,
    places: AtomicU64,
}

/// The clock, read at most once for all the limits of one admission or grant, and only if a lease runs out.
#[derive(Default)]
struct Now(Option<Instant>);

impl Now {
    fn get(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

/// Takes `n` from a lease if it holds them.
fn take_leased(lease: &AtomicU64, n: u64) -> bool {
    lease.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| held.checked_sub(n)).is_ok()
}

impl Hold {
    /// The calling thread's hold on `counters`.
    fn new(counters: Arc<Counters>) -> Hold {
        let shard = SHARD_OF_THREAD.with(|n| *n) % counters.shards.len();
        Hold { counters, shard, leased: Leased::default() }
    }

    /// The calling thread's hold on `counters`, made known to them when it may lease: they take its leases back
    /// before they refuse.
    fn registered(counters: Arc<Counters>) -> Arc<Hold> {
        let hold = Arc::new(Hold::new(counters));
        if hold.leases.any() {
            let mut holds = hold.holds.lock().unwrap_or_else(|p| p.into_inner());
            holds.retain(|h| h.strong_count() > 0);
            holds.push(Arc::downgrade(&hold));
        }
        hold
    }

    /// A place and a request, from the leases or else from the shards.
    fn admit(&self, now: &mut Now) -> Result<(), Throttled> {
        let counters = &*self.counters;
        let leases = counters.leases;
        if counters.limits.concurrent.is_some() && !(leases.places > 0 && take_leased(&self.leased.places, 1)) {
            let lease = |shard: &Shard| {
                let mut got = 0;
                shard
                    .places
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        got = u64::from(n).min(leases.places.max(1));
                        (got > 0).then(|| n - got as u32)
                    })
                    .map(|_| got)
                    .map_err(|_| Duration::ZERO)
            };
            match counters.take_from_shards(self.shard, lease) {
                Ok(got) if got > 1 => _ = self.leased.places.fetch_add(got - 1, Ordering::Relaxed),
                Ok(_) => {}
                Err(_) if leases.places > 0 => {
                    counters.reclaim();
                    counters.take_place(self.shard)?;
                }
                Err(_) => return Err(counters.refused_place()),
            }
        }
        if let Some(rate) = &counters.requests
            && !(leases.requests > 0 && take_leased(&self.leased.requests, 1))
        {
            let at = counters.nanos(now.get());
            let taken = match counters.take_rate(rate, |s| &s.requests, self.shard, leases.requests.max(1), at) {
                Err(_) if leases.any() => {
                    counters.reclaim();
                    counters.take_rate(rate, |s| &s.requests, self.shard, 1, at)
                }
                taken => taken,
            };
            match taken {
                Ok(got) if got > 1 => _ = self.leased.requests.fetch_add(got - 1, Ordering::Relaxed),
                Ok(_) => {}
                Err(wait) => {
                    self.release();
                    return Err(counters.refused_request(wait));
                }
            }
        }
        Ok(())
    }

    /// Gives a place back, to the lease (past twice its size, the rest to the shard).
    fn release(&self) {
        let counters = &*self.counters;
        if counters.limits.concurrent.is_none() {
            return;
        }
        let size = counters.leases.places;
        if size == 0 {
            return counters.release(self.shard);
        }
        let held = self.leased.places.fetch_add(1, Ordering::Relaxed) + 1;
        if held > 2 * size && take_leased(&self.leased.places, size) {
            counters.shards[self.shard].places.fetch_add(size as u32, Ordering::AcqRel);
        }
    }

    /// Up to `want` bytes: from the read lease when it holds them, else from the shards (a lease's worth more).
    fn take_bytes(&self, write: bool, want: u64, now: &mut Now) -> Result<u64, Duration> {
        let size = self.counters.leases.read;
        if write || size == 0 {
            return self.counters.take_bytes(write, self.shard, want, now.get());
        }
        if take_leased(&self.leased.read, want) {
            return Ok(want);
        }
        let held = self.leased.read.swap(0, Ordering::Relaxed);
        let ask = want.saturating_sub(held) + size;
        let taken = match self.counters.take_bytes(false, self.shard, ask, now.get()) {
            Ok(got) => Ok(got + held),
            Err(_) if held > 0 => Ok(held),
            Err(_) => {
                self.counters.reclaim();
                self.counters.take_bytes(false, self.shard, want, now.get())
            }
        };
        let got = taken?;
        let granted = got.min(want);
        self.leased.read.fetch_add(got - granted, Ordering::Relaxed);
        Ok(granted)
    }

    /// Bytes granted and not sent: back to the read lease (past twice its size, the rest to the shard).
    fn give_back_bytes(&self, write: bool, bytes: u64) {
        let size = self.counters.leases.read;
        if write || size == 0 {
            return self.counters.give_back_bytes(write, self.shard, bytes);
        }
        let held = self.leased.read.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if held > 2 * size {
            let extra = held - size;
            if take_leased(&self.leased.read, extra) {
                self.counters.give_back_bytes(false, self.shard, extra);
            }
        }
    }

    /// Everything leased, back to the shard.
    fn return_leases(&self) {
        let counters = &*self.counters;
        let shard = &counters.shards[self.shard];
        let requests = self.leased.requests.swap(0, Ordering::Relaxed);
        if let (Some(rate), 1..) = (&counters.requests, requests) {
            rate.give_back(&shard.requests, requests);
        }
        let read = self.leased.read.swap(0, Ordering::Relaxed);
        if let (Some(rate), 1..) = (&counters.read, read) {
            rate.give_back(&shard.read, read);
        }
        let places = self.leased.places.swap(0, Ordering::Relaxed);
        if places > 0 {
            shard.places.fetch_add(places as u32, Ordering::AcqRel);
        }
    }
}

/// A hold that goes (a worker's table replaced) gives back what it leased.
impl Drop for Hold {
    fn drop(&mut self) {
        self.return_leases();
    }
}

impl std::ops::Deref for Hold {
    type Target = Counters;

    fn deref(&self) -> &Counters {
        &self.counters
    }
}

/// The counters that cover one request: its principal's and its bucket's, inline.
type Covering = smallvec::SmallVec<[Arc<Hold>; 2]>;

/// The bandwidth limits that cover one response (or upload): its principal's and its bucket's. A grant is what
/// all of them allow; what one gave beyond the others goes back to it.
#[derive(Debug)]
pub struct BytePace {
    counters: Covering,
    write: bool,
}

impl BytePace {
    /// What every limit of `covering` (in `write`'s direction) allows of `want`, taken from each.
    fn grant_from(covering: &[Arc<Hold>], write: bool, want: u64) -> Result<u64, Duration> {
        let mut now = Now::default();
        let mut granted = want;
        for (i, hold) in covering.iter().enumerate() {
            if hold.bytes(write).is_none() {
                continue;
            }
            match hold.take_bytes(write, granted, &mut now) {
                Ok(n) => {
                    // The limits before this one gave `granted`; keep only what this one allows too.
                    for earlier in &covering[..i] {
                        if earlier.bytes(write).is_some() && granted > n {
                            earlier.give_back_bytes(write, granted - n);
                        }
                    }
                    granted = n;
                }
                Err(wait) => {
                    for earlier in &covering[..i] {
                        if earlier.bytes(write).is_some() {
                            earlier.give_back_bytes(write, granted);
                        }
                    }
                    return Err(wait);
                }
            }
        }
        Ok(granted)
    }

    fn refund_to(covering: &[Arc<Hold>], write: bool, unsent: u64) {
        if unsent > 0 {
            for hold in covering.iter().filter(|hold| hold.bytes(write).is_some()) {
                hold.give_back_bytes(write, unsent);
            }
        }
    }
}

impl Pace for BytePace {
    fn grant(&self, want: u64) -> Result<u64, Duration> {
        Self::grant_from(&self.counters, self.write, want)
    }

    fn scope(&self) -> &'static str {
        self.counters.first().map_or("default", |c| c.scope)
    }

    fn refund(&self, unsent: u64) {
        Self::refund_to(&self.counters, self.write, unsent)
    }
}

/// A permit paces the object bytes of its response: no second allocation for the pace.
impl Pace for Permit {
    fn grant(&self, want: u64) -> Result<u64, Duration> {
        BytePace::grant_from(&self.covering, false, want)
    }

    fn refund(&self, unsent: u64) {
        BytePace::refund_to(&self.covering, false, unsent)
    }

    fn scope(&self) -> &'static str {
        self.read_scope.unwrap_or("default")
    }
}

/// The counters of one principal (or bucket, or anonymous address group) under one set of limits, in shards.
#[derive(Debug)]
struct Counters {
    limits: LimitSet,
    scope: &'static str,
    named: Option<Box<str>>,
    requests: Option<Rate>,
    read: Option<Rate>,
    write: Option<Rate>,
    /// The instant the shards' counts are nanoseconds from.
    origin: Instant,
    shards: Box<[Shard]>,
    /// How much a hold takes from its shard at a time (none: every request takes from the shard).
    leases: Leases,
    /// The holds that may have leased, so that a refusal first takes back what they hold unused.
    holds: std::sync::Mutex<Vec<std::sync::Weak<Hold>>>,
}

/// How much of each count a hold leases at once: a sixteenth of what each shard holds, at most 64 requests or
/// places and 256 KiB; none where that is less than two (or 16 KiB), and none for unnamed principals, whose holds
/// last one request. A lease is taken before it is used, so a limit may admit up to what the holds lease beyond
/// its burst, once: at most an eighth of it (a lease may hold twice its size from refunds).
#[derive(Debug, Default, Clone, Copy)]
struct Leases {
    requests: u64,
    read: u64,
    places: u64,
}

impl Leases {
    fn of(limits: &LimitSet, shards: usize) -> Leases {
        let part = |whole: u64, most: u64, least: u64| {
            Some(whole / (16 * shards as u64)).filter(|&n| n >= least).map_or(0, |n| n.min(most))
        };
        Leases {
            requests: limits.request_burst().map_or(0, |b| part(u64::from(b), 64, 2)),
            read: limits.read_burst().map_or(0, |b| part(b, 256 << 10, 16 << 10)),
            places: limits.concurrent.map_or(0, |c| part(u64::from(c), 64, 2)),
        }
    }

    fn any(&self) -> bool {
        self.requests > 0 || self.read > 0 || self.places > 0
    }
}

impl Counters {
    /// Counters in one shard, or for a named principal (a few, set by an operator) one per CPU when every limit is
    /// large enough to divide.
    fn new(limits: LimitSet, scope: &'static str, named: Option<Box<str>>) -> Counters {
        let shards = if named.is_some() { Self::shards_for(&limits, *SHARDS) } else { 1 };
        Self::with_shards(limits, scope, named, shards)
    }

    fn with_shards(limits: LimitSet, scope: &'static str, named: Option<Box<str>>, shards: usize) -> Counters {
        let requests = limits.requests.map(|rate| {
            let burst = f64::from(limits.request_burst().unwrap_or(1).max(1));
            Rate::new(f64::from(rate.count) / f64::from(rate.period_secs), burst, 1.0, shards)
        });
        let bytes = |rate: Option<u64>, burst: Option<u64>| rate.zip(burst).map(|(r, b)| Rate::bytes(r, b, shards));
        let read = bytes(limits.read_bytes, limits.read_burst());
        let write = bytes(limits.write_bytes, limits.write_burst());
        let places = limits.concurrent.unwrap_or(0);
        let leases = if named.is_some() { Leases::of(&limits, shards) } else { Leases::default() };
        let shards = (0..shards as u32)
            .map(|i| Shard {
                requests: requests.as_ref().map_or(AtomicI64::new(0), Rate::full),
                read: read.as_ref().map_or(AtomicI64::new(0), Rate::full),
                write: write.as_ref().map_or(AtomicI64::new(0), Rate::full),
                // The places divided, the remainder to the first shards.
                places: AtomicU32::new(places / shards as u32 + u32::from(i < places % shards as u32)),
            })
            .collect();
        let holds = std::sync::Mutex::default();
        Counters { limits, scope, named, requests, read, write, origin: Instant::now(), shards, leases, holds }
    }

    /// `most` shards if every limit of `limits` leaves each enough, else one.
    fn shards_for(limits: &LimitSet, most: usize) -> usize {
        let n = most as u64;
        let requests_ok = limits.request_burst().is_none_or(|b| f64::from(b) >= SHARD_LEAST_REQUESTS * n as f64);
        let places_ok = limits.concurrent.is_none_or(|c| c >= SHARD_LEAST_PLACES * most as u32);
        let bytes_ok = |burst: Option<u64>| burst.is_none_or(|b| b >= SHARD_LEAST_BYTES * n);
        if requests_ok && places_ok && bytes_ok(limits.read_burst()) && bytes_ok(limits.write_burst()) {
            most
        } else {
            1
        }
    }

    /// `now` in nanoseconds since the origin, as the shards count.
    fn nanos(&self, now: Instant) -> f64 {
        // Through u64: a u128's conversion to f64 is a library call.
        now.saturating_duration_since(self.origin).as_nanos() as u64 as f64
    }

    fn bytes(&self, write: bool) -> Option<&Rate> {
        if write { self.write.as_ref() } else { self.read.as_ref() }
    }

    /// Up to `want` bytes from shard `first`, else from the first other shard that has them; else how long until
    /// one has. None limits: `want`.
    fn take_bytes(&self, write: bool, first: usize, want: u64, now: Instant) -> Result<u64, Duration> {
        let Some(rate) = self.bytes(write) else { return Ok(want) };
        fn write_count(shard: &Shard) -> &AtomicI64 {
            &shard.write
        }
        fn read_count(shard: &Shard) -> &AtomicI64 {
            &shard.read
        }
        let count: fn(&Shard) -> &AtomicI64 = if write { write_count } else { read_count };
        self.take_rate(rate, count, first, want, self.nanos(now))
    }

    /// Up to `want` of `rate` (each shard's count where `count` says), from shard `first`, else from another;
    /// when none has a whole quantum, what they hold together, if that makes one (a sharded rate never refuses
    /// what one shard would have given).
    fn take_rate(
        &self,
        rate: &Rate,
        count: fn(&Shard) -> &AtomicI64,
        first: usize,
        want: u64,
        now: f64,
    ) -> Result<u64, Duration> {
        let taken = self.take_from_shards(first, |shard| rate.take(count(shard), want, now));
        if taken.is_ok() || self.shards.len() == 1 {
            return taken;
        }
        let held: f64 = self.shards.iter().map(|shard| rate.take_all(count(shard), now)).sum();
        let least = rate.quantum.min(want as f64);
        let own = count(&self.shards[first]);
        if held < least {
            rate.give_back_part(own, held);
            let all_shards = rate.per_sec * self.shards.len() as f64;
            return Err(Duration::from_secs_f64((least - held) / all_shards));
        }
        let granted = (held as u64).min(want);
        rate.give_back_part(own, held - granted as f64);
        Ok(granted)
    }

    fn give_back_bytes(&self, write: bool, shard: usize, bytes: u64) {
        if let Some(rate) = self.bytes(write) {
            let shard = &self.shards[shard];
            rate.give_back(if write { &shard.write } else { &shard.read }, bytes);
        }
    }

    /// `take` from shard `first`, then from the others in turn; refused by all, the shortest wait.
    fn take_from_shards<T>(&self, first: usize, take: impl Fn(&Shard) -> Result<T, Duration>) -> Result<T, Duration> {
        let mut wait = match take(&self.shards[first]) {
            Ok(taken) => return Ok(taken),
            Err(wait) => wait,
        };
        let n = self.shards.len();
        for i in 1..n {
            match take(&self.shards[(first + i) % n]) {
                Ok(taken) => return Ok(taken),
                Err(w) => wait = wait.min(w),
            }
        }
        Err(wait)
    }

    /// Takes a place among the requests in progress, then a request from the rate, from shard `first` or
    /// another; gives the place back if the rate refuses. No lease.
    #[cfg(test)]
    fn admit(&self, first: usize, now: Instant) -> Result<(), Throttled> {
        if self.limits.concurrent.is_some() {
            self.take_place(first)?;
        }
        if let Some(rate) = &self.requests
            && let Err(wait) = self.take_rate(rate, |shard| &shard.requests, first, 1, self.nanos(now))
        {
            self.release(first);
            return Err(self.refused_request(wait));
        }
        Ok(())
    }

    /// One place from shard `first` or another; refused when none has one.
    fn take_place(&self, first: usize) -> Result<(), Throttled> {
        let place = |shard: &Shard| {
            shard
                .places
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .map_err(|_| Duration::ZERO)
        };
        self.take_from_shards(first, place).map(|_| ()).map_err(|_| self.refused_place())
    }

    /// The refusal of a request over the concurrency limit.
    fn refused_place(&self) -> Throttled {
        Throttled {
            kind: LimitKind::Concurrent,
            scope: self.scope,
            named: self.named.clone(),
            quota: u64::from(self.limits.concurrent.unwrap_or(0)),
            window_secs: 1,
            retry_after_secs: 1,
        }
    }

    /// The refusal of a request over the rate, to be tried again after `wait`.
    fn refused_request(&self, wait: Duration) -> Throttled {
        let limit = self.limits.requests.unwrap_or(RequestRate { count: 1, period_secs: 1 });
        Throttled {
            kind: LimitKind::Requests,
            scope: self.scope,
            named: self.named.clone(),
            quota: u64::from(limit.count),
            window_secs: u64::from(limit.period_secs),
            retry_after_secs: whole_secs_at_least_one(wait),
        }
    }

    /// Takes back what every hold leased and has not used, before a refusal: a limit refuses only when it is
    /// spent, not when its rest sits in another worker's lease.
    fn reclaim(&self) {
        let holds: Vec<Arc<Hold>> = {
            let holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
            holds.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        for hold in holds {
            hold.return_leases();
        }
    }

    /// Gives a place back, to shard `shard` (places move to the shards of the workers that release them).
    fn release(&self, shard: usize) {
        if self.limits.concurrent.is_some() {
            self.shards[shard].places.fetch_add(1, Ordering::AcqRel);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Owner {
    Token(Box<str>),
    AccessKey(Box<str>),
    Signer(Box<str>),
    Address(IpAddr),
    Bucket(Box<str>),
}

/// An [`Owner`] borrowed from the request: the map is searched without a copy of the name.
#[derive(Debug, Clone, Copy, Hash)]
enum OwnerRef<'a> {
    Token(&'a str),
    AccessKey(&'a str),
    Signer(&'a str),
    Address(IpAddr),
    Bucket(&'a str),
}

impl Equivalent<Owner> for OwnerRef<'_> {
    fn equivalent(&self, key: &Owner) -> bool {
        match (self, key) {
            (OwnerRef::Token(a), Owner::Token(b))
            | (OwnerRef::AccessKey(a), Owner::AccessKey(b))
            | (OwnerRef::Signer(a), Owner::Signer(b))
            | (OwnerRef::Bucket(a), Owner::Bucket(b)) => *a == &**b,
            (OwnerRef::Address(a), Owner::Address(b)) => a == b,
            _ => false,
        }
    }
}

impl OwnerRef<'_> {
    fn owned(self) -> Owner {
        match self {
            OwnerRef::Token(id) => Owner::Token(id.into()),
            OwnerRef::AccessKey(id) => Owner::AccessKey(id.into()),
            OwnerRef::Signer(id) => Owner::Signer(id.into()),
            OwnerRef::Address(ip) => Owner::Address(ip),
            OwnerRef::Bucket(name) => Owner::Bucket(name.into()),
        }
    }
}

/// Principals (and address groups) counted at once; beyond, the least used start again.
pub const COUNTED_PRINCIPALS: usize = 100_000;

/// The replica's counters, shared by every data worker.
#[derive(Debug)]
pub struct Throttle {
    counters: quick_cache::sync::Cache<Owner, Arc<Counters>>,
    /// Tells this throttle's counters apart in a table's slots (tests run several in one process).
    id: u64,
}

static NEXT_THROTTLE_ID: AtomicU64 = AtomicU64::new(0);

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(COUNTED_PRINCIPALS)
    }
}

/// A request's places among the requests in progress of its principal and its bucket, given back when it drops:
/// a download holds it until its last byte is sent.
#[derive(Debug, Default)]
pub struct Permit {
    /// The counters of the limits that hold a place or pace bytes (one reference each, for both).
    covering: Covering,
    /// The scope of the first read bandwidth limit that covers it (its pace's, as metrics name it).
    read_scope: Option<&'static str>,
}

impl Permit {
    /// Whether it holds a place (a concurrency limit covers the request): else there is nothing to keep.
    pub fn holds(&self) -> bool {
        self.covering.iter().any(|c| c.limits.concurrent.is_some())
    }

    /// Neither a place nor a pace: nothing to keep.
    pub fn is_empty(&self) -> bool {
        self.covering.is_empty()
    }

    /// Whether a read bandwidth limit covers the request: the permit is then its object bytes' pace.
    pub fn paces_reads(&self) -> bool {
        self.covering.iter().any(|c| c.read.is_some())
    }

    /// The pace of the response's object bytes, when a read bandwidth limit covers it.
    pub fn read_pace(&self) -> Option<Arc<dyn Pace>> {
        self.pace(false)
    }

    /// The pace of the request's body, when a write bandwidth limit covers it.
    pub fn write_pace(&self) -> Option<Arc<dyn Pace>> {
        self.pace(true)
    }

    fn pace(&self, write: bool) -> Option<Arc<dyn Pace>> {
        let counters: Covering = self
            .covering
            .iter()
            .filter(|c| if write { c.write.is_some() } else { c.read.is_some() })
            .cloned()
            .collect();
        (!counters.is_empty()).then(|| Arc::new(BytePace { counters, write }) as Arc<dyn Pace>)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        for hold in &self.covering {
            hold.release();
        }
    }
}

impl Throttle {
    pub fn new(principals: usize) -> Throttle {
        Throttle {
            counters: quick_cache::sync::Cache::new(principals),
            id: NEXT_THROTTLE_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Whether `who`'s request on `bucket` may go on under `table`: it passes only if every limit that covers it
    /// allows. The permit must be held until the response ends.
    pub fn admit(&self, table: &LimitTable, who: Who<'_>, bucket: &str) -> Result<Permit, Throttled> {
        self.admit_shared(table, who, bucket).map(|(permit, _)| permit)
    }

    /// [`admit`](Self::admit), and who the request is for the worker's fair shares (`LimitTable::share`), from
    /// one look at the table.
    pub fn admit_shared(&self, table: &LimitTable, who: Who<'_>, bucket: &str) -> Result<(Permit, Share), Throttled> {
        let own = table.own(&who);
        let share = LimitTable::share_under(own, &who);
        let mut now = Now::default();
        let mut permit = Permit { covering: Covering::new(), read_scope: None };
        if let Some(own) = own {
            let key = match who {
                Who::Token(id) => OwnerRef::Token(id),
                Who::S3Key(id) => OwnerRef::AccessKey(id),
                Who::Signer(id) => OwnerRef::Signer(id),
                Who::Anonymous(ip) => OwnerRef::Address(address_group(ip, own.limits.prefixes())),
            };
            self.admit_one(&mut permit, key, own, &mut now)?;
        }
        if let Some(own) = table.bucket(bucket) {
            self.admit_one(&mut permit, OwnerRef::Bucket(bucket), own, &mut now)?;
        }
        Ok((permit, share))
    }

    fn admit_one(&self, permit: &mut Permit, key: OwnerRef<'_>, own: Own<'_>, now: &mut Now) -> Result<(), Throttled> {
        let hold = match own.slot.and_then(OnceLock::get) {
            Some((throttle, hold)) if *throttle == self.id => hold.clone(),
            _ => {
                let hold = Hold::registered(self.counters_of(key, own));
                if let Some(slot) = own.slot {
                    let _ = slot.set((self.id, hold.clone()));
                }
                hold
            }
        };
        hold.admit(now)?;
        if hold.read.is_some() && permit.read_scope.is_none() {
            permit.read_scope = Some(hold.scope);
        }
        if hold.read.is_some() || hold.write.is_some() || own.limits.concurrent.is_some() {
            permit.covering.push(hold);
        }
        Ok(())
    }

    /// `key`'s counters under `own`'s limit: the ones in the map if that limit is the one they count for, else new
    /// ones (a limit changed starts again).
    fn counters_of(&self, key: OwnerRef<'_>, own: Own<'_>) -> Arc<Counters> {
        match self.counters.get(&key) {
            Some(c) if c.limits == *own.limits && c.scope == own.scope => c,
            _ => {
                let named = match (own.scope, key) {
                    ("token" | "s3-key", OwnerRef::Token(n) | OwnerRef::AccessKey(n))
                    | ("bucket", OwnerRef::Bucket(n)) => Some(n.into()),
                    _ => None,
                };
                let fresh = Arc::new(Counters::new(*own.limits, own.scope, named));
                self.counters.insert(key.owned(), fresh.clone());
                fresh
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throttle::RequestRate;

    fn rate(count: u32) -> Option<RequestRate> {
        Some(RequestRate { count, period_secs: 1 })
    }

    #[test]
    fn no_limit_passes_without_counting() {
        let throttle = Throttle::new(16);
        let table = LimitTable::default();
        for _ in 0..1000 {
            assert!(throttle.admit(&table, Who::Token("t"), "b").is_ok());
        }
        assert_eq!(throttle.counters.len(), 0);
    }

    #[test]
    fn a_request_rate_refuses_past_its_burst_and_names_the_limit() {
        let throttle = Throttle::new(16);
        let limits = LimitSet { requests: rate(5), ..Default::default() };
        let table = LimitTable::new([(Subject::Token("t".into()), limits)]);
        for _ in 0..5 {
            throttle.admit(&table, Who::Token("t"), "b").unwrap();
        }
        let refused = throttle.admit(&table, Who::Token("t"), "b").unwrap_err();
        assert_eq!(
            (refused.kind, refused.scope, refused.quota, refused.retry_after_secs),
            (LimitKind::Requests, "token", 5, 1)
        );
        // Another token is not covered (no default).
        throttle.admit(&table, Who::Token("u"), "b").unwrap();
    }

    #[test]
    fn the_default_covers_each_principal_alone() {
        let throttle = Throttle::new(16);
        let table = LimitTable::new([(Subject::Default, LimitSet { requests: rate(1), ..Default::default() })]);
        throttle.admit(&table, Who::Token("a"), "b").unwrap();
        throttle.admit(&table, Who::S3Key("a"), "b").unwrap();
        throttle.admit(&table, Who::Signer("k"), "b").unwrap();
        assert_eq!(throttle.admit(&table, Who::Token("a"), "b").unwrap_err().scope, "default");
    }

    #[test]
    fn concurrency_places_return_when_permits_drop() {
        let throttle = Throttle::new(16);
        let table =
            LimitTable::new([(Subject::S3Key("k".into()), LimitSet { concurrent: Some(2), ..Default::default() })]);
        let first = throttle.admit(&table, Who::S3Key("k"), "b").unwrap();
        let _second = throttle.admit(&table, Who::S3Key("k"), "b").unwrap();
        let refused = throttle.admit(&table, Who::S3Key("k"), "b").unwrap_err();
        assert_eq!((refused.kind, refused.quota), (LimitKind::Concurrent, 2));
        drop(first);
        throttle.admit(&table, Who::S3Key("k"), "b").unwrap();
    }

    #[test]
    fn a_bucket_limit_is_shared_and_a_refusal_there_gives_the_principals_place_back() {
        let throttle = Throttle::new(16);
        let table = LimitTable::new([
            (Subject::Bucket("shared".into()), LimitSet { requests: rate(3), ..Default::default() }),
            (Subject::Token("a".into()), LimitSet { concurrent: Some(1), ..Default::default() }),
        ]);
        let _b1 = throttle.admit(&table, Who::Token("b"), "shared").unwrap();
        let _b2 = throttle.admit(&table, Who::Token("b"), "shared").unwrap();
        let _a = throttle.admit(&table, Who::Token("a"), "shared").unwrap();
        drop(_a);
        let refused = throttle.admit(&table, Who::Token("a"), "shared").unwrap_err();
        assert_eq!(refused.scope, "bucket");
        // The token's one place was given back when the bucket refused: another bucket takes it.
        let _other = throttle.admit(&table, Who::Token("a"), "elsewhere").unwrap();
    }

    #[test]
    fn anonymous_clients_are_counted_per_address_group() {
        let throttle = Throttle::new(16);
        let limits = LimitSet { requests: rate(1), ipv4_prefix: Some(24), ..Default::default() };
        let table = LimitTable::new([(Subject::Anonymous, limits)]);
        let ip = |s: &str| Who::Anonymous(s.parse().unwrap());
        throttle.admit(&table, ip("192.0.2.1"), "b").unwrap();
        assert_eq!(throttle.admit(&table, ip("192.0.2.200"), "b").unwrap_err().scope, "anonymous");
        throttle.admit(&table, ip("198.51.100.1"), "b").unwrap();
    }

    #[test]
    fn a_byte_rate_grants_its_burst_then_waits_for_the_rate() {
        // 4 KiB a second: a quantum (4 KiB) takes a second to come back, longer than any pause between two lines.
        let rate = Rate::bytes(4096, 64 << 10, 1);
        let (origin, shard) = (Instant::now(), rate.full());
        let now = || Instant::now().saturating_duration_since(origin).as_nanos() as f64;
        assert_eq!(rate.take(&shard, 1 << 20, now()), Ok(64 << 10), "the burst at once");
        let wait = rate.take(&shard, 64 << 10, now()).unwrap_err();
        assert!(wait <= Duration::from_secs(1) && wait > Duration::ZERO, "a quantum's time at most: {wait:?}");
        rate.give_back(&shard, 10_000);
        assert_eq!(rate.take(&shard, 5_000, now()), Ok(5_000), "what was given back");
    }

    fn sharded(limits: LimitSet, shards: usize) -> Counters {
        assert_eq!(Counters::shards_for(&limits, shards), shards, "{limits:?} divides into {shards}");
        Counters::with_shards(limits, "token", Some("t".into()), shards)
    }

    #[test]
    fn sharded_places_add_up_to_the_limit_whichever_shards_take_and_give_them_back() {
        let counters = sharded(LimitSet { concurrent: Some(64), ..Default::default() }, 4);
        for _ in 0..64 {
            counters.admit(0, Instant::now()).unwrap();
        }
        let refused = counters.admit(2, Instant::now()).unwrap_err();
        assert_eq!((refused.kind, refused.quota), (LimitKind::Concurrent, 64));
        counters.release(3);
        counters.admit(1, Instant::now()).unwrap();
        assert!(counters.admit(0, Instant::now()).is_err());
    }

    #[test]
    fn a_sharded_request_rate_admits_its_whole_burst_from_one_shard_then_refuses() {
        let limits = LimitSet { requests: Some(RequestRate { count: 64, period_secs: 3600 }), ..Default::default() };
        let counters = sharded(limits, 4);
        for _ in 0..64 {
            counters.admit(1, Instant::now()).unwrap();
        }
        let refused = counters.admit(1, Instant::now()).unwrap_err();
        assert_eq!((refused.kind, refused.quota, refused.window_secs), (LimitKind::Requests, 64, 3600));
        assert!(
            (1..=57).contains(&refused.retry_after_secs),
            "a request's time in shard: {}",
            refused.retry_after_secs
        );
        assert!(counters.admit(3, Instant::now()).is_err(), "every shard is empty");
    }

    #[test]
    fn a_sharded_byte_rate_grants_its_whole_burst_from_one_shard() {
        let limits = LimitSet { read_bytes: Some(4096), read_burst: Some(1 << 20), ..Default::default() };
        let counters = sharded(limits, 4);
        let mut granted = 0;
        while let Ok(n) = counters.take_bytes(false, 2, 1 << 20, Instant::now()) {
            granted += n;
            assert!(granted <= (1 << 20) + 4096, "{granted}");
        }
        assert!(granted >= (1 << 20) - 4 * 4096, "{granted}");
        counters.give_back_bytes(false, 0, 8192);
        assert_eq!(counters.take_bytes(false, 3, 8192, Instant::now()), Ok(8192), "given back to another shard");
    }

    /// Two holds on the same counters, as two workers' copies of the table have.
    fn two_holds(limits: LimitSet) -> (Arc<Hold>, Arc<Hold>) {
        let counters = Arc::new(sharded(limits, 2));
        assert!(counters.leases.any(), "{limits:?} leases");
        (Hold::registered(counters.clone()), Hold::registered(counters))
    }

    #[test]
    fn leased_places_add_up_to_the_limit_and_a_refusal_takes_back_the_other_holds_leases() {
        let (a, b) = two_holds(LimitSet { concurrent: Some(1024), ..Default::default() });
        let mut now = Now::default();
        for _ in 0..1000 {
            a.admit(&mut now).unwrap();
        }
        assert!(a.leased.places.load(Ordering::Relaxed) > 0, "a leased ahead");
        for _ in 0..24 {
            b.admit(&mut now).unwrap();
        }
        assert_eq!(b.admit(&mut now).unwrap_err().kind, LimitKind::Concurrent, "1,024 in progress");
        a.release();
        b.admit(&mut now).expect("the place a gave back, though it went to a's lease");
        assert!(a.admit(&mut now).is_err());
    }

    #[test]
    fn a_leased_request_rate_admits_its_burst_exactly_across_holds() {
        let limits = LimitSet { requests: Some(RequestRate { count: 1024, period_secs: 3600 }), ..Default::default() };
        let (a, b) = two_holds(limits);
        let mut now = Now::default();
        let mut admitted = 0;
        while a.admit(&mut now).is_ok() && admitted < 2000 {
            admitted += 1;
            if admitted == 1000 {
                break;
            }
        }
        while b.admit(&mut now).is_ok() && admitted < 2000 {
            admitted += 1;
        }
        assert_eq!(admitted, 1024, "the burst, not what the leases held besides");
        let refused = a.admit(&mut now).unwrap_err();
        assert_eq!((refused.kind, refused.quota), (LimitKind::Requests, 1024));
    }

    #[test]
    fn a_leased_byte_rate_grants_its_burst_and_a_hold_that_goes_gives_its_lease_back() {
        let limits = LimitSet { read_bytes: Some(4096), read_burst: Some(4 << 20), ..Default::default() };
        let (a, b) = two_holds(limits);
        let mut granted = 0;
        let mut now = Now::default();
        while let Ok(n) = a.take_bytes(false, 4096, &mut now) {
            granted += n;
            assert!(granted <= (4 << 20) + 8192, "{granted}");
            if granted >= 1 << 20 {
                break;
            }
        }
        let leased = a.leased.read.load(Ordering::Relaxed);
        assert!(leased > 0, "a leased ahead");
        while let Ok(n) = b.take_bytes(false, 4096, &mut now) {
            granted += n;
            assert!(granted <= (4 << 20) + 8192, "{granted}");
        }
        assert!(granted >= (4 << 20) - 8192, "the whole burst, a's lease too: {granted}");
        b.give_back_bytes(false, 4096);
        drop(b);
        assert_eq!(a.take_bytes(false, 4096, &mut now), Ok(4096), "b's lease, back in the shards");
    }

    #[test]
    fn small_limits_stay_in_one_shard() {
        let one = |limits: LimitSet| Counters::shards_for(&limits, 4);
        assert_eq!(one(LimitSet { concurrent: Some(2), ..Default::default() }), 1);
        assert_eq!(one(LimitSet { requests: rate(5), ..Default::default() }), 1);
        assert_eq!(one(LimitSet { read_bytes: Some(1 << 20), read_burst: Some(128 << 10), ..Default::default() }), 1);
        assert_eq!(one(LimitSet { requests: rate(1000), concurrent: Some(1000), ..Default::default() }), 4);
        assert_eq!(
            Counters::new(LimitSet { concurrent: Some(1000), ..Default::default() }, "anonymous", None).shards.len(),
            1,
            "an unnamed principal's counters (there may be many) are not sharded"
        );
    }

    #[test]
    fn a_copy_of_a_table_takes_holds_of_its_own() {
        let throttle = Throttle::new(16);
        let table =
            LimitTable::new([(Subject::Token("t".into()), LimitSet { concurrent: Some(1), ..Default::default() })]);
        let permit = throttle.admit(&table, Who::Token("t"), "b").unwrap();
        let copy = table.clone();
        assert!(copy.tokens["t"].counters.get().is_none(), "no hold copied");
        assert_eq!(
            throttle.admit(&copy, Who::Token("t"), "b").unwrap_err().kind,
            LimitKind::Concurrent,
            "the same counts"
        );
        drop(permit);
        throttle.admit(&copy, Who::Token("t"), "b").unwrap();
    }

    #[test]
    fn a_pace_grants_what_every_covering_limit_allows_and_refunds_them_all() {
        let throttle = Throttle::new(16);
        let token = LimitSet { read_bytes: Some(10 << 20), read_burst: Some(1 << 20), ..Default::default() };
        // The least burst, below what shards divide: the bucket's limit is one shard on any machine.
        let bucket = LimitSet { read_bytes: Some(4096), read_burst: Some(64 << 10), ..Default::default() };
        let table = LimitTable::new([(Subject::Token("t".into()), token), (Subject::Bucket("b".into()), bucket)]);
        let permit = throttle.admit(&table, Who::Token("t"), "b").unwrap();
        assert!(permit.write_pace().is_none(), "no write limit");
        let pace = permit.read_pace().unwrap();
        assert_eq!(pace.grant(4 << 20), Ok(64 << 10), "the bucket's burst, the smaller");
        pace.refund(64 << 10);
        assert_eq!(pace.grant(4 << 20), Ok(64 << 10), "refunded to both");
        assert!(pace.grant(4 << 20).is_err(), "the bucket is empty for a second");
        // The token's limit gave only what the bucket's allowed: another bucket's request has the rest of its
        // burst (and what refilled meanwhile), from one shard or several.
        let other = throttle.admit(&table, Who::Token("t"), "other").unwrap().read_pace().unwrap();
        let mut rest = 0;
        while let Ok(n) = other.grant(4 << 20) {
            rest += n;
            assert!(rest <= (1 << 20) + (64 << 10), "{rest}");
        }
        assert!(rest >= (1 << 20) - (64 << 10), "{rest}");
    }

    #[test]
    fn shares_name_principals_apart_and_carry_their_weight() {
        let weighty = LimitSet { weight: Some(3), ..Default::default() };
        let table = LimitTable::new([(Subject::Token("a".into()), weighty)]);
        let (a, b) = (table.share(&Who::Token("a")), table.share(&Who::Token("b")));
        assert_ne!(a.key, b.key);
        assert_ne!(table.share(&Who::S3Key("a")).key, a.key, "kinds apart");
        assert_eq!((a.weight, b.weight), (3, 1));
        let ip = |s: &str| Who::Anonymous(s.parse().unwrap());
        assert_ne!(table.share(&ip("192.0.2.1")).key, table.share(&ip("192.0.2.2")).key, "/32 by default");
        let grouped = LimitTable::new([(Subject::Anonymous, LimitSet { ipv4_prefix: Some(24), ..Default::default() })]);
        assert_eq!(grouped.share(&ip("192.0.2.1")).key, grouped.share(&ip("192.0.2.2")).key);
    }

    #[test]
    fn a_reloaded_table_keeps_the_counts_of_an_unchanged_limit_and_each_throttle_counts_its_own() {
        let throttle = Throttle::new(16);
        let limits = LimitSet { requests: rate(1), ..Default::default() };
        let rows = || [(Subject::Token("t".into()), limits), (Subject::Bucket("b".into()), limits)];
        let before = LimitTable::new(rows());
        throttle.admit(&before, Who::Token("t"), "c").unwrap();
        assert_eq!(throttle.admit(&before, Who::Token("t"), "c").unwrap_err().scope, "token", "through its entry");
        let after = LimitTable::new(rows());
        assert_eq!(throttle.admit(&after, Who::Token("t"), "c").unwrap_err().scope, "token", "the same counts");
        let other = Throttle::new(16);
        other.admit(&before, Who::Token("t"), "b").unwrap();
        assert_eq!(other.admit(&before, Who::Token("u"), "b").unwrap_err().scope, "bucket");
        throttle.admit(&before, Who::Token("u"), "b").unwrap();
    }

    #[test]
    fn a_changed_limit_applies_at_once() {
        let throttle = Throttle::new(16);
        let one = LimitTable::new([(Subject::Token("t".into()), LimitSet { requests: rate(1), ..Default::default() })]);
        throttle.admit(&one, Who::Token("t"), "b").unwrap();
        assert!(throttle.admit(&one, Who::Token("t"), "b").is_err());
        let ten =
            LimitTable::new([(Subject::Token("t".into()), LimitSet { requests: rate(10), ..Default::default() })]);
        throttle.admit(&ten, Who::Token("t"), "b").unwrap();
    }
}
