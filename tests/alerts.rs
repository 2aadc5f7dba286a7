//! The shipped alert rules (deploy/alerts.yml) evaluated by a real
//! Prometheus scraping a running `modstream run` on Apache Kafka: an idle
//! healthy instance fires none; with the verdict topic deleted the
//! partitions stall and `ModstreamPartitionStalled` goes pending, then
//! firing within its `for:` plus a scrape and an evaluation interval, and
//! resolves once the topic is back; a model failing on every event fires
//! `ModstreamModelFailing` the same way, resolved by a fixed model. The
//! alerts whose `for:` is too long to wait out (lag growing, deliveries
//! failing) run in promtool's rule tests, in virtual time.

mod support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::Broker;
use support::{DLQ, INPUT, Modstream, VERDICTS};

/// Prometheus's scrape and rule evaluation interval here.
const INTERVAL: Duration = Duration::from_secs(1);

struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scraping 127.0.0.1:`target` with the shipped rules loaded.
    fn start(target: u16) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let rules = support::repo_root().join("deploy/alerts.yml");
        let port = support::free_port();
        let secs = INTERVAL.as_secs();
        std::fs::write(
            dir.path().join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: {secs}s\n  evaluation_interval: {secs}s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: modstream\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n",
                rules.display()
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is installed (scripts/test.sh installs it)");
        Prometheus {
            child,
            port,
            _dir: dir,
        }
    }

    /// Each alert now and its state (`pending` or `firing`); `None` while
    /// Prometheus does not answer yet.
    fn alerts(&self) -> Option<BTreeMap<String, String>> {
        let (status, body) = support::http_get(self.port, "/api/v1/alerts");
        if status != 200 {
            return None;
        }
        let json: serde_json::Value = serde_json::from_str(&body).ok()?;
        let alerts = json["data"]["alerts"].as_array()?;
        Some(
            alerts
                .iter()
                .map(|a| {
                    (
                        a["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                        a["state"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect(),
        )
    }

    /// Whether its scrape of the target is up.
    fn scraping(&self) -> bool {
        let (status, body) = support::http_get(self.port, "/api/v1/query?query=up");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        status == 200 && json["data"]["result"][0]["value"][1] == "1"
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `modstream run` on `broker` (its configuration edited by `edit`, its
/// /metrics on a free port) and a Prometheus that has scraped it.
fn watched(
    broker: &Broker,
    dir: &std::path::Path,
    name: &str,
    edit: impl FnOnce(String) -> String,
) -> (Modstream, Prometheus) {
    let config = support::write_config(dir, &broker.bootstrap(), &format!("g-{name}"));
    let metrics = support::free_port();
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{metrics}\""),
    );
    std::fs::write(&config, edit(text)).unwrap();
    let service = Modstream::start(&config, name, dir);
    let prom = Prometheus::start(metrics);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !prom.scraping() {
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped the service"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    (service, prom)
}

/// Waits until `alert` is in `state` (or gone, for `None`); when it got there.
fn wait_for(prom: &Prometheus, alert: &str, state: Option<&str>, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let now = prom.alerts().unwrap_or_default();
        if now.get(alert).map(String::as_str) == state {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{alert} not {state:?} within {within:?}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn a_stalled_partition_fires_its_alert_after_its_for_and_resolves() {
    let broker = Broker::start();
    broker.create_topic(INPUT, 2);
    broker.create_topic(VERDICTS, 2);
    broker.create_topic(DLQ, 1);
    let dir = tempfile::tempdir().unwrap();
    // The stall shows 3 s after the oldest event stops moving; the topic is
    // never created by a client (as in production, where it is created once).
    let (mut service, prom) = watched(&broker, dir.path(), "alerts", |text| {
        let text = text.replace(
            "\"linger.ms\" = 2",
            "\"linger.ms\" = 2\n\"allow.auto.create.topics\" = false",
        );
        format!("{text}\n[limits]\nstall_after = \"3s\"\n")
    });

    // Healthy and working, then idle: no alert at all, pending or firing.
    support::produce(&broker.bootstrap(), &support::events("h-", 0..200));
    let quiet_until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < quiet_until {
        let now = prom.alerts().unwrap_or_default();
        assert!(now.is_empty(), "a healthy instance fires nothing: {now:?}");
        std::thread::sleep(Duration::from_millis(500));
    }

    // No verdict topic: deliveries cannot complete, the partitions stall.
    broker.delete_topic(VERDICTS);
    support::produce(&broker.bootstrap(), &support::events("s-", 0..100));
    let pending = wait_for(
        &prom,
        "ModstreamPartitionStalled",
        Some("pending"),
        Duration::from_secs(30),
    );
    let firing = wait_for(
        &prom,
        "ModstreamPartitionStalled",
        Some("firing"),
        Duration::from_secs(90),
    );
    let took = firing - pending;
    println!("ModstreamPartitionStalled: pending, then firing {took:?} later");
    // `for: 1m`: not sooner (less this poll's steps, which see each state
    // up to a scrape late), and within a scrape and an evaluation after it.
    assert!(
        took >= Duration::from_secs(58) && took <= Duration::from_secs(60) + 3 * INTERVAL,
        "pending to firing took {took:?} against for: 1m"
    );

    // The topic back: the partitions move, the alert resolves.
    broker.create_topic(VERDICTS, 2);
    wait_for(
        &prom,
        "ModstreamPartitionStalled",
        None,
        Duration::from_secs(60),
    );
    assert!(service.terminate(Duration::from_secs(30)));
}

/// The alerts whose `for:` is too long to wait out here (lag growing,
/// 15 min; deliveries failing, 5 min) in Prometheus's own rule tests, in
/// virtual time: absent a minute before their `for:` has passed, firing
/// from then (tests/prometheus/long-alerts.yml).
#[test]
fn the_long_alerts_fire_after_their_for_in_promtools_rule_tests() {
    let out = Command::new("promtool")
        .args(["test", "rules", "long-alerts.yml"])
        .current_dir(support::repo_root().join("tests/prometheus"))
        .output()
        .expect("promtool is installed (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The model fails on every event (tests/data/failing-model on texts that
/// are not numbers): the circuit breaker opens, `ModstreamModelFailing`
/// goes pending, then firing within its `for:` plus a scrape and an
/// evaluation interval; a fixed model swapped in (the model directory's
/// symlink, as a deployment does) closes the breaker and resolves it.
#[test]
fn a_failing_model_fires_its_alert_and_a_fixed_one_resolves_it() {
    let broker = Broker::start();
    broker.create_topic(INPUT, 1);
    broker.create_topic(VERDICTS, 1);
    broker.create_topic(DLQ, 1);
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let root = support::repo_root();
    std::os::unix::fs::symlink(root.join("tests/data/failing-model"), &model).unwrap();
    let (mut service, prom) = watched(&broker, dir.path(), "breaker", |text| {
        let edited = text.replace(
            &format!(
                "model_dir = \"{}\"",
                root.join("models/profanity-check").display()
            ),
            &format!(
                "model_dir = \"{}\"\nreload_interval = \"1s\"",
                model.display()
            ),
        );
        assert!(edited.contains("reload_interval"), "{edited}");
        edited
    });

    // Texts the model cannot read, in runs of their own: every run fails,
    // and after `inference.breaker_after` (5) of them the breaker opens.
    for i in 0..10 {
        support::produce(
            &broker.bootstrap(),
            &support::events("f-", 3 * i..3 * i + 3),
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let pending = wait_for(
        &prom,
        "ModstreamModelFailing",
        Some("pending"),
        Duration::from_secs(60),
    );
    let firing = wait_for(
        &prom,
        "ModstreamModelFailing",
        Some("firing"),
        Duration::from_secs(90),
    );
    let took = firing - pending;
    println!("ModstreamModelFailing: pending, then firing {took:?} later");
    assert!(
        took >= Duration::from_secs(58) && took <= Duration::from_secs(60) + 3 * INTERVAL,
        "pending to firing took {took:?} against for: 1m"
    );

    // A model that works, swapped in: the breaker closes, the alert resolves.
    let fixed = dir.path().join("model.next");
    std::os::unix::fs::symlink(root.join("models/profanity-check"), &fixed).unwrap();
    std::fs::rename(&fixed, &model).unwrap();
    wait_for(
        &prom,
        "ModstreamModelFailing",
        None,
        Duration::from_secs(90),
    );
    assert!(service.terminate(Duration::from_secs(30)));
}
