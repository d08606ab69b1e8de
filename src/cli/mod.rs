//! The command line. Every command prints its result on stdout and, on bad input, one line on stderr with a
//! non-zero exit status (see `main.rs`). Here: the clap types, the dispatch, and what each command needs of the
//! data dir (read-only, writing, or may create it).

mod auth;
mod blobs;
mod db;
mod limits;
mod objects;
mod stats;
mod uploads;

/// What the commands that set data up do, callable without printing: token and key creation and signing as of a
/// given time (the commands pass their clock, tests a fixture's), bucket creation and `put`. Test fixtures call
/// these with arguments parsed by [`Cli`], so they mean what the command line means.
pub use auth::{PresignRequest, create_s3_key, create_token, presigned_url};
pub use objects::{create_bucket, put};

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;
use clap::{Parser, Subcommand};

use crate::config::{DatabaseFlags, FlagOverrides, Settings, TlsFlags};
use crate::names::{BucketName, IndexDocument, ObjectKey, Website};
use crate::store::{BucketDeletion, StatsOrder, Store};

#[derive(Debug, Parser)]
#[command(name = "blobgate", version, about = "Object-storage download gateway that serves blobs with sendfile(2)")]
pub struct Cli {
    /// Where the database and blob files live; only `serve` and `bucket create` create it, other commands need
    /// it to exist [env: BLOBGATE_DATA_DIR] [default: ./data]
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Settings file [env: BLOBGATE_CONFIG] [default: config/default.toml when it exists]
    // clap would print the variable's value, empty when unset, as `[env: BLOBGATE_CONFIG=]`.
    #[arg(long, global = true, value_name = "FILE", env = "BLOBGATE_CONFIG", hide_env = true)]
    pub config: Option<PathBuf>,
    /// Where the metadata lives: sqlite://PATH or postgres://USER:PASS@HOST:PORT/DB [env: BLOBGATE_DATABASE_URL]
    /// [default: sqlite://<data-dir>/blobgate.db]
    #[arg(long, global = true, value_name = "URL")]
    pub database_url: Option<String>,
    /// Access log for `serve`: one JSON line per response, `-` for stdout [env: BLOBGATE_ACCESS_LOG]
    #[arg(long, global = true, value_name = "PATH")]
    pub access_log: Option<PathBuf>,
    /// HTTPS on both listeners for `serve`: the certificate chain, PEM [env: BLOBGATE_TLS__CERT]
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// HTTPS for `serve`: the private key of the chain's first certificate, PEM [env: BLOBGATE_TLS__KEY]
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
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
    Put(PutArgs),
    /// List a bucket's objects in key order, one line each: key, size, ETag, content type, updated (tab-separated).
    Ls {
        /// The bucket to list.
        bucket: String,
        /// Only keys starting with this.
        prefix: Option<String>,
        /// One JSON object per line instead (with sha256, cache_control, content_disposition, created_at and the
        /// codings of its precompressed variants too).
        #[arg(long)]
        json: bool,
        /// Objects read per database query; the listing is printed page by page.
        #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        page_size: u32,
    },
    /// Delete one object; running servers stop serving it at their next request.
    Rm {
        /// The object's bucket.
        bucket: String,
        /// The object's key.
        key: String,
    },
    /// Manage bearer tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Manage S3 access keys (SigV4).
    #[command(subcommand, name = "s3-key")]
    S3Key(S3KeyCommand),
    /// Limit what principals may ask of each server: request rate, bandwidth and requests in progress, on a token,
    /// an S3 key, a bucket, anonymous clients or everyone by default.
    #[command(subcommand)]
    Limits(LimitsCommand),
    /// Print a signed URL for BUCKET/KEY.
    Presign {
        /// The object's bucket.
        bucket: String,
        /// The object's key (it need not exist yet).
        key: String,
        /// Lifetime: seconds or a duration as the config takes it (`3600`, `1h`, `7days`); at most
        /// auth.presign_max_lifetime.
        #[arg(long, value_name = "DURATION", default_value = "3600", value_parser = duration_secs)]
        expires_in: u64,
        /// Scheme, host and port of the data listener [default: public_url, else http://<listen>]
        #[arg(long, value_name = "URL")]
        base_url: Option<String>,
        /// Make the response carry this Content-Disposition (e.g. `attachment`); covered by the signature.
        #[arg(long, value_name = "VALUE")]
        response_content_disposition: Option<String>,
    },
    /// Manage signed-URL keys, and revoke single signed URLs.
    #[command(subcommand)]
    Signing(SigningCommand),
    /// Database maintenance.
    #[command(subcommand)]
    Db(DbCommand),
    /// Per-object download stats, highest first.
    Stats {
        /// Only this bucket's objects.
        #[arg(long)]
        bucket: Option<String>,
        /// Only keys starting with this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Show this many objects.
        #[arg(long, value_name = "N")]
        top: Option<u32>,
        /// Order by bytes sent or by requests.
        #[arg(long, value_enum, default_value_t = StatsOrder::Bytes)]
        by: StatsOrder,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// S3 multipart uploads that were neither completed nor aborted (they hold their parts on disk).
    #[command(subcommand)]
    Uploads(UploadsCommand),
    /// Where blobs live: move the data dir's blobs to an S3-compatible object store.
    #[command(subcommand)]
    Blobs(BlobsCommand),
    /// Store every regular file under DIR, keyed by its path relative to DIR (idempotent).
    Import {
        /// The bucket to store into (it must exist).
        bucket: String,
        /// The directory to import; symlinks and special files are skipped.
        dir: PathBuf,
        /// Prepended to every key, e.g. `releases/v1/`.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Also store br and gzip variants of text-like files that have no sidecar (`x.br`, `x.gz`) for them.
        #[arg(long)]
        precompress: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum BucketCommand {
    /// Create a bucket (and the data dir, if missing).
    Create {
        /// S3 naming: 3 to 63 of `a-z`, `0-9`, `.` and `-`.
        name: String,
        /// Readable without credentials (the default is private: a token or a signed URL is needed).
        #[arg(long)]
        public: bool,
    },
    /// List buckets as JSON lines.
    List,
    /// Change who may read a bucket, the Cache-Control served for its objects that store none, or its index and
    /// error documents (a static site). Running servers apply it at their next request.
    #[command(group(clap::ArgGroup::new("change").required(true).multiple(true)
        .args(["public", "private", "cache_control", "index_document", "error_document"])))]
    Set {
        /// The bucket to change.
        name: String,
        /// Readable without credentials.
        #[arg(long, conflicts_with = "private")]
        public: bool,
        /// Readable only with a token or a signed URL.
        #[arg(long)]
        private: bool,
        /// Default Cache-Control for objects that store none; `""` removes the default.
        #[arg(long, value_name = "VALUE")]
        cache_control: Option<String>,
        /// What a directory path (`/NAME/`, `/NAME/dir/`) serves: that directory's key plus this relative suffix,
        /// such as `index.html`; `""` turns it off.
        #[arg(long, value_name = "SUFFIX")]
        index_document: Option<String>,
        /// The key served, with 404, for a missing key (such as `404.html`); `""` turns it off.
        #[arg(long, value_name = "KEY")]
        error_document: Option<String>,
    },
    /// Set or clear the bucket's CORS rule (which web origins may read its objects from a script). Running
    /// servers apply it at their next request.
    #[command(subcommand)]
    Cors(CorsCommand),
    /// Delete a bucket with its tokens, download stats and unfinished S3 uploads; refused while it has objects,
    /// unless --force.
    Delete {
        /// The bucket to delete.
        name: String,
        /// Delete its objects first (their blobs go with their last reference).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum UploadsCommand {
    /// List unfinished uploads as JSON lines (bucket, key, upload_id, parts, bytes, started, created_by), by
    /// bucket, then key, then age.
    List {
        /// Only this bucket's uploads.
        #[arg(long)]
        bucket: Option<String>,
    },
    /// Abort an upload: its parts are deleted, and their files removed.
    Abort {
        /// The upload's bucket.
        bucket: String,
        /// The key the upload was started for.
        key: String,
        /// The upload's id, as `uploads list` shows it.
        upload_id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum BlobsCommand {
    /// Copy every blob an object references from the data dir to an object store (resumable and idempotent:
    /// blobs already there with their size are skipped), then print one JSON line. Endpoint, region and
    /// credentials come from the `blob_store` settings; serve with `blob_store.url` set to the same URL afterwards.
    Migrate {
        /// The object store: s3://BUCKET or s3://BUCKET/PREFIX.
        #[arg(long)]
        to: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum CorsCommand {
    /// Replace the bucket's CORS rule.
    Set {
        /// The bucket to change.
        name: String,
        /// An origin allowed to read, as browsers send it (`https://app.example`, `http://localhost:8080`), or `*`
        /// for any. Repeat for several.
        #[arg(long = "origin", value_name = "ORIGIN", required = true)]
        origins: Vec<String>,
        /// Seconds a browser may cache a preflight answer (at most 86400).
        #[arg(long, value_name = "SECS")]
        max_age: Option<u32>,
        /// A response header scripts may read, besides Content-Range, Content-Length, ETag, Accept-Ranges and
        /// Content-Encoding. Repeat for several.
        #[arg(long = "expose-header", value_name = "HEADER")]
        expose_headers: Vec<String>,
        /// A method pages may send (GET, HEAD, PUT, POST, DELETE; e.g. PUT to a presigned URL). Repeat for several;
        /// without it, GET and HEAD.
        #[arg(long = "method", value_name = "METHOD")]
        methods: Vec<String>,
        /// A request header pages may send beyond Range, the If-* headers and Authorization (e.g. content-type), or
        /// `*` for any. Repeat for several.
        #[arg(long = "allow-header", value_name = "HEADER")]
        allow_headers: Vec<String>,
    },
    /// Remove the bucket's CORS rule: responses carry no CORS headers.
    Clear {
        /// The bucket to change.
        name: String,
    },
}

/// `--by`, spelled as `StatsOrder` spells itself (as the admin listener's `?by=` does).
impl clap::ValueEnum for StatsOrder {
    fn value_variants<'a>() -> &'a [Self] {
        &StatsOrder::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.as_str()))
    }
}

/// What `put` stores: `cli::put` checks it and stages the file.
#[derive(Debug, clap::Args)]
pub struct PutArgs {
    /// The bucket to store into (it must exist).
    pub bucket: String,
    /// The object's key: 1 to 1024 bytes of UTF-8, `/` allowed.
    pub key: String,
    /// The file to copy.
    pub file: PathBuf,
    /// Content-Type to serve [default: guessed from the key's extension]
    #[arg(long, value_name = "TYPE")]
    pub content_type: Option<String>,
    /// Cache-Control to serve [default: the bucket's default, if it has one]
    #[arg(long, value_name = "VALUE")]
    pub cache_control: Option<String>,
    /// Content-Disposition to serve; a bare `attachment` or `inline` gets the key's last segment as file name.
    #[arg(long, value_name = "VALUE")]
    pub content_disposition: Option<String>,
    /// Also store br and gzip variants of a text-like type, each when it is smaller.
    #[arg(long)]
    pub precompress: bool,
}

/// What `token create` and `s3-key create` grant: `cli::auth` checks it and turns it into the store's `Rights`.
#[derive(Debug, clap::Args)]
pub struct GrantArgs {
    /// The bucket it gives access to (the one-grant form; `--grant` adds more).
    #[arg(long)]
    pub bucket: Option<String>,
    /// With --bucket: only keys starting with this prefix.
    #[arg(long)]
    pub prefix: Option<String>,
    /// With --bucket: read (GET/HEAD, listings), write (read + uploads and deletes) or admin [default: read].
    #[arg(long)]
    pub scope: Option<String>,
    /// A grant, BUCKET[/PREFIX]:SCOPE (the last `:` separates the scope); repeatable. `*` is every bucket:
    /// `--grant '*:admin'` also creates and deletes buckets (S3 CreateBucket, DeleteBucket).
    #[arg(long = "grant", value_name = "BUCKET[/PREFIX]:SCOPE")]
    pub grants: Vec<String>,
    /// Lifetime: seconds or a duration as the config takes it (`3600`, `1h`, `7days`); without it, it does not
    /// expire.
    #[arg(long, value_name = "DURATION", value_parser = duration_secs)]
    pub expires_in: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it (it is shown only once).
    Create {
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Revoke a token, given the token itself or its id. Takes effect on running servers at once.
    Revoke {
        /// The token, or its id (the part after `bg_`, as `token list` shows it).
        token: String,
    },
    /// List tokens as JSON lines (ids, scopes, expiry; never secrets).
    List,
}

#[derive(Debug, Subcommand)]
pub enum DbCommand {
    /// List the schema's migrations, this release's and the database's: version, state (applied, pending; newer:
    /// applied by a newer release, which this one tolerates; unknown, differs, failed: another line of releases,
    /// refused), when applied, description. Reads only, and creates nothing.
    Status {
        /// One JSON object per line instead.
        #[arg(long)]
        json: bool,
    },
    /// Apply this release's pending migrations and exit; prints each applied one as `db status` does.
    Migrate {
        /// One JSON object per line instead.
        #[arg(long)]
        json: bool,
    },
    /// Copy every bucket, object, token, S3 key, signing key, revoked URL, stats row and S3 upload in progress
    /// into an empty database (e.g. from SQLite to PostgreSQL), in one transaction, and check the counts. Blobs
    /// and part files stay in the data dir.
    Copy {
        /// The target database: postgres://USER:PASS@HOST:PORT/DB (or sqlite://PATH). Its migrations are applied.
        #[arg(long, value_name = "URL")]
        to: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum S3KeyCommand {
    /// Create an access key and print `ACCESS_KEY_ID SECRET_ACCESS_KEY` (the secret is shown only once).
    Create {
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Revoke an access key. Takes effect on running servers at their next request.
    Revoke {
        /// The access key id.
        access_key_id: String,
    },
    /// List access keys as JSON lines (ids, scopes, expiry; never secrets).
    List,
}

#[derive(Debug, Subcommand)]
pub enum LimitsCommand {
    /// Set or change the limit on PRINCIPAL (only the options given change) and print it as a JSON line. Running
    /// servers apply it at their next request.
    Set {
        /// `default` (each principal without a limit of its own), `anonymous` (each client address group),
        /// `token:ID`, `s3-key:ACCESS_KEY_ID` or `bucket:NAME` (shared by everyone using the bucket).
        principal: String,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Print limits as JSON lines: PRINCIPAL's, or all.
    Show {
        /// As `limits set` takes it.
        principal: Option<String>,
    },
    /// Remove the limit on PRINCIPAL.
    Clear {
        /// As `limits set` takes it.
        principal: String,
    },
}

/// What a limit allows (per server); an option not given leaves that part as it was.
#[derive(Debug, clap::Args)]
pub struct LimitArgs {
    /// Requests per second, minute or hour: `100/s`, `6000/min`, `10/h`.
    #[arg(long, value_name = "RATE", value_parser = request_rate)]
    requests: Option<crate::throttle::RequestRate>,
    /// Requests that may come at once above the rate [default: the rate's count].
    #[arg(long, value_name = "N")]
    request_burst: Option<u32>,
    /// Object bytes sent per second, shared by all the principal's downloads: `50MiB/s`, `10MB/s`.
    #[arg(long, value_name = "RATE", value_parser = read_rate)]
    read: Option<u64>,
    /// Bytes that may go at once above the read rate: `8MiB` [default: a tenth of a second's worth, 64KiB at
    /// least].
    #[arg(long, value_name = "SIZE", value_parser = burst_size)]
    read_burst: Option<u64>,
    /// Upload body bytes received per second, shared by all the principal's uploads: `20MiB/s`.
    #[arg(long, value_name = "RATE", value_parser = write_rate)]
    write: Option<u64>,
    /// Bytes that may come at once above the write rate [default: as `--read-burst`].
    #[arg(long, value_name = "SIZE", value_parser = burst_size)]
    write_burst: Option<u64>,
    /// Requests in progress at once (a download counts until its last byte is sent).
    #[arg(long, value_name = "N")]
    concurrent: Option<u32>,
    /// The principal's share of a saturated server's sends against other principals' (1 to 1000) [default: 1].
    #[arg(long, value_name = "N")]
    weight: Option<u32>,
    /// `anonymous` only: the leading bits of an IPv4 address that make one client [default: 32].
    #[arg(long, value_name = "BITS")]
    ipv4_prefix: Option<u8>,
    /// `anonymous` only: the leading bits of an IPv6 address that make one client [default: 64].
    #[arg(long, value_name = "BITS")]
    ipv6_prefix: Option<u8>,
}

impl LimitArgs {
    fn into_set(self) -> crate::throttle::LimitSet {
        crate::throttle::LimitSet {
            requests: self.requests,
            request_burst: self.request_burst,
            read_bytes: self.read,
            read_burst: self.read_burst,
            write_bytes: self.write,
            write_burst: self.write_burst,
            concurrent: self.concurrent,
            ipv4_prefix: self.ipv4_prefix,
            ipv6_prefix: self.ipv6_prefix,
            weight: self.weight,
        }
    }
}

/// `--read`: `SIZE/s`.
fn read_rate(value: &str) -> Result<u64, String> {
    crate::throttle::parse_byte_rate(value, "--read").map_err(|e| e.to_string())
}

/// `--write`: `SIZE/s`.
fn write_rate(value: &str) -> Result<u64, String> {
    crate::throttle::parse_byte_rate(value, "--write").map_err(|e| e.to_string())
}

/// `--read-burst`, `--write-burst`: a size.
fn burst_size(value: &str) -> Result<u64, String> {
    crate::throttle::parse_size(value, "burst").map_err(|e| e.to_string())
}

/// `--requests`: `COUNT/s`, `COUNT/min` or `COUNT/h`.
fn request_rate(value: &str) -> Result<crate::throttle::RequestRate, String> {
    crate::throttle::RequestRate::parse(value).map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
pub enum SigningCommand {
    /// Add a new signing key; new links are signed with it, old ones keep verifying.
    Rotate,
    /// Stop a key from verifying: every link signed with it stops working.
    Retire {
        /// The key's id, as `signing list` shows it.
        key_id: String,
    },
    /// List signing keys as JSON lines (never secrets).
    List,
    /// Revoke one signed URL.
    RevokeUrl {
        /// The whole signed URL, as `presign` printed it.
        url: String,
    },
}

impl Cli {
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let mut flags = FlagOverrides {
            data_dir: self.data_dir.clone(),
            database: self.database_url.clone().map(|url| DatabaseFlags { url: Some(url) }),
            access_log: self.access_log.clone(),
            ..Default::default()
        };
        if let Command::Serve { listen, admin_listen } = &self.command {
            flags.listen = *listen;
            flags.admin_listen = *admin_listen;
            if self.tls_cert.is_some() || self.tls_key.is_some() {
                flags.tls = Some(TlsFlags { cert: self.tls_cert.clone(), key: self.tls_key.clone() });
            }
        }
        Settings::load(self.config.as_deref(), &flags)
    }
}

/// What a command needs from the data dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Reads only: opens the database read-only and creates nothing, so a read-only data dir will do.
    Read,
    /// Writes into an existing data dir.
    Write,
    /// May start a new data dir.
    Create,
}

fn access(command: &Command) -> Access {
    match command {
        Command::Serve { .. } | Command::Bucket(BucketCommand::Create { .. }) => Access::Create,
        Command::Bucket(BucketCommand::List)
        | Command::Ls { .. }
        | Command::Stats { .. }
        | Command::Token(TokenCommand::List)
        | Command::S3Key(S3KeyCommand::List)
        | Command::Limits(LimitsCommand::Show { .. })
        | Command::Signing(SigningCommand::List)
        | Command::Uploads(UploadsCommand::List { .. })
        | Command::Blobs(BlobsCommand::Migrate { .. })
        | Command::Db(DbCommand::Status { .. } | DbCommand::Copy { .. }) => Access::Read,
        _ => Access::Write,
    }
}

/// Runs a command other than `serve`. Only `bucket create` starts a new data dir: anything else run from the
/// wrong directory says where it looked instead of creating an empty `./data` there.
pub async fn run_command(command: Command, settings: Settings) -> anyhow::Result<()> {
    let database = settings.database_url()?;
    run_on_store(command, settings).await.map_err(|e| name_unreachable_database(e, &database))
}

/// An unreachable database, wherever in the command it showed (opening it names it already), gets one line that
/// says which database: SQLite's path, or PostgreSQL's host, port and database (`DatabaseUrl`'s `Display` never
/// shows a password).
fn name_unreachable_database(error: anyhow::Error, database: &crate::config::DatabaseUrl) -> anyhow::Error {
    if crate::store::MetadataError::in_chain_is_unavailable(&error) {
        error.context(format!("{database} is unreachable"))
    } else {
        error
    }
}

async fn run_on_store(command: Command, settings: Settings) -> anyhow::Result<()> {
    let dir = &settings.data_dir;
    let access = access(&command);
    if access != Access::Create {
        let shown = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        if !dir.exists() {
            bail!(
                "data dir {} does not exist (set --data-dir or BLOBGATE_DATA_DIR; `bucket create` or `serve` creates it)",
                shown.display()
            );
        }
        if !dir.is_dir() {
            bail!("data dir {} is not a directory", shown.display());
        }
    }
    // These open the database themselves: neither needs the blob store or the secrets key.
    match command {
        Command::Db(DbCommand::Status { json }) => return db::status(&settings, json).await,
        Command::Db(DbCommand::Migrate { json }) => return db::migrate(&settings, json).await,
        _ => {}
    }
    let busy = settings.timeouts.database();
    let database = settings.database_url()?;
    let store = match access {
        Access::Read => Store::open_read_only(dir, &database, busy).await?,
        Access::Write | Access::Create => Store::open(dir, &database, busy).await?,
    };
    let store = store.with_blob_store(&settings, false).await?;
    // `db copy` refuses such a database instead (it would drop what the newer release stored).
    if !matches!(command, Command::Db(DbCommand::Copy { .. })) {
        db::warn_of_newer(store.meta.migrations());
    }
    let result = match command {
        Command::Serve { .. } => unreachable!("serve is run by main"),
        Command::Bucket(BucketCommand::Create { name, public }) => {
            let bucket = objects::create_bucket(&store, &name, public).await?;
            println!("{}", serde_json::json!({ "bucket": bucket.name, "public": bucket.public }));
            Ok(())
        }
        Command::Bucket(BucketCommand::List) => {
            for b in store.meta.list_buckets().await? {
                println!("{}", objects::bucket_json(&b));
            }
            Ok(())
        }
        Command::Bucket(BucketCommand::Set {
            name,
            public,
            private,
            cache_control,
            index_document,
            error_document,
        }) => {
            // Every flag is checked before the one update, so bad input changes nothing.
            let website = (
                flag_change(index_document, IndexDocument::parse)?,
                flag_change(error_document, Website::parse_error_document)?,
            );
            objects::set_bucket(&store, &name, public, private, cache_control, website).await
        }
        Command::Bucket(BucketCommand::Cors(CorsCommand::Set {
            name,
            origins,
            max_age,
            expose_headers,
            methods,
            allow_headers,
        })) => {
            let methods = methods.iter().map(|m| m.to_ascii_uppercase()).collect();
            let allow_headers = allow_headers.iter().map(|h| h.to_ascii_lowercase()).collect();
            let rule =
                crate::header_values::cors::CorsRule { origins, max_age, expose_headers, methods, allow_headers };
            objects::set_bucket_cors(&store, &name, Some(rule)).await
        }
        Command::Bucket(BucketCommand::Cors(CorsCommand::Clear { name })) => {
            objects::set_bucket_cors(&store, &name, None).await
        }
        Command::Bucket(BucketCommand::Delete { name, force }) => {
            let name = BucketName::parse(&name)?;
            match store.delete_bucket(&name, force).await? {
                BucketDeletion::NotEmpty { objects } => {
                    bail!("bucket {name} has {objects} objects: delete them first, or use --force")
                }
                BucketDeletion::Deleted { objects, tokens, uploads } => {
                    let line = serde_json::json!({ "bucket": name.as_str(), "deleted_objects": objects,
                        "deleted_tokens": tokens, "aborted_uploads": uploads });
                    println!("{line}");
                }
            }
            Ok(())
        }
        Command::Ls { bucket, prefix, json, page_size } => {
            objects::list_objects(&store, &bucket, &prefix.unwrap_or_default(), json, page_size).await
        }
        Command::Rm { bucket, key } => {
            let bucket = BucketName::parse(&bucket)?;
            let key = ObjectKey::parse(&key)?;
            if !store.delete(&bucket, &key).await? {
                bail!("no such object: {bucket}/{key}");
            }
            eprintln!("deleted {bucket}/{key}");
            Ok(())
        }
        Command::Put(args) => {
            println!("{}", serde_json::to_string(&objects::put(&store, args).await?)?);
            Ok(())
        }
        Command::Import { bucket, dir, prefix, precompress } => {
            objects::import(&store, &bucket, &dir, &prefix, precompress).await
        }
        Command::Token(command) => auth::token(&store, command).await,
        Command::S3Key(command) => auth::s3_key(&store, command).await,
        Command::Limits(command) => limits::limits(&store, command).await,
        Command::Presign { bucket, key, expires_in, base_url, response_content_disposition } => {
            let base_url = match (base_url, settings.public_url()?) {
                (Some(given), _) => given,
                (None, Some(public)) => public,
                (None, None) => format!("http://{}", settings.listen),
            };
            let request = auth::PresignRequest { bucket, key, expires_in, base_url, response_content_disposition };
            auth::presign(&store, &settings, request).await
        }
        Command::Signing(command) => auth::signing(&store, command).await,
        Command::Stats { bucket, prefix, top, by, json } => stats::stats(&store, bucket, &prefix, top, by, json).await,
        Command::Uploads(UploadsCommand::List { bucket }) => uploads::list(&store, bucket.as_deref()).await,
        Command::Uploads(UploadsCommand::Abort { bucket, key, upload_id }) => {
            uploads::abort(&store, &bucket, &key, &upload_id).await
        }
        Command::Db(DbCommand::Copy { to }) => db::copy(&store, &to, &settings).await,
        Command::Blobs(BlobsCommand::Migrate { to }) => blobs::migrate(&store, &to, &settings).await,
        Command::Db(DbCommand::Status { .. } | DbCommand::Migrate { .. }) => unreachable!("run above"),
    };
    store.meta.close().await;
    result
}

/// `bucket set`'s index and error documents, parsed: `None` leaves one as it is, `Some(None)` turns it off.
type WebsiteChanges = (Option<Option<IndexDocument>>, Option<Option<ObjectKey>>);

/// A flag that sets a value or, given as `""`, clears it.
fn flag_change<T>(
    flag: Option<String>,
    parse: impl Fn(&str) -> Result<T, crate::names::NameError>,
) -> Result<Option<Option<T>>, crate::names::NameError> {
    match flag {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(Some(None)),
        Some(v) => parse(&v).map(|parsed| Some(Some(parsed))),
    }
}

/// A Unix time as RFC 3339 (UTC, seconds): how every command prints times.
pub fn rfc3339(unix_secs: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix_secs.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `--expires-in`: whole seconds (`3600`) or a duration in the config's spelling (`1h`, `90min`, `7days`).
fn duration_secs(value: &str) -> Result<u64, String> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Ok(secs);
    }
    let duration = humantime::parse_duration(value)
        .map_err(|_| format!("{value:?} is not a duration: give seconds (3600) or a duration (1h, 7days)"))?;
    if duration.subsec_nanos() != 0 {
        return Err(format!("{value:?} is not a whole number of seconds"));
    }
    Ok(duration.as_secs())
}

#[cfg(test)]
mod tests {

    #[test]
    fn expires_in_takes_seconds_or_the_configs_durations() {
        for (given, secs) in [("3600", 3600), ("1h", 3600), ("7days", 604_800), ("90min", 5400), (" 2s ", 2), ("0", 0)]
        {
            assert_eq!(duration_secs(given), Ok(secs), "{given}");
        }
        for bad in ["", "soon", "-5", "1.5s", "500ms"] {
            assert!(duration_secs(bad).is_err(), "{bad}");
        }
    }
    use clap::CommandFactory;

    use super::*;

    /// Every argument of every command, in `--help`, says what it is.
    #[test]
    fn every_argument_has_help() {
        fn check(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(format!("{path} {} (the command)", sub.get_name()));
                }
                check(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let command = Cli::command();
        command.clone().debug_assert();
        let mut missing = Vec::new();
        check(&command, "blobgate", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }

    #[test]
    fn times_print_as_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(-5), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn an_unreachable_database_is_named_in_the_one_line_error() {
        use crate::config::DatabaseUrl;
        let unreachable = || {
            anyhow::Error::from(crate::store::MetadataError::no_answer_within(std::time::Duration::from_secs(1)))
                .context("cannot list objects")
        };
        let sqlite = DatabaseUrl::Sqlite("/srv/bg/blobgate.db".into());
        let line = format!("{:#}", name_unreachable_database(unreachable(), &sqlite));
        assert!(line.starts_with("SQLite database /srv/bg/blobgate.db is unreachable: "), "{line}");
        let postgres = DatabaseUrl::parse("postgres://bg:s3cret@db.internal:5433/meta").unwrap();
        let line = format!("{:#}", name_unreachable_database(unreachable(), &postgres));
        assert!(line.contains("db.internal:5433") && line.contains("meta") && !line.contains("s3cret"), "{line}");
        assert!(!line.contains('\n'), "{line}");
        let other = name_unreachable_database(anyhow::anyhow!("no such bucket"), &postgres);
        assert_eq!(format!("{other:#}"), "no such bucket", "only an unreachable database is named");
    }
}
