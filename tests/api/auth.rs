//! Authorisation over the wire: bearer tokens (scope × bucket × prefix × expiry × revocation), anonymous and
//! public access, malformed credentials, and signed URLs (tampering, expiry, key rotation and retirement,
//! single-URL revocation, signed Content-Disposition).

use std::time::Duration;

use crate::helpers::*;

/// Buckets `alpha` and `beta` (private) and `open` (public) with a few objects.
struct World {
    env: TestEnv,
    x: Vec<u8>,
}

fn world() -> World {
    let env = TestEnv::new();
    env.bucket("alpha", false);
    env.bucket("beta", false);
    env.bucket("open", true);
    let x = test_bytes(4000, 1);
    env.put_bytes("alpha", "pub/x", &x, &[]);
    env.put_bytes("alpha", "priv/y", b"y", &[]);
    env.put_bytes("alpha", "pubx", b"not under pub/", &[]);
    env.put_bytes("beta", "pub/x", b"beta's x", &[]);
    env.put_bytes("open", "o", b"open", &[]);
    World { env, x }
}

fn assert_401(r: &Response, what: &str) {
    assert_eq!(r.status, 401, "{what}: {}", String::from_utf8_lossy(&r.body));
    assert_json_error(r, 401, "unauthorized");
    let challenge = r.header("www-authenticate").unwrap_or_else(|| panic!("{what}: no WWW-Authenticate"));
    assert!(challenge.starts_with("Bearer"), "{what}: {challenge}");
}

#[test]
fn token_scope_bucket_and_prefix_matrix() {
    let w = world();
    let env = &w.env;
    let read = env.token("alpha", "read", &[]);
    let write = env.token("alpha", "write", &[]);
    let admin = env.token("alpha", "admin", &[]);
    let prefixed = env.token("alpha", "read", &["--prefix", "pub/"]);
    let beta = env.token("beta", "read", &[]);
    let server = env.serve();

    let whole_bucket: &[(&str, u16)] = &[
        ("/alpha/pub/x", 200),
        ("/alpha/priv/y", 200),
        ("/alpha/missing", 404),
        ("/beta/pub/x", 403),
        ("/gamma/pub/x", 403),
        ("/open/o", 200),
    ];
    let mut table: Vec<(&str, &str, &str, u16)> = Vec::new();
    for (name, token) in [("read", &read), ("write", &write), ("admin", &admin)] {
        table.extend(whole_bucket.iter().map(|(p, s)| (name, token.as_str(), *p, *s)));
    }
    table.extend([
        ("prefix", prefixed.as_str(), "/alpha/pub/x", 200),
        ("prefix", prefixed.as_str(), "/alpha/pub/missing", 404),
        ("prefix", prefixed.as_str(), "/alpha/priv/y", 403),
        // Outside the prefix, absence is not revealed.
        ("prefix", prefixed.as_str(), "/alpha/priv/missing", 403),
        ("prefix", prefixed.as_str(), "/alpha/pubx", 403),
        ("prefix", prefixed.as_str(), "/beta/pub/x", 403),
        ("beta", beta.as_str(), "/beta/pub/x", 200),
        ("beta", beta.as_str(), "/alpha/pub/x", 403),
        ("beta", beta.as_str(), "/alpha/missing", 403),
    ]);
    for (name, token, path, status) in table {
        let r = server.get_auth(path, token, &[]);
        let what = format!("{name} token GET {path}");
        assert_eq!(r.status, status, "{what}: {}", String::from_utf8_lossy(&r.body));
        match status {
            200 => {}
            403 => {
                assert_json_error(&r, 403, "forbidden");
                assert_eq!(r.header("www-authenticate"), None, "{what}: a 403 is not a challenge");
            }
            404 => assert_json_error(&r, 404, "not_found"),
            _ => unreachable!(),
        }
        let auth = format!("Bearer {token}");
        let head = server.request("HEAD", path, &[("Authorization", &auth)]);
        assert_eq!(head.status, status, "{name} token HEAD {path}");
    }
    let r = server.get_auth("/alpha/pub/x", &prefixed, &[]);
    assert!(r.body == w.x);
}

