//! Day-two operations (issue 26): every documented metric series from start-up, upload counters, the JSON process
//! log, quiet sqlx, and the access log's file mode.

use std::os::unix::fs::PermissionsExt;

use crate::helpers::*;

/// Names in the docs that look like series but are not (the PostgreSQL change feed's channel).
const NOT_SERIES: [&str; 1] = ["blobgate_changes"];

/// Series that exist only on an HTTPS server (a timestamp has no honest value without a certificate); their
/// values are asserted in `https::`.
const HTTPS_ONLY: [&str; 1] = ["blobgate_tls_certificate_expiry_timestamp_seconds"];

fn doc(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).expect(path)
}

/// README.md, ARCHITECTURE.md and every `docs/*.md`, one after the other.
fn all_docs() -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs");
    let mut pages: Vec<_> = std::fs::read_dir(dir).expect("docs/").map(|e| e.expect("docs/ entry").path()).collect();
    pages.retain(|p| p.extension().is_some_and(|e| e == "md"));
    pages.sort();
    let mut text = doc("README.md") + &doc("ARCHITECTURE.md");
    for page in pages {
        text += &std::fs::read_to_string(&page).expect("a docs page");
    }
    text
}

/// Every `blobgate_*` word in `text`.
fn series_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("blobgate_") {
        let name: String =
            rest[at..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit()).collect();
        rest = &rest[at + name.len()..];
        if !NOT_SERIES.contains(&name.as_str()) {
            names.insert(name);
        }
    }
    names
}

#[test]
fn every_series_the_docs_name_is_on_metrics_from_start_up() {
    let operations = doc("docs/operations.md");
    let start = operations.find("- Prometheus series (`/metrics`)").expect("the series list in docs/operations.md");
    let end = start + operations[start..].find("\n\n").expect("the paragraph after it");
    let listed = series_names(&operations[start..end]);
    let mentioned = series_names(&all_docs());
    assert!(listed.len() >= 30, "{listed:?}");
    let unlisted: Vec<_> = mentioned.difference(&listed).collect();
    assert!(unlisted.is_empty(), "named in the docs but not in docs/operations.md's series list: {unlisted:?}");

    let env = TestEnv::new();
    let server = env.serve();
    let metrics = server.metrics();
    let exposed: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(|name| name.trim_end_matches("_bucket").trim_end_matches("_count").trim_end_matches("_sum"))
        .collect();
    let missing: Vec<_> =
        listed.iter().filter(|name| !exposed.contains(name.as_str()) && !HTTPS_ONLY.contains(&name.as_str())).collect();
    assert!(missing.is_empty(), "documented but not on /metrics at start-up: {missing:?}\n{metrics}");
    // Labelled series exist for every bounded label value, at 0.
    for line in [
        "blobgate_responses_total{class=\"2xx\",kind=\"full\"} 0",
        "blobgate_auth_failures_total{reason=\"revoked\"} 0",
        "blobgate_uploads_total{api=\"native\",result=\"stored\"} 0",
        "blobgate_uploads_total{api=\"s3\",result=\"refused\"} 0",
        "blobgate_upload_bytes_total 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} missing:\n{metrics}");
    }
}

#[test]
fn native_uploads_are_counted_by_result_with_the_bytes_stored() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let writer = env.token("bkt", "write", &[]);
    let reader = env.token("bkt", "read", &[]);
    let server = env.serve_with(&[("BLOBGATE_LIMITS__MAX_UPLOAD_BYTES", "1000")], &[]);
    assert_eq!(server.put("/bkt/a", &writer, &[7u8; 600], &[]).status, 201);
    assert_eq!(server.put("/bkt/b", &writer, &[7u8; 400], &[]).status, 201);
    assert_eq!(server.put("/bkt/c", &writer, &[7u8; 2000], &[]).status, 413);
    assert_eq!(server.put("/bkt/d", &reader, b"no", &[]).status, 403);
    let counted = |result: &str| {
        let line = format!("blobgate_uploads_total{{api=\"native\",result=\"{result}\"}} ");
        let metrics = server.metrics();
        metrics.lines().find_map(|l| l.strip_prefix(line.as_str())).map(|v| v.parse::<f64>().unwrap())
    };
    assert_eq!(counted("stored"), Some(2.0));
    assert_eq!(counted("refused"), Some(2.0));
    assert_eq!(counted("failed"), Some(0.0));
    assert_eq!(server.metric("blobgate_upload_bytes_total"), 1000.0);
}

#[test]
fn log_format_json_writes_one_json_object_a_line() {
    let env = TestEnv::new();
    env.bucket("bkt", true);
    env.put_bytes("bkt", "k", b"hello", &[]);
    let mut server = env.serve_with(&[("BLOBGATE_LOG_FORMAT", "json")], &[]);
    assert_eq!(server.get("/bkt/k", &[]).status, 200);
    server.stop();
    let log = server.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}\n{log}")))
        .collect();
    let serving = lines.iter().find(|l| l["message"] == "blobgate is serving").expect("the start line");
    assert_eq!(serving["level"], "INFO");
    assert_eq!(serving["target"], "blobgate::startup");
    assert!(serving["data"].as_str().is_some_and(|a| a.starts_with("127.0.0.1:")), "{serving}");
    assert!(serving["timestamp"].is_string(), "{serving}");
    assert!(lines.iter().any(|l| l["message"] == "stopped"), "{log}");

    // A bad value is refused at start, naming the key.
    let out = env.cli_env(&["serve"], &[("BLOBGATE_LOG_FORMAT", "yaml")]);
    let err = one_line_error(&out, &["serve"]);
    assert!(err.contains("log_format") && err.contains("yaml"), "{err}");
}

