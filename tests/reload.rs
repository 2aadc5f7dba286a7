//! Hot reload on Apache Kafka: under paced load the model
//! directory (a symlink) is swapped to a new version, then to a broken one.
//! Nothing is lost, nothing fails, the group does not rebalance, verdicts
//! carry the version that scored them, and the broken model is refused.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

/// A copy of the shipped model with another version in its manifest.
fn model_version(dir: &Path, version: &str) {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/profanity-check");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(shipped.join("model.onnx"), dir.join("model.onnx")).unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shipped.join("manifest.json")).unwrap())
            .unwrap();
    manifest["version"] = version.into();
    std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
}

/// Point `link` at `target` atomically (a new link renamed over the old).
fn swap_link(link: &Path, target: &Path) {
    let tmp = link.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

/// Wall-clock time, ms since the epoch (as Kafka timestamps are).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn scrape(port: u16) -> String {
    support::http_get(port, "/metrics").1
}

fn status(port: u16, path: &str) -> u16 {
    support::http_get(port, path).0
}

fn sample(exposition: &str, series: &str) -> f64 {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(-1.0)
}

#[test]
fn a_model_swapped_twice_under_load_one_of_them_broken() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    for (topic, partitions) in [(INPUT, 2), (VERDICTS, 2), (DLQ, 1)] {
        broker.create_topic(topic, partitions);
    }
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2, broken) = (
        dir.path().join("v1"),
        dir.path().join("v2"),
        dir.path().join("broken"),
    );
    model_version(&v1, "1.9.1");
    model_version(&v2, "2.0.0-test");
    model_version(&broken, "3.0.0-broken");
    std::fs::write(broken.join("model.onnx"), b"not an onnx model").unwrap();
    let current = dir.path().join("current");
    std::os::unix::fs::symlink(&v1, &current).unwrap();

    let port = support::free_port();
    let config = support::write_config(dir.path(), &bootstrap, "g-reload");
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text
        .lines()
        .map(|l| {
            if l.starts_with("model_dir") {
                format!(
                    "model_dir = {:?}\nreload_interval = \"300ms\"",
                    current.display().to_string()
                )
            } else if l.starts_with("listen") {
                format!("listen = \"127.0.0.1:{port}\"")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&config, text).unwrap();
    let _service = Modstream::start(&config, "reload", dir.path());

    let events = support::events("r-", 0..3000);
    // A steady 250 per second for 12 s: no gap in which a swap could pass
    // unseen.
    let load = support::load::produce_steady(bootstrap.clone(), events, 250);
    std::thread::sleep(Duration::from_secs(4));
    let swap_asked_ms = now_ms();
    swap_link(&current, &v2);
    let deadline = Instant::now() + Duration::from_secs(20);
    while sample(
        &scrape(port),
        "modstream_model_reloads_total{outcome=\"loaded\"}",
    ) < 1.0
    {
        assert!(Instant::now() < deadline, "v2 was never loaded");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    swap_link(&current, &broken);
    while sample(
        &scrape(port),
        "modstream_model_reloads_total{outcome=\"refused\"}",
    ) < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the broken model was never looked at"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        status(port, "/readyz"),
        200,
        "a refused model leaves the service ready"
    );
    let acked = load.join().unwrap();
    let load_ended_ms = now_ms();
    let v = support::verify(&bootstrap, &acked, Duration::from_secs(90));
    v.report("hot reload");
    assert!(v.lost.is_empty(), "lost {}", v.lost.len());

    let metrics = scrape(port);
    assert_eq!(
        sample(
            &metrics,
            "modstream_model_reloads_total{outcome=\"loaded\"}"
        ),
        1.0
    );
    assert!(
        sample(
            &metrics,
            "modstream_model_reloads_total{outcome=\"refused\"}"
        ) >= 1.0
    );
    assert_eq!(
        sample(&metrics, "modstream_rebalances_total{kind=\"assign\"}"),
        1.0,
        "the group never rebalanced after its first assignment"
    );
    assert_eq!(
        sample(&metrics, "modstream_dlq_total{reason=\"inference_failed\"}"),
        0.0
    );
    assert_eq!(sample(&metrics, "modstream_inference_failures_total"), 0.0);

    // Each verdict names the version that scored it: v1, then v2, never the
    // broken one, and per partition never back.
    let verdicts =
        modstream::tools::read::TopicReader::from_beginning(&bootstrap, VERDICTS, Some(2))
            .unwrap()
            .read_to_end(Duration::from_secs(30))
            .unwrap();
    let mut by_partition: HashMap<i64, Vec<(i64, String)>> = HashMap::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    // The swap happened under load: the old version still wrote verdicts
    // after the swap was asked for, the new one before the load ended (a
    // verdict's timestamp is when modstream produced it).
    let written = |version: &'static str| {
        verdicts.iter().filter_map(move |r| {
            let json = r.json()?;
            (json["model"]["version"] == version).then_some(r.timestamp_ms?)
        })
    };
    let last_v1 = written("1.9.1").max();
    let first_v2 = written("2.0.0-test").min();
    assert!(
        last_v1.is_some_and(|t| t >= swap_asked_ms),
        "v1 verdicts after the swap was asked for at {swap_asked_ms}: last at {last_v1:?}"
    );
    assert!(
        first_v2.is_some_and(|t| t < load_ended_ms),
        "v2 verdicts before the load ended at {load_ended_ms}: first at {first_v2:?}"
    );
    for r in &verdicts {
        let json = r.json().unwrap();
        let version = json["model"]["version"].as_str().unwrap().to_string();
        *counts.entry(version.clone()).or_default() += 1;
        by_partition
            .entry(json["source"]["partition"].as_i64().unwrap())
            .or_default()
            .push((json["source"]["offset"].as_i64().unwrap(), version));
    }
    assert!(counts.get("1.9.1").is_some_and(|n| *n > 0), "{counts:?}");
    assert!(
        counts.get("2.0.0-test").is_some_and(|n| *n > 0),
        "{counts:?}"
    );
    assert_eq!(
        counts.len(),
        2,
        "only the two good versions scored: {counts:?}"
    );
    for (partition, mut scored) in by_partition {
        scored.sort();
        let first_v2 = scored
            .iter()
            .position(|(_, v)| v == "2.0.0-test")
            .unwrap_or(scored.len());
        assert!(
            scored[first_v2..].iter().all(|(_, v)| v == "2.0.0-test"),
            "partition {partition}: back to v1 after v2"
        );
    }
    let log = std::fs::read_to_string(dir.path().join("reload.log")).unwrap_or_default();
    assert!(log.contains("new model refused"), "the refusal is logged");
}

