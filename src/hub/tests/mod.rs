use super::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::consumer::rebalance::{Control, Positions};
use crate::producer::record::{OutRecord, RecordKind};
use crate::producer::reports::{Report, Token};
use crate::telemetry::Health;
use crate::tp::{Generation, Source, Tp};

use crate::hub::partition::tests::tp;
use crate::inference::manifest::Manifest;
use crate::inference::{InferenceJob, ScoreError, TokenStats};
use crate::policy::ModelId;
use crate::tp::Position;
use crate::verdict::Scorer;
use outbox::{Fate, Outbox};

struct Harness {
    hub: Hub<Outbox>,
    outbox: Outbox,
    jobs: async_channel::Receiver<InferenceJob>,
    /// The offsets the hub handed over, resolving to their acknowledgements.
    acks: futures::stream::FuturesUnordered<futures::future::BoxFuture<'static, Ack>>,
    /// The fast way's reports, taken from the hub at the first `acks`.
    reports: Option<mpsc::UnboundedReceiver<Report>>,
    positions: async_channel::Receiver<Positions>,
    /// What the hub reports to /readyz.
    health: Arc<Health>,
}

fn harness() -> Harness {
    harness_with("")
}

/// `kafka` lines added to the harness's settings.
fn harness_with(kafka: &str) -> Harness {
    harness_adjusted(kafka, |_| {})
}

/// `kafka` lines added to the harness's settings, then `adjust` applied
/// (before the hub is made: its parts take their settings then).
fn harness_adjusted(kafka: &str, adjust: impl FnOnce(&mut Settings)) -> Harness {
    let mut settings = test_settings(kafka);
    adjust(&mut settings);
    harness_of_settings(settings)
}

/// The `kafka` line of a delivery mode.
fn delivery_mode(exactly_once: bool) -> &'static str {
    if exactly_once {
        r#"delivery = "exactly_once""#
    } else {
        ""
    }
}

/// The harness's settings, with these `kafka` lines.
fn test_settings(kafka: &str) -> Settings {
    Settings::from_toml(&format!(
        r#"
        [kafka]
        {kafka}
        bootstrap_servers = "127.0.0.1:1"
        drain_timeout = "1s"
        [input]
        topics = ["posts"]
        [batching]
        max_batch_size = 2
        max_batch_delay = "20ms"
        [inference]
        workers = 1
        "#
    ))
    .unwrap()
}

/// The harness's one model under these settings, judged by `[policy]`.
fn harness_of_settings(settings: Settings) -> Harness {
    harness_of_model(settings, None)
}

/// The same, its model a token model when it has a `max_length`.
fn harness_of_model(settings: Settings, max_length: Option<usize>) -> Harness {
    harness_of_model_on(settings, max_length, Outbox::default())
}

/// The same, delivering to this stand-in.
fn harness_of_model_on(settings: Settings, max_length: Option<usize>, outbox: Outbox) -> Harness {
    let manifest: Manifest = serde_json::from_value(serde_json::json!({
        "name": "m", "version": "1", "input_kind": "text", "inputs": ["text"],
        "output": "p", "labels": ["offensive"], "score_label": "offensive",
    }))
    .unwrap();
    let (jobs_tx, jobs) = async_channel::bounded(2);
    let lane = ModelLane {
        scorer: Scorer::named("default", &manifest),
        jobs: jobs_tx,
        workers: 1,
        max_batch: settings.batching.max_batch_size,
        max_length,
    };
    let labels = [crate::policy::ModelLabels::of("default", &manifest)];
    let rules = Ruleset::from_config(&settings.policy, &labels).unwrap();
    harness_on(settings, vec![lane], rules, jobs, outbox)
}

/// A hub over these models and rules; `jobs` is the first model's queue.
fn harness_of(
    settings: Settings,
    lanes: Vec<ModelLane>,
    rules: Ruleset,
    jobs: async_channel::Receiver<InferenceJob>,
) -> Harness {
    harness_on(settings, lanes, rules, jobs, Outbox::default())
}

/// The same, delivering to this stand-in.
fn harness_on(
    settings: Settings,
    lanes: Vec<ModelLane>,
    rules: Ruleset,
    jobs: async_channel::Receiver<InferenceJob>,
    outbox: Outbox,
) -> Harness {
    let (positions_tx, positions) = async_channel::bounded(64);
    let health = Arc::new(Health::default());
    let hub = Hub::new(
        settings,
        lanes,
        rules,
        outbox.clone(),
        positions_tx,
        health.clone(),
        &Shutdown::new(),
    );
    let acks = Default::default();
    Harness {
        hub,
        outbox,
        jobs,
        acks,
        reports: None,
        positions,
        health,
    }
}

