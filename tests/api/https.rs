//! HTTPS in the process (`--tls-cert`/`--tls-key`): real clients byte-exact over TLS 1.2 and 1.3 with each key
//! type, plain HTTP and stalled handshakes on the HTTPS port, refusals at start naming their key, the SIGHUP reload
//! by certificate fingerprint, and the metrics and access log that say how a connection was encrypted. This
//! kernel has no TLS, so these connections are encrypted in user space; the kTLS path is tested in the kernel VM.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::helpers::pki::{EC, TestPki};
use crate::helpers::s3::{boto3_command, key_json, run_ok, s3_key};
use crate::helpers::strace;
use crate::helpers::*;

/// A CA and server certificates it signed for `localhost` and 127.0.0.1, one per key type.
fn https_pki() -> TestPki {
    let pki = TestPki::with_ca("ca");
    for (name, newkey) in [("ecdsa", EC), ("rsa", "-newkey rsa:2048"), ("ed25519", "-newkey ed25519"), ("second", EC)] {
        pki.server(name, newkey, "DNS:localhost,IP:127.0.0.1", "ca");
    }
    pki
}

/// `blobgate serve` on HTTPS with the pair `name`, plus `env`.
fn serve_https(env: &TestEnv, pki: &TestPki, name: &str, extra: &[(&str, &str)]) -> Server {
    let (cert, key) = (pki.file(&format!("{name}.crt")), pki.file(&format!("{name}.key")));
    let mut vars = vec![("BLOBGATE_TLS__CERT", cert.to_str().unwrap()), ("BLOBGATE_TLS__KEY", key.to_str().unwrap())];
    vars.extend_from_slice(extra);
    env.serve_with(&vars, &[])
}

