//! `modstream rescore` on Apache Kafka: a time range of the input
//! topic is judged again into another topic, exactly the events in range,
//! and the live group's committed offsets are not touched.

mod support;

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

const RESCORED: &str = "rescored";

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[test]
fn rescoring_a_time_range_scores_exactly_it_and_leaves_the_live_group_alone() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    for (topic, partitions) in [(INPUT, 2), (VERDICTS, 2), (DLQ, 1), (RESCORED, 2)] {
        broker.create_topic(topic, partitions);
    }
    // Before the range, in it, after it; a second between them.
    let mut acked = support::produce(&bootstrap, &support::events("a-", 0..100));
    std::thread::sleep(Duration::from_millis(1200));
    let from = now_ms();
    let inside = support::produce(&bootstrap, &support::events("b-", 0..150));
    let to = now_ms() + 1;
    std::thread::sleep(Duration::from_millis(1200));
    acked.extend(support::produce(&bootstrap, &support::events("c-", 0..80)));
    acked.extend(inside.iter().cloned());
    assert_eq!(inside.len(), 150);

    // The live group moderates everything and commits.
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &bootstrap, "g-live");
    let mut live = Modstream::start(&config, "live", dir.path());
    let v = support::verify(&bootstrap, &acked, Duration::from_secs(90));
    assert!(v.lost.is_empty(), "lost {:?}", v.lost.len());
    assert!(live.terminate(Duration::from_secs(30)));
    let committed = support::committed(&bootstrap, "g-live", 2);
    assert_eq!(
        committed.iter().sum::<i64>(),
        330,
        "the live group committed everything"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_modstream"))
        .args(["rescore", "--config"])
        .arg(&config)
        .args([
            "--topic",
            INPUT,
            "--output-topic",
            RESCORED,
            "--compare-topic",
            VERDICTS,
        ])
        .args([
            "--from",
            &from.to_string(),
            "--to",
            &to.to_string(),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["events"], 150, "{report}");
    let verdicts: u64 = report["verdicts"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(verdicts, 150);
    assert_eq!(report["invalid"], 0);
    assert_eq!(
        report["compared"], 150,
        "every rescored event had a live verdict"
    );
    assert_eq!(
        report["differing"], 0,
        "same model, same policy: same verdicts"
    );

    // Exactly the events in range, once each, with their source.
    let rescored =
        modstream::tools::read::TopicReader::from_beginning(&bootstrap, RESCORED, Some(2))
            .unwrap()
            .read_to_end(Duration::from_secs(30))
            .unwrap();
    let ids: Vec<String> = rescored
        .iter()
        .map(|r| r.json().unwrap()["event_id"].as_str().unwrap().to_string())
        .collect();
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(ids.len(), 150);
    assert_eq!(unique, inside.iter().collect::<HashSet<_>>());
    for r in &rescored {
        assert_eq!(r.json().unwrap()["source"]["topic"], INPUT);
    }

    // The live group's offsets are where it left them.
    assert_eq!(support::committed(&bootstrap, "g-live", 2), committed);
}
