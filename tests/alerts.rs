//! The shipped alert rules (deploy/alerts.yml) evaluated by a real
//! Prometheus scraping a running `modstream run` on Apache Kafka: an idle
//! healthy instance fires none; with the verdict topic deleted the
//! partitions stall and `ModstreamPartitionStalled` goes pending, then
//! firing within its `for:` plus a scrape and an evaluation interval, and
//! resolves once the topic is back, while `ModstreamDeliveriesFailing` goes
//! pending then firing too; a model failing on every event fires
//! `ModstreamModelFailing` the same way, resolved by a fixed model; a paced
//! overload fires `ModstreamLagGrowing`, resolved when a faster model lets
//! the group catch up. The two alerts whose `for:` is too long to wait out
//! (lag growing, 15 min; deliveries failing, 5 min) run live with only that
//! `for:` shortened in a copy of the rules (their expressions as shipped),
//! and with their shipped `for:` in promtool's rule tests, in virtual time.

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

/// The `for:` of the alerts too long to wait out, in the rules the live
/// tests load: (alert, shipped, here).
const SHORTENED: [(&str, &str, &str); 2] = [
    ("ModstreamLagGrowing", "15m", "20s"),
    ("ModstreamDeliveriesFailing", "5m", "10s"),
];

/// deploy/alerts.yml with only the `for:` of [`SHORTENED`] changed.
fn rules_to_load(dir: &std::path::Path) -> std::path::PathBuf {
    let shipped = std::fs::read_to_string(support::repo_root().join("deploy/alerts.yml")).unwrap();
    let mut blocks: Vec<String> = shipped.split("      - alert: ").map(String::from).collect();
    for (alert, from, to) in SHORTENED {
        let block = (blocks.iter_mut())
            .find(|b| b.starts_with(&format!("{alert}\n")))
            .unwrap_or_else(|| panic!("{alert} is in deploy/alerts.yml"));
        let was = format!("        for: {from}\n");
        assert!(block.contains(&was), "{alert} has for: {from}");
        *block = block.replace(&was, &format!("        for: {to}\n"));
    }
    let path = dir.join("alerts.yml");
    std::fs::write(&path, blocks.join("      - alert: ")).unwrap();
    path
}

/// The shortened `for:` of `alert`.
fn shortened(alert: &str) -> Duration {
    let (_, _, to) = SHORTENED.iter().find(|(a, _, _)| *a == alert).unwrap();
    Duration::from_secs(to.trim_end_matches('s').parse().unwrap())
}

