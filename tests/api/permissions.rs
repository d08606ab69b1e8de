//! Secrets at rest (issue 12, item 4): whatever the umask, the data dir is `0700` and nothing blobgate creates
//! in it (database, its -wal and -shm files, blobs, temp files, the generation counter) is readable by group or
//! others; a data dir that is already looser gets one warning at start.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::helpers::*;

/// Runs blobgate under `umask 022`, the common default that made everything `0755`/`0644`.
const UMASK_022: [&str; 3] = ["sh", "-c", "umask 022; exec \"$0\" \"$@\""];

fn cli_with_umask_022(env: &TestEnv, args: &[&str]) -> Output {
    let out = Command::new(UMASK_022[0])
        .args(&UMASK_022[1..])
        .arg(BIN)
        .arg("--data-dir")
        .arg(env.data_dir())
        .args(args)
        .current_dir(env.dir.path())
        .env_remove("BLOBGATE_CONFIG")
        .env_remove("RUST_LOG")
        .output()
        .expect("run sh");
    assert!(out.status.success(), "blobgate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Every directory and file under `dir` (not `dir` itself), with its mode.
fn modes_under(dir: &Path) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().map_while(Result::ok) {
        let path = entry.path();
        out.push((path.display().to_string(), mode(&path)));
        if entry.file_type().unwrap().is_dir() {
            out.extend(modes_under(&path));
        }
    }
    out
}

#[test]
fn nothing_in_the_data_dir_is_readable_by_others_whatever_the_umask() {
    let env = TestEnv::new();
    let data = env.data_dir();
    cli_with_umask_022(&env, &["bucket", "create", "alpha"]);
    let file = write_file(env.dir.path(), "upload.bin", &test_bytes(5000, 3));
    cli_with_umask_022(&env, &["put", "alpha", "a.bin", file.to_str().unwrap()]);
    let token = String::from_utf8(
        cli_with_umask_022(&env, &["token", "create", "--bucket", "alpha", "--scope", "write"]).stdout,
    )
    .unwrap();
    let token = token.trim();
    // Creates the first signing key: the HMAC secrets are in the database.
    cli_with_umask_022(&env, &["presign", "alpha", "a.bin"]);

    let server = env.serve_with(&[], &UMASK_022);
    assert_eq!(server.get_auth("/alpha/a.bin", token, &[]).status, 200);
    let r = server.admin("PUT", "/alpha/b.bin", &[("Authorization", &format!("Bearer {token}"))], b"uploaded");
    assert_eq!(r.status, 201);
    // An upload in progress: its temp file exists until the body is complete.
    let mut upload = Conn::open(server.admin);
    let head = format!(
        "PUT /alpha/c.bin HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\nContent-Length: 4000000\r\n\r\n"
    );
    upload.send(head.as_bytes());
    // More than one write batch, so the temp file exists (the first batch creates it).
    upload.send(&vec![b'x'; 1 << 20]);
    assert!(wait_for(Duration::from_secs(30), || !env.tmp_files().is_empty()), "the upload is staged in tmp/");

    assert_eq!(mode(&data), 0o700, "the data dir is {:04o}", mode(&data));
    let entries = modes_under(&data);
    for name in [
        "blobgate.db",
        "blobgate.db-wal",
        "blobgate.db-shm",
        "blobgate.generation",
        "signing-secrets.key",
        "blobs",
        "tmp",
    ] {
        assert!(entries.iter().any(|(p, _)| p.ends_with(&format!("/{name}"))), "{name} exists: {entries:?}");
    }
    assert!(env.blob_files().len() >= 2 && env.tmp_files().len() == 1, "{entries:?}");
    for (path, mode) in &entries {
        assert_eq!(mode & 0o077, 0, "{path} is {mode:04o}: readable by group or others");
    }
    drop(upload);
}

#[test]
fn a_data_dir_open_to_others_gets_one_warning_at_start() {
    let env = TestEnv::new();
    env.ok(&["bucket", "create", "alpha"]);
    let data = env.data_dir();
    assert_eq!(mode(&data), 0o700);
    let warnings = |server: &Server| -> Vec<String> {
        server.log().lines().filter(|l| l.contains("data dir is open")).map(str::to_owned).collect()
    };
    let server = env.serve();
    assert_eq!(warnings(&server), Vec::<String>::new(), "a private data dir is not warned about");
    drop(server);

    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = env.serve();
    let lines = warnings(&server);
    assert_eq!(lines.len(), 1, "{}", server.log());
    assert!(lines[0].contains("WARN") && lines[0].contains(&data.display().to_string()), "{}", lines[0]);
    assert!(lines[0].contains("mode=0755"), "{}", lines[0]);
    // The warning is all it does: the operator's mode is left as it is.
    assert_eq!(mode(&data), 0o755);
}

/// Signing-key secrets are sealed under `signing-secrets.key`, outside the database: without that file the
/// database's keys are useless, and blobgate refuses to start over them rather than make a new key.
#[test]
fn signing_secrets_need_the_key_file_outside_the_database() {
    let env = TestEnv::new();
    env.bucket("alpha", false);
    env.put_bytes("alpha", "a", b"bytes", &[]);
    let server = env.serve();
    let url = env.ok(&["presign", "alpha", "a", "--base-url", &format!("http://{}", server.data)]);
    let link = path_of_url(url.trim()).to_owned();
    assert_eq!(server.get(&link, &[]).body, b"bytes");
    drop(server);

    let key_file = env.data_dir().join("signing-secrets.key");
    assert_eq!(mode(&key_file), 0o600);
    let saved = std::fs::read(&key_file).unwrap();
    std::fs::remove_file(&key_file).unwrap();
    for args in [&["presign", "alpha", "a"][..], &["signing", "list"]] {
        let err = env.fails(args);
        assert!(err.contains("signing-secrets.key is missing") && err.contains("restore"), "{err}");
    }
    assert!(!key_file.exists(), "no new key is made over keys sealed with the old one");
    std::fs::write(&key_file, format!("{}\n", "0".repeat(64))).unwrap();
    let err = env.fails(&["signing", "list"]);
    assert!(err.contains("does not open with this secrets key"), "{err}");

    std::fs::write(&key_file, saved).unwrap();
    let server = env.serve();
    assert_eq!(server.get(&link, &[]).body, b"bytes", "the restored key file opens the keys again");
}