#[test]
fn anonymous_and_public_access() {
    let w = world();
    let server = w.env.serve();
    let r = server.get("/open/o", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"open");
    assert_401(&server.get("/alpha/pub/x", &[]), "anonymous on a private bucket");
    let head = server.request("HEAD", "/alpha/pub/x", &[]);
    assert_eq!(head.status, 401);
    assert!(head.header("www-authenticate").unwrap().starts_with("Bearer"));
    // Present key, absent key, absent bucket, and bad signed-URL parameters: one identical answer.
    let present = server.get("/alpha/pub/x", &[]);
    let bodies: Vec<Vec<u8>> =
        ["/alpha/missing", "/nosuchbucket/pub/x"].iter().map(|p| server.get(p, &[]).body).collect();
    for body in &bodies {
        assert_eq!(*body, present.body);
    }
    let bad_sig = "?bg-expires=9999999999&bg-key=k00000000&bg-sig=AAAA";
    let signed_present = server.get(&format!("/alpha/pub/x{bad_sig}"), &[]);
    let signed_absent = server.get(&format!("/nosuchbucket/pub/x{bad_sig}"), &[]);
    assert_401(&signed_present, "bad signature");
    assert_eq!(signed_present.body, signed_absent.body);
    assert_eq!(signed_present.status, signed_absent.status);
}

#[test]
fn malformed_and_repeated_authorization() {
    let w = world();
    let token = w.env.token("alpha", "read", &[]);
    let server = w.env.serve();
    let unknown_id = format!("bg_ffffffffffff_{}", &token[16..]);
    let wrong_secret = format!("{}{}", &token[..token.len() - 1], if token.ends_with('A') { 'B' } else { 'A' });
    for value in [
        "Basic x".to_owned(),
        "Bearer".to_owned(),
        "Bearer ".to_owned(),
        format!("Bearer {token} extra"),
        format!("Token {token}"),
        format!("Bearer{token}"),
        "Bearer not-a-token".to_owned(),
        format!("Bearer {unknown_id}"),
        format!("Bearer {wrong_secret}"),
    ] {
        let r = server.get("/alpha/pub/x", &[("Authorization", &value)]);
        assert_401(&r, &format!("Authorization: {value}"));
    }
    // RFC 9110 §11.6.2: one Authorization field only.
    let auth = format!("Bearer {token}");
    let r = server.get("/alpha/pub/x", &[("Authorization", &auth), ("Authorization", &auth)]);
    assert_json_error(&r, 400, "bad_request");
    // The scheme is case-insensitive (RFC 9110 §11.1).
    for scheme in ["bearer", "BEARER", "bEaReR"] {
        let r = server.get("/alpha/pub/x", &[("Authorization", &format!("{scheme} {token}"))]);
        assert_eq!(r.status, 200, "{scheme}");
        assert!(r.body == w.x);
    }
    // A token and a signed URL together are ambiguous.
    let url = w.env.ok(&["presign", "alpha", "pub/x", "--base-url", &format!("http://{}", server.data)]);
    let r = server.get(path_of_url(url.trim()), &[("Authorization", &auth)]);
    assert_json_error(&r, 400, "bad_request");
}

