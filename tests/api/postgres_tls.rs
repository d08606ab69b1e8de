//! TLS to PostgreSQL: a cluster of the test's own that speaks TLS only (`scripts/pg-cluster start DIR --tls`),
//! with a CA and a server certificate the test makes (openssl). Each `sslmode` connects or is refused with one
//! line naming `database.url`; `serve` warns of a database on another host reached without TLS required.

use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use crate::helpers::pki::{EC, TestPki};
use crate::helpers::*;

/// The warning `serve` logs for a database link that may be plaintext.
const PLAINTEXT_WARNING: &str = "database.url does not require TLS to a database on another host";

/// A CA, a server certificate it signed for `localhost` only (so `127.0.0.1` is a host name it does not match),
/// and an unrelated CA.
fn pki() -> TestPki {
    let pki = TestPki::with_ca("ca");
    pki.ca("other-ca");
    pki.server("server", EC, "DNS:localhost", "ca");
    pki
}

/// A cluster that serves the PKI's server certificate and refuses TCP logins without TLS.
fn cluster(pki: &TestPki) -> OwnCluster {
    OwnCluster::start_tls(&pki.file("server.crt"), &pki.file("server.key"))
}

/// `cluster`'s URL on `host`, with this query.
fn url_on(cluster: &OwnCluster, host: &str, query: &str) -> String {
    format!("{}?{query}", cluster.url.replacen("@127.0.0.1:", &format!("@{host}:"), 1))
}

/// `sslmode=MODE&sslrootcert=FILE`.
fn verified(mode: &str, root: &Path) -> String {
    format!("sslmode={mode}&sslrootcert={}", root.display())
}

#[test]
fn verify_full_serves_a_bucket_end_to_end_over_tls() {
    let pki = pki();
    let cluster = cluster(&pki);
    let env = TestEnv {
        database_url: Some(url_on(&cluster, "localhost", &verified("verify-full", &pki.file("ca.crt")))),
        ..TestEnv::new()
    };
    env.bucket("tls", false);
    let bytes = test_bytes(50_000, 7);
    env.put_bytes("tls", "over/tls.bin", &bytes, &[]);
    let token = env.token("tls", "read", &[]);
    let server = env.serve();
    let r = server.get_auth("/tls/over/tls.bin", &token, &[]);
    assert_eq!((r.status, r.body == bytes), (200, true), "log:\n{}", server.log());
    assert!(env.ok(&["ls", "tls"]).contains("over/tls.bin"));
    // A CLI change reaches the running server: its change feed (LISTEN and the head poll) works over TLS too.
    env.ok(&["token", "revoke", &token]);
    let revoked = wait_for(Duration::from_secs(30), || server.get_auth("/tls/over/tls.bin", &token, &[]).status == 401);
    assert!(revoked, "the revocation never reached the server; log:\n{}", server.log());
    let log = server.log();
    assert!(!log.contains(PLAINTEXT_WARNING), "a verified link is not warned of:\n{log}");
    assert!(!log.contains("change listener"), "the change listener failed:\n{log}");
}

/// Runs `bucket create` and `serve` with `url`; both must fail with one line naming `database.url` and `reason`,
/// never the password.
fn refused_with(env: &TestEnv, url: &str, reason: &str) {
    for args in [&["bucket", "create", "refused"][..], &["serve"]] {
        let line = env.refused_database_url(args, url);
        assert!(line.contains(reason), "{args:?} {url}: {line}");
        assert!(!line.contains(":blobgate@"), "the password shows: {line}");
    }
}

