//! A chaos run on librdkafka's mock cluster: a seeded random schedule of
//! faults (produce and commit errors, a broker down, leader moves, slow
//! brokers, a second member joining and leaving) under continuous paced
//! load, bounded to about 90 s. At the end: lost = 0, the committed offsets
//! reach the end of every partition, every member stopped when asked, and
//! no partition of either member was ever stalled (the most stalled at
//! once, as each run's health counted it). `MODSTREAM_CHAOS_SEED=N` replays a schedule; the seed is
//! printed (and shown on failure).

mod support;

use std::time::{Duration, Instant};

use rdkafka::mocking::MockCoordinator;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

use modstream::shutdown::Shutdown;
use modstream::telemetry::Health;
use modstream::tools::embedded::EmbeddedBroker;
use support::mock_faults::stops_within;
use support::{DLQ, INPUT, VERDICTS};

const PARTITIONS: i32 = 4;
const GROUP: &str = "chaos";

/// xorshift64*: a small deterministic generator for the schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn settings(bootstrap: &str, dir: &std::path::Path) -> modstream::config::Settings {
    let config = support::write_config(dir, bootstrap, GROUP);
    let mut settings = modstream::config::Settings::load(Some(&config)).unwrap();
    settings.limits.stall_after = Duration::from_secs(20);
    settings
        .kafka
        .producer
        .0
        .insert("message.timeout.ms".into(), "5000".into());
    settings
}

