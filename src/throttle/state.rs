//! What one replica counts per principal, shared by its data workers: a request bucket (GCRA, `governor`: one
//! compare-and-swap per request, no lock), the requests in progress and byte buckets (one compare-and-swap per
//! grant). A principal's counters live in a bounded map, and a named principal's also in the limits table that
//! found them there (each worker's copy reaches them without the map); a limit changed by `limits set` starts them
//! again.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use quanta::Instant;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};
use quick_cache::Equivalent;

use crate::file_body::{Pace, Share};

use super::{LimitKind, LimitSet, Subject, Throttled, address_group, whole_secs_at_least_one};

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

/// A limit set on a token, an S3 key or a bucket, and its counters in the [`Throttle`] (by its id) once used.
#[derive(Debug, Clone)]
struct Named {
    limits: LimitSet,
    counters: OnceLock<(u64, Arc<Counters>)>,
}

/// The limit that covers a principal itself, where it was set, and its counters' slot when it was set on the
/// principal by name (the default and anonymous limits count each principal or group apart).
#[derive(Debug, Clone, Copy)]
struct Own<'t> {
    limits: &'t LimitSet,
    scope: &'static str,
    slot: Option<&'t OnceLock<(u64, Arc<Counters>)>>,
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

/// Bytes a second with a burst, shared by every response or upload its principal has in progress, on every
/// worker: a token bucket kept as the instant it was (or will be) empty, so that a grant is one compare-and-swap
/// and no lock (a chunk's, not a request's: but a small response is one chunk).
#[derive(Debug)]
struct ByteBucket {
    per_sec: f64,
    /// The burst, as the time the rate takes to fill it (nanoseconds).
    burst_nanos: f64,
    /// The least a grant gives (unless less is wanted), so that a low rate still sends chunks worth a syscall.
    quantum: f64,
    /// Nanoseconds after `origin` at which the bucket held nothing, counting what was taken since: at `t` it holds
    /// `min(burst, (t - empty_at) * per_sec)` bytes.
    empty_at: AtomicI64,
    origin: Instant,
}

impl ByteBucket {
    fn new(per_sec: u64, burst: u64) -> ByteBucket {
        let (per_sec, burst) = (per_sec.max(1) as f64, burst as f64);
        let quantum = (per_sec / 50.0).clamp(4096.0, 256.0 * 1024.0).min(burst);
        let burst_nanos = burst / per_sec * 1e9;
        ByteBucket {
            per_sec,
            burst_nanos,
            quantum,
            empty_at: AtomicI64::new(-(burst_nanos as i64)),
            origin: Instant::now(),
        }
    }

    /// Up to `want` bytes now, at least a quantum's (or `want`) worth; else how long until that many are there.
    fn take(&self, want: u64, now: Instant) -> Result<u64, Duration> {
        // Through u64: a u128's conversion to f64 is a library call.
        let now = now.saturating_duration_since(self.origin).as_nanos() as u64 as f64;
        let least = self.quantum.min(want as f64);
        let mut empty_at = self.empty_at.load(Ordering::Acquire);
        loop {
            // What was given beyond the burst is not kept: the bucket is never emptier than full at `now`.
            let from = (empty_at as f64).max(now - self.burst_nanos);
            let available = (now - from) * self.per_sec / 1e9;
            if available < least {
                return Err(Duration::from_secs_f64((least - available) / self.per_sec));
            }
            // `available` is at least `least`, so positive: the cast truncates, as floor would.
            let granted = (available as u64).min(want);
            let taken = from + granted as f64 / self.per_sec * 1e9;
            match self.empty_at.compare_exchange_weak(empty_at, taken as i64, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(granted),
                Err(current) => empty_at = current,
            }
        }
    }

    fn give_back(&self, bytes: u64) {
        let nanos = (bytes as f64 / self.per_sec * 1e9) as i64;
        self.empty_at.fetch_sub(nanos, Ordering::AcqRel);
    }
}

/// The counters that cover one request: its principal's and its bucket's, inline.
type Covering = smallvec::SmallVec<[Arc<Counters>; 2]>;

