//! The wiring: consumer → validation → per-partition batchers → inference
//! workers → verdict / DLQ delivery → offset store.
//!
//! One task owns all per-partition state (batchers, offset trackers, reorder
//! buffers), so nothing here needs a lock. Its loop handles, in priority order:
//! rebalances, delivery acknowledgements, inference results, batch deadlines,
//! then new input, and new input only while fewer than
//! `limits.max_in_flight` events are undelivered (beyond that the bounded
//! input channel fills and the consumer pauses its partitions).
//!
//! Guarantees: every consumed record ends as exactly one verdict or one DLQ
//! record (or, for a partition revoked meanwhile, is left uncommitted for its
//! next owner); verdicts of a partition are produced in offset order; an
//! offset is stored only once it and every earlier offset of its partition
//! were acknowledged by the broker.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use std::sync::atomic::Ordering;

use rdkafka::consumer::Consumer;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batcher::{Batcher, ClosedBatch};
use crate::config::Settings;
use crate::consumer::{self, Ingested, KafkaConsumer, RebalanceEvent, Tp};
use crate::event::{self, Priority, RejectReason};
use crate::inference::{InferenceError, InferenceJob, InferencePool, InferenceResult};
use crate::producer::{OutRecord, ProducerError, Sink};
use crate::shutdown::Shutdown;
use crate::telemetry::{Health, metric};
use crate::verdict;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Inference(#[from] InferenceError),
    #[error(transparent)]
    Consumer(#[from] consumer::ConsumerError),
    #[error(transparent)]
    Producer(#[from] ProducerError),
    #[error(
        "{0} events were not delivered before kafka.shutdown_timeout; they stay uncommitted and are reprocessed after a restart"
    )]
    Abandoned(u64),
    #[error("invalid policy for this model: {0}")]
    Policy(String),
}

/// Counts of one run, for the demo and the tests.
#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    pub consumed: u64,
    pub verdicts: u64,
    pub dlq: u64,
    pub stale: u64,
    /// Deliveries given up at shutdown (their offsets stay uncommitted).
    pub abandoned: u64,
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
}

/// A valid event waiting for its verdict.
struct Pending {
    tp: Tp,
    generation: u64,
    offset: i64,
    key: Option<Vec<u8>>,
    /// The original bytes, for a dead-letter record if the model fails on it.
    payload: Vec<u8>,
    event: event::Event,
    timestamp_ms: Option<i64>,
}

struct Partition {
    generation: u64,
    batcher: Batcher<Pending>,
    offsets: crate::offsets::OffsetTracker,
    /// Sequence number of the next batch to close, and of the next one whose
    /// verdicts may be produced; `finished` holds results that came back early.
    next_batch_seq: u64,
    next_emit_seq: u64,
    finished: BTreeMap<u64, Vec<Scored>>,
}

/// An event with its probabilities, or why the model could not score it.
type Scored = (Pending, Result<Vec<f32>, String>);

struct ReadyBatch {
    tp: Tp,
    generation: u64,
    seq: u64,
    items: Vec<Pending>,
}

/// What the delivery tasks report back.
struct Ack {
    tp: Tp,
    generation: u64,
    offset: i64,
    outcome: Result<Outcome, ProducerError>,
    /// Enqueue to acknowledgement.
    took: std::time::Duration,
}

