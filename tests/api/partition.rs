//! A replica cut off from PostgreSQL while the database stays up for everyone else (a network partition): the
//! operator's revocations commit through the CLI, and the cut-off replica must stop honouring what they revoked
//! once its caches are older than `database.max_staleness`, then catch up and serve again when the link returns,
//! without a restart. A TCP proxy of the test's own sits between the replica and the real PostgreSQL cluster;
//! cutting it drops every byte both ways (as a partition does: no reset, the queries just hang).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::helpers::s3::{Signing, presigned_path, s3_code, s3_key};
use crate::helpers::*;

/// A TCP proxy to one address that can be cut (every byte dropped, both ways, on open and new connections) and
/// restored (the connections that lived through the cut are closed, since their streams lost bytes).
struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Every socket the proxy holds (both ends of every connection), to close on restore.
    sockets: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let (cut_flag, held) = (cut.clone(), sockets.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                held.lock().unwrap().push(client.try_clone().unwrap());
                if cut_flag.load(Ordering::Acquire) {
                    // A partition: the connection is never answered. Read and drop what the client sends.
                    let cut_flag = cut_flag.clone();
                    std::thread::spawn(move || pump(client, None, &cut_flag));
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else { continue };
                held.lock().unwrap().push(server.try_clone().unwrap());
                for (from, to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                    let cut_flag = cut_flag.clone();
                    std::thread::spawn(move || pump(from, Some(to), &cut_flag));
                }
            }
        });
        Proxy { addr, cut, sockets }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::Release);
    }

    fn restore(&self) {
        for socket in self.sockets.lock().unwrap().drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        self.cut.store(false, Ordering::Release);
    }
}

/// Copies `from` to `to` while the link is up; drops the bytes while it is cut (and all of them with no `to`).
fn pump(mut from: TcpStream, mut to: Option<TcpStream>, cut: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut.load(Ordering::Acquire) {
            continue;
        }
        if let Some(to) = to.as_mut()
            && to.write_all(&buf[..n]).is_err()
        {
            break;
        }
    }
    if let Some(to) = to {
        let _ = to.shutdown(Shutdown::Both);
    }
}

/// `url` with its host and port replaced by `addr`.
fn via(url: &str, addr: SocketAddr) -> String {
    let mut parsed = url::Url::parse(url).expect("a PostgreSQL URL");
    parsed.set_host(Some(&addr.ip().to_string())).unwrap();
    parsed.set_port(Some(addr.port())).unwrap();
    parsed.to_string()
}

fn target_of(url: &str) -> SocketAddr {
    let parsed = url::Url::parse(url).expect("a PostgreSQL URL");
    format!("{}:{}", parsed.host_str().unwrap(), parsed.port().unwrap_or(5432)).parse().expect("an IP address")
}