#[test]
fn the_access_log_is_created_with_access_log_mode_and_an_existing_file_keeps_its_own() {
    let env = TestEnv::new();
    env.bucket("bkt", true);
    env.put_bytes("bkt", "k", b"hello", &[]);
    let logs = env.dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let mode_of = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;

    // The default, under the process's own umask of 077.
    let fresh = logs.join("access.log");
    let mut server = env.serve_with(&[("BLOBGATE_ACCESS_LOG", fresh.to_str().unwrap())], &[]);
    assert_eq!(server.get("/bkt/k", &[]).status, 200);
    server.stop();
    assert_eq!(mode_of(&fresh), 0o640, "a shipper in the file's group can read it");
    assert!(std::fs::read_to_string(&fresh).unwrap().contains("\"path\":\"/bkt/k\""));

    // Another mode; an existing file is left as it is.
    let other = logs.join("other.log");
    let mut server =
        env.serve_with(&[("BLOBGATE_ACCESS_LOG", other.to_str().unwrap()), ("BLOBGATE_ACCESS_LOG_MODE", "0644")], &[]);
    server.stop();
    assert_eq!(mode_of(&other), 0o644);
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut server = env.serve_with(&[("BLOBGATE_ACCESS_LOG", fresh.to_str().unwrap())], &[]);
    server.stop();
    assert_eq!(mode_of(&fresh), 0o600, "the operator's mode stays");

    for bad in ["0400", "0999", "rw-r-----", "01777"] {
        let out = env.cli_env(&["serve"], &[("BLOBGATE_ACCESS_LOG_MODE", bad)]);
        let err = one_line_error(&out, &["serve"]);
        assert!(err.contains("access_log_mode"), "{bad}: {err}");
    }
}

/// S3 uploads (PutObject, UploadPart) are counted like native ones, by boto3's requests; copies are not uploads.
#[test]
fn s3_uploads_are_counted_by_result_with_the_bytes_stored() {
    use crate::helpers::s3::{key_json, run_boto3, s3_key};
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve_with(&[("BLOBGATE_ACCESS_LOG", env.dir.path().join("a.log").to_str().unwrap())], &[]);
    let script = r#"
s3 = client(spec["endpoint"], spec["key"])
out = {}
out["put"] = code(lambda: s3.put_object(Bucket="bkt", Key="a", Body=b"x" * 1000))
out["bad_md5"] = code(lambda: s3.put_object(Bucket="bkt", Key="b", Body=b"y" * 10, ContentMD5="AAAAAAAAAAAAAAAAAAAAAA=="))
up = s3.create_multipart_upload(Bucket="bkt", Key="m")["UploadId"]
parts = []
for n, size in [(1, 5 << 20), (2, 7)]:
    etag = s3.upload_part(Bucket="bkt", Key="m", UploadId=up, PartNumber=n, Body=b"z" * size)["ETag"]
    parts.append({"PartNumber": n, "ETag": etag})
s3.complete_multipart_upload(Bucket="bkt", Key="m", UploadId=up, MultipartUpload={"Parts": parts})
out["copy"] = code(lambda: s3.copy_object(Bucket="bkt", Key="c", CopySource={"Bucket": "bkt", "Key": "a"}))
print(json.dumps(out))
"#;
    let spec = serde_json::json!({"endpoint": format!("http://{}", server.admin), "key": key_json(&key)});
    let out = run_boto3(&env.dir.path().join("home"), script, &spec);
    assert_eq!(out["put"], serde_json::json!([200, ""]), "{out}");
    assert_eq!(out["bad_md5"][0], 400, "{out}");
    assert_eq!(out["copy"], serde_json::json!([200, ""]), "{out}");
    let metrics = server.metrics();
    let counted = |result: &str| {
        let line = format!("blobgate_uploads_total{{api=\"s3\",result=\"{result}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(line.as_str())).map(|v| v.parse::<f64>().unwrap())
    };
    assert_eq!(counted("stored"), Some(3.0), "one PutObject and two UploadParts:\n{metrics}");
    // botocore sends a PUT refused with BadDigest again: each request is counted.
    let read_log = || std::fs::read_to_string(env.dir.path().join("a.log")).unwrap_or_default();
    // The writer flushes every 100 ms: wait for the last request's line.
    assert!(wait_for(std::time::Duration::from_secs(30), || read_log().contains(r#""path":"/bkt/c""#)));
    let log = read_log();
    let refused_puts = log.lines().filter(|l| l.contains(r#""method":"PUT","path":"/bkt/b""#)).count();
    assert!(refused_puts >= 1, "{log}");
    // Refused after its signature verified: the line still names the key.
    let named = format!(r#""principal":"{}""#, key.id);
    let refused = log.lines().filter(|l| l.contains(r#""method":"PUT","path":"/bkt/b""#));
    assert!(refused.clone().all(|l| l.contains(&named)), "a BadDigest upload's line names its key ({named}):\n{log}");
    assert_eq!(counted("refused"), Some(refused_puts as f64), "the bad Content-MD5s:\n{log}");
    assert_eq!(server.metric("blobgate_upload_bytes_total"), (1000 + (5 << 20) + 7) as f64);
}