enum Outcome {
    /// The verdict label, and when the input record was written (ms).
    Verdict(&'static str, Option<i64>),
    Dlq(RejectReason),
}

struct PendingRevoke {
    partitions: Vec<Tp>,
    deadline: Instant,
    done: std::sync::mpsc::Sender<()>,
}

/// Run the pipeline until `shutdown` says stop and everything in flight is
/// delivered (or abandoned on abort). The model loads before any connection.
pub async fn run(settings: Settings, shutdown: Shutdown) -> Result<RunSummary, PipelineError> {
    run_with_health(settings, shutdown, Arc::default()).await
}

/// [`run`], reporting readiness (for /readyz) into `health`.
pub async fn run_with_health(
    settings: Settings,
    shutdown: Shutdown,
    health: Arc<Health>,
) -> Result<RunSummary, PipelineError> {
    let (results_tx, results_rx) = mpsc::channel(settings.inference.workers * 4);
    let pool = InferencePool::start(
        &settings.inference,
        settings.batching.max_batch_size,
        results_tx,
    )?;
    if let Some(label) = settings
        .policy
        .labels
        .keys()
        .find(|l| !pool.manifest.labels.contains(l))
    {
        return Err(PipelineError::Policy(format!(
            "policy.labels.{label}: the model has no such label (it has {:?})",
            pool.manifest.labels
        )));
    }
    tracing::info!(model = %pool.manifest.name, version = %pool.manifest.version, workers = settings.inference.workers, "model loaded");
    health.model_loaded.store(true, Ordering::SeqCst);
    let sink = Sink::new(&settings.kafka)?;
    let (rebalance_tx, rebalance_rx) = mpsc::channel(16);
    let kafka = consumer::create(&settings, rebalance_tx)?;
    {
        let (kafka, bootstrap, timeout) = (
            kafka.clone(),
            settings.kafka.bootstrap_servers.clone(),
            settings.kafka.startup_timeout,
        );
        tokio::task::spawn_blocking(move || {
            consumer::check_connection(&kafka, &bootstrap, timeout)
        })
        .await
        .map_err(|e| consumer::ConsumerError::Refused(e.to_string()))??;
    }
    consumer::subscribe(&kafka, &settings.input.topics)?;
    health.consumer_ready.store(true, Ordering::SeqCst);
    // The consumer reached the cluster; check the producer does too (same
    // brokers, its own credentials).
    {
        let (sink, timeout) = (sink.clone(), settings.kafka.startup_timeout);
        let reachable = tokio::task::spawn_blocking(move || sink.reachable(timeout))
            .await
            .unwrap_or(false);
        health.producer_connected.store(reachable, Ordering::SeqCst);
        if !reachable {
            tracing::warn!("the producer cannot reach the cluster yet; deliveries will retry");
        }
    }
    let (ingest_tx, ingest_rx) = mpsc::channel(1024);
    let pipeline_done = CancellationToken::new();
    let poll = consumer::spawn_poll_loop(
        kafka.clone(),
        ingest_tx,
        settings.kafka.commit_interval,
        shutdown.stop.clone(),
        pipeline_done.clone(),
    )?;
    tracing::info!(topics = ?settings.input.topics, group = %settings.kafka.group_id, "consuming");

    // A drain that cannot finish (deliveries failing) ends after
    // kafka.shutdown_timeout: the rest stays uncommitted for the restart.
    let watchdog = {
        let (stop, abort, timeout) = (
            shutdown.stop.clone(),
            shutdown.abort.clone(),
            settings.kafka.shutdown_timeout,
        );
        tokio::spawn(async move {
            stop.cancelled().await;
            tokio::time::sleep(timeout).await;
            tracing::warn!(
                timeout_s = timeout.as_secs(),
                "shutdown timeout; abandoning undelivered events"
            );
            abort.cancel();
        })
    };
    let (acks_tx, acks_rx) = mpsc::channel(settings.limits.max_in_flight);
    let mut core = Core {
        scores: verdict::Scorer::new(&pool.manifest, &settings.policy),
        settings,
        pool,
        sink,
        kafka,
        abort: shutdown.abort.clone(),
        stop: shutdown.stop.clone(),
        producer_fatal: None,
        partitions: HashMap::new(),
        revoked_at: HashMap::new(),
        ready: VecDeque::new(),
        in_inference: HashMap::new(),
        next_job_id: 0,
        in_flight: 0,
        acks_tx,
        deliveries: TaskTracker::new(),
        pending_revokes: Vec::new(),
        summary: RunSummary::default(),
    };
    core.run(ingest_rx, rebalance_rx, results_rx, acks_rx).await;
    watchdog.abort();
    health.consumer_ready.store(false, Ordering::SeqCst);

    // The poll thread must hold the last handle of the consumer: closing it
    // runs the revoke callback, which may block, and must not on this runtime.
    let Core {
        sink,
        pool,
        summary,
        deliveries,
        kafka,
        producer_fatal,
        ..
    } = core;
    let fatal = kafka.context().fatal_error();
    drop(kafka);
    deliveries.close();
    deliveries.wait().await;
    let _ = tokio::task::spawn_blocking(move || {
        let _ = sink.flush(std::time::Duration::from_secs(5));
        pool.shutdown();
    })
    .await;
    pipeline_done.cancel();
    let _ = tokio::task::spawn_blocking(move || poll.thread.join()).await;
    tracing::debug!("poll thread joined");
    tracing::info!(
        consumed = summary.consumed,
        verdicts = summary.verdicts,
        dlq = summary.dlq,
        abandoned = summary.abandoned,
        "pipeline stopped"
    );
    if let Some(fatal) = fatal {
        return Err(consumer::ConsumerError::Refused(fatal).into());
    }
    if let Some(fatal) = producer_fatal {
        return Err(ProducerError::Fatal(fatal).into());
    }
    if summary.abandoned > 0 {
        return Err(PipelineError::Abandoned(summary.abandoned));
    }
    Ok(summary)
}

struct Core {
    settings: Settings,
    scores: verdict::Scorer,
    pool: InferencePool,
    sink: Sink,
    kafka: Arc<KafkaConsumer>,
    abort: CancellationToken,
    stop: CancellationToken,
    /// A fatal producer error: nothing more can be delivered; the run stops.
    producer_fatal: Option<String>,
    partitions: HashMap<Tp, Partition>,
    /// Generation at which a partition was revoked: older records are stale.
    revoked_at: HashMap<Tp, u64>,
    ready: VecDeque<ReadyBatch>,
    in_inference: HashMap<u64, Vec<ReadyBatch>>,
    next_job_id: u64,
    /// Events accepted and not yet acknowledged (or abandoned).
    in_flight: usize,
    acks_tx: mpsc::Sender<Ack>,
    deliveries: TaskTracker,
    pending_revokes: Vec<PendingRevoke>,
    summary: RunSummary,
}

impl Core {
    async fn run(
        &mut self,
        mut ingest_rx: mpsc::Receiver<Ingested>,
        mut rebalance_rx: mpsc::Receiver<RebalanceEvent>,
        mut results_rx: mpsc::Receiver<InferenceResult>,
        mut acks_rx: mpsc::Receiver<Ack>,
    ) {
        let mut input_open = true;
        loop {
            let wake_at = self.next_wake();
            let accepting = input_open && self.in_flight < self.settings.limits.max_in_flight;
            tokio::select! {
                biased;
                Some(event) = rebalance_rx.recv() => self.on_rebalance(event),
                Some(ack) = acks_rx.recv() => self.on_ack(ack),
                Some(result) = results_rx.recv() => self.on_inference_result(result),
                _ = sleep_until(wake_at) => {}
                record = ingest_rx.recv(), if accepting => match record {
                    Some(record) => self.on_record(record),
                    None => {
                        input_open = false;
                        self.flush_all();
                    }
                },
            }
            self.close_expired();
            self.dispatch();
            self.finish_revokes(false);
            if !input_open && self.in_flight == 0 {
                break;
            }
        }
        self.finish_revokes(true);
    }

