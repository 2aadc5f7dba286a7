//! The hub: the one task that owns all per-partition state, so nothing here
//! needs a lock. Its loop handles, in priority order: rebalances, delivery
//! acknowledgements, inference results, batch deadlines, then new input, and
//! new input only while fewer than `limits.max_in_flight` events are
//! undelivered (beyond that the bounded input channel fills and the consumer
//! pauses its partitions).
//!
//! Guarantees: every consumed record ends as exactly one verdict or one DLQ
//! record (or, for a partition revoked meanwhile, is left uncommitted for its
//! next owner); verdicts of a partition are produced in offset order; a
//! position is sent to the consumer for storing only once every earlier
//! offset of its partition was acknowledged by the broker.
//!
//! What it owns: the partitions' state ([`Partition`]), the dispatch queue,
//! the jobs in inference, the in-flight count, the positions of the owned
//! partitions (the consumer thread learns them by message) and the revokes
//! in progress ([`Revokes`]).

use std::collections::{HashMap, HashSet, VecDeque};

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Settings;
use crate::consumer::{Ingested, Tp};
use crate::event::{self, Priority, RejectReason};
use crate::inference::{InferenceJob, InferenceResult};
use crate::partition::{Partition, Pending, ReadyBatch, Scored};
use crate::producer::{OutRecord, ProducerError, Source};
use crate::rebalance::{Positions, RebalanceEvent, Revokes};
use crate::shutdown::Shutdown;
use crate::slo::{self, Choice};
use crate::telemetry::{Health, metric};
use crate::verdict::{self, Original, Scorer};
use std::sync::Arc;

mod breaker;
mod watchdog;

use breaker::Breaker;
use watchdog::STALL_CHECK;

/// How soon the hub tries again to hand positions to the consumer thread
/// when it has not taken the previous batch yet.
const POSITIONS_RETRY: std::time::Duration = std::time::Duration::from_millis(10);

/// Counts of one run, for the demo and the tests.
#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    pub consumed: u64,
    pub verdicts: u64,
    pub dlq: u64,
    pub stale: u64,
    /// Deliveries given up at shutdown (their offsets stay uncommitted).
    pub abandoned: u64,
    /// Records the broker refused for good (committed past, counted, logged).
    pub undeliverable: u64,
    /// Model runs, and the time spent in them.
    pub batches: u64,
    pub inference_seconds: f64,
    /// Token models: tokens fed, real and padded (padding efficiency = real ÷ padded).
    pub real_tokens: u64,
    pub padded_tokens: u64,
    /// Model runs by size: `run_sizes[n]` runs of n events.
    pub run_sizes: Vec<u64>,
    /// Where an event's time goes: waiting for its batch to close (summed
    /// over closed batches), and from enqueueing its verdict to the broker's
    /// acknowledgement (summed over records).
    pub batch_wait_seconds: f64,
    pub closed_batches: u64,
    pub produce_seconds: f64,
    /// With `batching.target_p99`: the batch sizes and deadlines chosen, and
    /// when (a change of size, or of the deadline by more than a tenth; the
    /// first [`MAX_BATCH_CHOICES`]).
    pub batch_choices: Vec<(std::time::Instant, Choice)>,
}

/// How many batch choices a [`RunSummary`] keeps.
pub const MAX_BATCH_CHOICES: usize = 100_000;

/// Hands a record to the broker; resolves once it is acknowledged (see
/// [`crate::producer::Sink`]). A trait so that tests can stand in for Kafka.
pub trait Deliver: Send + 'static {
    /// `source`: the input partition and offset the record answers.
    fn deliver(
        &self,
        record: OutRecord,
        source: Source,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<(), ProducerError>>;

    /// A delivery failure concerning the whole service that lasts now:
    /// (topic, for how long, last error).
    fn service_failure(&self) -> Option<(String, std::time::Duration, String)> {
        None
    }
}

/// What the delivery tasks report back.
pub struct Ack {
    tp: Tp,
    generation: u64,
    offset: i64,
    outcome: Result<Outcome, ProducerError>,
    /// "verdict" or "dlq".
    kind: &'static str,
    /// Enqueue to acknowledgement.
    took: std::time::Duration,
    /// When the consumer thread polled the input record.
    received_at: Instant,
}

