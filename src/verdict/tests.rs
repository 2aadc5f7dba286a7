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

/// A verdict with every field the body can write: tenant, warnings, a
/// routed copy's priority, a list match, a wave, reused scores, a deferred
/// model and a crossing.
fn fullest_verdict(
    write: impl FnOnce(&VerdictPayload<'_>) -> Result<Vec<u8>, crate::schema::verdict::EncodeError>,
) -> Vec<u8> {
    use crate::event::{FieldWarning, OptionalField};
    let manifest: Manifest = serde_json::from_value(json!({
        "name": "m", "version": "2.1", "input_kind": "text", "inputs": ["text"],
        "output": "p", "labels": ["offensive", "clean"], "score_label": "offensive",
    }))
    .unwrap();
    let scorer = Scorer::named("m", &manifest);
    let mut event = crate::event::validate(
        Some(
            json!({"event_id": "e-1", "text": "t", "tenant": "kids"})
                .to_string()
                .as_bytes(),
        ),
        &Default::default(),
    )
    .unwrap();
    event.warnings.push(FieldWarning {
        field: OptionalField::Lang,
        message: "not a string".into(),
    });
    let decision = Decision {
        verdict: Verdict::Block,
        deferred: vec![ModelId(0)],
        by_score: Verdict::Block,
        human_review: true,
        crossings: vec![crate::policy::Crossing {
            model: ModelId(0),
            label: "offensive".into(),
            score: 0.9,
            threshold: 0.85,
            verdict: Verdict::Block,
        }],
    };
    let marks = Marks {
        matched: Some(ListMatch {
            list: "spam".into(),
            id: "s1".into(),
            label: "spam".into(),
            verdict: Verdict::Block,
            distance: 0.25,
            decides: false,
        }),
        wave: Some(WaveNote {
            id: "e-0".into(),
            size: 21,
            users: 6,
            first_seen_ms: 1_764_800_000_000,
        }),
        reused: true,
    };
    let fired = crate::policy::state_rules::Fired {
        rule: "fast-poster".into(),
        entity: "user:u-9".into(),
        counter: "posts_1m".into(),
        value: 6,
        raise: Verdict::Review,
        label: Some("velocity".into()),
    };
    let judged = Judged {
        rules: &scorer.alone,
        rule: RuleId(0),
        decision: &decision,
        models: smallvec::smallvec![ScoredBy {
            model: ModelId(0),
            scorer: &scorer,
            probabilities: &[0.9, 0.1],
        }],
        marks: Some(&marks),
        state: Some(&fired),
    };
    let tp = Tp::new("posts", 3);
    let answer = Answer {
        source: &tp,
        offset: 42,
        key: None,
        event: &event,
        timestamp_ms: Some(1_764_800_000_000),
    };
    verdict_record_with("v", &answer, &judged, Some("high"), Timing::Live, write)
        .unwrap()
        .payload
        .unwrap()
}

/// The field names of each record of `schema` against the keys of the JSON
/// `value` written for it, recursively; a difference is pushed to `diffs`.
fn compare(
    schema: &serde_json::Value,
    value: &serde_json::Value,
    at: &str,
    diffs: &mut Vec<String>,
) {
    use serde_json::Value;
    match (schema, value) {
        (Value::Array(branches), _) => {
            let branch = branches.iter().find(|b| (*b == "null") == value.is_null());
            if let Some(branch) = branch {
                compare(branch, value, at, diffs);
            }
        }
        (Value::Object(s), _) if s.get("type") == Some(&json!("record")) => {
            let fields = s["fields"].as_array().unwrap();
            let names: Vec<&str> = fields.iter().map(|f| f["name"].as_str().unwrap()).collect();
            let keys: Vec<&str> = value
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            for name in &names {
                if !keys.contains(name) {
                    diffs.push(format!("{at}.{name}: in the schema, not written"));
                }
            }
            for key in &keys {
                if !names.contains(key) {
                    diffs.push(format!("{at}.{key}: written, not in the schema"));
                }
            }
            for f in fields {
                let name = f["name"].as_str().unwrap();
                if let Some(v) = value.get(name) {
                    compare(&f["type"], v, &format!("{at}.{name}"), diffs);
                }
            }
        }
        (Value::Object(s), Value::Array(items)) if s.get("type") == Some(&json!("array")) => {
            for item in items {
                compare(&s["items"], item, &format!("{at}[]"), diffs);
            }
        }
        (Value::Object(s), Value::Object(_)) if s.get("type") == Some(&json!("map")) => {}
        (Value::Object(s), _) => compare(&s["type"], value, at, diffs),
        _ => {}
    }
}

#[test]
fn the_avro_schema_has_the_verdicts_fields_and_reads_back_what_the_body_wrote() {
    use crate::schema::codec::{Codec, Texts};
    use crate::schema::verdict::{VERDICT_SCHEMA, VerdictEncoder};
    let json_bytes = fullest_verdict(|body| Ok(serde_json::to_vec(body).unwrap()));
    let written: serde_json::Value = serde_json::from_slice(&json_bytes).unwrap();
    // Every optional field is there to be compared.
    for path in [
        "/tenant",
        "/warnings/0",
        "/review_priority",
        "/reason/match",
        "/reason/state",
        "/reason/wave",
    ] {
        assert!(written.pointer(path).is_some(), "{path} in {written}");
    }
    assert_eq!(written["reason"]["models"][0]["deferred"], true);
    assert_eq!(written["reason"]["reused"], true);
    let schema: serde_json::Value = serde_json::from_str(VERDICT_SCHEMA).unwrap();
    let mut diffs = Vec::new();
    compare(&schema, &written, "verdict", &mut diffs);
    assert!(
        diffs.is_empty(),
        "the verdict and its Avro schema differ: {diffs:#?}"
    );

    // Written straight into Avro, read back by the schema: the same verdict
    // (fields out of the schema's order would not read back).
    let encoder = VerdictEncoder::with_id(7);
    let avro = fullest_verdict(|body| encoder.encode(body));
    assert_eq!(&avro[..5], &[0, 0, 0, 0, 7]);
    let codec = Codec::build(&Texts {
        schema_type: "AVRO".into(),
        schema: VERDICT_SCHEMA.into(),
        references: Vec::new(),
    })
    .unwrap();
    let mut back = codec.decode(&avro[5..]).unwrap();
    // Written in different milliseconds.
    for field in ["processed_at", "latency_ms"] {
        back[field] = written[field].clone();
    }
    assert_eq!(back, written);
}

#[test]
fn a_verdict_without_its_optional_fields_is_written_in_avro_with_their_defaults() {
    use crate::schema::codec::{Codec, Texts};
    use crate::schema::verdict::{VERDICT_SCHEMA, VerdictEncoder};
    let manifest: Manifest = serde_json::from_value(json!({
        "name": "m", "version": "1", "input_kind": "text", "inputs": ["text"],
        "output": "p", "labels": ["offensive"], "score_label": "offensive",
    }))
    .unwrap();
    let scorer = Scorer::named("m", &manifest);
    let event = crate::event::validate(
        Some(
            json!({"event_id": "e-2", "text": "t"})
                .to_string()
                .as_bytes(),
        ),
        &Default::default(),
    )
    .unwrap();
    let tp = Tp::new("posts", 0);
    let answer = || Answer {
        source: &tp,
        offset: 7,
        key: None,
        event: &event,
        timestamp_ms: None,
    };
    let (json_record, _) = scorer.verdict_record("v", answer(), &[0.1]);
    let mut expected: serde_json::Value =
        serde_json::from_slice(&json_record.payload.unwrap()).unwrap();
    let encoder = VerdictEncoder::with_id(3);
    let (avro, _) = scorer
        .verdict_record_with("v", answer(), &[0.1], |body| encoder.encode(body))
        .unwrap();
    let codec = Codec::build(&Texts {
        schema_type: "AVRO".into(),
        schema: VERDICT_SCHEMA.into(),
        references: Vec::new(),
    })
    .unwrap();
    let mut back = codec.decode(&avro.payload.unwrap()[5..]).unwrap();
    back["processed_at"] = expected["processed_at"].clone();
    // What the JSON verdict leaves out, the Avro one has as its default.
    for (field, default) in [
        ("review_priority", json!(null)),
        ("tenant", json!(null)),
        ("warnings", json!([])),
    ] {
        assert!(
            expected.get(field).is_none(),
            "{field} is left out of the JSON"
        );
        expected[field] = default;
    }
    for (field, default) in [
        ("match", json!(null)),
        ("reused", json!(false)),
        ("state", json!(null)),
        ("wave", json!(null)),
    ] {
        expected["reason"][field] = default;
    }
    expected["reason"]["models"][0]["deferred"] = json!(false);
    assert_eq!(back, expected);
}
