//! Events as feed pipelines publish them, through the whole pipeline on
//! the mock cluster: nested JSON read by a mapping, CloudEvents in binary
//! and structured mode, and optional fields that cannot be read left out
//! with a warning instead of sending the post to the DLQ.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use modstream::config::Mapping;
use modstream::shutdown::Shutdown;
use modstream::tools::demo::{self, DEMO_DLQ, DEMO_INPUT, DEMO_VERDICTS};
use modstream::tools::embedded::EmbeddedBroker;
use modstream::tools::read::ReadRecord;

const PARTITIONS: i32 = 2;

/// key, value, headers.
type Input = (String, String, Vec<(&'static str, String)>);

/// Produce (key, value, headers) to the input topic, each acknowledged.
async fn produce(bootstrap: &str, records: &[Input]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (key, value, headers) in records {
        let mut h = OwnedHeaders::new();
        for (name, v) in headers {
            h = h.insert(Header {
                key: name,
                value: Some(v.as_bytes()),
            });
        }
        producer
            .send(
                FutureRecord::to(DEMO_INPUT)
                    .key(key)
                    .payload(value)
                    .headers(h),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
}

/// Run the pipeline with `mapping` until `verdicts` verdicts and `dlq`
/// dead letters are out; returns them, by event id for the verdicts.
async fn run(
    mapping: Mapping,
    records: &[Input],
    verdicts: usize,
    dlq: usize,
) -> (HashMap<String, serde_json::Value>, Vec<ReadRecord>) {
    let broker = EmbeddedBroker::start(&[
        (DEMO_INPUT, PARTITIONS),
        (DEMO_VERDICTS, PARTITIONS),
        (DEMO_DLQ, 1),
    ])
    .unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    produce(&bootstrap, records).await;
    let mut settings = demo::demo_settings(&bootstrap, "g-formats").unwrap();
    settings.input.mapping = mapping;
    settings.validate().unwrap();
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let out = support::read_records(&bootstrap, DEMO_VERDICTS, PARTITIONS, verdicts).await;
    let dead = if dlq > 0 {
        support::read_records(&bootstrap, DEMO_DLQ, 1, dlq).await
    } else {
        Vec::new()
    };
    shutdown.stop.cancel();
    let summary = tokio::time::timeout(Duration::from_secs(60), pipeline)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(summary.verdicts as usize, verdicts, "verdicts");
    assert_eq!(summary.dlq as usize, dlq, "dead letters");
    let by_id = out
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(&r.payload).unwrap();
            (v["event_id"].as_str().unwrap().to_string(), v)
        })
        .collect::<HashMap<_, _>>();
    assert_eq!(by_id.len(), verdicts, "one verdict per event");
    (by_id, dead)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_with_epoch_seconds_as_floats_are_all_moderated() {
    // What Python's time.time() gives; before, every one was dead-lettered.
    let records: Vec<_> = (0..3000)
        .map(|i| {
            let value = serde_json::json!({
                "event_id": format!("f-{i}"),
                "text": "a perfectly ordinary post",
                "created_at": 1_796_099_449.85 + f64::from(i),
            });
            (format!("u{}", i % 50), value.to_string(), Vec::new())
        })
        .collect();
    let (verdicts, _) = run(Mapping::default(), &records, 3000, 0).await;
    assert!(
        verdicts.values().all(|v| v.get("warnings").is_none()),
        "epoch seconds are a valid created_at"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_posts_and_cloudevents_are_read_by_the_mapping() {
    let mapping = Mapping {
        id: "/post/id".into(),
        text: vec!["/post/title".into(), "/post/body".into()],
        text_separator: "\n".into(),
        tenant: "/community".into(),
        created_at: "/post/created_utc".into(),
        user_id: "/author/id".into(),
        ..Mapping::default()
    };
    let post = |id: &str, created: serde_json::Value| {
        serde_json::json!({
            "post": {"id": id, "title": "Weekend plans", "body": "hiking, then soup", "created_utc": created},
            "author": {"id": 981_234},
            "community": "hiking",
        })
    };
    let ce = |id: &str| {
        vec![
            ("ce_specversion", "1.0".to_string()),
            ("ce_id", format!("ce-{id}")),
            ("ce_source", "/feed".to_string()),
            ("ce_type", "post.created".to_string()),
        ]
    };
    let structured = serde_json::json!({
        "specversion": "1.0", "id": "s-1", "source": "/feed", "type": "post.created",
        "datacontenttype": "application/json", "data": post("p-structured", 1_796_099_449.0.into()),
    });
    let records = vec![
        (
            "k1".to_string(),
            post("p-plain", 1_796_099_449.85.into()).to_string(),
            Vec::new(),
        ),
        (
            "k2".to_string(),
            post("p-binary", "2026-11-29T10:00:00Z".into()).to_string(),
            ce("b"),
        ),
        (
            "k3".to_string(),
            structured.to_string(),
            vec![("content-type", "application/cloudevents+json".to_string())],
        ),
        // A created_at that cannot be read: moderated all the same.
        (
            "k4".to_string(),
            post("p-bad-time", "last tuesday".into()).to_string(),
            Vec::new(),
        ),
        // No id where the mapping looks: a dead letter naming the pointer.
        (
            "k5".to_string(),
            serde_json::json!({"post": {"title": "no id"}}).to_string(),
            Vec::new(),
        ),
    ];
    let (verdicts, dlq) = run(mapping, &records, 4, 1).await;
    for id in ["p-plain", "p-binary", "p-structured", "p-bad-time"] {
        let v = &verdicts[id];
        assert_eq!(v["tenant"], "hiking", "{id}: {v}");
        assert!(["allow", "review", "block"].contains(&v["verdict"].as_str().unwrap()));
    }
    assert!(verdicts["p-plain"].get("warnings").is_none());
    let warnings = verdicts["p-bad-time"]["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .starts_with("created_at: /post/created_utc"),
        "{warnings:?}"
    );
    let reason = String::from_utf8(dlq[0].headers["modstream.reason"].clone()).unwrap();
    let message = String::from_utf8(dlq[0].headers["modstream.message"].clone()).unwrap();
    assert_eq!(reason, "missing_event_id");
    assert!(message.contains("/post/id"), "{message}");
}