enum Outcome {
    /// The verdict label, and when the input record was written (ms).
    Verdict(&'static str, Option<i64>),
    Dlq(RejectReason),
}

/// The hub's inputs.
pub struct Inputs {
    pub records: mpsc::Receiver<Ingested>,
    pub rebalances: mpsc::Receiver<RebalanceEvent>,
    pub results: mpsc::Receiver<InferenceResult>,
}

pub struct Hub<D: Deliver> {
    settings: Settings,
    scorer: Arc<Scorer>,
    /// The candidate model offered the live verdicts, if one is configured.
    shadow: Option<crate::shadow::Shadow>,
    jobs: async_channel::Sender<InferenceJob>,
    outbox: D,
    /// Positions for the consumer thread to store.
    positions_tx: async_channel::Sender<Positions>,
    abort: CancellationToken,
    stop: CancellationToken,
    /// A fatal producer error: nothing more can be delivered; the run stops.
    producer_fatal: Option<ProducerError>,
    partitions: HashMap<Tp, Partition>,
    revokes: Revokes,
    /// The last position stored for each owned partition, and those not yet
    /// handed to the consumer thread (its channel was full).
    positions: HashMap<Tp, i64>,
    unsent_positions: HashMap<Tp, i64>,
    ready: VecDeque<ReadyBatch>,
    in_inference: HashMap<u64, Vec<ReadyBatch>>,
    next_job_id: u64,
    /// Events accepted and not yet acknowledged (or abandoned).
    in_flight: usize,
    acks_tx: mpsc::Sender<Ack>,
    acks_rx: Option<mpsc::Receiver<Ack>>,
    deliveries: TaskTracker,
    summary: RunSummary,
    breaker: Breaker,
    /// The watchdog: partitions stalled now, and when it looks next.
    health: std::sync::Arc<Health>,
    stalled: HashSet<Tp>,
    next_stall_check: Instant,
    /// The batch size and deadline now: fixed, or chosen by the latency
    /// target's controller when `batching.target_p99` is set.
    batch: Choice,
    slo: Option<slo::Controller>,
    /// Model runs dispatched at most at once (two per worker). Resolved
    /// once: `workers = "auto"` reads the cgroup's CPU limit from files.
    dispatch_capacity: usize,
}

impl<D: Deliver> Hub<D> {
    pub fn new(
        settings: Settings,
        scorer: Scorer,
        jobs: async_channel::Sender<InferenceJob>,
        outbox: D,
        positions_tx: async_channel::Sender<Positions>,
        health: std::sync::Arc<Health>,
        shutdown: &Shutdown,
    ) -> Self {
        let (acks_tx, acks_rx) = mpsc::channel(settings.limits.max_in_flight);
        let b = &settings.batching;
        let workers = settings.inference.worker_count();
        let slo = b.target_p99.map(|target| {
            slo::Controller::new(
                target,
                b.max_batch_size,
                b.max_batch_delay,
                workers,
                Instant::now(),
            )
        });
        let batch = slo.as_ref().map_or(
            Choice {
                size: b.max_batch_size,
                delay: b.max_batch_delay,
            },
            slo::Controller::choice,
        );
        export_choice(batch);
        metrics::gauge!(metric::LATENCY_TARGET_MISSED).set(0.0);
        let summary = RunSummary {
            batch_choices: slo
                .as_ref()
                .map(|_| vec![(std::time::Instant::now(), batch)])
                .unwrap_or_default(),
            ..Default::default()
        };
        Hub {
            settings,
            scorer: Arc::new(scorer),
            shadow: None,
            jobs,
            outbox,
            positions_tx,
            abort: shutdown.abort.clone(),
            stop: shutdown.stop.clone(),
            producer_fatal: None,
            partitions: HashMap::new(),
            revokes: Revokes::default(),
            positions: HashMap::new(),
            unsent_positions: HashMap::new(),
            ready: VecDeque::new(),
            in_inference: HashMap::new(),
            next_job_id: 0,
            in_flight: 0,
            acks_tx,
            acks_rx: Some(acks_rx),
            deliveries: TaskTracker::new(),
            summary,
            health,
            breaker: Breaker::default(),
            stalled: HashSet::new(),
            next_stall_check: Instant::now() + STALL_CHECK,
            batch,
            slo,
            dispatch_capacity: workers * 2,
        }
    }

    /// Offer every (sampled) live verdict to this shadow model.
    pub fn with_shadow(mut self, shadow: Option<crate::shadow::Shadow>) -> Self {
        self.shadow = shadow;
        self
    }