impl Prometheus {
    /// Scraping 127.0.0.1:`target` with the shipped rules loaded (the long
    /// `for:` shortened, [`rules_to_load`]).
    fn start(target: u16) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let rules = rules_to_load(dir.path());
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

/// Waits until `alert` is in `state` (or gone, for `None`).
fn wait_for(prom: &Prometheus, alert: &str, state: Option<&str>, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = prom.alerts().unwrap_or_default();
        if now.get(alert).map(String::as_str) == state {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{alert} not {state:?} within {within:?}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Polls every alert until each of `alerts` is firing, noting when each
/// was first seen pending and firing; then checks that each went pending,
/// then firing after its `for:` (not sooner, less this poll's steps, which
/// see each state up to a scrape late; within a scrape and an evaluation
/// after it).
fn pending_then_firing(prom: &Prometheus, alerts: &[(&str, Duration)], within: Duration) {
    let mut seen: BTreeMap<(String, String), Instant> = BTreeMap::new();
    let deadline = Instant::now() + within;
    loop {
        let now = prom.alerts().unwrap_or_default();
        for (alert, state) in &now {
            seen.entry((alert.clone(), state.clone()))
                .or_insert_with(Instant::now);
        }
        if alerts
            .iter()
            .all(|(a, _)| now.get(*a).is_some_and(|s| s == "firing"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{alerts:?} not all firing within {within:?}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    for (alert, for_) in alerts {
        let at = |state: &str| seen.get(&(alert.to_string(), state.to_string())).copied();
        let (Some(pending), Some(firing)) = (at("pending"), at("firing")) else {
            panic!("{alert} was not seen pending before firing");
        };
        let took = firing - pending;
        println!("{alert}: pending, then firing {took:?} later");
        assert!(
            took + 2 * INTERVAL >= *for_ && took <= *for_ + 3 * INTERVAL,
            "{alert}: pending to firing took {took:?} against for: {for_:?}"
        );
    }
}

/// A one-node broker with the input and verdict topics of `partitions`
/// partitions and the dead-letter topic.
fn broker_with_topics(partitions: i32) -> Broker {
    let broker = Broker::start();
    broker.create_topic(INPUT, partitions);
    broker.create_topic(VERDICTS, partitions);
    broker.create_topic(DLQ, 1);
    broker
}

/// A model directory that is a symlink (as a deployment swaps it), first
/// to `first` (relative to the repository); [`SwappedModel::swap`] points
/// it at another.
struct SwappedModel {
    link: std::path::PathBuf,
}

impl SwappedModel {
    fn new(dir: &std::path::Path, first: &str) -> SwappedModel {
        let link = dir.join("model");
        std::os::unix::fs::symlink(support::repo_root().join(first), &link).unwrap();
        SwappedModel { link }
    }

    /// The service's configuration on this model, reloaded every second,
    /// with `more` [inference] keys.
    fn configure(&self, text: String, more: &str) -> String {
        let shipped = support::repo_root().join("models/profanity-check");
        let edited = text.replace(
            &format!("model_dir = \"{}\"", shipped.display()),
            &format!(
                "model_dir = \"{}\"\nreload_interval = \"1s\"\n{more}",
                self.link.display()
            ),
        );
        assert!(edited.contains("reload_interval"), "{edited}");
        edited
    }

    /// Points the directory at `to` in one rename.
    fn swap(&self, to: &str) {
        let next = self.link.with_extension("next");
        std::os::unix::fs::symlink(support::repo_root().join(to), &next).unwrap();
        std::fs::rename(&next, &self.link).unwrap();
    }
}

#[test]
fn a_stalled_partition_fires_its_alert_after_its_for_and_resolves() {
    let broker = broker_with_topics(2);
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

    // No verdict topic: deliveries fail and are retried, the partitions
    // stall.
    broker.delete_topic(VERDICTS);
    support::produce(&broker.bootstrap(), &support::events("s-", 0..100));
    pending_then_firing(
        &prom,
        &[
            ("ModstreamPartitionStalled", Duration::from_secs(60)),
            (
                "ModstreamDeliveriesFailing",
                shortened("ModstreamDeliveriesFailing"),
            ),
        ],
        Duration::from_secs(150),
    );

    // The topic back: the partitions move, the stall resolves. (Deliveries
    // failing reads a 5 min rate: it resolves 5 min after the last failure,
    // which promtool's rule tests check.)
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
    let broker = broker_with_topics(1);
    let dir = tempfile::tempdir().unwrap();
    let model = SwappedModel::new(dir.path(), "tests/data/failing-model");
    let (mut service, prom) = watched(&broker, dir.path(), "breaker", |text| {
        model.configure(text, "")
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
    pending_then_firing(
        &prom,
        &[("ModstreamModelFailing", Duration::from_secs(60))],
        Duration::from_secs(150),
    );

    // A model that works, swapped in: the breaker closes, the alert resolves.
    model.swap("models/profanity-check");
    wait_for(
        &prom,
        "ModstreamModelFailing",
        None,
        Duration::from_secs(90),
    );
    assert!(service.terminate(Duration::from_secs(30)));
}

/// A paced overload: posts at 1,000 a second against a transformer on one
/// session (a few hundred a second here). The lag passes 10,000 and grows:
/// `ModstreamLagGrowing` goes pending, then firing after its (shortened)
/// `for:`; a faster model swapped in lets the group catch up, and it
/// resolves.
#[test]
fn a_paced_overload_fires_lag_growing_and_catching_up_resolves_it() {
    let broker = broker_with_topics(2);
    let dir = tempfile::tempdir().unwrap();
    let model = SwappedModel::new(dir.path(), "models/minilm-l6");
    let (mut service, prom) = watched(&broker, dir.path(), "lag", |text| {
        model.configure(text, "workers = 1")
    });

    let load = support::produce_paced(
        broker.bootstrap(),
        support::events("o-", 0..60_000),
        Duration::from_secs(60),
    );
    pending_then_firing(
        &prom,
        &[("ModstreamLagGrowing", shortened("ModstreamLagGrowing"))],
        Duration::from_secs(90),
    );

    // Capacity back (here a faster model): the lag falls under 10,000.
    model.swap("models/profanity-check");
    load.join().unwrap();
    wait_for(&prom, "ModstreamLagGrowing", None, Duration::from_secs(90));
    assert!(service.terminate(Duration::from_secs(30)));
}
