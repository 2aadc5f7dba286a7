//! The local stack's files: docker-compose.yml is valid, the image builds the
//! binary the tests use, Prometheus' config is valid, and the Grafana
//! dashboard parses and names only metrics the service exports.
//! (No Docker engine runs here; containers themselves are not started.)

use std::process::Command;

mod support;

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
        ["RUN cargo build --release --locked -p modstream"],
        "default features (no charts), locked dependencies, the service's package"
    );
    assert!(
        dockerfile.contains("scripts/fetch-onnxruntime.sh"),
        "ONNX Runtime from the same wheel as the tests"
    );
    assert!(dockerfile.contains("ORT_DYLIB_PATH=/opt/onnxruntime/libonnxruntime.so.1.31.1"));
}

/// The image's package, as the image builds it, links no chart library
/// (`prevalence --chart` is behind the `charts` feature, which only the
/// workspace's build turns on, through the bench).
#[test]
fn the_service_package_links_no_chart_library() {
    let tree = |extra: &[&str]| {
        let out = Command::new(env!("CARGO"))
            .args([
                "tree",
                "--offline",
                "--locked",
                "-e",
                "normal",
                "-p",
                "modstream",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert!(!tree(&[]).contains("plotters"));
    assert!(tree(&["--features", "charts"]).contains("plotters"));
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

/// `kubectl kustomize` an overlay of deploy/k8s and check every object
/// against its schema (deploy/k8s/validate.py); the objects as JSON.
fn render(overlay: &str) -> Vec<serde_json::Value> {
    let kustomize = Command::new("kubectl")
        .args(["kustomize", &format!("deploy/k8s/overlays/{overlay}")])
        .output()
        .expect("kubectl is installed (scripts/test.sh installs it)");
    assert!(
        kustomize.status.success(),
        "kubectl kustomize {overlay}: {}",
        String::from_utf8_lossy(&kustomize.stderr)
    );
    let python = support::prepared_python("MODSTREAM_K8S_PYTHON", "k8s-validate");
    let mut validate = Command::new(python)
        .arg("deploy/k8s/validate.py")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    validate
        .stdin
        .take()
        .unwrap()
        .write_all(&kustomize.stdout)
        .unwrap();
    let out = validate.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{overlay}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn object<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn seconds(d: std::time::Duration) -> u64 {
    d.as_secs()
}

#[test]
fn the_kubernetes_overlays_render_validate_and_agree_with_the_config() {
    let config = std::fs::read_to_string("config/modstream.toml").unwrap();
    assert_eq!(
        std::fs::read_to_string("deploy/k8s/base/modstream.toml").unwrap(),
        config,
        "the ConfigMap's copy of config/modstream.toml is the same file"
    );
    let settings = modstream::config::Settings::from_toml(&config).unwrap();
    let alerts = std::fs::read_to_string("deploy/alerts.yml").unwrap();
    let alert_names: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(str::trim)
        .collect();

    for overlay in ["cpu", "gpu"] {
        let docs = render(overlay);
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        for kind in [
            "Deployment",
            "Service",
            "ConfigMap",
            "Secret",
            "PodDisruptionBudget",
            "ScaledObject",
            "PodMonitor",
            "PrometheusRule",
        ] {
            assert!(kinds.contains(&kind), "{overlay} renders a {kind}");
        }

        // The ScaledObject scales the Deployment on the config's group and topic.
        let scaled = object(&docs, "ScaledObject");
        let trigger = &scaled["spec"]["triggers"][0];
        assert_eq!(trigger["type"], "kafka");
        assert_eq!(
            trigger["metadata"]["consumerGroup"],
            settings.kafka.group_id
        );
        assert_eq!(trigger["metadata"]["topic"], settings.input.topics[0]);
        assert_eq!(trigger["metadata"]["offsetResetPolicy"], "earliest");
        let deployment = object(&docs, "Deployment");
        assert_eq!(
            scaled["spec"]["scaleTargetRef"]["name"],
            deployment["metadata"]["name"]
        );
        let max = scaled["spec"]["maxReplicaCount"].as_u64().unwrap();
        let partitions: u64 = scaled["metadata"]["annotations"]["modstream.dev/input-partitions"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(max <= partitions, "no more members than partitions");
        assert!(
            scaled["spec"]["minReplicaCount"].as_u64().unwrap() >= 1,
            "never scaled to zero"
        );
        assert!(
            trigger["metadata"]["lagThreshold"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                > 0
        );

        // The grace period outlasts shutdown plus a drain.
        let pod = &deployment["spec"]["template"]["spec"];
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
        assert!(
            grace
                > seconds(settings.kafka.shutdown_timeout) + seconds(settings.kafka.drain_timeout),
            "grace {grace} s"
        );
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        let container = &pod["containers"][0];
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);

        // Probes and the monitor point at what modstream serves, where it listens.
        let env = |name: &str| {
            container["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == name)
                .map(|e| e["value"].clone())
        };
        let listen = env("MODSTREAM__TELEMETRY__LISTEN").unwrap();
        let port: u64 = listen
            .as_str()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(container["ports"][0]["containerPort"], port);
        let port_name = &container["ports"][0]["name"];
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(&container["readinessProbe"]["httpGet"]["port"], port_name);
        let monitor = object(&docs, "PodMonitor");
        assert_eq!(
            &monitor["spec"]["podMetricsEndpoints"][0]["port"],
            port_name
        );
        assert_eq!(
            monitor["spec"]["podMetricsEndpoints"][0]["path"],
            "/metrics"
        );
        for (k, v) in monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
        {
            assert_eq!(&deployment["spec"]["template"]["metadata"]["labels"][k], v);
        }
        // The secret reaches librdkafka's sasl.password, never as a plain value.
        let password = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "MODSTREAM__KAFKA__CONSUMER__SASL__PASSWORD")
            .unwrap();
        assert!(password["valueFrom"]["secretKeyRef"].is_object());

        // The PrometheusRule carries deploy/alerts.yml's alerts, each on exported metrics.
        let rule = object(&docs, "PrometheusRule");
        let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
        let names: Vec<&str> = rules.iter().filter_map(|r| r["alert"].as_str()).collect();
        assert_eq!(names, alert_names);
        for r in rules {
            let used = metric_names(r["expr"].as_str().unwrap());
            assert!(!used.is_empty());
            for name in used {
                assert!(
                    metric::ALL.contains(&name.as_str()),
                    "{name} is not exported"
                );
            }
        }

        let limits = &container["resources"]["limits"];
        if overlay == "gpu" {
            assert_eq!(limits["nvidia.com/gpu"], 1);
            assert!(container["image"].as_str().unwrap().ends_with("-gpu"));
            assert_eq!(
                env("MODSTREAM__INFERENCE__EXECUTION_PROVIDERS").unwrap(),
                "cuda,cpu"
            );
            assert!(pod["tolerations"].as_array().is_some_and(|t| !t.is_empty()));
        } else {
            assert!(limits.get("nvidia.com/gpu").is_none());
        }
    }
    let dockerfile = std::fs::read_to_string("Dockerfile").unwrap();
    assert!(
        dockerfile.contains(" AS gpu\n"),
        "the gpu overlay's image target"
    );
}

/// The CPU overlay's lagThreshold is what `modstream plan` derives from the
/// shipped bench report.
#[test]
fn the_lag_threshold_comes_from_the_shipped_bench_report() {
    let docs = render("cpu");
    let threshold: u64 =
        object(&docs, "ScaledObject")["spec"]["triggers"][0]["metadata"]["lagThreshold"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_modstream"))
        .args([
            "plan",
            "--rate",
            "100000",
            "--p99",
            "50",
            "--json",
            "--from",
            "docs/bench/bench.json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["lag_threshold"], threshold);
    assert!(plan["instances"].as_u64().unwrap() >= 1);
    assert!(plan["partitions"].as_u64().unwrap() >= plan["instances"].as_u64().unwrap());
}

/// docker-compose's Kafka and the tests' Kafka (tests/kafka/server.properties)
/// are the same broker with the same settings: same version, and every
/// broker setting compose gives (environment `KAFKA_A_B` = property `a.b`)
/// has the same value in the tests' properties, host addresses aside.
#[test]
fn the_compose_broker_and_the_tests_broker_agree() {
    let compose = std::fs::read_to_string("docker-compose.yml").unwrap();
    let pom = std::fs::read_to_string("tests/kafka/pom.xml").unwrap();
    let version = pom
        .split("<kafka.version>")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .expect("kafka.version in the pom");
    for image in compose
        .lines()
        .filter(|l| l.contains("image: apache/kafka"))
    {
        assert!(
            image.trim().ends_with(&format!(":{version}")),
            "compose runs the tests' Kafka {version}: {image}"
        );
    }
    let properties: std::collections::HashMap<String, String> =
        std::fs::read_to_string("tests/kafka/server.properties")
            .unwrap()
            .replace("@REPLICATION@", "1")
            .replace("@MIN_ISR@", "1")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    // Addresses and ids differ by nature (container names vs free ports);
    // the tests' protocol map adds the secured listener.
    let per_host = [
        "node.id",
        "listeners",
        "advertised.listeners",
        "controller.quorum.voters",
        "listener.security.protocol.map",
    ];
    let mut compared = 0;
    for line in compose.lines() {
        let Some((key, value)) = line.trim().split_once(": ") else {
            continue;
        };
        let Some(name) = key.strip_prefix("KAFKA_") else {
            continue;
        };
        let property = name.to_lowercase().replace('_', ".");
        if per_host.contains(&property.as_str()) {
            continue;
        }
        let value = value.trim_matches('"');
        assert_eq!(
            properties.get(&property).map(String::as_str),
            Some(value),
            "{property}: docker-compose.yml says {value}"
        );
        compared += 1;
    }
    assert!(compared >= 5, "compared {compared} settings");
    let map = properties["listener.security.protocol.map"].as_str();
    for listener in ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"] {
        assert!(map.contains(listener) && compose.contains(listener));
    }
}