/// The bandwidth limits that cover one response (or upload): its principal's and its bucket's. A grant is what
/// all of them allow; what one gave beyond the others goes back to it.
#[derive(Debug)]
pub struct BytePace {
    counters: Covering,
    write: bool,
}

impl BytePace {
    fn bucket(counters: &Counters, write: bool) -> Option<&ByteBucket> {
        if write { counters.write.as_ref() } else { counters.read.as_ref() }
    }

    /// What every bucket of `covering` (in `write`'s direction) allows of `want`, taken from each.
    fn grant_from(covering: &[Arc<Counters>], write: bool, want: u64) -> Result<u64, Duration> {
        let now = Instant::now();
        let mut granted = want;
        for (i, counters) in covering.iter().enumerate() {
            let Some(bucket) = Self::bucket(counters, write) else { continue };
            match bucket.take(granted, now) {
                Ok(n) => {
                    // The buckets before this one gave `granted`; keep only what this one allows too.
                    for earlier in &covering[..i] {
                        if let Some(b) = Self::bucket(earlier, write) {
                            b.give_back(granted - n);
                        }
                    }
                    granted = n;
                }
                Err(wait) => {
                    for earlier in &covering[..i] {
                        if let Some(b) = Self::bucket(earlier, write) {
                            b.give_back(granted);
                        }
                    }
                    return Err(wait);
                }
            }
        }
        Ok(granted)
    }

