//! The mock-cluster scenarios' harness: the real pipeline on an embedded
//! cluster (librdkafka's mock), a load, and the checks every scenario ends
//! with (lost, duplicates, committed offsets at the end).

use std::time::Duration;

use super::{DLQ, INPUT, VERDICTS};
use modstream::shutdown::Shutdown;
use modstream::tools::embedded::EmbeddedBroker;
use modstream::tools::read::{ReadRecord, read_topic};

pub const PARTITIONS: i32 = 4;

pub struct Run {
    pub broker: EmbeddedBroker,
    pub shutdown: Shutdown,
    pub pipeline: tokio::task::JoinHandle<
        Result<modstream::pipeline::RunSummary, modstream::pipeline::PipelineError>,
    >,
    pub acked: Vec<String>,
    pub group: String,
    pub _dir: tempfile::TempDir,
}

/// A cluster of `brokers`, `events` produced, and the pipeline started.
pub async fn start(brokers: u32, events: usize, group: &str) -> Run {
    start_with(brokers, events, group, |_, _| {}).await
}

/// [`start`], with a hook to change the settings or the cluster first.
pub async fn start_with(
    brokers: u32,
    events: usize,
    group: &str,
    prepare: impl FnOnce(&mut modstream::config::Settings, &EmbeddedBroker),
) -> Run {
    super::init_logs();
    let broker = EmbeddedBroker::start_with_brokers(
        brokers,
        &[(INPUT, PARTITIONS), (VERDICTS, PARTITIONS), (DLQ, 1)],
    )
    .unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let evs = super::events(&format!("{group}-"), 0..events);
    let acked = tokio::task::spawn_blocking(move || super::produce(&bootstrap, &evs))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = super::write_config(dir.path(), broker.bootstrap_servers(), group);
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
/// later), then stop cleanly. Asserts lost = 0; the pipeline's counts.
pub async fn finish(run: Run, scenario: &str) -> modstream::pipeline::RunSummary {
    let bootstrap = run.broker.bootstrap_servers().to_string();
    let acked = run.acked.clone();
    let b = bootstrap.clone();
    let v = tokio::task::spawn_blocking(move || super::verify(&b, &acked, Duration::from_secs(90)))
        .await
        .unwrap();
    let (b, group, total) = (bootstrap.clone(), run.group.clone(), run.acked.len() as i64);
    let committed = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(45);
        loop {
            let c = super::committed(&b, &group, PARTITIONS);
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
    let summary = tokio::time::timeout(Duration::from_secs(60), run.pipeline)
        .await
        .expect("pipeline stops after the fault")
        .unwrap()
        .unwrap();
    // Duplicates from reprocessing after a fenced commit show up late: count again.
    let (b, acked) = (bootstrap.clone(), run.acked.clone());
    let v = if v.lost.is_empty() {
        tokio::task::spawn_blocking(move || super::verify(&b, &acked, Duration::from_secs(30)))
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
    summary
}

/// The group's committed offsets never pass an input event without a verdict.
pub async fn nothing_committed_past_a_missing_verdict(bootstrap: &str, group: &str) {
    let (bootstrap, group) = (bootstrap.to_string(), group.to_string());
    let (committed, sources) = tokio::task::spawn_blocking(move || {
        (
            super::committed(&bootstrap, &group, PARTITIONS),
            super::verdict_sources(&bootstrap),
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
pub async fn run_failing_model(
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
    tokio::task::spawn_blocking(move || super::produce(&b, &events))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = super::write_config(dir.path(), &bootstrap, group);
    let mut settings = modstream::config::Settings::load(Some(&config)).unwrap();
    settings.inference.model_dir = super::repo_root().join("tests/data/failing-model");
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
pub fn verdict_leader_down(broker: &EmbeddedBroker, group: &str) {
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
pub async fn restart_and_finish(
    broker: EmbeddedBroker,
    acked: Vec<String>,
    group: String,
    scenario: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let config = super::write_config(dir.path(), broker.bootstrap_servers(), &group);
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

/// A member asked to stop ends within `within`: cleanly, or giving up the
/// deliveries it could not make (left uncommitted for the members that
/// remain). A hang or any other error fails the test. Returns how many it
/// gave up.
pub async fn stops_within(
    member: tokio::task::JoinHandle<
        Result<modstream::pipeline::RunSummary, modstream::pipeline::PipelineError>,
    >,
    within: Duration,
    who: &str,
) -> u64 {
    let ended = tokio::time::timeout(within, member)
        .await
        .unwrap_or_else(|_| panic!("{who} did not stop within {within:?}"))
        .unwrap_or_else(|e| panic!("{who} panicked: {e}"));
    match ended {
        Ok(_) => 0,
        Err(modstream::pipeline::PipelineError::Abandoned(n)) => n,
        Err(e) => panic!("{who} stopped with an error: {e}"),
    }
}

pub async fn after(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}
