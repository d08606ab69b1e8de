//! Test data set up through the library, in the test process: what `TestEnv::bucket`, `put_bytes`, `token` and
//! `s3::s3_key` do, with the store calls `blobgate bucket create`, `put`, `token create` and `s3-key create` make
//! (`src/cli/mod.rs`, `src/cli/auth.rs`), on the env's data dir and database. A server running beside sees these
//! writes through its change feed as it sees the CLI's. A process per fixture was most of what setting up a test
//! cost; tests of the CLI itself use [`TestEnv::by_cli`] (or `env.ok`, `env.cli`).
//!
//! Flags these helpers do not read (a form the CLI takes that they do not) send the call to the CLI instead, so a
//! fixture never quietly means something else than the command it stands for.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock};

use anyhow::{Context, bail};
use blobgate::config::Settings;
use blobgate::names::{BucketName, ObjectKey, parse_attrs};
use blobgate::store::{Grant, GrantedBucket, Rights, S3KeyRecord, Scope, Store, TokenRecord, unix_now};

use super::{TestEnv, rand_u64};

/// The library side of a [`TestEnv`]: a runtime of its own, and on PostgreSQL the open store.
#[derive(Default)]
pub struct Fixtures {
    /// Every fixture through the CLI, as before (`TestEnv::by_cli`).
    by_cli: bool,
    runtime: OnceLock<tokio::runtime::Runtime>,
    /// PostgreSQL: the store stays open between fixtures (each new connection costs a SCRAM exchange, slow in a
    /// debug build). SQLite: opened and closed by each fixture, as the CLI does, so nothing in the test process
    /// holds the database, its WAL or its lock between calls.
    kept: Mutex<Option<Store>>,
}

impl Drop for Fixtures {
    fn drop(&mut self) {
        let kept = self.kept.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let (Some(store), Some(runtime)) = (kept, self.runtime.get()) {
            runtime.block_on(store.meta.close());
        }
    }
}

impl TestEnv {
    /// This env with every fixture (`bucket`, `put_bytes`, `token`, `s3_key`) made by the `blobgate` binary: for
    /// tests of the CLI, whose output those fixtures return.
    pub fn by_cli(mut self) -> Self {
        self.fixtures.by_cli = true;
        self
    }

    /// `blobgate bucket create NAME [--public]`.
    pub fn bucket(&self, name: &str, public: bool) {
        if self.fixtures.by_cli {
            let mut args = vec!["bucket", "create", name];
            if public {
                args.push("--public");
            }
            self.ok(&args);
            return;
        }
        self.on_store(&format!("bucket create {name}"), async |store| {
            store.meta.create_bucket(&BucketName::parse(name)?, public, unix_now()).await?;
            Ok(())
        });
    }

    /// `blobgate put BUCKET KEY FILE EXTRA...` of `bytes`; returns the JSON it prints.
    pub fn put_bytes(&self, bucket: &str, key: &str, bytes: &[u8], extra: &[&str]) -> serde_json::Value {
        let path = self.dir.path().join(format!("upload-{}", rand_u64()));
        std::fs::write(&path, bytes).unwrap();
        let report = match PutFlags::parse(extra).filter(|_| !self.fixtures.by_cli) {
            Some(flags) => self.on_store(&format!("put {bucket} {key} {extra:?}"), async |store| {
                let report = put(store, bucket, key, &path, flags).await?;
                Ok(serde_json::to_value(report)?)
            }),
            None => {
                let mut args = vec!["put", bucket, key, path.to_str().unwrap()];
                args.extend_from_slice(extra);
                serde_json::from_str(self.ok(&args).trim()).expect("put prints JSON")
            }
        };
        std::fs::remove_file(&path).unwrap();
        report
    }

