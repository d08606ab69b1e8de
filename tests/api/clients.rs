//! Real clients against the real server, byte-exact on a 48 MiB object: curl resuming (`-C -`), wget resuming
//! (`-c`), aria2c over eight connections (`-x8 -s8`), and REDbot's HTTP lint. `scripts/test` installs them.

use std::path::Path;
use std::process::Command;

use crate::helpers::s3::run_ok;
use crate::helpers::*;

const SIZE: usize = 48 << 20;

/// A private bucket with a 48 MiB object and a read token; returns (env, content, token).
fn setup() -> (TestEnv, Vec<u8>, String) {
    let env = TestEnv::new();
    env.bucket("dls", false);
    let bytes = test_bytes(SIZE, 48);
    env.put_bytes("dls", "pkg/big.bin", &bytes, &[]);
    let token = env.token("dls", "read", &[]);
    (env, bytes, token)
}

fn same_file(path: &Path, expected: &[u8]) {
    let got = std::fs::read(path).expect("downloaded file");
    assert_eq!(got.len(), expected.len(), "downloaded length");
    assert!(got == expected, "downloaded bytes differ");
}

#[test]
fn curl_resumes_a_partial_download() {
    require_tool("curl", "apt package curl");
    let (env, bytes, token) = setup();
    let server = env.serve();
    let out = env.dir.path().join("curl.bin");
    // What an interrupted download leaves behind: the first 10 MB.
    std::fs::write(&out, &bytes[..10_000_000]).unwrap();
    let url = format!("http://{}/dls/pkg/big.bin", server.data);
    run_ok(
        Command::new("curl")
            .args(["-sS", "--fail", "-C", "-", "-H", &format!("Authorization: Bearer {token}")])
            .arg("-o")
            .arg(&out)
            .arg(&url),
    );
    same_file(&out, &bytes);
}

#[test]
fn wget_resumes_a_partial_download() {
    require_tool("wget", "apt package wget");
    let (env, bytes, token) = setup();
    let server = env.serve();
    let out = env.dir.path().join("wget.bin");
    std::fs::write(&out, &bytes[..(SIZE / 3)]).unwrap();
    let url = format!("http://{}/dls/pkg/big.bin", server.data);
    run_ok(
        Command::new("wget")
            .args(["-q", "-c", "--header", &format!("Authorization: Bearer {token}"), "-O"])
            .arg(&out)
            .arg(&url),
    );
    same_file(&out, &bytes);
}

#[test]
fn aria2c_downloads_over_eight_connections() {
    require_tool("aria2c", "apt package aria2");
    let (env, bytes, _) = setup();
    let server = env.serve();
    // A signed URL this time, so multi-connection clients work without headers too.
    let base = format!("http://{}", server.data);
    let url = env.ok(&["presign", "dls", "pkg/big.bin", "--expires-in", "600", "--base-url", &base]);
    let dir = env.dir.path().join("aria");
    run_ok(
        Command::new("aria2c")
            .args(["-q", "-x8", "-s8", "-k1M", "--file-allocation=none", "--allow-overwrite=true"])
            .args(["--auto-file-renaming=false", "-o", "big.bin", "-d"])
            .arg(&dir)
            .arg(url.trim()),
    );
    same_file(&dir.join("big.bin"), &bytes);
    // Eight connections means ranged requests: the server must have answered 206s.
    assert!(server.metrics().contains("blobgate_responses_total{class=\"2xx\",kind=\"range\"}"), "no 206 was served");
}

#[test]
fn redbot_finds_nothing_bad_or_worth_a_warning() {
    require_tool("redbot", "pip package redbot");
    let env = TestEnv::new();
    env.bucket("web", true);
    // Last-Modified in the past, as for any real object (REDbot checks it against Date): stored an hour ago.
    let attrs = blobgate::names::parse_attrs(None, Some("max-age=3600".into()), None).unwrap();
    let an_hour_ago = blobgate::store::unix_now() - 3600;
    env.put_modified_at("web", "static/app.js", &test_bytes(100_000, 7), attrs, an_hour_ago);
    let server = env.serve();
    let url = format!("http://{}/web/static/app.js", server.data);
    let out = Command::new("redbot").args(["-o", "har", &url]).output().expect("run redbot");
    assert!(out.status.success(), "redbot failed: {}", String::from_utf8_lossy(&out.stderr));
    let har: serde_json::Value = serde_json::from_slice(&out.stdout).expect("HAR output");
    let notes = har["log"]["entries"][0]["_red_messages"].as_array().expect("REDbot notes").clone();
    assert!(notes.len() > 5, "REDbot checked too little: {notes:?}");
    let bad: Vec<_> = notes.iter().filter(|n| n["level"] == "BAD" || n["level"] == "WARN").collect();
    assert!(bad.is_empty(), "REDbot notes: {bad:#?}");
    for expected in ["INM_304", "IMS_304", "RANGE_CORRECT", "CL_CORRECT"] {
        assert!(notes.iter().any(|n| n["note_id"] == expected), "REDbot did not confirm {expected}: {notes:?}");
    }
}
