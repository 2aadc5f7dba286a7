//! Broker faults injected through librdkafka's mock cluster while the real
//! pipeline runs. Each scenario fails if an event is lost or if the committed
//! offsets end anywhere but at the end of the input; each prints lost /
//! duplicates.

mod support;

use std::time::Duration;

use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

use modstream::shutdown::Shutdown;
use modstream::tools::embedded::EmbeddedBroker;
use modstream::tools::read::{ReadRecord, read_topic};
use support::{DLQ, INPUT, VERDICTS};

const PARTITIONS: i32 = 4;

struct Run {
    broker: EmbeddedBroker,
    shutdown: Shutdown,
    pipeline: tokio::task::JoinHandle<
        Result<modstream::pipeline::RunSummary, modstream::pipeline::PipelineError>,
    >,
    acked: Vec<String>,
    group: String,
    _dir: tempfile::TempDir,
}

/// A cluster of `brokers`, `events` produced, and the pipeline started.
async fn start(brokers: u32, events: usize, group: &str) -> Run {
    start_with(brokers, events, group, |_, _| {}).await
}

/// [`start`], with a hook to change the settings or the cluster first.
async fn start_with(
    brokers: u32,
    events: usize,
    group: &str,
    prepare: impl FnOnce(&mut modstream::config::Settings, &EmbeddedBroker),
) -> Run {
    support::init_logs();
    let broker = EmbeddedBroker::start_with_brokers(
        brokers,
        &[(INPUT, PARTITIONS), (VERDICTS, PARTITIONS), (DLQ, 1)],
    )
    .unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let evs = support::events(&format!("{group}-"), 0..events);
    let acked = tokio::task::spawn_blocking(move || support::produce(&bootstrap, &evs))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), broker.bootstrap_servers(), group);
    let mut settings = modstream::config::Settings::load(Some(&config)).unwrap();
    prepare(&mut settings, &broker);
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    Run {
        broker,
        shutdown,
        pipeline,
        acked,
        group: group.to_string(),
        _dir: dir,
    }
}

/// Wait for every verdict and for the commits to reach the end of the input
/// (a commit that failed or was fenced by a rebalance must be made good
/// later), then stop cleanly. Asserts lost = 0.
async fn finish(run: Run, scenario: &str) {
    let bootstrap = run.broker.bootstrap_servers().to_string();
    let acked = run.acked.clone();
    let b = bootstrap.clone();
    let v =
        tokio::task::spawn_blocking(move || support::verify(&b, &acked, Duration::from_secs(90)))
            .await
            .unwrap();
    let (b, group, total) = (bootstrap.clone(), run.group.clone(), run.acked.len() as i64);
    let committed = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(45);
        loop {
            let c = support::committed(&b, &group, PARTITIONS);
            if c.iter().map(|o| (*o).max(0)).sum::<i64>() == total
                || std::time::Instant::now() > deadline
            {
                return c;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    })
    .await
    .unwrap();
    run.shutdown.stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), run.pipeline)
        .await
        .expect("pipeline stops after the fault")
        .unwrap()
        .unwrap();
    // Duplicates from reprocessing after a fenced commit show up late: count again.
    let (b, acked) = (bootstrap.clone(), run.acked.clone());
    let v = if v.lost.is_empty() {
        tokio::task::spawn_blocking(move || support::verify(&b, &acked, Duration::from_secs(30)))
            .await
            .unwrap()
    } else {
        v
    };
    v.report(scenario);
    assert!(
        v.lost.is_empty(),
        "{scenario}: lost {} events",
        v.lost.len()
    );
    let total: i64 = committed.iter().map(|c| (*c).max(0)).sum();
    assert_eq!(
        total as usize,
        run.acked.len(),
        "{scenario}: committed offsets {committed:?} reach the input's end"
    );
}

