//! Policies per community over two models (the shipped profanity model and
//! MiniLM) on one stream, through the whole pipeline on the mock cluster:
//! each community judged by its rule with the reason in every verdict,
//! checked against each model's own score of the text; MiniLM scoring only
//! the kids' posts; review verdicts of the kids routed to their review
//! topic; one decision record per event; a policy file changed under load
//! (and a bad one refused); `modstream explain` on the real topic.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

use modstream::config::{InferenceSettings, Settings};
use modstream::policy::ModelId;
use modstream::shutdown::Shutdown;
use modstream::tools::demo::{self, DEMO_DLQ, DEMO_INPUT, DEMO_VERDICTS};
use modstream::tools::embedded::EmbeddedBroker;
use modstream::tools::read::ReadRecord;

const PARTITIONS: i32 = 2;
const REVIEW: &str = "kids-review";
const DECISIONS: &str = "moderation.decisions";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn minilm_dir() -> PathBuf {
    let dir = root().join("models/minilm-l6");
    assert!(
        dir.join("model.onnx").is_file(),
        "{} missing: run scripts/build-minilm-model.sh (scripts/test.sh does)",
        dir.display()
    );
    dir
}

/// Three communities and the rest: kids (both models, strict, reviews
/// routed), debate (lenient), news (every verdict to a human).
fn policy(version: &str, kids_minilm: bool, kids_review_at: f32) -> String {
    let minilm = if kids_minilm {
        "models.minilm.offensive = { review_at = 0.4, block_at = 0.8 }\n"
    } else {
        ""
    };
    format!(
        r#"
version = "{version}"

[[rules]]
id = "kids"
when = {{ tenant = "kids" }}
models.profanity.offensive = {{ review_at = {kids_review_at}, block_at = 0.97 }}
{minilm}routes = [{{ verdicts = ["review"], topic = "{REVIEW}", priority = "high" }}]

[[rules]]
id = "debate"
when = {{ tenant = "debate" }}
models.profanity.offensive = {{ review_at = 0.9, block_at = 0.98 }}

[[rules]]
id = "news"
when = {{ tenant = "news" }}
human_review = true
models.profanity.offensive = {{ review_at = 0.5, block_at = 0.85 }}

[[rules]]
id = "default"
models.profanity.offensive = {{ review_at = 0.5, block_at = 0.85 }}
"#
    )
}

/// The rule's thresholds per model, as the test reads its own policy.
fn thresholds(rule: &str, version: &str) -> Vec<(&'static str, f32, f32)> {
    let kids_review = if version == "v1" { 0.05 } else { 0.35 };
    match rule {
        "kids" if version == "v1" => vec![("profanity", kids_review, 0.97), ("minilm", 0.4, 0.8)],
        "kids" => vec![("profanity", kids_review, 0.97)],
        "debate" => vec![("profanity", 0.9, 0.98)],
        _ => vec![("profanity", 0.5, 0.85)],
    }
}

fn config_toml(bootstrap: &str, group: &str, policy: &Path) -> String {
    let dlq = format!("dlq_topic = \"{DEMO_DLQ}\"");
    let mut toml = demo::demo_config(bootstrap, group, 16, 10).replace(
        &dlq,
        &format!("{dlq}\n        decisions_topic = \"{DECISIONS}\""),
    );
    toml.push_str(&format!(
        r#"
        [inference]
        reload_interval = "200ms"
        [[inference.models]]
        name = "profanity"
        model_dir = {:?}
        workers = 1
        [[inference.models]]
        name = "minilm"
        model_dir = {:?}
        workers = 1
        max_batch_size = 8
        [policy]
        file = {:?}
        "#,
        root().join("models/profanity-check"),
        minilm_dir(),
        policy,
    ));
    toml
}

