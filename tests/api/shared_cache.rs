//! A real shared cache in front: nginx with `proxy_cache`. A private bucket's responses must never be stored
//! there (RFC 9111 §3.5), or a request without credentials, or with revoked ones, gets the bytes from the cache;
//! nor can a presigned `response-cache-control` make them storable.

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::helpers::s3::{Signing, presigned_path, s3_key};
use crate::helpers::*;

/// nginx as a caching reverse proxy for `upstream`, in the foreground, with everything under a temp dir.
pub struct CachingProxy {
    child: Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl CachingProxy {
    pub fn start(upstream: SocketAddr) -> Self {
        let nginx = system_binary("nginx", "nginx");
        let dir = tempfile::tempdir().unwrap();
        // nginx refuses port 0: a port no bind to port 0 can take before nginx binds it.
        let addr = reserved_local_addr();
        let d = dir.path().display();
        // One process, running as us (no worker switching to `nobody`, who could not write the temp dir).
        let conf = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\nevents {{}}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             proxy_cache_path {d}/cache keys_zone=blobs:1m;\n  server {{\n    listen {addr};\n\
             location / {{\n      proxy_pass http://{upstream};\n      proxy_http_version 1.1;\n\
             proxy_cache blobs;\n      add_header X-Cache-Status $upstream_cache_status always;\n    }}\n  }}\n}}\n"
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        let mut child = Command::new(&nginx)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .args(["-e", "stderr"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let up = wait_for(Duration::from_secs(30), || TcpStream::connect(addr).is_ok());
        if !up {
            let _ = child.kill();
            let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
            panic!("nginx did not start on {addr}:\n{log}");
        }
        Self { child, addr, _dir: dir }
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut conn = Conn::open(self.addr);
        conn.send(&raw_request("GET", path, headers, true));
        conn.read_response(false).expect("a response from nginx")
    }
}

impl Drop for CachingProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_shared_cache_never_serves_a_private_object_to_a_request_without_valid_credentials() {
    let env = TestEnv::new();
    let bytes = test_bytes(200_000, 41);
    // The walkthrough in docs/cdn-origin.md: a private object stored with a long-lived public Cache-Control.
    let cache_control = "public, max-age=31536000, immutable";
    env.bucket("releases", false);
    env.bucket("assets", true);
    env.put_bytes("releases", "v1/app.tar.gz", &bytes, &["--cache-control", cache_control]);
    env.put_bytes("assets", "app.js", &bytes, &["--cache-control", cache_control]);
    let token = env.token("releases", "read", &[]);
    let server = env.serve();
    let proxy = CachingProxy::start(server.data);
    let auth = format!("Bearer {token}");

    // The cache works: a public bucket's object is stored and the second request is a hit.
    let first = proxy.get("/assets/app.js", &[]);
    assert_eq!((first.status, first.header("cache-control")), (200, Some(cache_control)));
    let second = proxy.get("/assets/app.js", &[]);
    assert_eq!((second.status, second.header("x-cache-status")), (200, Some("HIT")), "{second:?}");
    assert!(second.body == bytes);

    // A token download through the cache: the bytes, marked private (browsers may still keep them a year).
    let r = proxy.get("/releases/v1/app.tar.gz", &[("Authorization", &auth)]);
    assert_eq!(r.status, 200);
    assert!(r.body == bytes);
    assert_eq!(r.header("cache-control"), Some("private, max-age=31536000, immutable"));
    // Then no token: 401 from blobgate, never the cached bytes.
    let r = proxy.get("/releases/v1/app.tar.gz", &[]);
    assert_eq!(r.status, 401, "served from the cache without credentials: {:?}", r.header("x-cache-status"));
    assert!(r.body.len() < 1000);
    // A revoked token does not keep working through the cache either.
    env.ok(&["token", "revoke", &token]);
    let r = proxy.get("/releases/v1/app.tar.gz", &[("Authorization", &auth)]);
    assert_eq!(r.status, 401, "a revoked token still got {:?} from the cache", r.header("x-cache-status"));

    // A presigned URL's response is private too: once the URL is revoked, the cache has nothing to replay.
    let url = env.ok(&["presign", "releases", "v1/app.tar.gz", "--base-url", &format!("http://{}", proxy.addr)]);
    let path = path_of_url(url.trim()).to_owned();
    let r = proxy.get(&path, &[]);
    assert_eq!((r.status, r.header("cache-control")), (200, Some("private, max-age=31536000, immutable")));
    env.ok(&["signing", "revoke-url", url.trim()]);
    let r = proxy.get(&path, &[]);
    assert_eq!(r.status, 401, "a revoked signed URL was served {:?} by the cache", r.header("x-cache-status"));
}

#[test]
fn put_warns_in_one_line_when_a_private_object_asks_for_shared_caching() {
    let env = TestEnv::new();
    env.bucket("releases", false);
    env.bucket("assets", true);
    let file = write_file(env.dir.path(), "f.bin", b"bytes");
    let file = file.to_str().unwrap();
    let put =
        |bucket: &str, cache_control: &str| env.cli(&["put", bucket, "k", file, "--cache-control", cache_control]);
    let out = put("releases", "public, max-age=31536000, immutable");
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("blobgate: warning: bucket releases is private"), "{stderr}");
    assert!(stderr.contains("Cache-Control: private, max-age=31536000, immutable"), "{stderr}");
    // The object is stored all the same, with the value as given (the rule applies when serving).
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["key"], "k");
    for (bucket, cache_control) in
        [("releases", "max-age=60"), ("releases", "s-maxage=60"), ("assets", "public, max-age=60")]
    {
        let out = put(bucket, cache_control);
        assert!(out.status.success());
        let warned = !out.stderr.is_empty();
        assert_eq!(warned, bucket == "releases" && cache_control.starts_with("s-maxage"), "{bucket} {cache_control}");
    }
}

/// The presigned override keeps `private` on a private bucket (and drops what would let a shared cache store the
/// answer), as stored values are; a public bucket's presigned override applies as given.
#[test]
fn a_presigned_cache_control_cannot_make_a_private_answer_shareable() {
    let env = TestEnv::new();
    env.bucket("vault", false);
    env.bucket("open", true);
    env.put_bytes("vault", "report.pdf", b"%PDF-1.7 quarterly", &[]);
    env.put_bytes("open", "app.css", b"body{}", &[]);
    let vault_key = s3_key(&env, "vault", &[]);
    let open_key = s3_key(&env, "open", &[]);
    let server = env.serve();
    let presigned = |key, path: &str| presigned_path(key, path, &Signing { expires: Some(600), ..Default::default() });
    for (asked, answered) in [
        ("public%2C%20s-maxage%3D86400", "private"),
        ("max-age%3D60%2C%20public", "private, max-age=60"),
        ("no-store", "private, no-store"),
        ("private%2C%20max-age%3D5", "private, max-age=5"),
    ] {
        let url = presigned(&vault_key, &format!("/vault/report.pdf?response-cache-control={asked}"));
        let r = server.get(&url, &[]);
        assert_eq!((r.status, r.header("cache-control")), (200, Some(answered)), "{asked}");
    }
    let url = presigned(&open_key, "/open/app.css?response-cache-control=public%2C%20s-maxage%3D86400");
    let r = server.get(&url, &[]);
    assert_eq!((r.status, r.header("cache-control")), (200, Some("public, s-maxage=86400")), "a public bucket's");
}