    fn refund_to(covering: &[Arc<Counters>], write: bool, unsent: u64) {
        if unsent > 0 {
            for counters in covering {
                if let Some(bucket) = Self::bucket(counters, write) {
                    bucket.give_back(unsent);
                }
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
        self.covering.iter().find(|c| c.read.is_some()).map_or("default", |c| c.scope)
    }
}

/// The counters of one principal (or bucket, or anonymous address group) under one set of limits.
#[derive(Debug)]
struct Counters {
    limits: LimitSet,
    scope: &'static str,
    named: Option<Box<str>>,
    requests: Option<DefaultDirectRateLimiter>,
    in_progress: AtomicU32,
    read: Option<ByteBucket>,
    write: Option<ByteBucket>,
}

impl Counters {
    fn new(limits: LimitSet, scope: &'static str, named: Option<Box<str>>) -> Counters {
        let requests = limits.requests.map(|rate| {
            let burst = NonZeroU32::new(limits.request_burst().unwrap_or(1)).unwrap_or(NonZeroU32::MIN);
            let quota = Quota::with_period(rate.interval()).expect("a rate's interval is positive").allow_burst(burst);
            DefaultDirectRateLimiter::direct(quota)
        });
        let read = limits.read_bytes.zip(limits.read_burst()).map(|(rate, burst)| ByteBucket::new(rate, burst));
        let write = limits.write_bytes.zip(limits.write_burst()).map(|(rate, burst)| ByteBucket::new(rate, burst));
        Counters { limits, scope, named, requests, in_progress: AtomicU32::new(0), read, write }
    }

    /// Takes a place among the requests in progress, then a request from the bucket; gives the place back if the
    /// bucket refuses.
    fn admit(&self, clock: &DefaultClock) -> Result<(), Throttled> {
        if let Some(max) = self.limits.concurrent {
            let before = self.in_progress.fetch_add(1, Ordering::AcqRel);
            if before >= max {
                self.in_progress.fetch_sub(1, Ordering::AcqRel);
                return Err(Throttled {
                    kind: LimitKind::Concurrent,
                    scope: self.scope,
                    named: self.named.clone(),
                    quota: u64::from(max),
                    window_secs: 1,
                    retry_after_secs: 1,
                });
            }
        }
        let refused = match (&self.requests, self.limits.requests) {
            (Some(bucket), Some(rate)) => bucket.check().err().map(|not_until| (not_until, rate)),
            _ => None,
        };
        if let Some((not_until, rate)) = refused {
            self.release();
            return Err(Throttled {
                kind: LimitKind::Requests,
                scope: self.scope,
                named: self.named.clone(),
                quota: u64::from(rate.count),
                window_secs: u64::from(rate.period_secs),
                retry_after_secs: whole_secs_at_least_one(not_until.wait_time_from(clock.now())),
            });
        }
        Ok(())
    }

    fn release(&self) {
        if self.limits.concurrent.is_some() {
            self.in_progress.fetch_sub(1, Ordering::AcqRel);
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
    clock: DefaultClock,
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
        for counters in &self.covering {
            counters.release();
        }
    }
}

impl Throttle {
    pub fn new(principals: usize) -> Throttle {
        Throttle {
            counters: quick_cache::sync::Cache::new(principals),
            clock: DefaultClock::default(),
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
        let mut permit = Permit::default();
        if let Some(own) = own {
            let key = match who {
                Who::Token(id) => OwnerRef::Token(id),
                Who::S3Key(id) => OwnerRef::AccessKey(id),
                Who::Signer(id) => OwnerRef::Signer(id),
                Who::Anonymous(ip) => OwnerRef::Address(address_group(ip, own.limits.prefixes())),
            };
            self.admit_one(&mut permit, key, own)?;
        }
        if let Some(own) = table.bucket(bucket) {
            self.admit_one(&mut permit, OwnerRef::Bucket(bucket), own)?;
        }
        Ok((permit, share))
    }

    fn admit_one(&self, permit: &mut Permit, key: OwnerRef<'_>, own: Own<'_>) -> Result<(), Throttled> {
        let counters = match own.slot.and_then(OnceLock::get) {
            Some((throttle, counters)) if *throttle == self.id => counters.clone(),
            _ => {
                let counters = self.counters_of(key, own);
                if let Some(slot) = own.slot {
                    let _ = slot.set((self.id, counters.clone()));
                }
                counters
            }
        };
        counters.admit(&self.clock)?;
        if counters.read.is_some() || counters.write.is_some() || own.limits.concurrent.is_some() {
            permit.covering.push(counters);
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
    fn a_byte_bucket_grants_its_burst_then_waits_for_the_rate() {
        // 4 KiB a second: a quantum (4 KiB) takes a second to come back, longer than any pause between two lines.
        let bucket = ByteBucket::new(4096, 64 << 10);
        assert_eq!(bucket.take(1 << 20, Instant::now()), Ok(64 << 10), "the burst at once");
        let wait = bucket.take(64 << 10, Instant::now()).unwrap_err();
        assert!(wait <= Duration::from_secs(1) && wait > Duration::ZERO, "a quantum's time at most: {wait:?}");
        bucket.give_back(10_000);
        assert_eq!(bucket.take(5_000, Instant::now()), Ok(5_000), "what was given back");
    }

    #[test]
    fn a_pace_grants_what_every_covering_limit_allows_and_refunds_them_all() {
        let throttle = Throttle::new(16);
        let token = LimitSet { read_bytes: Some(10 << 20), read_burst: Some(1 << 20), ..Default::default() };
        let bucket = LimitSet { read_bytes: Some(4096), read_burst: Some(128 << 10), ..Default::default() };
        let table = LimitTable::new([(Subject::Token("t".into()), token), (Subject::Bucket("b".into()), bucket)]);
        let permit = throttle.admit(&table, Who::Token("t"), "b").unwrap();
        assert!(permit.write_pace().is_none(), "no write limit");
        let pace = permit.read_pace().unwrap();
        assert_eq!(pace.grant(4 << 20), Ok(128 << 10), "the bucket's burst, the smaller");
        pace.refund(128 << 10);
        assert_eq!(pace.grant(4 << 20), Ok(128 << 10), "refunded to both");
        assert!(pace.grant(4 << 20).is_err(), "the bucket is empty for a second");
        // The token's bucket gave only what the bucket's allowed: another bucket's request has the rest of its
        // burst (and what refilled meanwhile).
        let other = throttle.admit(&table, Who::Token("t"), "other").unwrap().read_pace().unwrap();
        let rest = other.grant(4 << 20).unwrap();
        assert!(((1 << 20) - (128 << 10)..=1 << 20).contains(&rest), "{rest}");
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