#[test]
fn expired_tokens_and_signed_urls_are_401() {
    let w = world();
    let env = &w.env;
    // Both made an hour ago with a lifetime of a minute, by the code `token create` and `presign` run: expired.
    let (hour, minute) = (Duration::from_secs(3600), Duration::from_secs(60));
    let token = env.token_made_ago("alpha", "read", hour, minute);
    let lasting = env.token("alpha", "read", &["--expires-in", "3600"]);
    let server = env.serve();
    let base = format!("http://{}", server.data);
    let url = env.presigned_ago("alpha", "pub/x", &base, hour, minute);
    let r = server.get_auth("/alpha/pub/x", &token, &[]);
    assert_401(&r, "expired token");
    assert_eq!(r.json()["message"], "token expired");
    let r = server.get(path_of_url(url.trim()), &[]);
    assert_401(&r, "expired signed URL");
    assert_eq!(r.json()["message"], "signed URL expired");
    assert_eq!(server.get_auth("/alpha/pub/x", &lasting, &[]).status, 200);
    // `token list` shows the state.
    let list = env.ok(&["token", "list"]);
    let states: Vec<String> = list
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["state"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(states.iter().filter(|s| *s == "expired").count(), 1, "{list}");
}

#[test]
fn revoked_tokens_are_refused_at_once_by_a_running_server() {
    let w = world();
    let env = &w.env;
    let token = env.token("alpha", "read", &[]);
    let other = env.token("alpha", "read", &[]);
    let server = env.serve();
    assert_eq!(server.get_auth("/alpha/pub/x", &token, &[]).status, 200);
    // Keep-alive connection opened before the revocation: no per-connection caching either.
    let mut conn = Conn::open(server.data);
    let auth = format!("Bearer {token}");
    conn.send(&raw_request("GET", "/alpha/pub/x", &[("Authorization", &auth)], false));
    assert_eq!(conn.read_response(false).unwrap().status, 200);

    let out = env.cli(&["token", "revoke", &token]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The very next request after `token revoke` returned is refused: no window at all, not a short one.
    let r = server.get_auth("/alpha/pub/x", &token, &[]);
    assert_401(&r, "revoked token");
    assert_eq!(r.json()["message"], "token revoked");
    conn.send(&raw_request("GET", "/alpha/pub/x", &[("Authorization", &auth)], true));
    assert_401(&conn.read_response(false).unwrap(), "revoked token on an old connection");
    // Other tokens are untouched; revoking by id works too; revoking twice is an error.
    assert_eq!(server.get_auth("/alpha/pub/x", &other, &[]).status, 200);
    let id = other.split('_').nth(1).unwrap();
    env.ok(&["token", "revoke", id]);
    assert_401(&server.get_auth("/alpha/pub/x", &other, &[]), "token revoked by id");
    let err = env.fails(&["token", "revoke", &token]);
    assert!(err.contains("no live token"), "{err}");
}

#[test]
fn token_list_never_prints_secrets() {
    let w = world();
    let env = &w.env;
    let tokens: Vec<String> = ["read", "write", "admin"].iter().map(|s| env.token("alpha", s, &[])).collect();
    for t in &tokens {
        assert!(t.starts_with("bg_") && t.len() == 3 + 12 + 1 + 43, "token format: {t}");
        assert_eq!(t.lines().count(), 1);
    }
    let list = env.ok(&["token", "list"]);
    assert_eq!(list.lines().count(), 3);
    for t in &tokens {
        let (id, secret) = t[3..].split_once('_').unwrap();
        assert!(list.contains(id), "the id is listed");
        assert!(!list.contains(secret), "a secret was printed: {list}");
        assert!(!list.contains(t.as_str()));
    }
    for line in list.lines() {
        let json: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(json["bucket"], "alpha");
        assert_eq!(json["state"], "live");
    }
}

/// A presigned URL's path and query for `bucket/key` against `server`.
fn presign(env: &TestEnv, server: &Server, bucket: &str, key: &str, extra: &[&str]) -> String {
    let base = format!("http://{}", server.data);
    let mut args = vec!["presign", bucket, key, "--base-url", &base];
    args.extend_from_slice(extra);
    let out = env.ok(&args);
    assert_eq!(out.lines().count(), 1, "presign prints the URL alone: {out:?}");
    let url = out.trim();
    assert!(url.starts_with(&base), "{url}");
    path_of_url(url).to_owned()
}

/// Replaces the value of query parameter `name` in `path`.
fn with_param(path: &str, name: &str, value: &str) -> String {
    let (p, q) = path.split_once('?').unwrap();
    let q: Vec<String> = q
        .split('&')
        .map(|kv| if kv.split('=').next() == Some(name) { format!("{name}={value}") } else { kv.to_owned() })
        .collect();
    format!("{p}?{}", q.join("&"))
}

fn param<'a>(path: &'a str, name: &str) -> &'a str {
    path.split_once('?').unwrap().1.split('&').find_map(|kv| kv.strip_prefix(&format!("{name}="))).unwrap()
}

