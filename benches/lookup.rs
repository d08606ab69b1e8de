//! Authorise-and-look-up cost at 1,000 and 1,000,000 objects: the per-request work before a byte is sent
//! (bucket, bearer-token check, object lookup), through the same `Catalog` and `auth` code the data path uses, on
//! either metadata backend.
//!
//!     cargo bench --bench lookup                     # SQLite, both sizes; prints p50/p99 for cold and warm lookups
//!     cargo bench --bench lookup -- 1000             # one size
//!     cargo bench --bench lookup -- both             # SQLite and PostgreSQL side by side, with the ratios
//!     cargo bench --bench lookup -- postgres 1000000
//!
//! PostgreSQL: the server named by `BLOBGATE_BENCH_POSTGRES_URL` (a superuser URL such as
//! `scripts/pg-cluster start DIR` prints; each run creates and drops its own database), or, without it, a
//! throw-away cluster that the bench starts with `scripts/pg-cluster` and stops at the end.
//!
//! Both sizes look up the same number of distinct keys (1,000, random over the whole table), so the only
//! variable is the table size. "cold" is each key's first lookup: it misses the in-memory caches and reads the
//! database (SQLite: one B-tree probe per table, its pages in the OS page cache; PostgreSQL: one round trip over
//! loopback TCP, its pages in shared buffers); "warm" is 20,000 more lookups of those keys, now cached. Timings are
//! per request, in microseconds. Compare sizes and backends side by side within one run; absolute numbers depend on
//! the machine.
//!
//! Rows are written without blob files (the lookup path never opens them): on SQLite through the store's own
//! write transaction, as before; on PostgreSQL by one bench-only `INSERT … SELECT FROM generate_series` (the
//! same rows, a few seconds for a million instead of two million round trips).

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

#[derive(Clone, Copy, PartialEq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// p50 and p99 of one (size, backend, kind), in µs.
type Row = (usize, Backend, &'static str, f64, f64);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = vec![1_000, 1_000_000];
    }
    let chosen = args.iter().find(|a| matches!(a.as_str(), "sqlite" | "postgres" | "both"));
    let backends = match chosen.map(String::as_str) {
        Some("postgres") => vec![Backend::Postgres],
        Some("both") => vec![Backend::Sqlite, Backend::Postgres],
        _ => vec![Backend::Sqlite],
    };
    let cluster = backends.contains(&Backend::Postgres).then(PostgresServer::start);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    println!("{:>10}  {:>8}  {:>6}  {:>9}  {:>9}", "objects", "backend", "kind", "p50 µs", "p99 µs");
    let mut rows: Vec<Row> = Vec::new();
    for n in sizes {
        // Side by side: each size on every backend before the next size.
        for &backend in &backends {
            rows.extend(runtime.block_on(run(n, backend, cluster.as_ref())));
        }
    }
    if backends.len() == 2 {
        println!("\nratio postgres/sqlite (p50, p99)");
        for &(n, backend, kind, p50, p99) in &rows {
            if backend != Backend::Postgres {
                continue;
            }
            let sqlite = rows.iter().find(|r| r.0 == n && r.1 == Backend::Sqlite && r.2 == kind).unwrap();
            println!("{n:>10}  {kind:>6}  {:>6.2}  {:>6.2}", p50 / sqlite.3, p99 / sqlite.4);
        }
    }
}

/// The PostgreSQL server the bench uses: `BLOBGATE_BENCH_POSTGRES_URL`, or a throw-away cluster of its own.
struct PostgresServer {
    url: String,
    cluster: Option<tempfile::TempDir>,
}

impl PostgresServer {
    fn start() -> Self {
        if let Ok(url) = std::env::var("BLOBGATE_BENCH_POSTGRES_URL") {
            return PostgresServer { url, cluster: None };
        }
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-cluster"))
            .arg("start")
            .arg(dir.path())
            .output()
            .expect("scripts/pg-cluster runs");
        assert!(out.status.success(), "scripts/pg-cluster start: {}", String::from_utf8_lossy(&out.stderr));
        let url = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        PostgresServer { url, cluster: Some(dir) }
    }

    /// A fresh database named `name` on the server (dropped first if an earlier run left it): its URL.
    async fn fresh_database(&self, name: &str) -> String {
        use sqlx::{Connection, Executor};
        let mut admin = sqlx::PgConnection::connect(&self.url).await.unwrap();
        admin.execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str()).await.unwrap();
        admin.execute(format!("CREATE DATABASE {name}").as_str()).await.unwrap();
        let (base, _) = self.url.rsplit_once('/').expect("the server URL ends in /DATABASE");
        format!("{base}/{name}")
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(dir) = &self.cluster {
            let _ = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-cluster"))
                .arg("stop")
                .arg(dir.path())
                .status();
        }
    }
}

/// The key of object `i`, as both bulk paths write it.
fn object_key(i: usize) -> String {
    format!("dir{}/object-{i:07}.bin", i % 100)
}

