//! The hub: the one task that owns all per-partition state, so nothing here
//! needs a lock. Its loop handles, in priority order: the consumer
//! thread's control messages (rebalances, transaction ends), new scorers
//! from the hot reload (before any result that carries their version),
//! delivery acknowledgements, inference results, batch deadlines, then new
//! input, and new input only while fewer than `limits.max_in_flight` events are
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

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::consumer::Ingested;
use crate::inference::InferenceResult;
use crate::partition::Partition;
use crate::policy::Ruleset;
use crate::producer::{ProducerError, ServiceFailure};
use crate::rebalance::{Control, Positions, Revokes};
use crate::record::{OutRecord, RecordKind};
use crate::shutdown::Shutdown;
use crate::slo::Choice;
use crate::telemetry::{Health, StallKind, StallReporter, metric};
use crate::tp::{Generation, Source, Tp};
use crate::verdict::NewScorer;
use std::sync::Arc;

mod batching;
mod breaker;
mod deadlines;
mod delivery;
mod dispatch;
mod intake;
mod jobs;
mod lanes;
mod ledger;
mod matching;
mod meters;
mod outputs;
mod positions;
mod queue;
mod revoke;
mod state;
mod transaction;
mod watchdog;

pub use lanes::ModelLane;
use lanes::{Lane, Lanes};
use outputs::{Outcome, Outgoing};
use positions::PositionBook;
pub use state::Restores;
use watchdog::STALL_CHECK;

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
    /// Revokes of this member's partitions, and the events that were in
    /// flight in the revoked partitions when each began (drained before the
    /// answer, or left uncommitted for the next owner).
    pub revokes: u64,
    pub revoked_in_flight: u64,
    /// Exactly-once: aborted transactions whose partitions were read again,
    /// and records whose delivery failed inside a transaction (it aborts).
    pub rewinds: u64,
    pub aborted_records: u64,
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
    /// The faults this run met and got past (commit and delivery failures,
    /// re-sends, the most partitions stalled at once).
    pub faults: crate::telemetry::FaultCounts,
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

    /// A delivery failure concerning the whole service that lasts now.
    fn service_failure(&self) -> Option<ServiceFailure> {
        None
    }
}

/// What an offset's delivery resolves to.
pub struct Ack {
    tp: Tp,
    generation: Generation,
    offset: i64,
    outcome: Result<Outcome, ProducerError>,
    kind: RecordKind,
    /// Copies refused for good (reported once the offset is committed).
    refused_copies: Vec<delivery::Refused>,
    /// Enqueue to acknowledgement.
    took: std::time::Duration,
    /// When the consumer thread polled the input record.
    received_at: Instant,
    /// With exactly-once: the transaction it was handed over in.
    txn: transaction::TxnEpoch,
}

/// The input record an output answers: its partition, the generation of
/// the partition state that accepted it, and its offset.
#[derive(Debug, Clone)]
struct InputOffset {
    tp: Tp,
    generation: Generation,
    offset: i64,
}