fn broker() -> EmbeddedBroker {
    EmbeddedBroker::start(&[
        (DEMO_INPUT, PARTITIONS),
        (DEMO_VERDICTS, PARTITIONS),
        (DEMO_DLQ, 1),
        (REVIEW, 1),
        (DECISIONS, 1),
    ])
    .unwrap()
}

/// The sample posts, each given to a community in turn.
fn posts(count: usize, prefix: &str) -> Vec<(String, String, Option<&'static str>)> {
    let text = std::fs::read_to_string(root().join("data/sample_posts.txt")).unwrap();
    let lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('|'))
        .map(|l| l.split_once('|').unwrap().1.to_string())
        .collect();
    let tenants = [Some("kids"), Some("debate"), Some("news"), None];
    (0..count)
        .map(|i| {
            (
                format!("{prefix}{i}"),
                lines[i % lines.len()].clone(),
                tenants[i % tenants.len()],
            )
        })
        .collect()
}

async fn produce(
    bootstrap: &str,
    posts: &[(String, String, Option<&'static str>)],
    pace: Duration,
) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (id, text, tenant) in posts {
        let mut event = serde_json::json!({"event_id": id, "text": text});
        if let Some(t) = tenant {
            event["tenant"] = (*t).into();
        }
        let value = event.to_string();
        producer
            .send(
                FutureRecord::to(DEMO_INPUT).key(id).payload(&value),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        if !pace.is_zero() {
            tokio::time::sleep(pace).await;
        }
    }
}

/// Each model's own probabilities of `offensive` for these texts, scored
/// directly (not through the pipeline).
fn own_scores(texts: &[String]) -> HashMap<&'static str, Vec<f32>> {
    let mut out = HashMap::new();
    for (name, dir) in [
        ("profanity", root().join("models/profanity-check")),
        ("minilm", minilm_dir()),
    ] {
        let settings = InferenceSettings {
            model_dir: dir,
            ..Default::default()
        };
        let mut model = modstream::inference::load_sessions(
            &settings,
            1,
            modstream::inference::RunLimit::posts(32),
        )
        .unwrap()
        .remove(0);
        let offensive = model
            .manifest
            .labels
            .iter()
            .position(|l| l == "offensive")
            .unwrap();
        let mut all = Vec::new();
        for chunk in texts.chunks(16) {
            let mut chunk = chunk.to_vec();
            all.extend(
                model
                    .score(&mut chunk)
                    .unwrap()
                    .into_iter()
                    .map(|p| p[offensive]),
            );
        }
        out.insert(name, all);
    }
    out
}

fn parse(records: &[ReadRecord]) -> Vec<(i32, i64, serde_json::Value)> {
    records
        .iter()
        .map(|r| {
            (
                r.partition,
                r.offset,
                serde_json::from_slice(&r.payload).unwrap(),
            )
        })
        .collect()
}

fn expected_verdict(score: f32, review_at: f32, block_at: f32) -> &'static str {
    if score >= block_at {
        "block"
    } else if score >= review_at {
        "review"
    } else {
        "allow"
    }
}

fn severity(v: &str) -> u8 {
    match v {
        "block" => 2,
        "review" => 1,
        _ => 0,
    }
}