    /// Run until the input is closed and nothing is in flight; then wait for
    /// the delivery tasks and hand the last positions to the consumer.
    /// Returns the counts and the producer error that stopped it, if one did.
    pub async fn run(mut self, mut inputs: Inputs) -> (RunSummary, Option<ProducerError>) {
        let Some(mut acks_rx) = self.acks_rx.take() else {
            return (self.summary, None);
        };
        let mut input_open = true;
        let abort = self.abort.clone();
        loop {
            let wake_at = self.next_wake();
            let accepting = input_open
                && self.in_flight < self.settings.limits.max_in_flight
                && !self.breaker.open;
            let holding = self.breaker.open && !self.ready.is_empty();
            tokio::select! {
                biased;
                Some(event) = inputs.rebalances.recv() => self.on_rebalance(event),
                Some(ack) = acks_rx.recv() => self.on_ack(ack),
                Some(result) = inputs.results.recv() => self.on_inference_result(result),
                _ = abort.cancelled(), if holding => self.give_up_held(),
                _ = sleep_until(wake_at) => {}
                record = inputs.records.recv(), if accepting => match record {
                    Some(record) => self.on_record(record),
                    None => {
                        input_open = false;
                        self.flush_all();
                    }
                },
            }
            self.after_event();
            if !input_open && self.in_flight == 0 {
                break;
            }
        }
        self.finish_revokes(true);
        self.deliveries.close();
        self.deliveries.wait().await;
        let last: Positions = self.unsent_positions.drain().collect();
        if !last.is_empty() {
            let _ = self.positions_tx.send(last).await;
        }
        (self.summary, self.producer_fatal)
    }

    /// The work every event of the loop may have made possible.
    fn after_event(&mut self) {
        self.close_expired();
        self.dispatch();
        self.finish_revokes(false);
        self.send_positions();
        if Instant::now() >= self.next_stall_check {
            self.check_stalls();
        }
        if self
            .slo
            .as_ref()
            .is_some_and(|c| Instant::now() >= c.next_tick())
        {
            self.adjust_batching();
        }
    }

