//! Test data set up through the library, in the test process: what `TestEnv::bucket`, `put_bytes`, `token` and
//! `s3::s3_key` do, by the functions `blobgate bucket create`, `put`, `token create` and `s3-key create` run
//! (`blobgate::cli::{create_bucket, put, create_token, create_s3_key}`), with their arguments parsed by the CLI's
//! own parser, on the env's data dir and database. A server running beside sees these writes through its change
//! feed as it sees the CLI's. A process per fixture was most of what setting up a test cost; tests of the CLI
//! itself use [`TestEnv::by_cli`] (or `env.ok`, `env.cli`).

use std::sync::{Mutex, MutexGuard, OnceLock};

use blobgate::cli::{BucketCommand, Cli, Command, S3KeyCommand, TokenCommand};
use blobgate::config::Settings;
use blobgate::store::{Store, unix_now};
use clap::Parser;

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

/// `blobgate ARGS` parsed as the binary parses it: a fixture means what the command line means.
fn command(args: &[&str]) -> Command {
    let argv = std::iter::once("blobgate").chain(args.iter().copied());
    Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("blobgate {args:?}: {e}")).command
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
        let mut args = vec!["bucket", "create", name];
        if public {
            args.push("--public");
        }
        if self.fixtures.by_cli {
            self.ok(&args);
            return;
        }
        let Command::Bucket(BucketCommand::Create { name, public }) = command(&args) else { unreachable!() };
        self.on_store(&format!("{args:?}"), async |store| {
            blobgate::cli::create_bucket(store, &name, public).await.map(drop)
        });
    }

    /// `blobgate put BUCKET KEY FILE EXTRA...` of `bytes`; returns the JSON it prints.
    pub fn put_bytes(&self, bucket: &str, key: &str, bytes: &[u8], extra: &[&str]) -> serde_json::Value {
        let path = self.dir.path().join(format!("upload-{}", rand_u64()));
        std::fs::write(&path, bytes).unwrap();
        let args = [&["put", bucket, key, path.to_str().unwrap()][..], extra].concat();
        let report = if self.fixtures.by_cli {
            serde_json::from_str(self.ok(&args).trim()).expect("put prints JSON")
        } else {
            let Command::Put(put) = command(&args) else { unreachable!() };
            self.on_store(&format!("{args:?}"), async |store| {
                Ok(serde_json::to_value(blobgate::cli::put(store, put).await?)?)
            })
        };
        std::fs::remove_file(&path).unwrap();
        report
    }

    /// `blobgate token create --bucket BUCKET --scope SCOPE EXTRA...`: the token.
    pub fn token(&self, bucket: &str, scope: &str, extra: &[&str]) -> String {
        let args = [&["token", "create", "--bucket", bucket, "--scope", scope][..], extra].concat();
        if self.fixtures.by_cli {
            return self.ok(&args).trim().to_owned();
        }
        let Command::Token(TokenCommand::Create { grant }) = command(&args) else { unreachable!() };
        self.on_store(&format!("{args:?}"), async |store| blobgate::cli::create_token(store, grant, unix_now()).await)
    }

    /// `blobgate s3-key create ARGS...`: its line, `ACCESS_KEY_ID SECRET_ACCESS_KEY`.
    pub fn s3_key_line(&self, args: &[&str]) -> String {
        let args = [&["s3-key", "create"][..], args].concat();
        if self.fixtures.by_cli {
            return self.ok(&args).trim().to_owned();
        }
        let Command::S3Key(S3KeyCommand::Create { grant }) = command(&args) else { unreachable!() };
        self.on_store(&format!("{args:?}"), async |store| {
            let (id, secret) = blobgate::cli::create_s3_key(store, grant, unix_now()).await?;
            Ok(format!("{id} {secret}"))
        })
    }

    /// Runs `op` on this env's store, opened as a write command of the CLI opens it (`Store::open`, which also
    /// creates the data dir and applies the migrations); a failure fails the test, naming `what`.
    pub(super) fn on_store<T>(&self, what: &str, op: impl AsyncFnOnce(&Store) -> anyhow::Result<T>) -> T {
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