/// The high watermark of every input partition.
fn input_end(bootstrap: &str) -> Vec<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    (0..PARTITIONS)
        .map(|p| {
            consumer
                .fetch_watermarks(INPUT, p, Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_schedule_of_faults_loses_nothing_and_leaves_nothing_stuck() {
    support::init_logs();
    let seed: u64 = std::env::var("MODSTREAM_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
        | 1;
    println!("chaos seed {seed} (replay: MODSTREAM_CHAOS_SEED={seed})");
    let mut rng = Rng(seed);

    let broker = EmbeddedBroker::start_with_brokers(
        3,
        &[(INPUT, PARTITIONS), (VERDICTS, PARTITIONS), (DLQ, 1)],
    )
    .unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    broker.with_cluster(|c| {
        c.coordinator(MockCoordinator::Group(GROUP.into()), 1)
            .unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let health = std::sync::Arc::new(Health::default());
    let first_shutdown = Shutdown::new();
    let first = tokio::spawn(modstream::pipeline::run_with_health(
        settings(&bootstrap, dir.path()),
        first_shutdown.clone(),
        health.clone(),
    ));
    // Continuous paced load: 6,000 events over 40 s, acknowledged chunk by chunk.
    let load = support::produce_paced(
        bootstrap.clone(),
        support::events("chaos-", 0..6000),
        Duration::from_secs(40),
    );

    let mut second: Option<(Shutdown, tokio::task::JoinHandle<_>)> = None;
    let mut second_health = Vec::new();
    let faults_until = Instant::now() + Duration::from_secs(40);
    let mut schedule = Vec::new();
    while Instant::now() < faults_until {
        tokio::time::sleep(Duration::from_millis(1500 + rng.below(2500))).await;
        let fault = rng.below(6);
        let broker_id = 2 + rng.below(2) as i32; // never the coordinator
        let partition = rng.below(PARTITIONS as u64) as i32;
        let topic = if rng.below(2) == 0 { INPUT } else { VERDICTS };
        schedule.push(match fault {
            0 => {
                let n = 1 + rng.below(20) as usize;
                broker.with_cluster(move |c| {
                    c.request_errors(
                        RDKafkaApiKey::Produce,
                        &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; n],
                    )
                });
                format!("{n} produce errors")
            }
            1 => {
                let n = 1 + rng.below(10) as usize;
                broker.with_cluster(move |c| {
                    c.request_errors(
                        RDKafkaApiKey::OffsetCommit,
                        &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; n],
                    )
                });
                format!("{n} commit errors")
            }
            2 => {
                let down_ms = 500 + rng.below(2500);
                broker
                    .with_cluster(move |c| c.broker_down(broker_id))
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(down_ms)).await;
                broker
                    .with_cluster(move |c| c.broker_up(broker_id))
                    .unwrap();
                format!("broker {broker_id} down {down_ms} ms")
            }
            3 => {
                let leader = 1 + rng.below(3) as i32;
                broker
                    .with_cluster(move |c| c.partition_leader(topic, partition, Some(leader)))
                    .unwrap();
                format!("{topic}/{partition} leader → {leader}")
            }
            4 => {
                let rtt_ms = 200 + rng.below(800);
                broker
                    .with_cluster(move |c| {
                        c.broker_round_trip_time(broker_id, Duration::from_millis(rtt_ms))
                    })
                    .unwrap();
                format!("broker {broker_id} round trip {rtt_ms} ms")
            }
            _ => match second.take() {
                None => {
                    let shutdown = Shutdown::new();
                    let member_health = std::sync::Arc::new(Health::default());
                    let run = tokio::spawn(modstream::pipeline::run_with_health(
                        settings(&bootstrap, dir.path()),
                        shutdown.clone(),
                        member_health.clone(),
                    ));
                    second_health.push(member_health);
                    second = Some((shutdown, run));
                    "a second member joins".to_string()
                }
                Some((shutdown, run)) => {
                    shutdown.stop.cancel();
                    // It may give up deliveries stuck in a fault: they stay
                    // uncommitted for the remaining member.
                    let gave_up =
                        stops_within(run, Duration::from_secs(45), "the second member").await;
                    format!("the second member leaves ({gave_up} deliveries given up)")
                }
            },
        });
    }
    // Heal: every broker up and fast, the second member gone.
    broker.with_cluster(|c| {
        for b in 1..=3 {
            let _ = c.broker_up(b);
            let _ = c.broker_round_trip_time(b, Duration::ZERO);
        }
        c.clear_request_errors(RDKafkaApiKey::Produce);
        c.clear_request_errors(RDKafkaApiKey::OffsetCommit);
    });
    if let Some((shutdown, run)) = second.take() {
        shutdown.stop.cancel();
        let gave_up = stops_within(run, Duration::from_secs(45), "the second member").await;
        schedule.push(format!(
            "the second member leaves ({gave_up} deliveries given up)"
        ));
    }
    println!("chaos schedule (seed {seed}): {schedule:?}");
    let acked = tokio::task::spawn_blocking(move || load.join().unwrap())
        .await
        .unwrap();

    let b = bootstrap.clone();
    let acked_for_verify = acked.clone();
    let v = tokio::task::spawn_blocking(move || {
        support::verify(&b, &acked_for_verify, Duration::from_secs(60))
    })
    .await
    .unwrap();
    v.report("chaos: a seeded schedule of faults under paced load (tests/chaos_mock.rs)");
    let b = bootstrap.clone();
    let (lost, sources) = (v.lost.clone(), v.sources.clone());
    tokio::task::spawn_blocking(move || support::trace_lost(&b, &lost, &sources, GROUP))
        .await
        .unwrap();
    assert!(
        v.lost.is_empty(),
        "seed {seed}: lost {} events; schedule {schedule:?}",
        v.lost.len()
    );
    // The input producer retries too, so the input may hold a few records
    // twice: the end is each partition's high watermark.
    let b = bootstrap.clone();
    let (committed, end) = tokio::task::spawn_blocking(move || {
        let end = input_end(&b);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = support::committed(&b, GROUP, PARTITIONS);
            if c == end || Instant::now() > deadline {
                return (c, end);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    })
    .await
    .unwrap();
    first_shutdown.stop.cancel();
    let summary = tokio::time::timeout(Duration::from_secs(60), first)
        .await
        .expect("the member stops")
        .unwrap()
        .unwrap();
    println!("chaos: the first member met {:?}", summary.faults);
    assert_eq!(
        committed, end,
        "seed {seed}: committed offsets reach the end of every partition; schedule {schedule:?}"
    );
    let most_stalled: Vec<u64> = std::iter::once(&health)
        .chain(&second_health)
        .map(|h| h.faults.counts().most_stalled)
        .collect();
    assert!(
        most_stalled.iter().all(|&n| n == 0),
        "seed {seed}: partitions stalled at once, first member then each second one: {most_stalled:?}; schedule {schedule:?}"
    );
}
