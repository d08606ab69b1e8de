//! Crash safety: a kill -9 in the middle of an upload leaves nothing visible, and the next start removes the
//! temp file it left behind.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use crate::helpers::*;

#[test]
fn kill_9_mid_upload_then_restart_leaves_nothing() {
    let env = TestEnv::new();
    env.bucket("ups", false);
    let writer = env.token("ups", "write", &[]);
    let mut server = env.serve();

    let total = 8 << 20;
    let mut stream = TcpStream::connect(server.admin).unwrap();
    let head = format!(
        "PUT /ups/half.bin HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {writer}\r\nContent-Length: {total}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&test_bytes(total / 2, 9)).unwrap();
    // Wait until the server has staged part of the body on disk, then kill it without warning.
    let tmp = env.data_dir().join("tmp");
    let staged = wait_for(Duration::from_secs(30), || {
        files_under(&tmp).iter().any(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0) > 0)
    });
    assert!(staged, "the upload never reached the disk");
    server.stop_with("KILL");
    drop(stream);
    assert!(!files_under(&tmp).is_empty(), "the killed upload left its temp file (as a crash would)");

    let server = env.serve();
    let reader = env.token("ups", "read", &[]);
    let r = server.get("/ups/half.bin", &[("Authorization", &format!("Bearer {reader}"))]);
    assert_eq!(r.status, 404, "a partial upload must never become visible");
    assert!(files_under(&tmp).is_empty(), "start-up sweep left temp files: {:?}", files_under(&tmp));
    assert!(files_under(&env.data_dir().join("blobs")).is_empty(), "no blob may exist for the killed upload");
}