/// The `age_ms` of the first log line containing `what`.
fn logged_age_ms(log: &str, what: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.contains(what))?;
    let start = line.find("age_ms=")? + "age_ms=".len();
    line[start..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

const MAX_STALENESS: Duration = Duration::from_secs(3);

#[test]
fn a_replica_cut_off_from_the_database_refuses_revoked_credentials_within_its_window_and_catches_up() {
    let url = postgres_database();
    let env = TestEnv { database_url: Some(url.clone()), ..TestEnv::new() };
    env.bucket("private", false);
    env.bucket("assets", true);
    let doc = test_bytes(20_000, 7);
    env.put_bytes("private", "doc", &doc, &[]);
    env.put_bytes("assets", "app.css", b"body { color: teal }", &[]);
    let token = env.token("private", "read", &[]);
    let key = s3_key(&env, "private", &[]);
    let s3_url = presigned_path(&key, "/private/doc", &Signing { expires: Some(3600), ..Default::default() });

    let proxy = Proxy::start(target_of(&url));
    let proxied = via(&url, proxy.addr);
    let serve = |public_window: &str| {
        env.serve_with(
            &[
                ("BLOBGATE_DATABASE_URL", proxied.as_str()),
                ("BLOBGATE_DATABASE__MAX_STALENESS", "3s"),
                ("BLOBGATE_DATABASE__PUBLIC_MAX_STALENESS", public_window),
                ("BLOBGATE_TIMEOUTS__DATABASE_ACQUIRE", "1s"),
                ("BLOBGATE_TIMEOUTS__HANDLER", "3s"),
            ],
            &[],
        )
    };
    // One replica keeps public objects for 8 s past its last sync, the other fails them closed with the rest.
    let (lenient, strict) = (serve("8s"), serve("0s"));
    let bearer = format!("Bearer {token}");
    let bearer = [("Authorization", bearer.as_str())];
    for server in [&lenient, &strict] {
        assert_eq!(server.get("/private/doc", &bearer).body, doc);
        assert_eq!(server.get(&s3_url, &[]).body, doc);
        assert_eq!(server.get("/assets/app.css", &[]).status, 200);
        assert_eq!(server.admin("GET", "/readyz", &[], b"").status, 200);
    }

    proxy.cut();
    let cut_at = Instant::now();
    // The operator still reaches the database: every revocation commits.
    env.ok(&["token", "revoke", &token]);
    env.ok(&["s3-key", "revoke", &key.id]);
    env.ok(&["bucket", "set", "assets", "--private"]);
    env.ok(&["rm", "assets", "app.css"]);

    // Ask until each answer has turned, checking that none turns back: once refused, refused until the link returns.
    let mut first_refusal: [[Option<Duration>; 3]; 2] = [[None; 3]; 2];
    let deadline = cut_at + Duration::from_secs(60);
    while first_refusal.iter().flatten().any(Option::is_none) {
        assert!(Instant::now() < deadline, "still answering after 60 s: {first_refusal:?}");
        for (n, server) in [&lenient, &strict].into_iter().enumerate() {
            let answers =
                [server.get("/private/doc", &bearer), server.get(&s3_url, &[]), server.get("/assets/app.css", &[])];
            for (i, answer) in answers.iter().enumerate() {
                match (answer.status, first_refusal[n][i]) {
                    (200, None) => {}
                    (503, seen) => {
                        assert!(answer.header("retry-after").is_some(), "503 without Retry-After");
                        first_refusal[n][i] = seen.or(Some(cut_at.elapsed()));
                    }
                    (status, seen) => panic!("server {n}, request {i}: {status} (refused since {seen:?})"),
                }
            }
            if answers[1].status == 503 {
                assert_eq!(s3_code(&answers[1]), "ServiceUnavailable", "an S3 client gets S3's words");
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "first 503 after the cut (bearer, SigV4, public): lenient {:?}, strict {:?}",
        first_refusal[0], first_refusal[1]
    );
    for server in [&lenient, &strict] {
        assert_eq!(server.admin("GET", "/readyz", &[], b"").status, 503);
        // The server's own verdict, with the age of its caches when it turned: never before the window. That it
        // turns within the watchdog's quarter second after it is the catalog's unit test
        // (`the_watchdog_turns_within_one_check_after_each_window`, on a paused clock); here the age is printed.
        let log = server.log();
        let age = logged_age_ms(&log, "within database.max_staleness: refusing credentials")
            .or_else(|| logged_age_ms(&log, "refusing every request"))
            .unwrap_or_else(|| panic!("no staleness warning; log:\n{log}"));
        assert!(age > MAX_STALENESS.as_millis() as u64, "turned at {age} ms");
        println!("turned at {age} ms (window {MAX_STALENESS:?})");
    }
    let [bearer_at, sigv4_at, public_at] = first_refusal[0].map(Option::unwrap);
    assert!(
        public_at > bearer_at.max(sigv4_at),
        "the lenient replica kept its public object longer: {first_refusal:?}"
    );
    assert!(logged_age_ms(&lenient.log(), "refusing every request").is_some_and(|ms| ms > 8000));

    proxy.restore();
    for server in [&lenient, &strict] {
        let back = wait_for(Duration::from_secs(30), || server.admin("GET", "/readyz", &[], b"").status == 200);
        assert!(back, "never ready again; log:\n{}", server.log());
        // Caught up with what happened meanwhile, without a restart.
        assert_eq!(server.get("/private/doc", &bearer).status, 401, "the revoked token");
        let s3 = server.get(&s3_url, &[]);
        assert_eq!((s3.status, s3_code(&s3).as_str()), (403, "InvalidAccessKeyId"), "the revoked S3 key");
        assert_eq!(server.get("/assets/app.css", &[]).status, 401, "the bucket made private");
        let fresh = format!("Bearer {}", env.token("private", "read", &[]));
        assert_eq!(server.get("/private/doc", &[("Authorization", fresh.as_str())]).body, doc, "serves again");
        assert!(server.log().contains("in sync with the database again"), "{}", server.log());
    }
}
