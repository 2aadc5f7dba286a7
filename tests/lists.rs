//! Known-bad lists through the whole pipeline on the mock cluster: a list
//! topic's items in force before the first verdict, an item added and
//! removed under paced load matching on every partition within seconds
//! and no more once removed, a list topic that cannot be read, a list file
//! read again while running (a wrong one refused).

mod support;

use std::time::{Duration, Instant};

use modstream::shutdown::Shutdown;
use modstream::tools::embedded::EmbeddedBroker;
use support::matching::*;
use support::{DLQ, INPUT, VERDICTS};

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