/// A verdict's reason against the policy version it names and the models'
/// own scores; returns the verdict the test computes.
fn check_reason(v: &serde_json::Value, tenant: Option<&str>, own: &HashMap<&str, f32>) -> String {
    let reason = &v["reason"];
    let version = reason["policy"].as_str().unwrap();
    let rule = reason["rule"].as_str().unwrap();
    // Every tenant of the stream has its rule; posts without one the default.
    let want_rule = tenant.unwrap_or("default");
    assert_eq!(rule, want_rule, "{v}");
    let models = reason["models"].as_array().unwrap();
    let judged = thresholds(rule, version);
    let ids: Vec<&str> = models.iter().map(|m| m["id"].as_str().unwrap()).collect();
    let want_ids: Vec<&str> = judged.iter().map(|(m, _, _)| *m).collect();
    assert_eq!(ids, want_ids, "the models of rule {rule} in {version}: {v}");
    let mut worst = "allow";
    for (m, (name, review_at, block_at)) in models.iter().zip(&judged) {
        let reported = m["scores"]["offensive"].as_f64().unwrap() as f32;
        let mine = own[name];
        assert!(
            (reported - mine).abs() < 2e-3,
            "{name}: pipeline {reported}, own {mine}"
        );
        let verdict = expected_verdict(reported, *review_at, *block_at);
        let crossed = m["crossed"].as_array().unwrap();
        if verdict == "allow" {
            assert!(crossed.is_empty(), "{v}");
        } else {
            let threshold = if verdict == "block" {
                *block_at
            } else {
                *review_at
            };
            assert_eq!(crossed.len(), 1, "{v}");
            assert_eq!(crossed[0]["verdict"], verdict);
            assert_eq!(crossed[0]["label"], "offensive");
            assert!((crossed[0]["threshold"].as_f64().unwrap() as f32 - threshold).abs() < 1e-6);
        }
        if severity(verdict) > severity(worst) {
            worst = verdict;
        }
    }
    if rule == "news" {
        assert_eq!(reason["human_review"], true);
        if worst == "allow" {
            worst = "review";
        }
    }
    assert_eq!(v["verdict"], worst, "{v}");
    worst.to_string()
}

type Post = (String, String, Option<&'static str>);

/// Exactly one record of this kind per post, and none for anything else.
fn one_per_post(records: &[ReadRecord], posts: &[Post], kind: &str) {
    let counts = support::event_id_counts(records);
    let repeated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "{kind}s written more than once: {repeated:?}"
    );
    let mut ids: Vec<&str> = counts.keys().map(String::as_str).collect();
    let mut want: Vec<&str> = posts.iter().map(|(id, _, _)| id.as_str()).collect();
    ids.sort();
    want.sort();
    assert_eq!(ids, want, "one {kind} per post and no other");
}

