//! Prevalence end to end on Apache Kafka 4.4: 20,000 events from a
//! generator that knows which violate, moderated with sampling on (its
//! rate bound dropping some) and a kill -9 halfway; a labeller labels
//! every sample from that truth; then `modstream prevalence` prints an
//! interval that holds the true share. Each run's draws are checked on
//! their own against its verdicts' scores: every event a run drew has a
//! sample or a drop record of that run and no other event has one, the
//! events judged twice (the crash) were drawn the same way both times, and
//! no event was drawn with two probabilities.

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
    // About 60 drawn per second per tenant at the paced rate, more in the
    // restarted run's backlog: the bound drops some.
    let rates = SamplingSettings {
        min_rate: 0.02,
        max_rate: 0.3,
        max_per_second: 40.0,
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
    let killed_at = chrono::Utc::now();
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

    // Which run wrote a record: the first run's all predate the kill.
    let run_of = |at: &serde_json::Value| {
        let at: chrono::DateTime<chrono::Utc> = at.as_str().unwrap().parse().unwrap();
        usize::from(at > killed_at)
    };
    // Each run's draws, from its verdicts' scores: what its samples and
    // drops must be.
    let mut judged: [HashMap<String, f64>; 2] = Default::default();
    let mut drawn: [HashSet<String>; 2] = Default::default();
    let mut probability: HashMap<String, f64> = HashMap::new();
    for v in read_all(&bootstrap, VERDICTS) {
        let id = v["event_id"].as_str().unwrap().to_string();
        let score = v["reason"]["models"][0]["scores"]["offensive"]
            .as_f64()
            .unwrap();
        let p = inclusion_probability(&rates, score);
        let run = run_of(&v["processed_at"]);
        judged[run].insert(id.clone(), p);
        if let Some(before) = probability.insert(id.clone(), p) {
            assert_eq!(before, p, "{id}: judged twice, with two probabilities");
        }
        if unit(id.as_bytes()) < p {
            drawn[run].insert(id);
        }
    }
    let all_judged: HashSet<&String> = judged.iter().flat_map(|j| j.keys()).collect();
    assert_eq!(all_judged.len(), EVENTS, "a verdict per event");
    let twice: HashSet<&String> = judged[0]
        .keys()
        .filter(|id| judged[1].contains_key(*id))
        .collect();
    assert!(
        !twice.is_empty(),
        "the crash left events judged twice: else this proves nothing"
    );

    let mut sampled: [HashSet<String>; 2] = Default::default();
    let mut dropped: [HashSet<String>; 2] = Default::default();
    for s in read_all(&bootstrap, SAMPLES) {
        let id = s["event_id"].as_str().unwrap().to_string();
        let run = run_of(&s["sampled_at"]);
        let p = s["sample"]["probability"].as_f64().unwrap();
        // The service's rates went through its configuration file: the
        // last bit may differ.
        let want = probability.get(&id).copied();
        assert!(
            want.is_some_and(|w| (w - p).abs() < 1e-12),
            "{id}: drawn with {p}, its verdict says {want:?}"
        );
        let into = if s["dropped"] == true {
            &mut dropped[run]
        } else {
            &mut sampled[run]
        };
        assert!(into.insert(id.clone()), "{id}: two records in one run");
    }
    for run in 0..2 {
        let mut written: HashSet<&String> = sampled[run].iter().collect();
        written.extend(dropped[run].iter());
        assert!(
            sampled[run].is_disjoint(&dropped[run]),
            "run {run}: an event both sampled and dropped"
        );
        let want: HashSet<&String> = drawn[run].iter().collect();
        // The first run's records of the events it judged again after the
        // crash may be lost with it (killed before their acknowledgement);
        // every other drawn event of a run has its record, and no other.
        let missing: Vec<&&String> = want
            .difference(&written)
            .filter(|id| run == 1 || !twice.contains(**id))
            .collect();
        // And its record of an event whose verdict was lost with it: that
        // event was judged again, and drawn the same way.
        let extra: Vec<&&String> = written
            .difference(&want)
            .filter(|id| run == 1 || !drawn[1].contains(**id))
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "run {run}: drawn without a record {:?}, a record without a draw {:?}",
            &missing[..missing.len().min(5)],
            &extra[..extra.len().min(5)]
        );
    }
    let drops = dropped[0].len() + dropped[1].len();
    assert!(
        drops > 0,
        "the rate bound dropped some: else it is not tested"
    );
    let sampled_ever: HashSet<String> = sampled[0].union(&sampled[1]).cloned().collect();
    let never_sampled_drops = dropped[0]
        .union(&dropped[1])
        .filter(|id| !sampled_ever.contains(*id))
        .count();
    println!(
        "{} samples of {EVENTS} events; {} events judged twice; drops {} then {} ({never_sampled_drops} events dropped and never sampled)",
        sampled_ever.len(),
        twice.len(),
        dropped[0].len(),
        dropped[1].len()
    );
    let sampled: HashMap<String, ()> = sampled_ever.iter().map(|id| (id.clone(), ())).collect();

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
    // The workspace's build draws charts; `-p modstream` alone does not.
    let charts = cfg!(feature = "charts");
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
        .args(charts.then_some("--chart"))
        .args(charts.then_some(&chart))
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
    assert!(
        printed.contains(&format!(
            "rate bound (sampling.max_per_second): {never_sampled_drops}"
        )),
        "the report counts each dropped event once"
    );
    assert!(printed.contains("(0 of them with another probability)"));
    assert!(
        printed.lines().any(|l| l.starts_with("t0 "))
            && printed.lines().any(|l| l.starts_with("t1 "))
    );
    if charts {
        assert!(std::fs::read_to_string(&chart).unwrap().contains("<svg"));
    }
}
