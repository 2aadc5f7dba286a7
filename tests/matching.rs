//! Matching through the whole pipeline on the mock cluster, with the
//! shipped profanity model: a synthetic campaign's waves found against the
//! generator's truth, with reused verdicts equal to the model's own; a
//! list item added on the list topic under paced load, matching on every
//! partition within seconds and no more once removed; a list file read
//! again while running (a wrong one refused); instances joining
//! and leaving mid-wave without a verdict lost or an offset left behind.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use modstream::config::Settings;
use modstream::shutdown::Shutdown;
use modstream::tools::campaign::{Campaign, CampaignPost, generate_campaign};
use modstream::tools::embedded::EmbeddedBroker;
use modstream::verdict::Verdict;
use support::{DLQ, INPUT, VERDICTS};

const WAVES: &str = "waves";
const LISTS: &str = "lists";

fn broker(partitions: i32) -> EmbeddedBroker {
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
fn settings(dir: &Path, bootstrap: &str, group: &str, matching: &str) -> Settings {
    let path = support::write_config(dir, bootstrap, group);
    let text = std::fs::read_to_string(&path).unwrap().replace(
        &format!("dlq_topic = \"{DLQ}\""),
        &format!("dlq_topic = \"{DLQ}\"\nwaves_topic = \"{WAVES}\""),
    );
    std::fs::write(&path, format!("{text}\n[matching]\n{matching}\n")).unwrap();
    Settings::load(Some(&path)).unwrap()
}

fn triples(posts: &[CampaignPost]) -> Vec<(String, String, Vec<u8>)> {
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
fn by_id(records: &[modstream::tools::read::ReadRecord]) -> HashMap<String, serde_json::Value> {
    let mut out = HashMap::new();
    for r in records {
        let v = r.json().unwrap();
        let id = v["event_id"].as_str().unwrap().to_string();
        assert!(out.insert(id, v).is_none(), "one verdict per event");
    }
    out
}

/// Polls until `group`'s committed offsets sum to `total` (or 30 s).
async fn committed_sum(bootstrap: &str, group: &str, partitions: i32, total: i64) -> i64 {
    let (b, g) = (bootstrap.to_string(), group.to_string());
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sum: i64 = support::committed(&b, &g, partitions)
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
fn model_verdicts(settings: &Settings, texts: &[String]) -> Vec<modstream::verdict::Verdict> {
    let mut model = modstream::inference::load_sessions(&settings.inference, 1, 32)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaigns_waves_are_found_and_reuse_the_verdicts_the_model_gives() {
    support::init_logs();
    let broker = broker(2);
    let bootstrap = broker.bootstrap_servers().to_string();
    let posts = generate_campaign(2000, &Campaign::default(), "c-");
    let events = triples(&posts);
    let b = bootstrap.clone();
    let acked = tokio::task::spawn_blocking(move || support::produce(&b, &events))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(
        dir.path(),
        &bootstrap,
        "g-campaign",
        "waves = true\nreuse = true",
    );
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings.clone(), shutdown.clone()));
    support::read_records(&bootstrap, VERDICTS, 2, posts.len()).await;
    let committed = committed_sum(&bootstrap, "g-campaign", 2, posts.len() as i64).await;
    shutdown.stop.cancel();
    let summary = pipeline.await.unwrap().unwrap();
    assert_eq!((summary.verdicts, summary.dlq), (posts.len() as u64, 0));
    assert_eq!(committed, posts.len() as i64, "committed == end");
    let b = bootstrap.clone();
    let verification =
        tokio::task::spawn_blocking(move || support::verify(&b, &acked, Duration::from_secs(30)))
            .await
            .unwrap();
    assert!(verification.lost.is_empty() && verification.duplicates == 0);
    let verdicts = by_id(&support::read_to_end(&bootstrap, VERDICTS).await);

    // Waves against the generator's truth.
    let in_wave = |p: &CampaignPost| verdicts[&p.event.event_id]["reason"].get("wave").is_some();
    let spam = posts.iter().filter(|p| p.template.is_some()).count();
    let marked_spam = posts
        .iter()
        .filter(|p| p.template.is_some() && in_wave(p))
        .count();
    let marked_normal = posts
        .iter()
        .filter(|p| p.template.is_none() && in_wave(p))
        .count();
    let precision = marked_spam as f64 / (marked_spam + marked_normal).max(1) as f64;
    let recall = marked_spam as f64 / spam as f64;

    // Reused verdicts against the model's own verdict of each post's text:
    // reuse is by identical text, so they agree, evasions included.
    let reused: Vec<&CampaignPost> = posts
        .iter()
        .filter(|p| verdicts[&p.event.event_id]["reason"]["reused"] == true)
        .collect();
    let raw: Vec<String> = reused
        .iter()
        .map(|p| p.event.text.clone().unwrap())
        .collect();
    let own = model_verdicts(&settings, &raw);
    let verdict_of = |p: &CampaignPost| {
        verdicts[&p.event.event_id]["verdict"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let disagreeing: Vec<(&str, String, Verdict)> = reused
        .iter()
        .zip(&own)
        .filter(|(p, v)| verdict_of(p) != v.as_str())
        .map(|(p, v)| (p.event.event_id.as_str(), verdict_of(p), *v))
        .collect();
    let mut own_kinds: Vec<&str> = own.iter().map(|v| v.as_str()).collect();
    own_kinds.sort();
    own_kinds.dedup();
    let waves = support::read_to_end(&bootstrap, WAVES).await;
    let started = waves
        .iter()
        .filter(|r| r.json().unwrap()["started"] == true)
        .count();
    eprintln!(
        "campaign: {spam} campaign posts of {}; in a wave: {marked_spam} campaign, {marked_normal} normal (precision {precision:.3}, recall {recall:.3}); reused {} ({} disagreeing with the model's verdict of the text; the model's verdicts of them {own_kinds:?}); wave records {} ({started} started)",
        posts.len(),
        reused.len(),
        disagreeing.len(),
        waves.len()
    );
    assert!(precision >= 0.99, "precision {precision}");
    assert!(recall >= 0.75, "recall {recall}");
    assert!(
        reused.len() * 2 >= marked_spam,
        "most posts of a wave reuse: {}",
        reused.len()
    );
    assert!(
        disagreeing.is_empty(),
        "reused verdicts unlike the model's: {disagreeing:?}"
    );
    assert!(
        own_kinds.len() >= 2,
        "the reused verdicts are not all one kind: {own_kinds:?}"
    );
    assert_eq!(started, 5, "one wave per template");
    assert!(reused.iter().all(|p| p.template.is_some()));
}

/// A target post every fifth post, on both partitions, while a list item
/// is added and removed on the list topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_item_on_the_list_topic_matches_within_seconds_and_stops_when_removed() {
    support::init_logs();
    let broker = broker(2);
    let bootstrap = broker.bootstrap_servers().to_string();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(
        dir.path(),
        &bootstrap,
        "g-list-topic",
        &format!("list_topic = \"{LISTS}\""),
    );
    let shutdown = Shutdown::new();
    let health = std::sync::Arc::new(modstream::telemetry::Health::default());
    let pipeline = tokio::spawn(modstream::pipeline::run_with_health(
        settings,
        shutdown.clone(),
        health.clone(),
    ));
    // Judging from the first post: the window before the item has posts.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !health
        .consumer_ready
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        assert!(Instant::now() < deadline, "the pipeline started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let target = "buy cheap watches at example dot com today";
    let (add_at, remove_at, end) = (
        Duration::from_secs(2),
        Duration::from_secs(7),
        Duration::from_secs(14),
    );
    let b = bootstrap.clone();
    let load = std::thread::spawn(move || {
        let started = Instant::now();
        let mut sent = Vec::new();
        let mut i = 0;
        let (mut added, mut removed) = (None, None);
        while started.elapsed() < end && i < 3000 {
            if added.is_none() && started.elapsed() >= add_at {
                let before = chrono::Utc::now();
                list_record(
                    &b,
                    Some(
                        r#"{"verdict": "block", "label": "spam", "text": "Buy CHEAP watches at example dot com today!"}"#,
                    ),
                );
                added = Some(before);
            }
            if removed.is_none() && started.elapsed() >= remove_at {
                // Before the tombstone is written: a post judged earlier
                // sees the item.
                removed = Some(chrono::Utc::now());
                list_record(&b, None);
            }
            let text = if i % 5 == 0 {
                target.to_string()
            } else {
                format!("an ordinary post number {i} about the weather")
            };
            let id = format!("l-{i}");
            let payload = serde_json::json!({"event_id": id, "text": text})
                .to_string()
                .into_bytes();
            support::produce(&b, &[(id.clone(), format!("k{i}"), payload)]);
            sent.push((id, started.elapsed(), i % 5 == 0));
            i += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        (sent, added.unwrap(), removed.unwrap())
    });
    let (sent, added, removed) = tokio::task::spawn_blocking(move || load.join().unwrap())
        .await
        .unwrap();
    support::read_records(&bootstrap, VERDICTS, 2, sent.len()).await;
    shutdown.stop.cancel();
    pipeline.await.unwrap().unwrap();
    let verdicts = by_id(&support::read_to_end(&bootstrap, VERDICTS).await);
    let settle = Duration::from_secs(3);
    let mut matched_partitions = std::collections::HashSet::new();
    let (mut first_match, mut last_match) = (None, None);
    // Targets judged before the item and well after its removal: the
    // windows the assertions below hold in (each must have some).
    let (mut before, mut after) = (0, 0);
    for (id, at, is_target) in &sent {
        let v = &verdicts[id];
        let matched = v["reason"]["match"]["id"] == "w1";
        if matched {
            assert!(*is_target, "only the target matches: {v}");
            first_match = first_match.or(Some(*at));
            last_match = Some(*at);
        }
        if !is_target {
            continue;
        }
        // Judged before the item was written, or well after its removal.
        let judged: chrono::DateTime<chrono::Utc> =
            v["processed_at"].as_str().unwrap().parse().unwrap();
        if judged < added || judged > removed + settle {
            assert!(!matched, "sent at {at:?}, outside the item's time: {v}");
            before += usize::from(judged < added);
            after += usize::from(judged > removed + settle);
        }
        // Sent well after the item was written and judged before its
        // removal (a post's intake may lag its send under load).
        if *at >= add_at + settle && judged < removed {
            assert!(matched, "sent at {at:?}, the item in force: {v}");
            assert_eq!(v["verdict"], "block");
            matched_partitions.insert(v["source"]["partition"].as_i64().unwrap());
        }
    }
    eprintln!(
        "list topic: item added at {add_at:?}, first match at {first_match:?}; removed at {remove_at:?}, last match at {last_match:?}; targets judged before it {before}, after its removal {after}"
    );
    assert_eq!(matched_partitions.len(), 2, "matched on every partition");
    assert!(
        before >= 2 && after >= 2,
        "both windows judged targets: {before}, {after}"
    );
}

/// A list topic record: key "w1", the item (None: a tombstone).
fn list_record(bootstrap: &str, item: Option<&str>) {
    list_records(bootstrap, &[("w1".into(), item.map(str::to_string))]);
}

/// Instances join and leave while waves are forming: their clusters are
/// lost with their partitions (found again on the next owner), no verdict
/// is lost and every offset is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_joining_and_leaving_mid_wave_lose_nothing() {
    support::init_logs();
    let broker = broker(4);
    let bootstrap = broker.bootstrap_servers().to_string();
    let posts = generate_campaign(3000, &Campaign::default(), "r-");
    let producing =
        support::produce_paced(bootstrap.clone(), triples(&posts), Duration::from_secs(6));
    let dir = tempfile::tempdir().unwrap();
    let group = "g-mid-wave";
    let settings = settings(dir.path(), &bootstrap, group, "waves = true\nreuse = true");
    let start = |s: &Settings| {
        let shutdown = Shutdown::new();
        let run = tokio::spawn(modstream::pipeline::run(s.clone(), shutdown.clone()));
        (shutdown, run)
    };
    let (stop_a, a) = start(&settings);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (stop_b, b) = start(&settings);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_a.stop.cancel();
    a.await.unwrap().unwrap();
    let (stop_c, c) = start(&settings);
    let last_move = chrono::Utc::now();
    let acked = tokio::task::spawn_blocking(move || producing.join().unwrap())
        .await
        .unwrap();
    let b2 = bootstrap.clone();
    let verification =
        tokio::task::spawn_blocking(move || support::verify(&b2, &acked, Duration::from_secs(60)))
            .await
            .unwrap();
    let committed = committed_sum(&bootstrap, group, 4, posts.len() as i64).await;
    stop_b.stop.cancel();
    stop_c.stop.cancel();
    b.await.unwrap().unwrap();
    c.await.unwrap().unwrap();
    verification.report("mid-wave");
    assert!(
        verification.lost.is_empty(),
        "lost {:?}",
        &verification.lost[..verification.lost.len().min(10)]
    );
    assert_eq!(committed, posts.len() as i64, "committed == end");
    let verdicts = support::read_to_end(&bootstrap, VERDICTS).await;
    let template: HashMap<&str, Option<usize>> = posts
        .iter()
        .map(|p| (p.event.event_id.as_str(), p.template))
        .collect();
    // After the last move (c joined, a left), each template's wave is found
    // again by the partitions' new owners; no normal post is in one.
    let mut found_after = std::collections::BTreeSet::new();
    let mut normal_in_wave = 0;
    for r in &verdicts {
        let v = r.json().unwrap();
        if v["reason"].get("wave").is_none() {
            continue;
        }
        let judged: chrono::DateTime<chrono::Utc> =
            v["processed_at"].as_str().unwrap().parse().unwrap();
        match template[v["event_id"].as_str().unwrap()] {
            Some(t) if judged > last_move => {
                found_after.insert(t);
            }
            Some(_) => {}
            None => normal_in_wave += 1,
        }
    }
    eprintln!(
        "mid-wave: {} verdicts, templates in a wave after the last move {found_after:?}, {} duplicates",
        verdicts.len(),
        verification.duplicates
    );
    assert_eq!(normal_in_wave, 0, "no normal post in a wave");
    assert_eq!(
        found_after.len(),
        5,
        "every template's wave found again after the moves"
    );
}

/// A list file changed while running is read again (a wrong one is
/// refused whole and the list in force stays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_file_changed_while_running_is_read_again_and_a_wrong_one_refused() {
    support::init_logs();
    let broker = broker(2);
    let bootstrap = broker.bootstrap_servers().to_string();
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("spam.jsonl");
    let item = |id: &str, text: &str| {
        format!(
            "{{\"id\": \"{id}\", \"verdict\": \"block\", \"label\": \"spam\", \"text\": \"{text}\"}}\n"
        )
    };
    std::fs::write(&list, item("old", "something else entirely here")).unwrap();
    let matching = format!("lists = [{{ name = \"spam\", file = {list:?} }}]");
    let mut settings = settings(dir.path(), &bootstrap, "g-list-file", &matching);
    settings.inference.reload_interval = Duration::from_millis(200);
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let target = "cheap watches for sale at example dot com";
    // Post `n` of the target text; the id its verdict matched (if any).
    let post = |n: usize| {
        let b = bootstrap.clone();
        async move {
            let id = format!("f-{n}");
            let payload = serde_json::json!({"event_id": id, "text": target})
                .to_string()
                .into_bytes();
            let to = b.clone();
            tokio::task::spawn_blocking(move || {
                support::produce(&to, &[(id, format!("k{n}"), payload)])
            })
            .await
            .unwrap();
            let verdicts = by_id(&support::read_records(&b, VERDICTS, 2, n + 1).await);
            verdicts[&format!("f-{n}")]["reason"]["match"]["id"]
                .as_str()
                .map(str::to_string)
        }
    };
    assert_eq!(post(0).await, None);
    std::fs::write(
        &list,
        item("w1", "Cheap WATCHES for sale at example dot com!"),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        post(1).await.as_deref(),
        Some("w1"),
        "the new file in force"
    );
    std::fs::write(&list, format!("{}not an item\n", item("w2", "anything"))).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        post(2).await.as_deref(),
        Some("w1"),
        "the wrong file refused, the list kept"
    );
    shutdown.stop.cancel();
    pipeline.await.unwrap().unwrap();
}

/// Items written to the list topic before a start are in force for the
/// first verdict: the backlog of target posts waiting in the input when
/// the service starts is matched, every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_topic_items_are_in_force_before_the_first_verdict() {
    support::init_logs();
    let broker = broker(2);
    let bootstrap = broker.bootstrap_servers().to_string();
    let b = bootstrap.clone();
    tokio::task::spawn_blocking(move || {
        // Many items before the one that matters: reading them takes a while.
        let mut records: Vec<(String, Option<String>)> = (0..3000)
            .map(|i| {
                let item = format!(r#"{{"verdict": "review", "label": "spam", "text": "filler item number {i} of the list"}}"#);
                (format!("f{i}"), Some(item))
            })
            .collect();
        let target = r#"{"verdict": "block", "label": "spam", "text": "buy cheap watches at example dot com today"}"#;
        records.push(("w1".into(), Some(target.into())));
        list_records(&b, &records);
        let events: Vec<(String, String, Vec<u8>)> = (0..40)
            .map(|i| {
                let id = format!("t-{i}");
                let payload = serde_json::json!({"event_id": id, "text": "Buy CHEAP watches at example dot com today!!"});
                (id, format!("k{i}"), payload.to_string().into_bytes())
            })
            .collect();
        support::produce(&b, &events);
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(
        dir.path(),
        &bootstrap,
        "g-list-first",
        &format!("list_topic = \"{LISTS}\""),
    );
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let verdicts = by_id(&support::read_records(&bootstrap, VERDICTS, 2, 40).await);
    shutdown.stop.cancel();
    pipeline.await.unwrap().unwrap();
    let unmatched: Vec<&String> = verdicts
        .iter()
        .filter(|(_, v)| v["reason"]["match"]["id"] != "w1" || v["verdict"] != "block")
        .map(|(id, _)| id)
        .collect();
    assert!(
        unmatched.is_empty(),
        "judged before the list was in force: {unmatched:?}"
    );
}

/// A list topic that does not exist: the start waits `list_topic_wait`
/// and fails naming it; with `list_topic_late = "start"` it starts and
/// /readyz says why it is not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_topic_that_cannot_be_read_fails_the_start_or_readyz() {
    support::init_logs();
    let broker = EmbeddedBroker::start(&[(INPUT, 1), (VERDICTS, 1), (DLQ, 1), (WAVES, 1)]).unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let dir = tempfile::tempdir().unwrap();
    let matching = "list_topic = \"no-such-lists\"\nlist_topic_wait = \"3s\"";
    let settings = settings(dir.path(), &bootstrap, "g-list-missing", matching);
    let started = Instant::now();
    let result = modstream::pipeline::run(settings.clone(), Shutdown::new()).await;
    let e = result.expect_err("the start fails").to_string();
    assert!(
        e.contains("no-such-lists") && e.contains("list_topic_wait"),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let mut late = settings;
    late.matching.list_topic_late = modstream::config::ListTopicLate::Start;
    let health = std::sync::Arc::new(modstream::telemetry::Health::default());
    let shutdown = Shutdown::new();
    let run = tokio::spawn(modstream::pipeline::run_with_health(
        late,
        shutdown.clone(),
        health.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !health
        .consumer_ready
        .load(std::sync::atomic::Ordering::SeqCst)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let why = health.list_topic().expect("/readyz says why");
    assert!(why.contains("no-such-lists") && !health.ready(), "{why}");
    shutdown.stop.cancel();
    run.await.unwrap().unwrap();
}

/// Issue 46's attack with the shipped profanity model: eight accounts post
/// 40 variants of a benign text until it is a wave (reuse on), then 60
/// variants with one or two words swapped for insults, and posts whose
/// look-alike letters fool the model followed by the plain text. Every
/// verdict is the model's own verdict of that post's text: no post takes
/// a less strict verdict from the wave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spammer_cannot_make_insults_reuse_a_benign_waves_scores() {
    support::init_logs();
    let broker = broker(2);
    let bootstrap = broker.bootstrap_servers().to_string();
    let benign = [
        "hey neighbor you did a great job on the garden this spring it looks lovely now",
        "hey neighbor you did a great job on the garden this spring it looks lovely today",
        "hey neighbor you did a great job on the garden this spring it looks really lovely",
        "hey neighbor you did a wonderful job on the garden this spring it looks lovely",
    ];
    let insults = ["fucking", "shitty", "crappy", "stupid", "damn"];
    let mut texts: Vec<String> = (0..40)
        .map(|i| benign[i % benign.len()].to_string())
        .collect();
    for i in 0..60 {
        let mut words: Vec<&str> = benign[i % benign.len()].split(' ').collect();
        words[5] = insults[i % insults.len()];
        if i % 3 == 0 {
            words[1] = "idiot";
        }
        texts.push(words.join(" "));
    }
    // A look-alike evasion first (Cyrillic і, о), then the plain text.
    for _ in 0..10 {
        texts.push(
            "hey neighbоr you did a fuсking jоb on the garden this spring it looks lovely".into(),
        );
        texts.push(
            "hey neighbor you did a fucking job on the garden this spring it looks lovely".into(),
        );
    }
    let events: Vec<(String, String, Vec<u8>)> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let id = format!("a-{i}");
            let user = format!("acct-{}", i % 8);
            let payload = serde_json::json!({"event_id": id, "text": text, "user_id": user});
            (id, user, payload.to_string().into_bytes())
        })
        .collect();
    let b = bootstrap.clone();
    tokio::task::spawn_blocking(move || support::produce(&b, &events))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let matching = "waves = true\nreuse = true\nwave_posts = 20\nwave_users = 5";
    let settings = settings(dir.path(), &bootstrap, "g-attack", matching);
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings.clone(), shutdown.clone()));
    let verdicts = by_id(&support::read_records(&bootstrap, VERDICTS, 2, texts.len()).await);
    shutdown.stop.cancel();
    pipeline.await.unwrap().unwrap();
    let own = model_verdicts(&settings, &texts);
    let mut served_less_strict = Vec::new();
    let (mut reused, mut in_wave, mut flagged) = (0, 0, 0);
    for (i, want) in own.iter().enumerate() {
        let v = &verdicts[&format!("a-{i}")];
        let got = Verdict::parse(v["verdict"].as_str().unwrap()).unwrap();
        if got < *want {
            served_less_strict.push((i, texts[i].clone(), got, *want));
        }
        reused += usize::from(v["reason"]["reused"] == true);
        in_wave += usize::from(i >= 40 && v["reason"].get("wave").is_some());
        flagged += usize::from(i >= 40 && *want > Verdict::Allow);
    }
    eprintln!(
        "attack: {} posts, {reused} reused, {in_wave} of the 80 later posts in the wave, {flagged} of them flagged by the model",
        texts.len()
    );
    assert!(
        served_less_strict.is_empty(),
        "bypasses: {served_less_strict:?}"
    );
    assert!(in_wave >= 30, "the insults joined the wave: {in_wave}");
    assert!(flagged > 40, "the model flags the insults: {flagged}");
    assert!(reused > 20, "the benign repeats still reuse: {reused}");
}

/// List topic records, in order: (key, the item; None: a tombstone).
fn list_records(bootstrap: &str, records: &[(String, Option<String>)]) {
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