/// The position `next` of partition `p` of the test topic.
fn at(p: i32, next: i64) -> Position {
    Position { tp: tp(p), next }
}

fn record(partition: i32, offset: i64, generation: u64) -> Ingested {
    Ingested {
        tp: tp(partition),
        offset,
        key: None,
        payload: Some(format!(r#"{{"event_id":"e{offset}","text":"post {offset}"}}"#).into_bytes()),
        headers: Vec::new(),
        timestamp_ms: None,
        generation: Generation(generation),
        received_at: Instant::now(),
        bytes: None,
    }
}

fn scored(job: &InferenceJob) -> InferenceResult {
    InferenceResult {
        id: job.id,
        scores: job.texts.iter().map(|_| Ok(vec![0.1])).collect(),
        texts: job.texts.clone(),
        elapsed: Duration::from_millis(3),
        tokens: TokenStats::default(),
        version: 0,
        worker: 0,
    }
}

fn failed(job: &InferenceJob) -> InferenceResult {
    InferenceResult {
        id: job.id,
        scores: job
            .texts
            .iter()
            .map(|_| Err(ScoreError::Run("model run failed".into())))
            .collect(),
        texts: job.texts.clone(),
        elapsed: Duration::from_millis(3),
        tokens: TokenStats::default(),
        version: 0,
        worker: 0,
    }
}

impl Harness {
    /// The ledger's answer: events accepted and not yet answered.
    fn in_flight(&self) -> usize {
        self.hub.ledger.in_flight()
    }

    /// The ledger's answer: the run's counts so far.
    fn summary(&self) -> &RunSummary {
        self.hub.ledger.summary()
    }

    fn push(&mut self, record: Ingested) {
        self.hub.on_record(record);
        self.hub.after_event();
    }

    fn result(&mut self, result: InferenceResult) {
        self.hub.on_inference_result(result);
        self.hub.after_event();
    }

    /// Feed `n` acknowledgements back to the hub: the futures' and the
    /// fast way's reports, as they come (a failed report's delivery goes
    /// on as a future).
    async fn acks(&mut self, n: usize) {
        if self.reports.is_none() {
            self.reports = self.hub.stages.delivery.take_reports();
        }
        let mut acked = 0;
        while acked < n {
            self.acks.extend(self.hub.stages.delivery.take_outgoing());
            let reports = self.reports.as_mut();
            let ack = tokio::select! {
                Some(ack) = futures::StreamExt::next(&mut self.acks) => Some(ack),
                Some(report) = async { reports?.recv().await } => {
                    self.hub.stages.delivery.reported(report)
                }
            };
            if let Some(ack) = ack {
                self.hub.on_ack(ack);
                acked += 1;
            }
            self.hub.after_event();
        }
    }

    /// Two events of partition 0 scored in one batch, both their
    /// offsets answered.
    async fn two_answered(&mut self) {
        self.push(record(0, 0, 0));
        self.push(record(0, 1, 0));
        let job = self.jobs.try_recv().unwrap();
        self.result(scored(&job));
        self.acks(2).await;
        assert_eq!(self.in_flight(), 0, "both offsets answered");
    }

    /// Partition 0's position for the commit (at-least-once: the last
    /// stored; exactly-once: the seal's answer), and whether the seal
    /// asked for an abort.
    fn committed_on_0(&mut self, exactly_once: bool) -> (Option<i64>, bool) {
        if exactly_once {
            let sealed = self.seal().try_recv().expect("nothing outstanding");
            let at = sealed.positions.iter().find(|p| p.tp == tp(0));
            (at.map(|p| p.next), sealed.abort.is_some())
        } else {
            let stored = self.stored().concat();
            let at = stored.iter().rev().find(|p| p.tp == tp(0));
            (at.map(|p| p.next), false)
        }
    }

    /// Revoke one partition as the consumer's callback would; the
    /// answer arrives on the returned channel.
    fn revoke(&mut self, tp: Tp, generation: u64) -> std::sync::mpsc::Receiver<Positions> {
        let (done, answer) = std::sync::mpsc::channel();
        self.hub.on_control(Control::Revoke {
            partitions: vec![tp],
            generation: Generation(generation),
            done,
        });
        self.hub.after_event();
        answer
    }

    /// Rewind one partition as the consumer thread does after an abort,
    /// taking its answer.
    fn rewind(&mut self, tp: Tp, generation: u64) {
        let (done, rewound) = std::sync::mpsc::channel();
        self.hub.on_control(Control::Rewind {
            partitions: vec![tp],
            generation: Generation(generation),
            done,
        });
        rewound.try_recv().expect("answered");
    }

    /// Everything the hub has for the consumer thread to store, taking
    /// one batch at a time as the consumer thread does.
    fn seal(&mut self) -> std::sync::mpsc::Receiver<crate::consumer::rebalance::Sealed> {
        let (reply, answer) = std::sync::mpsc::channel();
        let deadline = Instant::now() + Duration::from_secs(1);
        self.hub.on_control(Control::Seal { deadline, reply });
        self.hub.after_event();
        answer
    }

    fn stored(&mut self) -> Vec<Positions> {
        let mut taken = Vec::new();
        loop {
            self.hub.stages.positions.send();
            match self.positions.try_recv() {
                Ok(batch) => taken.push(batch),
                Err(_) => return taken,
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn verdicts_keep_offset_order_when_model_runs_finish_out_of_order() {
    let mut h = harness();
    for offset in 0..4 {
        h.push(record(0, offset, 0));
    }
    assert_eq!(h.in_flight(), 4);
    let first = h.jobs.try_recv().unwrap();
    let second = h.jobs.try_recv().unwrap();
    // The later batch comes back first: nothing may be produced yet.
    h.result(scored(&second));
    assert!(h.outbox.offsets().is_empty());
    h.result(scored(&first));
    assert_eq!(h.outbox.offsets(), vec![0, 1, 2, 3]);
    assert_eq!(h.in_flight(), 4, "in flight until acknowledged");
    h.acks(4).await;
    assert_eq!(h.in_flight(), 0);
    assert_eq!(h.summary().verdicts, 4);
    let stored: Vec<Position> = h.stored().into_iter().flatten().collect();
    assert_eq!(stored.last(), Some(&at(0, 4)), "one past the last");
}

#[tokio::test(start_paused = true)]
async fn a_malformed_record_is_dead_lettered_in_its_place() {
    let mut h = harness();
    h.push(record(0, 0, 0));
    let mut bad = record(0, 1, 0);
    bad.payload = Some(b"not json".to_vec());
    h.push(bad);
    // The DLQ record goes out at once; the position waits for offset 0.
    h.acks(1).await;
    assert_eq!(h.summary().dlq, 1);
    assert_eq!(
        h.stored().concat(),
        vec![at(0, 0)],
        "offset 0 has no verdict yet"
    );
    tokio::time::advance(Duration::from_millis(20)).await;
    h.hub.after_event();
    let job = h.jobs.try_recv().expect("closed at the deadline");
    h.result(scored(&job));
    h.acks(1).await;
    assert_eq!(h.in_flight(), 0);
    assert_eq!(h.stored().concat(), vec![at(0, 2)]);
}

#[tokio::test(start_paused = true)]
async fn verdicts_go_out_as_cloudevents_in_either_mode() {
    use crate::config::CloudEventsOutput;
    for mode in [CloudEventsOutput::Binary, CloudEventsOutput::Structured] {
        let mut h = harness_adjusted("", |s| s.output.cloudevents = mode);
        h.push(record(0, 0, 0));
        h.push(record(0, 1, 0));
        let job = h.jobs.try_recv().unwrap();
        h.result(scored(&job));
        let sent = h.outbox.sent();
        assert_eq!(sent.len(), 2);
        let header = |r: &OutRecord, name: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.clone())
                .map(|v| String::from_utf8(v).unwrap())
        };
        let body: serde_json::Value =
            serde_json::from_slice(sent[1].payload.as_deref().unwrap()).unwrap();
        match mode {
            CloudEventsOutput::Binary => {
                assert_eq!(header(&sent[1], "ce_subject").as_deref(), Some("e1"));
                assert_eq!(header(&sent[1], "ce_id").as_deref(), Some("posts-0-1"));
                assert_eq!(body["event_id"], "e1", "the value is the verdict");
            }
            _ => {
                assert_eq!(
                    header(&sent[1], "content-type").as_deref(),
                    Some("application/cloudevents+json")
                );
                assert_eq!(body["specversion"], "1.0");
                assert_eq!(body["subject"], "e1");
                assert_eq!(body["type"], "dev.modstream.verdict");
                assert_eq!(body["data"]["event_id"], "e1", "the verdict is the data");
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_revoke_during_inference_waits_for_the_verdicts_then_answers_the_position() {
    let mut h = harness();
    h.push(record(0, 0, 0));
    h.push(record(0, 1, 0));
    let job = h.jobs.try_recv().unwrap();
    let answer = h.revoke(tp(0), 1);
    assert!(answer.try_recv().is_err(), "two events still in flight");
    // A record polled before the revoke is left to the next owner.
    h.push(record(0, 2, 0));
    assert_eq!(h.summary().stale, 1);
    assert_eq!(h.in_flight(), 2);
    h.result(scored(&job));
    h.acks(2).await;
    assert_eq!(answer.try_recv().unwrap(), vec![at(0, 2)]);
    assert_eq!(h.in_flight(), 0);
    // The partition comes straight back: the hub knows where it was.
    let (reply, resume) = std::sync::mpsc::channel();
    h.hub.on_control(Control::Assign {
        partitions: vec![tp(0), tp(1)],
        reply,
    });
    assert_eq!(resume.try_recv().unwrap(), vec![at(0, 2)]);
}

#[tokio::test(start_paused = true)]
async fn a_drain_that_times_out_leaves_the_events_to_the_next_owner() {
    let mut h = harness();
    h.push(record(0, 0, 0));
    h.push(record(0, 1, 0));
    h.push(record(1, 0, 0));
    let job = h.jobs.try_recv().unwrap();
    let answer = h.revoke(tp(0), 1);
    // Partition 1's open batch is untouched; partition 0's model run
    // does not come back within kafka.drain_timeout.
    tokio::time::advance(Duration::from_secs(1)).await;
    h.hub.after_event();
    assert_eq!(
        answer.try_recv().unwrap(),
        vec![at(0, 0)],
        "nothing delivered: the position stays at the first offset"
    );
    assert_eq!(h.in_flight(), 3);
    // The late result produces nothing and is no longer in flight.
    h.result(scored(&job));
    assert!(h.outbox.offsets().is_empty());
    assert_eq!(h.in_flight(), 1);
    // Partition 1 carries on.
    let job = h
        .jobs
        .try_recv()
        .expect("partition 1 closed at its deadline");
    h.result(scored(&job));
    h.acks(1).await;
    assert_eq!(h.in_flight(), 0);
    assert_eq!(h.stored().concat(), vec![at(1, 1)]);
}

#[tokio::test(start_paused = true)]
async fn a_record_the_broker_refuses_for_good_does_not_pin_its_partition() {
    let mut h = harness();
    h.outbox.fail_topic("moderation.dlq", Fate::Rejected);
    let mut bad = record(0, 0, 0);
    bad.payload = Some(vec![b'{'; 10]);
    h.push(bad);
    h.push(record(0, 1, 0));
    h.push(record(0, 2, 0));
    let job = h.jobs.try_recv().unwrap();
    h.result(scored(&job));
    h.acks(3).await;
    assert_eq!(h.summary().undeliverable, 1);
    assert_eq!(h.summary().verdicts, 2);
    assert_eq!(h.in_flight(), 0);
    let stored: Vec<Position> = h.stored().concat();
    assert_eq!(stored.last(), Some(&at(0, 3)), "the position passes it");
}

#[tokio::test(start_paused = true)]
async fn a_partition_without_progress_is_reported_stalled_until_it_moves() {
    let mut h = harness_adjusted("", |s| s.limits.stall_after = Duration::from_secs(3));
    h.push(record(0, 0, 0));
    h.push(record(0, 1, 0));
    let job = h.jobs.try_recv().unwrap();
    // The model run does not come back.
    tokio::time::advance(Duration::from_secs(2)).await;
    h.hub.after_event();
    assert!(h.health.stalled().is_empty(), "not yet");
    tokio::time::advance(Duration::from_secs(2)).await;
    h.hub.after_event();
    let stalled = h.health.stalled();
    assert_eq!(stalled.len(), 1);
    assert_eq!(
        (stalled[0].partition, stalled[0].offset, stalled[0].pending),
        (0, 0, 2)
    );
    assert!(stalled[0].waiting_s >= 3);
    // It moves: no longer stalled at the next look.
    h.result(scored(&job));
    h.acks(2).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    h.hub.after_event();
    assert!(h.health.stalled().is_empty());
}

mod breaker;
mod deadlines;
mod delivery;
mod exactly_once;
mod fast_way;
mod matching;
mod outbox;
mod policy;
mod run_loop;
mod sampling;
mod token_budget;

#[tokio::test(start_paused = true)]
async fn reading_a_backlog_with_urgent_posts_no_scored_verdict_waits_for_newer_batches() {
    // A backlog read partition by partition, one post in three urgent: most
    // batches close early as urgent. Runs finished in the order they were
    // handed out must release their verdicts at once: a partition's
    // batches are taken oldest first, urgent or not.
    let mut h = harness();
    for partition in 0..3 {
        for offset in 0..12 {
            let mut r = record(partition, offset, 0);
            if offset % 3 == 2 {
                r.payload = Some(
                    format!(r#"{{"event_id":"e{offset}","text":"post","priority":"urgent"}}"#)
                        .into_bytes(),
                );
            }
            h.push(r);
        }
    }
    let mut scored_events = 0;
    while let Ok(job) = h.jobs.try_recv() {
        scored_events += job.texts.len();
        h.result(scored(&job));
        assert_eq!(
            h.outbox.offsets().len(),
            scored_events,
            "every scored verdict out at once"
        );
    }
    assert_eq!(scored_events, 36, "every post scored");
}
