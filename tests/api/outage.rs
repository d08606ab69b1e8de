//! The database going away and coming back: readiness (`/readyz`), answers from cache, 503 + `Retry-After` for
//! what needs the database, download stats buffered through the outage.

use crate::helpers::*;

#[test]
fn readyz_is_ready_on_sqlite_and_liveness_stays_apart() {
    let env = TestEnv::new();
    env.bucket("open", true);
    let server = env.serve();
    let ready = wait_for(std::time::Duration::from_secs(5), || server.admin("GET", "/readyz", &[], b"").status == 200);
    assert!(ready, "/readyz never answered 200; log:\n{}", server.log());
    let r = server.admin("GET", "/readyz", &[], b"");
    assert_eq!(r.body, b"ok\n");
    assert_eq!(server.admin("GET", "/healthz", &[], b"").status, 200);
    let metrics = String::from_utf8(server.admin("GET", "/metrics", &[], b"").body).unwrap();
    assert!(metrics.lines().any(|l| l == "blobgate_database_up 1"), "{metrics}");
    assert_eq!(server.get("/readyz", &[]).status, 400, "the data listener has no /readyz");
}
