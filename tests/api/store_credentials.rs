//! The object store's credentials (contract: "Blobs on S3-compatible object storage", docs/replicas.md "Store
//! credentials"): the AWS chain as the store's requests show it at a counting proxy (signed with which key id,
//! with which session token), no credentials refused at start, `anonymous` unsigned, and a refused key named in
//! one line without its secret.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::helpers::upstream::{CountingProxy, ProxiedRequest, S3Upstream};
use crate::helpers::*;

/// `blob_store.url` and `endpoint` for `bucket` behind `proxy`, with `extra` beside.
fn store_env(proxy: &CountingProxy, bucket: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    [("BLOBGATE_BLOB_STORE__URL", format!("s3://{bucket}/bg")), ("BLOBGATE_BLOB_STORE__ENDPOINT", proxy.endpoint())]
        .into_iter()
        .chain(extra.iter().map(|(k, v)| (*k, (*v).to_owned())))
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

fn refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// `blobgate put pub KEY` of `bytes` with `store`'s settings.
fn cli_put(env: &TestEnv, store: &[(String, String)], key: &str, bytes: &[u8]) -> std::process::Output {
    let path = write_file(env.dir.path(), &format!("upload-{}", rand_u64()), bytes);
    env.cli_env(&["put", "pub", key, path.to_str().unwrap()], &refs(store))
}

/// The requests that reached the store, each signed with `key_id` and carrying `token` as its session token.
fn assert_all_signed(requests: &[ProxiedRequest], key_id: &str, token: Option<&str>) {
    assert!(!requests.is_empty(), "nothing reached the store");
    for r in requests {
        let auth = r.authorization.as_deref().unwrap_or_else(|| panic!("unsigned: {r:?}"));
        assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=") && auth.contains(&format!("={key_id}/")), "{r:?}");
        assert_eq!(r.security_token.as_deref(), token, "{r:?}");
    }
}

#[test]
fn static_keys_with_a_session_token_sign_every_store_request_with_the_token() {
    let upstream = S3Upstream::moto();
    let (bucket, proxy) = (upstream.bucket("creds"), CountingProxy::start(upstream.addr()));
    let env = TestEnv::new();
    env.bucket("pub", true);
    let bytes = test_bytes(100_000, 1);
    // From the environment, as temporary credentials come (moto accepts any key).
    let from_env = store_env(
        &proxy,
        &bucket,
        &[
            ("AWS_ACCESS_KEY_ID", "ASIAENVTEMPORARY"),
            ("AWS_SECRET_ACCESS_KEY", "env-secret"),
            ("AWS_SESSION_TOKEN", "env-session-token"),
        ],
    );
    let out = cli_put(&env, &from_env, "env.bin", &bytes);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_all_signed(&proxy.requests(), "ASIAENVTEMPORARY", Some("env-session-token"));
    // From the settings, which win over the environment.
    proxy.reset();
    let settings = [
        from_env.clone(),
        store_env(
            &proxy,
            &bucket,
            &[
                ("BLOBGATE_BLOB_STORE__ACCESS_KEY_ID", "ASIACONFTEMPORARY"),
                ("BLOBGATE_BLOB_STORE__SECRET_ACCESS_KEY", "conf-secret"),
                ("BLOBGATE_BLOB_STORE__SESSION_TOKEN", "conf-session-token"),
            ],
        ),
    ]
    .concat();
    let server = env.serve_with(&refs(&settings), &[]);
    assert_eq!(server.get("/pub/env.bin", &[]).body, bytes);
    assert_all_signed(&proxy.requests(), "ASIACONFTEMPORARY", Some("conf-session-token"));
}

/// A container credentials endpoint on a loopback port: serves `json` to requests whose `Authorization` is
/// `token`, 401 to others; returns its URL and the `Authorization` headers it saw.
fn credentials_endpoint(json: String, token: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/credentials", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut authorization = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("authorization")
                {
                    authorization = value.trim().to_owned();
                }
            }
            let ok = authorization == token;
            log.lock().unwrap().push(authorization);
            let (status, body) = if ok { ("200 OK", json.as_str()) } else { ("401 Unauthorized", "{}") };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, seen)
}

#[test]
fn container_credentials_sign_store_requests_with_the_key_and_token_they_serve() {
    let upstream = S3Upstream::moto();
    let (bucket, proxy) = (upstream.bucket("creds"), CountingProxy::start(upstream.addr()));
    let json = serde_json::json!({
        "AccessKeyId": "ASIACONTAINERKEY",
        "SecretAccessKey": "container-secret",
        "Token": "container-session-token",
        "Expiration": "2099-01-01T00:00:00Z",
    });
    let (url, seen) = credentials_endpoint(json.to_string(), "pod-identity-token");
    let env = TestEnv::new();
    let token_file = write_file(env.dir.path(), "pod-token", b"pod-identity-token");
    env.bucket("pub", true);
    let settings = store_env(
        &proxy,
        &bucket,
        &[
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", &url),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file.to_str().unwrap()),
        ],
    );
    let bytes = test_bytes(70_000, 2);
    let out = cli_put(&env, &settings, "o.bin", &bytes);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_all_signed(&proxy.requests(), "ASIACONTAINERKEY", Some("container-session-token"));
    assert_eq!(*seen.lock().unwrap(), ["pod-identity-token"], "asked once, with the token file's token");
    let server = env.serve_with(&refs(&settings), &[]);
    proxy.reset();
    assert_eq!(server.get("/pub/o.bin", &[]).body, bytes);
    assert_all_signed(&proxy.requests(), "ASIACONTAINERKEY", Some("container-session-token"));
}