#[test]
fn each_sslmode_against_a_tls_only_server_connects_or_says_why_not() {
    let pki = pki();
    let cluster = cluster(&pki);
    let env = TestEnv::new();
    let (ca, other) = (pki.file("ca.crt"), pki.file("other-ca.crt"));
    // require encrypts and checks nothing; verify-ca checks the CA (and, with sqlx 0.8, the name too).
    let connects = [("localhost", verified("verify-ca", &ca)), ("127.0.0.1", "sslmode=require".to_owned())];
    for ((host, query), bucket) in connects.iter().zip(["via-verify-ca", "via-require"]) {
        let url = url_on(&cluster, host, query);
        let out = env.cli_env(&["bucket", "create", bucket], &[("BLOBGATE_DATABASE_URL", &url)]);
        assert!(out.status.success(), "{query}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let not_ours = format!("the server's certificate is not signed by sslrootcert {}", other.display());
    let cases = [
        ("127.0.0.1", verified("verify-full", &ca), "the server's certificate does not match host 127.0.0.1"),
        // libpq would skip the name here; sqlx 0.8 checks it (sqlx#3793): refused, and the message says why.
        (
            "127.0.0.1",
            verified("verify-ca", &ca),
            "does not match host 127.0.0.1 (checked under sslmode=verify-ca too)",
        ),
        ("localhost", verified("verify-full", &other), not_ours.as_str()),
        ("127.0.0.1", verified("verify-ca", &other), &not_ours),
        // As libpq: `require` with a root certificate checks the CA.
        ("127.0.0.1", verified("require", &other), &not_ours),
        // The built-in public CAs did not sign it either.
        ("localhost", "sslmode=verify-full".to_owned(), "not signed by a trusted CA"),
        (
            "127.0.0.1",
            "sslmode=disable".to_owned(),
            "no encryption (the server accepts TLS only: set sslmode=verify-full)",
        ),
        ("localhost", verified("verify-full", &pki.file("missing.crt")), "missing.crt cannot be read"),
        ("localhost", verified("verify-full", &pki.file("server.ext")), "server.ext holds no PEM certificate"),
    ];
    for (host, query, reason) in &cases {
        refused_with(&env, &url_on(&cluster, host, query), reason);
    }
}

#[test]
fn tls_required_of_a_server_without_it_is_refused() {
    let env = TestEnv::new();
    let plain = postgres_database();
    for mode in ["require", "verify-full"] {
        let reason = format!("the server does not offer TLS, which sslmode={mode} requires");
        refused_with(&env, &format!("{plain}?sslmode={mode}"), &reason);
    }
}

#[test]
fn serve_warns_once_of_a_database_on_another_host_without_tls_required() {
    let loopback = TestEnv::on_postgres();
    let server = loopback.serve();
    assert!(!server.log().contains(PLAINTEXT_WARNING), "loopback is not warned of:\n{}", server.log());
    drop(server);

    // The same database through this machine's own network address: not loopback, so not known to stay here.
    let database = loopback.database_url.clone().unwrap();
    let (_, rest) = database.split_once("@127.0.0.1:").expect("the test cluster is on 127.0.0.1");
    let (port, _) = rest.split_once('/').unwrap();
    let exposed = forward_from_network_address(SocketAddr::from(([127, 0, 0, 1], port.parse().unwrap())));
    let remote = TestEnv {
        database_url: Some(database.replacen(&format!("127.0.0.1:{port}"), &exposed.to_string(), 1)),
        ..TestEnv::new()
    };
    let server = remote.serve();
    let ready = wait_for(Duration::from_secs(30), || server.admin("GET", "/readyz", &[], b"").status == 200);
    assert!(ready, "it reaches the database; log:\n{}", server.log());
    let log = server.log();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(PLAINTEXT_WARNING)).collect();
    assert_eq!(warnings.len(), 1, "one warning:\n{log}");
    assert!(warnings[0].contains("WARN") && warnings[0].contains("sslmode=verify-full"), "{}", warnings[0]);
    assert!(warnings[0].contains(&format!("on {exposed} as blobgate")), "it names the database: {}", warnings[0]);
    assert!(!log.contains(":blobgate@"), "the password shows:\n{log}");
}

/// This machine's first IPv4 address that is not loopback: fails, saying so, where there is none.
fn network_address() -> Ipv4Addr {
    nix::ifaddrs::getifaddrs()
        .expect("getifaddrs")
        .filter_map(|a| a.address.and_then(|s| s.as_sockaddr_in().map(|s| s.ip())))
        .find(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .expect("this test needs an IPv4 address besides loopback on this machine (a network interface)")
}

/// Listens on this machine's network address and relays each connection to `target`: an address that is not
/// loopback, served by a loopback-only server. Only this machine's own connections are relayed.
fn forward_from_network_address(target: SocketAddr) -> SocketAddr {
    let ip = IpAddr::V4(network_address());
    let listener = TcpListener::bind((ip, 0)).expect("listen on the network address");
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            if client.peer_addr().map(|p| p.ip()).ok() != Some(ip) {
                continue;
            }
            let Ok(server) = TcpStream::connect(target) else { continue };
            let pairs = [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)];
            for (mut from, mut to) in pairs {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(Shutdown::Write);
                });
            }
        }
    });
    addr
}
