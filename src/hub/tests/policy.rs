//! Several models and the policy: each event scored by the models its rule
//! names, in model order; the reason, routed copies and decision records;
//! a policy change applies from one point on, never inside an event.

use super::*;

const RULES: &str = r#"
version = "v1"

[[rules]]
id = "kids"
when = { tenant = "kids" }
models.cheap.offensive = { review_at = 0.2, block_at = 0.9 }
models.big.toxic = { review_at = 0.3, block_at = 0.6 }
routes = [{ verdicts = ["review"], topic = "kids-review", priority = "high" }]

[[rules]]
id = "default"
models.cheap.offensive = { review_at = 0.5, block_at = 0.85 }
"#;

fn manifest(name: &str, label: &str) -> Manifest {
    serde_json::from_value(serde_json::json!({
        "name": name, "version": "7", "input_kind": "text", "inputs": ["text"],
        "output": "p", "labels": [label], "score_label": label,
    }))
    .unwrap()
}

/// A hub with two models, `cheap` (lane 0, `h.jobs`) and `big` (lane 1,
/// the second receiver), judged by `RULES`.
fn two_models() -> (Harness, async_channel::Receiver<InferenceJob>) {
    let settings = Settings::from_toml(
        r#"
        [kafka]
        bootstrap_servers = "127.0.0.1:1"
        [input]
        topics = ["posts"]
        [output]
        decisions_topic = "decisions"
        [batching]
        max_batch_size = 2
        max_batch_delay = "20ms"
        [inference]
        workers = 1
        "#,
    )
    .unwrap();
    let models = [manifest("cheap-m", "offensive"), manifest("big-m", "toxic")];
    let mut lanes = Vec::new();
    let mut receivers = Vec::new();
    for (name, m) in ["cheap", "big"].into_iter().zip(&models) {
        let (tx, rx) = async_channel::bounded(2);
        lanes.push(ModelLane {
            scorer: Scorer::named(name, m),
            jobs: tx,
            workers: 1,
            max_batch: 2,
            max_length: None,
        });
        receivers.push(rx);
    }
    let labels = [
        crate::policy::ModelLabels::of("cheap", &models[0]),
        crate::policy::ModelLabels::of("big", &models[1]),
    ];
    let rules = Ruleset::parse(RULES, config::FileFormat::Toml, &labels).unwrap();
    let second = receivers.pop().unwrap();
    let first = receivers.pop().unwrap();
    let h = harness_of(settings, lanes, rules, first);
    (h, second)
}

fn post(offset: i64, tenant: Option<&str>) -> Ingested {
    let mut event =
        serde_json::json!({"event_id": format!("e{offset}"), "text": format!("post {offset}")});
    if let Some(t) = tenant {
        event["tenant"] = t.into();
    }
    Ingested {
        payload: Some(event.to_string().into_bytes()),
        ..record(0, offset, 0)
    }
}

fn with_scores(job: &InferenceJob, p: f32) -> InferenceResult {
    InferenceResult {
        scores: job.texts.iter().map(|_| Ok(vec![p])).collect(),
        ..scored(job)
    }
}

/// Records handed over to `topic`, parsed.
fn on(outbox: &Outbox, topic: &str) -> Vec<serde_json::Value> {
    outbox
        .sent()
        .iter()
        .filter(|r| r.topic == topic)
        .map(|r| serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap())
        .collect()
}