/// The group's committed offsets never pass an input event without a verdict.
async fn nothing_committed_past_a_missing_verdict(bootstrap: &str, group: &str) {
    let (bootstrap, group) = (bootstrap.to_string(), group.to_string());
    let (committed, sources) = tokio::task::spawn_blocking(move || {
        (
            support::committed(&bootstrap, &group, PARTITIONS),
            support::verdict_sources(&bootstrap),
        )
    })
    .await
    .unwrap();
    for (p, &c) in committed.iter().enumerate() {
        for offset in 0..c.max(0) {
            assert!(
                sources.contains(&(p as i32, offset)),
                "partition {p} committed to {c} but offset {offset} has no verdict"
            );
        }
    }
}

/// `texts` (event ids `{prefix}{i}`, one key) on one partition through the
/// failing test model (tests/data/failing-model: it parses each text as a
/// number); waits for `(verdicts, dead letters)` and stops the pipeline.
async fn run_failing_model(
    group: &str,
    prefix: &str,
    texts: &[&str],
    (verdicts_want, dlq_want): (usize, usize),
) -> (EmbeddedBroker, Vec<ReadRecord>, Vec<ReadRecord>) {
    let broker = EmbeddedBroker::start(&[(INPUT, 1), (VERDICTS, 1), (DLQ, 1)]).unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let events: Vec<(String, String, Vec<u8>)> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let id = format!("{prefix}{i}");
            let payload = serde_json::json!({"event_id": id, "text": t});
            (id, "k".to_string(), payload.to_string().into_bytes())
        })
        .collect();
    let b = bootstrap.clone();
    tokio::task::spawn_blocking(move || support::produce(&b, &events))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &bootstrap, group);
    let mut settings = modstream::config::Settings::load(Some(&config)).unwrap();
    settings.inference.model_dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/failing-model");
    settings.batching.max_batch_delay = Duration::from_millis(200);
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let b = bootstrap.clone();
    let (verdicts, dlq) = tokio::task::spawn_blocking(move || {
        (
            read_topic(&b, VERDICTS, 1, verdicts_want, Duration::from_secs(20)).unwrap(),
            read_topic(&b, DLQ, 1, dlq_want, Duration::from_secs(10)).unwrap(),
        )
    })
    .await
    .unwrap();
    shutdown.stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), pipeline)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    (broker, verdicts, dlq)
}

/// Verdict partitions led by broker 3, the input and the group's
/// coordinator by broker 1, and broker 3 down: every verdict delivery fails
/// until it is up again.
fn verdict_leader_down(broker: &EmbeddedBroker, group: &str) {
    let group = group.to_string();
    broker.with_cluster(move |c| {
        for p in 0..PARTITIONS {
            c.partition_leader(VERDICTS, p, Some(3)).unwrap();
            c.partition_leader(INPUT, p, Some(1)).unwrap();
        }
        c.coordinator(rdkafka::mocking::MockCoordinator::Group(group), 1)
            .unwrap();
        c.broker_down(3).unwrap();
    });
}

/// A new member of the stopped run's group picks up from what was
/// committed; then [`finish`].
async fn restart_and_finish(
    broker: EmbeddedBroker,
    acked: Vec<String>,
    group: String,
    scenario: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), broker.bootstrap_servers(), &group);
    let settings = modstream::config::Settings::load(Some(&config)).unwrap();
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    finish(
        Run {
            broker,
            shutdown,
            pipeline,
            acked,
            group,
            _dir: dir,
        },
        scenario,
    )
    .await;
}

