//! Prevalence end to end on Apache Kafka 4.4: 20,000 events from a
//! generator that knows which violate, moderated with sampling on and a
//! kill -9 halfway; a labeller labels every sample from that truth; then
//! `modstream prevalence` prints an interval that holds the true share.
//! Every event's draw is checked against its verdict's score: the events
//! judged twice (the crash) were sampled the same way both times, and no
//! event was sampled with two probabilities.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use modstream::config::SamplingSettings;
use modstream::sampling::{inclusion_probability, unit};
use modstream::tools::generator::{post_text, spread};
use modstream::tools::read::TopicReader;
use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

const SAMPLES: &str = "samples";
const LABELS: &str = "labels";
const EVENTS: usize = 20_000;

/// Event `i` violates for 1 in 12 (the generator's truth: an abusive
/// sample post), its tenant one of two.
fn violates(i: usize) -> bool {
    spread(i as u64 ^ 0x7E57).is_multiple_of(12)
}

fn events() -> Vec<(String, String, Vec<u8>)> {
    (0..EVENTS)
        .map(|i| {
            let id = format!("p-{i}");
            let payload = serde_json::json!({
                "event_id": id, "text": post_text(i, violates(i)), "tenant": format!("t{}", i % 2),
            });
            (
                id,
                format!("user-{}", i % 97),
                payload.to_string().into_bytes(),
            )
        })
        .collect()
}

fn read_all(bootstrap: &str, topic: &str) -> Vec<serde_json::Value> {
    TopicReader::from_beginning(bootstrap, topic, None)
        .unwrap()
        .read_to_end(Duration::from_secs(60))
        .unwrap()
        .iter()
        .filter_map(|r| r.json())
        .collect()
}

/// The labeller's records, keyed by event id.
fn produce_labels(bootstrap: &str, labels: &[(String, &str)]) {
    let records: Vec<(String, String, Vec<u8>)> = labels
        .iter()
        .map(|(id, label)| {
            let value = serde_json::json!({
                "event_id": id, "label": label, "labeller": "test-truth",
                "labelled_at": "2026-12-03T12:00:00Z",
            });
            (id.clone(), id.clone(), value.to_string().into_bytes())
        })
        .collect();
    support::produce_to(bootstrap, LABELS, &records);
}