    fn next_wake(&self) -> Option<Instant> {
        let batch = self
            .partitions
            .values()
            .filter_map(|p| p.batcher.deadline())
            .min();
        let revoke = self.pending_revokes.iter().map(|r| r.deadline).min();
        batch.into_iter().chain(revoke).min()
    }

    fn on_record(&mut self, record: Ingested) {
        self.summary.consumed += 1;
        if self
            .revoked_at
            .get(&record.tp)
            .is_some_and(|g| record.generation < *g)
        {
            self.summary.stale += 1;
            metrics::counter!(metric::STALE_RECORDS_TOTAL).increment(1);
            return;
        }
        // A revoke whose drain the consumer gave up on ends here, before the
        // partition's new assignment starts.
        if let (Some(old), Some(revoked)) = (
            self.partitions.get(&record.tp),
            self.revoked_at.get(&record.tp),
        ) && old.generation < *revoked
        {
            self.finish_revokes(true);
        }
        let (max_size, max_delay) = (
            self.settings.batching.max_batch_size,
            self.settings.batching.max_batch_delay,
        );
        let partition = self
            .partitions
            .entry(record.tp.clone())
            .or_insert_with(|| Partition {
                generation: record.generation,
                batcher: Batcher::new(max_size, max_delay),
                offsets: crate::offsets::OffsetTracker::new(),
                next_batch_seq: 0,
                next_emit_seq: 0,
                finished: BTreeMap::new(),
            });
        partition.offsets.track(record.offset);
        self.in_flight += 1;
        metrics::gauge!(metric::IN_FLIGHT_EVENTS).set(self.in_flight as f64);

        // Acknowledgements are matched against this partition state's own
        // generation, not the (newer) one a later rebalance stamps on records.
        let generation = partition.generation;
        match event::validate(record.payload.as_deref(), &self.settings.limits) {
            Ok(event) => {
                let urgent = event.priority == Priority::Urgent;
                let pending = Pending {
                    tp: record.tp.clone(),
                    generation,
                    offset: record.offset,
                    key: record.key,
                    payload: record.payload.unwrap_or_default(),
                    event,
                    timestamp_ms: record.timestamp_ms,
                };
                if let Some(batch) = partition.batcher.push(pending, urgent, record.received_at) {
                    self.enqueue(&record.tp, batch);
                }
            }
            Err(rejection) => {
                let out = verdict::dead_letter(
                    &self.settings.output.dlq_topic,
                    &record.tp,
                    record.offset,
                    record.key,
                    record.payload.unwrap_or_default(),
                    &rejection,
                );
                self.deliver(
                    record.tp,
                    generation,
                    record.offset,
                    out,
                    Outcome::Dlq(rejection.reason),
                );
            }
        }
    }

