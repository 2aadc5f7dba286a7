//! The metrics and health listener of `modstream run`, scraped after an
//! end-to-end run: the counters match what happened, the exposition passes
//! promtool, and a real Prometheus server scrapes it.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use modstream::tools::embedded::EmbeddedBroker;
use support::{DLQ, INPUT, Modstream, VERDICTS};

fn get(port: u16, path: &str) -> (u16, String) {
    support::http_get(port, path)
}

/// Sum of a metric's samples (all label sets), from the exposition text.
fn sum(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| {
            l.starts_with(name)
                && (l[name.len()..].starts_with('{') || l[name.len()..].starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn metrics_match_what_happened_and_prometheus_scrapes_them() {
    let broker = EmbeddedBroker::start(&[(INPUT, 2), (VERDICTS, 2), (DLQ, 1)]).unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let mut events = support::events("p-", 0..500);
    for i in 0..7 {
        events.push((format!("bad-{i}"), "k".into(), b"not json".to_vec()));
    }
    let acked = support::produce(&bootstrap, &events);
    let valid: Vec<String> = acked
        .iter()
        .filter(|id| id.starts_with("p-"))
        .cloned()
        .collect();

    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &bootstrap, "g-metrics");
    let port = support::free_port();
    let service = Command::new(env!("CARGO_BIN_EXE_modstream"))
        .args(["run", "--config"])
        .arg(&config)
        .env("MODSTREAM__TELEMETRY__LISTEN", format!("127.0.0.1:{port}"))
        // The latency target's controller chooses the batching here (every
        // other test runs fixed batching).
        .env("MODSTREAM__BATCHING__TARGET_P99", "50ms")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut service = Modstream::adopt(service, "metrics");

    let v = support::verify(&bootstrap, &valid, Duration::from_secs(60));
    assert!(v.lost.is_empty());
    // DLQ deliveries are acknowledged around the same time; give them a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut exposition = get(port, "/metrics").1;
    let committed = "modstream_commits_total{outcome=\"ok\"}";
    while (sum(&exposition, "modstream_dlq_total") < 7.0 || sum(&exposition, committed) < 1.0)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(200));
        exposition = get(port, "/metrics").1;
    }

    assert_eq!(get(port, "/healthz").0, 200);
    let (status, ready) = get(port, "/readyz");
    assert_eq!(status, 200, "{ready}");
    assert!(ready.contains("\"ready\":true"), "{ready}");

    assert_eq!(
        sum(&exposition, "modstream_verdicts_total"),
        500.0,
        "verdicts_total == valid events"
    );
    assert_eq!(
        sum(&exposition, "modstream_dlq_total"),
        7.0,
        "dlq_total == malformed events"
    );
    assert!(exposition.contains("modstream_dlq_total{reason=\"invalid_json\"} 7"));
    // The periodic commit's outcome reaches the counter (kafka.commit_interval).
    assert!(
        sum(&exposition, committed) >= 1.0,
        "commits counted:\n{exposition}"
    );
    // By the rule that decided (the configuration's thresholds: "default"),
    // and per model.
    assert_eq!(sum(&exposition, "modstream_policy_verdicts_total"), 500.0);
    for verdict in ["allow", "review", "block"] {
        assert!(
            exposition.contains(&format!(
                "modstream_policy_verdicts_total{{rule=\"default\",verdict=\"{verdict}\"}}"
            )),
            "{verdict}"
        );
    }
    assert!(exposition.contains("modstream_model_events_total{model=\"default\"} 500"));
    assert_eq!(sum(&exposition, "modstream_events_consumed_total"), 507.0);
    let batches = sum(&exposition, "modstream_batch_size_count");
    assert!(batches >= 1.0);
    assert_eq!(
        sum(&exposition, "modstream_inference_seconds_count"),
        batches,
        "one inference per batch"
    );
    assert_eq!(
        sum(&exposition, "modstream_batch_size_sum"),
        500.0,
        "every valid event scored once"
    );
    assert_eq!(
        sum(&exposition, "modstream_end_to_end_latency_seconds_count"),
        500.0
    );

    // The controller's choice is exported, within the configured bounds.
    let size = sum(&exposition, "modstream_batch_target_size");
    assert!((1.0..=32.0).contains(&size), "chosen size {size}");
    let delay = sum(&exposition, "modstream_batch_target_delay_seconds");
    assert!((0.0..=0.010).contains(&delay), "chosen deadline {delay}");
    // The events were produced before the service started, so their
    // end-to-end latency includes its start-up: at this scrape the target
    // may be reported missed. Both gauges are exported; once the backlog is
    // gone and the service idles, the controller leaves saturation and the
    // target is no longer reported missed (within a few of its 100 ms ticks).
    for gauge in [
        "modstream_latency_target_missed",
        "modstream_batching_saturated",
    ] {
        assert!(
            exposition.contains(&format!("{gauge} ")),
            "{gauge} exported"
        );
    }
    let idle_by = Instant::now() + Duration::from_secs(10);
    let idle = loop {
        let now = get(port, "/metrics").1;
        let (missed, saturated) = (
            sum(&now, "modstream_latency_target_missed"),
            sum(&now, "modstream_batching_saturated"),
        );
        if (missed, saturated) == (0.0, 0.0) || Instant::now() > idle_by {
            break (missed, saturated);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        idle,
        (0.0, 0.0),
        "idle: (target missed, saturated) go back to 0"
    );

    // promtool accepts the exposition.
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed (scripts/test.sh installs it)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // A real Prometheus scrapes the service while more events flow.
    let prom_port = support::free_port();
    let prom_dir = tempfile::tempdir().unwrap();
    std::fs::write(
        prom_dir.path().join("prometheus.yml"),
        format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: modstream\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"),
    )
    .unwrap();
    let mut prometheus = Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            prom_dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            prom_dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus is installed (scripts/test.sh installs it)");
    let more = support::events("q-", 0..2000);
    let load = support::produce_paced(bootstrap.clone(), more, Duration::from_secs(8));
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut rate = 0.0;
    while Instant::now() < deadline && rate <= 0.0 {
        std::thread::sleep(Duration::from_secs(1));
        let Ok(stream) = TcpStream::connect(("127.0.0.1", prom_port)) else {
            continue;
        };
        drop(stream);
        let (status, body) = get(
            prom_port,
            "/api/v1/query?query=sum(rate(modstream_verdicts_total%5B5s%5D))",
        );
        if status != 200 {
            continue;
        }
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        rate = json["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
    }
    load.join().unwrap();
    let empty = dashboard_queries_without_a_series(prom_port, Duration::from_secs(30));
    let _ = prometheus.kill();
    let _ = prometheus.wait();
    println!("prometheus saw sum(rate(modstream_verdicts_total[5s])) = {rate:.1}/s");
    assert!(rate > 0.0, "Prometheus scraped a non-zero verdict rate");
    assert!(
        empty.is_empty(),
        "dashboard queries that return no series from a running instance: {empty:?}"
    );
    assert!(service.terminate(Duration::from_secs(20)));
}

/// Alerts need series that exist: an idle instance (no event yet) exports
/// every counter and gauge at 0, with its known labels.
#[test]
fn an_idle_instance_exports_every_series_at_zero() {
    let broker = EmbeddedBroker::start(&[(INPUT, 2), (VERDICTS, 2), (DLQ, 1)]).unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &bootstrap, "g-idle");
    // A list: its series are labelled by it.
    let list = dir.path().join("spam.jsonl");
    std::fs::write(
        &list,
        "{\"id\": \"a\", \"verdict\": \"block\", \"label\": \"spam\", \"text\": \"buy now\"}\n",
    )
    .unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{text}\n[matching]\nlists = [{{ name = \"spam\", file = {list:?} }}]\n")
            // Sampling: its series are per tenant, `_none` from the start.
            .replace("[output]\n", "[output]\nsamples_topic = \"samples\"\n")
            // CUDA asked for, without require_gpu: it runs on the CPU (this
            // machine's ONNX Runtime has no CUDA) and says so.
            .replace(
                "[inference]\n",
                "[inference]\nexecution_providers = [\"cuda\", \"cpu\"]\n",
            ),
    )
    .unwrap();
    let port = support::free_port();
    let service = Command::new(env!("CARGO_BIN_EXE_modstream"))
        .args(["run", "--config"])
        .arg(&config)
        .env("MODSTREAM__TELEMETRY__LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _service = Modstream::adopt(service, "idle");
    let deadline = Instant::now() + Duration::from_secs(30);
    let exposition = loop {
        let ready =
            TcpStream::connect(("127.0.0.1", port)).is_ok() && get(port, "/readyz").0 == 200;
        if ready {
            break get(port, "/metrics").1;
        }
        assert!(
            Instant::now() < deadline,
            "the idle instance never got ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Per-partition series appear with their partitions; histograms with
    // their first observation.
    let per_partition = [
        modstream::telemetry::metric::OLDEST_PENDING_SECONDS,
        modstream::telemetry::metric::CONSUMER_LAG,
    ];
    use modstream::telemetry::metric::{TABLE, Type};
    for m in TABLE {
        let name = &m.name;
        if per_partition.contains(name) || m.kind == Type::Histogram {
            continue;
        }
        assert!(
            exposition
                .lines()
                .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))),
            "{name} is not exported by an idle instance:\n{exposition}"
        );
    }
    for line in [
        "modstream_list_items{list=\"spam\"} 1",
        "modstream_list_matches_total{list=\"spam\",verdict=\"block\"} 0",
        "modstream_samples_total{tenant=\"_none\"} 0",
        "modstream_verdicts_total{verdict=\"block\"} 0",
        "modstream_dlq_total{reason=\"invalid_json\"} 0",
        "modstream_events_consumed_total{topic=\"posts\"} 0",
        "modstream_undeliverable_total{kind=\"dlq\"} 0",
        "modstream_stalled_partitions 0",
        "modstream_batch_target_size 32",
        "modstream_model_provider{model=\"default\",provider=\"cpu\"} 1",
        "modstream_model_cpu_nodes{model=\"default\"} 0",
        "modstream_analytics_given_up_total{kind=\"sample\"} 0",
    ] {
        assert!(exposition.contains(line), "missing `{line}`:\n{exposition}");
    }
    assert!(
        !exposition.contains("provider=\"cuda\""),
        "no session runs on CUDA here:\n{exposition}"
    );
    let (_, ready) = get(port, "/readyz");
    assert!(
        ready.contains(
            r#""models":[{"cpu_nodes":0,"model":"default","providers":["cpu"],"workers":"#
        ),
        "/readyz says where the model runs: {ready}"
    );
}

/// The Grafana dashboard's queries (every panel's targets) that Prometheus,
/// scraping a running instance, still answers with no series by `within`
/// (a query of a metric that does not exist never has one).
fn dashboard_queries_without_a_series(prom_port: u16, within: Duration) -> Vec<String> {
    let path = support::repo_root().join("deploy/grafana/dashboards/modstream.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    fn targets(panels: &serde_json::Value, out: &mut Vec<String>) {
        for panel in panels.as_array().into_iter().flatten() {
            let exprs = panel["targets"].as_array().into_iter().flatten();
            out.extend(exprs.filter_map(|t| t["expr"].as_str().map(String::from)));
            targets(&panel["panels"], out);
        }
    }
    let mut queries = Vec::new();
    targets(&dashboard["panels"], &mut queries);
    assert!(queries.len() >= 5, "the dashboard's queries: {queries:?}");
    let deadline = Instant::now() + within;
    loop {
        queries.retain(|q| {
            let encoded: String = (q.bytes())
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect();
            let (status, body) = get(prom_port, &format!("/api/v1/query?query={encoded}"));
            let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let found = json["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty());
            !(status == 200 && found)
        });
        if queries.is_empty() || Instant::now() > deadline {
            return queries;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
