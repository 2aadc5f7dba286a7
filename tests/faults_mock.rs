//! Broker faults injected through librdkafka's mock cluster while the real
//! pipeline runs. Each scenario fails if an event is lost or if the committed
//! offsets end anywhere but at the end of the input; each prints lost /
//! duplicates.

mod support;

use std::time::Duration;

use rdkafka::mocking::MockCoordinator;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

use modstream::shutdown::Shutdown;
use modstream::tools::embedded::EmbeddedBroker;
use support::mock_faults::*;
use support::{DLQ, INPUT, VERDICTS};

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
    let summary = finish(run, "offset commit errors").await;
    println!("offset commit errors: {:?}", summary.faults);
    assert!(
        summary.faults.commit_failures > 0,
        "the injected commit errors were met: {:?}",
        summary.faults
    );
}

/// How long every produce request fails: longer than message.timeout.ms
/// (3 s), so that librdkafka gives up on records and modstream's re-send
/// path runs, not only librdkafka's own retries.
const PRODUCE_ERRORS_FOR: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_errors_on_verdicts_are_retried_not_skipped() {
    let run = start_with(1, 3000, "produce-errors", |settings, _| {
        settings
            .kafka
            .producer
            .0
            .insert("message.timeout.ms".into(), "3000".into());
    })
    .await;
    let bootstrap = run.broker.bootstrap_servers().to_string();
    let flowing = tokio::task::spawn_blocking(move || {
        support::wait_for_progress(&bootstrap, 1, Duration::from_secs(30))
    });
    assert!(flowing.await.unwrap(), "verdicts flow before the fault");
    // Each produce request takes one injected error: topped up faster than
    // librdkafka's retries (100 ms to 1 s apart) take them, then cleared.
    let errors_until = std::time::Instant::now() + PRODUCE_ERRORS_FOR;
    let mut kinds = [
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR__TRANSPORT,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
    ]
    .into_iter()
    .cycle();
    while std::time::Instant::now() < errors_until {
        let round: Vec<_> = kinds.by_ref().take(8).collect();
        run.broker.with_cluster(move |c| {
            c.clear_request_errors(RDKafkaApiKey::Produce);
            c.request_errors(RDKafkaApiKey::Produce, &round)
        });
        after(200).await;
    }
    run.broker
        .with_cluster(|c| c.clear_request_errors(RDKafkaApiKey::Produce));
    let summary = finish(run, "produce errors").await;
    println!("produce errors: {:?}", summary.faults);
    assert!(
        summary.faults.delivery_failures > 0 && summary.faults.resends > 0,
        "the produce errors outlasted librdkafka's retries and modstream sent the verdicts again: {:?}",
        summary.faults
    );
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

/// Both brokers go down for 10 s once verdicts flow, with verdicts in
/// flight: librdkafka gives up on them after 5 s (message.timeout.ms),
/// modstream sends them again once the brokers are back. The verdicts'
/// broker goes first, half a second before the input's, so that verdicts
/// are in flight when both are down (together, they found at times a
/// service that had delivered everything it had fetched, and no failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_brokers_down_for_ten_seconds_then_up() {
    let run = start_with(2, 6000, "broker-down", |settings, broker| {
        settings
            .kafka
            .producer
            .0
            .insert("message.timeout.ms".into(), "5000".into());
        broker.with_cluster(|c| {
            for p in 0..PARTITIONS {
                c.partition_leader(VERDICTS, p, Some(2)).unwrap();
                c.partition_leader(INPUT, p, Some(1)).unwrap();
            }
            c.coordinator(MockCoordinator::Group("broker-down".into()), 1)
                .unwrap();
        });
    })
    .await;
    let bootstrap = run.broker.bootstrap_servers().to_string();
    let before = tokio::task::spawn_blocking(move || {
        let flowing = support::wait_for_progress(&bootstrap, 1, Duration::from_secs(30));
        (flowing, support::verdict_count(&bootstrap))
    });
    let (flowing, verdicts_before) = before.await.unwrap();
    run.broker.with_cluster(|c| c.broker_down(2)).unwrap();
    after(500).await;
    run.broker.with_cluster(|c| c.broker_down(1)).unwrap();
    assert!(flowing, "verdicts flow before the broker goes down");
    assert!(
        verdicts_before < run.acked.len() as i64,
        "events left when the broker went down: {verdicts_before} verdicts of {}",
        run.acked.len()
    );
    after(10_000).await;
    run.broker
        .with_cluster(|c| c.broker_up(1).and_then(|()| c.broker_up(2)))
        .unwrap();
    let summary = finish(run, "all brokers down 10 s").await;
    println!(
        "all brokers down: {verdicts_before} verdicts before; {:?}",
        summary.faults
    );
    assert!(
        summary.faults.delivery_failures > 0 && summary.faults.resends > 0,
        "verdicts in flight when the broker went down failed and were sent again: {:?}",
        summary.faults
    );
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

/// Batches of 300 with a 20 s deadline: of each partition's 1,000 events,
/// 900 go out in full batches and 100 wait in an open batch. Once the 3,600
/// are read back, a second member joins: the first member's revoke finds
/// those events in flight, closes their batches at once and delivers them
/// before handing over (long before their deadline); nothing is lost and
/// the offsets reach the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joining_mid_stream_drains_before_handing_over() {
    let run = start_with(1, 4000, "rebalance", |settings, _| {
        settings.batching.max_batch_size = 300;
        settings.batching.max_batch_delay = Duration::from_secs(20);
    })
    .await;
    let bootstrap = run.broker.bootstrap_servers().to_string();
    let b = bootstrap.clone();
    tokio::task::spawn_blocking(move || {
        let reader =
            modstream::tools::read::TopicReader::from_beginning(&b, VERDICTS, None).unwrap();
        let read = reader.read(3600, Duration::from_secs(60), |_| {}).unwrap();
        assert_eq!(read.len(), 3600, "the full batches went out");
    })
    .await
    .unwrap();
    let joined = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &bootstrap, &run.group);
    let settings = modstream::config::Settings::load(Some(&config)).unwrap();
    let second_shutdown = Shutdown::new();
    let second = tokio::spawn(modstream::pipeline::run(settings, second_shutdown.clone()));
    let acked = run.acked.clone();
    let b = bootstrap.clone();
    let v =
        tokio::task::spawn_blocking(move || support::verify(&b, &acked, Duration::from_secs(90)))
            .await
            .unwrap();
    assert!(v.lost.is_empty(), "rebalance: lost {}", v.lost.len());
    assert!(
        joined.elapsed() < Duration::from_secs(18),
        "the open batches were delivered at the revoke, not at their 20 s deadline ({:?})",
        joined.elapsed()
    );
    second_shutdown.stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let summary = finish(run, "rebalance with batches in flight").await;
    assert!(summary.revokes >= 1, "{summary:?}");
    assert!(
        summary.revoked_in_flight > 0,
        "the revoke found events in flight: {summary:?}"
    );
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
    // It cannot deliver either: what it holds it gives up after its
    // shutdown timeout (uncommitted, for the first member).
    let gave_up = stops_within(second, Duration::from_secs(30), "the second member").await;
    println!("the second member gave up {gave_up} deliveries");
    after(2000).await;
    run.broker.with_cluster(|c| c.broker_up(3)).unwrap();
    finish(run, "cooperative rebalances while paused").await;
}
