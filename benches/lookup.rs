//! Authorise-and-look-up cost at 1,000 and 1,000,000 objects: the per-request work before a byte is sent
//! (bucket, bearer-token check, object lookup), through the same `Catalog` and `auth` code the data path uses.
//!
//!     cargo bench --bench lookup            # both sizes; prints p50/p99 for cold and warm lookups
//!     cargo bench --bench lookup -- 1000    # one size
//!
//! Both sizes look up the same number of distinct keys (1,000, random over the whole table), so the only
//! variable is the table size. "cold" is each key's first lookup: it misses the in-memory caches and reads SQLite
//! (one B-tree probe per table, its pages in the OS page cache); "warm" is 20,000 more lookups of those keys, now
//! cached. Timings are per request, in microseconds. Compare the two sizes side by side within one run; absolute
//! numbers depend on the machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blobgate::auth::Authorizer;
use blobgate::auth::token;
use blobgate::catalog::Catalog;
use blobgate::config::Settings;
use blobgate::http::range::RangePolicy;
use blobgate::http::{DataParts, DataState};
use blobgate::names::{BucketName, ObjectAttrs, ObjectKey};
use blobgate::store::{Store, TokenRecord};
use http::{HeaderMap, HeaderValue, Uri, header};

const SAMPLES: usize = 20_000;
/// Distinct keys looked up at every table size.
const HOT_KEYS: usize = 1_000;

fn main() {
    let sizes: Vec<usize> = match std::env::args().skip(1).find_map(|a| a.parse().ok()) {
        Some(n) => vec![n],
        None => vec![1_000, 1_000_000],
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    println!("{:>10}  {:>6}  {:>9}  {:>9}", "objects", "kind", "p50 µs", "p99 µs");
    for n in sizes {
        runtime.block_on(run(n));
    }
}

async fn run(objects: usize) {
    let dir = tempfile::tempdir().unwrap();
    let database = blobgate::config::DatabaseUrl::in_data_dir(dir.path());
    let store = Store::open(dir.path(), &database, Duration::from_secs(10)).await.unwrap();
    let bucket = store.meta.create_bucket(&BucketName::parse("bench").unwrap(), false, 0).await.unwrap();
    // Rows only: the lookup path never touches blob files.
    let mut tx = store.meta.begin_write().await.unwrap();
    let sha = "ab".repeat(32);
    for i in 0..objects {
        let key = ObjectKey::parse(&format!("dir{}/object-{i:07}.bin", i % 100)).unwrap();
        tx.upsert_object(bucket.id, &key, &sha, 4096, &ObjectAttrs::default(), 0).await.unwrap();
    }
    tx.commit().await.unwrap();
    let new = token::generate();
    store
        .meta
        .create_token(&TokenRecord {
            id: new.id.clone(),
            secret_hash: new.secret_hash.to_vec(),
            bucket_id: bucket.id,
            bucket_name: "bench".into(),
            prefix: String::new(),
            scope: blobgate::store::Scope::Read,
            created_at: 0,
            expires_at: None,
            revoked_at: None,
        })
        .await
        .unwrap();

    let catalog = Arc::new(Catalog::new(store.meta.clone(), store.blobs.clone(), 64).await.unwrap());
    let presign_max_lifetime = Settings::default().auth.presign_max_lifetime;
    let app = DataState::new(DataParts {
        log_principal: false,
        catalog: catalog.clone(),
        auth: Authorizer::new(catalog.clone(), presign_max_lifetime),
        range_policy: RangePolicy::default(),
    });
    let mut headers = HeaderMap::new();
    headers.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {}", new.token)).unwrap());

    // Cold: distinct random keys, never looked up before (the object cache misses; bucket and token hit).
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |bound: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % bound as u64) as usize
    };
    // The same working set at every size, so the only variable is how many objects the table holds: HOT_KEYS
    // distinct keys spread over the whole table. Cold: each looked up once, so every lookup misses the caches.
    // Warm: SAMPLES lookups drawn from those keys, now cached.
    let mut hot = std::collections::BTreeSet::new();
    while hot.len() < HOT_KEYS.min(objects) {
        hot.insert(next(objects));
    }
    let mut hot: Vec<usize> = hot.into_iter().collect();
    for i in (1..hot.len()).rev() {
        hot.swap(i, next(i + 1));
    }
    let cold = time_lookups(&app, &catalog, &headers, &hot).await;
    let picks: Vec<usize> = (0..SAMPLES).map(|_| hot[next(hot.len())]).collect();
    let warm = time_lookups(&app, &catalog, &headers, &picks).await;
    for (kind, mut t) in [("cold", cold), ("warm", warm)] {
        t.sort();
        let p = |q: f64| t[((t.len() as f64 * q) as usize).min(t.len() - 1)].as_secs_f64() * 1e6;
        println!("{objects:>10}  {kind:>6}  {:>9.2}  {:>9.2}", p(0.50), p(0.99));
    }
}

async fn time_lookups(app: &DataState, catalog: &Catalog, headers: &HeaderMap, picks: &[usize]) -> Vec<Duration> {
    let mut times = Vec::with_capacity(picks.len());
    for &i in picks {
        let path = format!("/bench/dir{}/object-{i:07}.bin", i % 100);
        let uri: Uri = path.parse().unwrap();
        let started = Instant::now();
        let (bucket_name, key) = blobgate::names::parse_object_path(uri.path()).unwrap();
        let bucket = catalog.bucket(bucket_name.as_str()).await.unwrap();
        let credentials = blobgate::auth::credentials(headers, uri.query()).unwrap();
        let grant = app.auth.read(&bucket_name, bucket.as_ref(), &key, credentials).await.unwrap();
        let entry = catalog.object(grant.bucket.id, key.as_str()).await.unwrap();
        times.push(started.elapsed());
        assert!(entry.is_some(), "{path} must exist");
    }
    times
}