/// What an input record holds until its outputs are acknowledged: when
/// the consumer thread polled it, and its share of the byte budget (given
/// back when dropped).
struct Hold {
    received_at: Instant,
    bytes: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// An input record's outputs, ready to be handed to the producer.
struct ReadyOutput {
    at: InputOffset,
    out: Outgoing,
    outcome: Outcome,
    hold: Hold,
}

/// The hub's inputs.
pub struct Inputs {
    pub records: mpsc::Receiver<Ingested>,
    pub control: mpsc::Receiver<Control>,
    pub results: mpsc::Receiver<InferenceResult>,
    /// New model versions from the hot reload, each before any result
    /// carries its version.
    pub scorers: mpsc::Receiver<NewScorer>,
    /// New policies (the policy file changed, or SIGHUP): events accepted
    /// from then on are judged by it.
    pub policies: mpsc::Receiver<Arc<Ruleset>>,
    /// List changes (a list file read again, the list topic's items).
    pub matching: mpsc::Receiver<crate::matching::Update>,
}

pub struct Hub<D: Deliver> {
    settings: Settings,
    /// One lane per model, in the order they score an event.
    lanes: Lanes,
    /// The policy new events are judged by.
    rules: Arc<Ruleset>,
    outbox: D,
    abort: CancellationToken,
    stop: CancellationToken,
    /// A fatal producer error: nothing more can be delivered; the run stops.
    producer_fatal: Option<ProducerError>,
    // foldhash: these are looked up per event and per acknowledgement,
    // where SipHash's DoS resistance buys nothing (keys are the assignment).
    partitions: foldhash::HashMap<Tp, Partition>,
    revokes: Revokes,
    /// The positions for the consumer thread to store.
    positions: PositionBook,
    /// Runs in inference, matched to their results.
    jobs: jobs::JobTable,
    /// Offsets handed to the producer since the loop last looked, each
    /// resolving to its acknowledgement (the loop polls them).
    outgoing: Vec<BoxFuture<'static, Ack>>,
    /// Events in flight and the run's counts.
    ledger: ledger::Ledger,
    /// The watchdog: partitions stalled now, and when it looks next.
    health: std::sync::Arc<Health>,
    stalls: StallReporter,
    next_stall_check: Instant,
    /// The partitions' batch size and deadline now (from the lanes'
    /// choices: fixed, or their latency controllers').
    batch: Choice,
    /// The partitions' budget of predicted tokens per batch now
    /// (`batching.max_batch_tokens`, or less where a controller chose less).
    batch_tokens: Option<u64>,
    /// The open batches' deadlines in time order.
    deadlines: deadlines::Deadlines,
    /// Predicts each post's tokens for `batching.max_batch_tokens`, learning
    /// from the token models' runs.
    token_estimate: crate::tokens::TokenEstimate,
    /// With `kafka.delivery = "exactly_once"`: the open transaction's state.
    txn: Option<transaction::TxnBoundary>,
    /// Reads events from records, by each topic's mapping.
    decoder: crate::event::Decoder,
    /// With a Schema Registry input format: the schemas the stage fetched.
    schemas: Option<Arc<crate::schema::SchemaStore>>,
    /// Per-event metric handles.
    meters: meters::Meters,
    /// With `[matching]`: the known-bad lists and the wave clusters.
    matcher: Option<crate::matching::Matcher>,
    /// Composes the records that answer an event.
    outputs: outputs::Composer,
    /// With `state.changelog_topic`: what all partitions' entity state
    /// holds, and the restore thread's jobs and answers.
    state: Option<crate::state::Keeper>,
    restore_jobs: Option<std::sync::mpsc::Sender<crate::state::restore::Job>>,
    restored: Option<mpsc::Receiver<crate::state::restore::Restored>>,
    /// With `[tracing]`: each model run's span (the posts' are the
    /// composer's).
    traces: Option<crate::telemetry::traces::Traces>,
}

impl<D: Deliver> Hub<D> {
    /// `models`: one per model, in the order they score an event; `rules`:
    /// the policy at start.
    pub fn new(
        settings: Settings,
        models: Vec<ModelLane>,
        rules: Ruleset,
        outbox: D,
        positions_tx: async_channel::Sender<Positions>,
        health: std::sync::Arc<Health>,
        shutdown: &Shutdown,
    ) -> Self {
        let settings_eos = settings.kafka.exactly_once();
        let decoder = crate::event::Decoder::new(&settings.input, &settings.limits);
        let lanes: Vec<Lane> = models
            .into_iter()
            .map(|m| Lane::new(m, &settings.batching))
            .collect();
        let batch = lanes::partition_choice(&lanes);
        let batch_tokens = lanes::partition_tokens(&lanes);
        batching::export_choice(batch);
        let token_estimate =
            crate::tokens::TokenEstimate::new(lanes.iter().filter_map(Lane::max_length).max());
        metrics::gauge!(metric::LATENCY_TARGET_MISSED).set(0.0);
        let rules = Arc::new(rules);
        let meters = meters::Meters::new(&rules);
        policy_loaded_at();
        Hub {
            lanes: Lanes::new(lanes),
            rules,
            outbox,
            abort: shutdown.abort.clone(),
            stop: shutdown.stop.clone(),
            producer_fatal: None,
            partitions: Default::default(),
            revokes: Revokes::default(),
            positions: PositionBook::new(positions_tx),
            jobs: jobs::JobTable::default(),
            outgoing: Vec::new(),
            ledger: ledger::Ledger::new(settings.batching.target_p99.map(|_| batch)),
            stalls: StallReporter::new(StallKind::Undelivered, health.clone()),
            health,
            next_stall_check: Instant::now() + STALL_CHECK,
            batch,
            batch_tokens,
            token_estimate,
            deadlines: Default::default(),
            txn: settings_eos.then(transaction::TxnBoundary::default),
            decoder,
            schemas: None,
            meters,
            matcher: None,
            outputs: outputs::Composer::new(&settings),
            state: None,
            restore_jobs: None,
            restored: None,
            traces: None,
            settings,
        }
    }

    /// Record spans of the posts and the model runs (`None`: tracing off).
    pub fn with_traces(mut self, traces: Option<crate::telemetry::traces::Traces>) -> Self {
        self.outputs.set_traces(traces.clone());
        self.traces = traces;
        self
    }

    /// Keep entity state ([`crate::state`]), each new partition's read back
    /// by this restore thread (`None`: state is off).
    pub fn with_state(mut self, state: Option<(crate::state::Keeper, Restores)>) -> Self {
        let Some((keeper, restores)) = state else {
            return self;
        };
        self.state = Some(keeper);
        self.restore_jobs = Some(restores.jobs);
        self.restored = Some(restores.restored);
        self
    }

    /// Decode input values with these schemas, and write verdicts in Avro
    /// with this encoder.
    pub fn with_formats(
        mut self,
        schemas: Option<Arc<crate::schema::SchemaStore>>,
        verdict_encoder: Option<crate::schema::verdict::VerdictEncoder>,
    ) -> Self {
        self.schemas = schemas;
        self.outputs.set_encoder(verdict_encoder);
        self
    }

