//! A static site's assets behind docs/cdn-origin.md's shared caches (nginx `proxy_cache`, Varnish), read by a browser
//! on another origin. The trial that found it: objects with variants got `Vary: Origin` and `Vary: Accept-Encoding`
//! as two header lines, nginx keyed its cache on one, and a copy stored for a request without `Origin` was handed
//! to Chromium without `Access-Control-Allow-Origin`. `Vary` is one line now; these tests prime each cache
//! without `Origin`, then let Chromium read through it.

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::browser::{chromium_dom, page_output, serve_page};
use crate::helpers::*;
use crate::shared_cache::CachingProxy;
use crate::varnish::Varnish;

/// A stylesheet big enough for its br and gzip variants to be kept.
fn stylesheet() -> Vec<u8> {
    (0..200).map(|i| format!(".c{i} {{ color: #{:06x}; margin: {}px; }}\n", i * 997, i % 17)).collect::<String>().into()
}

/// The `Vary` lines of a raw response, as sent.
fn vary_lines(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<String>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(&raw_request("GET", path, headers, true)).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let head = String::from_utf8_lossy(&raw[..find(&raw, b"\r\n\r\n").expect("a head")]).into_owned();
    let status = head[9..12].parse().unwrap();
    let lines = head.lines().filter(|l| l.to_ascii_lowercase().starts_with("vary:")).map(str::to_owned).collect();
    (status, lines)
}

#[test]
fn vary_is_one_header_line_on_every_answer() {
    let env = TestEnv::new();
    env.bucket("site", true);
    let css = env.dir.path().join("app.css");
    std::fs::write(&css, stylesheet()).unwrap();
    env.ok(&["put", "site", "app.css", css.to_str().unwrap(), "--precompress"]);
    env.ok(&["bucket", "cors", "set", "site", "--origin", "https://app.example"]);
    let server = env.serve();
    let etag = server.get("/site/app.css", &[]).header("etag").unwrap().to_owned();
    let origin = ("Origin", "https://app.example");
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, u16);
    let cases: [Case; 6] = [
        ("/site/app.css", vec![], 200),
        ("/site/app.css", vec![origin, ("Accept-Encoding", "br")], 200),
        ("/site/app.css", vec![("If-None-Match", etag.as_str())], 304),
        ("/site/app.css", vec![origin, ("If-Match", "\"x\"")], 412),
        ("/site/app.css", vec![origin, ("Range", "bytes=99999-")], 416),
        ("/site/missing.css", vec![origin], 404),
    ];
    for (path, headers, status) in &cases {
        let (got, lines) = vary_lines(server.data, path, headers);
        assert_eq!(got, *status, "{path} {headers:?}");
        match *status {
            // The object's answers vary on both; a missing key's only on Origin (no coding was chosen).
            404 => assert_eq!(lines, ["vary: Origin"], "{path} {headers:?}"),
            _ => assert_eq!(lines, ["vary: Origin, Accept-Encoding"], "{path} {headers:?}"),
        }
    }
}

#[test]
fn a_browser_gets_cors_headers_through_nginx_and_varnish_primed_without_origin() {
    let env = TestEnv::new();
    env.bucket("site", true);
    let bytes = stylesheet();
    let css = env.dir.path().join("app.css");
    std::fs::write(&css, &bytes).unwrap();
    let put = env.ok(&["put", "site", "app.css", css.to_str().unwrap(), "--precompress"]);
    assert!(put.contains("\"br\"") && put.contains("\"gzip\""), "both variants kept: {put}");
    // nginx stores only what says how long it may (no proxy_cache_valid in docs/cdn-origin.md's snippet).
    env.ok(&["bucket", "set", "site", "--cache-control", "public, max-age=600"]);
    let server = env.serve();
    let nginx = CachingProxy::start(server.data);
    let varnish = Varnish::start(server.data);

    let script = r#"
      const out = document.getElementById('out');
      const params = new URLSearchParams(location.search);
      (async () => {
        const seen = {};
        for (const name of ['nginx', 'varnish']) {
          try {
            const r = await fetch(params.get(name) + '/site/app.css');
            const text = await r.text();
            seen[name] = { status: r.status, length: text.length, encoding: r.headers.get('content-encoding') };
          } catch (e) { seen[name] = { error: String(e) }; }
        }
        out.textContent = JSON.stringify(seen);
      })();
    "#;
    let page = serve_page(format!(
        "<!doctype html><html><body><pre id=\"out\">pending</pre><script>{script}</script></body></html>"
    ));
    env.ok(&["bucket", "cors", "set", "site", "--origin", &format!("http://{page}")]);

    // Primed as a crawler or a same-origin page would: a browser's Accept-Encoding, no Origin.
    let accept = ("Accept-Encoding", "gzip, deflate, br, zstd");
    let primed = nginx.get("/site/app.css", &[accept]);
    assert_eq!((primed.status, primed.header("x-cache-status")), (200, Some("MISS")));
    assert_eq!(nginx.get("/site/app.css", &[accept]).header("x-cache-status"), Some("HIT"));
    let primed = varnish.get("/site/app.css", &[accept]);
    assert_eq!((primed.status, primed.header("x-cache")), (200, Some("MISS")));
    assert_eq!(varnish.get("/site/app.css", &[accept]).header("x-cache"), Some("HIT"));

    let url = format!("http://{page}/?nginx=http://{}&varnish=http://{}", nginx.addr, varnish.addr);
    let seen = page_output(&chromium_dom(&url));
    for name in ["nginx", "varnish"] {
        assert_eq!(seen[name]["status"], 200, "{name}: {seen}");
        assert_eq!(seen[name]["length"], bytes.len(), "{name}: the decoded stylesheet: {seen}");
    }
    assert_eq!(seen["varnish"]["encoding"], "br", "Varnish keeps brotli with docs/cdn-origin.md's VCL: {seen}");
}

/// With docs/cdn-origin.md's VCL (`http_gzip_support=off` and `Accept-Encoding` normalised), each coding is cached
/// apart and brotli reaches brotli clients from the cache.
#[test]
fn varnish_with_the_documented_vcl_caches_each_coding_apart_and_keeps_brotli() {
    let env = TestEnv::new();
    env.bucket("site", true);
    let bytes = stylesheet();
    let css = env.dir.path().join("app.css");
    std::fs::write(&css, &bytes).unwrap();
    env.ok(&["put", "site", "app.css", css.to_str().unwrap(), "--precompress"]);
    let server = env.serve();
    let varnish = Varnish::start(server.data);
    for (accept, coding) in [("gzip, deflate, br", Some("br")), ("gzip", Some("gzip")), ("identity", None)] {
        let headers = [("Accept-Encoding", accept)];
        for cache in ["MISS", "HIT"] {
            let r = varnish.get("/site/app.css", &headers);
            assert_eq!((r.status, r.header("x-cache")), (200, Some(cache)), "{accept}");
            assert_eq!(r.header("content-encoding"), coding, "{accept}: {:?}", r.headers);
            if coding.is_none() {
                assert_eq!(r.body, bytes);
            }
        }
    }
}