    /// `blobgate token create --bucket BUCKET --scope SCOPE EXTRA...`: the token.
    pub fn token(&self, bucket: &str, scope: &str, extra: &[&str]) -> String {
        let mut args = vec!["--bucket", bucket, "--scope", scope];
        args.extend_from_slice(extra);
        match GrantFlags::parse(&args).filter(|_| !self.fixtures.by_cli) {
            Some(flags) => self.on_store(&format!("token create {args:?}"), async |store| {
                let rights = rights(store, flags).await?;
                let new = blobgate::auth::token::generate();
                let record = TokenRecord { id: new.id, secret_hash: new.secret_hash.to_vec(), rights };
                store.meta.create_token(&record).await?;
                Ok(new.token)
            }),
            None => self.ok(&[&["token", "create"][..], &args].concat()).trim().to_owned(),
        }
    }

    /// `blobgate s3-key create ARGS...`: its line, `ACCESS_KEY_ID SECRET_ACCESS_KEY`.
    pub fn s3_key_line(&self, args: &[&str]) -> String {
        match GrantFlags::parse(args).filter(|_| !self.fixtures.by_cli) {
            Some(flags) => self.on_store(&format!("s3-key create {args:?}"), async |store| {
                let rights = rights(store, flags).await?;
                let new = blobgate::auth::access_key::generate();
                store
                    .meta
                    .create_s3_key(&S3KeyRecord { id: new.id.clone(), secret: new.secret.clone(), rights })
                    .await?;
                Ok(format!("{} {}", new.id, new.secret))
            }),
            None => self.ok(&[&["s3-key", "create"][..], args].concat()).trim().to_owned(),
        }
    }

    /// Runs `op` on this env's store, opened as a write command of the CLI opens it (`Store::open`, which also
    /// creates the data dir and applies the migrations); a failure fails the test, naming `what`.
    fn on_store<T>(&self, what: &str, op: impl AsyncFnOnce(&Store) -> anyhow::Result<T>) -> T {
        let runtime = self.fixtures.runtime.get_or_init(|| {
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime for fixtures")
        });
        let mut kept = lock(&self.fixtures.kept);
        let store = match kept.take() {
            Some(store) => store,
            None => {
                let mut settings = Settings { data_dir: self.data_dir(), ..Settings::default() };
                settings.database.url = self.database_url.clone();
                let database = settings.database_url().expect("the env's database URL");
                runtime
                    .block_on(Store::open(&settings.data_dir, &database, settings.timeouts.database()))
                    .unwrap_or_else(|e| panic!("{what}: cannot open the store: {e:#}"))
            }
        };
        let result = runtime.block_on(op(&store));
        if self.database_url.is_some() {
            *kept = Some(store);
        } else {
            runtime.block_on(store.meta.close());
        }
        result.unwrap_or_else(|e| panic!("{what} failed: {e:#}"))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `put`'s flags: `--content-type V`, `--cache-control V`, `--content-disposition V`, `--precompress`.
#[derive(Default)]
struct PutFlags {
    content_type: Option<String>,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    precompress: bool,
}

impl PutFlags {
    /// `None` for anything else, or a flag given twice (which clap refuses).
    fn parse(args: &[&str]) -> Option<Self> {
        let mut flags = PutFlags::default();
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let slot = match *flag {
                "--precompress" if !flags.precompress => {
                    flags.precompress = true;
                    continue;
                }
                "--content-type" => &mut flags.content_type,
                "--cache-control" => &mut flags.cache_control,
                "--content-disposition" => &mut flags.content_disposition,
                _ => return None,
            };
            if slot.is_some() {
                return None;
            }
            *slot = Some(args.next()?.to_string());
        }
        Some(flags)
    }
}

/// What `blobgate put` does with a file (`cli/mod.rs`, `Command::Put`): stage it, add br and gzip variants of a
/// text-like type with `--precompress`, and store both in one write.
async fn put(
    store: &Store,
    bucket: &str,
    key: &str,
    file: &Path,
    flags: PutFlags,
) -> anyhow::Result<blobgate::store::PutReport> {
    let bucket = BucketName::parse(bucket)?;
    let key = ObjectKey::parse(key)?;
    let attrs = parse_attrs(flags.content_type, flags.cache_control, flags.content_disposition)?;
    blobgate::store::require_bucket(store.meta.bucket(&bucket).await?, &bucket)?;
    let staged = store.blobs.stage_file(file, |_| {})?;
    let content_type = blobgate::store::effective_content_type(attrs.content_type.as_deref(), key.as_str());
    let variants = if flags.precompress && blobgate::store::precompress::is_text_like(&content_type) {
        blobgate::store::precompress::compress_file(&store.blobs, file, staged.size)?
    } else {
        Vec::new()
    };
    Ok(store.put_with_variants(&bucket, &key, staged, attrs, variants).await?)
}

/// The grant flags of `token create` and `s3-key create` (`--bucket`, `--prefix`, `--scope`, `--grant`,
/// `--expires-in SECONDS`).
#[derive(Default)]
struct GrantFlags {
    bucket: Option<String>,
    prefix: Option<String>,
    scope: Option<String>,
    grants: Vec<String>,
    expires_in: Option<u64>,
}

impl GrantFlags {
    /// `None` for anything else: another flag or form, a flag given twice, a duration that is not whole seconds.
    fn parse(args: &[&str]) -> Option<Self> {
        let mut flags = GrantFlags::default();
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let value = args.next()?.to_string();
            let slot = match *flag {
                "--grant" => {
                    flags.grants.push(value);
                    continue;
                }
                "--expires-in" if flags.expires_in.is_none() => {
                    flags.expires_in = Some(value.parse().ok()?);
                    continue;
                }
                "--bucket" => &mut flags.bucket,
                "--prefix" => &mut flags.prefix,
                "--scope" => &mut flags.scope,
                _ => return None,
            };
            if slot.replace(value).is_some() {
                return None;
            }
        }
        Some(flags)
    }
}

