//! S3 test helpers for every module that speaks S3: real clients (boto3, aws-cli, rclone, s3cmd) in a clean
//! environment with their own `$HOME`, access keys as the CLI makes them, and SigV4 signatures computed by botocore,
//! never by our code.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use super::{Response, TestEnv, require_tool};

/// Keys that break a client that does not encode them right.
pub const ODD_KEYS: &[&str] = &["dir/a b+c%d.txt", "dir/sub/é ü.bin", "top+plus.txt", "100%.txt", "x/y/z"];

/// The python3 that has boto3 and, next to it, aws-cli's `aws` (found by `scripts/test-services`).
pub fn python() -> &'static PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| PathBuf::from(super::test_service("BLOBGATE_TEST_PYTHON")))
}

/// A client command with a clean environment: `PATH`, a UTF-8 locale and its own `$HOME`, nothing else.
pub fn clean_command(program: impl AsRef<std::ffi::OsStr>, home: &Path) -> Command {
    std::fs::create_dir_all(home).unwrap();
    let mut cmd = Command::new(program);
    cmd.env_clear();
    for (name, value) in clean_env(home) {
        cmd.env(name, value);
    }
    cmd
}

fn clean_env(home: &Path) -> Vec<(String, String)> {
    let path = std::env::var("PATH").unwrap_or_default();
    let home = home.to_str().expect("a UTF-8 home").to_owned();
    [("PATH", path), ("HOME", home), ("LANG", "C.UTF-8".into()), ("LC_ALL", "C.UTF-8".into())]
        .map(|(name, value)| (name.to_owned(), value))
        .into()
}

/// What runs to its end and gives its output: a [`Command`], or a [`PythonScript`].
pub trait Run: std::fmt::Debug {
    fn run(&mut self) -> Output;
}

impl Run for Command {
    fn run(&mut self) -> Output {
        self.output().unwrap_or_else(|e| panic!("run {self:?}: {e}"))
    }
}

pub fn run_ok(cmd: &mut impl Run) -> String {
    let out = cmd.run();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A Python script run by a fork server of the test run (`tests/s3/python_server.py`, which imported boto3 or
/// aws-cli once), as `python3 ARGV...` with a clean environment would run it: its own `$HOME`, `PATH` and a UTF-8
/// locale, plus what [`PythonScript::env`] adds, in this process's directory.
pub struct PythonScript {
    /// The server's variable: `BLOBGATE_TEST_BOTO3` or `BLOBGATE_TEST_AWSCLI`.
    server: &'static str,
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

impl PythonScript {
    /// `python3 -c CODE ARGS...` with boto3 imported beforehand.
    pub fn boto3(home: &Path, code: &str, args: &[&str]) -> Self {
        let argv = ["-c", code].iter().chain(args).map(|a| (*a).to_owned()).collect();
        Self::new("BLOBGATE_TEST_BOTO3", home, argv)
    }

    /// `aws ARGS...` (aws-cli), imported beforehand.
    pub fn aws(home: &Path, args: &[&str]) -> Self {
        let aws = python().parent().unwrap().join("aws");
        assert!(aws.exists(), "aws-cli is not installed next to {} (pip install awscli)", python().display());
        let argv = std::iter::once(aws.to_str().unwrap()).chain(args.iter().copied()).map(str::to_owned).collect();
        Self::new("BLOBGATE_TEST_AWSCLI", home, argv)
    }

    fn new(server: &'static str, home: &Path, argv: Vec<String>) -> Self {
        std::fs::create_dir_all(home).unwrap();
        Self { server, argv, env: clean_env(home) }
    }

    /// Adds (or replaces) an environment variable.
    pub fn env(&mut self, name: &str, value: impl AsRef<std::ffi::OsStr>) -> &mut Self {
        let value = value.as_ref().to_str().expect("a UTF-8 value").to_owned();
        self.env.retain(|(n, _)| n != name);
        self.env.push((name.to_owned(), value));
        self
    }
}

impl std::fmt::Debug for PythonScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "python3 {:?} (by the fork server, env {:?})", self.argv, self.env)
    }
}

impl Run for PythonScript {
    /// Sends the script to its server and waits for the exit status of the process that ran it.
    fn run(&mut self) -> Output {
        use std::io::{BufRead, Write};
        use std::os::unix::process::ExitStatusExt;
        let socket = super::test_service(self.server);
        let files = tempfile::tempdir().expect("temp dir");
        let (stdout, stderr) = (files.path().join("stdout"), files.path().join("stderr"));
        std::fs::write(&stdout, b"").unwrap();
        std::fs::write(&stderr, b"").unwrap();
        let env: serde_json::Map<_, _> = self.env.iter().map(|(n, v)| (n.clone(), v.as_str().into())).collect();
        let request = serde_json::json!({
            "argv": self.argv, "env": env, "cwd": std::env::current_dir().expect("the current directory"),
            "stdout": stdout, "stderr": stderr,
        });
        let mut conn = std::os::unix::net::UnixStream::connect(&socket)
            .unwrap_or_else(|e| panic!("the Python fork server at {socket} (scripts/test-services): {e}"));
        conn.write_all(format!("{request}\n").as_bytes()).expect("send the script");
        let mut answer = String::new();
        std::io::BufReader::new(conn).read_line(&mut answer).expect("the script's exit status");
        let answer: serde_json::Value = serde_json::from_str(&answer)
            .unwrap_or_else(|_| panic!("the fork server at {socket} gave no exit status for {self:?}: {answer:?}"));
        let status = answer["wait_status"].as_i64().expect("a wait status") as i32;
        Output {
            status: std::process::ExitStatus::from_raw(status),
            stdout: std::fs::read(&stdout).unwrap(),
            stderr: std::fs::read(&stderr).unwrap(),
        }
    }
}