/// Every verdict checked by [`check_reason`] against the models' own
/// scores of its post: (partition, the verdict, the post's index, the
/// verdict the test computed).
fn check_all<'a>(
    posts: &[Post],
    verdicts: &'a [(i32, i64, serde_json::Value)],
) -> Vec<(i32, &'a serde_json::Value, usize, String)> {
    let texts: Vec<String> = posts.iter().map(|(_, t, _)| t.clone()).collect();
    let own = own_scores(&texts);
    let by_id: HashMap<&str, usize> = posts
        .iter()
        .enumerate()
        .map(|(i, (id, _, _))| (id.as_str(), i))
        .collect();
    verdicts
        .iter()
        .map(|(partition, _, v)| {
            let i = by_id[v["event_id"].as_str().unwrap()];
            let scores: HashMap<&str, f32> = own.iter().map(|(m, s)| (*m, s[i])).collect();
            (*partition, v, i, check_reason(v, posts[i].2, &scores))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn communities_are_judged_by_their_rules_over_two_models_with_the_reason() {
    support::init_logs();
    let dir = tempfile::tempdir().unwrap();
    let policy_path = dir.path().join("policy.toml");
    std::fs::write(&policy_path, policy("v1", true, 0.05)).unwrap();
    let broker = broker();
    let bootstrap = broker.bootstrap_servers().to_string();
    let posts = posts(120, "p");
    produce(&bootstrap, &posts, Duration::ZERO).await;
    let config = dir.path().join("modstream.toml");
    std::fs::write(&config, config_toml(&bootstrap, "g-policies", &policy_path)).unwrap();
    let settings = Settings::load(Some(&config)).unwrap();
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    support::read_records(&bootstrap, DEMO_VERDICTS, PARTITIONS, posts.len()).await;
    support::read_records(&bootstrap, DECISIONS, 1, posts.len()).await;
    shutdown.stop.cancel();
    let summary = pipeline.await.unwrap().unwrap();
    assert_eq!((summary.verdicts, summary.dlq), (posts.len() as u64, 0));
    // Everything the run wrote, read to the end of each topic once it stopped.
    let verdicts = support::read_to_end(&bootstrap, DEMO_VERDICTS).await;
    one_per_post(&verdicts, &posts, "verdict");
    let verdicts = parse(&verdicts);
    let decisions = support::read_to_end(&bootstrap, DECISIONS).await;
    one_per_post(&decisions, &posts, "decision record");

    let mut kids_reviews = Vec::new();
    let mut seen = HashMap::new();
    for (_, v, i, verdict) in check_all(&posts, &verdicts) {
        *seen
            .entry((
                v["reason"]["rule"].as_str().unwrap().to_string(),
                verdict.clone(),
            ))
            .or_insert(0) += 1;
        if posts[i].2 == Some("kids") && verdict == "review" {
            kids_reviews.push(posts[i].0.clone());
        }
    }
    eprintln!("verdicts by (rule, verdict): {seen:?}");
    assert!(
        seen.keys().any(|(r, v)| r == "kids" && v != "allow")
            && seen.keys().any(|(r, v)| r == "debate" && v == "allow"),
        "the sample holds posts each rule judges differently: {seen:?}"
    );
    assert_eq!(verdicts.len(), posts.len());

    // Decision records (one per event, checked above), keyed by its id.
    for d in &decisions {
        let body: serde_json::Value = serde_json::from_slice(&d.payload).unwrap();
        assert_eq!(
            d.key.as_deref(),
            body["event_id"].as_str().map(str::as_bytes)
        );
        assert_eq!(body["policy"], "v1");
    }
    // The kids' reviews, copied to their review queue with the rule's priority.
    {
        let routed = parse(&support::read_to_end(&bootstrap, REVIEW).await);
        let mut ids: Vec<String> = routed
            .iter()
            .map(|(_, _, v)| v["event_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        kids_reviews.sort();
        assert_eq!(ids, kids_reviews);
        assert!(
            routed
                .iter()
                .all(|(_, _, v)| v["review_priority"] == "high")
        );
    }
    eprintln!("kids reviews routed: {}", kids_reviews.len());
    assert!(
        !kids_reviews.is_empty(),
        "the kids' rule sends some posts to review: {seen:?}"
    );

    // explain, on the real topic, with the same configuration.
    let (id, _, _) = posts.iter().find(|(_, _, t)| *t == Some("kids")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_modstream"))
        .args([
            "explain",
            "--event-id",
            id,
            "--topic",
            DEMO_INPUT,
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let live = verdicts
        .iter()
        .find(|(_, _, v)| v["event_id"] == id.as_str())
        .unwrap();
    assert!(
        text.contains(&format!("event {id} at {DEMO_INPUT}/")),
        "{text}"
    );
    assert!(text.contains("policy v1, rule \"kids\""), "{text}");
    assert!(
        text.contains("  profanity (alt-profanity-check")
            && text.contains("  minilm (minilm-l6-moderation"),
        "{text}"
    );
    assert!(
        text.contains(&format!("verdict: {}", live.2["verdict"].as_str().unwrap())),
        "{text}"
    );
    // Judged again now: no pipeline latency to show.
    assert!(text.contains("\"latency_ms\": null"), "{text}");
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_modstream"))
        .args([
            "explain",
            "--event-id",
            "no-such-post",
            "--topic",
            DEMO_INPUT,
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no event \"no-such-post\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_changed_under_load_applies_from_a_point_per_partition_and_a_bad_one_is_refused() {
    support::init_logs();
    let dir = tempfile::tempdir().unwrap();
    let policy_path = dir.path().join("policy.toml");
    std::fs::write(&policy_path, policy("v1", true, 0.05)).unwrap();
    let broker = broker();
    let bootstrap = broker.bootstrap_servers().to_string();
    let config = dir.path().join("modstream.toml");
    std::fs::write(
        &config,
        config_toml(&bootstrap, "g-policy-reload", &policy_path),
    )
    .unwrap();
    let settings = Settings::load(Some(&config)).unwrap();
    support::metrics();
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    // 600 posts over ~9 s; v2 (kids: profanity only, review_at 0.35) at
    // ~3 s, a file naming a model that does not exist at ~6 s.
    let posts = posts(600, "r");
    let load = {
        let (b, p) = (bootstrap.clone(), posts.clone());
        tokio::spawn(async move { produce(&b, &p, Duration::from_millis(15)).await })
    };
    let replace = |text: String| {
        let tmp = dir.path().join("policy.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &policy_path).unwrap();
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    replace(policy("v2", false, 0.35));
    tokio::time::sleep(Duration::from_secs(3)).await;
    replace(policy("v3", true, 0.05).replace("models.minilm", "models.bert"));
    load.await.unwrap();
    support::read_records(&bootstrap, DEMO_VERDICTS, PARTITIONS, posts.len()).await;
    shutdown.stop.cancel();
    let summary = pipeline.await.unwrap().unwrap();
    assert_eq!((summary.verdicts, summary.dlq), (posts.len() as u64, 0));
    let verdicts = support::read_to_end(&bootstrap, DEMO_VERDICTS).await;
    one_per_post(&verdicts, &posts, "verdict");
    let verdicts = parse(&verdicts);
    // v2 taken, v3 refused: counted as each happened (this binary's
    // recorder; no other test here reloads a policy).
    let reloads = |outcome: &str| {
        support::metric_value(&format!(
            "modstream_policy_reloads_total{{outcome=\"{outcome}\"}}"
        ))
    };
    assert_eq!(reloads("loaded"), Some(1.0), "v2 loaded once");
    assert_eq!(reloads("refused"), Some(1.0), "the bad v3 refused once");

    let mut per_partition: HashMap<i32, Vec<(i64, String)>> = HashMap::new();
    // Models, thresholds and verdict all of the version each names.
    for (partition, v, _, _) in check_all(&posts, &verdicts) {
        let offset = v["source"]["offset"].as_i64().unwrap();
        let version = v["reason"]["policy"].as_str().unwrap().to_string();
        per_partition
            .entry(partition)
            .or_default()
            .push((offset, version));
    }
    for (partition, mut seq) in per_partition {
        seq.sort();
        let versions: Vec<&str> = seq.iter().map(|(_, v)| v.as_str()).collect();
        let switch = versions
            .iter()
            .position(|v| *v == "v2")
            .unwrap_or(versions.len());
        assert!(
            switch > 0 && switch < versions.len(),
            "partition {partition}: both versions: {versions:?}"
        );
        assert!(
            versions[..switch].iter().all(|v| *v == "v1")
                && versions[switch..].iter().all(|v| *v == "v2"),
            "partition {partition}: v1 up to a point, then v2 (the bad v3 refused): {versions:?}"
        );
    }
}

#[test]
fn the_example_policy_loads_against_the_shipped_models() {
    let labels: Vec<modstream::policy::ModelLabels> = [
        ("profanity", root().join("models/profanity-check")),
        ("minilm", minilm_dir()),
    ]
    .into_iter()
    .map(|(name, dir)| {
        let manifest = modstream::inference::manifest::Manifest::load(&dir).unwrap();
        modstream::policy::ModelLabels::of(name, &manifest)
    })
    .collect();
    let rules =
        modstream::policy::Ruleset::load(&root().join("config/policy.example.toml"), &labels)
            .unwrap();
    let ids: Vec<&str> = rules.rule_ids().collect();
    assert_eq!(ids, ["kids", "debate", "news", "default"]);
    let cascade = &rules.rules()[3].cascade;
    assert_eq!(
        (cascade.len(), cascade[0].after, cascade[0].model),
        (1, ModelId(0), ModelId(1)),
        "MiniLM after the profanity model"
    );
}
