//! The topics beside the input and the verdicts, on Apache Kafka 4.4 (one
//! KRaft node, no topic created on demand): an analytics topic missing at
//! start fails it naming the key, and deleted while running holds nothing
//! (moderation goes on; what is given up is counted and shown); the list
//! topic is in force before the first verdict, and a partition added to it
//! later is read.

mod support;

use std::time::{Duration, Instant};

use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

fn topics(broker: &Broker, input_partitions: i32) {
    broker.create_topic(INPUT, input_partitions);
    broker.create_topic(VERDICTS, input_partitions);
    broker.create_topic(DLQ, 1);
}

/// An analytics topic (here the samples topic, every verdict sampled): a
/// start fails at once naming it while it does not exist; deleted while
/// the service runs, moderation goes on: every event gets its verdict and
/// every offset is committed, the samples given up are counted, and
/// /readyz names the topic while staying ready.
#[test]
fn a_failing_samples_topic_never_holds_moderation() {
    let broker = Broker::start();
    topics(&broker, 2);
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-analytics");
    let port = support::free_port();
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        )
        .replace(
            "[output]\n",
            "[output]\nsamples_topic = \"samples\"\nanalytics_timeout = \"2s\"\n",
        )
        .replace(
            "\"linger.ms\" = 2",
            "\"linger.ms\" = 2\n\"allow.auto.create.topics\" = false",
        );
    std::fs::write(
        &config,
        format!("{text}\n[sampling]\nmin_rate = 1.0\nmax_rate = 1.0\nmax_per_second = 100000.0\n"),
    )
    .unwrap();
    let started = Instant::now();
    let out = std::process::Command::new(support::modstream_binary())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a missing samples topic fails the start"
    );
    assert!(
        stderr.contains("output.samples_topic") && stderr.contains("samples"),
        "names the key and the topic: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "at once: {:?}",
        started.elapsed()
    );

    broker.create_topic("samples", 1);
    let mut service = Modstream::start(&config, "analytics", dir.path());
    let first = support::produce(&broker.bootstrap(), &support::events("a-", 0..300));
    assert!(support::wait_for_progress(
        &broker.bootstrap(),
        300,
        Duration::from_secs(90)
    ));
    broker.delete_topic("samples");
    let deleted = Instant::now();
    let rest = support::produce(&broker.bootstrap(), &support::events("b-", 0..1500));
    let (mut failing, mut ready_meanwhile) = (None, true);
    while !support::wait_for_committed_end(
        &broker.bootstrap(),
        "g-analytics",
        2,
        Duration::from_secs(1),
    ) && deleted.elapsed() < Duration::from_secs(120)
    {
        let (status, body) = support::http_get(port, "/readyz");
        if body.contains("\"analytics_failing\":\"samples") {
            failing.get_or_insert(body);
            ready_meanwhile &= status == 200;
        }
    }
    let took = deleted.elapsed();
    assert!(
        support::wait_for_committed_end(
            &broker.bootstrap(),
            "g-analytics",
            2,
            Duration::from_secs(5)
        ),
        "every offset committed with the samples topic gone"
    );
    let mut acked = first;
    acked.extend(rest);
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(60));
    v.report("samples topic deleted while running");
    assert!(v.lost.is_empty(), "lost {}", v.lost.len());
    // The topic is still gone: /readyz keeps naming it, and stays ready.
    let named = Instant::now();
    while failing.is_none() && named.elapsed() < Duration::from_secs(10) {
        let (status, body) = support::http_get(port, "/readyz");
        if body.contains("\"analytics_failing\":\"samples") {
            failing = Some(body);
            ready_meanwhile &= status == 200;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, metrics) = support::http_get(port, "/metrics");
    let given_up: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("modstream_analytics_given_up_total{kind=\"sample\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    println!(
        "1,500 events after the samples topic was deleted: committed to the end after {took:?}; {given_up} samples given up; /readyz said {failing:?}"
    );
    assert!(given_up > 0.0, "the samples given up are counted");
    assert!(
        failing.is_some() && ready_meanwhile,
        "/readyz names the topic and stays ready"
    );
    assert!(service.terminate(Duration::from_secs(30)));
}

