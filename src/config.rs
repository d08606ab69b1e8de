//! Layered settings: built-in defaults < config file < `BLOBGATE_*` environment < command-line flags.
//!
//! This is the only module that reads the environment (but for `--config`'s `BLOBGATE_CONFIG`, which clap reads in
//! `cli`). Nested keys use `__` in the environment, e.g.
//! `BLOBGATE_LIMITS__MAX_HEAD_BYTES=32768` sets `limits.max_head_bytes`. Every error names the key it is about.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// Used when `--config` is not given and this file exists in the working directory.
pub const DEFAULT_CONFIG_FILE: &str = "config/default.toml";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Holds the blob files, and the SQLite database unless `database.url` names another.
    pub data_dir: PathBuf,
    pub database: DatabaseSettings,
    /// The public listener: downloads by sendfile, and uploads and S3 writes unless `listen_read_only`.
    pub listen: SocketAddr,
    /// Refuse writes on the data listener (405, S3 XML on S3 requests): downloads only, writes on the admin
    /// listener.
    pub listen_read_only: bool,
    /// Management: `/healthz`, `/readyz`, `/metrics`, `/stats`, and everything the data listener serves.
    pub admin_listen: SocketAddr,
    /// The public base of links to objects (`https://dl.example.com`): what `blobgate presign` prints (unless
    /// `--base-url`) and S3's `Location`. Unset: `http://<listen>` for presign, a path for `Location`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
    /// A `tracing` filter, e.g. `info` or `blobgate=debug`; `RUST_LOG` wins when set. sqlx's own lines show at
    /// `warn` and above unless the filter names `sqlx`.
    pub log: String,
    /// The process log's format on stderr: `text` (for people) or `json` (one JSON object a line, for shippers).
    pub log_format: LogFormat,
    /// The access log: one JSON line per response on both listeners; `-` is stdout; unset, none is written.
    /// Also `--access-log` and `BLOBGATE_ACCESS_LOG`. SIGHUP reopens the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_log: Option<PathBuf>,
    /// The mode a new access log file gets, in octal (`0640`: a log shipper in the file's group can read it),
    /// whatever the umask. An existing file keeps its own.
    #[serde(deserialize_with = "octal_digits")]
    pub access_log_mode: String,
    /// Whether the admin listener's probes (`/healthz`, `/readyz`, `/metrics`) are access-logged: a load balancer
    /// and a scraper ask every second or so, and their lines would bury the requests. `BLOBGATE_ACCESS_LOG_PROBES`.
    pub access_log_probes: bool,
    pub limits: Limits,
    pub timeouts: Timeouts,
    pub auth: AuthSettings,
    /// The S3-compatible API.
    pub s3: S3Settings,
    pub runtime: RuntimeSettings,
    /// HTTPS on both listeners (`--tls-cert`/`--tls-key`); unset, both speak plain HTTP.
    pub tls: TlsSettings,
    /// Fault injection for the test suite; every value is off by default.
    pub faults: Faults,
    /// Where blobs live: the data dir (unset `url`), or an S3-compatible object store.
    pub blob_store: BlobStoreSettings,
    /// With an object store, the data dir's cache of its blobs.
    pub cache: CacheSettings,
}

/// `blob_store`: unset `url` keeps blobs in the data dir; `s3://BUCKET[/PREFIX]` puts them in an object store.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BlobStoreSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The store's base URL (`http://127.0.0.1:9000`); unset, AWS S3's regional endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    pub region: String,
    /// Path-style requests (`ENDPOINT/BUCKET/KEY`), as MinIO, Ceph RGW and most self-hosted stores want.
    pub path_style: bool,
    /// Static credentials; unset, the standard AWS chain from the environment ([`StoreCredentials`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<String>,
    /// With temporary static credentials, their session token; unset, `AWS_SESSION_TOKEN`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_token: Option<String>,
    /// The EC2 instance metadata service as the chain's last resort (it is asked only when this is set).
    pub instance_metadata: bool,
    /// Unsigned requests (a public bucket): no credentials are looked for, and none is an error without it.
    pub anonymous: bool,
    /// PEM certificates trusted for an HTTPS endpoint, beside the system's (a private CA).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<PathBuf>,
    /// How long the store may keep a call waiting, so a hung store is a 503 soon rather than a hang.
    pub timeouts: BlobStoreTimeouts,
    /// When consecutive failures make calls fail fast for a while.
    pub breaker: BreakerSettings,
    /// Fetches (GETs) from the store in flight at once; a fetch waits at most `timeouts.first_byte` for a place,
    /// then fails as unavailable (503). Each holds at most a 1 MiB write batch, so fills hold at most this many MiB.
    pub max_fetches: usize,
}

/// `blob_store.timeouts`: only idleness is bounded, never a whole transfer (a large range may take long).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BlobStoreTimeouts {
    /// Opening a TCP (and TLS) connection to the store.
    #[serde(with = "humantime_serde")]
    pub connect: Duration,
    /// From sending a call until its response head (a listing page: its whole answer).
    #[serde(with = "humantime_serde")]
    pub first_byte: Duration,
    /// Between two chunks of a fetched body; an upload's PUT of one part (at most 8 MiB) gets this beyond
    /// `first_byte`.
    #[serde(with = "humantime_serde")]
    pub idle: Duration,
}

impl Default for BlobStoreTimeouts {
    fn default() -> Self {
        Self { connect: Duration::from_secs(3), first_byte: Duration::from_secs(5), idle: Duration::from_secs(5) }
    }
}

/// `blob_store.breaker`: after `failures` store calls in a row fail (unavailable or timed out; "not found" is an
/// answer), calls fail at once for `cool_down`; then one call probes the store, and its result closes or re-opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerSettings {
    pub failures: u32,
    #[serde(with = "humantime_serde")]
    pub cool_down: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self { failures: 5, cool_down: Duration::from_secs(5) }
    }
}

impl Default for BlobStoreSettings {
    fn default() -> Self {
        Self {
            url: None,
            endpoint: None,
            region: "us-east-1".into(),
            path_style: true,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            instance_metadata: false,
            anonymous: false,
            ca_bundle: None,
            timeouts: BlobStoreTimeouts::default(),
            breaker: BreakerSettings::default(),
            max_fetches: 64,
        }
    }
}

/// Never prints the secret.
impl std::fmt::Debug for BlobStoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStoreSettings")
            .field("url", &self.url)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("access_key_id", &self.access_key_id)
            .field("key_given", &self.secret_access_key.is_some())
            .field("session_token_given", &self.session_token.is_some())
            .field("instance_metadata", &self.instance_metadata)
            .field("anonymous", &self.anonymous)
            .field("ca_bundle", &self.ca_bundle)
            .field("timeouts", &self.timeouts)
            .field("breaker", &self.breaker)
            .field("max_fetches", &self.max_fetches)
            .finish()
    }
}

/// `cache`: the local cache of an object store's blobs, which bodies leave by sendfile, and the in-memory cache
/// of object metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheSettings {
    /// The in-memory cache of objects' metadata and prepared header fields, in bytes (each entry weighed by what
    /// it holds); beyond it, the entries least likely to be read again are dropped.
    pub metadata_bytes: u64,
    /// The cache's size on disk; least recently used blobs are evicted beyond it.
    pub max_bytes: u64,
    /// A cold read fetches the slices of this size (aligned from offset 0) that cover it.
    pub slice_bytes: u64,
    /// Cached blobs whose file stays open; others are reopened when read.
    pub max_open_files: usize,
    /// How often a read of a quarantined blob (its store copy failed its check) asks whether the copy changed.
    #[serde(with = "humantime_serde")]
    pub quarantine_recheck: Duration,
}

/// The chunk an object store blob's slice manifest digests (`store::manifest`): `cache.slice_bytes` is a whole
/// number of them.
pub const SLICE_CHECK_BYTES: u64 = 1 << 20;

impl Default for CacheSettings {
    fn default() -> Self {
        Self {
            metadata_bytes: 128 << 20,
            max_bytes: 10 << 30,
            slice_bytes: 8 << 20,
            max_open_files: 4096,
            quarantine_recheck: Duration::from_secs(30),
        }
    }
}

/// An object store as `blob_store` names it, checked: what the store needs to reach it.
#[derive(Clone, PartialEq, Eq)]
pub struct ObjectStoreLocation {
    pub bucket: String,
    /// Without leading or trailing `/`; empty for the bucket's root.
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: String,
    pub path_style: bool,
    pub credentials: StoreCredentials,
    pub ca_bundle: Option<PathBuf>,
    pub timeouts: BlobStoreTimeouts,
    pub breaker: BreakerSettings,
    pub max_fetches: usize,
}

