//! Behind a real cache: Varnish with its built-in VCL in front of the data listener. What blobgate's stats count is
//! what reached the origin, so "one download" means the cache answered the rest.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use crate::helpers::*;

/// The VCL docs/cdn-origin.md shows: blobgate as the backend, multi-range requests piped to it, `Accept-Encoding`
/// normalised so brotli variants are kept (with `http_gzip_support=off`), and an `X-Cache` header saying whether
/// the answer was a hit. Everything else is Varnish's built-in VCL (it passes requests with
/// `Authorization` and does not store responses marked `private`, `no-store` or `no-cache`).
pub fn vcl(backend: SocketAddr) -> String {
    let (host, port) = (backend.ip(), backend.port());
    format!(
        r#"vcl 4.1;

backend blobgate {{
    .host = "{host}";
    .port = "{port}";
}}

sub vcl_recv {{
    # Varnish answers several ranges with 416, and fails a pass of them ("Invalid range header"): pipe them to
    # blobgate, which answers 206 multipart/byteranges.
    if (req.http.Range ~ ",") {{
        return (pipe);
    }}
    # Keep brotli: with http_gzip_support off, Accept-Encoding reaches blobgate as the client sent it; normalised
    # to the codings blobgate stores, so the cache keeps at most one copy per coding (it keys on Vary).
    if (req.http.Accept-Encoding ~ "\bbr\b") {{
        set req.http.Accept-Encoding = "br";
    }} elsif (req.http.Accept-Encoding ~ "\bgzip\b") {{
        set req.http.Accept-Encoding = "gzip";
    }} else {{
        unset req.http.Accept-Encoding;
    }}
}}

sub vcl_deliver {{
    if (obj.hits > 0) {{
        set resp.http.X-Cache = "HIT";
    }} else {{
        set resp.http.X-Cache = "MISS";
    }}
}}
"#
    )
}

/// A throw-away `varnishd` in the foreground, its working dir and VCL in a temp dir; killed on drop.
pub struct Varnish {
    child: Child,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Varnish {
    /// With docs/cdn-origin.md's VCL and parameters.
    pub fn start(backend: SocketAddr) -> Self {
        Self::start_with(&vcl(backend), &["http_gzip_support=off"])
    }

    /// Varnish with another VCL and more `-p` parameters (`name=value`).
    pub fn start_with(vcl: &str, params: &[&str]) -> Self {
        let varnishd = system_binary("varnishd", "varnish");
        let dir = tempfile::tempdir().unwrap();
        let vcl_file = dir.path().join("blobgate.vcl");
        std::fs::write(&vcl_file, vcl).unwrap();
        let log = std::fs::File::create(dir.path().join("varnishd.log")).unwrap();
        let child = Command::new(&varnishd)
            .arg("-F")
            .arg("-n")
            .arg(dir.path().join("work"))
            // No privilege separation: as root it would switch to the `varnish` user, who cannot read the temp dir.
            // Port 0: the manager binds it, and its listening socket says which port it got.
            // No management port (`-T none`), so the one listening socket is the HTTP one.
            .args(["-j", "none", "-T", "none", "-a", "127.0.0.1:0", "-s", "malloc,32m", "-f"])
            .arg(&vcl_file)
            // No grace, so an expired object is revalidated before the answer (not served stale meanwhile), and
            // a minute of keep, so Varnish revalidates it with If-None-Match instead of fetching it again.
            .args(["-p", "default_grace=0s", "-p", "default_keep=60s"])
            .args(params.iter().flat_map(|p| ["-p", p]))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start varnishd");
        let unbound = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut varnish = Self { child, addr: unbound, dir };
        // The manager listens first, then starts the worker process: wait for an answer (any status; `/` names
        // no object).
        let up = wait_for(Duration::from_secs(30), || {
            if varnish.addr == unbound {
                varnish.addr = listening_addrs(varnish.child.id()).first().copied().unwrap_or(unbound);
            }
            varnish.child.try_wait().unwrap().is_none()
                && varnish.addr != unbound
                && TcpStream::connect(varnish.addr).is_ok()
                && varnish.get("/", &[]).status > 0
        });
        if !up {
            let _ = varnish.child.kill();
            panic!("varnishd did not start on {}:\n{}", varnish.addr, varnish.log());
        }
        varnish
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("varnishd.log")).unwrap_or_default()
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut conn = Conn::open(self.addr);
        conn.send(&raw_request("GET", path, headers, true));
        let response = conn.read_response(false).expect("a response from varnish");
        assert_eq!(response.header("transfer-encoding"), None, "the test client reads Content-Length bodies only");
        response
    }
}