#[test]
fn signed_urls_download_and_every_tampering_is_401() {
    let w = world();
    let env = &w.env;
    let odd = test_bytes(3000, 9);
    env.put_bytes("alpha", "dir/a b é.bin", &odd, &[]);
    let server = env.serve();
    let link = presign(env, &server, "alpha", "pub/x", &[]);
    let r = server.get(&link, &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == w.x);
    let odd_link = presign(env, &server, "alpha", "dir/a b é.bin", &[]);
    assert!(odd_link.starts_with("/alpha/dir/a%20b%20%C3%A9.bin?"), "{odd_link}");
    let r = server.get(&odd_link, &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == odd);
    // Ranges work with signed URLs too.
    let r = server.get(&link, &[("Range", "bytes=10-19")]);
    assert_eq!(r.status, 206);
    assert!(r.body == w.x[10..20]);

    // Every single-character change of the signature.
    let sig = param(&link, "bg-sig").to_owned();
    for i in 0..sig.len() {
        let mut chars: Vec<char> = sig.chars().collect();
        chars[i] = if chars[i] == 'A' { 'B' } else { 'A' };
        let tampered: String = chars.into_iter().collect();
        assert_401(&server.get(&with_param(&link, "bg-sig", &tampered), &[]), &format!("bg-sig char {i}"));
    }
    // Other bucket, other key (both exist), other expiry, other or unknown key id, missing or repeated params.
    let expires: i64 = param(&link, "bg-expires").parse().unwrap();
    let kid = param(&link, "bg-key").to_owned();
    let other_kid: serde_json::Value = serde_json::from_str(env.ok(&["signing", "rotate"]).trim()).unwrap();
    let tampered = [
        ("other bucket", link.replacen("/alpha/", "/beta/", 1)),
        ("other key", link.replacen("/pub/x?", "/priv/y?", 1)),
        ("key prefix", link.replacen("/pub/x?", "/pubx?", 1)),
        ("expiry +1", with_param(&link, "bg-expires", &(expires + 1).to_string())),
        ("expiry -1", with_param(&link, "bg-expires", &(expires - 1).to_string())),
        ("other key id", with_param(&link, "bg-key", other_kid["key_id"].as_str().unwrap())),
        ("unknown key id", with_param(&link, "bg-key", "kdeadbeef")),
        ("no signature", link.replace(&format!("&bg-sig={sig}"), "")),
        ("repeated signature", format!("{link}&bg-sig={sig}")),
        ("signature padded", with_param(&link, "bg-sig", &format!("{sig}="))),
        ("added disposition", format!("{link}&response-content-disposition=attachment")),
    ];
    for (what, path) in &tampered {
        assert_ne!(path, &link, "{what}: the tampering changed nothing");
        assert_401(&server.get(path, &[]), what);
    }
    assert_eq!(server.get(&link, &[]).status, 200, "the original still works");
    // A correctly signed link to an absent key: the signer had access, so a plain 404.
    let absent = presign(env, &server, "alpha", "nothing/here", &[]);
    assert_json_error(&server.get(&absent, &[]), 404, "not_found");
    let _ = kid;
}