/// Where the store's credentials come from: the AWS chain, in its order, the first source present wins. Values
/// are read here (the one module that reads the environment) and handed to `object_store`'s own providers.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreCredentials {
    /// `blob_store.access_key_id` / `secret_access_key` [/ `session_token`], or `AWS_ACCESS_KEY_ID` /
    /// `AWS_SECRET_ACCESS_KEY` [/ `AWS_SESSION_TOKEN`].
    Static { access_key_id: String, secret_access_key: String, session_token: Option<String>, from_env: bool },
    /// `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN` [+ `AWS_ROLE_SESSION_NAME`, `AWS_ENDPOINT_URL_STS`]: STS
    /// AssumeRoleWithWebIdentity (EKS IRSA).
    WebIdentity { token_file: String, role_arn: String, session_name: Option<String>, sts_endpoint: Option<String> },
    /// `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` (ECS: `http://169.254.170.2` + it).
    ContainerRelative { uri: String },
    /// `AWS_CONTAINER_CREDENTIALS_FULL_URI` + `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` (EKS Pod Identity).
    ContainerFull { uri: String, token_file: String },
    /// The EC2 instance metadata service (IMDSv2), with `blob_store.instance_metadata = true`.
    InstanceMetadata,
    /// `blob_store.anonymous = true`: unsigned requests.
    Anonymous,
}

impl StoreCredentials {
    /// The settings these credentials came from, as messages name them (never a value).
    pub fn source(&self) -> &'static str {
        match self {
            Self::Static { from_env: false, session_token: None, .. } => {
                "blob_store.access_key_id / blob_store.secret_access_key"
            }
            Self::Static { from_env: false, .. } => {
                "blob_store.access_key_id / blob_store.secret_access_key / blob_store.session_token"
            }
            Self::Static { from_env: true, session_token: None, .. } => "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
            Self::Static { from_env: true, .. } => "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN",
            Self::WebIdentity { .. } => "AWS_WEB_IDENTITY_TOKEN_FILE / AWS_ROLE_ARN",
            Self::ContainerRelative { .. } => "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            Self::ContainerFull { .. } => "AWS_CONTAINER_CREDENTIALS_FULL_URI / AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
            Self::InstanceMetadata => "blob_store.instance_metadata (the EC2 instance role)",
            Self::Anonymous => "blob_store.anonymous (unsigned requests)",
        }
    }

    /// The chain over `settings` and the environment variables `env` gives (empty ones count as unset).
    fn resolve(settings: &BlobStoreSettings, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let given = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let (id, secret, token) =
            (given(&settings.access_key_id), given(&settings.secret_access_key), given(&settings.session_token));
        if settings.anonymous {
            if id.is_some() || secret.is_some() || token.is_some() || settings.instance_metadata {
                bail!(
                    "blob_store.anonymous = true goes with no blob_store credentials (access_key_id, secret_access_key, session_token, instance_metadata)"
                );
            }
            return Ok(Self::Anonymous);
        }
        match (id, secret) {
            (Some(access_key_id), Some(secret_access_key)) => {
                return Ok(Self::Static { access_key_id, secret_access_key, session_token: token, from_env: false });
            }
            (None, None) if token.is_some() => {
                bail!("blob_store.session_token goes with blob_store.access_key_id and secret_access_key")
            }
            (None, None) => {}
            _ => bail!(
                "blob_store: set both access_key_id and secret_access_key (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or neither"
            ),
        }
        match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(access_key_id), Some(secret_access_key)) => {
                let session_token = env("AWS_SESSION_TOKEN");
                return Ok(Self::Static { access_key_id, secret_access_key, session_token, from_env: true });
            }
            (None, None) => {}
            _ => bail!(
                "blob_store: set both access_key_id and secret_access_key (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or neither"
            ),
        }
        match (env("AWS_WEB_IDENTITY_TOKEN_FILE"), env("AWS_ROLE_ARN")) {
            (Some(token_file), Some(role_arn)) => {
                let (session_name, sts_endpoint) = (env("AWS_ROLE_SESSION_NAME"), env("AWS_ENDPOINT_URL_STS"));
                return Ok(Self::WebIdentity { token_file, role_arn, session_name, sts_endpoint });
            }
            (None, None) => {}
            _ => bail!("blob_store: set both AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, or neither"),
        }
        if let Some(uri) = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
            return Ok(Self::ContainerRelative { uri });
        }
        if let Some(uri) = env("AWS_CONTAINER_CREDENTIALS_FULL_URI") {
            let Some(token_file) = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") else {
                bail!(
                    "blob_store: AWS_CONTAINER_CREDENTIALS_FULL_URI needs AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (a plain AWS_CONTAINER_AUTHORIZATION_TOKEN is not supported)"
                );
            };
            return Ok(Self::ContainerFull { uri, token_file });
        }
        if settings.instance_metadata {
            return Ok(Self::InstanceMetadata);
        }
        bail!(
            "blob_store: no credentials for the object store: set blob_store.access_key_id and secret_access_key \
             (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, \
             AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI, blob_store.instance_metadata = true, \
             or blob_store.anonymous = true for unsigned requests"
        )
    }
}

/// Never prints a secret or a token.
impl std::fmt::Debug for StoreCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.source())
    }
}

/// Never prints the secret.
impl std::fmt::Debug for ObjectStoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl std::fmt::Display for ObjectStoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}", self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        if let Some(endpoint) = &self.endpoint {
            write!(f, " at {endpoint}")?;
        }
        Ok(())
    }
}

impl ObjectStoreLocation {
    /// `s3://BUCKET[/PREFIX]` with the other `blob_store` keys; credentials fall back to the standard AWS
    /// environment variables (this module is the one that reads the environment).
    pub fn parse(url: &str, settings: &BlobStoreSettings) -> anyhow::Result<Self> {
        Self::parse_with_env(url, settings, &|name| std::env::var(name).ok())
    }

    /// [`Self::parse`] with the environment variables `env` gives.
    fn parse_with_env(
        url: &str,
        settings: &BlobStoreSettings,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let url = url.trim();
        let Some(rest) = url.strip_prefix("s3://") else {
            bail!("blob_store.url {url:?} must be s3://BUCKET or s3://BUCKET/PREFIX");
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
            && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !bucket_ok {
            bail!("blob_store.url {url:?}: {bucket:?} is not an S3 bucket name (3-63 of a-z, 0-9, '-', '.')");
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|p| p.is_empty() || p == "." || p == "..") && !prefix.is_empty() {
            bail!("blob_store.url {url:?}: the prefix must be path segments without empty, '.' or '..' parts");
        }
        let endpoint = match settings.endpoint.as_deref().map(str::trim).filter(|e| !e.is_empty()) {
            None => None,
            Some(e) => {
                let parsed = url::Url::parse(e).map_err(|err| anyhow::anyhow!("blob_store.endpoint {e:?}: {err}"))?;
                if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                    bail!("blob_store.endpoint {e:?} must be http:// or https:// with a host");
                }
                Some(e.trim_end_matches('/').to_owned())
            }
        };
        if settings.region.trim().is_empty() {
            bail!("blob_store.region must not be empty");
        }
        let credentials = StoreCredentials::resolve(settings, env)?;
        if let Some(ca) = &settings.ca_bundle
            && !ca.is_file()
        {
            bail!("blob_store.ca_bundle {} is not a file", ca.display());
        }
        let t = &settings.timeouts;
        for (key, value) in [
            ("blob_store.timeouts.connect", t.connect),
            ("blob_store.timeouts.first_byte", t.first_byte),
            ("blob_store.timeouts.idle", t.idle),
            ("blob_store.breaker.cool_down", settings.breaker.cool_down),
        ] {
            if value.is_zero() {
                bail!("{key} must be greater than zero");
            }
        }
        if settings.breaker.failures == 0 {
            bail!("blob_store.breaker.failures must be at least 1");
        }
        check("blob_store.max_fetches", settings.max_fetches, 1, 100_000)?;
        Ok(Self {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            endpoint,
            region: settings.region.trim().to_owned(),
            path_style: settings.path_style,
            credentials,
            ca_bundle: settings.ca_bundle.clone(),
            timeouts: settings.timeouts,
            breaker: settings.breaker,
            max_fetches: settings.max_fetches,
        })
    }
}

/// `tls`: with `cert` and `key` both set, both listeners speak HTTPS only.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM: the certificate chain, the server's own first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// PEM: the private key (ECDSA, Ed25519 or RSA) of the chain's first certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    pub ktls: KtlsMode,
}

