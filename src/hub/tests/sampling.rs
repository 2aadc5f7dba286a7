//! Sampling in the hub: a verdict drawn by its event id and risk score
//! goes out with its sample record (same acknowledgement, same
//! transaction); the rate bound drops over it and the next sample says so.

use super::*;
use crate::producer::record::RecordKind;

/// A hub with `output.samples_topic` and this `[sampling]` (TOML lines).
fn sampling_hub(sampling: &str, delivery: &str) -> Harness {
    let settings = Settings::from_toml(&format!(
        r#"
        [kafka]
        bootstrap_servers = "127.0.0.1:1"
        {delivery}
        [input]
        topics = ["posts"]
        [output]
        samples_topic = "samples"
        [batching]
        max_batch_size = 1
        [inference]
        workers = 1
        [sampling]
        {sampling}
        "#
    ))
    .unwrap();
    harness_of_settings(settings)
}

fn tenant_post(offset: i64) -> Ingested {
    let event = serde_json::json!({
        "event_id": format!("e{offset}"), "text": format!("post {offset}"), "tenant": "cats",
    });
    Ingested {
        payload: Some(event.to_string().into_bytes()),
        ..record(0, offset, 0)
    }
}

fn samples(h: &Harness) -> Vec<serde_json::Value> {
    h.outbox
        .sent()
        .iter()
        .filter(|r| r.kind == RecordKind::Sample)
        .map(|r| {
            assert_eq!(r.topic, "samples");
            assert_eq!(r.key.as_deref(), Some(r.payload_event_id().as_bytes()));
            serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap()
        })
        .collect()
}

impl OutRecord {
    fn payload_event_id(&self) -> String {
        let v: serde_json::Value =
            serde_json::from_slice(self.payload.as_deref().unwrap()).unwrap();
        v["event_id"].as_str().unwrap().to_string()
    }
}

/// Each event scored (0.1 by [`scored`]) in turn.
fn judge(h: &mut Harness, n: i64) {
    for offset in 0..n {
        h.push(tenant_post(offset));
        let job = h.jobs.try_recv().unwrap();
        h.result(scored(&job));
    }
}

#[tokio::test(start_paused = true)]
async fn verdicts_are_drawn_by_their_id_and_score_and_their_samples_wait_with_them() {
    let mut h = sampling_hub(
        "min_rate = 0.3\nmax_rate = 0.8\nmax_per_second = 1000.0",
        "",
    );
    judge(&mut h, 40);
    // 0.3 + 0.5 × 0.1 (the model's score, rounded to 1/1000).
    let probability = 0.35;
    let expected: Vec<String> = (0..40)
        .map(|i| format!("e{i}"))
        .filter(|id| crate::sampling::unit(id.as_bytes()) < probability)
        .collect();
    let got = samples(&h);
    let ids: Vec<&str> = got
        .iter()
        .map(|s| s["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, expected);
    assert!(!ids.is_empty() && ids.len() < 40, "{} of 40", ids.len());
    let s = &got[0];
    assert!((s["sample"]["probability"].as_f64().unwrap() - probability).abs() < 1e-12);
    assert!((s["sample"]["score"].as_f64().unwrap() - 0.1).abs() < 1e-6);
    assert_eq!(s["sample"]["model"], "default");
    assert_eq!(s["verdict"], "allow");
    assert_eq!(s["tenant"], "cats");
    assert_eq!(s["event"]["text"], format!("post {}", &ids[0][1..]));
    assert_eq!(s["reason"]["rule"], "default");
    assert!(s["reason"]["models"][0]["scores"]["offensive"].is_number());
    h.acks(40).await;
    assert_eq!(h.stored().concat().last(), Some(&at(0, 40)));
}

/// A verdict acknowledged whose sample is not: its offset waits.
#[tokio::test(start_paused = true)]
async fn an_offset_waits_for_its_sample_as_for_its_verdict() {
    let mut h = sampling_hub(
        "min_rate = 1.0\nmax_rate = 1.0\nmax_per_second = 1000.0",
        "",
    );
    h.outbox.hold_topic("samples");
    judge(&mut h, 3);
    assert_eq!(samples(&h).len(), 3, "handed over with their verdicts");
    let waited = tokio::time::timeout(Duration::from_secs(30), h.acks(1)).await;
    assert!(waited.is_err(), "no offset is done while its sample waits");
    assert!(h.stored().concat().is_empty(), "nothing to commit");
    h.outbox.release_topic("samples");
    h.acks(3).await;
    assert_eq!(h.stored().concat().last(), Some(&at(0, 3)));
}

#[tokio::test(start_paused = true)]
async fn the_rate_bound_drops_samples_and_writes_a_drop_record_for_each() {
    let mut h = sampling_hub("min_rate = 1.0\nmax_rate = 1.0\nmax_per_second = 2.0", "");
    judge(&mut h, 5);
    let got = samples(&h);
    let dropped: Vec<&serde_json::Value> = got.iter().filter(|s| s["dropped"] == true).collect();
    assert_eq!(got.len(), 5, "every drawn event has a record");
    assert_eq!(dropped.len(), 3, "2 per second for the tenant and rule");
    let d = dropped[0];
    assert_eq!(
        (
            d["event_id"].as_str(),
            d["rule"].as_str(),
            d["tenant"].as_str()
        ),
        (Some("e2"), Some("default"), Some("cats"))
    );
    assert_eq!(d["sample"]["probability"], 1.0);
    assert!(
        d.get("event").is_none() && d.get("reason").is_none(),
        "no text: {d}"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    h.push(tenant_post(5));
    let job = h.jobs.try_recv().unwrap();
    h.result(scored(&job));
    let got = samples(&h);
    assert_eq!(got.len(), 6);
    assert_eq!(got[5]["event_id"], "e5");
    assert!(got[5].get("dropped").is_none() && got[5]["event"]["text"] == "post 5");
}

#[tokio::test(start_paused = true)]
async fn with_exactly_once_a_sample_is_in_its_verdicts_transaction() {
    let mut h = sampling_hub(
        "min_rate = 1.0\nmax_rate = 1.0\nmax_per_second = 1000.0",
        r#"delivery = "exactly_once""#,
    );
    h.outbox.hold_topic("samples");
    judge(&mut h, 2);
    assert_eq!(samples(&h).len(), 2);
    let sealed = h.seal();
    // The verdicts are acknowledged; the samples are not: the seal waits.
    let waited = tokio::time::timeout(Duration::from_millis(500), h.acks(1)).await;
    assert!(waited.is_err());
    assert!(
        sealed.try_recv().is_err(),
        "the transaction waits for its samples"
    );
    h.outbox.release_topic("samples");
    h.acks(2).await;
    let answer = sealed
        .try_recv()
        .expect("answered once all are acknowledged");
    assert_eq!(
        answer.records, 2,
        "2 input offsets, each with its verdict and sample"
    );
    assert_eq!(answer.positions, vec![at(0, 2)]);
    assert_eq!(answer.abort, None);
}

#[tokio::test(start_paused = true)]
async fn a_sample_that_fails_in_a_transaction_aborts_it_with_its_verdict() {
    let mut h = sampling_hub(
        "min_rate = 1.0\nmax_rate = 1.0\nmax_per_second = 1000.0",
        r#"delivery = "exactly_once""#,
    );
    h.outbox.fail_topic("samples", Fate::InTransaction);
    judge(&mut h, 1);
    h.acks(1).await;
    let answer = h.seal().try_recv().expect("nothing outstanding");
    assert!(answer.abort.is_some(), "the transaction aborts");
    assert!(answer.positions.is_empty(), "its offset is not committed");
}
