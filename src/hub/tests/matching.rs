//! Matching in the hub: a deciding list item settles an event without a
//! model run (and an annotating one only marks it); a rule may skip lists
//! or be decided by them alone; a wave's later posts take the scores of its
//! first scored post, and the wave record goes out with a verdict.

use super::*;
use crate::matching::Matcher;

const SPAM: &str = "win a free phone today click the link in my bio now";

/// A hub whose matcher has one list (`spam`, in `mode`) holding [`SPAM`],
/// with waves of 3 posts by 2 users and a waves topic; `rules`: the policy
/// file (none: `[policy]`).
fn matching_hub(mode: &str, rules: Option<&str>) -> (Harness, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("spam.jsonl");
    std::fs::write(
        &list,
        format!(r#"{{"id": "s1", "verdict": "block", "label": "spam", "text": "{SPAM}"}}"#),
    )
    .unwrap();
    let settings = Settings::from_toml(&format!(
        r#"
        [kafka]
        bootstrap_servers = "127.0.0.1:1"
        [input]
        topics = ["posts"]
        [output]
        waves_topic = "waves"
        [batching]
        max_batch_size = 1
        [inference]
        workers = 1
        [matching]
        lists = [{{ name = "spam", file = {list:?}, mode = "{mode}" }}]
        waves = true
        wave_posts = 3
        wave_users = 2
        "#
    ))
    .unwrap();
    let mut h = harness_of_settings(settings.clone());
    if let Some(text) = rules {
        let manifest: Manifest = serde_json::from_value(serde_json::json!({
            "name": "m", "version": "1", "input_kind": "text", "inputs": ["text"],
            "output": "p", "labels": ["offensive"], "score_label": "offensive",
        }))
        .unwrap();
        let labels = [crate::policy::ModelLabels::of("default", &manifest)];
        let rules = Ruleset::parse(text, config::FileFormat::Toml, &labels).unwrap();
        h.hub.stages.intake.set_rules(Arc::new(rules));
    }
    (h.hub.stages.matching).set_matcher(Some(Matcher::new(&settings.matching).unwrap()));
    (h, dir)
}

fn post(offset: i64, text: &str, user: &str) -> Ingested {
    let event =
        serde_json::json!({"event_id": format!("e{offset}"), "text": text, "user_id": user});
    Ingested {
        payload: Some(event.to_string().into_bytes()),
        ..record(0, offset, 0)
    }
}

fn verdicts(h: &Harness) -> Vec<serde_json::Value> {
    h.outbox
        .sent()
        .iter()
        .filter(|r| r.kind == crate::producer::record::RecordKind::Verdict)
        .map(|r| serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_deciding_item_settles_an_event_without_a_model_run() {
    let (mut h, _dir) = matching_hub("decide", None);
    h.push(post(
        0,
        "WIN a free phone today!! click the link in my bio now guys",
        "u1",
    ));
    h.push(post(
        1,
        "Win a free phone today, click the link in my bio now 🔥",
        "u2",
    ));
    assert!(
        h.jobs.try_recv().is_err(),
        "no model ran on a matched event"
    );
    let v = verdicts(&h);
    assert_eq!(v.len(), 2);
    assert_eq!(v[1]["verdict"], "block");
    assert_eq!(
        v[1]["reason"]["match"],
        serde_json::json!({"list": "spam", "id": "s1", "label": "spam", "verdict": "block", "distance": 0.0})
    );
    assert!(
        v[0]["reason"]["match"]["distance"].as_f64().unwrap() > 0.0,
        "near: {}",
        v[0]
    );
    h.push(post(
        2,
        "what a lovely morning for a long walk by the river",
        "u3",
    ));
    let job = h.jobs.try_recv().expect("an unmatched event is scored");
    h.result(scored(&job));
    let v = verdicts(&h);
    assert_eq!(v[2]["verdict"], "allow");
    assert!(v[2]["reason"].get("match").is_none());
    h.acks(3).await;
    assert_eq!(h.stored().concat().last(), Some(&at(0, 3)));
}

#[tokio::test(start_paused = true)]
async fn an_annotating_list_marks_the_reason_and_the_model_decides() {
    let (mut h, _dir) = matching_hub("annotate", None);
    h.push(post(0, SPAM, "u1"));
    let job = h.jobs.try_recv().expect("the model runs");
    h.result(scored(&job));
    let v = &verdicts(&h)[0];
    assert_eq!(v["verdict"], "allow", "by the model's 0.1");
    assert_eq!(v["reason"]["match"]["id"], "s1");
}

#[tokio::test(start_paused = true)]
async fn a_rule_skips_lists_or_is_decided_by_them_alone() {
    let rules = r#"
        version = "v1"
        [[rules]]
        id = "trusted"
        when = { user_id = "staff" }
        lists = []
        models.default.offensive = { review_at = 0.5, block_at = 0.85 }
        [[rules]]
        id = "lists-only"
        lists = ["spam"]
    "#;
    let (mut h, _dir) = matching_hub("decide", Some(rules));
    h.push(post(0, SPAM, "staff"));
    let job = h.jobs.try_recv().expect("the trusted rule skips the list");
    h.result(scored(&job));
    h.push(post(1, SPAM, "u1"));
    h.push(post(2, "a post no list holds and no model judges", "u2"));
    assert!(
        h.jobs.try_recv().is_err(),
        "the lists-only rule runs no model"
    );
    let v = verdicts(&h);
    let got: Vec<(&str, &str)> = v
        .iter()
        .map(|v| {
            (
                v["reason"]["rule"].as_str().unwrap(),
                v["verdict"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("trusted", "allow"),
            ("lists-only", "block"),
            ("lists-only", "allow")
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_waves_later_posts_of_the_same_text_reuse_its_scores() {
    let (mut h, _dir) = matching_hub("decide", None);
    let text = |i: i64| {
        format!(
            "join the best crypto group in town today message me for the link {}",
            ["now", "fast", "here"][i as usize % 3]
        )
    };
    h.push(post(0, &text(0), "u1"));
    let job = h.jobs.try_recv().unwrap();
    let mut first = scored(&job);
    first.scores = vec![Ok(vec![0.6])];
    h.result(first);
    // Posts 1 and 2 make it a wave (3 posts, 2 users) and run; each later
    // post has the text of one of the first three and reuses its scores.
    for i in 1..6 {
        h.push(post(i, &text(i), if i % 2 == 0 { "u1" } else { "u2" }));
        while let Ok(job) = h.jobs.try_recv() {
            h.result(scored(&job));
        }
    }
    let v = verdicts(&h);
    assert_eq!(v.len(), 6);
    assert_eq!(v[3]["verdict"], "review", "post 0's 0.6");
    assert_eq!(v[3]["reason"]["reused"], true);
    assert_eq!(v[3]["reason"]["wave"]["id"], "e0");
    assert_eq!(v[3]["scores"]["offensive"], 0.6000000238418579);
    for i in [1, 2] {
        assert_eq!(v[i]["verdict"], "allow", "post {i}: its own run's 0.1");
        assert!(
            v[i]["reason"].get("reused").is_none_or(|r| r == false),
            "{}",
            v[i]
        );
    }
    for i in [4, 5] {
        assert_eq!(v[i]["verdict"], "allow", "post {i}: post {}'s 0.1", i - 3);
        assert_eq!(v[i]["reason"]["reused"], true);
    }
    assert!(v[2]["reason"].get("wave").is_some() && v[4]["reason"].get("wave").is_some());
    let waves: Vec<serde_json::Value> = (h.outbox.sent().iter())
        .filter(|r| r.topic == "waves")
        .map(|r| serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap())
        .collect();
    assert_eq!(
        waves.len(),
        1,
        "one record as it started (the interval bounds the rest)"
    );
    assert_eq!(
        (waves[0]["size"].as_u64(), waves[0]["started"].as_bool()),
        (Some(3), Some(true))
    );
    h.acks(6).await;
    assert_eq!(h.stored().concat().last(), Some(&at(0, 6)));
}

/// Issue 46's attack through the hub: accounts seed a wave of a benign
/// text (the model scores it 0.016), then post it with insults swapped
/// in. Every insult post runs the model and gets the model's own verdict.
#[tokio::test(start_paused = true)]
async fn insults_posted_into_a_benign_wave_are_judged_by_the_model() {
    let (mut h, _dir) = matching_hub("decide", None);
    let benign = "hey neighbor you did a great job on the garden this spring it looks lovely";
    let insulting = "hey neighbor you did a fucking job on the garden this spring it looks lovely";
    let mut offset = 0;
    let mut model_runs = 0;
    let mut send = |h: &mut Harness, text: &str, offensive: f32| {
        h.push(post(offset, text, &format!("acct-{}", offset % 8)));
        offset += 1;
        while let Ok(job) = h.jobs.try_recv() {
            let mut result = scored(&job);
            result.scores = vec![Ok(vec![offensive]); job.texts.len()];
            h.result(result);
            model_runs += 1;
        }
    };
    for _ in 0..10 {
        send(&mut h, benign, 0.016);
    }
    for _ in 0..10 {
        send(&mut h, insulting, 0.958);
    }
    let v = verdicts(&h);
    assert_eq!(v.len(), 20);
    assert!(
        v[2..10].iter().all(|v| v["reason"]["reused"] == true),
        "the benign text reuses"
    );
    for v in &v[10..] {
        assert_eq!(v["verdict"], "block", "{v}");
        assert!(v["reason"]["wave"].is_object(), "in the wave: {v}");
    }
    assert!(
        v[11..].iter().all(|v| v["reason"]["reused"] == true),
        "the insult reuses its own text's scores"
    );
    assert_eq!(
        model_runs, 3,
        "the benign text twice before its wave, the insult once"
    );
    h.acks(20).await;
}

/// A backlog read at once: the wave's later posts arrived before its first
/// post was scored, and take its scores at their model's turn instead.
#[tokio::test(start_paused = true)]
async fn a_backlogs_wave_posts_take_the_kept_scores_at_their_models_turn() {
    let (mut h, _dir) = matching_hub("decide", None);
    let text = "join the best crypto group in town today message me for the link now";
    for i in 0..6 {
        h.push(post(i, text, if i % 2 == 0 { "u1" } else { "u2" }));
    }
    // The lane runs two at a time: posts 0 and 1; 2 to 5 wait in its queue.
    let first = h.jobs.try_recv().unwrap();
    let second = h.jobs.try_recv().unwrap();
    assert!(h.jobs.try_recv().is_err());
    let mut result = scored(&first);
    result.scores = vec![Ok(vec![0.6])];
    h.result(result);
    h.result(scored(&second));
    assert!(
        h.jobs.try_recv().is_err(),
        "posts 2 to 5 took post 0's scores"
    );
    let v = verdicts(&h);
    assert_eq!(v.len(), 6);
    for v in &v[2..] {
        assert_eq!(
            (v["verdict"].as_str(), v["reason"]["reused"].as_bool()),
            (Some("review"), Some(true)),
            "{v}"
        );
    }
    assert_eq!(
        v[1]["verdict"], "allow",
        "post 1 ran before any scores were kept"
    );
    h.acks(6).await;
    assert_eq!(h.in_flight(), 0);
    assert_eq!(h.stored().concat().last(), Some(&at(0, 6)));
}

/// An exactly-once hub with waves of 3 posts by 2 users (a waves topic) and
/// every verdict drawn for a sample, 2 per second.
fn exactly_once_matching_hub() -> Harness {
    let settings = Settings::from_toml(
        r#"
        [kafka]
        bootstrap_servers = "127.0.0.1:1"
        delivery = "exactly_once"
        drain_timeout = "1s"
        [input]
        topics = ["posts"]
        [output]
        waves_topic = "waves"
        samples_topic = "samples"
        [batching]
        max_batch_size = 1
        [inference]
        workers = 1
        [matching]
        waves = true
        wave_posts = 3
        wave_users = 2
        [sampling]
        min_rate = 1.0
        max_rate = 1.0
        max_per_second = 2.0
        "#,
    )
    .unwrap();
    let mut h = harness_of_settings(settings.clone());
    (h.hub.stages.matching).set_matcher(Some(Matcher::new(&settings.matching).unwrap()));
    h
}

/// Exactly-once: the transaction that held a wave's started record (and
/// its posts' samples) aborts; the partition is read again, and the
/// records go out again in the next transaction: none is lost to the
/// abort.
#[tokio::test(start_paused = true)]
async fn a_wave_record_and_samples_rolled_back_by_an_abort_are_written_again() {
    let mut h = exactly_once_matching_hub();
    let text = "join the best crypto group in town today message me for the link now";
    let kinds =
        |h: &Harness, topic: &str| h.outbox.sent().iter().filter(|r| r.topic == topic).count();
    let judge = |h: &mut Harness, generation: u64| {
        for i in 0..3 {
            let mut r = post(i, text, ["u1", "u2", "u1"][i as usize]);
            r.generation = crate::tp::Generation(generation);
            h.push(r);
            while let Ok(job) = h.jobs.try_recv() {
                h.result(scored(&job));
            }
        }
    };
    h.outbox.fail_topic("waves", Fate::InTransaction);
    judge(&mut h, 0);
    assert_eq!(kinds(&h, "waves"), 1, "the wave started at post 2");
    assert_eq!(
        kinds(&h, "samples"),
        3,
        "2 samples and 1 drop (2 per second)"
    );
    h.acks(3).await;
    let answer = h.seal().try_recv().expect("nothing outstanding");
    assert!(answer.abort.is_some(), "the transaction aborts: {answer:?}");
    assert!(
        !answer.positions.contains(&at(0, 3)),
        "no position passes the failed record: {answer:?}"
    );
    h.rewind(tp(0), 1);
    h.hub.on_control(Control::Unseal);
    h.outbox.fail_all(None);
    h.outbox.heal_topics();
    judge(&mut h, 1);
    h.acks(3).await;
    assert_eq!(kinds(&h, "waves"), 2, "the started record went out again");
    let samples: Vec<serde_json::Value> = (h.outbox.sent().iter())
        .filter(|r| r.topic == "samples")
        .map(|r| serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap())
        .collect();
    let dropped =
        |s: &[serde_json::Value]| s.iter().map(|v| v["dropped"] == true).collect::<Vec<_>>();
    assert_eq!(
        dropped(&samples[3..]),
        dropped(&samples[..3]),
        "each event drawn as before, no token spent again"
    );
    let answer = h.seal().try_recv().expect("acknowledged");
    assert_eq!((answer.abort, answer.positions), (None, vec![at(0, 3)]));
}

/// A verdict that cannot be written in the output format is dead-lettered
/// with its wave record: the wave grew by its post either way.
#[tokio::test(start_paused = true)]
async fn a_dead_lettered_verdict_keeps_its_wave_record() {
    let (mut h, _dir) = matching_hub("decide", None);
    let text = "join the best crypto group in town today message me for the link now";
    for i in 0..2 {
        h.push(post(i, text, ["u1", "u2"][i as usize]));
        while let Ok(job) = h.jobs.try_recv() {
            h.result(scored(&job));
        }
    }
    // The third post starts the wave; its verdict does not fit the format.
    (h.hub.stages.outputs).set_encoder(Some(crate::schema::verdict::VerdictEncoder::refusing()));
    h.push(post(2, text, "u1"));
    let sent = h.outbox.sent();
    let dlq = sent
        .iter()
        .filter(|r| r.kind == crate::producer::record::RecordKind::Dlq)
        .count();
    let waves: Vec<&OutRecord> = sent.iter().filter(|r| r.topic == "waves").collect();
    assert_eq!(
        (dlq, waves.len()),
        (1, 1),
        "the dead letter and its wave record"
    );
    let wave: serde_json::Value =
        serde_json::from_slice(waves[0].payload.as_deref().unwrap()).unwrap();
    assert_eq!(wave["started"], true);
    h.acks(3).await;
    assert_eq!(h.stored().concat().last(), Some(&at(0, 3)));
}