impl TlsSettings {
    /// The certificate and key files when HTTPS is on; an error naming the key when only one is set.
    pub fn pair(&self) -> anyhow::Result<Option<(&Path, &Path)>> {
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Ok(Some((cert, key))),
            (None, None) => Ok(None),
            (Some(_), None) => bail!("tls.cert is set but tls.key is not: HTTPS needs both (--tls-key)"),
            (None, Some(_)) => bail!("tls.key is set but tls.cert is not: HTTPS needs both (--tls-cert)"),
        }
    }
}

/// `tls.ktls`: whether the session keys go to the kernel after the handshake, so bodies leave by sendfile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KtlsMode {
    /// Kernel TLS where the kernel offers it, user-space TLS otherwise (one warning says why).
    #[default]
    Auto,
    /// Refuse to start without kernel TLS.
    Required,
    /// User-space TLS always.
    Off,
}

/// A file mode as octal digits: a string (`"0640"`), or a number whose digits are read as octal, since the
/// environment's `0640` arrives as the number 640.
fn octal_digits<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Digits {
        Text(String),
        Number(u64),
    }
    Ok(match Digits::deserialize(deserializer)? {
        Digits::Text(text) => text,
        Digits::Number(n) => n.to_string(),
    })
}

/// `log_format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// Where the metadata lives: `sqlite://PATH`, or PostgreSQL as `postgres://USER:PASS@HOST:PORT/DB` (also
    /// `postgresql://`, and `?host=/socket/dir`). Unset: `sqlite://<data_dir>/blobgate.db`. Also `--database-url`
    /// and `BLOBGATE_DATABASE_URL`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// How long a server may go without syncing its caches with the database before it refuses whatever a missed
    /// change could affect: credentials (a revocation) and private buckets, 503 with `Retry-After`.
    #[serde(with = "humantime_serde")]
    pub max_staleness: Duration,
    /// The same bound for cached objects of public buckets (a bucket made private, an object deleted meanwhile):
    /// past it every request is refused. Below `max_staleness` (`0s`) they fail with everything else.
    #[serde(with = "humantime_serde")]
    pub public_max_staleness: Duration,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self { url: None, max_staleness: Duration::from_secs(30), public_max_staleness: Duration::from_secs(3600) }
    }
}

/// Never prints the URL itself: it may hold a password.
impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = self.url.as_deref().map(|url| match DatabaseUrl::parse(url) {
            Ok(parsed) => parsed.to_string(),
            Err(_) => "(invalid)".to_owned(),
        });
        f.debug_struct("DatabaseSettings")
            .field("url", &url)
            .field("max_staleness", &self.max_staleness)
            .field("public_max_staleness", &self.public_max_staleness)
            .finish()
    }
}

/// `--database-url`: the one database setting a flag sets, so that flags never reset the others.
#[derive(Clone, Default, Serialize)]
pub struct DatabaseFlags {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl std::fmt::Debug for DatabaseFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseFlags").field("url", &self.url.as_ref().map(|_| "(set)")).finish()
    }
}

/// A parsed `database.url`: the backend and where its database is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// An SQLite database file.
    Sqlite(PathBuf),
    /// A PostgreSQL database.
    Postgres(PostgresUrl),
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatabaseUrl::Sqlite(path) => write!(f, "SQLite database {}", path.display()),
            DatabaseUrl::Postgres(url) => url.fmt(f),
        }
    }
}

/// A `postgres://` URL. It may hold a password, so `Debug` and `Display` show only where it points:
/// `PostgreSQL database DB on HOST:PORT as USER`.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl {
    url: String,
    /// Where it points, without credentials: for messages.
    target: String,
}

impl PostgresUrl {
    fn parse(url: &str) -> anyhow::Result<Self> {
        // Never repeat the URL or the parser's view of it in an error: it may hold a password.
        let parsed =
            url::Url::parse(url).map_err(|e| anyhow::anyhow!("database.url is not a valid PostgreSQL URL: {e}"))?;
        let param = |name: &str| parsed.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.into_owned());
        let host = param("host")
            .or_else(|| parsed.host_str().filter(|h| !h.is_empty()).map(str::to_owned))
            .unwrap_or_else(|| "localhost".to_owned());
        let port = param("port").map_or(Ok(parsed.port().unwrap_or(5432)), |p| p.parse::<u16>());
        let Ok(port) = port else {
            bail!("database.url is not a valid PostgreSQL URL: invalid port");
        };
        let user = param("user").unwrap_or_else(|| {
            let user = parsed.username();
            percent_encoding::percent_decode_str(user).decode_utf8_lossy().into_owned()
        });
        let database = param("dbname")
            .or_else(|| Some(parsed.path().trim_start_matches('/').to_owned()).filter(|d| !d.is_empty()))
            .unwrap_or_else(|| user.clone());
        let target = format!("PostgreSQL database {database} on {host}:{port} as {user}");
        Ok(Self { url: url.to_owned(), target })
    }

    /// The whole URL, password included: for the database driver only, never for a message.
    pub fn expose_secret(&self) -> &str {
        &self.url
    }
}

impl std::fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.target)
    }
}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostgresUrl({})", self.target)
    }
}

impl DatabaseUrl {
    /// The SQLite file name used when `database.url` is unset.
    pub const DEFAULT_SQLITE_FILE: &str = "blobgate.db";

    /// The default: SQLite in the data dir.
    pub fn in_data_dir(data_dir: &Path) -> Self {
        DatabaseUrl::Sqlite(data_dir.join(Self::DEFAULT_SQLITE_FILE))
    }

    /// `sqlite://PATH` (or `sqlite:PATH`; `PATH` may be relative), or `postgres://…` / `postgresql://…`. Errors
    /// name `database.url` and never repeat the URL, which may hold a password.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("sqlite") => {
                let path = url["sqlite:".len()..].strip_prefix("//").unwrap_or(&url["sqlite:".len()..]);
                if path.is_empty() || path.contains('?') || path.starts_with(':') {
                    bail!("database.url must be sqlite://PATH, with a file path and no options");
                }
                Ok(DatabaseUrl::Sqlite(PathBuf::from(path)))
            }
            Some("postgres" | "postgresql") => Ok(DatabaseUrl::Postgres(PostgresUrl::parse(url)?)),
            _ => bail!("database.url must be sqlite://PATH or postgres://USER:PASS@HOST:PORT/DB"),
        }
    }
}

/// Test-only fault injection: widens race windows so that tests can force an interleaving.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// When a pool sendfile finds the socket full, hold the pool thread until the socket is writable again (at
    /// most this long) and a little after, so the writable edge reaches tokio before the connection task resumes.
    #[serde(with = "humantime_serde")]
    pub pool_wouldblock_hold: Duration,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeSettings {
    /// Data-listener threads, each with its own runtime and SO_REUSEPORT socket; 0 means one per usable CPU.
    pub data_workers: usize,
}