    /// A closed batch joins the dispatch queue; urgent ones go first.
    fn enqueue(&mut self, tp: &Tp, batch: ClosedBatch<Pending>) {
        let Some(partition) = self.partitions.get_mut(tp) else {
            return;
        };
        let waited = batch.opened_at.elapsed().as_secs_f64();
        metrics::histogram!(metric::BATCH_WAIT_SECONDS).record(waited);
        self.summary.batch_wait_seconds += waited;
        self.summary.closed_batches += 1;
        let ready = ReadyBatch {
            tp: tp.clone(),
            generation: partition.generation,
            seq: partition.next_batch_seq,
            items: batch.items,
        };
        partition.next_batch_seq += 1;
        if batch.reason == crate::batcher::CloseReason::Urgent {
            self.ready.push_front(ready);
        } else {
            self.ready.push_back(ready);
        }
    }

    fn close_expired(&mut self) {
        let now = Instant::now();
        let expired: Vec<(Tp, ClosedBatch<Pending>)> = self
            .partitions
            .iter_mut()
            .filter_map(|(tp, p)| p.batcher.close_expired(now).map(|b| (tp.clone(), b)))
            .collect();
        for (tp, batch) in expired {
            self.enqueue(&tp, batch);
        }
    }

    fn flush_all(&mut self) {
        let tps: Vec<Tp> = self.partitions.keys().cloned().collect();
        self.flush(&tps);
    }

    fn flush(&mut self, tps: &[Tp]) {
        for tp in tps {
            if let Some(batch) = self.partitions.get_mut(tp).and_then(|p| p.batcher.flush()) {
                self.enqueue(tp, batch);
            }
        }
    }

    /// Coalesce ready batches (possibly of several partitions) into model runs
    /// of at most `max_batch_size` events, while the workers' queue has room.
    fn dispatch(&mut self) {
        let max = self.settings.batching.max_batch_size;
        let capacity = self.settings.inference.workers * 2;
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
            match self.pool.try_submit(InferenceJob { id, texts }) {
                Ok(()) => {
                    self.in_inference.insert(id, segments);
                }
                Err(_job) => {
                    // Cannot happen while in_inference bounds the queue; keep
                    // the events anyway (texts are gone, so score them as failed).
                    tracing::error!("inference queue full despite the bound");
                    self.in_inference.insert(id, segments);
                    self.on_inference_result(InferenceResult {
                        id,
                        scores: vec![],
                        elapsed: std::time::Duration::ZERO,
                        tokens: Default::default(),
                    });
                }
            }
        }
    }