#[test]
fn no_store_credentials_refuse_to_start_and_anonymous_sends_unsigned_requests() {
    let upstream = S3Upstream::moto();
    let (bucket, proxy) = (upstream.bucket("creds"), CountingProxy::start(upstream.addr()));
    let env = TestEnv::new();
    env.bucket("pub", true);
    let settings = store_env(&proxy, &bucket, &[]);
    let aws = [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ];
    let mut serve = env.serve_command("127.0.0.1:0", "127.0.0.1:0");
    serve.envs(settings.iter().map(|(k, v)| (k, v)));
    for name in aws {
        serve.env_remove(name);
    }
    let line = one_line_error(&run_until_exit(serve, Duration::from_secs(30)), &["serve"]);
    for names in
        ["blobgate: ", "no credentials", "blob_store.access_key_id", "AWS_ACCESS_KEY_ID", "blob_store.anonymous"]
    {
        assert!(line.contains(names), "{names}: {line}");
    }
    let path = write_file(env.dir.path(), "upload", b"bytes");
    let out = env.cli_env(&["put", "pub", "o", path.to_str().unwrap()], &refs(&settings));
    assert_eq!(one_line_error(&out, &["put"]), line, "a command that uses the store says the same");
    assert!(proxy.requests().is_empty(), "nothing was asked of the store");

    // A public bucket, as anonymous is for (moto refuses unsigned requests to a private one).
    let public = "s3.put_bucket_acl(Bucket=spec['bucket'], ACL='public-read-write')\nprint('null')";
    upstream.boto3(&upstream.endpoint(), public, serde_json::json!({ "bucket": bucket }));
    let anonymous = [settings, store_env(&proxy, &bucket, &[("BLOBGATE_BLOB_STORE__ANONYMOUS", "true")])].concat();
    let bytes = test_bytes(50_000, 3);
    let out = cli_put(&env, &anonymous, "o.bin", &bytes);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let server = env.serve_with(&refs(&anonymous), &[]);
    assert_eq!(server.get("/pub/o.bin", &[]).body, bytes);
    let requests = proxy.requests();
    assert!(requests.iter().any(|r| r.method == "PUT"), "{requests:?}");
    assert!(requests.iter().all(|r| r.authorization.is_none() && r.security_token.is_none()), "{requests:?}");
}

#[test]
fn a_key_the_store_refuses_is_named_in_one_line_without_its_secret() {
    // s3s-fs checks signatures against its one key.
    let upstream = S3Upstream::s3s_fs();
    let (bucket, proxy) = (upstream.bucket("creds"), CountingProxy::start(upstream.addr()));
    let env = TestEnv::new();
    env.bucket("pub", true);
    let secret = "not-the-secret-7d1f";
    for id in [upstream.access_key(), "AKIAUNKNOWNKEY"] {
        let settings = store_env(&proxy, &bucket, &[("AWS_ACCESS_KEY_ID", id), ("AWS_SECRET_ACCESS_KEY", secret)]);
        let out = cli_put(&env, &settings, "o.bin", b"refused");
        let line = one_line_error(&out, &["put"]);
        assert!(line.starts_with("blobgate: ") && line.contains("AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"), "{line}");
        assert!(line.contains("refused the credentials") && !line.contains(secret), "{line}");
    }
    // `blobs migrate` of a data dir's blobs, with the key in the settings.
    env.put_bytes("pub", "local.bin", b"in the data dir", &[]);
    let settings = [
        ("BLOBGATE_BLOB_STORE__ENDPOINT", proxy.endpoint()),
        ("BLOBGATE_BLOB_STORE__ACCESS_KEY_ID", upstream.access_key().to_owned()),
        ("BLOBGATE_BLOB_STORE__SECRET_ACCESS_KEY", secret.to_owned()),
    ]
    .map(|(k, v)| (k.to_owned(), v));
    let out = env.cli_env(&["blobs", "migrate", "--to", &format!("s3://{bucket}/bg")], &refs(&settings));
    let line = one_line_error(&out, &["blobs", "migrate"]);
    assert!(
        line.contains("blob_store.access_key_id / blob_store.secret_access_key") && !line.contains(secret),
        "{line}"
    );

    // A server's refused upload: 503, and the log names the settings.
    let settings =
        [settings.to_vec(), vec![("BLOBGATE_BLOB_STORE__URL".to_owned(), format!("s3://{bucket}/bg"))]].concat();
    let token = env.ok(&["token", "create", "--bucket", "pub", "--scope", "write"]).trim().to_owned();
    let server = env.serve_with(&refs(&settings), &[]);
    let response = server.put("/pub/up.bin", &token, b"refused upload", &[]);
    assert_eq!(response.status, 503, "{}", String::from_utf8_lossy(&response.body));
    assert!(!String::from_utf8_lossy(&response.body).contains(secret));
    assert!(
        wait_for(Duration::from_secs(5), || server
            .log()
            .contains("blob_store.access_key_id / blob_store.secret_access_key")),
        "{}",
        server.log()
    );
    assert!(!server.log().contains(secret), "{}", server.log());

    // Readiness fails, and the load balancer takes the replica out.
    let ready = server.admin("GET", "/readyz", &[], b"");
    assert_json_error(&ready, 503, "blob_store_unavailable");
    assert!(!String::from_utf8_lossy(&ready.body).contains(secret));

    // A refused fetch: an object stored with the right key, read by the server with the wrong one.
    let right = store_env(
        &proxy,
        &bucket,
        &[("AWS_ACCESS_KEY_ID", upstream.access_key()), ("AWS_SECRET_ACCESS_KEY", upstream.secret_key())],
    );
    let out = cli_put(&env, &right, "stored.bin", b"stored with the right key");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let named = |log: &str| log.matches("refused the credentials of blob_store.access_key_id").count();
    let before = named(&server.log());
    let response = server.get("/pub/stored.bin", &[]);
    assert_eq!(response.status, 503, "{}", String::from_utf8_lossy(&response.body));
    assert!(wait_for(Duration::from_secs(5), || named(&server.log()) > before), "{}", server.log());
    assert!(!server.log().contains(secret), "{}", server.log());
}