#[test]
fn prevalence_holds_the_true_share_and_a_crash_samples_the_same_way() {
    let broker = Broker::start();
    for (topic, partitions) in [
        (INPUT, 4),
        (VERDICTS, 4),
        (DLQ, 1),
        (SAMPLES, 2),
        (LABELS, 1),
    ] {
        broker.create_topic(topic, partitions);
    }
    let bootstrap = broker.bootstrap();
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &bootstrap, "g-prevalence");
    let rates = SamplingSettings {
        min_rate: 0.02,
        max_rate: 0.3,
        max_per_second: 100_000.0,
        ..SamplingSettings::default()
    };
    let mut text = std::fs::read_to_string(&config).unwrap().replace(
        "[output]\n",
        &format!("[output]\nsamples_topic = \"{SAMPLES}\"\n"),
    );
    text.push_str(&format!(
        "[sampling]\nmin_rate = {}\nmax_rate = {}\nmax_per_second = {:.1}\n",
        rates.min_rate, rates.max_rate, rates.max_per_second
    ));
    std::fs::write(&config, text).unwrap();

    let mut service = Modstream::start(&config, "prevalence", dir.path());
    let load = support::produce_paced(bootstrap.clone(), events(), Duration::from_secs(8));
    assert!(
        support::wait_for_progress(&bootstrap, 6_000, Duration::from_secs(90)),
        "verdicts before the crash"
    );
    service.kill9();
    let mut service = Modstream::start(&config, "prevalence-restarted", dir.path());
    let acked = load.join().unwrap();
    assert_eq!(acked.len(), EVENTS);
    assert!(
        support::wait_for_committed_end(&bootstrap, "g-prevalence", 4, Duration::from_secs(120)),
        "every event judged"
    );
    assert!(
        service.terminate(Duration::from_secs(20)),
        "exits 0 on SIGTERM"
    );

    // Each verdict's draw, from its score: what the samples must be.
    let mut expected: HashMap<String, f64> = HashMap::new();
    let mut verdicts_per_event: HashMap<String, usize> = HashMap::new();
    for v in read_all(&bootstrap, VERDICTS) {
        let id = v["event_id"].as_str().unwrap().to_string();
        let score = v["reason"]["models"][0]["scores"]["offensive"]
            .as_f64()
            .unwrap();
        let p = inclusion_probability(&rates, score);
        *verdicts_per_event.entry(id.clone()).or_default() += 1;
        if unit(id.as_bytes()) < p
            && let Some(before) = expected.insert(id.clone(), p)
        {
            assert_eq!(
                before, p,
                "{id}: judged twice, drawn with two probabilities"
            );
        }
    }
    assert_eq!(verdicts_per_event.len(), EVENTS, "a verdict per event");
    let judged_twice = verdicts_per_event.values().filter(|&&n| n > 1).count();
    assert!(
        judged_twice > 0,
        "the crash left events judged twice: else this proves nothing"
    );

    let mut sampled: HashMap<String, Vec<f64>> = HashMap::new();
    for s in read_all(&bootstrap, SAMPLES) {
        let id = s["event_id"].as_str().unwrap().to_string();
        sampled
            .entry(id)
            .or_default()
            .push(s["sample"]["probability"].as_f64().unwrap());
    }
    let sampled_twice = sampled.values().filter(|p| p.len() > 1).count();
    for (id, ps) in &sampled {
        assert!(ps.iter().all(|p| *p == ps[0]), "{id} sampled with {ps:?}");
        // The service's rates went through its configuration file: the
        // last bit may differ.
        let want = expected.get(id).copied();
        assert!(
            want.is_some_and(|p| (p - ps[0]).abs() < 1e-12),
            "{id}: sampled with {}, its verdict says {want:?}",
            ps[0]
        );
    }
    let got: HashSet<&String> = sampled.keys().collect();
    let want: HashSet<&String> = expected.keys().collect();
    assert_eq!(got, want, "exactly the events their draw picks");
    println!(
        "{} samples of {EVENTS} events; {judged_twice} events judged twice, {sampled_twice} of their samples written twice",
        sampled.len()
    );

    // The labeller: every sample labelled from the generator's truth.
    let labels: Vec<(String, &str)> = sampled
        .keys()
        .map(|id| {
            let i: usize = id.trim_start_matches("p-").parse().unwrap();
            (id.clone(), if violates(i) { "offensive" } else { "none" })
        })
        .collect();
    produce_labels(&bootstrap, &labels);
    let truth = (0..EVENTS).filter(|&i| violates(i)).count() as f64 / EVENTS as f64;
    let chart = dir.path().join("thresholds.svg");
    let out = std::process::Command::new(support::modstream_binary())
        .args([
            "prevalence",
            "--samples",
            SAMPLES,
            "--labels",
            LABELS,
            "--by",
            "tenant",
        ])
        .arg("--config")
        .arg(&config)
        .arg("--chart")
        .arg(&chart)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    println!("{printed}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    let row: Vec<&str> = printed
        .lines()
        .find(|l| l.starts_with("all ") && l.split_whitespace().nth(1) == Some("offensive"))
        .expect("a row for all, offensive")
        .split_whitespace()
        .collect();
    let number = |s: &str| {
        s.trim_matches(|c| c == '[' || c == ']' || c == ',')
            .parse::<f64>()
            .unwrap()
    };
    let (estimate, low, high) = (number(row[2]), number(row[3]), number(row[4]));
    println!("true share {truth:.4}; estimated {estimate:.4} [{low:.4}, {high:.4}]");
    assert!(
        low <= truth && truth <= high,
        "the interval holds the true share {truth}"
    );
    assert!(printed.contains(&format!("labelled: {}; unlabelled: 0", sampled.len())));
    assert!(printed.contains("(0 of them with another probability)"));
    assert!(
        printed.lines().any(|l| l.starts_with("t0 "))
            && printed.lines().any(|l| l.starts_with("t1 "))
    );
    assert!(std::fs::read_to_string(&chart).unwrap().contains("<svg"));
}