    fn on_inference_result(&mut self, result: InferenceResult) {
        let Some(segments) = self.in_inference.remove(&result.id) else {
            return;
        };
        metrics::histogram!(metric::INFERENCE_SECONDS).record(result.elapsed.as_secs_f64());
        self.summary.batches += 1;
        self.summary.inference_seconds += result.elapsed.as_secs_f64();
        self.summary.real_tokens += result.tokens.real;
        self.summary.padded_tokens += result.tokens.padded;
        metrics::counter!(metric::TOKENS_REAL_TOTAL).increment(result.tokens.real);
        metrics::counter!(metric::TOKENS_PADDED_TOTAL).increment(result.tokens.padded);
        let mut scores = result.scores.into_iter();
        for segment in segments {
            let scored: Vec<Scored> = segment
                .items
                .into_iter()
                .map(|p| {
                    let s = scores
                        .next()
                        .unwrap_or_else(|| Err("no score returned".to_string()));
                    (p, s)
                })
                .collect();
            match self.partitions.get_mut(&segment.tp) {
                Some(partition) if partition.generation == segment.generation => {
                    partition.finished.insert(segment.seq, scored);
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
        loop {
            let Some(partition) = self.partitions.get_mut(tp) else {
                return;
            };
            let seq = partition.next_emit_seq;
            let Some(scored) = partition.finished.remove(&seq) else {
                return;
            };
            partition.next_emit_seq += 1;
            for (pending, score) in scored {
                let (out, outcome) = match score {
                    Ok(probabilities) => {
                        let (out, label) = self.scores.verdict_record(
                            &self.settings.output.topic,
                            &pending.tp,
                            pending.offset,
                            pending.key,
                            &pending.event,
                            &probabilities,
                            pending.timestamp_ms,
                        );
                        let event_time = pending
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
                            pending.key,
                            pending.payload,
                            &rejection,
                        );
                        (out, Outcome::Dlq(RejectReason::InferenceFailed))
                    }
                };
                self.deliver(pending.tp, pending.generation, pending.offset, out, outcome);
            }
        }
    }

    /// Enqueue one record now; a task reports its acknowledgement.
    fn deliver(&mut self, tp: Tp, generation: u64, offset: i64, out: OutRecord, outcome: Outcome) {
        let delivery = self.sink.deliver(out, self.abort.clone());
        let acks = self.acks_tx.clone();
        let started = Instant::now();
        self.deliveries.spawn(async move {
            let outcome = delivery.await.map(|()| outcome);
            let _ = acks
                .send(Ack {
                    tp,
                    generation,
                    offset,
                    outcome,
                    took: started.elapsed(),
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
                    self.producer_fatal = Some(message);
                    self.stop.cancel();
                    self.abort.cancel();
                }
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
                if let Some(t) = event_time_ms {
                    let ms = (chrono::Utc::now().timestamp_millis() - t).max(0);
                    metrics::histogram!(metric::END_TO_END_SECONDS).record(ms as f64 / 1000.0);
                }
            }
            Outcome::Dlq(reason) => {
                self.summary.dlq += 1;
                metrics::counter!(metric::DLQ_TOTAL, "reason" => reason.code()).increment(1);
            }
        }
        let Some(partition) = self.partitions.get_mut(&ack.tp) else {
            return;
        };
        if partition.generation != ack.generation {
            return;
        }
        partition.offsets.ack(ack.offset);
        if let Some(position) = partition.offsets.take_new_position() {
            consumer::store_position(&self.kafka, &ack.tp, position);
        }
    }

    fn release(&mut self, events: usize) {
        self.in_flight = self.in_flight.saturating_sub(events);
        metrics::gauge!(metric::IN_FLIGHT_EVENTS).set(self.in_flight as f64);
    }

    fn on_rebalance(&mut self, event: RebalanceEvent) {
        match event {
            RebalanceEvent::Assign { partitions } => {
                tracing::debug!(partitions = partitions.len(), "assignment received");
            }
            RebalanceEvent::Revoke {
                partitions,
                generation,
                done,
            } => {
                for tp in &partitions {
                    self.revoked_at.insert(tp.clone(), generation);
                }
                self.flush(&partitions);
                self.pending_revokes.push(PendingRevoke {
                    partitions,
                    deadline: Instant::now() + self.settings.kafka.drain_timeout,
                    done,
                });
            }
        }
    }

    /// Answer revokes whose partitions are drained (or whose time is up).
    fn finish_revokes(&mut self, force: bool) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending_revokes.len() {
            let revoke = &self.pending_revokes[i];
            let drained = revoke.partitions.iter().all(|tp| {
                self.partitions
                    .get(tp)
                    .is_none_or(|p| p.offsets.in_flight() == 0)
            });
            if drained || force || now >= revoke.deadline {
                let revoke = self.pending_revokes.swap_remove(i);
                let revoked: HashSet<&Tp> = revoke.partitions.iter().collect();
                for tp in &revoke.partitions {
                    if let Some(mut partition) = self.partitions.remove(tp) {
                        if let Some(position) = partition.offsets.take_new_position() {
                            consumer::store_position(&self.kafka, tp, position);
                        }
                        let unsent: usize = partition.finished.values().map(Vec::len).sum();
                        self.release(unsent);
                    }
                }
                // Queued batches of revoked partitions will not be scored.
                let before = self.ready.len();
                let mut dropped = 0;
                self.ready.retain(|b| {
                    let keep = !revoked.contains(&b.tp);
                    if !keep {
                        dropped += b.items.len();
                    }
                    keep
                });
                if before != self.ready.len() {
                    self.release(dropped);
                }
                let _ = revoke.done.send(());
            } else {
                i += 1;
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
