//! Exactly-once checks: configs with `kafka.delivery = "exactly_once"`, and
//! the outputs (verdicts and dead letters) read back at an isolation level,
//! counted per input event.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use modstream::tools::read::{Isolation, TopicReader};

use super::{DLQ, VERDICTS};

/// [`super::write_config`] with exactly-once, this instance id, and the
/// transaction interval (`kafka.commit_interval`).
pub fn write_config(
    dir: &Path,
    bootstrap: &str,
    group: &str,
    instance: &str,
    interval: &str,
) -> PathBuf {
    let base = super::write_config(dir, bootstrap, group);
    let text = std::fs::read_to_string(&base)
        .unwrap()
        .replace(
            "[kafka]\n",
            &format!(
                "[kafka]\ndelivery = \"exactly_once\"\ninstance_id = \"{instance}\"\ntransaction_timeout = \"10s\"\n"
            ),
        )
        .replace(
            "commit_interval = \"500ms\"",
            &format!("commit_interval = \"{interval}\""),
        );
    let path = dir.join(format!("{group}-{instance}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `n` events `{prefix}{i}`; every `invalid_every`-th lacks its text (a
/// dead-letter record answers it; its value is the input, event id in it).
pub fn events(prefix: &str, n: usize, invalid_every: usize) -> Vec<(String, String, Vec<u8>)> {
    super::events(prefix, 0..n)
        .into_iter()
        .enumerate()
        .map(|(i, (id, key, payload))| {
            if i % invalid_every == invalid_every - 1 {
                let bad = serde_json::json!({"event_id": id, "no_text": true});
                (id, key, bad.to_string().into_bytes())
            } else {
                (id, key, payload)
            }
        })
        .collect()
}

/// Where an output is: topic, partition, offset, its source, its timestamp.
type Place<'a> = (&'a str, i32, i64, String, Option<i64>);

/// Outputs per input event at one isolation level.
#[derive(Debug)]
pub struct Outputs {
    pub isolation: Isolation,
    pub records: usize,
    pub lost: usize,
    pub duplicates: usize,
    pub dlq: usize,
}

/// Read verdicts and dead letters to their ends and count the outputs of
/// each of `acked`.
pub fn outputs(bootstrap: &str, acked: &[String], isolation: Isolation) -> Outputs {
    let mut copies: HashMap<String, usize> = HashMap::new();
    // Where each output of an event is: topic, partition, offset.
    let mut at: HashMap<String, Vec<Place<'_>>> = HashMap::new();
    let mut dlq = 0;
    for topic in [VERDICTS, DLQ] {
        let records = TopicReader::with_isolation(bootstrap, topic, None, isolation)
            .unwrap()
            .read_to_end(Duration::from_secs(90))
            .unwrap_or_else(|e| panic!("reading {topic} to its end ({isolation:?}): {e}"));
        for r in &records {
            let v = r.json().expect("a JSON value");
            let id = v["event_id"].as_str().expect("an event id").to_string();
            at.entry(id.clone()).or_default().push((
                topic,
                r.partition,
                r.offset,
                v["source"].to_string(),
                r.timestamp_ms,
            ));
            *copies.entry(id).or_default() += 1;
        }
        if topic == DLQ {
            dlq = records.len();
        }
    }
    let records = copies.values().sum::<usize>();
    let lost = acked.iter().filter(|id| !copies.contains_key(*id)).count();
    let duplicates = copies.values().map(|n| n - 1).sum();
    let mut twice: Vec<_> = at.iter().filter(|(_, w)| w.len() > 1).collect();
    twice.sort();
    for (id, where_) in twice.iter().take(10) {
        println!("{isolation:?}: {id} more than once: {where_:?}");
    }
    let o = Outputs {
        isolation,
        records,
        lost,
        duplicates,
        dlq,
    };
    println!(
        "{:?}: {} outputs for {} acked inputs ({} dead letters): lost {}, duplicates {}",
        o.isolation,
        o.records,
        acked.len(),
        o.dlq,
        o.lost,
        o.duplicates
    );
    o
}
