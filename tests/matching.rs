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
use modstream::matching::normalize::normalize;
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

    // Reused verdicts against the model's own verdict of each post: of its
    // text once normalised (its content, the evasions undone), and of its
    // raw text (which evasions may fool).
    let reused: Vec<&CampaignPost> = posts
        .iter()
        .filter(|p| verdicts[&p.event.event_id]["reason"]["reused"] == true)
        .collect();
    let raw: Vec<String> = reused
        .iter()
        .map(|p| p.event.text.clone().unwrap())
        .collect();
    let normalised: Vec<String> = raw.iter().map(|t| normalize(t)).collect();
    let (own, own_raw) = (
        model_verdicts(&settings, &normalised),
        model_verdicts(&settings, &raw),
    );
    let verdict_of = |p: &CampaignPost| {
        verdicts[&p.event.event_id]["verdict"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let agreeing = |own: &[Verdict]| {
        reused
            .iter()
            .zip(own)
            .filter(|(p, v)| verdict_of(p) == v.as_str())
            .count()
    };
    let agreement = agreeing(&own) as f64 / reused.len().max(1) as f64;
    let agreement_raw = agreeing(&own_raw) as f64 / reused.len().max(1) as f64;
    let fooled = reused
        .iter()
        .zip(&own_raw)
        .filter(|(p, v)| verdict_of(p) != v.as_str())
        .all(|(p, v)| Verdict::parse(&verdict_of(p)).unwrap() > *v);
    let mut own_kinds: Vec<&str> = own.iter().map(|v| v.as_str()).collect();
    own_kinds.sort();
    own_kinds.dedup();
    let waves = support::read_to_end(&bootstrap, WAVES).await;
    let started = waves
        .iter()
        .filter(|r| r.json().unwrap()["started"] == true)
        .count();
    eprintln!(
        "campaign: {spam} campaign posts of {}; in a wave: {marked_spam} campaign, {marked_normal} normal (precision {precision:.3}, recall {recall:.3}); reused {} (agreeing with the model's verdict of the normalised text {agreement:.3}, of the raw text {agreement_raw:.3}; the model's verdicts of them {own_kinds:?}); wave records {} ({started} started)",
        posts.len(),
        reused.len(),
        waves.len()
    );
    assert!(precision >= 0.99, "precision {precision}");
    assert!(recall >= 0.75, "recall {recall}");
    assert!(
        reused.len() * 2 >= marked_spam,
        "most posts of a wave reuse: {}",
        reused.len()
    );
    assert!(agreement >= 0.99, "agreement {agreement}");
    assert!(
        fooled,
        "where the raw text's verdict differs, an evasion fooled the model: the reused verdict is the stricter"
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
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let target = "buy cheap watches at example dot com today";
    let (add_at, remove_at, end) = (
        Duration::from_secs(2),
        Duration::from_secs(7),
        Duration::from_secs(11),
    );
    let b = bootstrap.clone();
    let load = std::thread::spawn(move || {
        let started = Instant::now();
        let mut sent = Vec::new();
        let mut i = 0;
        let (mut added, mut removed) = (None, None);
        while started.elapsed() < end && i < 2000 {
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
        "list topic: item added at {add_at:?}, first match at {first_match:?}; removed at {remove_at:?}, last match at {last_match:?}"
    );
    assert_eq!(matched_partitions.len(), 2, "matched on every partition");
}

/// A list topic record: key "w1", the item (None: a tombstone).
fn list_record(bootstrap: &str, item: Option<&str>) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let mut record = BaseRecord::<str, str>::to(LISTS).key("w1");
    if let Some(item) = item {
        record = record.payload(item);
    }
    producer.send(record).map_err(|(e, _)| e).unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
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
    let in_waves = verdicts
        .iter()
        .filter(|r| r.json().unwrap()["reason"].get("wave").is_some())
        .count();
    eprintln!(
        "mid-wave: {} verdicts, {in_waves} in a wave, {} duplicates",
        verdicts.len(),
        verification.duplicates
    );
    assert!(in_waves > 0, "waves found across the moves");
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
