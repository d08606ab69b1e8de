//! Service-level tests on the in-process application (`in_process::spawn_app`): no binary, no CLI.

use crate::helpers::*;
use crate::in_process::spawn_app;

#[test]
fn an_in_process_app_is_healthy_and_serves_a_public_object() {
    let app = spawn_app();
    assert_eq!(app.admin("GET", "/healthz").body, b"ok\n");
    app.bucket("pub", true);
    let bytes = test_bytes(10_000, 3);
    let sha256 = app.put("pub", "dir/a.bin", &bytes);
    let r = app.get("/pub/dir/a.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == bytes, "the body is the object");
    assert_eq!(r.header("etag"), Some(format!("\"{sha256}\"").as_str()));
    assert_eq!(r.header("content-length"), Some("10000"));
    let r = app.get("/pub/dir/a.bin", &[("Range", "bytes=-10")]);
    assert_eq!((r.status, r.header("content-range")), (206, Some("bytes 9990-9999/10000")));
    assert!(r.body == bytes[9990..]);
}

#[test]
fn an_object_stored_while_the_app_serves_becomes_visible() {
    let app = spawn_app();
    app.bucket("pub", true);
    assert_json_error(&app.get("/pub/late", &[]), 404, "not_found");
    // Written through another store handle, as the CLI writes: the caches learn of it through the change feed.
    app.put("pub", "late", b"here now");
    let visible = wait_for(std::time::Duration::from_secs(30), || app.get("/pub/late", &[]).status == 200);
    assert!(visible, "the new object never became visible");
    assert_eq!(app.get("/pub/late", &[]).body, b"here now");
}

#[test]
fn an_in_process_app_refuses_what_the_binary_refuses() {
    let app = spawn_app();
    app.bucket("priv", false);
    app.put("priv", "secret", b"not for you");
    assert_json_error(&app.get("/priv/secret", &[]), 401, "unauthorized");
    // Same answer as for an object that does not exist, so nothing is revealed.
    assert_json_error(&app.get("/priv/nothing", &[]), 401, "unauthorized");
    assert_json_error(&app.get("/Bad_Bucket/x", &[]), 400, "invalid_name");
    let r = request_at(app.data, "DELETE", "/priv/secret", &[]);
    assert_json_error(&r, 401, "unauthorized");
    let r = request_at(app.data, "PATCH", "/priv/secret", &[]);
    assert_json_error(&r, 405, "method_not_allowed");
}
