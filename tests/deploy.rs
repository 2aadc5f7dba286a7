//! The local stack's files: docker-compose.yml is valid, the image builds the
//! binary the tests use, Prometheus' config is valid, and the Grafana
//! dashboard parses and names only metrics the service exports.
//! (No Docker engine runs here; containers themselves are not started.)

use std::process::Command;

use modstream::telemetry::metric;

#[test]
fn docker_compose_file_is_valid() {
    let out = Command::new("docker-compose")
        .args(["-f", "docker-compose.yml", "config", "-q"])
        .output()
        .expect("docker-compose is installed (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_image_builds_the_same_binary_as_the_tests() {
    let dockerfile = std::fs::read_to_string("Dockerfile").unwrap();
    let builds: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("RUN") && l.contains("cargo build"))
        .collect();
    assert_eq!(
        builds,
        ["RUN cargo build --release --locked"],
        "default features, locked dependencies"
    );
    assert!(
        dockerfile.contains("scripts/fetch-onnxruntime.sh"),
        "ONNX Runtime from the same wheel as the tests"
    );
    assert!(dockerfile.contains("ORT_DYLIB_PATH=/opt/onnxruntime/libonnxruntime.so.1.31.1"));
}

/// `promtool check KIND FILE` passes.
fn promtool_check(kind: &str, file: &str) {
    let out = Command::new("promtool")
        .args(["check", kind, file])
        .output()
        .expect("promtool is installed (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn prometheus_config_is_valid() {
    promtool_check("config", "deploy/prometheus.yml");
}

/// Every `modstream_` name in `text`.
fn metric_names(text: &str) -> Vec<String> {
    let mut used = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("modstream_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        used.push(name);
    }
    used
}

#[test]
fn the_alert_rules_are_valid_and_name_only_exported_metrics() {
    promtool_check("rules", "deploy/alerts.yml");
    let rules = std::fs::read_to_string("deploy/alerts.yml").unwrap();
    let exprs: String = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect();
    let used = metric_names(&exprs);
    for name in &used {
        assert!(
            metric::ALL.contains(&name.as_str()),
            "{name} is not exported"
        );
    }
    assert!(
        used.iter().any(|u| u == metric::STALLED_PARTITIONS),
        "an alert on stalled partitions"
    );
}

#[test]
fn the_dashboard_names_only_exported_metrics() {
    let text = std::fs::read_to_string("deploy/grafana/dashboards/modstream.json").unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut used = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            used.extend(metric_names(target["expr"].as_str().unwrap()));
        }
    }
    assert!(
        used.len() >= 6,
        "the dashboard queries modstream metrics: {used:?}"
    );
    for name in &used {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        assert!(
            metric::ALL.contains(&base) || metric::ALL.contains(&name.as_str()),
            "{name} is not exported"
        );
    }
    for wanted in [
        metric::VERDICTS_TOTAL,
        metric::BATCH_SIZE,
        metric::END_TO_END_SECONDS,
        metric::CONSUMER_LAG,
        metric::DLQ_TOTAL,
    ] {
        assert!(
            used.iter().any(|u| u.starts_with(wanted)),
            "the dashboard shows {wanted}"
        );
    }
}