/// `curl -sS --cacert CA ARGS` (the output is the body, or what `-w` asks for); it must succeed.
fn curl(pki: &TestPki, args: &[&str]) -> Vec<u8> {
    require_tool("curl", "apt package curl");
    let out =
        Command::new("curl").args(["-sS", "--cacert", &pki.path("ca.crt")]).args(args).output().expect("run curl");
    assert!(out.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn url(addr: std::net::SocketAddr, path: &str) -> String {
    format!("https://localhost:{}{path}", addr.port())
}

/// The admin listener's `/metrics`, over HTTPS.
fn https_metrics(pki: &TestPki, server: &Server) -> String {
    String::from_utf8(curl(pki, &[&url(server.admin, "/metrics")])).unwrap()
}

fn metric_value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
}

/// What the python clients check (http.client on one keep-alive connection per TLS version, and boto3 with the CA
/// bundle); prints one JSON line of what it did.
const PYTHON_CLIENTS: &str = r#"
import hashlib, http.client, json, ssl, sys
spec = json.loads(sys.argv[1])
done = {}
for version in ["TLSv1_2", "TLSv1_3"]:
    ctx = ssl.create_default_context(cafile=spec["ca"])
    ctx.minimum_version = ctx.maximum_version = getattr(ssl.TLSVersion, version)
    conn = http.client.HTTPSConnection("localhost", spec["port"], context=ctx)
    requests = 0
    for _ in range(3):
        conn.request("GET", spec["path"], headers={"Authorization": "Bearer " + spec["token"]})
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200, r.status
        assert hashlib.sha256(body).hexdigest() == spec["sha256"], "full body differs"
        conn.request("GET", spec["path"], headers={"Authorization": "Bearer " + spec["token"], "Range": "bytes=1000-1999"})
        r = conn.getresponse()
        part = r.read()
        assert r.status == 206 and len(part) == 1000, (r.status, len(part))
        assert hashlib.sha256(part).hexdigest() == spec["range_sha256"], "range differs"
        requests += 2
    assert conn.sock.version().replace(".", "_") == version, conn.sock.version()
    assert conn.sock.selected_alpn_protocol() in (None, "http/1.1")
    conn.close()
    done[version] = requests
print(json.dumps(done))
"#;

#[test]
fn real_clients_read_and_write_byte_exact_over_https() {
    let pki = https_pki();
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.bucket("priv", false);
    let big = test_bytes(3 * 1024 * 1024 + 17, 41);
    let small = test_bytes(4096, 42);
    env.put_bytes("pub", "big.bin", &big, &[]);
    env.put_bytes("pub", "small.bin", &small, &[]);
    env.put_bytes("priv", "big.bin", &big, &[]);
    let token = env.token("priv", "write", &[]);
    let log = env.dir.path().join("access.log");
    let server = serve_https(&env, &pki, "ecdsa", &[("BLOBGATE_ACCESS_LOG", log.to_str().unwrap())]);
    let big_url = url(server.data, "/pub/big.bin");

    // curl: full bodies over both TLS versions, a range, a three-part multi-range, a HEAD.
    for version in [["--tlsv1.2", "--tls-max", "1.2"], ["--tlsv1.3", "--tls-max", "1.3"]] {
        let body = curl(&pki, &[version[0], version[1], version[2], &big_url]);
        assert_eq!(sha256_hex(&body), sha256_hex(&big), "curl {version:?}");
    }
    assert_eq!(curl(&pki, &[&url(server.data, "/pub/small.bin")]), small);
    assert_eq!(curl(&pki, &["-r", "100-199", &big_url]), big[100..200]);
    let multi = curl(&pki, &["-i", "-r", "0-9,1000-1099,3145000-3145727", &big_url]);
    let text = String::from_utf8_lossy(&multi);
    assert!(text.starts_with("HTTP/1.1 206"), "{}", &text[..80]);
    for (start, end) in [(0usize, 9usize), (1000, 1099), (3145000, 3145727)] {
        let range = format!("ange: bytes {start}-{end}/{}", big.len());
        let at = find(&multi, range.as_bytes()).unwrap_or_else(|| panic!("no part {range}"));
        let body_at = at + find(&multi[at..], b"\r\n\r\n").unwrap() + 4;
        assert_eq!(&multi[body_at..body_at + end - start + 1], &big[start..=end], "part {range}");
    }
    let head = String::from_utf8(curl(&pki, &["-I", &big_url])).unwrap();
    assert!(head.contains(&format!("content-length: {}", big.len())), "{head}");

    // A private object with a bearer token, and a native upload on the data listener, read back.
    let auth = format!("Authorization: Bearer {token}");
    assert_eq!(sha256_hex(&curl(&pki, &["-H", &auth, &url(server.data, "/priv/big.bin")])), sha256_hex(&big));
    let upload = env.dir.path().join("upload.bin");
    let uploaded = test_bytes(2 * 1024 * 1024 + 3, 43);
    std::fs::write(&upload, &uploaded).unwrap();
    let put = curl(
        &pki,
        &[
            "-w",
            "%{http_code}",
            "-o",
            "/dev/null",
            "-H",
            &auth,
            "-T",
            upload.to_str().unwrap(),
            &url(server.data, "/priv/up.bin"),
        ],
    );
    assert!(matches!(&put[..], b"200" | b"201"), "PUT answered {}", String::from_utf8_lossy(&put));
    assert_eq!(sha256_hex(&curl(&pki, &["-H", &auth, &url(server.data, "/priv/up.bin")])), sha256_hex(&uploaded));

    // wget and aria2c (four connections at once, each a range).
    require_tool("wget", "apt package wget");
    let wget_to = env.dir.path().join("wget.bin");
    let out = Command::new("wget")
        .args(["-q", "--ca-certificate", &pki.path("ca.crt"), "-O", wget_to.to_str().unwrap(), &big_url])
        .output()
        .unwrap();
    assert!(out.status.success(), "wget: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(sha256_hex(&std::fs::read(&wget_to).unwrap()), sha256_hex(&big));
    require_tool("aria2c", "apt package aria2");
    let aria_dir = env.dir.path().join("aria");
    let out = Command::new("aria2c")
        .args([
            "-q",
            "-x4",
            "-s4",
            "-k1M",
            "--ca-certificate",
            &pki.path("ca.crt"),
            "-d",
            aria_dir.to_str().unwrap(),
            "-o",
            "a.bin",
            &big_url,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "aria2c: {}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(sha256_hex(&std::fs::read(aria_dir.join("a.bin")).unwrap()), sha256_hex(&big));

    // python's ssl: keep-alive connections, TLS 1.2 and 1.3, full bodies and ranges in turn.
    let spec = serde_json::json!({
        "ca": pki.path("ca.crt"), "port": server.data.port(), "path": "/priv/big.bin", "token": token,
        "sha256": sha256_hex(&big), "range_sha256": sha256_hex(&big[1000..2000]),
    });
    let python = crate::helpers::s3::python();
    let done = run_ok(Command::new(python).args(["-c", PYTHON_CLIENTS, &spec.to_string()]));
    assert_eq!(done.trim(), r#"{"TLSv1_2": 6, "TLSv1_3": 6}"#);

    // openssl s_client: a raw request, answered through the TLS session.
    let mut s_client = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-CAfile",
            &pki.path("ca.crt"),
            "-connect",
            &format!("localhost:{}", server.data.port()),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    s_client
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET /pub/small.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    s_client.stdout.take().unwrap().read_to_end(&mut answer).unwrap();
    let _ = s_client.wait();
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..answer.len().min(200)]));
    assert!(answer.ends_with(&small), "s_client's body differs");

    // boto3 with a CA bundle: PutObject and GetObject on the data listener, multipart for the large one.
    let key = s3_key(&env, "priv", &["--scope", "write"]);
    let home = env.dir.path().join("boto-home");
    let script = r#"
s3 = client(spec["endpoint"], spec["key"])
cfg = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)
data = bytes((i * 7 + 3) % 251 for i in range(11 * 1024 * 1024))
import io
s3.upload_fileobj(io.BytesIO(data), "priv", "boto.bin", Config=cfg)
back = s3.get_object(Bucket="priv", Key="boto.bin")["Body"].read()
ranged = s3.get_object(Bucket="priv", Key="big.bin", Range="bytes=5-104")["Body"].read()
print(json.dumps({"same": hashlib.sha256(back).hexdigest() == hashlib.sha256(data).hexdigest(), "len": len(back),
    "range": hashlib.sha256(ranged).hexdigest()}))
"#;
    let spec =
        serde_json::json!({"endpoint": format!("https://localhost:{}", server.data.port()), "key": key_json(&key)});
    let out = run_ok(boto3_command(&home, script, &spec).env("AWS_CA_BUNDLE", pki.path("ca.crt")));
    let result: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(result["same"], true, "{result}");
    assert_eq!(result["len"], 11 * 1024 * 1024);
    assert_eq!(result["range"], sha256_hex(&big[5..105]));

    // Every one of those connections was encrypted in user space here (this kernel has no TLS), and said so.
    let metrics = https_metrics(&pki, &server);
    assert!(metric_value(&metrics, r#"blobgate_tls_connections_total{mode="userspace"}"#) >= 12.0, "{metrics}");
    assert_eq!(metric_value(&metrics, r#"blobgate_tls_connections_total{mode="ktls"}"#), 0.0);
    assert!(server.log().contains("encrypted in user space"), "{}", server.log());
    assert!(wait_for(Duration::from_secs(30), || std::fs::read_to_string(&log).is_ok_and(|l| l.lines().count() > 10)));
    let lines = std::fs::read_to_string(&log).unwrap();
    for line in lines.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(entry["tls"], "userspace", "{line}");
    }
}

/// What the page blobgate serves to Chromium does on its own origin: a full object, a range and a two-part
/// multi-range, each hashed with WebCrypto (HTTPS makes the page a secure context), then a native PUT with a
/// bearer token and the upload read back; writes what it saw as JSON into `<pre id="out">`.
const BROWSER_PAGE_SCRIPT: &str = r#"
  const out = document.getElementById('out');
  const spec = JSON.parse(document.getElementById('spec').textContent);
  const hex = async (buf) => Array.from(new Uint8Array(await crypto.subtle.digest('SHA-256', buf)))
    .map((b) => b.toString(16).padStart(2, '0')).join('');
  (async () => {
    const seen = { secure: window.isSecureContext, protocol: location.protocol };
    try {
      const full = await fetch('/site/big.bin');
      seen.full = [full.status, await hex(await full.arrayBuffer())];
      const range = await fetch('/site/big.bin', { headers: { Range: 'bytes=100-199' } });
      seen.range = [range.status, range.headers.get('content-range'), await hex(await range.arrayBuffer())];
      const multi = await fetch('/site/big.bin', { headers: { Range: 'bytes=0-9,1000-1099' } });
      seen.multi = [multi.status, multi.headers.get('content-type'), Array.from(new Uint8Array(await multi.arrayBuffer()))];
      const data = new Uint8Array(spec.upload_len);
      for (let i = 0; i < data.length; i++) data[i] = (i * 7 + 3) % 251;
      const auth = { Authorization: 'Bearer ' + spec.token };
      const put = await fetch('/drop/from-browser.bin', { method: 'PUT', headers: auth, body: data });
      seen.put = put.status;
      const back = await fetch('/drop/from-browser.bin', { headers: auth });
      seen.back = [back.status, await hex(await back.arrayBuffer())];
      seen.protocols = [performance.getEntriesByType('navigation')[0].nextHopProtocol,
                        ...performance.getEntriesByType('resource').map((e) => e.nextHopProtocol)];
    } catch (e) { seen.error = String(e); }
    out.textContent = JSON.stringify(seen);
  })();
"#;

/// Chromium over HTTPS, trusting the test certificate by its public key: a page blobgate serves reads a full
/// object, a range and a multi-range and uploads with a native PUT, all byte-exact by SHA-256; and uploads and
/// deletes on the admin listener over HTTPS.
#[test]
fn chromium_and_admin_uploads_are_byte_exact_over_https() {
    use crate::browser::{chromium_dom_with, page_output};
    let pki = https_pki();
    let env = TestEnv::new();
    env.bucket("site", true);
    env.bucket("drop", false);
    let big = test_bytes(2 * 1024 * 1024 + 11, 51);
    env.put_bytes("site", "big.bin", &big, &[]);
    let token = env.token("drop", "write", &[]);
    let upload_len = 3 * 1024 * 1024 + 5;
    let spec = serde_json::json!({ "token": token, "upload_len": upload_len });
    let page = format!(
        "<!doctype html><html><body><pre id=\"out\">pending</pre>\
         <script type=\"application/json\" id=\"spec\">{spec}</script><script>{BROWSER_PAGE_SCRIPT}</script></body></html>"
    );
    env.put_bytes("site", "page.html", page.as_bytes(), &["--content-type", "text/html; charset=utf-8"]);
    let server = serve_https(&env, &pki, "ecdsa", &[]);

    // Chromium keeps its own trust store; the certificate's SPKI hash makes it valid there, not merely ignored.
    let spki = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -pubkey -noout -in {} | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary \
             | openssl base64 -A",
            pki.file("ecdsa.crt").display()
        ))
        .output()
        .unwrap();
    let spki = String::from_utf8(spki.stdout).unwrap();
    assert_eq!(spki.trim().len(), 44, "an SPKI SHA-256 in base64: {spki:?}");
    let flag = format!("--ignore-certificate-errors-spki-list={}", spki.trim());
    let seen = page_output(&chromium_dom_with(&url(server.data, "/site/page.html"), &[&flag]));

    assert_eq!(seen["secure"], true, "{seen}");
    assert_eq!(seen["protocol"], "https:", "{seen}");
    assert_eq!(seen["full"], serde_json::json!([200, sha256_hex(&big)]), "{seen}");
    let content_range = format!("bytes 100-199/{}", big.len());
    assert_eq!(seen["range"], serde_json::json!([206, content_range, sha256_hex(&big[100..200])]), "{seen}");
    assert_eq!(seen["multi"][0], 206, "{seen}");
    let content_type = seen["multi"][1].as_str().unwrap_or_default();
    assert!(content_type.starts_with("multipart/byteranges; boundary="), "{seen}");
    let multi: Vec<u8> = seen["multi"][2].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
    for (start, end) in [(0usize, 9usize), (1000, 1099)] {
        let range = format!("ange: bytes {start}-{end}/{}", big.len());
        let at = find(&multi, range.as_bytes()).unwrap_or_else(|| panic!("no part {range}"));
        let body_at = at + find(&multi[at..], b"\r\n\r\n").unwrap() + 4;
        assert_eq!(&multi[body_at..body_at + end - start + 1], &big[start..=end], "part {range}");
    }
    let uploaded: Vec<u8> = (0..upload_len).map(|i| ((i * 7 + 3) % 251) as u8).collect();
    assert!(matches!(seen["put"].as_u64(), Some(200 | 201)), "{seen}");
    assert_eq!(seen["back"], serde_json::json!([200, sha256_hex(&uploaded)]), "{seen}");
    let protocols = seen["protocols"].as_array().unwrap();
    assert!(protocols.len() >= 6, "the page and its five fetches: {seen}");
    assert!(protocols.iter().all(|p| p == "http/1.1"), "ALPN http/1.1 on every request: {seen}");
    let auth = format!("Authorization: Bearer {token}");
    let stored = curl(&pki, &["-H", &auth, &url(server.data, "/drop/from-browser.bin")]);
    assert_eq!(sha256_hex(&stored), sha256_hex(&uploaded), "what the browser uploaded, read back by curl");

    // The admin listener over HTTPS: a native upload (201 with the object's JSON), read back, then deleted.
    let file = env.dir.path().join("admin.bin");
    let admin_bytes = test_bytes(5 * 1024 * 1024 + 7, 52);
    std::fs::write(&file, &admin_bytes).unwrap();
    let put = curl(
        &pki,
        &["-w", "\n%{http_code}", "-H", &auth, "-T", file.to_str().unwrap(), &url(server.admin, "/drop/admin.bin")],
    );
    let put = String::from_utf8(put).unwrap();
    let (json, status) = put.rsplit_once('\n').unwrap();
    assert_eq!(status, "201", "{put}");
    let object: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|_| panic!("PUT's JSON: {put}"));
    assert_eq!(object["size"], admin_bytes.len(), "{object}");
    let back = curl(&pki, &["-H", &auth, &url(server.data, "/drop/admin.bin")]);
    assert_eq!(sha256_hex(&back), sha256_hex(&admin_bytes));
    let deleted =
        curl(&pki, &["-X", "DELETE", "-w", "%{http_code}", "-H", &auth, &url(server.admin, "/drop/admin.bin")]);
    assert_eq!(deleted, b"204");
    let gone =
        curl(&pki, &["-o", "/dev/null", "-w", "%{http_code}", "-H", &auth, &url(server.data, "/drop/admin.bin")]);
    assert_eq!(gone, b"404");
    let metrics = https_metrics(&pki, &server);
    assert!(metric_value(&metrics, r#"blobgate_tls_connections_total{mode="userspace"}"#) >= 6.0, "{metrics}");
}

/// Python's ssl: keep-alive HTTPS connections that each made one request and went idle; the second is used again;
/// then two newcomers. Prints how each of the first four ended: `close` (close_notify or EOF), `open`, or what else.
const IDLE_AT_THE_CAP: &str = r#"
import http.client, json, socket, ssl, sys
spec = json.loads(sys.argv[1])
ctx = ssl.create_default_context(cafile=spec["ca"])
def connect():
    conn = http.client.HTTPSConnection("localhost", spec["port"], context=ctx)
    conn.request("GET", "/pub/a")
    r = conn.getresponse()
    assert r.status == 200 and r.read() == b"cap", r.status
    return conn
idle = [connect() for _ in range(4)]
idle[1].request("GET", "/pub/a")
assert idle[1].getresponse().read() == b"cap"
newcomers = [connect() for _ in range(2)]
ends = []
for conn in idle:
    conn.sock.settimeout(0.3)
    try:
        ends.append("close" if conn.sock.recv(64) == b"" else "bytes")
    except (socket.timeout, TimeoutError):
        ends.append("open")
    except ssl.SSLEOFError:
        ends.append("close")
    except OSError as e:
        ends.append(type(e).__name__)
print(json.dumps(ends))
"#;

/// At `limits.max_connections`, HTTPS connections are closed as plain ones are: the longest idle first, cleanly.
#[test]
fn at_the_cap_the_longest_idle_https_connection_is_closed_first() {
    let pki = https_pki();
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.put_bytes("pub", "a", b"cap", &[]);
    let server = serve_https(
        &env,
        &pki,
        "ecdsa",
        &[("BLOBGATE_LIMITS__MAX_CONNECTIONS", "4"), ("BLOBGATE_RUNTIME__DATA_WORKERS", "1")],
    );
    let spec = serde_json::json!({ "ca": pki.path("ca.crt"), "port": server.data.port() });
    let python = crate::helpers::s3::python();
    let ends = run_ok(Command::new(python).args(["-c", IDLE_AT_THE_CAP, &spec.to_string()]));
    assert_eq!(ends.trim(), r#"["close", "open", "close", "open"]"#);
}

/// Python's ssl: `warm` HTTPS connections, each one GET of `/pub/big.bin` and closed, then `connections` more,
/// each one GET and then held open, idle. Says `warm` and `idle` at those points and waits for a line on stdin.
const IDLE_AFTER_A_BODY: &str = r#"
import http.client, json, ssl, sys
spec = json.loads(sys.argv[1])
ctx = ssl.create_default_context(cafile=spec["ca"])
def one_get():
    conn = http.client.HTTPSConnection("localhost", spec["port"], context=ctx)
    conn.request("GET", "/pub/big.bin")
    r = conn.getresponse()
    body = r.read()
    assert r.status == 200 and len(body) == spec["size"], (r.status, len(body))
    return conn
for _ in range(spec["warm"]):
    one_get().close()
print("warm", flush=True)
sys.stdin.readline()
held = [one_get() for _ in range(spec["connections"])]
print("idle", flush=True)
sys.stdin.readline()
"#;

/// The server's resident memory (VmRSS), in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).expect("a VmRSS line");
    line.trim().trim_end_matches("kB").trim().parse().unwrap()
}

/// An idle keep-alive HTTPS connection holds no body buffer (user-space TLS reads a body 128 KiB at a time): 200
/// connections that each received a 200 KiB body and went idle grow the server's RSS by a few KiB each, not by
/// the 128 KiB of a buffer kept per connection.
#[test]
fn idle_https_connections_hold_no_body_buffer() {
    use std::io::{BufRead, Write as _};
    let pki = https_pki();
    let env = TestEnv::new();
    env.bucket("pub", true);
    let size = 200 * 1024;
    env.put_bytes("pub", "big.bin", &test_bytes(size, 11), &[]);
    let server = serve_https(&env, &pki, "ecdsa", &[("BLOBGATE_RUNTIME__DATA_WORKERS", "1")]);
    let connections = 200;
    let spec = serde_json::json!({
        "ca": pki.path("ca.crt"), "port": server.data.port(), "size": size, "warm": 20, "connections": connections,
    });
    let mut client = Command::new(crate::helpers::s3::python())
        .args(["-c", IDLE_AFTER_A_BODY, &spec.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python");
    let (mut said, mut stdin) = (BufReader::new(client.stdout.take().unwrap()).lines(), client.stdin.take().unwrap());
    let mut next = |expected: &str| {
        let line = said.next().and_then(Result::ok);
        assert_eq!(line.as_deref(), Some(expected), "the client stopped early");
    };
    next("warm");
    let before = rss_kib(server.pid());
    stdin.write_all(b"\n").unwrap();
    next("idle");
    let after = rss_kib(server.pid());
    stdin.write_all(b"\n").unwrap();
    assert!(client.wait().unwrap().success());
    let per_connection = after.saturating_sub(before) / connections;
    eprintln!("RSS {before} -> {after} KiB over {connections} idle HTTPS connections: {per_connection} KiB each");
    // A few KiB each (the session's keys and its 4 KiB record buffer, the connection's task); a kept body
    // buffer is 128 KiB.
    assert!(per_connection <= 32, "{per_connection} KiB per idle HTTPS connection ({before} -> {after} KiB)");
}

#[test]
fn rsa_and_ed25519_keys_serve_as_ecdsa_does() {
    let pki = https_pki();
    let env = TestEnv::new();
    env.bucket("pub", true);
    let bytes = test_bytes(200_000, 7);
    env.put_bytes("pub", "o.bin", &bytes, &[]);
    for name in ["rsa", "ed25519"] {
        let mut server = serve_https(&env, &pki, name, &[]);
        for max in ["1.2", "1.3"] {
            let body = curl(&pki, &["--tls-max", max, &url(server.data, "/pub/o.bin")]);
            assert_eq!(sha256_hex(&body), sha256_hex(&bytes), "{name} over TLS {max}");
        }
        let served = openssl_fingerprint(&pki, server.data.port());
        assert_eq!(served, pki.fingerprint(name), "{name}");
        server.stop();
    }
}

/// The SHA-256 fingerprint of the certificate a server at `port` presents (openssl s_client, then x509).
fn openssl_fingerprint(pki: &TestPki, port: u16) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect localhost:{port} -CAfile {} </dev/null 2>/dev/null \
             | openssl x509 -noout -fingerprint -sha256",
            pki.path("ca.crt")
        ))
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().rsplit('=').next().unwrap_or_default().to_owned()
}

#[test]
fn plain_http_and_stalled_handshakes_on_the_https_port_are_closed() {
    let pki = https_pki();
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.put_bytes("pub", "o.bin", b"hello", &[]);
    let server = serve_https(&env, &pki, "ecdsa", &[("BLOBGATE_TIMEOUTS__HEADER_READ", "1s")]);

    // Plain HTTP: a 400 in plain text, unencrypted, then the close.
    for addr in [server.data, server.admin] {
        let mut plain = TcpStream::connect(addr).unwrap();
        plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        plain.write_all(b"GET /pub/o.bin HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut answer = String::new();
        plain.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
        assert!(answer.to_ascii_lowercase().contains("content-type: text/plain"), "{answer}");
        assert!(answer.contains("HTTPS"), "{answer}");
    }

    // A client that connects and sends nothing, and one that stops halfway through its ClientHello: both closed
    // once timeouts.header_read has passed, with nothing sent.
    let silent = TcpStream::connect(server.data).unwrap();
    let mut half = TcpStream::connect(server.data).unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00]).unwrap();
    // Closed by the server's timer (an EOF or a reset), not given up on by this read's timeout (a bound on a
    // hang); the metrics below count both as handshake timeouts.
    for mut stream in [silent, half] {
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = [0u8; 64];
        let read = stream.read(&mut buf);
        let timed_out = |e: &std::io::Error| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
        assert!(matches!(&read, Ok(0)) || read.as_ref().is_err_and(|e| !timed_out(e)), "the server sent {read:?}");
    }
    // A client that closes at once, and one whose first bytes are not TLS nor HTTP.
    drop(TcpStream::connect(server.data).unwrap());
    let mut garbage = TcpStream::connect(server.data).unwrap();
    garbage.write_all(&[0x16, 0x03, 0x03, 0x00, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff]).unwrap();
    garbage.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = Vec::new();
    let _ = garbage.read_to_end(&mut sink);

    // The service goes on, and the failures are counted by reason.
    assert_eq!(curl(&pki, &[&url(server.data, "/pub/o.bin")]), b"hello");
    let counted = |metrics: &str, reason: &str| {
        metric_value(metrics, &format!(r#"blobgate_tls_handshake_failures_total{{reason="{reason}"}}"#))
    };
    assert!(
        wait_for(Duration::from_secs(30), || {
            let metrics = https_metrics(&pki, &server);
            counted(&metrics, "plain_http") == 2.0
                && counted(&metrics, "timeout") == 2.0
                && counted(&metrics, "malformed") == 1.0
                && counted(&metrics, "closed") >= 1.0
        }),
        "{}",
        https_metrics(&pki, &server)
    );
}

/// Python's ssl: a `slow` client that connects, waits a third of `header_read` past when a `reference` client
/// connects, then handshakes; both send part of a head and read until the server answers or closes. Prints who was
/// answered first, and with what.
const SLOW_HANDSHAKE: &str = r#"
import json, socket, ssl, sys, threading, time
spec = json.loads(sys.argv[1])
ctx = ssl.create_default_context(cafile=spec["ca"])
third = spec["header_read"] / 3
ends, lock = [], threading.Lock()
def partial_head(name, raw):
    tls = ctx.wrap_socket(raw, server_hostname="localhost")
    tls.sendall(b"GET /pub/o.bin HTTP/1.1\r\nHost: localhost\r\n")
    tls.settimeout(60)
    try:
        first = tls.recv(4096).split(b"\r\n")[0].decode()
    except (ssl.SSLError, OSError) as e:
        first = type(e).__name__
    with lock:
        ends.append([name, first or "close"])
slow = socket.create_connection(("127.0.0.1", spec["port"]))
time.sleep(third)
reference = socket.create_connection(("127.0.0.1", spec["port"]))
threads = [threading.Thread(target=partial_head, args=("reference", reference))]
threads[0].start()
time.sleep(third)
threads.append(threading.Thread(target=partial_head, args=("slow", slow)))
threads[1].start()
for t in threads:
    t.join()
print(json.dumps(ends))
"#;

/// `timeouts.header_read` is one budget from accept to the complete head, the handshake included: a client whose
/// handshake came late gets its 408 before a reference client accepted after it (handshake at once, same partial
/// head). With the handshake and the head timed apart, the slow client's 408 came a whole handshake later.
#[test]
fn a_slow_handshake_uses_the_header_read_budget_of_its_head() {
    let pki = https_pki();
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.put_bytes("pub", "o.bin", b"hello", &[]);
    // The slow client connects at 0 and handshakes at 2 s, the reference connects at 1 s (and handshakes at once):
    // in one budget the slow one is answered at 3 s and the reference at 4 s; timed apart, the slow one at 5 s.
    let server = serve_https(&env, &pki, "ecdsa", &[("BLOBGATE_TIMEOUTS__HEADER_READ", "3s")]);
    let spec = serde_json::json!({ "ca": pki.path("ca.crt"), "port": server.data.port(), "header_read": 3.0 });
    let python = crate::helpers::s3::python();
    let ends = run_ok(Command::new(python).args(["-c", SLOW_HANDSHAKE, &spec.to_string()]));
    let ends: Vec<(String, String)> = serde_json::from_str(ends.trim()).unwrap();
    let names: Vec<&str> = ends.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["slow", "reference"], "{ends:?}");
    for (name, first) in &ends {
        assert!(first.starts_with("HTTP/1.1 408 "), "{name}: {first}");
    }
}

#[test]
fn sighup_reloads_the_pair_and_keeps_it_when_the_new_one_is_bad_and_the_expiry_gauge_follows() {
    let pki = https_pki();
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.put_bytes("pub", "o.bin", b"reloaded", &[]);
    let live = env.dir.path().join("live");
    std::fs::create_dir_all(&live).unwrap();
    let install = |name: &str| {
        std::fs::copy(pki.file(&format!("{name}.crt")), live.join("cert.pem")).unwrap();
        std::fs::copy(pki.file(&format!("{name}.key")), live.join("key.pem")).unwrap();
    };
    install("ecdsa");
    let (cert, key) = (live.join("cert.pem"), live.join("key.pem"));
    let server = env.serve_with(
        &[("BLOBGATE_TLS__CERT", cert.to_str().unwrap()), ("BLOBGATE_TLS__KEY", key.to_str().unwrap())],
        &[],
    );
    let port = server.data.port();
    assert_eq!(openssl_fingerprint(&pki, port), pki.fingerprint("ecdsa"));
    // The expiry gauge is the served certificate's notAfter; with 2 days left, the start warns of it.
    let expiry = || metric_value(&https_metrics(&pki, &server), "blobgate_tls_certificate_expiry_timestamp_seconds");
    assert_eq!(expiry(), not_after(&pki, "ecdsa"));
    assert!(server.log().contains("the TLS certificate expires in less than 14 days"), "{}", server.log());

    // A new pair (valid for 30 days): new connections present it after SIGHUP, and the gauge follows.
    pki.openssl(
        "x509 -req -in second.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -extfile second.ext -out second.crt",
    );
    install("second");
    assert_eq!(openssl_fingerprint(&pki, port), pki.fingerprint("ecdsa"), "nothing changes before the signal");
    server.signal("HUP");
    assert!(
        wait_for(Duration::from_secs(30), || openssl_fingerprint(&pki, port) == pki.fingerprint("second")),
        "the new certificate is not served; log:\n{}",
        server.log()
    );
    assert_eq!(expiry(), not_after(&pki, "second"));
    assert!(not_after(&pki, "second") > not_after(&pki, "ecdsa") + 20.0 * 86400.0);

    // A bad pair (a key that is not the certificate's): logged, and the pair in use stays.
    std::fs::copy(pki.file("rsa.key"), &key).unwrap();
    server.signal("HUP");
    assert!(
        wait_for(Duration::from_secs(30), || server.log().contains("cannot reload the TLS certificate")),
        "{}",
        server.log()
    );
    assert!(server.log().contains("tls.key"), "{}", server.log());
    assert_eq!(openssl_fingerprint(&pki, port), pki.fingerprint("second"));
    assert_eq!(curl(&pki, &[&url(server.data, "/pub/o.bin")]), b"reloaded");
    assert_eq!(expiry(), not_after(&pki, "second"), "the gauge follows the pair in use");
}

/// Certificate `name`'s notAfter as a Unix time, as openssl reads it.
fn not_after(pki: &TestPki, name: &str) -> f64 {
    let out = Command::new("sh")
        .args([
            "-c",
            &format!(
                "date -d \"$(openssl x509 -noout -enddate -in {} | cut -d= -f2)\" +%s",
                pki.path(&format!("{name}.crt"))
            ),
        ])
        .output()
        .expect("run openssl and date");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().parse().unwrap()
}

#[test]
fn bad_tls_settings_are_refused_at_start_naming_the_key() {
    let pki = https_pki();
    let env = TestEnv::new();
    let (cert, key) = (pki.file("ecdsa.crt"), pki.file("ecdsa.key"));
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let missing = env.dir.path().join("missing.pem");
    let not_pem = write_file(env.dir.path(), "not.pem", b"hello\n");
    let other_key = pki.file("rsa.key");
    // The serve flags, the environment, and the key the refusal names.
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (vec!["--tls-cert", cert], vec![], "tls.key"),
        (vec!["--tls-key", key], vec![], "tls.cert"),
        (vec!["--tls-cert", missing.to_str().unwrap(), "--tls-key", key], vec![], "tls.cert"),
        (vec!["--tls-cert", cert, "--tls-key", not_pem.to_str().unwrap()], vec![], "tls.key"),
        (vec!["--tls-cert", not_pem.to_str().unwrap(), "--tls-key", key], vec![], "tls.cert"),
        (vec!["--tls-cert", cert, "--tls-key", other_key.to_str().unwrap()], vec![], "tls.key"),
        (vec!["--tls-cert", cert, "--tls-key", key], vec![("BLOBGATE_TLS__KTLS", "required")], "tls.ktls"),
        (vec!["--tls-cert", cert, "--tls-key", key], vec![("BLOBGATE_TLS__KTLS", "sometimes")], "tls.ktls"),
    ];
    for (args, vars, names) in cases {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];
        all.extend_from_slice(&args);
        let out = env.cli_env(&all, &vars);
        assert!(!out.status.success(), "{args:?} {vars:?} started");
        let line = one_line_error(&out, &[names]);
        assert!(line.contains(names), "{args:?} {vars:?}: {line}");
    }
    assert!(!env.data_dir().exists(), "a refused start created the data dir");
}

