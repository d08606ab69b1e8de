//! The per-request cost of SigV4 header auth on a typical GetObject, beside the bearer check it competes with:
//! time per request (p50 and mean over batches) and heap allocations per request, in one run.
//!
//!     cargo bench --bench sigv4
//!
//! The request is the S3 documentation's signed GetObject with a Range ("Examples: Signature Calculations": its
//! headers and signature, verified at its own time), so no signature here comes from our code. "sigv4" is what
//! `Authorizer::s3` does per request around the lookup of the key: `sigv4::parse` (syntax, scope, skew) and
//! `SigV4Auth::verify` (canonical request, string to sign, the cached signing key, constant-time compare).
//! "parse" is `sigv4::parse` alone ("sigv4" less "parse" is the verification). "bearer" is what the native path
//! does instead: `auth::credentials` and the token's hash compared with the stored one. The secret lookup is the
//! same cached map lookup for both and is left out.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use blobgate::auth::sigv4::{self, RequestParts, SigningKeyCache};
use blobgate::auth::{Credentials, credentials, token};
use http::{HeaderMap, HeaderName, HeaderValue};

/// Counts heap allocations, so the figure per request is exact whatever the machine's load.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; the caller guarantees `new_size` is valid for `layout`'s alignment.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const AKID: &str = "AKIAIOSFODNN7EXAMPLE";
const SECRET: &[u8] = b"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
const REGION: &str = "us-east-1";
/// 20130524T000000Z: the documentation example's time.
const EXAMPLE_TIME: i64 = 1_369_353_600;
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
const AUTHORIZATION: &str = "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,\
    SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,\
    Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41";

const BATCH: usize = 1_000;
const BATCHES: usize = 200;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
    }
    map
}

fn main() {
    let signed = headers(&[
        ("host", "examplebucket.s3.amazonaws.com"),
        ("range", "bytes=0-9"),
        ("x-amz-content-sha256", EMPTY_SHA256),
        ("x-amz-date", "20130524T000000Z"),
        ("authorization", AUTHORIZATION),
        ("user-agent", "Boto3/1.35.0 md/Botocore#1.35.0 ua/2.0 os/linux"),
    ]);
    let request = RequestParts { method: "GET", path: "/test.txt", query: None, headers: &signed };
    let keys = SigningKeyCache::default();
    let sigv4 = || {
        let auth = sigv4::parse(&request, REGION, EXAMPLE_TIME).unwrap().unwrap();
        assert_eq!(auth.access_key_id, AKID);
        auth.verify(&request, SECRET, &keys).expect("the documentation's signature verifies")
    };

    let minted = token::generate();
    let bearer_headers = headers(&[
        ("host", "examplebucket.s3.amazonaws.com"),
        ("range", "bytes=0-9"),
        ("authorization", &format!("Bearer {}", minted.token)),
        ("user-agent", "curl/8.5.0"),
    ]);
    let bearer = || {
        let Credentials::Bearer(presented) = credentials(&bearer_headers, None).unwrap() else { unreachable!() };
        let id = token::token_id(presented);
        assert!(token::matches(presented, id, &minted.secret_hash));
        id.map(str::len)
    };

    // Warm the signing-key cache and the code, then interleave the two, batch by batch.
    for _ in 0..BATCH {
        black_box(sigv4());
        black_box(bearer());
    }
    let parse_only = || sigv4::parse(&request, REGION, EXAMPLE_TIME).unwrap().unwrap().signature[0] as usize;
    let (mut sigv4_ns, mut bearer_ns) = (Vec::with_capacity(BATCHES), Vec::with_capacity(BATCHES));
    let mut parse_ns = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        sigv4_ns.push(batch(|| black_box(sigv4()).payload.is_streaming() as usize));
        parse_ns.push(batch(|| black_box(parse_only())));
        bearer_ns.push(batch(|| black_box(bearer()).unwrap_or(0)));
    }
    let sigv4_allocs = allocations(|| black_box(sigv4()).payload.is_streaming() as usize);
    let bearer_allocs = allocations(|| black_box(bearer()).unwrap_or(0));

    println!("{:>8}  {:>9}  {:>9}  {:>11}", "path", "p50 ns", "mean ns", "allocations");
    let row = |name: &str, ns: &mut Vec<f64>, allocs: f64| {
        ns.sort_by(f64::total_cmp);
        let mean = ns.iter().sum::<f64>() / ns.len() as f64;
        println!("{name:>8}  {:>9.0}  {mean:>9.0}  {allocs:>11.1}", ns[ns.len() / 2]);
        ns[ns.len() / 2]
    };
    let s = row("sigv4", &mut sigv4_ns, sigv4_allocs);
    row("  parse", &mut parse_ns, allocations(|| black_box(parse_only())));
    let b = row("bearer", &mut bearer_ns, bearer_allocs);
    println!("\nsigv4 - bearer: {:.0} ns per request (p50 of batches of {BATCH})", s - b);
}

/// Nanoseconds per call over one batch.
fn batch(mut f: impl FnMut() -> usize) -> f64 {
    let started = Instant::now();
    let mut sink = 0;
    for _ in 0..BATCH {
        sink += f();
    }
    black_box(sink);
    started.elapsed().as_nanos() as f64 / BATCH as f64
}

/// Heap allocations per call.
fn allocations(mut f: impl FnMut() -> usize) -> f64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..BATCH {
        black_box(f());
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / BATCH as f64
}
