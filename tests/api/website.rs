//! Static-site origins (`bucket set --index-document/--error-document`), over the wire: a directory path serves
//! its index document through the ordinary pipeline (preconditions, ranges, CORS), a missing key the error
//! document with 404, a directory named without its `/` a 302 to it, each only after the request's own
//! authorisation, so a caller who may not read the bucket learns nothing. Signed S3 requests keep S3's REST
//! semantics (boto3). The sendfile proof is in `syscalls.rs`.

use crate::helpers::*;

const INDEX: &[u8] = b"<!doctype html><title>home</title>";
const CSS_INDEX: &[u8] = b"<!doctype html><title>css</title>";
const DOCS_INDEX: &[u8] = b"<!doctype html><title>docs</title>";
const NOT_FOUND: &[u8] = b"<!doctype html><title>not here</title>";
const APP: &str = "https://app.example";

/// A bucket holding a small site; the error document's own Cache-Control is a year, which its 404 must not carry.
fn site(env: &TestEnv, name: &str, public: bool) {
    env.bucket(name, public);
    env.put_bytes(name, "index.html", INDEX, &[]);
    env.put_bytes(name, "css/index.html", CSS_INDEX, &[]);
    env.put_bytes(name, "css/site.css", b"body { color: rgb(1, 2, 3) }", &[]);
    env.put_bytes(name, "docs/index.html", DOCS_INDEX, &[]);
    env.put_bytes(name, "404.html", NOT_FOUND, &["--cache-control", "public, max-age=31536000, immutable"]);
}

fn website(env: &TestEnv, name: &str) -> serde_json::Value {
    let out = env.ok(&["bucket", "set", name, "--index-document", "index.html", "--error-document", "404.html"]);
    serde_json::from_str(out.trim()).expect("bucket set prints the bucket")
}

/// The bucket's line of `bucket list`.
fn listed(env: &TestEnv, name: &str) -> serde_json::Value {
    let out = env.ok(&["bucket", "list"]);
    out.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).find(|b| b["bucket"] == name).unwrap()
}

fn body(r: &Response) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// The error document's answer: its bytes and type with 404, no validators, and a Cache-Control of its own.
fn assert_error_document(r: &Response, cache_control: &str) {
    assert_eq!((r.status, body(r)), (404, String::from_utf8_lossy(NOT_FOUND).into_owned()), "{r:?}");
    assert!(r.header("content-type").is_some_and(|t| t.starts_with("text/html")), "{r:?}");
    assert_eq!(r.header("content-length"), Some(NOT_FOUND.len().to_string().as_str()));
    assert_eq!(r.header("cache-control"), Some(cache_control), "never the document's own year: {r:?}");
    for absent in ["etag", "last-modified", "accept-ranges", "content-range", "repr-digest"] {
        assert_eq!(r.header(absent), None, "{absent}: {r:?}");
    }
}

#[test]
fn a_directory_path_serves_its_index_document_through_the_whole_pipeline() {
    let env = TestEnv::new();
    site(&env, "static", true);
    website(&env, "static");
    let server = env.serve();

    let home = server.get("/static/", &[]);
    assert_eq!((home.status, body(&home)), (200, String::from_utf8_lossy(INDEX).into_owned()));
    assert!(home.header("content-type").is_some_and(|t| t.starts_with("text/html")), "{home:?}");
    let direct = server.get("/static/index.html", &[]);
    assert_eq!(home.header("etag"), direct.header("etag"), "the index document's own ETag");
    let css = server.get("/static/css/", &[]);
    assert_eq!((css.status, css.body.as_slice()), (200, CSS_INDEX));

    let head = server.request("HEAD", "/static/css/", &[]);
    assert_eq!((head.status, head.body.len()), (200, 0));
    assert_eq!(head.header("content-length"), Some(CSS_INDEX.len().to_string().as_str()));
    let etag = home.header("etag").unwrap();
    assert_eq!(server.get("/static/", &[("If-None-Match", etag)]).status, 304);
    let range = server.get("/static/", &[("Range", "bytes=0-8")]);
    assert_eq!((range.status, range.body.as_slice()), (206, &INDEX[..9]));
    assert_eq!(range.header("content-range"), Some(format!("bytes 0-8/{}", INDEX.len()).as_str()));
    // Plain keys are untouched.
    assert_eq!(server.get("/static/css/site.css", &[]).status, 200);
}