async fn after(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_commit_errors_delay_commits_but_lose_nothing() {
    let run = start(1, 3000, "commit-errors").await;
    run.broker.with_cluster(|c| {
        c.request_errors(
            RDKafkaApiKey::OffsetCommit,
            &[
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__TRANSPORT,
            ],
        )
    });
    finish(run, "offset commit errors").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_errors_on_verdicts_are_retried_not_skipped() {
    // librdkafka gives up on a record after 3 s here; modstream sends it again.
    let run = start_with(1, 3000, "produce-errors", |settings, _| {
        settings
            .kafka
            .producer
            .0
            .insert("message.timeout.ms".into(), "3000".into());
    })
    .await;
    after(300).await;
    run.broker.with_cluster(|c| {
        c.request_errors(
            RDKafkaApiKey::Produce,
            &[
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__TRANSPORT,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            ],
        )
    });
    finish(run, "produce errors").await;
}

/// Verdicts that librdkafka gives up on (message.timeout.ms = 1 s, their
/// leader down for 2.5 s) are sent again in offset order: in every verdict
/// partition, the first copies of an input partition's verdicts keep
/// their source offsets increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_sent_verdicts_keep_offset_order() {
    let run = start_with(3, 3000, "resend-order", |settings, broker| {
        settings
            .kafka
            .producer
            .0
            .insert("message.timeout.ms".into(), "1000".into());
        // The verdicts' leader is away for longer than message.timeout.ms:
        // librdkafka gives up on what it holds and modstream sends it again.
        verdict_leader_down(broker, "resend-order");
    })
    .await;
    after(2500).await;
    run.broker.with_cluster(|c| c.broker_up(3)).unwrap();
    let bootstrap = run.broker.bootstrap_servers().to_string();
    let acked = run.acked.clone();
    let b = bootstrap.clone();
    let v =
        tokio::task::spawn_blocking(move || support::verify(&b, &acked, Duration::from_secs(90)))
            .await
            .unwrap();
    assert!(v.lost.is_empty(), "lost {}", v.lost.len());
    let b = bootstrap.clone();
    let verdicts = tokio::task::spawn_blocking(move || {
        modstream::tools::read::TopicReader::from_beginning(&b, VERDICTS, None)
            .unwrap()
            .read_to_end(Duration::from_secs(60))
            .unwrap()
    })
    .await
    .unwrap();
    // (verdict partition, input partition) → source offsets in log order.
    let mut seen: std::collections::HashMap<(i32, i64), Vec<i64>> = Default::default();
    let mut first = std::collections::HashSet::new();
    for r in &verdicts {
        let v: serde_json::Value = serde_json::from_slice(&r.payload).unwrap();
        let (p, o) = (
            v["source"]["partition"].as_i64().unwrap(),
            v["source"]["offset"].as_i64().unwrap(),
        );
        if first.insert((p, o)) {
            seen.entry((r.partition, p)).or_default().push(o);
        }
    }
    for ((verdict_partition, input_partition), offsets) in &seen {
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "verdict partition {verdict_partition}, input partition {input_partition}: first copies out of offset order: {offsets:?}"
        );
    }
    println!(
        "re-sends: {} verdicts for {} events ({} duplicates)",
        verdicts.len(),
        first.len(),
        verdicts.len() - first.len()
    );
    finish(run, "produce errors with re-sends, order kept").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_brokers_down_for_ten_seconds_then_up() {
    let run = start(1, 3000, "broker-down").await;
    after(500).await;
    run.broker.with_cluster(|c| c.broker_down(1)).unwrap();
    after(10_000).await;
    run.broker.with_cluster(|c| c.broker_up(1)).unwrap();
    finish(run, "all brokers down 10 s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_leaders_move_during_load() {
    let run = start(3, 3000, "leader-moves").await;
    for (i, broker) in [2, 3, 1, 2].into_iter().enumerate() {
        after(400).await;
        run.broker.with_cluster(move |c| {
            for p in 0..PARTITIONS {
                c.partition_leader(INPUT, p, Some(broker)).unwrap();
                c.partition_leader(VERDICTS, p, Some((broker % 3) + 1))
                    .unwrap();
            }
        });
        let _ = i;
    }
    finish(run, "partition leaders moved").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joining_mid_stream_drains_before_handing_over() {
    let run = start(1, 4000, "rebalance").await;
    after(500).await;
    // A second member of the same group forces a rebalance with batches in flight.
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), run.broker.bootstrap_servers(), &run.group);
    let settings = modstream::config::Settings::load(Some(&config)).unwrap();
    let second_shutdown = Shutdown::new();
    let second = tokio::spawn(modstream::pipeline::run(settings, second_shutdown.clone()));
    let bootstrap = run.broker.bootstrap_servers().to_string();
    let acked = run.acked.clone();
    let v = tokio::task::spawn_blocking(move || {
        support::verify(&bootstrap, &acked, Duration::from_secs(90))
    })
    .await
    .unwrap();
    assert!(v.lost.is_empty(), "rebalance: lost {}", v.lost.len());
    second_shutdown.stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    finish(run, "rebalance with batches in flight").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_model_run_isolates_the_bad_events() {
    // The test model parses each text as a number and fails the whole run
    // on anything else.
    let texts = ["0.5", "2", "boom", "-1", "0", "kaboom", "3.5", "1"];
    let (broker, verdicts, dlq) = run_failing_model("failing-model", "m-", &texts, (6, 2)).await;
    let bootstrap = broker.bootstrap_servers().to_string();

    let scored: Vec<String> = verdicts
        .iter()
        .map(|v| {
            serde_json::from_slice::<serde_json::Value>(&v.payload).unwrap()["event_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        scored,
        ["m-0", "m-1", "m-3", "m-4", "m-6", "m-7"],
        "the good events get verdicts, in order"
    );
    let failed: Vec<(String, String)> = dlq
        .iter()
        .map(|d| {
            (
                String::from_utf8_lossy(&d.headers["modstream.source.offset"]).into_owned(),
                String::from_utf8_lossy(&d.headers["modstream.reason"]).into_owned(),
            )
        })
        .collect();
    assert_eq!(
        failed,
        [
            ("2".to_string(), "inference_failed".to_string()),
            ("5".to_string(), "inference_failed".to_string())
        ]
    );
    let committed =
        tokio::task::spawn_blocking(move || support::committed(&bootstrap, "failing-model", 1))
            .await
            .unwrap();
    assert_eq!(
        committed,
        vec![8],
        "every event accounted for, so the offset reaches the end"
    );
}

/// A score the model returns as NaN is an inference failure of that event
/// (DLQ `inference_failed`), never an `allow` with null scores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_finite_score_is_dead_lettered_not_judged() {
    // The failing test model parses each text as a number: "nan" scores NaN.
    let (_broker, verdicts, dlq) =
        run_failing_model("nan-model", "n-", &["0.5", "nan", "1"], (3, 1)).await;
    let judged: Vec<i64> = verdicts
        .iter()
        .map(|v| {
            serde_json::from_slice::<serde_json::Value>(&v.payload).unwrap()["source"]["offset"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(judged, vec![0, 2], "only the finite scores make verdicts");
    assert_eq!(dlq.len(), 1);
    let header = |name: &str| String::from_utf8_lossy(&dlq[0].headers[name]).into_owned();
    assert_eq!(header("modstream.source.offset"), "1");
    assert_eq!(header("modstream.reason"), "inference_failed");
    assert!(
        header("modstream.message").contains("non-finite"),
        "{}",
        header("modstream.message")
    );
}

/// A dead-letter record is the input record as it was: a null value stays
/// null, its headers and timestamp are kept, modstream's headers follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_records_keep_null_values_headers_and_timestamps() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let broker = EmbeddedBroker::start(&[(INPUT, 1), (VERDICTS, 1), (DLQ, 1)]).unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let headers = || {
        OwnedHeaders::new()
            .insert(Header {
                key: "trace-id",
                value: Some("t-1"),
            })
            .insert(Header {
                key: "empty",
                value: None::<&str>,
            })
    };
    producer
        .send(
            BaseRecord::<str, [u8]>::to(INPUT)
                .key("tombstone")
                .timestamp(1_600_000_000_000)
                .headers(headers()),
        )
        .unwrap();
    producer
        .send(
            BaseRecord::to(INPUT)
                .key("bad")
                .payload("not json")
                .timestamp(1_600_000_000_001)
                .headers(headers()),
        )
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &bootstrap, "dlq-copy");
    let settings = modstream::config::Settings::load(Some(&config)).unwrap();
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let b = bootstrap.clone();
    let dlq = tokio::task::spawn_blocking(move || {
        modstream::tools::read::read_topic(&b, DLQ, 1, 2, Duration::from_secs(15)).unwrap()
    })
    .await
    .unwrap();
    shutdown.stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), pipeline)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(dlq.len(), 2);
    let (tombstone, bad) = (&dlq[0], &dlq[1]);
    assert!(tombstone.null_value, "a null value stays null");
    assert!(!bad.null_value);
    assert_eq!(bad.payload, b"not json");
    for (d, ts, reason) in [
        (tombstone, 1_600_000_000_000, "empty_payload"),
        (bad, 1_600_000_000_001, "invalid_json"),
    ] {
        assert_eq!(d.timestamp_ms, Some(ts), "the input's timestamp");
        assert_eq!(d.headers["trace-id"], b"t-1", "the input's headers");
        assert!(d.headers.contains_key("empty"));
        assert_eq!(d.headers["modstream.reason"], reason.as_bytes());
    }
}

/// Verdict partitions led by broker 3, which then goes down: deliveries time
/// out (message.timeout.ms = 1 s) again and again. They are retried, never
/// skipped; a shutdown meanwhile gives up after kafka.shutdown_timeout with an
/// error, commits nothing undelivered, and the restart loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_timeouts_are_retried_and_a_stop_meanwhile_loses_nothing() {
    let run = start_with(3, 2000, "timeouts", |settings, broker| {
        settings
            .kafka
            .producer
            .0
            .insert("message.timeout.ms".into(), "1000".into());
        settings.kafka.shutdown_timeout = Duration::from_secs(3);
        // Down from the start: a run that delivered everything within a
        // few hundred milliseconds left nothing to time out (flaky).
        verdict_leader_down(broker, "timeouts");
    })
    .await;
    after(3300).await;
    run.shutdown.stop.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(30), run.pipeline)
        .await
        .expect("the shutdown timeout bounds the drain")
        .unwrap();
    match stopped {
        Err(modstream::pipeline::PipelineError::Abandoned(n)) => {
            println!("stopped with {n} deliveries abandoned")
        }
        other => panic!("a stop with undeliverable verdicts must report them, got {other:?}"),
    }
    run.broker.with_cluster(|c| c.broker_up(3)).unwrap();
    restart_and_finish(
        run.broker,
        run.acked,
        run.group,
        "delivery timeouts, stop, restart",
    )
    .await;
}

