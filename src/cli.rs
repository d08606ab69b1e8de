//! The command line. Every command prints its result on stdout and, on bad input, one line on stderr with a
//! non-zero exit status (see `main.rs`).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

use crate::config::{FlagOverrides, Settings};
use crate::names::{BucketName, ObjectKey, parse_attrs};
use crate::store::{StatsOrder, Store, StoreError, unix_now};

#[derive(Debug, Parser)]
#[command(name = "blobgate", version, about = "Object-storage download gateway that serves blobs with sendfile(2)")]
pub struct Cli {
    /// Where the database and blob files live (created if missing) [env: BLOBGATE_DATA_DIR] [default: ./data]
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Settings file [default: config/default.toml when it exists]
    #[arg(long, global = true, value_name = "FILE", env = "BLOBGATE_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the data and admin listeners until SIGINT/SIGTERM, then drain gracefully.
    Serve {
        /// Data listener address [env: BLOBGATE_LISTEN] [default: 127.0.0.1:8080]
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Admin listener address [env: BLOBGATE_ADMIN_LISTEN] [default: 127.0.0.1:8081]
        #[arg(long, value_name = "ADDR")]
        admin_listen: Option<SocketAddr>,
    },
    /// Manage buckets.
    #[command(subcommand)]
    Bucket(BucketCommand),
    /// Store a copy of FILE as BUCKET/KEY; prints one JSON line.
    Put {
        bucket: String,
        key: String,
        file: PathBuf,
        #[arg(long, value_name = "TYPE")]
        content_type: Option<String>,
        #[arg(long, value_name = "VALUE")]
        cache_control: Option<String>,
        #[arg(long, value_name = "VALUE")]
        content_disposition: Option<String>,
    },
    /// Manage bearer tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Print a signed URL for BUCKET/KEY.
    Presign {
        bucket: String,
        key: String,
        /// Lifetime in seconds (at most auth.presign_max_lifetime).
        #[arg(long, value_name = "SECS", default_value_t = 3600)]
        expires_in: u64,
        /// Scheme, host and port of the data listener [default: http://<listen>]
        #[arg(long, value_name = "URL")]
        base_url: Option<String>,
        /// Make the response carry this Content-Disposition (e.g. `attachment`); covered by the signature.
        #[arg(long, value_name = "VALUE")]
        response_content_disposition: Option<String>,
    },
    /// Manage signed-URL keys, and revoke single signed URLs.
    #[command(subcommand)]
    Signing(SigningCommand),
    /// Per-object download stats, highest first.
    Stats {
        #[arg(long)]
        bucket: Option<String>,
        /// Only keys starting with this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Show this many objects.
        #[arg(long, value_name = "N")]
        top: Option<u32>,
        /// Order by bytes sent or by requests.
        #[arg(long, value_enum, default_value_t = StatsBy::Bytes)]
        by: StatsBy,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Store every regular file under DIR, keyed by its path relative to DIR (idempotent).
    Import {
        bucket: String,
        dir: PathBuf,
        /// Prepended to every key, e.g. `releases/v1/`.
        #[arg(long, default_value = "")]
        prefix: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum BucketCommand {
    /// Create a bucket; --public makes it readable without credentials.
    Create {
        name: String,
        #[arg(long)]
        public: bool,
    },
    /// List buckets as JSON lines.
    List,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StatsBy {
    Bytes,
    Requests,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it (it is shown only once).
    Create {
        #[arg(long)]
        bucket: String,
        /// Only keys starting with this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
        /// read (GET/HEAD), write (read + PUT/DELETE) or admin.
        #[arg(long, default_value = "read")]
        scope: String,
        /// Lifetime in seconds; without it the token does not expire.
        #[arg(long, value_name = "SECS")]
        expires_in: Option<u64>,
    },
    /// Revoke a token, given the token itself or its id. Takes effect on running servers at once.
    Revoke { token: String },
    /// List tokens as JSON lines (ids, scopes, expiry; never secrets).
    List,
}

#[derive(Debug, Subcommand)]
pub enum SigningCommand {
    /// Add a new signing key; new links are signed with it, old ones keep verifying.
    Rotate,
    /// Stop a key from verifying: every link signed with it stops working.
    Retire { key_id: String },
    /// List signing keys as JSON lines (never secrets).
    List,
    /// Revoke one signed URL.
    RevokeUrl { url: String },
}

impl Cli {
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let mut flags = FlagOverrides { data_dir: self.data_dir.clone(), ..Default::default() };
        if let Command::Serve { listen, admin_listen } = &self.command {
            flags.listen = *listen;
            flags.admin_listen = *admin_listen;
        }
        Settings::load(self.config.as_deref(), &flags)
    }
}

/// Runs a command other than `serve`.
pub async fn run_command(command: Command, settings: Settings) -> anyhow::Result<()> {
    let store = Store::open(&settings.data_dir, settings.timeouts.sqlite_busy).await?;
    let result = match command {
        Command::Serve { .. } => unreachable!("serve is run by main"),
        Command::Bucket(BucketCommand::Create { name, public }) => {
            let name = BucketName::parse(&name)?;
            let bucket = store.meta.create_bucket(&name, public, unix_now()).await?;
            println!("{}", serde_json::json!({ "bucket": bucket.name, "public": bucket.public }));
            Ok(())
        }
        Command::Bucket(BucketCommand::List) => {
            for b in store.meta.list_buckets().await? {
                println!("{}", serde_json::json!({ "bucket": b.name, "public": b.public }));
            }
            Ok(())
        }
        Command::Put { bucket, key, file, content_type, cache_control, content_disposition } => {
            let bucket = BucketName::parse(&bucket)?;
            let key = ObjectKey::parse(&key)?;
            let attrs = parse_attrs(content_type, cache_control, content_disposition)?;
            require_regular_file(&file)?;
            require_bucket(&store, &bucket).await?;
            warn_if_shared_caching_in_private_bucket(&store, &bucket, attrs.cache_control.as_deref()).await?;
            let blobs = store.blobs.clone();
            let staged = tokio::task::spawn_blocking(move || blobs.stage_file(&file, |_| {})).await??;
            let report = store.put(&bucket, &key, staged, attrs).await?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        Command::Import { bucket, dir, prefix } => import(&store, &bucket, &dir, &prefix).await,
        Command::Token(command) => crate::cli_auth::token(&store, command).await,
        Command::Presign { bucket, key, expires_in, base_url, response_content_disposition } => {
            let base_url = base_url.unwrap_or_else(|| format!("http://{}", settings.listen));
            let request =
                crate::cli_auth::PresignRequest { bucket, key, expires_in, base_url, response_content_disposition };
            crate::cli_auth::presign(&store, &settings, request).await
        }
        Command::Signing(command) => crate::cli_auth::signing(&store, command).await,
        Command::Stats { bucket, prefix, top, by, json } => stats(&store, bucket, &prefix, top, by, json).await,
    };
    store.meta.close().await;
    result
}

async fn stats(
    store: &Store,
    bucket: Option<String>,
    prefix: &str,
    top: Option<u32>,
    by: StatsBy,
    json: bool,
) -> anyhow::Result<()> {
    let bucket_id = match bucket {
        Some(name) => {
            let name = BucketName::parse(&name)?;
            Some(store.meta.bucket(&name).await?.ok_or_else(|| StoreError::NoSuchBucket(name.to_string()))?.id)
        }
        None => None,
    };
    let order = match by {
        StatsBy::Bytes => StatsOrder::Bytes,
        StatsBy::Requests => StatsOrder::Requests,
    };
    let rows = store.meta.object_stats(bucket_id, prefix, order, top).await?;
    if json {
        let array: Vec<_> = rows.iter().map(crate::metrics::downloads::stats_json).collect();
        println!("{}", serde_json::to_string(&array)?);
        return Ok(());
    }
    println!(
        "{:<40} {:>9} {:>9} {:>8} {:>15} {:>7} {:>7}  LAST_DOWNLOAD",
        "BUCKET/KEY", "REQUESTS", "COMPLETED", "ABORTED", "BYTES_SENT", "RANGES", "304S"
    );
    for s in &rows {
        let c = &s.counters;
        let last = crate::metrics::downloads::stats_json(s)["last_download_at"].as_str().unwrap_or("-").to_owned();
        println!(
            "{:<40} {:>9} {:>9} {:>8} {:>15} {:>7} {:>7}  {last}",
            format!("{}/{}", s.bucket, s.key),
            c.requests,
            c.completed,
            c.aborted,
            c.bytes_sent,
            c.range_requests,
            c.not_modified
        );
    }
    Ok(())
}

fn require_regular_file(path: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    Ok(())
}

async fn require_bucket(store: &Store, bucket: &BucketName) -> anyhow::Result<()> {
    if store.meta.bucket(bucket).await?.is_none() {
        return Err(StoreError::NoSuchBucket(bucket.to_string()).into());
    }
    Ok(())
}

/// A private bucket's responses never let shared caches store them, whatever the stored Cache-Control says: say
/// so (one line on stderr) when the uploader asked for `public` or `s-maxage`, and what will be sent instead.
async fn warn_if_shared_caching_in_private_bucket(
    store: &Store,
    bucket: &BucketName,
    cache_control: Option<&str>,
) -> anyhow::Result<()> {
    use crate::http::representation::{allows_shared_caching, private_cache_control};
    let Some(value) = cache_control.filter(|v| allows_shared_caching(v)) else { return Ok(()) };
    if store.meta.bucket(bucket).await?.is_some_and(|b| !b.public) {
        let sent = private_cache_control(Some(value));
        eprintln!(
            "blobgate: warning: bucket {bucket} is private, so this object is served with Cache-Control: {} \
             (shared caches must not keep private objects)",
            sent.to_str().unwrap_or("private")
        );
    }
    Ok(())
}

/// Imports a directory tree. Every key is checked before anything is stored, so a bad name stores nothing.
async fn import(store: &Store, bucket: &str, dir: &Path, prefix: &str) -> anyhow::Result<()> {
    let bucket = BucketName::parse(bucket)?;
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    require_bucket(store, &bucket).await?;
    let mut files = Vec::new();
    for entry in walkdir::WalkDir::new(dir).follow_links(false).sort_by_file_name() {
        let entry = entry.with_context(|| format!("cannot walk {}", dir.display()))?;
        // Symlinks and special files are skipped: only regular files become objects.
        if !entry.file_type().is_file() {
            continue;
        }
        let relative = entry.path().strip_prefix(dir).expect("walkdir yields paths under its root");
        let relative = relative.to_str().with_context(|| format!("{} is not valid UTF-8", entry.path().display()))?;
        let key = ObjectKey::parse(&format!("{prefix}{}", relative.replace(std::path::MAIN_SEPARATOR, "/")))
            .with_context(|| format!("cannot import {}", entry.path().display()))?;
        let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
        files.push((entry.into_path(), key, size));
    }
    let total: u64 = files.iter().map(|f| f.2).sum();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let (mut created, mut replaced, mut unchanged) = (0u64, 0u64, 0u64);
    for (path, key, _) in files.iter() {
        bar.set_message(key.to_string());
        let blobs = store.blobs.clone();
        let (path, progress) = (path.clone(), bar.clone());
        let staged = tokio::task::spawn_blocking(move || blobs.stage_file(&path, |n| progress.inc(n))).await??;
        match store.put(&bucket, key, staged, Default::default()).await?.status {
            "created" => created += 1,
            "replaced" => replaced += 1,
            _ => unchanged += 1,
        }
    }
    bar.finish_and_clear();
    let summary = serde_json::json!({
        "bucket": bucket.as_str(), "files": files.len(), "bytes": total,
        "created": created, "replaced": replaced, "unchanged": unchanged,
    });
    writeln!(std::io::stdout(), "{summary}")?;
    Ok(())
}
