use super::*;
use serde_json::json;

#[test]
fn thresholds_split_allow_review_block() {
    let p = Thresholds {
        review_at: 0.5,
        block_at: 0.9,
    };
    assert_eq!(decide(&p, 0.1), Verdict::Allow);
    assert_eq!(decide(&p, 0.5), Verdict::Review);
    assert_eq!(decide(&p, 0.89), Verdict::Review);
    assert_eq!(decide(&p, 0.9), Verdict::Block);
}

#[test]
fn per_label_thresholds_take_the_most_severe_verdict() {
    let manifest: Manifest = serde_json::from_value(serde_json::json!({
        "name": "m", "version": "1", "input_kind": "tokens",
        "inputs": ["input_ids"], "output": "logits",
        "labels": ["toxic", "threat", "insult"], "score_label": "toxic",
    }))
    .unwrap();
    let mut policy = Policy::default();
    let t = |review_at, block_at| Thresholds {
        review_at,
        block_at,
    };
    policy.labels.insert("toxic".into(), t(0.8, 0.95));
    policy.labels.insert("threat".into(), t(0.2, 0.5));
    let scorer = Scorer::new(&manifest, &policy).unwrap();
    assert_eq!(scorer.decide(&[0.1, 0.1, 0.99]), Verdict::Allow); // insult not judged
    assert_eq!(scorer.decide(&[0.85, 0.1, 0.0]), Verdict::Review);
    assert_eq!(scorer.decide(&[0.85, 0.6, 0.0]), Verdict::Block); // threat blocks
    // Without per-label thresholds: score_label with the global ones.
    let scorer = Scorer::new(&manifest, &Policy::default()).unwrap();
    assert_eq!(scorer.decide(&[0.9, 0.0, 0.0]), Verdict::Block);
    assert_eq!(scorer.decide(&[0.1, 0.99, 0.99]), Verdict::Allow);
    // A label the model lacks is refused where the policy is built.
    policy.labels.insert("spam".into(), t(0.5, 0.9));
    let error = Scorer::new(&manifest, &policy).expect_err("refused");
    assert_eq!(error.at, "policy.labels.spam");
    assert!(error.to_string().contains("policy.labels.spam"), "{error}");
}

#[test]
fn verdicts_keep_their_fields_and_add_the_reason() {
    let manifest: Manifest = serde_json::from_value(serde_json::json!({
        "name": "m", "version": "2.1", "input_kind": "text", "inputs": ["text"],
        "output": "p", "labels": ["offensive", "clean", "árbol"], "score_label": "offensive",
    }))
    .unwrap();
    let scorer = Scorer::new(&manifest, &Policy::default()).unwrap();
    let tp = Tp::new("posts", 3);
    for (id, probabilities, timestamp) in [
        (
            "e-1",
            vec![0.1f32, 0.9, 0.333_333_34],
            Some(1_700_000_000_000),
        ),
        ("ü \"quoted\" 😀", vec![0.97, 0.03, 1e-8], None),
        ("short", vec![0.5], Some(0)),
    ] {
        let event = crate::event::validate(
            Some(json!({"event_id": id, "text": "t"}).to_string().as_bytes()),
            &Default::default(),
        )
        .unwrap();
        let answer = Answer {
            source: &tp,
            offset: 42,
            key: None,
            event: &event,
            timestamp_ms: timestamp,
        };
        let (record, verdict) = scorer.verdict_record("v", answer, &probabilities);
        let written = String::from_utf8(record.payload.unwrap()).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&written).unwrap();
        // What the serde_json::Value version wrote for the same record.
        let scores: serde_json::Map<String, serde_json::Value> = manifest
            .labels
            .iter()
            .zip(&probabilities)
            .map(|(label, p)| (label.clone(), json!(p)))
            .collect();
        // The score label (offensive) by [policy]'s 0.5 / 0.85.
        let p = f64::from(probabilities[0]);
        let crossed = match verdict {
            Verdict::Block => {
                json!([{"label": "offensive", "score": p, "threshold": json!(0.85f32), "verdict": "block"}])
            }
            Verdict::Review => {
                json!([{"label": "offensive", "score": p, "threshold": json!(0.5f32), "verdict": "review"}])
            }
            Verdict::Allow => json!([]),
        };
        let before = json!({
            "event_id": id,
            "verdict": verdict,
            "scores": scores,
            "model": {"name": "m", "version": "2.1"},
            "source": {"topic": "posts", "partition": 3, "offset": 42},
            "latency_ms": parsed["latency_ms"],
            "processed_at": parsed["processed_at"],
            "reason": {"human_review": false, "policy": "config", "rule": "default",
                "models": [{"crossed": crossed, "id": "m", "name": "m", "scores": scores, "version": "2.1"}]},
        })
        .to_string();
        assert_eq!(written, before);
    }
}
