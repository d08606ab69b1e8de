//! CORS in a real browser: headless Chromium loads a page from another origin (a one-page HTTP server in the test,
//! on another port), whose script talks to blobgate and writes what it saw into the DOM; the test reads the DOM
//! Chromium dumps. A missing `chromium` or `ffmpeg` is a failure naming it (`scripts/test` installs both).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::Duration;

use crate::helpers::*;

/// Serves `html` to every request on a port of its own, from a thread that lives as long as the test.
pub fn serve_page(html: String) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{html}",
                html.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    addr
}

/// Loads `url` in headless Chromium and returns the DOM after the page's script had time to finish.
pub fn chromium_dom(url: &str) -> String {
    chromium_dom_with(url, &[])
}

/// [`chromium_dom`] with more of Chromium's flags (`--ignore-certificate-errors-spki-list=…` for a test CA).
pub fn chromium_dom_with(url: &str, flags: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("chromium")
        .args(["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--mute-audio"])
        .args(["--autoplay-policy=no-user-gesture-required", "--virtual-time-budget=15000", "--dump-dom"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(flags)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("chromium is not installed: scripts/test installs it (apt package chromium): {e}"));
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text the page wrote into `<pre id="out">`.
pub fn page_output(dom: &str) -> serde_json::Value {
    let start = dom.find("<pre id=\"out\">").unwrap_or_else(|| panic!("no output element in {dom}")) + 14;
    let end = start + dom[start..].find("</pre>").unwrap();
    let text = dom[start..end].replace("&quot;", "\"").replace("&amp;", "&");
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("the page did not finish: {text:?}\n{dom}"))
}

#[test]
fn a_page_on_another_origin_fetches_a_range_and_reads_the_exposed_headers() {
    let env = TestEnv::new();
    env.bucket("assets", true);
    env.bucket("closed", true);
    let bytes = test_bytes(5000, 16);
    env.put_bytes("assets", "app.bin", &bytes, &[]);
    env.put_bytes("closed", "app.bin", &bytes, &[]);
    let server = env.serve();
    let blobgate = format!("http://{}", server.data);

    // The page's own origin is only known once its server listens; the script reads blobgate's from the query.
    let script = r#"
      const out = document.getElementById('out');
      const base = new URLSearchParams(location.search).get('blobgate');
      (async () => {
        const seen = {};
        try {
          const r = await fetch(base + '/assets/app.bin', { headers: { Range: 'bytes=0-99' } });
          const body = await r.arrayBuffer();
          Object.assign(seen, { status: r.status, contentRange: r.headers.get('content-range'),
                                etag: r.headers.get('etag'), length: body.byteLength });
          // If-None-Match is not CORS-safelisted: this one needs the preflight.
          const again = await fetch(base + '/assets/app.bin', { headers: { 'If-None-Match': seen.etag } });
          seen.revalidated = again.status;
        } catch (e) { seen.error = String(e); }
        try {
          await fetch(base + '/closed/app.bin');
          seen.closed = 'readable';
        } catch (e) { seen.closed = 'blocked'; }
        out.textContent = JSON.stringify(seen);
      })();
    "#;
    let page = serve_page(format!(
        "<!doctype html><html><body><pre id=\"out\">pending</pre><script>{script}</script></body></html>"
    ));
    env.ok(&["bucket", "cors", "set", "assets", "--origin", &format!("http://{page}"), "--max-age", "60"]);

    let seen = page_output(&chromium_dom(&format!("http://{page}/?blobgate={blobgate}")));
    assert_eq!(seen["status"], 206, "{seen}");
    assert_eq!(seen["contentRange"], "bytes 0-99/5000", "{seen}");
    assert_eq!(seen["length"], 100, "{seen}");
    let etag = server.get("/assets/app.bin", &[]).header("etag").unwrap().to_owned();
    assert_eq!(seen["etag"], etag.as_str(), "{seen}");
    assert_eq!(seen["revalidated"], 304, "the preflight allowed If-None-Match: {seen}");
    assert_eq!(seen["closed"], "blocked", "a bucket without a rule is not readable from the page: {seen}");
}

#[test]
fn a_video_on_another_origin_plays_from_range_requests() {
    let env = TestEnv::new();
    let video = env.dir.path().join("clip.webm");
    let made = Command::new("ffmpeg")
        .args(["-loglevel", "error", "-y", "-f", "lavfi", "-i", "testsrc=duration=3:size=320x240:rate=15"])
        .args(["-c:v", "libvpx", "-b:v", "400k", "-pix_fmt", "yuv420p"])
        .arg(&video)
        .output()
        .unwrap_or_else(|e| panic!("ffmpeg is not installed: scripts/test installs it (apt package ffmpeg): {e}"));
    assert!(made.status.success(), "ffmpeg: {}", String::from_utf8_lossy(&made.stderr));
    env.bucket("media", true);
    env.ok(&["put", "media", "clip.webm", video.to_str().unwrap(), "--content-type", "video/webm"]);
    let server = env.serve();
    let blobgate = format!("http://{}", server.data);

    // crossorigin: the media element itself makes CORS requests, so the rule is what lets it play.
    let script = r#"
      const out = document.getElementById('out');
      const v = document.createElement('video');
      v.crossOrigin = 'anonymous';
      v.muted = true;
      v.preload = 'auto';
      v.addEventListener('canplaythrough', () => {
        out.textContent = JSON.stringify({ duration: v.duration, width: v.videoWidth });
      }, { once: true });
      v.addEventListener('error', () => {
        out.textContent = JSON.stringify({ error: v.error && v.error.message });
      });
      v.src = new URLSearchParams(location.search).get('blobgate') + '/media/clip.webm';
      document.body.appendChild(v);
    "#;
    let page = serve_page(format!(
        "<!doctype html><html><body><pre id=\"out\">pending</pre><script>{script}</script></body></html>"
    ));
    env.ok(&["bucket", "cors", "set", "media", "--origin", &format!("http://{page}")]);

    let seen = page_output(&chromium_dom(&format!("http://{page}/?blobgate={blobgate}")));
    assert_eq!(seen["width"], 320, "the video loaded: {seen}");
    assert!(seen["duration"].as_f64().is_some_and(|d| (d - 3.0).abs() < 0.5), "{seen}");

    // From blobgate's side: the browser's media requests were ranges, each answered 206.
    let mut last = serde_json::Value::Null;
    let counted = wait_for(Duration::from_secs(30), || {
        let stats: serde_json::Value = serde_json::from_str(env.ok(&["stats", "--json"]).trim()).unwrap();
        last = stats.as_array().unwrap().iter().find(|r| r["key"] == "clip.webm").cloned().unwrap_or_default();
        last["range_requests"].as_u64().is_some_and(|n| n >= 1) && last["range_requests"] == last["requests"]
    });
    assert!(counted, "every media request was a 206 range: {last}");
}

/// A page uploads to a presigned S3 URL and reads the object back through another, as the bucket's CORS rule
/// allows (`--method PUT --allow-header content-type`); a bucket whose rule allows reads only refuses the upload's
/// preflight, and nothing is stored there.
#[test]
fn a_page_puts_to_a_presigned_url_when_the_rule_allows_it() {
    use crate::helpers::s3::{Signing, presigned_url, s3_key};
    let env = TestEnv::new();
    env.bucket("uploads", false);
    env.bucket("reads-only", false);
    let key = s3_key(&env, "uploads", &["--scope", "write"]);
    let other = s3_key(&env, "reads-only", &["--scope", "write"]);
    let server = env.serve();
    let base = format!("http://{}", server.data);
    let sign = |key, path: &str, method| {
        presigned_url(key, &format!("{base}{path}"), &Signing { method, expires: Some(600), ..Default::default() })
    };
    let urls = serde_json::json!({
        "put": sign(&key, "/uploads/from-page.txt", "PUT"),
        "get": sign(&key, "/uploads/from-page.txt", "GET"),
        "refused": sign(&other, "/reads-only/from-page.txt", "PUT"),
    });
    let script = r#"
      const out = document.getElementById('out');
      const urls = JSON.parse(document.getElementById('urls').textContent);
      (async () => {
        const seen = {};
        try {
          const put = await fetch(urls.put, { method: 'PUT', headers: { 'Content-Type': 'text/plain' },
                                               body: 'written by a page' });
          seen.put = put.status;
          const got = await fetch(urls.get);
          Object.assign(seen, { get: got.status, body: await got.text(), etag: got.headers.get('etag') });
        } catch (e) { seen.error = String(e); }
        try {
          await fetch(urls.refused, { method: 'PUT', headers: { 'Content-Type': 'text/plain' }, body: 'no' });
          seen.refused = 'sent';
        } catch (e) { seen.refused = 'blocked'; }
        out.textContent = JSON.stringify(seen);
      })();
    "#;
    let page = serve_page(format!(
        "<!doctype html><html><body><pre id=\"out\">pending</pre>\
         <script type=\"application/json\" id=\"urls\">{urls}</script><script>{script}</script></body></html>"
    ));
    let origin = format!("http://{page}");
    let rule = ["--origin", &origin, "--method", "GET", "--method", "PUT", "--allow-header", "content-type"];
    env.ok(&[&["bucket", "cors", "set", "uploads"][..], &rule[..]].concat());
    env.ok(&["bucket", "cors", "set", "reads-only", "--origin", &origin]);

    let seen = page_output(&chromium_dom(&format!("{origin}/")));
    assert_eq!(seen["put"], 200, "{seen}");
    assert_eq!(seen["get"], 200, "{seen}");
    assert_eq!(seen["body"], "written by a page", "{seen}");
    assert!(seen["etag"].as_str().is_some_and(|e| e.starts_with('"')), "the ETag is exposed: {seen}");
    assert_eq!(seen["refused"], "blocked", "the rule allows no PUT: {seen}");
    assert!(!env.ok(&["ls", "reads-only"]).contains("from-page.txt"), "nothing stored where the rule refused");
}