/// What every boto3 script of `run_boto3` starts with: `spec` (the JSON argument), `client(endpoint, key)` (a path
/// style SigV4 client with no retries, for a `{"id", "secret"}` key) and `code(call)` (`[status, S3 code]` of the
/// call, `[200, ""]` when it succeeds).
const BOTO3_PRELUDE: &str = r#"
import datetime, hashlib, json, sys, threading
import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError
spec = json.loads(sys.argv[1])
def client(endpoint, key):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key["id"],
        aws_secret_access_key=key["secret"], region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
def code(call):
    try:
        call()
        return [200, ""]
    except ClientError as e:
        return [e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]]
"#;

/// Runs a boto3 script (after [`BOTO3_PRELUDE`]) with `spec` as its argument, in a clean environment with its own
/// `$HOME`, and parses the JSON it prints.
pub fn run_boto3(home: &Path, script: &str, spec: &serde_json::Value) -> serde_json::Value {
    let out = boto3_output(home, script, spec);
    serde_json::from_str(out.trim()).expect("the script prints JSON")
}

/// The same to run later or beside something else (a thread), or whose output is not JSON: [`run_ok`] runs it.
pub fn boto3_command(home: &Path, script: &str, spec: &serde_json::Value) -> PythonScript {
    PythonScript::boto3(home, &format!("{BOTO3_PRELUDE}{script}"), &[&spec.to_string()])
}

/// A boto3 script's stdout (it must succeed).
pub fn boto3_output(home: &Path, script: &str, spec: &serde_json::Value) -> String {
    run_ok(&mut boto3_command(home, script, spec))
}

/// An access key as the boto3 scripts take it.
pub fn key_json(key: &AccessKey) -> serde_json::Value {
    serde_json::json!({"id": key.id, "secret": key.secret})
}

/// An access key's two halves.
#[derive(Clone)]
pub struct AccessKey {
    pub id: String,
    pub secret: String,
}

/// `blobgate s3-key create --bucket BUCKET EXTRA...` (made in this process: `fixtures`).
pub fn s3_key(env: &TestEnv, bucket: &str, extra: &[&str]) -> AccessKey {
    access_key(&env.s3_key_line(&[&["--bucket", bucket][..], extra].concat()))
}

/// An access key with these `--grant BUCKET[/PREFIX]:SCOPE`s.
pub fn s3_key_granting(env: &TestEnv, grants: &[&str]) -> AccessKey {
    let args: Vec<&str> = grants.iter().flat_map(|grant| ["--grant", grant]).collect();
    access_key(&env.s3_key_line(&args))
}

fn access_key(line: &str) -> AccessKey {
    let (id, secret) = line.trim().split_once(' ').expect("ACCESS_KEY_ID SECRET_ACCESS_KEY");
    AccessKey { id: id.into(), secret: secret.into() }
}

/// Signs with botocore (`S3SigV4Auth` for headers, `S3SigV4QueryAuth` for presigned URLs), optionally at another
/// time (`skew_secs` from now) or with another region.
const SIGNER: &str = r#"
import datetime, json, sys
import botocore.auth
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
spec = json.loads(sys.argv[1])
if spec.get("skew_secs"):
    real = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda: real() + datetime.timedelta(seconds=spec["skew_secs"])
creds = Credentials(spec["id"], spec["secret"])
req = AWSRequest(method=spec["method"], url=spec["url"], headers=spec.get("headers", {}))
region = spec.get("region", "us-east-1")
if spec.get("expires") is not None:
    S3SigV4QueryAuth(creds, "s3", region, expires=spec["expires"]).add_auth(req)
    print(json.dumps({"url": req.url}))
else:
    S3SigV4Auth(creds, "s3", region).add_auth(req)
    print(json.dumps({"headers": dict(req.headers.items())}))
"#;

/// What to sign.
#[derive(Default)]
pub struct Signing<'a> {
    pub method: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub expires: Option<u64>,
    pub skew_secs: i64,
    pub region: Option<&'a str>,
}