impl Drop for Varnish {
    fn drop(&mut self) {
        // SIGTERM: the manager stops its worker process before it exits (killed, it leaves the worker to notice).
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        if !wait_for(Duration::from_secs(10), || self.child.try_wait().is_ok_and(|s| s.is_some())) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Stops Varnish, then the server (which writes the stats it holds on shutdown), and returns each object's stats
/// row by `bucket/key`: exactly what reached the origin.
fn origin_stats(env: &TestEnv, varnish: Varnish, mut server: Server) -> std::collections::HashMap<String, Row> {
    drop(varnish);
    assert_eq!(server.stop(), Some(0), "{}", server.log());
    let rows: serde_json::Value = serde_json::from_str(env.ok(&["stats", "--json"]).trim()).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let n = |field: &str| r[field].as_u64().unwrap_or_else(|| panic!("{field} in {r}"));
            let row = Row {
                requests: n("requests"),
                completed: n("completed"),
                range_requests: n("range_requests"),
                not_modified: n("not_modified"),
            };
            (format!("{}/{}", r["bucket"].as_str().unwrap(), r["key"].as_str().unwrap()), row)
        })
        .collect()
}

#[derive(Debug, PartialEq, Eq)]
struct Row {
    requests: u64,
    completed: u64,
    range_requests: u64,
    not_modified: u64,
}

fn downloads(n: u64) -> Row {
    Row { requests: n, completed: n, range_requests: 0, not_modified: 0 }
}

fn put_file(env: &TestEnv, dir: &Path, bucket: &str, key: &str, bytes: &[u8], cache_control: Option<&str>) {
    let file = write_file(dir, &format!("{bucket}-{}", key.replace('/', "-")), bytes);
    let mut args = vec!["put", bucket, key, file.to_str().unwrap()];
    if let Some(v) = cache_control {
        args.extend(["--cache-control", v]);
    }
    env.ok(&args);
}

#[test]
fn a_public_object_fetched_twice_through_varnish_is_downloaded_once() {
    let env = TestEnv::new();
    let bytes = test_bytes(300_000, 61);
    env.bucket("assets", true);
    put_file(&env, env.dir.path(), "assets", "app.js", &bytes, Some("max-age=60"));
    let server = env.serve();
    let varnish = Varnish::start(server.data);

    let first = varnish.get("/assets/app.js", &[]);
    assert_eq!((first.status, first.header("x-cache")), (200, Some("MISS")), "{:?}", first.headers);
    assert_eq!(first.header("cache-control"), Some("max-age=60"));
    assert!(first.body == bytes);
    let second = varnish.get("/assets/app.js", &[]);
    assert_eq!((second.status, second.header("x-cache")), (200, Some("HIT")), "{:?}", second.headers);
    assert!(second.body == bytes);
    assert_eq!(second.header("etag"), first.header("etag"));

    let stats = origin_stats(&env, varnish, server);
    assert_eq!(stats["assets/app.js"], downloads(1), "the second GET reached the origin");
}