/// SIGHUP re-reads the policy: a valid one applies to the next verdicts, an
/// invalid one is refused and the current one stays.
#[test]
fn sighup_reloads_the_policy_and_refuses_a_bad_one() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    for (topic, partitions) in [(INPUT, 1), (VERDICTS, 1), (DLQ, 1)] {
        broker.create_topic(topic, partitions);
    }
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let config = support::write_config(dir.path(), &bootstrap, "g-policy");
    let base = std::fs::read_to_string(&config).unwrap().replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    let with_policy = |review_at: f64, block_at: f64| {
        format!("{base}\n[policy]\nreview_at = {review_at}\nblock_at = {block_at}\n")
    };
    std::fs::write(&config, with_policy(0.5, 0.85)).unwrap();
    let service = Modstream::start(&config, "policy", dir.path());

    let first = support::produce(&bootstrap, &support::events("p1-", 0..100));
    assert!(
        support::verify(&bootstrap, &first, Duration::from_secs(60))
            .lost
            .is_empty()
    );
    // Everything scores ≥ 0: with review_at = 0 nothing is allowed any more.
    std::fs::write(&config, with_policy(0.0, 0.999_999)).unwrap();
    service.signal("-HUP");
    let deadline = Instant::now() + Duration::from_secs(20);
    while sample(
        &scrape(port),
        "modstream_policy_reloads_total{outcome=\"loaded\"}",
    ) < 1.0
    {
        assert!(Instant::now() < deadline, "the policy was never reloaded");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut acked = first.clone();
    let second = support::produce(&bootstrap, &support::events("p2-", 0..100));
    acked.extend(second.iter().cloned());
    assert!(
        support::verify(&bootstrap, &acked, Duration::from_secs(60))
            .lost
            .is_empty()
    );
    // review_at above block_at: refused, the policy above stays.
    std::fs::write(&config, with_policy(0.9, 0.1)).unwrap();
    service.signal("-HUP");
    while sample(
        &scrape(port),
        "modstream_policy_reloads_total{outcome=\"refused\"}",
    ) < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the bad policy was never looked at"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let third = support::produce(&bootstrap, &support::events("p3-", 0..100));
    acked.extend(third.iter().cloned());
    assert!(
        support::verify(&bootstrap, &acked, Duration::from_secs(60))
            .lost
            .is_empty()
    );

    let verdicts =
        modstream::tools::read::TopicReader::from_beginning(&bootstrap, VERDICTS, Some(1))
            .unwrap()
            .read_to_end(Duration::from_secs(30))
            .unwrap();
    let mut allowed: HashMap<&str, usize> = HashMap::new();
    for r in &verdicts {
        let json = r.json().unwrap();
        let id = json["event_id"].as_str().unwrap();
        let prefix = if id.starts_with("p1-") {
            "p1"
        } else if id.starts_with("p2-") {
            "p2"
        } else {
            "p3"
        };
        if json["verdict"] == "allow" {
            *allowed.entry(prefix).or_default() += 1;
        }
    }
    assert!(
        allowed.get("p1").is_some_and(|n| *n > 0),
        "the first policy allows some: {allowed:?}"
    );
    assert_eq!(
        allowed.get("p2"),
        None,
        "review_at = 0 allows nothing: {allowed:?}"
    );
    assert_eq!(
        allowed.get("p3"),
        None,
        "the refused policy did not apply: {allowed:?}"
    );
}