    /// Match events against lists and waves with this matcher.
    pub fn with_matcher(mut self, matcher: Option<crate::matching::Matcher>) -> Self {
        self.matcher = matcher;
        self
    }

    /// Offer every (sampled) live verdict to this shadow model.
    pub fn with_shadow(mut self, shadow: Option<crate::shadow::Shadow>) -> Self {
        self.outputs.set_shadow(shadow);
        self
    }

    /// Run until the input is closed and nothing is in flight; then wait for
    /// the deliveries left and hand the last positions to the consumer.
    /// Returns the counts and the producer error that stopped it, if one did.
    pub async fn run(mut self, mut inputs: Inputs) -> (RunSummary, Option<ProducerError>) {
        let mut input_open = true;
        let abort = self.abort.clone();
        // The offsets handed to the producer, each resolving once all its
        // records are acknowledged: polled here, so that an acknowledgement
        // wakes the hub itself (no task, no channel per offset).
        let mut delivering = FuturesUnordered::new();
        // One timer, moved when the next deadline changes (a new one per
        // turn of the loop would be registered and dropped each time).
        let wake = tokio::time::sleep_until(Instant::now());
        tokio::pin!(wake);
        let mut wake_set = None;
        // Without state, a channel that never yields.
        let (_no_state, empty) = mpsc::channel(1);
        let mut restored = self.restored.take().unwrap_or(empty);
        loop {
            delivering.extend(self.outgoing.drain(..));
            let wake_at = self.next_wake();
            if let Some(at) = wake_at.filter(|at| wake_set != Some(*at)) {
                wake.as_mut().reset(at);
                wake_set = Some(at);
            }
            let open = self.any_breaker_open();
            let accepting =
                input_open && self.ledger.in_flight() < self.settings.limits.max_in_flight && !open;
            let holding = open && self.queued() > 0;
            tokio::select! {
                biased;
                Some(control) = inputs.control.recv() => self.on_control(control),
                Some(new) = inputs.scorers.recv() => {
                    if let Some(lane) = self.lanes.get_mut(new.model) {
                        lane.reloaded(new.version, new.scorer);
                    }
                    if let Some(matcher) = &mut self.matcher {
                        matcher.model_reloaded();
                    }
                }
                Some(rules) = inputs.policies.recv() => self.on_policy(rules),
                Some(update) = inputs.matching.recv() => self.on_match_update(update),
                Some(ack) = delivering.next() => self.on_ack(ack),
                Some(done) = restored.recv() => self.on_restored(done),
                Some(result) = inputs.results.recv() => self.on_inference_result(result),
                _ = abort.cancelled(), if holding => self.give_up_held(),
                _ = &mut wake, if wake_at.is_some() => wake_set = None,
                record = inputs.records.recv(), if accepting => match record {
                    Some(record) => self.on_record(record),
                    None => {
                        input_open = false;
                        self.flush_all();
                    }
                },
            }
            self.after_event();
            if !input_open && self.ledger.in_flight() == 0 {
                break;
            }
        }
        self.finish_revokes(true);
        delivering.extend(self.outgoing.drain(..));
        while delivering.next().await.is_some() {}
        self.positions.flush().await;
        (self.ledger.into_summary(), self.producer_fatal)
    }

    /// The work every event of the loop may have made possible.
    fn after_event(&mut self) {
        self.close_expired();
        self.dispatch();
        self.finish_revokes(false);
        self.answer_seal();
        self.positions.send();
        let now = Instant::now();
        if now >= self.next_stall_check {
            self.check_stalls();
        }
        if self.next_slo_tick().is_some_and(|t| now >= t) {
            self.adjust_batching();
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        let batch = self.deadlines.next();
        let watchdog = (self.ledger.in_flight() > 0 || !self.stalls.is_empty())
            .then_some(self.next_stall_check);
        let slo = self.next_slo_tick();
        let probe = self.lanes.iter().filter_map(Lane::next_probe).min();
        // Positions waiting for the consumer thread to take the last batch.
        let positions = self.positions.retry_at();
        let seal = self
            .txn
            .as_ref()
            .and_then(transaction::TxnBoundary::deadline);
        batch
            .into_iter()
            .chain(self.revokes.next_deadline())
            .chain(seal)
            .chain(positions)
            .chain(watchdog)
            .chain(probe)
            .chain(slo)
            .min()
    }

    /// The earliest tick of a lane's latency controller.
    fn next_slo_tick(&self) -> Option<Instant> {
        self.lanes.iter().filter_map(Lane::next_tick).min()
    }

    /// A new policy takes over: events accepted from now on are judged by
    /// it (events already accepted keep theirs).
    fn on_policy(&mut self, rules: Arc<Ruleset>) {
        tracing::info!(from = %self.rules.version, to = %rules.version, rules = rules.rules().len(), "policy in force");
        self.meters.policy_loaded(&rules);
        policy_loaded_at();
        self.rules = rules;
    }
}

/// When the policy in force took over.
fn policy_loaded_at() {
    metrics::gauge!(metric::POLICY_LOADED_TIMESTAMP_SECONDS)
        .set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
}

#[cfg(test)]
mod tests;