#[test]
fn revalidation_through_varnish_gives_304_from_the_cache_and_from_the_origin() {
    let env = TestEnv::new();
    let bytes = test_bytes(100_000, 62);
    env.bucket("assets", true);
    put_file(&env, env.dir.path(), "assets", "fresh.css", &bytes, Some("max-age=60"));
    put_file(&env, env.dir.path(), "assets", "short.css", &bytes, Some("max-age=1"));
    let server = env.serve();
    let varnish = Varnish::start(server.data);

    // A client's If-None-Match: Varnish answers 304 from the stored object (blobgate's ETag).
    let first = varnish.get("/assets/fresh.css", &[]);
    let etag = first.header("etag").expect("an ETag from blobgate").to_owned();
    let r = varnish.get("/assets/fresh.css", &[("If-None-Match", &etag)]);
    assert_eq!((r.status, r.header("x-cache")), (304, Some("HIT")), "{:?}", r.headers);
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert!(r.body.is_empty());
    let r = varnish.get("/assets/fresh.css", &[("If-None-Match", "\"another\"")]);
    assert_eq!(r.status, 200);
    assert!(r.body == bytes);

    // Varnish's own revalidation: once short.css has expired, it asks blobgate with If-None-Match, gets 304 and
    // serves the bytes it kept. Asked until that 304 reaches blobgate's metrics (the answers before it are
    // Varnish's fresh copy; max-age=1 is the shortest the origin can give, and the 30 s bound a hang).
    assert!(varnish.get("/assets/short.css", &[]).body == bytes);
    let not_modified = || -> f64 {
        let metrics = server.metrics();
        let series = metrics.lines().filter(|l| l.starts_with("blobgate_responses_total{class=\"3xx\""));
        series.map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap()).sum()
    };
    assert_eq!(not_modified(), 0.0, "the client's If-None-Match was answered by Varnish");
    let revalidated = wait_for(Duration::from_secs(30), || {
        if not_modified() > 0.0 {
            return true;
        }
        let r = varnish.get("/assets/short.css", &[]);
        assert_eq!((r.status, r.header("cache-control")), (200, Some("max-age=1")));
        assert!(r.body == bytes);
        false
    });
    assert!(revalidated, "Varnish never revalidated short.css with blobgate");

    let stats = origin_stats(&env, varnish, server);
    assert_eq!(stats["assets/fresh.css"], downloads(1));
    // One download, then one 304 (the stats count 304s apart from downloads).
    let short = Row { requests: 1, completed: 1, range_requests: 0, not_modified: 1 };
    assert_eq!(stats["assets/short.css"], short, "Varnish did not revalidate with If-None-Match");
}

#[test]
fn a_range_through_varnish_is_byte_exact() {
    let env = TestEnv::new();
    let size = 1_000_000;
    let bytes = test_bytes(size, 63);
    env.bucket("media", true);
    put_file(&env, env.dir.path(), "media", "clip.webm", &bytes, Some("max-age=60"));
    let server = env.serve();
    let varnish = Varnish::start(server.data);

    // The first (a miss) and the others (hits): Varnish fetches the whole object and slices it.
    for (range, start, end) in [
        ("bytes=1000-1999", 1000, 1999),
        ("bytes=123456-654320", 123_456, 654_320),
        ("bytes=-100", size - 100, size - 1),
        ("bytes=999990-", size - 10, size - 1),
        ("bytes=0-0", 0, 0),
    ] {
        let r = varnish.get("/media/clip.webm", &[("Range", range)]);
        assert_eq!(r.status, 206, "{range}: {:?}", r.headers);
        assert_eq!(r.header("content-range"), Some(format!("bytes {start}-{end}/{size}").as_str()), "{range}");
        assert!(r.body == bytes[start..=end], "{range}: {} bytes, not the object's", r.body.len());
    }
    // Several ranges are piped to blobgate (the VCL; a piped answer has no X-Cache), which answers
    // multipart/byteranges.
    let multi = varnish.get("/media/clip.webm", &[("Range", "bytes=0-9,100-109")]);
    assert_eq!((multi.status, multi.header("x-cache")), (206, None), "{:?}", multi.headers);
    let parts = parse_multipart(&multi);
    assert_eq!(parts.len(), 2);
    assert!(parts[0].body == bytes[0..10] && parts[1].body == bytes[100..110]);
    let whole = varnish.get("/media/clip.webm", &[]);
    assert_eq!((whole.status, whole.header("x-cache")), (200, Some("HIT")));
    assert!(whole.body == bytes);

    let stats = origin_stats(&env, varnish, server);
    // Varnish fetched the whole object once; the multipart request was blobgate's.
    let clip = Row { requests: 2, completed: 2, range_requests: 1, not_modified: 0 };
    assert_eq!(stats["media/clip.webm"], clip);
}