/// The list topic grows a partition while the service runs: an item
/// written to the new partition matches within the reader's metadata
/// interval (10 s) and a few seconds more; the item written before the
/// start matched the first post.
#[test]
fn a_partition_added_to_the_list_topic_is_read() {
    let broker = Broker::start();
    topics(&broker, 1);
    broker.create_topic("lists", 1);
    let item = |text: &str| format!(r#"{{"verdict": "block", "label": "spam", "text": "{text}"}}"#);
    support::produce_to(
        &broker.bootstrap(),
        "lists",
        &[(
            "w0".into(),
            "w0".into(),
            item("buy cheap watches at example dot com").into_bytes(),
        )],
    );
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-lists");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{text}\n[matching]\nlist_topic = \"lists\"\n"),
    )
    .unwrap();
    let post = |id: &str, text: &str| {
        let payload = serde_json::json!({"event_id": id, "text": text}).to_string();
        (id.to_string(), id.to_string(), payload.into_bytes())
    };
    support::produce(
        &broker.bootstrap(),
        &[post("p-0", "Buy cheap WATCHES at example dot com!")],
    );
    let mut service = Modstream::start(&config, "lists", dir.path());
    let verdict_of = |id: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found = modstream::tools::read::TopicReader::from_beginning(
                &broker.bootstrap(),
                VERDICTS,
                None,
            )
            .unwrap()
            .read_to_end(Duration::from_secs(30))
            .unwrap()
            .iter()
            .filter_map(|r| r.json())
            .find(|v| v["event_id"] == id);
            if let Some(v) = found {
                return v;
            }
            assert!(Instant::now() < deadline, "no verdict for {id}");
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    assert_eq!(
        verdict_of("p-0")["reason"]["match"]["id"],
        "w0",
        "in force for the first post"
    );
    broker.add_partitions("lists", 2);
    let added = Instant::now();
    support::produce_to_partition(
        &broker.bootstrap(),
        "lists",
        1,
        "w1",
        &item("join my crypto signals group for daily profits"),
    );
    // Posts of the new item's text until one matches (bounded).
    let mut matched_after = None;
    for n in 1..=60 {
        let id = format!("p-{n}");
        support::produce(
            &broker.bootstrap(),
            &[post(&id, "Join my crypto signals group for daily profits!")],
        );
        if verdict_of(&id)["reason"]["match"]["id"] == "w1" {
            matched_after = Some(added.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("an item on a partition added to the list topic matched after {matched_after:?}");
    let after = matched_after.expect("the new partition's item matched");
    assert!(
        after < Duration::from_secs(25),
        "within the metadata interval and a little: {after:?}"
    );
    assert!(service.terminate(Duration::from_secs(30)));
}

/// An input topic that does not exist: with `input.require_topics` the
/// start fails naming it; without, the service starts and /readyz is 503
/// naming it (`modstream_input_topics_missing` 1) until it is created,
/// after which its events are judged and the service is ready.
#[test]
fn a_missing_input_topic_is_a_readiness_reason_until_it_exists() {
    let broker = Broker::start();
    broker.create_topic(VERDICTS, 2);
    broker.create_topic(DLQ, 1);
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-input");
    let port = support::free_port();
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    std::fs::write(
        &config,
        text.replace("[input]\n", "[input]\nrequire_topics = true\n"),
    )
    .unwrap();
    let out = std::process::Command::new(support::modstream_binary())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "require_topics fails the start");
    assert!(
        stderr.contains("input.topics") && stderr.contains(INPUT),
        "names the key and the topic: {stderr}"
    );

    std::fs::write(&config, &text).unwrap();
    let mut service = Modstream::start(&config, "input", dir.path());
    let missing = format!("\"input_missing\":[\"{INPUT}\"]");
    let started = Instant::now();
    let said = loop {
        let (status, body) = support::http_get(port, "/readyz");
        if body.contains(&missing) {
            break (status, body);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "/readyz: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        said.0, 503,
        "not ready while its input is missing: {}",
        said.1
    );
    let (_, metrics) = support::http_get(port, "/metrics");
    assert!(
        metrics.contains("modstream_input_topics_missing 1"),
        "{metrics}"
    );

    broker.create_topic(INPUT, 2);
    let created = Instant::now();
    let acked = support::produce(&broker.bootstrap(), &support::events("i-", 0..200));
    assert!(
        support::wait_for_progress(&broker.bootstrap(), 200, Duration::from_secs(120)),
        "the events of the topic created later are judged"
    );
    let judged = created.elapsed();
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(30));
    assert!(v.lost.is_empty(), "lost {}", v.lost.len());
    let ready = loop {
        let (status, body) = support::http_get(port, "/readyz");
        if status == 200 {
            break body;
        }
        assert!(
            created.elapsed() < Duration::from_secs(60),
            "/readyz: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "input topic created: its events judged after {judged:?}; /readyz ready after {:?}",
        created.elapsed()
    );
    assert!(ready.contains("\"input_missing\":[]"), "{ready}");
    assert!(service.terminate(Duration::from_secs(30)));
}
