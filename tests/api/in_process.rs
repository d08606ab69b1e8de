//! The application in the test process: `spawn_app` builds it with `Application::build` on port 0 over a
//! throw-away data dir and serves it on a runtime of its own, so service-level tests need neither the binary nor
//! its CLI. The real-binary harness (`helpers::TestEnv`) stays for what only a process shows: signals, exit
//! codes, the CLI, syscalls, fds.
//!
//! Metrics are process-wide (one Prometheus recorder), so tests here do not assert metric values.

use std::net::SocketAddr;
use std::time::Duration;

use blobgate::config::Settings;
use blobgate::names::{BucketName, ObjectAttrs, ObjectKey, parse_attrs};
use blobgate::startup::Application;
use blobgate::store::{Store, unix_now};

use crate::helpers::{Response, admin_request_at, request_at};

/// A running in-process gateway. Dropping it shuts the application down and removes its data dir.
pub struct TestApp {
    pub data: SocketAddr,
    pub admin: SocketAddr,
    /// A second handle on the data dir, as the CLI would hold: what it writes reaches the gateway's caches
    /// through the change feed. (`None` once dropped, before the application stops.)
    store: Option<Store>,
    runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

/// Builds and starts the application on 127.0.0.1 port 0 (both listeners, one data worker).
pub fn spawn_app() -> TestApp {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = Settings {
        data_dir: dir.path().join("data"),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..Settings::default()
    };
    settings.runtime.data_workers = 1;
    let busy = settings.timeouts.sqlite_busy;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let app = runtime.block_on(Application::build(settings.clone())).expect("build the application");
    let (data, admin) = (app.data_addr(), app.admin_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = runtime.spawn(app.run_until(async {
        let _ = stopped.await;
    }));
    let store = runtime
        .block_on(Store::open(&settings.data_dir, &settings.database_url().expect("database url"), busy))
        .expect("open the store");
    let app = TestApp { data, admin, store: Some(store), runtime, stop: Some(stop), served: Some(served), _dir: dir };
    let ready = crate::helpers::wait_for(Duration::from_secs(30), || app.admin("GET", "/healthz").status == 200);
    assert!(ready, "the in-process application did not become ready");
    app
}

impl TestApp {
    fn store(&self) -> &Store {
        self.store.as_ref().expect("the store handle is open until the app is dropped")
    }

    pub fn bucket(&self, name: &str, public: bool) {
        let name = BucketName::parse(name).expect("bucket name");
        self.runtime.block_on(self.store().meta.create_bucket(&name, public, unix_now())).expect("create bucket");
    }

    /// Stores `bytes` as `bucket/key`; returns the blob's SHA-256.
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) -> String {
        let (bucket, key) = (BucketName::parse(bucket).expect("bucket name"), ObjectKey::parse(key).expect("key"));
        let mut writer = self.store().blobs.writer().expect("stage a blob");
        writer.write(bytes).expect("write the staged blob");
        let staged = writer.finish().expect("finish the staged blob");
        let report =
            self.runtime.block_on(self.store().put(&bucket, &key, staged, ObjectAttrs::default())).expect("put");
        report.sha256
    }

    /// `blobgate put BUCKET KEY FILE EXTRA...` of `bytes`, with the attribute flags it takes (`--content-type`,
    /// `--cache-control`, `--content-disposition`, each followed by its value): the JSON it prints.
    pub fn put_with(&self, bucket: &str, key: &str, bytes: &[u8], extra: &[&str]) -> serde_json::Value {
        let (bucket, key) = (BucketName::parse(bucket).expect("bucket name"), ObjectKey::parse(key).expect("key"));
        let (mut content_type, mut cache_control, mut disposition) = (None, None, None);
        for flag in extra.chunks(2) {
            let slot = match flag[0] {
                "--content-type" => &mut content_type,
                "--cache-control" => &mut cache_control,
                "--content-disposition" => &mut disposition,
                other => panic!("put_with takes no {other}"),
            };
            *slot = Some(flag.get(1).expect("a value after the flag").to_string());
        }
        let attrs = parse_attrs(content_type, cache_control, disposition).expect("valid attributes");
        let mut writer = self.store().blobs.writer().expect("stage a blob");
        writer.write(bytes).expect("write the staged blob");
        let staged = writer.finish().expect("finish the staged blob");
        let report = self.runtime.block_on(self.store().put(&bucket, &key, staged, attrs)).expect("put");
        serde_json::to_value(report).expect("the put report as JSON")
    }

    /// `blobgate token create --bucket BUCKET --scope SCOPE`: the token.
    pub fn token(&self, bucket: &str, scope: &str) -> String {
        let grant = blobgate::cli::GrantArgs {
            bucket: Some(bucket.to_owned()),
            prefix: None,
            scope: Some(scope.to_owned()),
            grants: Vec::new(),
            expires_in: None,
        };
        self.runtime.block_on(blobgate::cli::create_token(self.store(), grant, unix_now())).expect("token create")
    }

    /// Stores `bytes` as `bucket/key` with `attrs`, last modified at `modified` (unix seconds), as a put made then
    /// would have. Returns the SHA-256.
    pub fn put_modified_at(&self, bucket: &str, key: &str, bytes: &[u8], attrs: ObjectAttrs, modified: i64) -> String {
        let (bucket, key) = (BucketName::parse(bucket).expect("bucket name"), ObjectKey::parse(key).expect("key"));
        let store = self.store();
        let mut writer = store.blobs.writer().expect("stage a blob");
        writer.write(bytes).expect("write the staged blob");
        let staged = writer.finish().expect("finish the staged blob");
        self.runtime
            .block_on(async {
                let mut tx = store.meta.lock_blob_refs().await?;
                let found = tx.bucket(&bucket).await?.ok_or_else(|| anyhow::anyhow!("no bucket {bucket}"))?;
                store.blobs.install(&staged)?;
                tx.upsert_object(found.id, &key, &staged.sha256, staged.size, &attrs, modified).await?;
                tx.commit().await?;
                anyhow::Ok(())
            })
            .expect("an object dated in the past");
        staged.sha256.clone()
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        request_at(self.data, "GET", path, headers)
    }

    /// One request to the data listener on a fresh connection (`Connection: close`).
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        request_at(self.data, method, path, headers)
    }

    /// GET with `Authorization: Bearer <token>`.
    pub fn get_auth(&self, path: &str, token: &str, headers: &[(&str, &str)]) -> Response {
        let auth = format!("Bearer {token}");
        let mut all = vec![("Authorization", auth.as_str())];
        all.extend_from_slice(headers);
        self.get(path, &all)
    }

    pub fn admin(&self, method: &str, path: &str) -> Response {
        admin_request_at(self.admin, method, path, &[], b"")
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // This handle goes first, without `close`: that waits for SQLite's WAL to go, which cannot while the
        // application holds the database (a second, every time). Its connections close in the background, and the
        // application's own close, the last, removes the WAL.
        drop(self.store.take());
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            let result = self.runtime.block_on(async { tokio::time::timeout(Duration::from_secs(30), served).await });
            if !std::thread::panicking() {
                let stopped = result.expect("the application stopped within 30 s").expect("the serve task");
                stopped.expect("the application ran without error");
            }
        }
    }
}