#[test]
fn varnish_never_serves_a_private_object_to_a_request_without_credentials() {
    let env = TestEnv::new();
    let bytes = test_bytes(200_000, 64);
    env.bucket("releases", false);
    // Stored asking for shared caching: a private bucket's responses say `private` all the same.
    put_file(&env, env.dir.path(), "releases", "v1/app.tar.gz", &bytes, Some("public, max-age=31536000, immutable"));
    let token = env.token("releases", "read", &[]);
    let server = env.serve();
    let varnish = Varnish::start(server.data);
    let auth = format!("Bearer {token}");
    let path = "/releases/v1/app.tar.gz";

    for _ in 0..2 {
        let r = varnish.get(path, &[("Authorization", &auth)]);
        assert_eq!((r.status, r.header("x-cache")), (200, Some("MISS")), "{:?}", r.headers);
        assert_eq!(r.header("cache-control"), Some("private, max-age=31536000, immutable"));
        assert!(r.body == bytes);
    }
    let r = varnish.get(path, &[]);
    assert_eq!(r.status, 401, "served without credentials: {:?}", r.headers);
    assert!(r.body.len() < 1000);

    // A signed URL has no Authorization header, so Varnish looks it up: `private` keeps it out of the cache,
    // and once the URL is revoked there is nothing to replay.
    let url = env.ok(&["presign", "releases", "v1/app.tar.gz", "--base-url", &format!("http://{}", varnish.addr)]);
    let signed = path_of_url(url.trim()).to_owned();
    for _ in 0..2 {
        let r = varnish.get(&signed, &[]);
        assert_eq!((r.status, r.header("x-cache")), (200, Some("MISS")), "{:?}", r.headers);
        assert_eq!(r.header("cache-control"), Some("private, max-age=31536000, immutable"));
        assert!(r.body == bytes);
    }
    env.ok(&["signing", "revoke-url", url.trim()]);
    let r = varnish.get(&signed, &[]);
    assert_eq!(r.status, 401, "a revoked signed URL was served: {:?}", r.headers);

    let stats = origin_stats(&env, varnish, server);
    assert_eq!(stats["releases/v1/app.tar.gz"], downloads(4), "every authorised GET reached the origin");
}

#[test]
fn varnish_sees_the_bucket_default_cache_control_for_objects_stored_without_one() {
    let env = TestEnv::new();
    let bytes = test_bytes(50_000, 65);
    env.bucket("live", true);
    env.bucket("plain", true);
    env.ok(&["bucket", "set", "live", "--cache-control", "no-store"]);
    put_file(&env, env.dir.path(), "live", "feed.json", &bytes, None);
    put_file(&env, env.dir.path(), "live", "pinned.json", &bytes, Some("max-age=60"));
    put_file(&env, env.dir.path(), "plain", "note.txt", &bytes, None);
    // docs/cdn-origin.md's content-hashed assets: the bucket default says immutable, the entry point says no-cache.
    env.bucket("static", true);
    env.ok(&["bucket", "set", "static", "--cache-control", "public, max-age=31536000, immutable"]);
    let dist = env.dir.path().join("dist");
    std::fs::create_dir_all(dist.join("assets")).unwrap();
    write_file(&dist.join("assets"), "app.3f9a1c.js", &bytes);
    env.ok(&["import", "static", dist.join("assets").to_str().unwrap(), "--prefix", "assets/"]);
    put_file(&env, &dist, "static", "index.html", &bytes, Some("no-cache"));
    let server = env.serve();
    let varnish = Varnish::start(server.data);

    for (path, cache_control, second) in [
        ("/static/assets/app.3f9a1c.js", Some("public, max-age=31536000, immutable"), "HIT"),
        ("/static/index.html", Some("no-cache"), "MISS"),
        ("/live/feed.json", Some("no-store"), "MISS"),
        // The object's own value beats the bucket's.
        ("/live/pinned.json", Some("max-age=60"), "HIT"),
        // Neither: Varnish stores it for its default_ttl (2 minutes), which is why feed.json needed its default.
        ("/plain/note.txt", None, "HIT"),
    ] {
        let first = varnish.get(path, &[]);
        assert_eq!((first.status, first.header("cache-control")), (200, cache_control), "{path}");
        let r = varnish.get(path, &[]);
        assert_eq!((r.status, r.header("x-cache")), (200, Some(second)), "{path}: {:?}", r.headers);
        assert!(r.body == bytes);
    }

    // The no-cache entry point is fetched whole every time: Varnish keeps a client's If-None-Match to itself on
    // a miss, and answers it (304) from what it fetched.
    let etag = varnish.get("/static/index.html", &[]).header("etag").unwrap().to_owned();
    let r = varnish.get("/static/index.html", &[("If-None-Match", &etag)]);
    assert_eq!((r.status, r.header("x-cache")), (304, Some("MISS")), "{:?}", r.headers);

    let stats = origin_stats(&env, varnish, server);
    assert_eq!(stats["static/assets/app.3f9a1c.js"], downloads(1));
    assert_eq!(stats["static/index.html"], downloads(4));
    assert_eq!(stats["live/feed.json"], downloads(2));
    assert_eq!(stats["live/pinned.json"], downloads(1));
    assert_eq!(stats["plain/note.txt"], downloads(1));
}