async fn run(objects: usize, backend: Backend, postgres: Option<&PostgresServer>) -> Vec<Row> {
    let dir = tempfile::tempdir().unwrap();
    let database_name = format!("bench_lookup_{objects}_{}", std::process::id());
    let postgres_url = match backend {
        Backend::Sqlite => None,
        Backend::Postgres => Some(postgres.unwrap().fresh_database(&database_name).await),
    };
    let database = match &postgres_url {
        None => blobgate::config::DatabaseUrl::in_data_dir(dir.path()),
        Some(url) => blobgate::config::DatabaseUrl::parse(url).unwrap(),
    };
    let store = Store::open(dir.path(), &database, Duration::from_secs(10)).await.unwrap();
    let bucket = store.meta.create_bucket(&BucketName::parse("bench").unwrap(), false, 0).await.unwrap();
    // Rows only: the lookup path never touches blob files.
    let sha = "ab".repeat(32);
    match backend {
        Backend::Sqlite => {
            let mut tx = store.meta.begin_write().await.unwrap();
            for i in 0..objects {
                let key = ObjectKey::parse(&object_key(i)).unwrap();
                tx.upsert_object(bucket.id, &key, &sha, 4096, &ObjectAttrs::default(), 0).await.unwrap();
            }
            tx.commit().await.unwrap();
        }
        Backend::Postgres => bulk_insert_postgres(postgres_url.as_deref().unwrap(), bucket.id, &sha, objects).await,
    }
    let new = token::generate();
    store
        .meta
        .create_token(&TokenRecord {
            id: new.id.clone(),
            secret_hash: new.secret_hash.to_vec(),
            rights: blobgate::store::Rights {
                grants: vec![blobgate::store::Grant {
                    bucket: Some(blobgate::store::GrantedBucket { id: bucket.id, name: "bench".into() }),
                    prefix: String::new(),
                    scope: blobgate::store::Scope::Read,
                }],
                created_at: 0,
                expires_at: None,
                revoked_at: None,
            },
        })
        .await
        .unwrap();

    let catalog = Arc::new(Catalog::new(store.meta.clone(), store.blobs.clone(), 64).await.unwrap());
    let presign_max_lifetime = Settings::default().auth.presign_max_lifetime;
    let app = DataState::new(DataParts {
        log_principal: false,
        s3_domain: None,
        throttle: Default::default(),
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
    let mut rows = Vec::new();
    for (kind, mut t) in [("cold", cold), ("warm", warm)] {
        t.sort();
        let p = |q: f64| t[((t.len() as f64 * q) as usize).min(t.len() - 1)].as_secs_f64() * 1e6;
        println!("{objects:>10}  {:>8}  {kind:>6}  {:>9.2}  {:>9.2}", backend.name(), p(0.50), p(0.99));
        rows.push((objects, backend, kind, p(0.50), p(0.99)));
    }
    drop(app);
    drop(catalog);
    store.meta.close().await;
    if let (Some(server), Some(_)) = (postgres, &postgres_url) {
        use sqlx::{Connection, Executor};
        let mut admin = sqlx::PgConnection::connect(&server.url).await.unwrap();
        admin.execute(format!("DROP DATABASE IF EXISTS {database_name} WITH (FORCE)").as_str()).await.unwrap();
    }
    rows
}

/// The bench's bulk path for PostgreSQL: the rows the SQLite branch writes through `upsert_object`, in one
/// statement, then `ANALYZE` as autovacuum would do soon after. Triggers are off for this session (replica role):
/// no server is running yet, so a million change-log rows and notifications would only cost time.
async fn bulk_insert_postgres(url: &str, bucket_id: i64, sha: &str, objects: usize) {
    use sqlx::{Connection, Executor};
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    conn.execute("SET session_replication_role = replica").await.unwrap();
    sqlx::query(
        "INSERT INTO objects (bucket_id, key, sha256, size, created_at, updated_at)
         SELECT $1, 'dir' || (i % 100) || '/object-' || lpad(i::text, 7, '0') || '.bin', $2, 4096, 0, 0
         FROM generate_series(0, $3 - 1) AS i",
    )
    .bind(bucket_id)
    .bind(sha)
    .bind(objects as i64)
    .execute(&mut conn)
    .await
    .unwrap();
    conn.execute("ANALYZE").await.unwrap();
    conn.close().await.unwrap();
}

async fn time_lookups(app: &DataState, catalog: &Catalog, headers: &HeaderMap, picks: &[usize]) -> Vec<Duration> {
    let mut times = Vec::with_capacity(picks.len());
    for &i in picks {
        let path = format!("/bench/{}", object_key(i));
        let uri: Uri = path.parse().unwrap();
        let started = Instant::now();
        let (bucket_name, key) = blobgate::names::parse_object_path(uri.path()).unwrap();
        let bucket = catalog.bucket(bucket_name.as_str()).await.unwrap();
        let credentials = blobgate::auth::credentials(headers, uri.query()).unwrap();
        let grant = app.auth.read(&bucket_name, bucket.as_ref(), key.as_str(), credentials).await.unwrap();
        let entry = catalog.object(grant.bucket.id, key.as_str()).await.unwrap();
        times.push(started.elapsed());
        assert!(entry.is_some(), "{path} must exist");
    }
    times
}