/// The rights the CLI grants for these flags (`cli/auth.rs`, `rights`): the one-grant form first, then each
/// `--grant`, every bucket looked up; the expiry from now.
async fn rights(store: &Store, flags: GrantFlags) -> anyhow::Result<Rights> {
    let mut specs = Vec::new();
    match flags.bucket {
        Some(bucket) => {
            let scope = flags.scope.as_deref().unwrap_or("read");
            let scope = Scope::parse(scope).with_context(|| format!("invalid scope {scope:?}"))?;
            specs.push((Some(bucket), flags.prefix.unwrap_or_default(), scope));
        }
        None if flags.prefix.is_some() || flags.scope.is_some() => bail!("--prefix and --scope go with --bucket"),
        None if flags.grants.is_empty() => bail!("give --bucket NAME or --grant BUCKET[/PREFIX]:SCOPE"),
        None => {}
    }
    for spec in &flags.grants {
        let (target, scope) = spec.rsplit_once(':').with_context(|| format!("invalid --grant {spec:?}"))?;
        let scope = Scope::parse(scope).with_context(|| format!("invalid --grant {spec:?}"))?;
        let (bucket, prefix) = target.split_once('/').unwrap_or((target, ""));
        specs.push(((bucket != "*").then(|| bucket.to_owned()), prefix.to_owned(), scope));
    }
    let mut grants = Vec::with_capacity(specs.len());
    for (bucket, prefix, scope) in specs {
        if !prefix.is_empty() {
            ObjectKey::parse(&prefix).with_context(|| format!("invalid prefix {prefix:?}"))?;
        }
        let bucket = match bucket {
            Some(name) => {
                let name = BucketName::parse(&name)?;
                let found = blobgate::store::require_bucket(store.meta.bucket(&name).await?, &name)?;
                Some(GrantedBucket { id: found.id, name: found.name })
            }
            None => None,
        };
        grants.push(Grant { bucket, prefix, scope });
    }
    let now = unix_now();
    let expires_at = match flags.expires_in {
        Some(0) => bail!("--expires-in must be at least 1 second"),
        Some(secs) => Some(now.saturating_add(i64::try_from(secs)?)),
        None => None,
    };
    Ok(Rights { grants, created_at: now, expires_at, revoked_at: None })
}
