//! The deployment files: both compose files are safe by default (admin, Prometheus and Grafana on 127.0.0.1
//! only, no anonymous Grafana, a healthcheck on every service, `/readyz` for blobgate), the HA file runs three
//! replicas on one shared volume and one PostgreSQL URL behind HAProxy, Prometheus scrapes every replica, and
//! `haproxy -c` accepts the HAProxy configurations; the TLS one also runs in front of an HTTPS replica. The
//! systemd unit is sandboxed and `systemd-analyze verify` accepts it. YAML is read by PyYAML (python3) into JSON;
//! the assertions are here. Where docker has compose, `docker compose config` must accept both files too.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A YAML file as JSON, through PyYAML's `safe_load` (merge keys, `<<: *anchor`, resolved).
fn yaml(path: &str) -> Value {
    require_tool("python3", "apt package python3");
    let script = "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)";
    let out = Command::new("python3").args(["-c", script, &format!("{ROOT}/{path}")]).output().unwrap();
    assert!(
        out.status.success(),
        "reading {path} (needs PyYAML, apt package python3-yaml): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn services(compose: &Value) -> &serde_json::Map<String, Value> {
    compose["services"].as_object().expect("a services map")
}

fn ports(service: &Value) -> Vec<String> {
    service["ports"].as_array().map_or(Vec::new(), |p| p.iter().map(|p| p.as_str().unwrap().to_owned()).collect())
}

/// The container port of a `[HOST_IP:]HOST_PORT:CONTAINER_PORT` entry, and whether it is bound to 127.0.0.1.
fn published(entry: &str) -> (&str, bool) {
    let container = entry.rsplit(':').next().unwrap();
    (container, entry.starts_with("127.0.0.1:"))
}

/// Properties both compose files must have: the only port on every interface is a data port (8080); every
/// service has a healthcheck; blobgate's is its `/readyz`; Grafana is not anonymous.
fn assert_safe_by_default(file: &str, compose: &Value) {
    for (name, service) in services(compose) {
        for entry in ports(service) {
            let (container, loopback) = published(&entry);
            assert!(loopback || container == "8080", "{file}: {name} publishes {entry} on every interface");
        }
        let test =
            service["healthcheck"]["test"].as_array().unwrap_or_else(|| panic!("{file}: {name} has no healthcheck"));
        let test: Vec<&str> = test.iter().map(|t| t.as_str().unwrap()).collect();
        assert!(test[0] == "CMD" || test[0] == "CMD-SHELL", "{file}: {name}: {test:?}");
        if name.starts_with("blobgate") {
            assert!(
                test.iter().any(|t| t.ends_with(":8081/readyz")),
                "{file}: {name} is not checked by /readyz: {test:?}"
            );
            assert!(
                ports(service).iter().all(|p| published(p).0 != "8081" || published(p).1),
                "{file}: {name}'s admin port"
            );
        }
        if name == "grafana" {
            assert_eq!(service["environment"]["GF_AUTH_ANONYMOUS_ENABLED"], "false", "{file}: anonymous Grafana");
        }
    }
}

#[test]
fn the_single_node_compose_file_is_safe_by_default() {
    let compose = yaml("docker-compose.yml");
    assert_safe_by_default("docker-compose.yml", &compose);
    let blobgate = &services(&compose)["blobgate"];
    assert_eq!(ports(blobgate), ["8080:8080", "127.0.0.1:8081:8081"]);
    assert_eq!(ports(&services(&compose)["grafana"]), ["127.0.0.1:3000:3000"]);
    assert_eq!(ports(&services(&compose)["prometheus"]), ["127.0.0.1:9090:9090"]);
    docker_compose_accepts("docker-compose.yml");
}

#[test]
fn the_ha_compose_file_runs_three_replicas_on_one_database_and_volume_behind_haproxy() {
    let compose = yaml("docker-compose.ha.yml");
    assert_safe_by_default("docker-compose.ha.yml", &compose);
    let all = services(&compose);
    let replicas: Vec<(&String, &Value)> = all.iter().filter(|(name, _)| name.starts_with("blobgate-")).collect();
    assert_eq!(replicas.len(), 3, "{:?}", all.keys().collect::<Vec<_>>());
    let urls: Vec<&Value> = replicas.iter().map(|(_, s)| &s["environment"]["BLOBGATE_DATABASE_URL"]).collect();
    let url = urls[0].as_str().expect("a database URL");
    assert!(url.starts_with("postgres://") && url.contains("@postgres:5432/"), "{url}");
    assert!(urls.iter().all(|u| *u == urls[0]), "one database for every replica: {urls:?}");
    for (name, replica) in &replicas {
        assert_eq!(replica["volumes"], serde_json::json!(["blobgate-data:/data"]), "{name}: the shared data volume");
        assert_eq!(replica["depends_on"]["postgres"]["condition"], "service_healthy", "{name}");
    }
    assert!(compose["volumes"].as_object().unwrap().contains_key("blobgate-data"));
    assert!(all["postgres"]["ports"].is_null(), "PostgreSQL is not published");
    assert_eq!(ports(&all["haproxy"]), ["8080:8080", "127.0.0.1:8404:8404"]);

    // HAProxy balances the three data listeners and checks each one's /readyz on its admin port.
    let mounted = all["haproxy"]["volumes"][0].as_str().unwrap();
    assert!(mounted.starts_with("./deploy/haproxy.cfg:"), "{mounted}");
    let cfg = std::fs::read_to_string(format!("{ROOT}/deploy/haproxy.cfg")).unwrap();
    let lines: Vec<&str> = cfg.lines().map(str::trim).collect();
    assert!(lines.contains(&"option httpchk GET /readyz"), "{cfg}");
    assert!(lines.contains(&"http-check expect status 200"), "{cfg}");
    assert!(lines.iter().any(|l| l.starts_with("default-server check port 8081")), "{cfg}");
    for (name, _) in &replicas {
        assert!(lines.contains(&format!("server {name} {name}:8080").as_str()), "no backend for {name}:\n{cfg}");
        // With no replica ready (a database outage), they still serve from their caches as unchecked backups.
        let n = name.trim_start_matches("blobgate-");
        let backup = format!("server cached-{n} {name}:8080 backup no-check");
        assert!(lines.contains(&backup.as_str()), "no cache fallback for {name}:\n{cfg}");
    }

    // Prometheus scrapes every replica's admin listener.
    let prometheus = yaml("deploy/prometheus-ha.yml");
    let targets = &prometheus["scrape_configs"][0]["static_configs"][0]["targets"];
    let want: Vec<String> = replicas.iter().map(|(name, _)| format!("{name}:8081")).collect();
    assert_eq!(targets, &serde_json::json!(want));
    assert_eq!(all["prometheus"]["volumes"][0], "./deploy/prometheus-ha.yml:/etc/prometheus/prometheus.yml:ro");
    docker_compose_accepts("docker-compose.ha.yml");
}

#[test]
fn the_dashboard_shows_every_series_per_replica_and_summed() {
    let text = std::fs::read_to_string(format!("{ROOT}/deploy/grafana/dashboards/blobgate.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap()))
        .collect();
    for series in ["blobgate_sent_bytes_total", "blobgate_active_downloads", "blobgate_open_connections"] {
        assert!(exprs.iter().any(|e| e.starts_with("sum(") && e.contains(series)), "{series} summed: {exprs:?}");
        assert!(
            exprs.iter().any(|e| e.starts_with("sum by (instance)") && e.contains(series)),
            "{series} per instance"
        );
    }
    assert!(exprs.contains(&"blobgate_database_up"), "readiness per replica: {exprs:?}");
    for series in ["blobgate_uploads_total", "blobgate_upload_bytes_total", "blobgate_cache_sync_age_seconds"] {
        assert!(exprs.iter().any(|e| e.contains(series)), "{series} has a panel: {exprs:?}");
    }
}

#[test]
fn haproxy_accepts_its_configuration() {
    let haproxy = system_binary("haproxy", "haproxy");
    let out = Command::new(haproxy).args(["-c", "-f", &format!("{ROOT}/deploy/haproxy.cfg")]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "haproxy -c: {text}");
    // The replicas' names resolve only inside the compose network; any other warning is a mistake.
    for line in text.lines().filter(|l| l.contains("[WARNING]")) {
        assert!(line.contains("could not resolve address 'blobgate-"), "haproxy -c warns: {line}");
    }
}

/// `docker compose -f FILE config` must accept the file where docker has the compose plugin (this machine's
/// docker has none; the checks above read the same file either way).
fn docker_compose_accepts(file: &str) {
    let has_compose = Command::new("docker").args(["compose", "version"]).output().is_ok_and(|o| o.status.success());
    if has_compose {
        let out = Command::new("docker")
            .args(["compose", "-f", file, "config", "--quiet"])
            .current_dir(ROOT)
            .output()
            .unwrap();
        assert!(out.status.success(), "docker compose -f {file} config: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// `deploy/haproxy-tls.cfg` with its certificate directory (`/etc/haproxy/tls`) at `tls_dir`, and with `run`
/// (the data and stats binds, one replica's data address and admin port) pointed at this test's processes: the
/// compose network's names, resolver and fixed ports become them, and nothing else changes.
fn haproxy_tls_config(tls_dir: &str, run: Option<(SocketAddr, SocketAddr, SocketAddr, u16)>) -> String {
    let source = std::fs::read_to_string(format!("{ROOT}/deploy/haproxy-tls.cfg")).unwrap();
    let source = source.replace("/etc/haproxy/tls", tls_dir);
    let Some((front, stats, replica, admin)) = run else { return source };
    let mut config = String::new();
    let mut skipping_resolvers = false;
    for line in source.lines() {
        let trimmed = line.trim_start();
        if line.starts_with("resolvers ") || (skipping_resolvers && !trimmed.is_empty()) {
            skipping_resolvers = true;
            continue;
        }
        skipping_resolvers = false;
        let line = if let Some(rest) = trimmed.strip_prefix("bind :8443 ") {
            format!("    bind {front} {rest}")
        } else if trimmed == "bind :8404" {
            format!("    bind {stats}")
        } else if trimmed.starts_with("default-server ") {
            let line = line.replace(" resolvers docker init-addr last,libc,none", "");
            assert!(line.contains(" port 8081 "), "{line}");
            line.replace(" port 8081 ", &format!(" port {admin} "))
        } else if trimmed.starts_with("server ") {
            if !trimmed.contains(" blobgate-1:8080 ") {
                continue;
            }
            line.replace("blobgate-1:8080", &replica.to_string())
        } else {
            line.to_owned()
        };
        config.push_str(&line);
        config.push('\n');
    }
    config
}

/// A directory as `/etc/haproxy/tls` holds it: HAProxy's certificate for `localhost` (`haproxy.pem`, certificate
/// and key) and the CA of the replicas' certificates (`blobgate-ca.crt`); the CA `ca` signs both, and
/// `blobgate-1.crt` / `.key` is a replica's certificate, for the name the configuration verifies.
fn haproxy_tls_pki() -> crate::helpers::pki::TestPki {
    use crate::helpers::pki::{EC, TestPki};
    let pki = TestPki::with_ca("ca");
    pki.server("front", EC, "DNS:localhost,IP:127.0.0.1", "ca");
    pki.server("blobgate-1", EC, "DNS:blobgate-1", "ca");
    let read = |name: &str| std::fs::read(pki.file(name)).unwrap();
    std::fs::write(pki.file("haproxy.pem"), [read("front.crt"), read("front.key")].concat()).unwrap();
    std::fs::write(pki.file("blobgate-ca.crt"), read("ca.crt")).unwrap();
    pki
}

#[test]
fn haproxy_accepts_its_tls_configuration_which_checks_and_verifies_the_replicas_over_https() {
    let cfg = std::fs::read_to_string(format!("{ROOT}/deploy/haproxy-tls.cfg")).unwrap();
    let lines: Vec<&str> = cfg.lines().map(str::trim).collect();
    assert!(lines.contains(&"option httpchk GET /readyz"), "{cfg}");
    assert!(lines.contains(&"http-check expect status 200"), "{cfg}");
    let default_server = lines.iter().find(|l| l.starts_with("default-server ")).expect("a default-server line");
    for option in ["ssl", "verify required", "ca-file blobgate-ca.crt", "check", "check-ssl", "port 8081"] {
        assert!(format!("{default_server} ").contains(&format!(" {option} ")), "{option}: {default_server}");
    }
    for n in 1..=3 {
        let name = format!("blobgate-{n}");
        let server = format!("server {name} {name}:8080 sni str({name}) check-sni {name}");
        assert!(lines.contains(&server.as_str()), "no verified backend for {name}:\n{cfg}");
        let backup = format!("server cached-{n} {name}:8080 backup no-check sni str({name})");
        assert!(lines.contains(&backup.as_str()), "no cache fallback for {name}:\n{cfg}");
    }
    let pki = haproxy_tls_pki();
    let path = pki.file("haproxy-tls.cfg");
    std::fs::write(&path, haproxy_tls_config(pki.file("").to_str().unwrap(), None)).unwrap();
    let out = Command::new(system_binary("haproxy", "haproxy")).arg("-c").arg("-f").arg(&path).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "haproxy -c: {text}");
    for line in text.lines().filter(|l| l.contains("[WARNING]")) {
        assert!(line.contains("could not resolve address 'blobgate-"), "haproxy -c warns: {line}");
    }
}

/// HAProxy running `config` (written into `pki`'s directory as `name`) until dropped, with its stats page at
/// `stats`.
struct RunningHaproxy {
    _child: KillOnDrop,
    stats: SocketAddr,
    log: std::path::PathBuf,
}

impl RunningHaproxy {
    fn start(pki: &crate::helpers::pki::TestPki, name: &str, config: &str, stats: SocketAddr) -> Self {
        let path = pki.file(name);
        std::fs::write(&path, config).unwrap();
        let log = std::fs::File::create(pki.file(&format!("{name}.log"))).unwrap();
        let child = Command::new(system_binary("haproxy", "haproxy"))
            .args(["-db", "-f"])
            .arg(&path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start haproxy");
        RunningHaproxy { _child: KillOnDrop(child), stats, log: pki.file(&format!("{name}.log")) }
    }

    /// What it printed so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `blobgate-1`'s `field` on the stats page (CSV): `status` (`UP`, `DOWN`), `check_status` (`L7OK`), ...
    fn server(&self, field: &str) -> Option<String> {
        std::net::TcpStream::connect(self.stats).ok()?;
        let body = request_at(self.stats, "GET", "/stats;csv", &[]).body;
        let body = String::from_utf8_lossy(&body);
        let header = body.lines().find_map(|l| l.strip_prefix("# pxname,"))?;
        let header = format!("pxname,{header}");
        let at = header.split(',').position(|f| f == field)?;
        let row = body.lines().find(|l| l.starts_with("replicas,blobgate-1,"))?;
        row.split(',').nth(at).map(str::to_owned)
    }

    /// Whether the last health check passed: `/readyz` answered 200 over a verified HTTPS connection.
    fn checked_up(&self) -> bool {
        self.server("status").as_deref() == Some("UP")
            && self.server("check_status").as_deref() == Some("L7OK")
            && self.server("check_code").as_deref() == Some("200")
    }
}

/// The TLS configuration run for real in front of an HTTPS replica: the HTTPS check on `/readyz` marks it up, and
/// an object comes through byte-exact, verified at both hops; a replica whose certificate names another server is
/// kept down.
#[test]
fn haproxy_tls_serves_an_https_replica_through_a_verified_hop() {
    require_tool("curl", "apt package curl");
    let pki = haproxy_tls_pki();
    let env = TestEnv::new();
    env.bucket("pub", true);
    let bytes = test_bytes(3 << 20, 9);
    env.put_bytes("pub", "o.bin", &bytes, &[]);
    let (cert, key) = (pki.path("blobgate-1.crt"), pki.path("blobgate-1.key"));
    let server = env.serve_with(&[("BLOBGATE_TLS__CERT", &cert), ("BLOBGATE_TLS__KEY", &key)], &[]);
    let (front, stats) = (reserved_local_addr(), reserved_local_addr());
    let replica = Some((front, stats, server.data, server.admin.port()));
    let config = haproxy_tls_config(pki.file("").to_str().unwrap(), replica);
    let haproxy = RunningHaproxy::start(&pki, "haproxy-run.cfg", &config, stats);
    assert!(
        wait_for(Duration::from_secs(20), || haproxy.checked_up()),
        "the HTTPS check on /readyz never passed: {:?} {:?}\n{config}\n{}",
        haproxy.server("status"),
        haproxy.server("check_status"),
        haproxy.log()
    );
    let curl = |args: &[&str], port: u16| {
        let url = format!("https://localhost:{port}/pub/o.bin");
        Command::new("curl")
            .args(["-sS", "--fail", "--max-time", "15", "--cacert", &pki.path("ca.crt")])
            .args(args)
            .arg(url)
            .output()
            .unwrap()
    };
    let out = curl(&[], front.port());
    assert!(out.status.success(), "curl through haproxy: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(sha256_hex(&out.stdout), sha256_hex(&bytes), "byte-exact through both TLS hops");
    assert_eq!(curl(&["-r", "1000-1999"], front.port()).stdout, &bytes[1000..2000]);
    drop(haproxy);

    // The same replica expected under another name: its certificate does not verify, for the check or traffic.
    let (front, stats) = (reserved_local_addr(), reserved_local_addr());
    let config =
        haproxy_tls_config(pki.file("").to_str().unwrap(), Some((front, stats, server.data, server.admin.port())))
            .replace("(blobgate-1)", "(blobgate-9)")
            .replace("check-sni blobgate-1", "check-sni blobgate-9");
    let haproxy = RunningHaproxy::start(&pki, "haproxy-other-name.cfg", &config, stats);
    assert!(
        wait_for(Duration::from_secs(20), || haproxy.server("status").as_deref() == Some("DOWN")),
        "a replica certificate for another name was not refused: {:?}\n{}",
        haproxy.server("check_status"),
        haproxy.log()
    );
    let out = curl(&[], front.port());
    assert!(!out.status.success() && out.stdout.is_empty(), "served through an unverified hop");
}

/// Kills a child process when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `deploy/blobgate.service`'s directives, `Key=value` as written (a key set twice appears twice).
fn unit_directives() -> Vec<(String, String)> {
    let unit = std::fs::read_to_string(format!("{ROOT}/deploy/blobgate.service")).unwrap();
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("not Key=value: {l}"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

#[test]
fn the_systemd_unit_is_sandboxed_and_systemd_analyze_accepts_it() {
    let directives = unit_directives();
    let values =
        |key: &str| -> Vec<&str> { directives.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect() };
    for (key, want) in [
        ("ProtectSystem", "strict"),
        ("ReadWritePaths", "/var/lib/blobgate /var/log/blobgate"),
        ("NoNewPrivileges", "yes"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("SystemCallFilter", "@system-service"),
        // Only for the kernel's autoload of the `tls` module (kernel TLS); see the unit's comment.
        ("CapabilityBoundingSet", "CAP_NET_ADMIN"),
        ("AmbientCapabilities", "CAP_NET_ADMIN"),
        ("ExecReload", "kill -HUP $MAINPID"),
        ("Restart", "on-failure"),
        ("User", "blobgate"),
        ("LimitNOFILE", "1048576"),
    ] {
        assert_eq!(values(key), [want], "{key}");
    }
    assert!(values("DynamicUser").is_empty(), "a static user: the data dir is long-lived state");
    let exec = values("ExecStart");
    assert_eq!(exec.len(), 1);
    assert!(exec[0].contains(" --data-dir /var/lib/blobgate ") && exec[0].ends_with(" serve"), "{exec:?}");

    // systemd's own check, on a copy whose ExecStart names the binary under test (verify wants it to exist).
    let analyze = system_binary("systemd-analyze", "systemd");
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(format!("{ROOT}/deploy/blobgate.service")).unwrap();
    let copy = dir.path().join("blobgate.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/blobgate", BIN)).unwrap();
    let out = Command::new(analyze).arg("verify").arg(&copy).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.trim().is_empty(), "systemd-analyze verify: {text}");
}
