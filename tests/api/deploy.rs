//! The deployment files: both compose files are safe by default (admin, Prometheus and Grafana on 127.0.0.1
//! only, no anonymous Grafana, a healthcheck on every service, `/readyz` for blobgate), the HA file runs three
//! replicas on one shared volume and one PostgreSQL URL behind HAProxy, Prometheus scrapes every replica, and
//! `haproxy -c` accepts the HAProxy configuration. YAML is read by PyYAML (python3) into JSON; the assertions
//! are here. Where docker has compose, `docker compose config` must accept both files too.

use std::process::Command;

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