    /// The latency target's controller looks again; its new choice applies
    /// to every partition's open and next batches and to dispatch.
    fn adjust_batching(&mut self) {
        let Some(controller) = self.slo.as_mut() else {
            return;
        };
        let was_missed = controller.status().missed;
        let changed = controller.tick(Instant::now());
        let status = controller.status();
        if let Some(choice) = changed {
            self.batch = choice;
            // Kept when the size changes or the deadline by a tenth.
            let noted = self.summary.batch_choices.last().is_some_and(|(_, last)| {
                last.size == choice.size && last.delay.abs_diff(choice.delay) * 10 <= last.delay
            });
            if !noted && self.summary.batch_choices.len() < MAX_BATCH_CHOICES {
                self.summary
                    .batch_choices
                    .push((std::time::Instant::now(), choice));
            }
            for partition in self.partitions.values_mut() {
                partition.set_batching(choice.size, choice.delay);
            }
            export_choice(choice);
        }
        metrics::gauge!(metric::BATCHING_SATURATED)
            .set(f64::from(u8::from(status.mode == slo::Mode::Throughput)));
        metrics::gauge!(metric::LATENCY_TARGET_MISSED).set(f64::from(u8::from(status.missed)));
        tracing::trace!(
            mode = ?status.mode,
            size = status.choice.size,
            delay = ?status.choice.delay,
            p99 = ?status.p99,
            outside_batching = ?status.uncontrolled,
            events_per_s = status.rate.round(),
            "batching choice"
        );
        let target = self.settings.batching.target_p99.unwrap_or_default();
        if status.missed && !was_missed {
            tracing::warn!(
                target_p99 = ?target,
                p99 = ?status.p99.unwrap_or_default(),
                events_per_s = status.rate.round(),
                outside_batching = ?status.uncontrolled,
                batch_size = status.choice.size,
                cause = status.miss_cause(),
                "latency target missed; batching for throughput until it can be met again"
            );
        } else if was_missed && !status.missed {
            tracing::info!(target_p99 = ?target, p99 = ?status.p99.unwrap_or_default(), "latency target met again");
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        let batch = self
            .partitions
            .values()
            .filter_map(Partition::deadline)
            .min();
        let watchdog =
            (self.in_flight > 0 || !self.stalled.is_empty()).then_some(self.next_stall_check);
        let slo = self.slo.as_ref().map(slo::Controller::next_tick);
        let probe = self
            .breaker
            .next_probe
            .filter(|_| self.breaker.probe.is_none());
        // Positions waiting for the consumer thread to take the last batch.
        let positions =
            (!self.unsent_positions.is_empty()).then(|| Instant::now() + POSITIONS_RETRY);
        batch
            .into_iter()
            .chain(self.revokes.next_deadline())
            .chain(positions)
            .chain(watchdog)
            .chain(probe)
            .chain(slo)
            .min()
    }

    fn on_record(&mut self, record: Ingested) {
        self.summary.consumed += 1;
        if self.revokes.is_stale(&record.tp, record.generation) {
            self.summary.stale += 1;
            metrics::counter!(metric::STALE_RECORDS_TOTAL).increment(1);
            return;
        }
        // A revoke whose drain the consumer gave up on ends here, before the
        // partition's new assignment starts.
        if let Some(old) = self.partitions.get(&record.tp)
            && self.revokes.is_stale(&record.tp, old.generation())
        {
            self.finish_revokes(true);
        }
        let batch = self.batch;
        let partition = self.partitions.entry(record.tp.clone()).or_insert_with(|| {
            Partition::new(
                record.tp.clone(),
                record.generation,
                batch.size,
                batch.delay,
            )
        });
        partition.track(record.offset);
        self.in_flight += 1;
        metrics::gauge!(metric::IN_FLIGHT_EVENTS).set(self.in_flight as f64);

        // Acknowledgements are matched against this partition state's own
        // generation, not the (newer) one a later rebalance stamps on records.
        let generation = partition.generation();
        let original = Original {
            key: record.key,
            payload: record.payload,
            headers: record.headers,
            timestamp_ms: record.timestamp_ms,
        };
        match event::validate(original.payload.as_deref(), &self.settings.limits) {
            Ok(event) => {
                let urgent = event.priority == Priority::Urgent;
                if let Some(controller) = self.slo.as_mut() {
                    controller.arrived(1);
                }
                let pending = Pending {
                    tp: record.tp,
                    generation,
                    offset: record.offset,
                    original,
                    event,
                    received_at: record.received_at,
                    bytes: record.bytes,
                    scored_by: None,
                };
                if let Some(batch) = partition.push(pending, urgent, record.received_at) {
                    self.enqueue(batch);
                }
            }
            Err(rejection) => {
                let out = verdict::dead_letter(
                    &self.settings.output.dlq_topic,
                    &record.tp,
                    record.offset,
                    original,
                    &rejection,
                );
                self.deliver(
                    (record.tp, generation, record.offset),
                    out,
                    Outcome::Dlq(rejection.reason),
                    (record.received_at, record.bytes),
                );
            }
        }
    }

    /// A closed batch joins the dispatch queue; urgent ones go first.
    fn enqueue(&mut self, batch: ReadyBatch) {
        let waited = batch.waited.as_secs_f64();
        metrics::histogram!(metric::BATCH_WAIT_SECONDS).record(waited);
        self.summary.batch_wait_seconds += waited;
        self.summary.closed_batches += 1;
        if batch.urgent {
            self.ready.push_front(batch);
        } else {
            self.ready.push_back(batch);
        }
    }

    fn close_expired(&mut self) {
        let now = Instant::now();
        let expired: Vec<ReadyBatch> = self
            .partitions
            .values_mut()
            .filter_map(|p| p.close_expired(now))
            .collect();
        for batch in expired {
            self.enqueue(batch);
        }
    }

    fn flush_all(&mut self) {
        let tps: Vec<Tp> = self.partitions.keys().cloned().collect();
        self.flush(&tps);
    }

    fn flush(&mut self, tps: &[Tp]) {
        for tp in tps {
            if let Some(batch) = self.partitions.get_mut(tp).and_then(Partition::flush) {
                self.enqueue(batch);
            }
        }
    }

    /// Coalesce ready batches (possibly of several partitions) into model runs
    /// of at most `max_batch_size` events, while the workers' queue has room.
    fn dispatch(&mut self) {
        let max = self.batch.size;
        let capacity = self.dispatch_capacity;
        if self.breaker.open {
            self.probe(capacity);
            return;
        }
        while !self.ready.is_empty() && self.in_inference.len() < capacity {
            let mut segments = Vec::new();
            let mut size = 0;
            while let Some(next) = self.ready.front() {
                if size > 0 && size + next.items.len() > max {
                    break;
                }
                let Some(batch) = self.ready.pop_front() else {
                    break;
                };
                size += batch.items.len();
                segments.push(batch);
            }
            let texts = segments
                .iter_mut()
                .flat_map(|s| {
                    s.items
                        .iter_mut()
                        .map(|p| std::mem::take(&mut p.event.text))
                })
                .collect();
            let id = self.next_job_id;
            self.next_job_id += 1;
            metrics::histogram!(metric::BATCH_SIZE).record(size as f64);
            let sizes = &mut self.summary.run_sizes;
            if sizes.len() <= size {
                sizes.resize(size + 1, 0);
            }
            sizes[size] += 1;
            self.in_inference.insert(id, segments);
            if let Err(e) = self.jobs.try_send(InferenceJob { id, texts }) {
                // Cannot happen while in_inference bounds the queue; keep
                // the events anyway (scored as failed).
                tracing::error!("inference queue full despite the bound");
                self.on_inference_result(InferenceResult {
                    id,
                    scores: vec![],
                    texts: e.into_inner().texts,
                    elapsed: std::time::Duration::ZERO,
                    tokens: Default::default(),
                    scorer: None,
                });
            }
        }
    }

    fn on_inference_result(&mut self, result: InferenceResult) {
        if self.breaker.probe == Some(result.id) {
            self.on_probe(result);
            return;
        }
        let Some(segments) = self.in_inference.remove(&result.id) else {
            return;
        };
        let dead = !result.scores.is_empty() && result.scores.iter().all(Result::is_err);
        if !dead {
            self.breaker.dead_runs = 0;
            if let Some(i) = result.scores.iter().position(Result::is_ok) {
                self.breaker.last_scored = result.texts.get(i).cloned();
            }
        } else {
            self.breaker.dead_runs += 1;
            let limit = self.settings.inference.breaker_after;
            if limit > 0 && (self.breaker.open || self.breaker.dead_runs >= limit) {
                self.hold_back(segments, result);
                return;
            }
        }
        metrics::histogram!(metric::INFERENCE_SECONDS).record(result.elapsed.as_secs_f64());
        if let Some(controller) = self.slo.as_mut() {
            controller.model_run(result.scores.len(), result.elapsed);
        }
        self.summary.batches += 1;
        self.summary.inference_seconds += result.elapsed.as_secs_f64();
        self.summary.real_tokens += result.tokens.real;
        self.summary.padded_tokens += result.tokens.padded;
        metrics::counter!(metric::TOKENS_REAL_TOTAL).increment(result.tokens.real);
        metrics::counter!(metric::TOKENS_PADDED_TOTAL).increment(result.tokens.padded);
        let mut scores = result.scores.into_iter();
        // The shadow model needs the texts back (they went to the workers).
        let mut texts = self.shadow.is_some().then(|| result.texts.into_iter());
        for segment in segments {
            let scored: Vec<Scored> = segment
                .items
                .into_iter()
                .map(|mut p| {
                    p.scored_by = result.scorer.clone();
                    if let Some(text) = texts.as_mut().and_then(Iterator::next) {
                        p.event.text = text;
                    }
                    let s = scores
                        .next()
                        .unwrap_or_else(|| Err("no score returned".to_string()));
                    (p, s)
                })
                .collect();
            match self.partitions.get_mut(&segment.tp) {
                Some(partition) if partition.generation() == segment.generation => {
                    partition.scored(segment.seq, scored);
                }
                // Revoked meanwhile and the drain gave up: the next owner
                // reprocesses these events.
                _ => self.release(scored.len()),
            }
            self.emit_in_order(&segment.tp);
        }
    }

    /// Produce the verdicts of a partition's batches in batch order.
    fn emit_in_order(&mut self, tp: &Tp) {
        while let Some(scored) = self
            .partitions
            .get_mut(tp)
            .and_then(Partition::next_in_order)
        {
            for (mut pending, score) in scored {
                let at = (pending.tp.clone(), pending.generation, pending.offset);
                let held = (pending.received_at, pending.bytes.take());
                let (out, outcome) = self.outcome(pending, score);
                self.deliver(at, out, outcome, held);
            }
        }
    }

    /// The verdict record of a scored event, or its dead-letter record.
    fn outcome(
        &self,
        mut pending: Pending,
        score: Result<Vec<f32>, String>,
    ) -> (OutRecord, Outcome) {
        match score {
            Ok(probabilities) => {
                // The model that scored it (a reload may have switched it).
                let scorer = pending
                    .scored_by
                    .clone()
                    .unwrap_or_else(|| self.scorer.clone());
                if let Some(shadow) = &self.shadow
                    && shadow.samples(&pending.event.event_id)
                {
                    shadow.offer(crate::shadow::ShadowJob {
                        event_id: pending.event.event_id.clone(),
                        text: std::mem::take(&mut pending.event.text),
                        source: (
                            pending.tp.topic.clone(),
                            pending.tp.partition,
                            pending.offset,
                        ),
                        live_probabilities: probabilities.clone(),
                        live: scorer.clone(),
                    });
                }
                let (out, label) = scorer.verdict_record(
                    &self.settings.output.topic,
                    &pending.tp,
                    pending.offset,
                    pending.original.key,
                    &pending.event,
                    &probabilities,
                    pending.original.timestamp_ms,
                );
                let event_time = pending
                    .original
                    .timestamp_ms
                    .filter(|t| *t > 0)
                    .or(pending.event.created_at_ms);
                (out, Outcome::Verdict(label, event_time))
            }
            Err(message) => {
                metrics::counter!(metric::INFERENCE_FAILURES_TOTAL).increment(1);
                let rejection = event::Rejection {
                    reason: RejectReason::InferenceFailed,
                    message,
                };
                let out = verdict::dead_letter(
                    &self.settings.output.dlq_topic,
                    &pending.tp,
                    pending.offset,
                    pending.original,
                    &rejection,
                );
                (out, Outcome::Dlq(RejectReason::InferenceFailed))
            }
        }
    }

    /// Enqueue one record now; a task reports its acknowledgement. `bytes`
    /// (the input's share of the byte budget) is given back after it;
    /// `received_at` is when the input was polled.
    fn deliver(
        &mut self,
        (tp, generation, offset): (Tp, u64, i64),
        out: OutRecord,
        outcome: Outcome,
        (received_at, bytes): (Instant, Option<tokio::sync::OwnedSemaphorePermit>),
    ) {
        let kind = out.kind;
        let delivery = self
            .outbox
            .deliver(out, (tp.clone(), offset), self.abort.clone());
        let acks = self.acks_tx.clone();
        let started = Instant::now();
        self.deliveries.spawn(async move {
            let outcome = delivery.await.map(|()| outcome);
            drop(bytes);
            let _ = acks
                .send(Ack {
                    tp,
                    generation,
                    offset,
                    outcome,
                    kind,
                    took: started.elapsed(),
                    received_at,
                })
                .await;
        });
    }

    fn on_ack(&mut self, ack: Ack) {
        self.release(1);
        self.summary.produce_seconds += ack.took.as_secs_f64();
        let outcome = match ack.outcome {
            Ok(outcome) => outcome,
            Err(ProducerError::Fatal(message)) => {
                self.summary.abandoned += 1;
                if self.producer_fatal.is_none() {
                    tracing::error!(error = %message, "stopping: the producer cannot deliver any more");
                    self.producer_fatal = Some(ProducerError::Fatal(message));
                    self.stop.cancel();
                    self.abort.cancel();
                }
                return;
            }
            Err(ProducerError::Rejected(error)) => {
                // Never pins the partition: counted, logged with where the
                // original lives, and committed past.
                let kind = ack.kind;
                metrics::counter!(metric::UNDELIVERABLE_TOTAL, "kind" => kind).increment(1);
                tracing::error!(topic = %ack.tp.topic, partition = ack.tp.partition, offset = ack.offset, kind, error = %error, "the broker refuses this record for good; its offset is committed");
                self.summary.undeliverable += 1;
                self.advance(&ack.tp, ack.generation, ack.offset);
                return;
            }
            Err(_) => {
                self.summary.abandoned += 1;
                return;
            }
        };
        match outcome {
            Outcome::Verdict(label, event_time_ms) => {
                self.summary.verdicts += 1;
                metrics::counter!(metric::VERDICTS_TOTAL, "verdict" => label).increment(1);
                let in_hub = ack.received_at.elapsed();
                let end_to_end = event_time_ms.map(|t| {
                    let ms = (chrono::Utc::now().timestamp_millis() - t).max(0);
                    metrics::histogram!(metric::END_TO_END_SECONDS).record(ms as f64 / 1000.0);
                    std::time::Duration::from_millis(ms as u64)
                });
                if let Some(controller) = self.slo.as_mut() {
                    // Without a record timestamp only the part in the hub is known.
                    let end_to_end = end_to_end.unwrap_or(in_hub).max(in_hub);
                    controller.delivered(end_to_end, end_to_end - in_hub, ack.took);
                }
            }
            Outcome::Dlq(reason) => {
                self.summary.dlq += 1;
                metrics::counter!(metric::DLQ_TOTAL, "reason" => reason.code()).increment(1);
            }
        }
        self.advance(&ack.tp, ack.generation, ack.offset);
    }

    /// An offset is done: move its partition's position if it can.
    fn advance(&mut self, tp: &Tp, generation: u64, offset: i64) {
        let Some(partition) = self.partitions.get_mut(tp) else {
            return;
        };
        if partition.generation() != generation {
            return;
        }
        if let Some(position) = partition.ack(offset) {
            self.store(tp.clone(), position);
        }
    }

    fn release(&mut self, events: usize) {
        self.in_flight = self.in_flight.saturating_sub(events);
        metrics::gauge!(metric::IN_FLIGHT_EVENTS).set(self.in_flight as f64);
    }

    /// Record a partition's new position, for the consumer thread to store.
    fn store(&mut self, tp: Tp, position: i64) {
        self.positions.insert(tp.clone(), position);
        self.unsent_positions.insert(tp, position);
    }

    /// Hand the new positions to the consumer thread, once it has taken the
    /// previous batch; meanwhile they wait here, later ones replacing earlier
    /// ones (the loop wakes every [`POSITIONS_RETRY`] to try again).
    fn send_positions(&mut self) {
        if self.unsent_positions.is_empty() || !self.positions_tx.is_empty() {
            return;
        }
        let batch: Positions = self.unsent_positions.drain().collect();
        if let Err(async_channel::TrySendError::Full(batch)) = self.positions_tx.try_send(batch) {
            self.unsent_positions.extend(batch);
        }
    }

    fn on_rebalance(&mut self, event: RebalanceEvent) {
        match event {
            RebalanceEvent::Revoke {
                partitions,
                generation,
                done,
            } => {
                self.flush(&partitions);
                self.revokes.start(
                    partitions,
                    generation,
                    self.settings.kafka.drain_timeout,
                    done,
                );
            }
            RebalanceEvent::Assign { partitions, reply } => {
                tracing::debug!(partitions = partitions.len(), "assignment received");
                let _ = reply.send(self.revokes.take_resume(&partitions));
            }
            RebalanceEvent::Resumed { positions } => self.positions.extend(positions),
        }
    }

    /// Answer revokes whose partitions are drained (or whose time is up):
    /// their state goes, their positions go to the consumer thread with
    /// the answer, and their queued batches will not be scored.
    fn finish_revokes(&mut self, force: bool) {
        let partitions = &self.partitions;
        let ready = self.revokes.ready(force, |tp| {
            partitions.get(tp).map_or(0, Partition::in_flight)
        });
        for (revoked, done) in ready {
            let mut answer = Positions::new();
            for tp in &revoked {
                if let Some(mut partition) = self.partitions.remove(tp) {
                    if let Some(position) = partition.final_position() {
                        self.positions.insert(tp.clone(), position);
                    }
                    self.release(partition.held_back());
                    metrics::gauge!(metric::OLDEST_PENDING_SECONDS, "topic" => tp.topic.to_string(), "partition" => tp.partition.to_string())
                        .set(0.0);
                }
                self.unsent_positions.remove(tp);
                if let Some(position) = self.positions.remove(tp) {
                    answer.push((tp.clone(), position));
                }
            }
            let revoked: HashSet<&Tp> = revoked.iter().collect();
            let mut dropped = 0;
            self.ready.retain(|b| {
                let keep = !revoked.contains(&b.tp);
                if !keep {
                    dropped += b.items.len();
                }
                keep
            });
            self.release(dropped);
            self.revokes.answer(answer, done);
        }
    }
}

/// The batch size and deadline in use, as metrics.
fn export_choice(choice: Choice) {
    metrics::gauge!(metric::BATCH_TARGET_SIZE).set(choice.size as f64);
    metrics::gauge!(metric::BATCH_TARGET_DELAY_SECONDS).set(choice.delay.as_secs_f64());
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