impl RuntimeSettings {
    pub fn worker_count(&self) -> usize {
        match self.data_workers {
            // available_parallelism honours the CPU affinity mask (taskset, cgroups).
            0 => std::thread::available_parallelism().map(usize::from).unwrap_or(1),
            n => n,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// Longest lifetime `presign` will sign, and the server will accept, for a signed URL.
    #[serde(with = "humantime_serde")]
    pub presign_max_lifetime: Duration,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self { presign_max_lifetime: Duration::from_secs(7 * 24 * 3600) }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Settings {
    /// The region SigV4 credential scopes must name, and HeadBucket's `x-amz-bucket-region`.
    pub region: String,
    /// Virtual-hosted-style addressing: a request whose `Host` is `BUCKET.<domain>` (any port) addresses that
    /// bucket. Unset: path-style only.
    pub domain: Option<String>,
}

impl Default for S3Settings {
    fn default() -> Self {
        Self { region: "us-east-1".into(), domain: None }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest request head (request line + headers) on the data listener; larger gets 431.
    pub max_head_bytes: usize,
    /// Most header fields in one request head; more gets 431.
    pub max_headers: usize,
    /// Longest request target; longer gets 414.
    pub max_uri_bytes: usize,
    /// Data connections served at once; further ones wait, unread (each worker accepts at most one of them, the
    /// rest stay in the kernel's accept backlog). The admin listener has a cap of the same size, counted apart.
    pub max_connections: usize,
    /// Most bytes handed to one sendfile call before yielding, so one fast reader cannot starve the others.
    pub sendfile_chunk_bytes: usize,
    /// Largest request body of an upload (native PUT, S3 PutObject, UploadPart, and the range of an
    /// UploadPartCopy); larger gets 413 (S3: `EntityTooLarge`).
    pub max_upload_bytes: u64,
    /// Largest object: a multipart upload is refused at the UploadPart or UploadPartCopy that would take its parts
    /// beyond it (and Complete is held to it); a single upload body is held to it too.
    pub max_object_bytes: u64,
    /// Bytes that the unfinished multipart uploads one S3 access key started may hold in `parts/` together;
    /// beyond it a part gets 403 `QuotaExceeded`. 0 turns it off.
    pub max_unfinished_upload_bytes_per_key: u64,
    /// Open data connections from one client address; beyond it a request gets 503 and the connection closes.
    /// 0 means unlimited.
    pub max_connections_per_ip: usize,
    /// Uploads in progress at once on the admin listener; beyond it an upload gets 503 with `Retry-After`.
    pub max_concurrent_uploads: usize,
    /// Request-body bytes the admin listener holds in memory at once, across all uploads: a body read waits for
    /// its share (at most 64 KiB), so beyond it TCP back-pressure slows the clients and memory stays flat.
    pub upload_buffer_bytes: usize,
    /// Slowest upload body accepted, in bytes per second averaged over each `timeouts.body_idle` window; slower
    /// gets 408, so a body that trickles a byte now and then cannot keep its upload place. 0 turns it off.
    pub min_upload_rate: u64,
    /// A download that acknowledged nothing for `timeouts.send_progress` is still not stalled while the bytes its
    /// connection took, at this rate, would last longer (up to a minute): a reader that takes its buffer in bursts
    /// and then pauses (`curl --limit-rate`) is a slow reader, not a stalled one. 0: the period alone decides.
    pub min_download_rate: u64,
    /// Download-stats aggregates (one per object and day) that may wait in memory while the database cannot be
    /// written; a record that needs one more is dropped and counted.
    pub stats_buffer_objects: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timeouts {
    /// From the first byte of a request (or from accept) until its head is complete.
    #[serde(with = "humantime_serde")]
    pub header_read: Duration,
    /// How long an idle keep-alive connection is kept open waiting for its next request. Above 90% of
    /// `limits.max_connections`, a connection that starts waiting gets a tenth of this (at least 1 s).
    #[serde(with = "humantime_serde")]
    pub keep_alive_idle: Duration,
    /// How long a response may make no progress (the peer acknowledges no bytes) before the connection is dropped.
    #[serde(with = "humantime_serde")]
    pub send_progress: Duration,
    /// How long a handler (auth, lookup, open) may take; this never covers the send.
    #[serde(with = "humantime_serde")]
    pub handler: Duration,
    /// After SIGINT/SIGTERM, how long in-flight responses may take to finish before the process exits.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// How long a database write waits for SQLite's lock (held by a CLI command, say) before failing.
    #[serde(with = "humantime_serde")]
    pub sqlite_busy: Duration,
    /// How long a request (or command) waits for a database connection before it fails as unreachable (503 with
    /// `Retry-After`); shorter than `handler`, so an outage answers 503 instead of hanging.
    #[serde(with = "humantime_serde")]
    pub database_acquire: Duration,
    /// How long an upload body on the admin listener may send nothing before it gets 408 (nothing is stored).
    #[serde(with = "humantime_serde")]
    pub body_idle: Duration,
    /// How long an upload beyond `limits.max_concurrent_uploads` waits for a place (first come, first served)
    /// before it gets 503 with `Retry-After`. A burst of parts slightly over the cap (several `aws s3 cp` at once,
    /// each with its 10 parts in flight) then waits instead of failing; nothing is read while it waits. 0 refuses
    /// at once.
    #[serde(with = "humantime_serde")]
    pub upload_queue: Duration,
    /// The start-up sweep removes a temp file of no live local process, or an unreferenced blob, only when it has
    /// not been modified for this long: a peer sharing the data dir (another host, another container) may still be
    /// writing it. Keep it above the longest a live writer leaves its temp file untouched (one 512 KiB write batch
    /// at `limits.min_upload_rate`: about 17 min at the default) plus the clock skew between hosts. With an object
    /// store, also how long a store blob outlives its last reference (keep it above the longest download), and an
    /// upload to the store that takes more than half of it is checked again (a part's is refused: send it again).
    #[serde(with = "humantime_serde")]
    pub sweep_grace: Duration,
    /// An S3 multipart upload not completed or aborted this long after it was created is aborted by `serve`
    /// (its parts removed), as S3's `AbortIncompleteMultipartUpload` lifecycle rule does.
    #[serde(with = "humantime_serde")]
    pub multipart_upload_expiry: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            database: DatabaseSettings::default(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            listen_read_only: false,
            public_url: None,
            tls: TlsSettings::default(),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            log: "info".into(),
            log_format: LogFormat::Text,
            access_log: None,
            access_log_mode: "0640".into(),
            access_log_probes: false,
            limits: Limits::default(),
            timeouts: Timeouts::default(),
            auth: AuthSettings::default(),
            s3: S3Settings::default(),
            runtime: RuntimeSettings::default(),
            faults: Faults::default(),
            blob_store: BlobStoreSettings::default(),
            cache: CacheSettings::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_head_bytes: 16 * 1024,
            max_headers: 100,
            max_uri_bytes: 8 * 1024,
            max_connections: 10_000,
            sendfile_chunk_bytes: 2 * 1024 * 1024,
            max_upload_bytes: 5 * 1024 * 1024 * 1024,
            max_object_bytes: 5 * 1024 * 1024 * 1024 * 1024,
            max_unfinished_upload_bytes_per_key: 1024 * 1024 * 1024 * 1024,
            max_connections_per_ip: 0,
            max_concurrent_uploads: 64,
            upload_buffer_bytes: 1024 * 1024,
            min_upload_rate: 500,
            min_download_rate: 32 * 1024,
            stats_buffer_objects: 100_000,
        }
    }
}

impl Limits {
    /// The most bytes one upload body may carry: an object of one body is held to `max_object_bytes` too.
    pub fn max_body_bytes(&self) -> u64 {
        self.max_upload_bytes.min(self.max_object_bytes)
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(10),
            keep_alive_idle: Duration::from_secs(75),
            send_progress: Duration::from_secs(30),
            handler: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            sqlite_busy: Duration::from_secs(10),
            database_acquire: Duration::from_secs(5),
            body_idle: Duration::from_secs(30),
            upload_queue: Duration::from_secs(5),
            sweep_grace: Duration::from_secs(3600),
            multipart_upload_expiry: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// How long the database may make a caller wait: for a lock (SQLite's busy timeout), and for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatabaseTimeouts {
    pub busy: Duration,
    pub acquire: Duration,
}

impl Timeouts {
    pub fn database(&self) -> DatabaseTimeouts {
        DatabaseTimeouts { busy: self.sqlite_busy, acquire: self.database_acquire }
    }
}

/// A busy timeout alone (tests, benches): the default acquire timeout.
impl From<Duration> for DatabaseTimeouts {
    fn from(busy: Duration) -> Self {
        DatabaseTimeouts { busy, acquire: Timeouts::default().database_acquire }
    }
}

/// Values given as command-line flags: the top layer. `None` leaves the lower layers alone.
#[derive(Debug, Default, Clone, Serialize)]
pub struct FlagOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database: Option<DatabaseFlags>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_log: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFlags>,
}

/// `--tls-cert` and `--tls-key`: flags set only what they name, so `tls.ktls` from the lower layers stays.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TlsFlags {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
}

/// Top-level keys; other `BLOBGATE_*` variables (such as `BLOBGATE_CONFIG`) are not settings.
const SETTING_KEYS: &[&str] = &[
    "data_dir",
    "database",
    "listen",
    "listen_read_only",
    "public_url",
    "admin_listen",
    "log",
    "log_format",
    "access_log",
    "access_log_mode",
    "access_log_probes",
    "limits",
    "timeouts",
    "auth",
    "s3",
    "runtime",
    "tls",
    "faults",
    "blob_store",
    "cache",
];

impl Settings {
    /// Loads the layers. `config_file` is `--config`/`BLOBGATE_CONFIG`; when it is `None`, `config/default.toml` is
    /// read if it exists. A named file that does not exist is an error.
    pub fn load(config_file: Option<&Path>, flags: &FlagOverrides) -> anyhow::Result<Self> {
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        match config_file {
            Some(path) => {
                if !path.is_file() {
                    bail!("config file {} does not exist", path.display());
                }
                figment = figment.merge(Toml::file_exact(path));
            }
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                figment = figment.merge(Toml::file_exact(DEFAULT_CONFIG_FILE));
            }
            None => {}
        }
        let env = Env::prefixed("BLOBGATE_")
            // The spelling the PostgreSQL issue's contract names, beside the nested `BLOBGATE_DATABASE__URL`.
            .map(|key| if key == "database_url" { "database__url".into() } else { key.into() })
            .filter(|key| {
                let top = key.as_str().split("__").next().unwrap_or_default();
                SETTING_KEYS.iter().any(|k| top.eq_ignore_ascii_case(k))
            })
            .split("__");
        let mut settings: Settings = figment
            .merge(env)
            .merge(Serialized::defaults(flags))
            .extract()
            .map_err(|e| anyhow::anyhow!(first_error(e)))?;
        // An empty value (`BLOBGATE_DATABASE_URL=` in a unit file or a compose file) means unset, as for a shell.
        settings.database.url = settings.database.url.filter(|url| !url.trim().is_empty());
        settings.access_log = settings.access_log.filter(|path| path.to_str().is_none_or(|p| !p.trim().is_empty()));
        settings.validate()?;
        Ok(settings)
    }

    /// Range checks that the types alone cannot express. Each message names its key.
    pub fn validate(&self) -> anyhow::Result<()> {
        let l = &self.limits;
        check("limits.max_head_bytes", l.max_head_bytes, 1024, 1 << 20)?;
        check("limits.max_headers", l.max_headers, 8, 1000)?;
        check("limits.max_uri_bytes", l.max_uri_bytes, 256, l.max_head_bytes)?;
        check("limits.max_connections", l.max_connections, 1, 1_000_000)?;
        check("limits.sendfile_chunk_bytes", l.sendfile_chunk_bytes, 4096, 1 << 30)?;
        if l.max_upload_bytes == 0 {
            bail!("limits.max_upload_bytes must be at least 1");
        }
        if l.max_object_bytes == 0 {
            bail!("limits.max_object_bytes must be at least 1");
        }
        check("limits.max_connections_per_ip", l.max_connections_per_ip, 0, 1_000_000)?;
        check("limits.max_concurrent_uploads", l.max_concurrent_uploads, 1, 100_000)?;
        // At least one body read (the driver reads at most 64 KiB at a time).
        check("limits.upload_buffer_bytes", l.upload_buffer_bytes, 64 * 1024, 1 << 32)?;
        check("limits.stats_buffer_objects", l.stats_buffer_objects, 2, 100_000_000)?;
        let t = &self.timeouts;
        for (key, value) in [
            ("timeouts.header_read", t.header_read),
            ("timeouts.keep_alive_idle", t.keep_alive_idle),
            ("timeouts.send_progress", t.send_progress),
            ("timeouts.handler", t.handler),
            ("timeouts.sqlite_busy", t.sqlite_busy),
            ("timeouts.database_acquire", t.database_acquire),
            ("timeouts.body_idle", t.body_idle),
            ("timeouts.multipart_upload_expiry", t.multipart_upload_expiry),
        ] {
            if value.is_zero() {
                bail!("{key} must be greater than zero");
            }
        }
        if t.database_acquire >= t.handler {
            bail!(
                "timeouts.database_acquire ({}) must be shorter than timeouts.handler ({})",
                humantime::format_duration(t.database_acquire),
                humantime::format_duration(t.handler)
            );
        }
        if self.runtime.data_workers > 256 {
            bail!("runtime.data_workers must be between 0 (one per CPU) and 256, got {}", self.runtime.data_workers);
        }
        if self.auth.presign_max_lifetime.is_zero() {
            bail!("auth.presign_max_lifetime must be greater than zero");
        }
        if self.data_dir.as_os_str().is_empty() {
            bail!("data_dir must not be empty");
        }
        check_log_filter("log", &self.log)?;
        self.access_log_mode()?;
        self.tls.pair()?;
        self.s3_domain()?;
        self.public_url()?;
        self.database_url()?;
        self.object_store()?;
        // A slice is checked in the chunks of its blob's manifest: a whole number of them.
        let chunk = SLICE_CHECK_BYTES;
        if self.cache.slice_bytes < chunk || self.cache.slice_bytes > 1 << 30 || self.cache.slice_bytes % chunk != 0 {
            bail!(
                "cache.slice_bytes must be a multiple of 1 MiB (1048576) up to 1 GiB (1073741824), got {}",
                self.cache.slice_bytes
            );
        }
        if self.cache.max_open_files == 0 {
            bail!("cache.max_open_files must be at least 1");
        }
        if self.cache.metadata_bytes < 1 << 20 {
            bail!("cache.metadata_bytes must be at least 1 MiB (1048576), got {}", self.cache.metadata_bytes);
        }
        if self.cache.max_bytes < self.cache.slice_bytes {
            bail!(
                "cache.max_bytes ({}) must be at least cache.slice_bytes ({})",
                self.cache.max_bytes,
                self.cache.slice_bytes
            );
        }
        // The background sync runs every second: a shorter window would flap.
        if self.database.max_staleness < Duration::from_secs(2) {
            bail!(
                "database.max_staleness must be at least 2s (the caches sync every second), got {}",
                humantime::format_duration(self.database.max_staleness)
            );
        }
        Ok(())
    }

    /// The object store blobs live in, or `None` for the data dir (`blob_store.url` unset or empty).
    pub fn object_store(&self) -> anyhow::Result<Option<ObjectStoreLocation>> {
        match self.blob_store.url.as_deref().map(str::trim).filter(|u| !u.is_empty()) {
            None => Ok(None),
            Some(url) => ObjectStoreLocation::parse(url, &self.blob_store).map(Some),
        }
    }

    /// `access_log_mode` as permission bits: octal, at most `0777`, and readable and writable by the owner (the
    /// server writes it, and reopens it after logrotate).
    pub fn access_log_mode(&self) -> anyhow::Result<u32> {
        let text = self.access_log_mode.trim();
        match u32::from_str_radix(text.strip_prefix("0o").unwrap_or(text), 8) {
            Ok(mode) if mode <= 0o777 && mode & 0o600 == 0o600 => Ok(mode),
            Ok(_) => {
                bail!("access_log_mode {text:?} must be at most 0777 and include 0600 (the owner reads and writes it)")
            }
            Err(_) => bail!("access_log_mode {text:?} is not an octal file mode such as 0640"),
        }
    }

    /// `public_url` without a trailing `/`: `http://` or `https://`, a host, an optional path, no query or fragment.
    /// An empty value means unset.
    pub fn public_url(&self) -> anyhow::Result<Option<String>> {
        let Some(text) = self.public_url.as_deref().map(str::trim).filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        let url = url::Url::parse(text).map_err(|e| anyhow::anyhow!("public_url {text:?} is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
            bail!("public_url {text:?} must be http:// or https:// with a host, such as https://dl.example.com");
        }
        if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
            bail!("public_url {text:?} must have no query, fragment or credentials");
        }
        Ok(Some(text.trim_end_matches('/').to_owned()))
    }

    /// `s3.domain`, lower-cased and without a trailing dot: a DNS name of at least two labels, each of letters,
    /// digits and hyphens. An empty value means unset, as an empty environment variable does.
    pub fn s3_domain(&self) -> anyhow::Result<Option<String>> {
        let Some(domain) = self.s3.domain.as_deref().map(str::trim).filter(|d| !d.is_empty()) else {
            return Ok(None);
        };
        let domain = domain.strip_suffix('.').unwrap_or(domain).to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if domain.len() > 253 || domain.split('.').count() < 2 || !domain.split('.').all(label_ok) {
            bail!("s3.domain {domain:?} is not a DNS name such as s3.example.com (no scheme, port or path)");
        }
        Ok(Some(domain))
    }

    /// `database.url`, parsed; SQLite's `blobgate.db` in the data dir when it is unset.
    pub fn database_url(&self) -> anyhow::Result<DatabaseUrl> {
        match &self.database.url {
            Some(url) => DatabaseUrl::parse(url),
            None => Ok(DatabaseUrl::in_data_dir(&self.data_dir)),
        }
    }
}

/// `filter` with sqlx's own lines at `warn` and above, unless it names `sqlx` itself: its pool and connection
/// chatter at `info` (every reconnect attempt during an outage) is noise for an operator, and the outage is logged
/// once by the readiness probe.
pub fn with_quiet_sqlx(filter: &str) -> String {
    if filter.contains("sqlx") { filter.to_owned() } else { format!("{filter},sqlx=warn") }
}

/// The `tracing` filter in force: `RUST_LOG` when it is set and not empty, else `setting`. A `RUST_LOG` that is not
/// a valid filter is an error naming `RUST_LOG` (the `log` setting is checked by [`Settings::validate`]).
pub fn log_filter(setting: &str) -> anyhow::Result<String> {
    match std::env::var("RUST_LOG") {
        Ok(value) if !value.trim().is_empty() => {
            check_log_filter("RUST_LOG", &value)?;
            Ok(value)
        }
        Err(std::env::VarError::NotUnicode(_)) => bail!("RUST_LOG is not valid UTF-8"),
        _ => Ok(setting.to_owned()),
    }
}

/// Refuses what `tracing`'s own parser would take silently: a bare word that is not a level is read as a target
/// name, so a typo such as `inf` or `notalevel` means "only target `notalevel`" and hides every log line. A bare
/// word must be a level or our own crate (`blobgate`, `blobgate::driver`); other targets need their level
/// (`sqlx=debug`). Filters with span or field selectors (`[...]`, `{...}`) get the parser's check only.
fn check_log_filter(key: &str, value: &str) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::filter::LevelFilter;
    if let Err(e) = EnvFilter::builder().parse(value) {
        bail!("{key} is not a valid log filter ({value:?}): {e}");
    }
    if value.contains(['[', '{']) {
        return Ok(());
    }
    for directive in value.split(',').map(str::trim).filter(|d| !d.is_empty() && !d.contains('=')) {
        let own_target = directive == "blobgate" || directive.starts_with("blobgate::");
        if directive.parse::<LevelFilter>().is_err() && !own_target {
            bail!(
                "{key} is not a valid log filter ({value:?}): {directive:?} is not a level (trace, debug, info, \
                 warn, error, off); give a target with its level, e.g. \"{directive}=debug\""
            );
        }
    }
    Ok(())
}

fn check(key: &str, value: usize, min: usize, max: usize) -> anyhow::Result<()> {
    if value < min || value > max {
        bail!("{key} must be between {min} and {max}, got {value}");
    }
    Ok(())
}

/// figment reports every problem; the first one, with its key and source, is the useful one-line message.
fn first_error(error: figment::Error) -> String {
    let error = error.into_iter().next().expect("a figment error holds at least one error");
    let mut message = format!("invalid configuration: {}", error.kind);
    if !error.path.is_empty() {
        message.push_str(&format!(" for key '{}'", error.path.join(".")));
    }
    if let Some(source) = &error.metadata {
        message.push_str(&format!(" (from {})", source.name));
        if let Some(src) = &source.source {
            message.push_str(&format!(" {src}"));
        }
    }
    message
}

/// Mode of every directory blobgate creates in the data dir, the data dir included: the owner only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode of every file blobgate creates there (database, temp files, blobs, generation counter).
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Creates the data directory, owner-only (`0700`: it holds the signing keys and private objects), with a
/// clear message when that fails. An existing directory keeps its mode; `serve` warns when it is looser.
pub fn ensure_data_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)
        .with_context(|| format!("cannot create data dir {}", dir.display()))
}

