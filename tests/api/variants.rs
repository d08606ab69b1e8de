//! Precompressed variants on the wire: negotiation from Accept-Encoding, per-variant ETags and Repr-Digest,
//! ranges over the encoded bytes, Vary on every answer of an object with variants, and curl `--compressed` as a
//! real client whose decoded bytes are the original.

use std::io::Read;
use std::process::Command;

use crate::helpers::*;

fn brotli_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::Decompressor::new(bytes, 4096).read_to_end(&mut out).unwrap();
    out
}

fn gzip_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).unwrap();
    out
}

fn script() -> Vec<u8> {
    (0..3000).map(|i| format!("export const value{i} = {i} * 7; // the {i}th value\n")).collect::<String>().into_bytes()
}

#[test]
fn get_negotiates_the_variant_and_each_has_its_own_validators() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    let original = script();
    env.put_bytes("pub", "app.js", &original, &["--precompress"]);
    env.put_bytes("pub", "plain.js", &original, &[]);
    let server = env.serve();
    let identity_etag = format!("\"{}\"", sha256_hex(&original));

    let plain = server.get("/pub/app.js", &[]);
    assert_eq!(plain.status, 200);
    assert!(plain.body == original, "no Accept-Encoding: the identity bytes");
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(plain.header("vary"), Some("Accept-Encoding"));
    assert_eq!(plain.header("etag"), Some(identity_etag.as_str()));

    let br = server.get("/pub/app.js", &[("Accept-Encoding", "gzip, deflate, br")]);
    assert_eq!(br.status, 200);
    assert_eq!(br.header("content-encoding"), Some("br"));
    assert_eq!(br.header("vary"), Some("Accept-Encoding"));
    assert!(br.body.len() < original.len() / 4, "{} bytes", br.body.len());
    assert_eq!(br.header("content-length"), Some(br.body.len().to_string().as_str()), "the encoded length");
    assert!(brotli_decode(&br.body) == original);
    let br_etag = format!("\"{}\"", sha256_hex(&br.body));
    assert_eq!(br.header("etag"), Some(br_etag.as_str()), "the variant blob's own strong ETag");
    assert_eq!(br.header("repr-digest"), Some(repr_digest(&br.body).as_str()), "over the encoded bytes");

    let gz = server.get("/pub/app.js", &[("Accept-Encoding", "GZIP;q=0.9, br;q=0.5")]);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    assert!(gzip_decode(&gz.body) == original);
    let gz_etag = format!("\"{}\"", sha256_hex(&gz.body));
    assert_eq!(gz.header("etag"), Some(gz_etag.as_str()));
    assert!(gz_etag != br_etag && gz_etag != identity_etag);

    // An impossible negotiation gets identity (not 406).
    let refused = server.get("/pub/app.js", &[("Accept-Encoding", "identity;q=0, *;q=0")]);
    assert_eq!((refused.status, refused.header("content-encoding")), (200, None));
    assert!(refused.body == original);

    // Ranges are over the encoded bytes.
    let part = server.get("/pub/app.js", &[("Accept-Encoding", "br"), ("Range", "bytes=10-99")]);
    assert_eq!(part.status, 206);
    assert_eq!(part.header("content-encoding"), Some("br"));
    assert!(part.body == br.body[10..100]);
    assert_eq!(part.header("content-range"), Some(format!("bytes 10-99/{}", br.body.len()).as_str()));
    let several = server.get("/pub/app.js", &[("Accept-Encoding", "br"), ("Range", "bytes=0-1,1000-1001")]);
    assert_eq!(several.status, 200, "several ranges of a variant: the whole variant");
    assert!(several.body == br.body);

    // If-None-Match compares with the selected representation's ETag.
    let hit = server.get("/pub/app.js", &[("Accept-Encoding", "br"), ("If-None-Match", &br_etag)]);
    assert_eq!(hit.status, 304);
    assert_eq!(hit.header("etag"), Some(br_etag.as_str()));
    assert_eq!(hit.header("vary"), Some("Accept-Encoding"));
    let other = server.get("/pub/app.js", &[("Accept-Encoding", "br"), ("If-None-Match", &gz_etag)]);
    assert_eq!((other.status, other.header("content-encoding")), (200, Some("br")), "another variant's tag");
    let either = format!("{gz_etag}, {br_etag}");
    let listed = server.get("/pub/app.js", &[("Accept-Encoding", "gzip"), ("If-None-Match", &either)]);
    assert_eq!((listed.status, listed.header("etag")), (304, Some(gz_etag.as_str())));
    let stale = server.get("/pub/app.js", &[("If-None-Match", &br_etag)]);
    assert_eq!(stale.status, 200, "identity selected: the br tag does not match it");

    // 412 and 416 vary too, and 416 names the encoded length.
    let failed = server.get("/pub/app.js", &[("Accept-Encoding", "br"), ("If-Match", "\"nope\"")]);
    assert_eq!((failed.status, failed.header("vary")), (412, Some("Accept-Encoding")));
    let beyond = server.get("/pub/app.js", &[("Accept-Encoding", "br"), ("Range", "bytes=999999-")]);
    assert_eq!((beyond.status, beyond.header("vary")), (416, Some("Accept-Encoding")));
    assert_eq!(beyond.header("content-range"), Some(format!("bytes */{}", br.body.len()).as_str()));
    assert_eq!(beyond.header("content-encoding"), None, "the error body is not encoded");

    // HEAD answers what the GET would.
    let head = server.request("HEAD", "/pub/app.js", &[("Accept-Encoding", "br")]);
    assert_eq!(head.header("content-length"), Some(br.body.len().to_string().as_str()));
    assert_eq!(head.header("content-encoding"), Some("br"));

    // An object without variants neither varies nor encodes.
    let none = server.get("/pub/plain.js", &[("Accept-Encoding", "br")]);
    assert_eq!((none.header("vary"), none.header("content-encoding")), (None, None));

    // A replace without variants drops them, seen by the running server.
    env.put_bytes("pub", "app.js", b"replaced", &[]);
    assert!(wait_for(std::time::Duration::from_secs(30), || {
        let r = server.get("/pub/app.js", &[("Accept-Encoding", "br")]);
        r.body == b"replaced" && r.header("vary").is_none()
    }));
}

#[test]
fn curl_compressed_decodes_every_variant_to_the_original() {
    require_tool("curl", "apt package curl");
    let env = TestEnv::new();
    env.bucket("pub", true);
    let original = script();
    env.put_bytes("pub", "app.js", &original, &["--precompress"]);
    let server = env.serve();
    let url = format!("http://{}/pub/app.js", server.data);
    for (accept, coding) in [(None, "any"), (Some("br"), "br"), (Some("gzip"), "gzip"), (Some("identity"), "")] {
        let out_path = env.dir.path().join("out.js");
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--fail", "--compressed", "-D", "-", "-o", out_path.to_str().unwrap()]);
        if let Some(a) = accept {
            cmd.args(["-H", &format!("Accept-Encoding: {a}")]);
        }
        let out = cmd.arg(&url).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
        match coding {
            // curl's own Accept-Encoding: br when it was built with brotli, else gzip.
            "any" => {
                assert!(head.contains("content-encoding: br") || head.contains("content-encoding: gzip"), "{head}")
            }
            "" => assert!(!head.contains("content-encoding"), "{head}"),
            coding => assert!(head.contains(&format!("content-encoding: {coding}")), "{accept:?}: {head}"),
        }
        assert!(std::fs::read(&out_path).unwrap() == original, "{accept:?}: decoded bytes differ");
    }
}