/// Keys of the records handed over to `topic`.
fn keys_on(outbox: &Outbox, topic: &str) -> Vec<Option<Vec<u8>>> {
    outbox
        .sent()
        .iter()
        .filter(|r| r.topic == topic)
        .map(|r| r.key.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn each_event_is_scored_by_the_models_of_its_rule_and_says_why() {
    let (mut h, big) = two_models();
    h.push(post(0, Some("kids")));
    h.push(post(1, None));
    let cheap = h.jobs.try_recv().expect("both go to the cheap model first");
    assert_eq!(cheap.texts, ["post 0", "post 1"]);
    assert!(
        big.try_recv().is_err(),
        "the big model waits for the cheap one"
    );
    h.result(with_scores(&cheap, 0.3));
    assert!(
        h.outbox.offsets().is_empty(),
        "e1 waits behind e0 (offset order)"
    );
    let second = big.try_recv().expect("then the kids post to the big model");
    assert_eq!(second.texts, ["post 0"], "only the rule that names it");
    h.result(with_scores(&second, 0.4));
    h.acks(2).await;
    assert_eq!(h.outbox.offsets(), vec![0, 1]);

    let verdicts = on(&h.outbox, "moderation.verdicts");
    let kids = &verdicts[0];
    assert_eq!(kids["verdict"], "review");
    assert_eq!(
        kids["model"]["name"], "cheap-m",
        "`model` is the first model's"
    );
    assert_eq!(kids["reason"]["policy"], "v1");
    assert_eq!(kids["reason"]["rule"], "kids");
    let models = kids["reason"]["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    assert_eq!(
        (models[0]["id"].as_str(), models[1]["id"].as_str()),
        (Some("cheap"), Some("big"))
    );
    assert_eq!(models[1]["name"], "big-m");
    assert_eq!(models[1]["version"], "7");
    // cheap 0.3 >= kids' review_at 0.2; big 0.4 >= review_at 0.3.
    let crossed = |m: &serde_json::Value| m["crossed"][0].clone();
    assert_eq!(crossed(&models[0])["threshold"], serde_json::json!(0.2f32));
    assert_eq!(crossed(&models[1])["label"], "toxic");
    assert_eq!(crossed(&models[1])["score"], serde_json::json!(0.4f32));
    assert_eq!(crossed(&models[1])["threshold"], serde_json::json!(0.3f32));
    let other = &verdicts[1];
    assert_eq!(other["verdict"], "allow", "0.3 is under the default 0.5");
    assert_eq!(other["reason"]["rule"], "default");
    assert_eq!(other["reason"]["models"].as_array().unwrap().len(), 1);
    assert_eq!(
        other["reason"]["models"][0]["crossed"],
        serde_json::json!([])
    );

    let routed = on(&h.outbox, "kids-review");
    assert_eq!(routed.len(), 1, "only the kids review");
    assert_eq!(routed[0]["event_id"], "e0");
    assert_eq!(routed[0]["review_priority"], "high");
    let decisions = on(&h.outbox, "decisions");
    assert_eq!(decisions.len(), 2);
    assert_eq!(decisions[0]["rule"], "kids");
    assert_eq!(decisions[0]["models"][1]["id"], "big");
    assert_eq!(decisions[0]["reasons"][1]["model"], "big");
    let keys = keys_on(&h.outbox, "decisions");
    assert_eq!(
        keys,
        [Some(b"e0".to_vec()), Some(b"e1".to_vec())],
        "keyed by event id"
    );
    assert_eq!(
        h.in_flight(),
        0,
        "an offset is done when all its records are"
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_policy_applies_to_events_accepted_after_it_never_inside_one() {
    let (mut h, big) = two_models();
    h.push(post(0, Some("kids")));
    h.push(post(1, Some("kids")));
    let cheap = h.jobs.try_recv().unwrap();
    h.result(with_scores(&cheap, 0.3));
    // v2 takes over while the big model still scores e0 and e1: kids get
    // the default rule from now on, and the big model no longer runs for them.
    let v2 = RULES
        .replace("version = \"v1\"", "version = \"v2\"")
        .replace("tenant = \"kids\"", "tenant = \"nobody\"");
    let labels = [
        crate::policy::ModelLabels::of("cheap", &manifest("cheap-m", "offensive")),
        crate::policy::ModelLabels::of("big", &manifest("big-m", "toxic")),
    ];
    let v2 = Ruleset::parse(&v2, config::FileFormat::Toml, &labels).unwrap();
    h.hub.on_policy(Arc::new(v2));
    h.push(post(2, Some("kids")));
    h.push(post(3, Some("kids")));
    let later = h.jobs.try_recv().unwrap();
    h.result(with_scores(&later, 0.3));
    let first = big
        .try_recv()
        .expect("e0 and e1 still go to the big model (v1)");
    assert_eq!(first.texts, ["post 0", "post 1"]);
    assert!(big.try_recv().is_err(), "e2 and e3 do not (v2)");
    h.result(with_scores(&first, 0.1));
    h.acks(4).await;
    let verdicts = on(&h.outbox, "moderation.verdicts");
    let seen: Vec<(String, String, usize)> = verdicts
        .iter()
        .map(|v| {
            (
                v["reason"]["policy"].as_str().unwrap().to_string(),
                v["reason"]["rule"].as_str().unwrap().to_string(),
                v["reason"]["models"].as_array().unwrap().len(),
            )
        })
        .collect();
    let v = |p: &str, r: &str, n| (p.to_string(), r.to_string(), n);
    assert_eq!(
        seen,
        [
            v("v1", "kids", 2),
            v("v1", "kids", 2),
            v("v2", "default", 1),
            v("v2", "default", 1)
        ]
    );
    assert_eq!(h.outbox.offsets(), vec![0, 1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn a_failure_of_the_second_model_dead_letters_the_event_and_keeps_order() {
    let (mut h, big) = two_models();
    h.push(post(0, Some("kids")));
    h.push(post(1, None));
    let cheap = h.jobs.try_recv().unwrap();
    h.result(with_scores(&cheap, 0.1));
    let second = big.try_recv().unwrap();
    h.result(failed(&second));
    h.acks(2).await;
    assert_eq!((h.summary().dlq, h.summary().verdicts), (1, 1));
    let kinds: Vec<_> = h
        .outbox
        .sent()
        .iter()
        .map(|r| (r.topic.clone(), r.kind))
        .collect();
    assert_eq!(
        kinds[0],
        (
            "moderation.dlq".to_string(),
            crate::producer::record::RecordKind::Dlq
        ),
        "e0 first: {kinds:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cascade_sends_only_unsure_events_to_the_second_model_which_then_decides() {
    let (mut h, big) = two_models();
    let cascade = r#"
version = "c1"
[[rules]]
id = "default"
models.cheap.offensive = { review_at = 0.5, block_at = 0.85 }
models.big.toxic = { review_at = 0.5, block_at = 0.85 }
cascade.big = { after = "cheap", label = "offensive", band = [0.2, 0.8] }
"#;
    let labels = [
        crate::policy::ModelLabels::of("cheap", &manifest("cheap-m", "offensive")),
        crate::policy::ModelLabels::of("big", &manifest("big-m", "toxic")),
    ];
    let rules = Ruleset::parse(cascade, config::FileFormat::Toml, &labels).unwrap();
    h.hub.on_policy(Arc::new(rules));
    for offset in 0..4 {
        h.push(post(offset, None));
    }
    let (a, b) = (h.jobs.try_recv().unwrap(), h.jobs.try_recv().unwrap());
    // e0, e1 sure (0.9: block); e2, e3 unsure (0.6).
    h.result(with_scores(&a, 0.9));
    assert!(big.try_recv().is_err(), "sure: the big model does not run");
    h.result(with_scores(&b, 0.6));
    let unsure = big.try_recv().expect("unsure: the big model runs");
    assert_eq!(unsure.texts, ["post 2", "post 3"]);
    h.result(with_scores(&unsure, 0.1));
    h.acks(4).await;
    let verdicts = on(&h.outbox, "moderation.verdicts");
    let got: Vec<(&str, usize, bool)> = verdicts
        .iter()
        .map(|v| {
            let models = v["reason"]["models"].as_array().unwrap();
            let deferred = models[0].get("deferred").is_some_and(|d| d == true);
            (v["verdict"].as_str().unwrap(), models.len(), deferred)
        })
        .collect();
    assert_eq!(
        got,
        [
            ("block", 1, false),
            ("block", 1, false),
            ("allow", 2, true),
            ("allow", 2, true)
        ],
        "the big model decides where the cheap one was unsure (0.6 alone would be a review)"
    );
}

#[tokio::test(start_paused = true)]
async fn an_urgent_post_moves_its_partitions_earlier_batches_up_in_the_other_models_queue() {
    // Kids posts go through both models, the default rule's through the
    // cheap one only. Partition 0's earlier kids batch waits for the big
    // model behind partition 2's; then an urgent default post of partition
    // 0 arrives. Its verdict waits for that earlier batch, so the big model
    // must take it next, not partition 2's.
    let (mut h, big) = two_models();
    let kids = |partition: i32, offset: i64| {
        let event = serde_json::json!({
            "event_id": format!("p{partition}e{offset}"),
            "text": format!("p{partition} post {offset}"),
            "tenant": "kids",
        });
        Ingested {
            payload: Some(event.to_string().into_bytes()),
            ..record(partition, offset, 0)
        }
    };
    let through_cheap = |h: &mut Harness| {
        while let Ok(job) = h.jobs.try_recv() {
            let result = with_scores(&job, 0.5);
            h.result(result);
        }
    };
    // Partition 1 fills the big model's two runs in flight.
    for offset in 0..4 {
        h.push(kids(1, offset));
    }
    through_cheap(&mut h);
    let busy = big.try_recv().unwrap();
    assert!(big.try_recv().is_ok(), "two runs in flight");
    for partition in [2, 0] {
        for offset in 0..2 {
            h.push(kids(partition, offset));
        }
        through_cheap(&mut h);
    }
    assert!(
        big.try_recv().is_err(),
        "partitions 2 and 0 wait, in that order"
    );
    let urgent = Ingested {
        payload: Some(br#"{"event_id":"p0e2","text":"p0 post 2","priority":"urgent"}"#.to_vec()),
        ..record(0, 2, 0)
    };
    h.push(urgent);
    through_cheap(&mut h);
    h.result(with_scores(&busy, 0.1));
    let next = big.try_recv().expect("a run freed");
    assert_eq!(
        next.texts,
        ["p0 post 0", "p0 post 1"],
        "the urgent post's partition first"
    );
}