#[test]
fn a_missing_key_gets_the_error_document_with_404_and_no_validators() {
    let env = TestEnv::new();
    site(&env, "static", true);
    site(&env, "closed", false);
    website(&env, "static");
    website(&env, "closed");
    let read = env.token("closed", "read", &[]);
    let mut server = env.serve();

    for path in ["/static/missing.png", "/static/empty/", "/static/css/missing/"] {
        assert_error_document(&server.get(path, &[]), "no-cache");
    }
    // No ranges and no 304 for a 404: the same whole body.
    assert_error_document(&server.get("/static/missing.png", &[("Range", "bytes=0-3")]), "no-cache");
    assert_error_document(&server.get("/static/missing.png", &[("If-None-Match", "*")]), "no-cache");
    let head = server.request("HEAD", "/static/missing.png", &[]);
    assert_eq!((head.status, head.body.len()), (404, 0));
    assert_eq!(head.header("content-length"), Some(NOT_FOUND.len().to_string().as_str()));
    // A private bucket's 404 is for its requester only, like its 200s.
    assert_error_document(&server.get_auth("/closed/missing.png", &read, &[]), "private, no-cache");
    assert_eq!(server.get("/static/404.html", &[]).status, 200, "the document itself is an ordinary object");

    // Its bytes behind a 404 are no download of it: only the direct GET above counts.
    assert_eq!(server.stop(), Some(0));
    let stats: serde_json::Value = serde_json::from_str(env.ok(&["stats", "--json"]).trim()).unwrap();
    let requests = |bucket: &str| {
        let rows = stats.as_array().unwrap().iter();
        rows.filter(|r| r["bucket"] == bucket && r["key"] == "404.html")
            .map(|r| r["requests"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!((requests("static"), requests("closed")), (1, 0), "{stats}");
}

#[test]
fn without_an_index_document_a_bucket_root_is_404_not_400() {
    let env = TestEnv::new();
    site(&env, "plain", true);
    let server = env.serve();
    for path in ["/plain/", "/plain", "/plain/css/", "/plain/docs"] {
        assert_json_error(&server.get(path, &[]), 404, "not_found");
        assert_eq!(server.request("HEAD", path, &[]).status, 404, "{path}");
    }
    // A folder object `dir/` is still served as the key it is.
    env.put_bytes("plain", "folder/", b"", &[]);
    assert_eq!(server.get("/plain/folder/", &[]).status, 200);
    let listed = listed(&env, "plain");
    assert_eq!(
        (&listed["index_document"], &listed["error_document"]),
        (&serde_json::Value::Null, &serde_json::Value::Null)
    );
}

/// Each `bucket set` reaches the running server at its next request (SQLite's change feed; PostgreSQL's is in the
/// catalog's tests), `""` turns a document off, and `bucket list` shows both.
#[test]
fn a_running_server_applies_each_change_at_its_next_request() {
    let env = TestEnv::new();
    site(&env, "static", true);
    let server = env.serve();
    assert_json_error(&server.get("/static/", &[]), 404, "not_found");

    let set = env.ok(&["bucket", "set", "static", "--index-document", "index.html"]);
    assert!(set.contains(r#""index_document":"index.html""#), "{set}");
    assert_eq!(server.get("/static/", &[]).body, INDEX);
    assert_json_error(&server.get("/static/missing", &[]), 404, "not_found");

    env.ok(&["bucket", "set", "static", "--error-document", "404.html"]);
    assert_error_document(&server.get("/static/missing", &[]), "no-cache");
    let shown = listed(&env, "static");
    assert_eq!(
        (shown["index_document"].as_str(), shown["error_document"].as_str()),
        (Some("index.html"), Some("404.html"))
    );

    env.ok(&["bucket", "set", "static", "--index-document", ""]);
    assert_error_document(&server.get("/static/", &[]), "no-cache");
    assert_eq!(server.get("/static/css/", &[]).status, 404);
    env.ok(&["bucket", "set", "static", "--error-document", ""]);
    assert_json_error(&server.get("/static/", &[]), 404, "not_found");
    let shown = listed(&env, "static");
    assert!(shown["index_document"].is_null() && shown["error_document"].is_null(), "{shown}");
}

#[test]
fn a_directory_named_without_its_slash_redirects_when_its_index_document_exists() {
    let env = TestEnv::new();
    site(&env, "static", true);
    site(&env, "plain", true);
    site(&env, "closed", false);
    website(&env, "static");
    website(&env, "closed");
    let server = env.serve();

    for (path, location) in [("/static/docs", "./docs/"), ("/static", "./static/"), ("/static/d%20x", "./d%20x/")] {
        if path.contains("%20") {
            env.put_bytes("static", "d x/index.html", DOCS_INDEX, &[]);
        }
        for method in ["GET", "HEAD"] {
            let r = server.request(method, path, &[]);
            assert_eq!((r.status, r.header("location")), (302, Some(location)), "{method} {path}: {r:?}");
            assert_eq!(r.header("cache-control"), Some("no-cache"), "{path}");
            assert!(r.body.is_empty());
        }
    }
    assert_eq!(server.get("/static/docs/", &[]).body, DOCS_INDEX, "where the redirect leads");
    // No index document there, an object of that name, or no index document at all: no redirect.
    assert_error_document(&server.get("/static/nodir", &[]), "no-cache");
    env.put_bytes("static", "docs", b"an object named docs", &[]);
    assert_eq!(server.get("/static/docs", &[]).body, b"an object named docs");
    assert_json_error(&server.get("/plain/docs", &[]), 404, "not_found");
    // Before authorisation, a refusal like any other.
    assert_eq!(server.get("/closed/docs", &[]).status, 401);
    let read = env.token("closed", "read", &[]);
    assert_eq!(server.get_auth("/closed/docs", &read, &[]).header("cache-control"), Some("private, no-cache"));
}

/// 401 and 403 before any lookup, identical for every path of an existing bucket and of an absent one; after
/// them, each document is read only by a caller who may read it.
#[test]
fn refusals_are_identical_for_present_and_absent_and_each_document_needs_its_own_right() {
    let env = TestEnv::new();
    site(&env, "closed", false);
    website(&env, "closed");
    env.bucket("other", false);
    let other = env.token("other", "read", &[]);
    let css_only = env.token("closed", "read", &["--prefix", "css/"]);
    let server = env.serve();

    let paths = [
        "/closed/",
        "/closed",
        "/closed/css/",
        "/closed/docs",
        "/closed/missing.png",
        "/nothere/",
        "/nothere",
        "/nothere/css/",
        "/nothere/missing.png",
    ];
    for (who, headers, status) in [
        ("nobody", vec![], 401),
        ("another bucket's token", vec![("Authorization", format!("Bearer {other}"))], 403),
        ("nobody, with an Origin", vec![("Origin", APP.to_owned())], 401),
    ] {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let first = server.get(paths[0], &headers);
        assert_eq!(first.status, status, "{who}");
        for path in paths {
            let r = server.get(path, &headers);
            assert_eq!(
                (r.status, r.headers_without_date(), &r.body),
                (first.status, first.headers_without_date(), &first.body),
                "{who} {path}"
            );
        }
    }
    // A token for `css/` reads that directory's index, not the bucket's nor the error document (outside its prefix).
    assert_eq!(server.get_auth("/closed/css/", &css_only, &[]).body, CSS_INDEX);
    assert_eq!(server.get_auth("/closed/", &css_only, &[]).status, 403);
    assert_eq!(server.get_auth("/closed/docs/", &css_only, &[]).status, 403);
    assert_json_error(&server.get_auth("/closed/css/missing.png", &css_only, &[]), 404, "not_found");
    // A signed URL grants the one key it names: its 404 is plain, and it redirects nowhere.
    let base = format!("http://{}", server.data);
    for key in ["css/missing.png", "docs"] {
        let url = env.ok(&["presign", "closed", key, "--base-url", &base]);
        assert_json_error(&server.get(path_of_url(url.trim()), &[]), 404, "not_found");
    }
    let url = env.ok(&["presign", "closed", "css/index.html", "--base-url", &base]);
    assert_eq!(server.get(path_of_url(url.trim()), &[]).body, CSS_INDEX);
}

#[test]
fn cors_headers_go_on_index_error_document_and_redirect_answers() {
    let env = TestEnv::new();
    site(&env, "static", true);
    website(&env, "static");
    env.ok(&["bucket", "cors", "set", "static", "--origin", APP]);
    let server = env.serve();
    let origin = [("Origin", APP)];
    for (path, status) in [("/static/", 200), ("/static/css/", 200), ("/static/missing", 404), ("/static/docs", 302)] {
        let r = server.get(path, &origin);
        assert_eq!(r.status, status, "{path}");
        assert_eq!(r.header("access-control-allow-origin"), Some(APP), "{path}: {r:?}");
        assert!(r.header("vary").is_some_and(|v| v.contains("Origin")), "{path}: {r:?}");
    }
    // Without Origin the bucket's answers still say they vary on it, so a shared cache keys them apart.
    assert!(server.get("/static/", &[]).header("vary").is_some_and(|v| v.contains("Origin")));
    let preflight = server.request(
        "OPTIONS",
        "/static/",
        &[("Origin", APP), ("Access-Control-Request-Method", "GET"), ("Access-Control-Request-Headers", "range")],
    );
    assert_eq!((preflight.status, preflight.header("access-control-allow-origin")), (204, Some(APP)));
}

#[test]
fn bad_documents_are_one_line_errors_and_change_nothing() {
    let env = TestEnv::new();
    site(&env, "static", false);
    env.ok(&["bucket", "set", "static", "--index-document", "index.html", "--error-document", "404.html"]);
    let before = listed(&env, "static");
    let long = "k".repeat(1025);
    for index in ["/index.html", "a//index.html", "dir/", "../index.html", "a/./b.html", "a\u{7}b", long.as_str()] {
        let line = env.fails(&["bucket", "set", "static", "--public", "--index-document", index]);
        assert!(line.starts_with("blobgate: invalid index document"), "{index:?}: {line}");
    }
    for error in ["../404.html", "a/../b", "x\u{1}", long.as_str()] {
        let line = env.fails(&["bucket", "set", "static", "--public", "--error-document", error]);
        assert!(line.starts_with("blobgate: invalid error document"), "{error:?}: {line}");
    }
    assert_eq!(listed(&env, "static"), before, "nothing changed, not even --public");
    let line = env.fails(&["bucket", "set", "nosuch", "--index-document", "index.html"]);
    assert!(line.contains("nosuch"), "{line}");
    // A suffix with its own directories is fine, and so is an error document in a directory.
    env.ok(&["bucket", "set", "static", "--index-document", "_site/home.html", "--error-document", "errors/404"]);
    let shown = listed(&env, "static");
    assert_eq!(
        (shown["index_document"].as_str(), shown["error_document"].as_str()),
        (Some("_site/home.html"), Some("errors/404"))
    );
}

/// Signed S3 requests keep S3's REST semantics (GetObject of `dir/` is that key, a missing key is `NoSuchKey` in
/// XML); unsigned ones are native requests and get the site, also with a query that names no S3 parameter.
#[test]
fn signed_s3_requests_keep_rest_semantics_and_anonymous_ones_get_the_site() {
    use crate::helpers::s3::{key_json, run_boto3, s3_key};
    let env = TestEnv::new();
    site(&env, "static", true);
    website(&env, "static");
    let key = s3_key(&env, "static", &["--scope", "read"]);
    let server = env.serve();
    let script = r#"
from botocore import UNSIGNED
endpoint = spec["endpoint"]
signed = client(endpoint, spec["key"])
anonymous = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
    config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
out = {
    "signed_dir": code(lambda: signed.get_object(Bucket="static", Key="css/")),
    "signed_missing": code(lambda: signed.get_object(Bucket="static", Key="missing.png")),
    "signed_head_dir": code(lambda: signed.head_object(Bucket="static", Key="css/")),
    "signed_index": signed.get_object(Bucket="static", Key="css/index.html")["Body"].read().decode(),
    "anonymous_dir": anonymous.get_object(Bucket="static", Key="css/")["Body"].read().decode(),
    "anonymous_missing": code(lambda: anonymous.get_object(Bucket="static", Key="missing.png")),
}
url = signed.generate_presigned_url("get_object", Params={"Bucket": "static", "Key": "css/"}, ExpiresIn=600)
import urllib.request, urllib.error
try:
    urllib.request.urlopen(url)
    out["presigned_dir"] = [200, ""]
except urllib.error.HTTPError as e:
    out["presigned_dir"] = [e.code, e.read().decode()]
print(json.dumps(out))
"#;
    let spec = serde_json::json!({"endpoint": format!("http://{}", server.data), "key": key_json(&key)});
    let out = run_boto3(&env.dir.path().join("boto3-home"), script, &spec);
    assert_eq!(out["signed_dir"], serde_json::json!([404, "NoSuchKey"]), "{out}");
    assert_eq!(out["signed_missing"], serde_json::json!([404, "NoSuchKey"]), "{out}");
    assert_eq!(out["signed_head_dir"][0], 404, "{out}");
    assert_eq!(out["signed_index"], String::from_utf8_lossy(CSS_INDEX).as_ref(), "{out}");
    assert_eq!(out["anonymous_dir"], String::from_utf8_lossy(CSS_INDEX).as_ref(), "{out}");
    assert_eq!(out["anonymous_missing"][0], 404, "{out}");
    assert_eq!(out["presigned_dir"][0], 404, "{out}");
    assert!(out["presigned_dir"][1].as_str().unwrap().contains("<Code>NoSuchKey</Code>"), "{out}");

    // Links with a tracking query reach the site; a query an S3 client sends is still S3's.
    assert_eq!(server.get("/static/?utm_source=mail&fbclid=x", &[]).body, INDEX);
    assert_eq!(server.get("/static?utm_source=mail", &[]).header("location"), Some("./static/"));
    let list = server.get("/static/?list-type=2", &[]);
    assert!(list.header("x-amz-request-id").is_some(), "an S3 answer: {list:?}");
}

/// A static site in headless Chromium through Varnish with docs/cdn-origin.md's VCL: the page, its stylesheet by a
/// relative link, a missing image's error page, and a directory link followed through its redirect. Varnish keeps
/// the page and never the 404 (`no-cache`), so a key uploaded later is served at once.
#[test]
fn a_browser_loads_a_static_site_through_varnish() {
    use crate::browser::{chromium_dom, page_output};
    use crate::varnish::Varnish;
    let env = TestEnv::new();
    site(&env, "www", true);
    website(&env, "www");
    let page = r#"<!doctype html><html><head><link rel="stylesheet" href="css/site.css"></head>
<body><pre id="out">pending</pre><script>
(async () => {
  const seen = { color: getComputedStyle(document.body).color };
  try {
    const missing = await fetch('missing.png');
    seen.missing = { status: missing.status, page: (await missing.text()).includes('<title>not here</title>') };
    const docs = await fetch('docs');
    const page = (await docs.text()).includes('<title>docs</title>');
    seen.docs = { status: docs.status, redirected: docs.redirected, url: docs.url, page };
  } catch (e) { seen.error = String(e); }
  document.getElementById('out').textContent = JSON.stringify(seen);
})();
</script></body></html>"#;
    env.put_bytes("www", "index.html", page.as_bytes(), &["--content-type", "text/html; charset=utf-8"]);
    let server = env.serve();
    let varnish = Varnish::start(server.data);

    let seen = page_output(&chromium_dom(&format!("http://{}/www/", varnish.addr)));
    assert_eq!(seen["color"], "rgb(1, 2, 3)", "{seen}");
    assert_eq!(seen["missing"]["status"], 404, "{seen}");
    assert_eq!(seen["missing"]["page"], true, "the error document: {seen}");
    assert_eq!(seen["docs"]["status"], 200, "{seen}");
    assert_eq!(seen["docs"]["redirected"], true, "{seen}");
    assert_eq!(seen["docs"]["url"], format!("http://{}/www/docs/", varnish.addr), "{seen}");
    assert_eq!(seen["docs"]["page"], true, "the directory's index document: {seen}");

    // Varnish keys on the Host too: the browser's.
    let host = varnish.addr.to_string();
    let host = [("Host", host.as_str())];
    assert_eq!(varnish.get("/www/", &host).header("x-cache"), Some("HIT"), "the browser's load primed the page");
    for _ in 0..2 {
        let r = varnish.get("/www/missing.png", &host);
        assert_eq!((r.status, r.header("x-cache")), (404, Some("MISS")), "a 404 is never kept: {r:?}");
    }
    env.put_bytes("www", "missing.png", b"now here", &[]);
    assert_eq!(varnish.get("/www/missing.png", &host).body, b"now here");
}