#[test]
fn signing_keys_rotate_and_retire() {
    let w = world();
    let env = &w.env;
    let server = env.serve();
    let old = presign(env, &server, "alpha", "pub/x", &[]);
    let old_kid = param(&old, "bg-key").to_owned();
    let rotated: serde_json::Value = serde_json::from_str(env.ok(&["signing", "rotate"]).trim()).unwrap();
    let new_kid = rotated["key_id"].as_str().unwrap().to_owned();
    assert_ne!(new_kid, old_kid);
    let new = presign(env, &server, "alpha", "pub/x", &[]);
    assert_eq!(param(&new, "bg-key"), new_kid, "new links are signed with the newest key");
    assert_eq!(server.get(&old, &[]).status, 200, "old links survive a rotation");
    assert_eq!(server.get(&new, &[]).status, 200);
    let list = env.ok(&["signing", "list"]);
    assert_eq!(list.lines().count(), 2);
    assert!(!list.contains("secret"), "{list}");

    let out = env.cli(&["signing", "retire", &old_kid]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_401(&server.get(&old, &[]), "link signed with a retired key");
    let r = server.get(&new, &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == w.x);
    let err = env.fails(&["signing", "retire", &old_kid]);
    assert!(err.contains(&old_kid), "{err}");
    env.fails(&["signing", "retire", "knope"]);
}

#[test]
fn a_single_signed_url_can_be_revoked() {
    let w = world();
    let env = &w.env;
    let server = env.serve();
    let doomed = presign(env, &server, "alpha", "pub/x", &["--expires-in", "3600"]);
    let kept = presign(env, &server, "alpha", "pub/x", &["--expires-in", "3601"]);
    assert_ne!(doomed, kept);
    assert_eq!(server.get(&doomed, &[]).status, 200);
    let out = env.cli(&["signing", "revoke-url", &format!("http://{}{doomed}", server.data)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = server.get(&doomed, &[]);
    assert_401(&r, "revoked signed URL");
    assert_eq!(r.json()["message"], "signed URL revoked");
    let r = server.get(&kept, &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == w.x);
    one_line_error(&env.cli(&["signing", "revoke-url", "http://h/alpha/pub/x"]), &["signing", "revoke-url"]);
}

#[test]
fn signed_content_disposition_is_served_and_cannot_be_changed() {
    let w = world();
    let env = &w.env;
    let server = env.serve();
    let link = presign(env, &server, "alpha", "pub/x", &["--response-content-disposition", "attachment"]);
    assert_eq!(param(&link, "response-content-disposition"), "attachment");
    let r = server.get(&link, &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-disposition"), Some("attachment; filename=\"x\""));
    assert!(r.body == w.x);
    let full = presign(
        env,
        &server,
        "alpha",
        "pub/x",
        &["--response-content-disposition", "attachment; filename=\"report.bin\""],
    );
    assert_eq!(server.get(&full, &[]).header("content-disposition"), Some("attachment; filename=\"report.bin\""));
    // Characters that need escaping in a query survive the round trip.
    let odd = "attachment; filename=\"a+b c;d.bin\"";
    let odd_link = presign(env, &server, "alpha", "pub/x", &["--response-content-disposition", odd]);
    assert_eq!(server.get(&odd_link, &[]).header("content-disposition"), Some(odd));
    // Unrelated query parameters (cache busters) do not break a signature.
    assert_eq!(server.get(&format!("{link}&utm_source=mail"), &[]).status, 200);
    // Changing or dropping the signed parameter breaks the signature.
    assert_401(&server.get(&with_param(&link, "response-content-disposition", "inline"), &[]), "tampered disposition");
    assert_401(&server.get(&link.replace("response-content-disposition=attachment&", ""), &[]), "dropped disposition");
    // An unsigned link or a token never sets a disposition.
    let token = env.token("alpha", "read", &[]);
    assert_eq!(server.get_auth("/alpha/pub/x", &token, &[]).header("content-disposition"), None);
    // An invalid disposition is refused when signing.
    env.fails(&["presign", "alpha", "pub/x", "--response-content-disposition", "attachment; filename"]);
}

#[test]

fn signed_content_disposition_applies_on_public_buckets_too() {
    let w = world();
    let env = &w.env;
    let server = env.serve();
    let link = presign(env, &server, "open", "o", &["--response-content-disposition", "attachment"]);
    let r = server.get(&link, &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"open");
    assert_eq!(r.header("content-disposition"), Some("attachment; filename=\"o\""));
}

/// Issue 12, item 1: an empty `response-content-disposition` appended to any signed URL used to verify like no
/// override and replace a stored `attachment` with an empty header, so stored HTML rendered inline on the
/// gateway's origin. An empty override is now a 400, and a signed one can only replace the stored value.
#[test]
fn an_empty_override_never_strips_a_stored_disposition() {
    let env = TestEnv::new();
    env.bucket("alpha", false);
    env.bucket("open", true);
    let html = b"<script>alert(document.domain)</script>";
    let attrs = ["--content-type", "text/html", "--content-disposition", "attachment"];
    for bucket in ["alpha", "open"] {
        env.put_bytes(bucket, "page.html", html, &attrs);
    }
    let server = env.serve();
    let stored = Some("attachment; filename=\"page.html\"");
    for bucket in ["alpha", "open"] {
        let link = presign(&env, &server, bucket, "page.html", &[]);
        let r = server.get(&link, &[]);
        assert_eq!((r.status, r.header("content-disposition")), (200, stored), "{bucket}: the plain link");
        let (path, query) = link.split_once('?').unwrap();
        for stripped in [
            format!("{link}&response-content-disposition="),
            format!("{link}&response-content-disposition"),
            format!("{path}?response-content-disposition=&{query}"),
            format!("{link}&response-content-type="),
            format!("{link}&response-cache-control="),
        ] {
            for method in ["GET", "HEAD"] {
                let r = server.request(method, &stripped, &[]);
                assert_eq!(r.status, 400, "{method} {stripped}: {:?}", r.header("content-disposition"));
                assert_eq!(r.header("content-disposition"), None);
                if method == "GET" {
                    assert_json_error(&r, 400, "bad_request");
                }
            }
        }
        // A signed override replaces the stored value with a valid one; an empty one cannot even be signed.
        let inline = presign(&env, &server, bucket, "page.html", &["--response-content-disposition", "inline"]);
        let r = server.get(&inline, &[]);
        assert_eq!((r.status, r.header("content-disposition")), (200, Some("inline; filename=\"page.html\"")));
        assert_json_error(
            &server.get(&with_param(&inline, "response-content-disposition", ""), &[]),
            400,
            "bad_request",
        );
        env.fails(&["presign", bucket, "page.html", "--response-content-disposition", ""]);
    }
    // No credentials at all on a public bucket: still no stripping.
    assert_json_error(&server.get("/open/page.html?response-content-disposition=", &[]), 400, "bad_request");
    let r = server.get("/open/page.html", &[]);
    assert_eq!((r.status, r.header("content-disposition")), (200, stored));
}

/// Issue 12, item 5: `signing revoke-url` used to store whatever `bg-expires` a copy of the URL carried, so a
/// copy edited to expire at 1 made the next revocation prune the row and, after a restart, the real link worked
/// again. Now a URL that does not verify is refused and revokes nothing, and a revoked link stays revoked.
#[test]
fn revoke_url_verifies_first_and_a_revoked_link_stays_revoked() {
    let w = world();
    let env = &w.env;
    let mut server = env.serve();
    let base = format!("http://{}", server.data);
    let link = presign(env, &server, "alpha", "pub/x", &["--expires-in", "3600"]);
    let expires: i64 = param(&link, "bg-expires").parse().unwrap();
    let sig = param(&link, "bg-sig").to_owned();
    let revoke = |path: &str| env.cli(&["signing", "revoke-url", &format!("{base}{path}")]);
    let forged = [
        with_param(&link, "bg-expires", "1"),
        with_param(&link, "bg-expires", &(expires - 1).to_string()),
        with_param(&link, "bg-key", "kdeadbeef"),
        with_param(&link, "bg-sig", &sig[..sig.len() - 1]),
        link.replacen("/pub/x?", "/priv/y?", 1),
        link.replacen("/alpha/", "/beta/", 1),
        format!("{link}&response-content-disposition=attachment"),
        format!("{link}&response-content-disposition="),
    ];
    for copy in &forged {
        let err = one_line_error(&revoke(copy), &["signing", "revoke-url", copy]);
        assert!(err.starts_with("blobgate: not revoked"), "{copy}: {err}");
        assert_eq!(server.get(&link, &[]).status, 200, "a refused revocation revoked nothing: {copy}");
    }
    assert!(one_line_error(&revoke(&forged[0]), &[]).contains("signature does not verify"));
    assert!(one_line_error(&revoke(&forged[2]), &[]).contains("kdeadbeef"));

    let out = revoke(&link);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let revoked = |server: &Server, what: &str| {
        let r = server.get(&link, &[]);
        assert_401(&r, what);
        assert_eq!(r.json()["message"], "signed URL revoked", "{what}");
    };
    revoked(&server, "revoked");
    // The sequence: the edited copy, then a later revocation that prunes expired rows, then a restart.
    assert!(!revoke(&forged[0]).status.success());
    // `short` was signed an hour ago for a minute: its revocation's row is expired at once, so the next
    // revocation may prune it.
    let short = env.presigned_ago("alpha", "pub/x", &base, Duration::from_secs(3600), Duration::from_secs(60));
    let short = path_of_url(&short).to_owned();
    assert!(revoke(&short).status.success());
    let later = presign(env, &server, "alpha", "priv/y", &["--expires-in", "60"]);
    assert!(revoke(&later).status.success(), "this revocation prunes the expired row of `short`");
    revoked(&server, "after a later revocation");
    assert_eq!(server.stop(), Some(0));
    let server = env.serve();
    revoked(&server, "after a restart");
    assert_401(&server.get(&later, &[]), "the later link is revoked too");
    // Revoking it again is harmless, and still leaves it revoked.
    assert!(revoke(&link).status.success());
    revoked(&server, "after revoking it twice");
}