#[cfg(test)]
// figment's Jail closures return figment::Error, which is large; that is its API, not ours.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn an_object_store_url_names_a_bucket_and_an_optional_prefix() {
        let settings = BlobStoreSettings {
            endpoint: Some("http://127.0.0.1:9000/".into()),
            access_key_id: Some("id".into()),
            secret_access_key: Some("secret".into()),
            ..BlobStoreSettings::default()
        };
        let at = ObjectStoreLocation::parse("s3://blobs", &settings).unwrap();
        assert_eq!((at.bucket.as_str(), at.prefix.as_str()), ("blobs", ""));
        assert_eq!(at.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        let at = ObjectStoreLocation::parse(" s3://blobs/prod/eu/ ", &settings).unwrap();
        assert_eq!((at.bucket.as_str(), at.prefix.as_str()), ("blobs", "prod/eu"));
        assert_eq!(at.to_string(), "s3://blobs/prod/eu at http://127.0.0.1:9000");
        assert!(!format!("{at:?}").contains("secret"), "Debug never shows the secret");
        for (bad, says) in [
            ("http://blobs", "must be s3://"),
            ("s3://", "not an S3 bucket name"),
            ("s3://Blobs", "not an S3 bucket name"),
            ("s3://ab", "not an S3 bucket name"),
            ("s3://blobs/a//b", "the prefix"),
            ("s3://blobs/a/../b", "the prefix"),
        ] {
            let err = ObjectStoreLocation::parse(bad, &settings).unwrap_err().to_string();
            assert!(err.contains(says) && err.contains("blob_store.url"), "{bad}: {err}");
        }
        let half = BlobStoreSettings { access_key_id: Some("id".into()), ..settings.clone() };
        let half = BlobStoreSettings { secret_access_key: None, ..half };
        let err = ObjectStoreLocation::parse_with_env("s3://blobs", &half, &|_| None).unwrap_err().to_string();
        assert!(err.contains("both access_key_id and secret_access_key"), "{err}");
        let ftp = BlobStoreSettings { endpoint: Some("ftp://x".into()), ..settings };
        assert!(
            ObjectStoreLocation::parse("s3://blobs", &ftp).unwrap_err().to_string().contains("blob_store.endpoint")
        );
    }

    /// The credentials of `settings` with the environment `vars`.
    fn credentials(settings: &BlobStoreSettings, vars: &[(&str, &str)]) -> anyhow::Result<StoreCredentials> {
        let env = |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned());
        ObjectStoreLocation::parse_with_env("s3://blobs", settings, &env).map(|at| at.credentials)
    }

    #[test]
    fn store_credentials_follow_the_aws_chain_and_none_is_refused() {
        let none = BlobStoreSettings::default();
        let err = credentials(&none, &[]).unwrap_err().to_string();
        for names in ["no credentials", "blob_store.access_key_id", "AWS_ACCESS_KEY_ID", "blob_store.anonymous"] {
            assert!(err.contains(names), "{err}");
        }
        assert!(!err.contains('\n'), "one line: {err}");
        let anonymous = BlobStoreSettings { anonymous: true, ..BlobStoreSettings::default() };
        let keys = [("AWS_ACCESS_KEY_ID", "AKENV"), ("AWS_SECRET_ACCESS_KEY", "env-secret")];
        assert_eq!(credentials(&anonymous, &keys).unwrap(), StoreCredentials::Anonymous, "the environment is ignored");
        let with_keys = BlobStoreSettings {
            access_key_id: Some("AKCONF".into()),
            secret_access_key: Some("conf-secret".into()),
            ..anonymous.clone()
        };
        assert!(credentials(&with_keys, &[]).unwrap_err().to_string().contains("blob_store.anonymous"));
        let conf = BlobStoreSettings { anonymous: false, session_token: Some("conf-token".into()), ..with_keys };
        let session = [("AWS_SESSION_TOKEN", "env-token")];
        let got = credentials(&conf, &[keys.as_slice(), &session].concat()).unwrap();
        assert_eq!(
            got,
            StoreCredentials::Static {
                access_key_id: "AKCONF".into(),
                secret_access_key: "conf-secret".into(),
                session_token: Some("conf-token".into()),
                from_env: false
            },
            "the settings win over the environment"
        );
        let shown = format!("{got:?} {conf:?}");
        assert!(!shown.contains("secret\"") && !shown.contains("conf-token"), "Debug hides secrets: {shown}");
        assert!(!shown.contains("conf-secret"), "{shown}");
        let got = credentials(&none, &[keys.as_slice(), &session].concat()).unwrap();
        assert_eq!(got.source(), "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN");
        assert!(
            matches!(got, StoreCredentials::Static { session_token: Some(t), from_env: true, .. } if t == "env-token")
        );
        let token_alone = BlobStoreSettings { session_token: Some("t".into()), ..BlobStoreSettings::default() };
        assert!(credentials(&token_alone, &[]).unwrap_err().to_string().contains("blob_store.session_token"));

        let irsa = [("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"), ("AWS_ROLE_ARN", "arn:aws:iam::1:role/bg")];
        assert_eq!(
            credentials(&none, &[irsa.as_slice(), &[("AWS_ENDPOINT_URL_STS", "https://sts.local")]].concat()).unwrap(),
            StoreCredentials::WebIdentity {
                token_file: "/var/run/token".into(),
                role_arn: "arn:aws:iam::1:role/bg".into(),
                session_name: None,
                sts_endpoint: Some("https://sts.local".into())
            }
        );
        assert!(credentials(&none, &irsa[..1]).unwrap_err().to_string().contains("AWS_ROLE_ARN"));
        let ecs = [("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/x")];
        assert_eq!(
            credentials(&none, &ecs).unwrap(),
            StoreCredentials::ContainerRelative { uri: "/v2/credentials/x".into() }
        );
        let full = [("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://169.254.170.23/v1/credentials")];
        assert!(credentials(&none, &full).unwrap_err().to_string().contains("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"));
        let pod = [full.as_slice(), &[("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "/var/run/pod-token")]].concat();
        assert_eq!(
            credentials(&none, &pod).unwrap(),
            StoreCredentials::ContainerFull {
                uri: "http://169.254.170.23/v1/credentials".into(),
                token_file: "/var/run/pod-token".into()
            }
        );
        assert!(matches!(
            credentials(&none, &[irsa.as_slice(), &pod].concat()).unwrap(),
            StoreCredentials::WebIdentity { .. }
        ));
        let imds = BlobStoreSettings { instance_metadata: true, ..BlobStoreSettings::default() };
        assert_eq!(credentials(&imds, &[]).unwrap(), StoreCredentials::InstanceMetadata);
        assert!(matches!(credentials(&imds, &pod).unwrap(), StoreCredentials::ContainerFull { .. }), "IMDS comes last");
        assert_eq!(credentials(&none, &[("AWS_ACCESS_KEY_ID", "")]).unwrap_err().to_string(), err, "empty is unset");
    }

    #[test]
    fn the_object_stores_timeouts_breaker_and_fetch_cap_are_read_and_checked() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "c.toml",
                "[blob_store]\nurl = \"s3://blobs\"\nanonymous = true\nmax_fetches = 8\n[blob_store.timeouts]\nfirst_byte = \"2s\"\n",
            )?;
            jail.set_env("BLOBGATE_BLOB_STORE__BREAKER__COOL_DOWN", "750ms");
            let s = Settings::load(Some(Path::new("c.toml")), &FlagOverrides::default()).map_err(|e| e.to_string())?;
            let at = s.object_store().map_err(|e| e.to_string())?.expect("a store");
            let defaults = BlobStoreTimeouts::default();
            assert_eq!(at.timeouts, BlobStoreTimeouts { first_byte: Duration::from_secs(2), ..defaults });
            assert_eq!(at.breaker, BreakerSettings { cool_down: Duration::from_millis(750), ..Default::default() });
            assert_eq!(at.max_fetches, 8);
            Ok(())
        });
        let mut settings = BlobStoreSettings { anonymous: true, ..Default::default() };
        settings.timeouts.idle = Duration::ZERO;
        let err = ObjectStoreLocation::parse("s3://blobs", &settings).unwrap_err().to_string();
        assert!(err.contains("blob_store.timeouts.idle"), "{err}");
        let settings = BlobStoreSettings { max_fetches: 0, anonymous: true, ..Default::default() };
        let err = ObjectStoreLocation::parse("s3://blobs", &settings).unwrap_err().to_string();
        assert!(err.contains("blob_store.max_fetches"), "{err}");
        let settings = BlobStoreSettings {
            breaker: BreakerSettings { failures: 0, ..Default::default() },
            anonymous: true,
            ..Default::default()
        };
        let err = ObjectStoreLocation::parse("s3://blobs", &settings).unwrap_err().to_string();
        assert!(err.contains("blob_store.breaker.failures"), "{err}");
    }

    #[test]
    fn cache_bounds_are_checked() {
        let mut settings = Settings::default();
        settings.cache.slice_bytes = 1000;
        assert!(settings.validate().unwrap_err().to_string().contains("cache.slice_bytes"));
        settings.cache = CacheSettings { max_bytes: 1 << 20, slice_bytes: 8 << 20, ..CacheSettings::default() };
        assert!(settings.validate().unwrap_err().to_string().contains("cache.max_bytes"));
        settings.cache = CacheSettings::default();
        settings.blob_store.url = Some("s3://no/".into());
        assert!(settings.validate().unwrap_err().to_string().contains("blob_store.url"));
        settings.blob_store.url = Some("  ".into());
        assert_eq!(settings.object_store().unwrap(), None, "an empty URL means unset");
    }

    #[test]
    fn every_top_level_setting_is_read_from_the_environment() {
        let defaults = serde_json::to_value(Settings::default()).unwrap();
        let mut keys: Vec<&str> = defaults.as_object().unwrap().keys().map(String::as_str).collect();
        // Unset by default, so absent from the serialized defaults.
        keys.extend(["access_log", "public_url"]);
        keys.sort_unstable();
        let mut known = SETTING_KEYS.to_vec();
        known.sort_unstable();
        assert_eq!(keys, known, "SETTING_KEYS must name every top-level setting, so BLOBGATE_<KEY> reaches it");
    }

    #[test]
    fn the_access_log_is_off_by_default_and_set_by_file_env_or_flag() {
        Jail::expect_with(|jail| {
            let load = |flags: &FlagOverrides| Settings::load(None, flags).map_err(|e| e.to_string());
            assert_eq!(load(&FlagOverrides::default())?.access_log, None);
            jail.create_file("c.toml", "access_log = \"/var/log/a.log\"\n")?;
            let s = Settings::load(Some(Path::new("c.toml")), &FlagOverrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(s.access_log, Some(PathBuf::from("/var/log/a.log")));
            jail.set_env("BLOBGATE_ACCESS_LOG", "-");
            assert_eq!(load(&FlagOverrides::default())?.access_log, Some(PathBuf::from("-")));
            let flags = FlagOverrides { access_log: Some("/tmp/b.log".into()), ..Default::default() };
            assert_eq!(load(&flags)?.access_log, Some(PathBuf::from("/tmp/b.log")));
            Ok(())
        });
    }

    #[test]
    fn layers_apply_in_order_defaults_file_env_flags() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "c.toml",
                "listen = \"127.0.0.1:9000\"\nadmin_listen = \"127.0.0.1:9001\"\n[limits]\nmax_headers = 50\n",
            )?;
            jail.set_env("BLOBGATE_ADMIN_LISTEN", "127.0.0.1:9101");
            jail.set_env("BLOBGATE_LIMITS__MAX_HEAD_BYTES", "32768");
            jail.set_env("BLOBGATE_BIN", "ignored: not a setting");
            let flags = FlagOverrides { data_dir: Some("/tmp/x".into()), ..Default::default() };
            let s = Settings::load(Some(Path::new("c.toml")), &flags).map_err(|e| e.to_string())?;
            assert_eq!(s.listen.port(), 9000);
            assert_eq!(s.admin_listen.port(), 9101);
            assert_eq!(s.limits.max_headers, 50);
            assert_eq!(s.limits.max_head_bytes, 32768);
            assert_eq!(s.data_dir, PathBuf::from("/tmp/x"));
            assert_eq!(s.timeouts.header_read, Duration::from_secs(10));
            Ok(())
        });
    }

    #[test]
    fn log_filters_that_would_hide_every_line_are_refused() {
        for good in ["info", "WARN", "off", "blobgate=debug", "blobgate", "blobgate::driver", "info,sqlx=warn", "3"] {
            check_log_filter("log", good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in ["notalevel", "inf", "info,notalevel", "blobgate=dbug", "sqlx"] {
            let err = check_log_filter("log", bad).expect_err(bad).to_string();
            assert!(err.starts_with("log is not a valid log filter"), "{bad}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
        Jail::expect_with(|jail| {
            jail.set_env("BLOBGATE_LOG", "notalevel");
            let err = Settings::load(None, &FlagOverrides::default()).unwrap_err().to_string();
            assert!(err.contains("log is not a valid log filter"), "{err}");
            jail.set_env("BLOBGATE_LOG", "debug");
            jail.set_env("RUST_LOG", "notalevel");
            let settings = Settings::load(None, &FlagOverrides::default()).map_err(|e| e.to_string())?;
            let err = log_filter(&settings.log).unwrap_err().to_string();
            assert!(err.starts_with("RUST_LOG is not a valid log filter"), "{err}");
            jail.set_env("RUST_LOG", "");
            assert_eq!(log_filter(&settings.log).map_err(|e| e.to_string())?, "debug");
            Ok(())
        });
    }

    #[test]
    fn staleness_windows_come_from_every_layer_and_a_url_flag_leaves_them_alone() {
        Jail::expect_with(|jail| {
            let s = Settings::load(None, &FlagOverrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(s.database.max_staleness, Duration::from_secs(30));
            assert_eq!(s.database.public_max_staleness, Duration::from_secs(3600));
            jail.create_file("c.toml", "[database]\nmax_staleness = \"10s\"\npublic_max_staleness = \"0s\"\n")?;
            jail.set_env("BLOBGATE_DATABASE__MAX_STALENESS", "5s");
            let flags = FlagOverrides {
                database: Some(DatabaseFlags { url: Some("sqlite:flag.db".into()) }),
                ..Default::default()
            };
            let s = Settings::load(Some(Path::new("c.toml")), &flags).map_err(|e| e.to_string())?;
            assert_eq!(s.database.max_staleness, Duration::from_secs(5), "env beats the file");
            assert_eq!(s.database.public_max_staleness, Duration::ZERO, "the file's, not reset by the flag");
            assert_eq!(s.database_url().unwrap(), DatabaseUrl::Sqlite("flag.db".into()));
            jail.set_env("BLOBGATE_DATABASE__MAX_STALENESS", "1s");
            let err = Settings::load(None, &FlagOverrides::default()).unwrap_err().to_string();
            assert!(err.starts_with("database.max_staleness must be at least 2s"), "{err}");
            jail.set_env("BLOBGATE_DATABASE__MAX_STALENESS", "soon");
            let err = Settings::load(None, &FlagOverrides::default()).unwrap_err().to_string();
            assert!(err.contains("database.max_staleness"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn the_database_url_defaults_to_sqlite_in_the_data_dir_and_postgres_urls_hide_their_password() {
        Jail::expect_with(|jail| {
            let flags = FlagOverrides { data_dir: Some("/srv/d".into()), ..Default::default() };
            let s = Settings::load(None, &flags).map_err(|e| e.to_string())?;
            assert_eq!(s.database_url().unwrap(), DatabaseUrl::Sqlite("/srv/d/blobgate.db".into()));
            jail.set_env("BLOBGATE_DATABASE__URL", "sqlite:///var/lib/bg/meta.db");
            let s = Settings::load(None, &flags).map_err(|e| e.to_string())?;
            assert_eq!(s.database_url().unwrap(), DatabaseUrl::Sqlite("/var/lib/bg/meta.db".into()));
            jail.set_env("BLOBGATE_DATABASE_URL", "sqlite://rel/meta.db");
            let s = Settings::load(None, &flags).map_err(|e| e.to_string())?;
            assert_eq!(s.database_url().unwrap(), DatabaseUrl::Sqlite("rel/meta.db".into()));
            let flags = FlagOverrides {
                database: Some(DatabaseFlags { url: Some("sqlite:flag.db".into()) }),
                ..Default::default()
            };
            let s = Settings::load(None, &flags).map_err(|e| e.to_string())?;
            assert_eq!(s.database_url().unwrap(), DatabaseUrl::Sqlite("flag.db".into()), "flags win");
            for (url, target) in [
                ("postgres://u:secret@db/bg", "PostgreSQL database bg on db:5432 as u"),
                ("postgresql://u:secret@db:6432/bg?host=/run/pg", "PostgreSQL database bg on /run/pg:6432 as u"),
                (
                    "postgres:///bg?host=%2Frun%2Fpg&user=u&password=secret",
                    "PostgreSQL database bg on /run/pg:5432 as u",
                ),
                ("postgres://u@db", "PostgreSQL database u on db:5432 as u"),
            ] {
                jail.set_env("BLOBGATE_DATABASE_URL", url);
                let s = Settings::load(None, &FlagOverrides::default()).map_err(|e| e.to_string())?;
                let DatabaseUrl::Postgres(pg) = s.database_url().unwrap() else { panic!("{url} is PostgreSQL") };
                assert_eq!(pg.expose_secret(), url);
                assert_eq!(pg.to_string(), target);
                for shown in [format!("{pg:?}"), format!("{s:?}"), s.database_url().unwrap().to_string()] {
                    assert!(!shown.contains("secret"), "the password shows: {shown}");
                    assert!(shown.contains(target), "{shown}");
                }
            }
            for empty in ["", "  "] {
                jail.set_env("BLOBGATE_DATABASE_URL", empty);
                jail.set_env("BLOBGATE_ACCESS_LOG", empty);
                let flags = FlagOverrides { data_dir: Some("/srv/d".into()), ..Default::default() };
                let s = Settings::load(None, &flags).map_err(|e| e.to_string())?;
                assert_eq!(s.database_url().unwrap(), DatabaseUrl::Sqlite("/srv/d/blobgate.db".into()), "unset");
                assert_eq!(s.access_log, None);
            }
            for url in ["postgres://u:secret@db:99999/bg", "postgres://u:secret@[db/bg"] {
                jail.set_env("BLOBGATE_DATABASE_URL", url);
                let err = Settings::load(None, &FlagOverrides::default()).unwrap_err().to_string();
                assert!(err.starts_with("database.url is not a valid PostgreSQL URL"), "{url}: {err}");
                assert!(!err.contains("secret"), "{err}");
            }
            for url in ["mysql://db/bg", "sqlite://", "sqlite::memory:", "sqlite://x.db?mode=ro", "blobgate.db"] {
                jail.set_env("BLOBGATE_DATABASE_URL", url);
                let err = Settings::load(None, &FlagOverrides::default()).unwrap_err().to_string();
                assert!(err.starts_with("database.url must be sqlite://PATH"), "{url}: {err}");
            }
            Ok(())
        });
    }

    #[test]
    fn upload_bounds_default_to_s3s_and_come_from_the_environment() {
        Jail::expect_with(|jail| {
            let l = Settings::load(None, &FlagOverrides::default()).map_err(|e| e.to_string())?.limits;
            assert_eq!((l.max_upload_bytes, l.max_object_bytes), (5 << 30, 5 << 40), "S3's part and object maxima");
            assert_eq!(l.max_unfinished_upload_bytes_per_key, 1 << 40);
            assert_eq!(l.max_body_bytes(), 5 << 30);
            jail.set_env("BLOBGATE_LIMITS__MAX_OBJECT_BYTES", "1000");
            jail.set_env("BLOBGATE_LIMITS__MAX_UNFINISHED_UPLOAD_BYTES_PER_KEY", "0");
            let l = Settings::load(None, &FlagOverrides::default()).map_err(|e| e.to_string())?.limits;
            assert_eq!((l.max_object_bytes, l.max_unfinished_upload_bytes_per_key), (1000, 0));
            assert_eq!(l.max_body_bytes(), 1000, "a one-body object is held to max_object_bytes too");
            jail.set_env("BLOBGATE_LIMITS__MAX_OBJECT_BYTES", "0");
            let err = Settings::load(None, &FlagOverrides::default()).unwrap_err().to_string();
            assert_eq!(err, "limits.max_object_bytes must be at least 1");
            Ok(())
        });
    }

    #[test]
    fn bad_values_name_their_key() {
        Jail::expect_with(|jail| {
            jail.set_env("BLOBGATE_LIMITS__MAX_HEADERS", "lots");
            let err = Settings::load(None, &FlagOverrides::default()).unwrap_err().to_string();
            assert!(err.contains("limits.max_headers"), "{err}");
            jail.set_env("BLOBGATE_LIMITS__MAX_HEADERS", "3");
            let err = Settings::load(None, &FlagOverrides::default()).unwrap_err().to_string();
            assert!(err.contains("limits.max_headers"), "{err}");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.create_file("c.toml", "[timeouts]\nheader_read = \"soon\"\n")?;
            let err = Settings::load(Some(Path::new("c.toml")), &FlagOverrides::default()).unwrap_err().to_string();
            assert!(err.contains("timeouts.header_read"), "{err}");
            jail.create_file("a.toml", "[timeouts]\nhandler = \"2s\"\ndatabase_acquire = \"2s\"\n")?;
            let err = Settings::load(Some(Path::new("a.toml")), &FlagOverrides::default()).unwrap_err().to_string();
            assert_eq!(err, "timeouts.database_acquire (2s) must be shorter than timeouts.handler (2s)");
            jail.create_file("d.toml", "lisen = \"127.0.0.1:1\"\n")?;
            let err = Settings::load(Some(Path::new("d.toml")), &FlagOverrides::default()).unwrap_err().to_string();
            assert!(err.contains("lisen"), "{err}");
            let err =
                Settings::load(Some(Path::new("missing.toml")), &FlagOverrides::default()).unwrap_err().to_string();
            assert!(err.contains("missing.toml"), "{err}");
            Ok(())
        });
    }
}
