//! Model faults through the real pipeline on librdkafka's mock cluster: a
//! model run that fails, a non-finite score, and what a dead-letter record
//! keeps of its input. Each fails if an event is lost or the committed
//! offsets end anywhere but at the end of the input.

mod support;

use std::time::Duration;

use modstream::shutdown::Shutdown;
use modstream::tools::embedded::EmbeddedBroker;
use support::mock_faults::*;
use support::{DLQ, INPUT, VERDICTS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_model_run_isolates_the_bad_events() {
    // The test model parses each text as a number and fails the whole run
    // on anything else.
    let texts = ["0.5", "2", "boom", "-1", "0", "kaboom", "3.5", "1"];
    let (broker, verdicts, dlq) = run_failing_model("failing-model", "m-", &texts, (6, 2)).await;
    let bootstrap = broker.bootstrap_servers().to_string();

    let scored: Vec<String> = verdicts
        .iter()
        .map(|v| {
            serde_json::from_slice::<serde_json::Value>(&v.payload).unwrap()["event_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        scored,
        ["m-0", "m-1", "m-3", "m-4", "m-6", "m-7"],
        "the good events get verdicts, in order"
    );
    let failed: Vec<(String, String)> = dlq
        .iter()
        .map(|d| {
            (
                String::from_utf8_lossy(&d.headers["modstream.source.offset"]).into_owned(),
                String::from_utf8_lossy(&d.headers["modstream.reason"]).into_owned(),
            )
        })
        .collect();
    assert_eq!(
        failed,
        [
            ("2".to_string(), "inference_failed".to_string()),
            ("5".to_string(), "inference_failed".to_string())
        ]
    );
    let committed =
        tokio::task::spawn_blocking(move || support::committed(&bootstrap, "failing-model", 1))
            .await
            .unwrap();
    assert_eq!(
        committed,
        vec![8],
        "every event accounted for, so the offset reaches the end"
    );
}

/// A score the model returns as NaN is an inference failure of that event
/// (DLQ `inference_failed`), never an `allow` with null scores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_finite_score_is_dead_lettered_not_judged() {
    // The failing test model parses each text as a number: "nan" scores NaN.
    let (_broker, verdicts, dlq) =
        run_failing_model("nan-model", "n-", &["0.5", "nan", "1"], (3, 1)).await;
    let judged: Vec<i64> = verdicts
        .iter()
        .map(|v| {
            serde_json::from_slice::<serde_json::Value>(&v.payload).unwrap()["source"]["offset"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(judged, vec![0, 2], "only the finite scores make verdicts");
    assert_eq!(dlq.len(), 1);
    let header = |name: &str| String::from_utf8_lossy(&dlq[0].headers[name]).into_owned();
    assert_eq!(header("modstream.source.offset"), "1");
    assert_eq!(header("modstream.reason"), "inference_failed");
    assert!(
        header("modstream.message").contains("non-finite"),
        "{}",
        header("modstream.message")
    );
}

/// A dead-letter record is the input record as it was: a null value stays
/// null, its headers and timestamp are kept, modstream's headers follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_records_keep_null_values_headers_and_timestamps() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let broker = EmbeddedBroker::start(&[(INPUT, 1), (VERDICTS, 1), (DLQ, 1)]).unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let headers = || {
        OwnedHeaders::new()
            .insert(Header {
                key: "trace-id",
                value: Some("t-1"),
            })
            .insert(Header {
                key: "empty",
                value: None::<&str>,
            })
    };
    producer
        .send(
            BaseRecord::<str, [u8]>::to(INPUT)
                .key("tombstone")
                .timestamp(1_600_000_000_000)
                .headers(headers()),
        )
        .unwrap();
    producer
        .send(
            BaseRecord::to(INPUT)
                .key("bad")
                .payload("not json")
                .timestamp(1_600_000_000_001)
                .headers(headers()),
        )
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &bootstrap, "dlq-copy");
    let settings = modstream::config::Settings::load(Some(&config)).unwrap();
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let b = bootstrap.clone();
    let dlq = tokio::task::spawn_blocking(move || {
        modstream::tools::read::read_topic(&b, DLQ, 1, 2, Duration::from_secs(15)).unwrap()
    })
    .await
    .unwrap();
    shutdown.stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), pipeline)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(dlq.len(), 2);
    let (tombstone, bad) = (&dlq[0], &dlq[1]);
    assert!(tombstone.null_value, "a null value stays null");
    assert!(!bad.null_value);
    assert_eq!(bad.payload, b"not json");
    for (d, ts, reason) in [
        (tombstone, 1_600_000_000_000, "empty_payload"),
        (bad, 1_600_000_000_001, "invalid_json"),
    ] {
        assert_eq!(d.timestamp_ms, Some(ts), "the input's timestamp");
        assert_eq!(d.headers["trace-id"], b"t-1", "the input's headers");
        assert!(d.headers.contains_key("empty"));
        assert_eq!(d.headers["modstream.reason"], reason.as_bytes());
    }
}