fn botocore(key: &AccessKey, url: &str, signing: &Signing<'_>) -> serde_json::Value {
    let home = tempfile::tempdir().unwrap();
    let headers: serde_json::Map<String, serde_json::Value> =
        signing.headers.iter().map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v))).collect();
    let spec = serde_json::json!({
        "id": key.id, "secret": key.secret, "method": if signing.method.is_empty() { "GET" } else { signing.method },
        "url": url, "headers": headers, "expires": signing.expires, "skew_secs": signing.skew_secs,
        "region": signing.region.unwrap_or("us-east-1"),
    });
    let out = run_ok(&mut PythonScript::boto3(home.path(), SIGNER, &[&spec.to_string()]));
    serde_json::from_str(out.trim()).expect("signer prints JSON")
}

/// The headers botocore adds to sign `path` for host `test` (what `helpers::raw_request` sends), with the given
/// extra headers signed too; returned with those extra headers, ready for `Server::get`.
pub fn signed_headers(key: &AccessKey, path: &str, signing: &Signing<'_>) -> Vec<(String, String)> {
    signed_headers_for_host("test", key, path, signing)
}

/// The same for another `Host` (the admin helper sends `t`).
pub fn signed_headers_for_host(
    host: &str,
    key: &AccessKey,
    path: &str,
    signing: &Signing<'_>,
) -> Vec<(String, String)> {
    let value = botocore(key, &format!("http://{host}{path}"), signing);
    let headers = value["headers"].as_object().expect("signed headers");
    headers.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())).collect()
}

/// A presigned URL's path and query for host `test`.
pub fn presigned_path(key: &AccessKey, path: &str, signing: &Signing<'_>) -> String {
    let value = botocore(key, &format!("http://test{path}"), signing);
    let url = value["url"].as_str().expect("presigned url");
    url.strip_prefix("http://test").expect("same host").to_owned()
}

/// A presigned URL for `url` (any host: what a browser will send).
pub fn presigned_url(key: &AccessKey, url: &str, signing: &Signing<'_>) -> String {
    botocore(key, url, signing)["url"].as_str().expect("presigned url").to_owned()
}

pub fn as_refs(headers: &[(String, String)]) -> Vec<(&str, &str)> {
    headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// An S3 error body's `<Code>`.
pub fn s3_code(response: &Response) -> String {
    let body = String::from_utf8_lossy(&response.body);
    let start = body.find("<Code>").map(|i| i + 6);
    let end = body.find("</Code>");
    match (start, end) {
        (Some(s), Some(e)) if s <= e => body[s..e].to_owned(),
        _ => panic!("no S3 error code in {} {body:?}", response.status),
    }
}

/// aws-cli's config and credentials files under `home`.
pub fn aws_home(home: &Path, key: &AccessKey) {
    let dir = home.join(".aws");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config"),
        "[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n    signature_version = s3v4\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("credentials"),
        format!("[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n", key.id, key.secret),
    )
    .unwrap();
}

pub fn aws(home: &Path, endpoint: &str, args: &[&str]) -> String {
    run_ok(&mut PythonScript::aws(home, &[&["--endpoint-url", endpoint][..], args].concat()))
}

pub fn rclone(home: &Path, args: &[&str]) -> String {
    require_tool("rclone", "apt package rclone");
    let config = home.join("rclone.conf");
    run_ok(clean_command("rclone", home).arg("--config").arg(&config).args(args))
}

/// Writes `home/rclone.conf` with one remote `bg` (`provider = Other`, path style) for `key` at `endpoint`
/// (`host:port`), plus `extra` lines.
pub fn rclone_config(home: &Path, key: &AccessKey, endpoint: &str, extra: &str) {
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(
        home.join("rclone.conf"),
        format!(
            "[bg]\ntype = s3\nprovider = Other\naccess_key_id = {}\nsecret_access_key = {}\nendpoint = http://{endpoint}\n\
             region = us-east-1\nforce_path_style = true\n{extra}",
            key.id, key.secret
        ),
    )
    .unwrap();
}

/// rclone with `home/rclone.conf`, its output kept whether it succeeds or not (for the caller to read its log).
pub fn rclone_output(home: &Path, args: &[&str]) -> Output {
    require_tool("rclone", "apt package rclone");
    clean_command("rclone", home).arg("--config").arg(home.join("rclone.conf")).args(args).output().expect("run rclone")
}

/// Writes `home/.s3cfg` for `key` at `endpoint` (`host:port`), path style, SigV4.
pub fn s3cmd_config(home: &Path, key: &AccessKey, endpoint: &str) {
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(
        home.join(".s3cfg"),
        format!(
            "[default]\naccess_key = {}\nsecret_key = {}\nhost_base = {endpoint}\nhost_bucket = {endpoint}\nuse_https = False\n\
             signature_v2 = False\nbucket_location = us-east-1\ncheck_ssl_certificate = False\n",
            key.id, key.secret
        ),
    )
    .unwrap();
}

pub fn s3cmd(home: &Path, args: &[&str]) -> Output {
    require_tool("s3cmd", "apt package s3cmd");
    clean_command("s3cmd", home).arg("-c").arg(home.join(".s3cfg")).args(args).output().expect("run s3cmd")
}