/// An STS endpoint over HTTPS (python3's http.server with `cert`/`key`) answering every
/// AssumeRoleWithWebIdentity with `ASIAWEBIDENTITY` / `web-identity-session-token`; each request's query goes to
/// `log` as a JSON line.
const STS: &str = r#"
import http.server, json, ssl, sys, urllib.parse
cert, key, log = sys.argv[1:4]
ANSWER = """<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIAWEBIDENTITY</AccessKeyId>
<SecretAccessKey>web-identity-secret</SecretAccessKey><SessionToken>web-identity-session-token</SessionToken>
<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleWithWebIdentityResult>
</AssumeRoleWithWebIdentityResponse>""".encode()
class Sts(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        with open(log, "a") as f:
            f.write(json.dumps({k: v[0] for k, v in query.items()}) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Sts)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// Kills a child process when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_web_identity_token_is_exchanged_at_sts_and_its_credentials_sign_store_requests() {
    use crate::helpers::pki::{EC, TestPki};
    require_tool("python3", "apt package python3");
    let pki = TestPki::with_ca("ca");
    pki.server("sts", EC, "DNS:localhost,IP:127.0.0.1", "ca");
    let log = pki.file("sts.log");
    let mut sts = std::process::Command::new("python3")
        .args(["-c", STS, &pki.path("sts.crt"), &pki.path("sts.key"), log.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start python3");
    let mut port = String::new();
    BufReader::new(sts.stdout.take().unwrap()).read_line(&mut port).unwrap();
    let _sts = KillOnDrop(sts);
    let sts_endpoint = format!("https://127.0.0.1:{}", port.trim());

    let upstream = S3Upstream::moto();
    let (bucket, proxy) = (upstream.bucket("creds"), CountingProxy::start(upstream.addr()));
    let env = TestEnv::new();
    let token_file = write_file(env.dir.path(), "irsa-token", b"the-service-account-jwt");
    env.bucket("pub", true);
    let settings = store_env(
        &proxy,
        &bucket,
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file.to_str().unwrap()),
            ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/blobgate"),
            ("AWS_ROLE_SESSION_NAME", "blobgate-test"),
            ("AWS_ENDPOINT_URL_STS", &sts_endpoint),
            // The STS endpoint's certificate is the test CA's: trusted as the store's would be.
            ("BLOBGATE_BLOB_STORE__CA_BUNDLE", &pki.path("ca.crt")),
        ],
    );
    let bytes = test_bytes(60_000, 4);
    let out = cli_put(&env, &settings, "o.bin", &bytes);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_all_signed(&proxy.requests(), "ASIAWEBIDENTITY", Some("web-identity-session-token"));
    let asked: Vec<serde_json::Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["Action"], "AssumeRoleWithWebIdentity");
    assert_eq!(asked[0]["RoleArn"], "arn:aws:iam::123456789012:role/blobgate");
    assert_eq!(asked[0]["RoleSessionName"], "blobgate-test");
    assert_eq!(asked[0]["WebIdentityToken"], "the-service-account-jwt");
    let server = env.serve_with(&refs(&settings), &[]);
    proxy.reset();
    assert_eq!(server.get("/pub/o.bin", &[]).body, bytes);
    assert_all_signed(&proxy.requests(), "ASIAWEBIDENTITY", Some("web-identity-session-token"));
}