/// kafka.shutdown_timeout is a bound: with verdicts stuck in librdkafka
/// (their leader down, message.timeout.ms at its 30 s default), a stop
/// returns within the timeout plus a second, with the abandoned count, and
/// the restart loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_stuck_deliveries_ends_within_the_shutdown_timeout() {
    let run = start_with(3, 1000, "bounded-stop", |settings, broker| {
        settings.kafka.shutdown_timeout = Duration::from_secs(2);
        verdict_leader_down(broker, "bounded-stop");
    })
    .await;
    after(3000).await;
    let stopping = std::time::Instant::now();
    run.shutdown.stop.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(30), run.pipeline)
        .await
        .expect("the shutdown timeout bounds the drain")
        .unwrap();
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_millis(3500),
        "stopped {took:?} after the signal, shutdown_timeout 2 s"
    );
    match stopped {
        Err(modstream::pipeline::PipelineError::Abandoned(n)) => {
            println!("stopped in {took:?} with {n} deliveries abandoned")
        }
        other => panic!("a stop with undeliverable verdicts must report them, got {other:?}"),
    }
    run.broker.with_cluster(|c| c.broker_up(3)).unwrap();
    restart_and_finish(
        run.broker,
        run.acked,
        run.group,
        "stop with stuck deliveries, restart",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_producer_error_stops_the_run_without_committing_past_it() {
    // With the gapless guarantee, librdkafka treats an out-of-order sequence
    // as fatal for the idempotent producer: it will deliver nothing more.
    let run = start_with(1, 3000, "fatal-producer", |settings, _| {
        settings
            .kafka
            .producer
            .0
            .insert("enable.gapless.guarantee".into(), "true".into());
    })
    .await;
    after(300).await;
    run.broker.with_cluster(|c| {
        c.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER; 3],
        )
    });
    let result = tokio::time::timeout(Duration::from_secs(60), run.pipeline)
        .await
        .expect("the run stops by itself after a fatal producer error")
        .unwrap();
    match result {
        Err(modstream::pipeline::PipelineError::Producer(e)) => {
            assert!(e.to_string().contains("fatal"), "{e}")
        }
        other => panic!("expected a fatal producer error, got {other:?}"),
    }
    nothing_committed_past_a_missing_verdict(run.broker.bootstrap_servers(), &run.group).await;
}

