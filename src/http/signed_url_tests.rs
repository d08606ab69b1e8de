//! Signed URLs through the chain the data listener runs: the driver's head parser, the one percent-decode of the
//! path, query parsing and HMAC verification. It spans three layers, so it lives here, above them.

use crate::auth::presign::{self, PresignParams, SignedFields};
use crate::auth::{AuthError, Credentials, credentials};
use crate::driver::head::{HeadLimits, Parsed, parse_request_head};
use crate::names::parse_object_path;

/// What the server's chain (head parser, one percent-decode, query parsing, HMAC verification) makes of a
/// request target: `Ok` with the signed fields it verified, or the error it answers.
fn verified(target: &[u8], secret: &[u8]) -> Result<(String, String, PresignParams), &'static str> {
    let limits = HeadLimits {
        max_head_bytes: 8192,
        max_headers: 16,
        max_uri_bytes: 4096,
        bodies: crate::driver::head::Bodies::Never,
    };
    let mut raw = b"GET ".to_vec();
    raw.extend_from_slice(target);
    raw.extend_from_slice(b" HTTP/1.1\r\nHost: h\r\n\r\n");
    let Ok(Parsed::Complete(head)) = parse_request_head(&raw, &limits) else { return Err("bad head") };
    let (bucket, key) = parse_object_path(head.path()).map_err(|_| "bad path")?;
    match credentials(&head.fields, head.query()) {
        Ok(Credentials::Presigned(p)) if p.verify(secret, bucket.as_str(), key.as_str()) => {
            Ok((bucket.to_string(), key.to_string(), p))
        }
        Ok(Credentials::Presigned(_)) => Err("signature does not verify"),
        Ok(_) => Err("not signed"),
        Err(AuthError::BadRequest(_)) => Err("400"),
        Err(_) => Err("401"),
    }
}

fn signed_target(secret: &[u8], disposition: Option<&str>) -> String {
    let fields = SignedFields {
        method: "GET",
        bucket: "bkt",
        key: "dir/file name+ü.bin",
        expires: 2_000_000_000,
        key_id: "k0a1b2c3d",
        response_disposition: disposition,
    };
    let url = presign::build_url("http://h", &fields, &presign::sign(secret, &fields));
    url.strip_prefix("http://h").unwrap().to_owned()
}

/// Every single-byte mutation of a signed URL's request target, with and without a signed override, is
/// refused by the chain the server runs, unless it is the same request spelled differently (e.g. `%2F` as
/// `%2f`), which the check confirms by comparing every signed field.
#[test]
fn every_single_byte_mutation_of_a_signed_url_is_rejected() {
    let secret = [7u8; 32];
    for disposition in [Some("attachment"), None] {
        let target = signed_target(&secret, disposition);
        let original = verified(target.as_bytes(), &secret).expect("the untouched URL verifies");
        let (mut tried, mut equivalent) = (0, 0);
        for i in 0..target.len() {
            for b in 0..=255u8 {
                if b == target.as_bytes()[i] {
                    continue;
                }
                let mut mutated = target.clone().into_bytes();
                mutated[i] = b;
                tried += 1;
                if let Ok(got) = verified(&mutated, &secret) {
                    let same = got.0 == original.0
                        && got.1 == original.1
                        && got.2.expires == original.2.expires
                        && got.2.key_id == original.2.key_id
                        && got.2.response_disposition == original.2.response_disposition;
                    assert!(same, "mutation at {i} to {b:#04x} was accepted with different fields: {got:?}");
                    equivalent += 1;
                }
            }
        }
        assert!(tried > 20_000);
        // Only re-spellings of percent-escapes (hex digit case) may pass, and they are the same request.
        let escapes = target.matches('%').count();
        assert!(equivalent <= 2 * escapes, "{equivalent} equivalent mutations for {escapes} escapes");
    }
}

/// Whole parameters appended, duplicated, emptied or dropped: none is accepted, and an empty override is a
/// 400 whether or not the link signed one (the stripped-`attachment` attack of issue 12).
#[test]
fn appended_duplicated_and_empty_parameters_of_a_signed_url_are_rejected() {
    let secret = [7u8; 32];
    for disposition in [Some("attachment"), None] {
        let target = signed_target(&secret, disposition);
        assert!(verified(target.as_bytes(), &secret).is_ok());
        let (path, query) = target.split_once('?').unwrap();
        let params: Vec<&str> = query.split('&').collect();
        let mut cases: Vec<(String, Option<&str>)> = Vec::new();
        for name in ["response-content-disposition", "response-content-type", "response-cache-control"] {
            cases.push((format!("{target}&{name}="), Some("400")));
            cases.push((format!("{target}&{name}"), Some("400")));
            cases.push((format!("{path}?{name}=&{query}"), Some("400")));
        }
        for value in ["inline", "attachment", "attachment;%20filename%3D%22x.html%22"] {
            cases.push((format!("{target}&response-content-disposition={value}"), None));
        }
        // Invalid (400), or repeated when the link signed one (401).
        cases.push((format!("{target}&response-content-disposition=attachment;"), None));
        for (i, param) in params.iter().enumerate() {
            let (name, _) = param.split_once('=').unwrap();
            let others = |replacement: Option<String>| {
                let mut q: Vec<String> = params.iter().map(|p| p.to_string()).collect();
                match replacement {
                    Some(r) => q[i] = r,
                    None => drop(q.remove(i)),
                }
                format!("{path}?{}", q.join("&"))
            };
            cases.push((format!("{target}&{param}"), None));
            cases.push((format!("{path}?{param}&{query}"), None));
            let emptied = if name.starts_with("response-") { Some("400") } else { None };
            cases.push((others(Some(format!("{name}="))), emptied));
            cases.push((others(None), None));
        }
        for (case, want) in &cases {
            let got = verified(case.as_bytes(), &secret);
            assert!(got.is_err(), "{case} was accepted: {got:?}");
            if let Some(want) = want {
                assert_eq!(got.unwrap_err(), *want, "{case}");
            }
        }
        assert!(cases.len() > 20);
    }
}
