//! Hostile input through the whole pipeline: each record gets exactly one
//! outcome (a verdict, or a DLQ record with a machine-readable reason), the
//! pipeline keeps going, and nothing panics.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use modstream::shutdown::Shutdown;
use modstream::tools::embedded::EmbeddedBroker;
use support::{DLQ, INPUT, VERDICTS};

/// (payload, key, huge headers?, expected outcome: "verdict" or a reason code)
fn cases() -> Vec<(Vec<u8>, Option<&'static str>, bool, &'static str)> {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let big = format!(
        r#"{{"event_id":"big","text":"{}"}}"#,
        "a".repeat(300 * 1024)
    );
    let long_text = format!(
        r#"{{"event_id":"long","text":"{}"}}"#,
        "a".repeat(70 * 1024)
    );
    vec![
        (b"".to_vec(), Some("k"), false, "empty_payload"),
        (b"not json at all".to_vec(), Some("k"), false, "invalid_json"),
        (b"[1,2,3]".to_vec(), Some("k"), false, "not_an_object"),
        (b"42".to_vec(), Some("k"), false, "not_an_object"),
        (b"\"a string\"".to_vec(), Some("k"), false, "not_an_object"),
        (deep.into_bytes(), Some("k"), false, "invalid_json"),
        (big.into_bytes(), Some("k"), false, "payload_too_large"),
        (b"{\"event_id\":\"u\",\"text\":\"\xc3\x28\"}".to_vec(), Some("k"), false, "invalid_utf8"),
        (br#"{"event_id":"nul","text":"a\u0000b\u0000"}"#.to_vec(), Some("k"), false, "verdict"),
        (br#"{"text":"no id"}"#.to_vec(), Some("k"), false, "missing_event_id"),
        (br#"{"event_id":"","text":"empty id"}"#.to_vec(), Some("k"), false, "empty_event_id"),
        (br#"{"event_id":12,"text":"numeric id"}"#.to_vec(), Some("k"), false, "wrong_type"),
        (br#"{"event_id":"t","text":{"nested":true}}"#.to_vec(), Some("k"), false, "wrong_type"),
        (long_text.into_bytes(), Some("k"), false, "text_too_large"),
        ("{\"event_id\":\"uni\",\"text\":\"\u{1F600} \u{5e9}\u{5dc}\u{5d5}\u{5dd} e\u{301}\u{301}\"}".as_bytes().to_vec(), Some("k"), false, "verdict"),
        (br#"{"event_id":"dup","event_id":"dup2","text":"a","text":"b"}"#.to_vec(), Some("k"), false, "verdict"),
        (br#"{"event_id":"nokey","text":"null key"}"#.to_vec(), None, false, "verdict"),
        (br#"{"event_id":"hdrs","text":"huge headers"}"#.to_vec(), Some("k"), true, "verdict"),
        (br#"{"event_id":"after","text":"the pipeline kept going"}"#.to_vec(), Some("k"), false, "verdict"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_record_gets_exactly_one_outcome() {
    // This test binary holds one test: the global metrics recorder is its own.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let broker = EmbeddedBroker::start(&[(INPUT, 1), (VERDICTS, 1), (DLQ, 1)]).unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let cases = cases();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("message.max.bytes", "2000000")
        .create()
        .unwrap();
    for (payload, key, huge_headers, _) in &cases {
        let mut record: BaseRecord<'_, str, [u8]> =
            BaseRecord::to(INPUT).payload(payload.as_slice());
        if let Some(k) = key {
            record = record.key(*k);
        }
        if *huge_headers {
            let value = vec![b'h'; 8 * 1024];
            let headers = (0..50).fold(OwnedHeaders::new(), |h, i| {
                h.insert(Header {
                    key: &format!("x-header-{i}"),
                    value: Some(value.as_slice()),
                })
            });
            record = record.headers(headers);
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &bootstrap, "hostile");
    let settings = modstream::config::Settings::load(Some(&config)).unwrap();
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));

    let verdicts_want = cases.iter().filter(|c| c.3 == "verdict").count();
    let dlq_want = cases.len() - verdicts_want;
    let b = bootstrap.clone();
    let (verdicts, dlq) = tokio::task::spawn_blocking(move || {
        // Wait for the expected records, then look a little longer for extras.
        modstream::tools::read::read_topic(&b, VERDICTS, 1, verdicts_want, Duration::from_secs(20))
            .unwrap();
        modstream::tools::read::read_topic(&b, DLQ, 1, dlq_want, Duration::from_secs(20)).unwrap();
        let v = modstream::tools::read::read_topic(
            &b,
            VERDICTS,
            1,
            verdicts_want + 1,
            Duration::from_millis(1500),
        )
        .unwrap();
        let d = modstream::tools::read::read_topic(
            &b,
            DLQ,
            1,
            dlq_want + 1,
            Duration::from_millis(1500),
        )
        .unwrap();
        (v, d)
    })
    .await
    .unwrap();
    shutdown.stop.cancel();
    let summary = tokio::time::timeout(Duration::from_secs(30), pipeline)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // Outcome per input offset.
    let mut outcomes: HashMap<i64, Vec<String>> = HashMap::new();
    for v in &verdicts {
        let json: serde_json::Value = serde_json::from_slice(&v.payload).unwrap();
        outcomes
            .entry(json["source"]["offset"].as_i64().unwrap())
            .or_default()
            .push("verdict".into());
    }
    for d in &dlq {
        let offset: i64 = String::from_utf8_lossy(&d.headers["modstream.source.offset"])
            .parse()
            .unwrap();
        let reason = String::from_utf8_lossy(&d.headers["modstream.reason"]).into_owned();
        let (payload, key, _, _) = &cases[offset as usize];
        assert_eq!(
            &d.payload, payload,
            "DLQ keeps the original payload of offset {offset}"
        );
        assert_eq!(
            d.key.as_deref(),
            key.map(str::as_bytes),
            "DLQ keeps the original key"
        );
        outcomes.entry(offset).or_default().push(reason);
    }
    for (offset, (_, _, _, expected)) in cases.iter().enumerate() {
        let got = outcomes.get(&(offset as i64)).cloned().unwrap_or_default();
        assert_eq!(
            got,
            vec![expected.to_string()],
            "offset {offset}: exactly one outcome"
        );
    }
    let nokey = verdicts
        .iter()
        .find(|v| String::from_utf8_lossy(&v.payload).contains("\"nokey\""))
        .unwrap();
    assert_eq!(nokey.key, None, "a null key stays null on the verdict");
    assert_eq!(summary.consumed as usize, cases.len());
    // The DLQ metric counts each reason once per dead-lettered record.
    let exposition = metrics.render();
    let mut expected: HashMap<&str, usize> = HashMap::new();
    for (_, _, _, outcome) in &cases {
        if *outcome != "verdict" {
            *expected.entry(*outcome).or_default() += 1;
        }
    }
    for (reason, n) in expected {
        let line = format!("modstream_dlq_total{{reason=\"{reason}\"}} {n}");
        assert!(
            exposition.lines().any(|l| l == line),
            "missing `{line}` in:\n{exposition}"
        );
    }
    println!(
        "hostile input: {} records, {} verdicts, {} dead-lettered, lost 0",
        cases.len(),
        verdicts.len(),
        dlq.len()
    );
}
