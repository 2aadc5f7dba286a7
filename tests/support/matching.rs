//! Matching's tests on the mock cluster: the cluster with their topics, the
//! service's settings with `[matching]`, the list topic's records, and the
//! shipped profanity model's own verdicts to hold reuse against.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use modstream::config::Settings;
use modstream::tools::campaign::CampaignPost;
use modstream::tools::embedded::EmbeddedBroker;

use super::{DLQ, INPUT, VERDICTS};

pub const WAVES: &str = "waves";
pub const LISTS: &str = "lists";

pub fn broker(partitions: i32) -> EmbeddedBroker {
    EmbeddedBroker::start(&[
        (INPUT, partitions),
        (VERDICTS, partitions),
        (DLQ, 1),
        (WAVES, 1),
        (LISTS, 1),
    ])
    .unwrap()
}

/// The tests' service configuration with a waves topic and `[matching]`.
pub fn settings(dir: &Path, bootstrap: &str, group: &str, matching: &str) -> Settings {
    let path = super::write_config(dir, bootstrap, group);
    let text = std::fs::read_to_string(&path).unwrap().replace(
        &format!("dlq_topic = \"{DLQ}\""),
        &format!("dlq_topic = \"{DLQ}\"\nwaves_topic = \"{WAVES}\""),
    );
    std::fs::write(&path, format!("{text}\n[matching]\n{matching}\n")).unwrap();
    Settings::load(Some(&path)).unwrap()
}

pub fn triples(posts: &[CampaignPost]) -> Vec<(String, String, Vec<u8>)> {
    posts
        .iter()
        .map(|p| {
            (
                p.event.event_id.clone(),
                p.event.key.clone(),
                p.event.payload.clone(),
            )
        })
        .collect()
}

/// Each verdict by event id (one each, checked).
pub fn by_id(records: &[modstream::tools::read::ReadRecord]) -> HashMap<String, serde_json::Value> {
    let mut out = HashMap::new();
    for r in records {
        let v = r.json().unwrap();
        let id = v["event_id"].as_str().unwrap().to_string();
        assert!(out.insert(id, v).is_none(), "one verdict per event");
    }
    out
}

/// Polls until `group`'s committed offsets sum to `total` (or 30 s).
pub async fn committed_sum(bootstrap: &str, group: &str, partitions: i32, total: i64) -> i64 {
    let (b, g) = (bootstrap.to_string(), group.to_string());
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sum: i64 = super::committed(&b, &g, partitions)
                .iter()
                .map(|o| (*o).max(0))
                .sum();
            if sum == total || Instant::now() > deadline {
                return sum;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap()
}

/// The profanity model's own verdict of each text by `[policy]`.
pub fn model_verdicts(settings: &Settings, texts: &[String]) -> Vec<modstream::verdict::Verdict> {
    let mut model = modstream::inference::load_sessions(
        &settings.inference,
        1,
        modstream::inference::RunLimit::posts(32),
    )
    .unwrap()
    .remove(0);
    let scorer = modstream::verdict::Scorer::new(&model.manifest, &settings.policy).unwrap();
    let mut out = Vec::new();
    for chunk in texts.chunks(32) {
        let mut chunk = chunk.to_vec();
        out.extend(
            model
                .score(&mut chunk)
                .unwrap()
                .iter()
                .map(|p| scorer.decide(p)),
        );
    }
    out
}

/// A list topic record: key "w1", the item (None: a tombstone).
pub fn list_record(bootstrap: &str, item: Option<&str>) {
    list_records(bootstrap, &[("w1".into(), item.map(str::to_string))]);
}

/// List topic records, in order: (key, the item; None: a tombstone).
pub fn list_records(bootstrap: &str, records: &[(String, Option<String>)]) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (key, item) in records {
        let mut record = BaseRecord::<str, str>::to(LISTS).key(key);
        if let Some(item) = item {
            record = record.payload(item);
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}