/// Deliveries refused for the whole service (the producer is not authorized
/// on the verdict topic) make /readyz fail with the reason, and after
/// kafka.service_failure_timeout the run stops with it, nothing committed
/// past an event without a verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_refused_for_the_whole_service_stop_the_run_with_the_reason() {
    support::init_logs();
    let broker =
        EmbeddedBroker::start(&[(INPUT, PARTITIONS), (VERDICTS, PARTITIONS), (DLQ, 1)]).unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let evs = support::events("unauthorized-", 0..500);
    let b = bootstrap.clone();
    tokio::task::spawn_blocking(move || support::produce(&b, &evs))
        .await
        .unwrap();
    broker.with_cluster(|c| {
        c.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 5000],
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &bootstrap, "unauthorized");
    let mut settings = modstream::config::Settings::load(Some(&config)).unwrap();
    settings.kafka.service_failure_timeout = Duration::from_secs(8);
    settings.kafka.shutdown_timeout = Duration::from_secs(2);
    let health = std::sync::Arc::new(modstream::telemetry::Health::default());
    let started = std::time::Instant::now();
    let pipeline = tokio::spawn(modstream::pipeline::run_with_health(
        settings,
        Shutdown::new(),
        health.clone(),
    ));
    let mut reported = None;
    while !pipeline.is_finished() && started.elapsed() < Duration::from_secs(60) {
        if let Some(why) = health.delivery_failing() {
            assert!(!health.ready(), "/readyz fails while it lasts");
            reported.get_or_insert(why);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let result = tokio::time::timeout(Duration::from_secs(10), pipeline)
        .await
        .expect("the run stops by itself")
        .unwrap();
    let took = started.elapsed();
    let why = reported.expect("/readyz said why");
    assert!(why.contains(VERDICTS) && why.contains("uthoriz"), "{why}");
    match result {
        Err(modstream::pipeline::PipelineError::Producer(e)) => {
            let text = e.to_string();
            assert!(
                text.contains("service_failure_timeout") && text.contains(VERDICTS),
                "{text}"
            );
        }
        other => panic!("expected the service failure, got {other:?}"),
    }
    assert!(took < Duration::from_secs(20), "stopped after {took:?}");
    nothing_committed_past_a_missing_verdict(&bootstrap, "unauthorized").await;
}

/// The pause state across cooperative (incremental) rebalances: deliveries
/// fail (the verdicts' leader is down), the in-flight bound is reached and
/// the partitions pause; a second member joins and leaves; then the leader
/// comes back. Every partition is fetched again and committed to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_rebalances_while_paused_leave_no_partition_unfetched() {
    let prepare = |settings: &mut modstream::config::Settings| {
        settings.limits.max_in_flight = 64;
        settings.kafka.consumer.0.insert(
            "partition.assignment.strategy".into(),
            "cooperative-sticky".into(),
        );
    };
    let run = start_with(3, 3000, "cooperative-paused", |settings, broker| {
        prepare(settings);
        verdict_leader_down(broker, "cooperative-paused");
    })
    .await;
    after(3000).await;
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), run.broker.bootstrap_servers(), &run.group);
    let mut settings = modstream::config::Settings::load(Some(&config)).unwrap();
    prepare(&mut settings);
    settings.kafka.shutdown_timeout = Duration::from_secs(2);
    let second_shutdown = Shutdown::new();
    let second = tokio::spawn(modstream::pipeline::run(settings, second_shutdown.clone()));
    after(6000).await;
    second_shutdown.stop.cancel();
    // It cannot deliver either: it gives up after its shutdown timeout.
    let _ = tokio::time::timeout(Duration::from_secs(30), second).await;
    after(2000).await;
    run.broker.with_cluster(|c| c.broker_up(3)).unwrap();
    finish(run, "cooperative rebalances while paused").await;
}