#[test]
fn a_slow_reader_gets_every_byte_and_a_stalled_one_is_closed_over_https() {
    let pki = https_pki();
    let env = TestEnv::new();
    env.bucket("pub", true);
    // More than the server's send buffer and the stalled client's receive buffer hold (tcp_wmem's default
    // maximum is 4 MiB), small enough for a slow reader to finish in seconds.
    let big = test_bytes(12 * 1024 * 1024, 9);
    env.put_bytes("pub", "big.bin", &big, &[]);
    let server = serve_https(&env, &pki, "ecdsa", &[("BLOBGATE_TIMEOUTS__SEND_PROGRESS", "2s")]);
    let python = crate::helpers::s3::python();
    // Reads about 256 KiB, then pauses 50 ms, and so on: slower than the server sends (its socket fills and it
    // waits again and again), but always making progress.
    let slow = r#"
import hashlib, json, socket, ssl, sys, time
spec = json.loads(sys.argv[1])
ctx = ssl.create_default_context(cafile=spec["ca"])
raw = socket.socket()
raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
raw.connect(("localhost", spec["port"]))
s = ctx.wrap_socket(raw, server_hostname="localhost")
s.sendall(b"GET /pub/big.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
chunks, since_pause = [], 0
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    chunks.append(chunk)
    since_pause += len(chunk)
    if since_pause >= 256 * 1024:
        time.sleep(spec["pause"])
        since_pause = 0
data = b"".join(chunks)
body = data[data.index(b"\r\n\r\n") + 4:]
print(json.dumps({"len": len(body), "sha256": hashlib.sha256(body).hexdigest()}))
"#;
    let spec = serde_json::json!({"ca": pki.path("ca.crt"), "port": server.data.port(), "pause": 0.05});
    let out = run_ok(Command::new(python).args(["-c", slow, &spec.to_string()]));
    let result: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(result["len"], big.len());
    assert_eq!(result["sha256"], sha256_hex(&big));

    // A client that reads nothing after its request is closed after send_progress: it reads (what the kernel
    // kept) only once the server has said it gave up, on a line from the test.
    let stalled = r#"
import json, socket, ssl, sys
spec = json.loads(sys.argv[1])
ctx = ssl.create_default_context(cafile=spec["ca"])
raw = socket.socket()
raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
raw.connect(("localhost", spec["port"]))
s = ctx.wrap_socket(raw, server_hostname="localhost")
s.sendall(b"GET /pub/big.bin HTTP/1.1\r\nHost: localhost\r\n\r\n")
print("sent", flush=True)
sys.stdin.readline()
got = 0
try:
    while True:
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        got += len(chunk)
except (ConnectionError, ssl.SSLError):
    pass
print(json.dumps({"got": got}))
"#;
    let gave_up = || server.log().matches("client made no progress").count();
    let before = gave_up();
    let mut client = Command::new(python)
        .args(["-c", stalled, &spec.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python");
    let mut said = String::new();
    BufReader::new(client.stdout.as_mut().unwrap()).read_line(&mut said).unwrap();
    assert_eq!(said.trim(), "sent", "the stalled client did not send its request");
    let closed = wait_for(Duration::from_secs(30), || gave_up() > before);
    assert!(closed, "the stalled reader was never dropped; log:\n{}", server.log());
    client.stdin.take().unwrap().write_all(b"read now\n").unwrap();
    let out = client.wait_with_output().unwrap();
    assert!(out.status.success(), "the stalled client failed");
    let result: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert!(result["got"].as_u64().unwrap() < big.len() as u64, "the stalled reader got every byte: {result}");
    let metrics = https_metrics(&pki, &server);
    assert!(metric_value(&metrics, "blobgate_stalled_responses_total") >= 1.0, "{metrics}");
}

/// `../shared/kernel-vm/run` beside the checkout (or `$BLOBGATE_KERNEL_VM`, for a checkout that lives elsewhere): a
/// VM whose kernel has TLS (this machine's has none).
fn kernel_vm() -> PathBuf {
    require_group("kernel-vm");
    let run = std::env::var_os("BLOBGATE_KERNEL_VM")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/kernel-vm/run"), PathBuf::from);
    assert!(
        run.is_file(),
        "the kTLS tests need {} (the shared kernel VM; set BLOBGATE_KERNEL_VM to its `run` for a checkout elsewhere)",
        run.display()
    );
    run
}

/// Bytes moved by an `strace -f -yy` file on the download's connections: by sendfile, and by read/write-like
/// calls on them plus any read of a blob file, what a user-space copy of a body shows up as. `-yy` names each
/// call's descriptor (`27<TCP:[11289]>`, `28</tmp/…/blobs/…>`): the data listener is the socket bound to port 8443,
/// its connections what `accept4` returns on it; start-up probes, SQLite's page reads and the `/metrics` fetch on
/// the admin port are left out.
fn socket_copies(trace: &str) -> (u64, u64) {
    const COPIES: &[&str] =
        &["read", "readv", "recvfrom", "recvmsg", "write", "writev", "sendto", "sendmsg", "pwrite64"];
    let (mut listeners, mut downloads) = (std::collections::HashSet::new(), std::collections::HashSet::new());
    let (mut sendfile, mut copied) = (0u64, 0u64);
    for call in strace::calls(trace) {
        let fd = strace::described(call.first_arg());
        match call.name.as_str() {
            "bind" if call.args.contains("htons(8443)") => {
                listeners.insert(fd.to_owned());
            }
            "accept4" if listeners.contains(fd) && !call.result.starts_with('-') => {
                downloads.insert(strace::described(&call.result).to_owned());
            }
            "sendfile" if downloads.contains(fd) => sendfile += call.moved(),
            "pread64" | "preadv" if fd.contains("/blobs/") => copied += call.moved(),
            name if downloads.contains(fd) && COPIES.contains(&name) => copied += call.moved(),
            _ => {}
        }
    }
    (sendfile, copied)
}

#[test]
fn the_copy_count_follows_the_download_socket_through_interrupted_calls() {
    let trace = r#"149   bind(9<TCP:[10242]>, {sa_family=AF_INET, sin_port=htons(8443), sin_addr=inet_addr("127.0.0.1")}, 16) = 0
149   bind(11<TCP:[6123]>, {sa_family=AF_INET, sin_port=htons(8444), sin_addr=inet_addr("127.0.0.1")}, 16) = 0
149   bind(12<TCP:[6126]>, {sa_family=AF_INET, sin_port=htons(0), sin_addr=inet_addr("127.0.0.1")}, 16) = 0
149   accept4(12<TCP:[6126]>, {sa_family=AF_INET, sin_port=htons(58740)}, [128 => 16], SOCK_CLOEXEC) = 14<TCP:[6131]>
149   read(14<TCP:[6131]>, "x"..., 100) = 100
150   pread64(6</tmp/d/meta.sqlite3>, ""..., 4096, 0) = 4096
187   accept4(9<TCP:[10242]>, {sa_family=AF_INET, sin_port=htons(44520)}, [128 => 16], SOCK_CLOEXEC|SOCK_NONBLOCK) = 27<TCP:[11289]>
187   accept4(9<TCP:[10242]>, 0x7f1c3a51d2b0, [128], SOCK_CLOEXEC|SOCK_NONBLOCK) = -1 EAGAIN (Resource temporarily unavailable)
187   recvfrom(27<TCP:[11289]>, "\26\3\1\2\0"..., 16389, MSG_PEEK, NULL, NULL) = 517
187   recvfrom(27<TCP:[11289]>, 0x7f1c20001d28, 5, 0, NULL, NULL) = -1 EAGAIN (Resource temporarily unavailable)
190   sendfile(27<TCP:[11289]>, 28</tmp/d/blobs/ee/1f/ee1f>, [0] <unfinished ...>
187   recvmsg(27<TCP:[11289]>, {msg_namelen=128}, 0 <unfinished ...>
190   <... sendfile resumed> => [2097152], 2097152) = 2097152
187   <... recvmsg resumed>{msg_namelen=128 => 0}, 0) = 2
181   writev(27<TCP:[11289]>, [{iov_len=16406}], 1 <unfinished ...>
181   <... writev resumed>)              = 16406
190   sendfile(27<TCP:[11289]>, 28</tmp/d/blobs/ee/1f/ee1f>, [2097152] => [2228224], 2097152) = 131072
191   pread64(28</tmp/d/blobs/ee/1f/ee1f>, ""..., 10, 5) = 10
153   accept4(11<TCP:[6123]>, {sa_family=AF_INET, sin_port=htons(48720)}, [128 => 16], SOCK_CLOEXEC|SOCK_NONBLOCK) = 27<TCP:[10305]>
153   sendto(27<TCP:[10305]>, "HTTP/1.1 200 OK\r\n"..., 3000, MSG_NOSIGNAL, NULL, 0) = 3000
"#;
    assert_eq!(socket_copies(trace), (2_097_152 + 131_072, 517 + 2 + 16_406 + 10));
}

/// The object the kernel-TLS cases download, and the smaller one of the user-space fallbacks: each of their body
/// bytes is encrypted by emulated instructions, so the bodies are as small as still shows what is counted (the
/// copies per body byte of a kTLS download are its handshake's ~2 KB, well under 0.001 of 4 MiB).
const KTLS_OBJECT: usize = 8 * 1024 * 1024;
const FALLBACK_OBJECT: usize = 1024 * 1024;

fn expected_body(case: &str, object: &[u8]) -> Vec<(usize, usize)> {
    match &case[..case.len().min(5)] {
        "range" => vec![(1000, 4_195_303)],
        "multi" => vec![(0, 2_097_151), (2_500_000, 4_597_151), (5_000_000, 7_097_151)],
        _ => vec![(0, object.len() - 1)],
    }
}

#[test]
fn kernel_tls_sends_bodies_by_sendfile_in_a_kernel_with_tls() {
    let vm = kernel_vm();
    require_tool("strace", "apt package strace");
    require_tool("objcopy", "apt package binutils");
    let pki = https_pki();
    let object = test_bytes(KTLS_OBJECT, 77);
    let fallback_object = test_bytes(FALLBACK_OBJECT, 78);
    // One boot for every case (a boot under emulation costs about as much as the cases): the kernel is given
    // AES-GCM but not ChaCha20, so the same run shows kernel TLS for the clients it can serve and the user-space
    // fallback for one it cannot.
    let run = |cases: &[&str]| -> tempfile::TempDir {
        let out = tempfile::tempdir().unwrap();
        std::fs::copy(pki.file("ecdsa.crt"), out.path().join("cert.pem")).unwrap();
        std::fs::copy(pki.file("ecdsa.key"), out.path().join("key.pem")).unwrap();
        std::fs::write(out.path().join("obj.bin"), &object).unwrap();
        std::fs::write(out.path().join("fallback.bin"), &fallback_object).unwrap();
        // The guest sees the host read-only but for a fresh /tmp, so what it runs comes through the shared
        // directory, wherever the checkout lives; the binary without its debug info, which the guest never reads.
        let script = out.path().join("ktls_in_vm.sh");
        std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/https/ktls_in_vm.sh"), &script).unwrap();
        run_ok(Command::new("objcopy").arg("--strip-debug").arg(BIN).arg(out.path().join("blobgate")));
        let mut cmd = Command::new(&vm);
        cmd.arg("--rw").arg(out.path()).args(["--", "bash"]).arg(&script).arg(out.path()).args(cases);
        cmd.env("BLOBGATE_VM_WITHHOLD", "chacha_generic poly1305_generic chacha20poly1305");
        let result = cmd.output().expect("run the kernel VM");
        assert!(
            result.status.success(),
            "the VM run failed ({}); the guest said:\n{}\n{}",
            result.status,
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        );
        let statuses = std::fs::read_to_string(out.path().join("curl-status")).unwrap_or_default();
        for case in cases {
            assert!(statuses.contains(&format!("{case} 0")), "curl failed in the VM: {statuses}");
        }
        out
    };
    let body_of = |out: &Path, case: &str| -> Vec<u8> {
        let body = std::fs::read(out.join(format!("body-{case}"))).unwrap();
        let parts = expected_body(case, &object);
        if parts.len() == 1 {
            return body;
        }
        // A multipart body: each part's bytes after its Content-Range line's blank line.
        let mut joined = Vec::new();
        for (start, end) in parts {
            let range = format!("ange: bytes {start}-{end}/{}", object.len());
            let at = find(&body, range.as_bytes()).unwrap_or_else(|| panic!("{case}: no part {range}"));
            let from = at + find(&body[at..], b"\r\n\r\n").unwrap() + 4;
            joined.extend_from_slice(&body[from..from + end - start + 1]);
        }
        joined
    };

    // Kernel TLS for every case: both versions, a full body, a range and three-part multi-ranges.
    let cases = ["full13", "full12", "range13", "range12", "multi13", "multi12"];
    let fallbacks = ["chacha", "full13-off"];
    let out = run(&[&cases[..], &fallbacks[..], &["keyupdate13"]].concat());
    let ulp = std::fs::read_to_string(out.path().join("ulp")).unwrap();
    assert!(ulp.split_whitespace().any(|u| u == "tls"), "the VM's kernel has no TLS: {ulp}");
    for case in cases {
        let expected: Vec<u8> =
            expected_body(case, &object).iter().flat_map(|&(s, e)| object[s..=e].iter().copied()).collect();
        assert_eq!(sha256_hex(&body_of(out.path(), case)), sha256_hex(&expected), "{case}: the body differs");
        let trace = std::fs::read_to_string(out.path().join(format!("strace-{case}.txt"))).unwrap();
        let (sendfile, copied) = socket_copies(&trace);
        assert!(sendfile >= expected.len() as u64, "{case}: sendfile moved {sendfile} of {} bytes", expected.len());
        let per_byte = copied as f64 / expected.len() as f64;
        eprintln!("{case}: {sendfile} B by sendfile, {copied} B copied, {per_byte:.5} per body byte");
        assert!(per_byte <= 0.001, "{case}: {copied} bytes copied in user space ({per_byte:.5} per body byte)");
        let metrics = std::fs::read_to_string(out.path().join(format!("metrics-{case}"))).unwrap();
        assert_eq!(metric_value(&metrics, r#"blobgate_tls_connections_total{mode="ktls"}"#), 2.0, "{case}");
        assert_eq!(metric_value(&metrics, r#"blobgate_tls_connections_total{mode="userspace"}"#), 0.0, "{case}");
    }
    // The kernel counted the sessions: one per download and one per metrics fetch in each direction (and, for
    // sending, the start-up probe's, one per cipher and start).
    let stat = std::fs::read_to_string(out.path().join("tls_stat")).unwrap();
    let count = |name: &str| -> u64 {
        stat.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok())).unwrap_or(0)
    };
    assert!(count("TlsTxSw") >= 2 * cases.len() as u64, "{stat}");
    assert!(count("TlsRxSw") >= 2 * cases.len() as u64, "{stat}");
    assert_eq!(count("TlsCurrTxSw"), 0, "every session ended: {stat}");

    // A kernel without ChaCha20: a client that offers only ChaCha20 is served in user space, byte-exact, and
    // `tls.ktls = off` serves everyone in user space.
    for case in fallbacks {
        let body = std::fs::read(out.path().join(format!("body-{case}"))).unwrap();
        assert_eq!(sha256_hex(&body), sha256_hex(&fallback_object), "{case}");
        // The same accounting sees the user-space copies: each body byte read from the blob, then written.
        let trace = std::fs::read_to_string(out.path().join(format!("strace-{case}.txt"))).unwrap();
        let (sendfile, copied) = socket_copies(&trace);
        assert_eq!(sendfile, 0, "{case}");
        let len = fallback_object.len() as u64;
        assert!(copied >= 2 * len, "{case}: {copied} bytes copied for a {len} byte body");
        let metrics = std::fs::read_to_string(out.path().join(format!("metrics-{case}"))).unwrap();
        assert!(metric_value(&metrics, r#"blobgate_tls_connections_total{mode="userspace"}"#) >= 1.0, "{case}");
    }
    // The client's TLS 1.3 KeyUpdate between two requests: where the kernel takes new receive keys the second
    // request is answered; where it cannot (Debian 12's 6.1), the connection closes after the first, counted.
    let sent = std::fs::read_to_string(out.path().join("sclient-keyupdate13")).unwrap();
    assert!(sent.contains("KEYUPDATE"), "s_client sent no KeyUpdate: {sent}");
    let answers = std::fs::read(out.path().join("body-keyupdate13")).unwrap();
    let first = find(&answers, b"HTTP/1.1 206").expect("the request before the KeyUpdate was answered");
    let body_at = first + find(&answers[first..], b"\r\n\r\n").unwrap() + 4;
    assert_eq!(&answers[body_at..body_at + 100], &object[..100]);
    let answered = String::from_utf8_lossy(&answers).matches("HTTP/1.1 206").count();
    let metrics = std::fs::read_to_string(out.path().join("metrics-keyupdate13")).unwrap();
    let closes = metric_value(&metrics, "blobgate_tls_key_update_closes_total");
    assert_eq!((closes, answered), if closes == 0.0 { (0.0, 2) } else { (1.0, 1) }, "{metrics}");
    let chacha = std::fs::read_to_string(out.path().join("metrics-chacha")).unwrap();
    assert_eq!(metric_value(&chacha, r#"blobgate_tls_connections_total{mode="ktls"}"#), 1.0, "the metrics fetch");
    let off = std::fs::read_to_string(out.path().join("metrics-full13-off")).unwrap();
    assert_eq!(metric_value(&off, r#"blobgate_tls_connections_total{mode="ktls"}"#), 0.0);
}

#[test]
fn a_paced_download_over_user_space_tls_goes_no_faster_than_its_limit_and_every_byte_arrives() {
    let (env, pki) = (TestEnv::new(), https_pki());
    env.bucket("bkt", false);
    let bytes = test_bytes(12 << 20, 48);
    env.put_bytes("bkt", "big", &bytes, &[]);
    let token = env.token("bkt", "read", &[]);
    let id = token_id_in(&env.ok(&["token", "list"]), &token);
    env.ok(&["limits", "set", &format!("token:{id}"), "--read", "4MiB/s", "--read-burst", "1MiB"]);
    let server = serve_https(&env, &pki, "ecdsa", &[]);
    let started = std::time::Instant::now();
    let body = curl(&pki, &["-H", &format!("Authorization: Bearer {token}"), &url(server.data, "/bkt/big")]);
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(sha256_hex(&body), sha256_hex(&bytes), "every byte");
    // 11 MiB beyond the 1 MiB burst at 4 MiB/s: 2.75 s at the least.
    assert!(secs >= 2.6, "{secs:.2} s for 12 MiB: faster than 4 MiB/s");
    let paced =
        metric_value(&https_metrics(&pki, &server), "blobgate_paced_bytes_total{direction=\"read\",scope=\"token\"}");
    assert_eq!(paced, bytes.len() as f64, "every body byte paced");
}
