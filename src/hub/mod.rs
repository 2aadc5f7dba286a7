//! The hub: the one task that owns all per-partition state, so nothing here
//! needs a lock. It routes each event through the chain of stages
//! ([`stages`]: take in and decode → match → batch → score → judge →
//! compose → deliver → store the position), written out in order in
//! [`route`]; the consumer thread's control messages (rebalances,
//! transaction ends) and the reloads are answered in [`control`].
//!
//! Its loop handles, in priority order: control messages, new scorers from
//! the hot reload (before any result that carries their version), new
//! policies and lists, delivery acknowledgements (futures and the fast
//! way's reports), restored state, inference results, batch deadlines,
//! then new input, and new input only while fewer than
//! `limits.max_in_flight` events are undelivered (beyond that the bounded
//! input channel fills and the consumer pauses its partitions).
//!
//! Guarantees: every consumed record ends as exactly one verdict or one DLQ
//! record (or, for a partition revoked meanwhile, is left uncommitted for its
//! next owner); verdicts of a partition are produced in offset order; a
//! position is sent to the consumer for storing only once every earlier
//! offset of its partition was acknowledged by the broker.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::Settings;
use crate::consumer::Ingested;
use crate::consumer::rebalance::{Control, Positions, Revokes};
use crate::inference::InferenceResult;
use crate::policy::Ruleset;
use crate::producer::ProducerError;
use crate::shutdown::Shutdown;
use crate::state::restore::Restored;
use crate::telemetry::{Health, metric};
use crate::verdict::NewScorer;

mod control;
mod ledger;
mod meters;
pub(crate) mod partition;
mod route;
pub(crate) mod stages;
mod watchdog;

pub use ledger::{MAX_BATCH_CHOICES, RunSummary};
use partition::Partitions;
pub use stages::delivery::{Ack, Deliver};
pub use stages::outputs::shadow;
pub use stages::scoring::ModelLane;
pub use stages::state::Restores;
use stages::{Parts, Stages};

/// At most this many acknowledgements already in are taken in one turn of
/// the hub's loop: its own work (`after_event`, the wake time, polling
/// every channel) is paid once for them, and a control message, a result
/// or a deadline waits behind at most this many. Only acknowledgements:
/// each gives memory back, where a burst of input records would take more
/// in before any is answered.
const ACK_BURST: usize = 64;

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
    /// With state rules: the restore thread's answers.
    pub restored: Option<mpsc::Receiver<Restored>>,
}

pub struct Hub<D: Deliver> {
    /// The owned partitions: each one's batch, undelivered offsets and
    /// reorder buffer.
    partitions: Partitions,
    /// The stages, in the order an event meets them.
    stages: Stages<D>,
    /// Revokes in progress, and the generation each partition was last
    /// revoked at (its older records are stale).
    revokes: Revokes,
    /// `kafka.drain_timeout`: how long a revoke waits for its partitions.
    drain_timeout: Duration,
    /// Events in flight and the run's counts.
    ledger: ledger::Ledger,
    /// Stalled partitions and deliveries failing for the whole service.
    watchdog: watchdog::Watchdog,
    /// With a latency target: the controllers look again at their ticks.
    target_p99: Option<Duration>,
    shutdown: Shutdown,
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
        health: Arc<Health>,
        shutdown: &Shutdown,
    ) -> Self {
        let parts = Parts {
            models,
            rules,
            outbox,
            positions: positions_tx,
            health: health.clone(),
            abort: shutdown.abort.clone(),
        };
        let stages = Stages::new(&settings, parts);
        metrics::gauge!(metric::LATENCY_TARGET_MISSED).set(0.0);
        let first_choice = settings
            .batching
            .target_p99
            .map(|_| stages.batching.choice());
        let ledger = ledger::Ledger::new(
            first_choice,
            settings.limits.max_in_flight,
            stages.intake.rules(),
        );
        control::policy_loaded_at();
        Hub {
            partitions: Partitions::default(),
            stages,
            revokes: Revokes::default(),
            drain_timeout: settings.kafka.drain_timeout,
            ledger,
            watchdog: watchdog::Watchdog::new(&settings, health),
            target_p99: settings.batching.target_p99,
            shutdown: shutdown.clone(),
        }
    }

    /// Record spans of the posts and the model runs (`None`: tracing off).
    pub fn with_traces(mut self, traces: Option<crate::telemetry::traces::Traces>) -> Self {
        self.stages.outputs.set_traces(traces.clone());
        self.stages.scoring.set_traces(traces);
        self
    }

    /// Keep entity state ([`crate::state`]), each new partition's read back
    /// by the restore thread that takes these jobs (`None`: state is off).
    pub fn with_state(
        mut self,
        state: Option<(
            crate::state::Keeper,
            std::sync::mpsc::Sender<crate::state::restore::Job>,
        )>,
    ) -> Self {
        if let Some((keeper, jobs)) = state {
            self.stages.state = stages::state::StateRules::new(keeper, jobs);
        }
        self
    }

    /// Decode input values with these schemas, and write verdicts in Avro
    /// with this encoder.
    pub fn with_formats(
        mut self,
        schemas: Option<Arc<crate::schema::SchemaStore>>,
        verdict_encoder: Option<crate::schema::verdict::VerdictEncoder>,
    ) -> Self {
        self.stages.intake.set_schemas(schemas);
        self.stages.outputs.set_encoder(verdict_encoder);
        self
    }

    /// Match events against lists and waves with this matcher.
    pub fn with_matcher(mut self, matcher: Option<crate::matching::Matcher>) -> Self {
        self.stages.matching.set_matcher(matcher);
        self
    }

    /// Offer every (sampled) live verdict to this shadow model.
    pub fn with_shadow(mut self, shadow: Option<shadow::Shadow>) -> Self {
        self.stages.outputs.set_shadow(shadow);
        self
    }

    /// Run until the input is closed and nothing is in flight; then wait for
    /// the deliveries left and hand the last positions to the consumer.
    /// Returns the counts and the producer error that stopped it, if one did.
    pub async fn run(mut self, mut inputs: Inputs) -> (RunSummary, Option<ProducerError>) {
        let mut input_open = true;
        let abort = self.shutdown.abort.clone();
        // The offsets handed to the producer, each resolving once all its
        // records are acknowledged: polled here, so that an acknowledgement
        // wakes the hub itself (no task, no channel per offset). Those
        // taken without waiting (`now_or_never`, a burst) need no waker: the
        // loop only sleeps after `select!` polled this with its own.
        let mut delivering = FuturesUnordered::new();
        // One timer, moved when the next deadline changes (a new one per
        // turn of the loop would be registered and dropped each time).
        let wake = tokio::time::sleep_until(Instant::now());
        tokio::pin!(wake);
        let mut wake_set = None;
        // Without state, a channel that never yields.
        let (_no_state, empty) = mpsc::channel(1);
        let mut restored = inputs.restored.take().unwrap_or(empty);
        // The fast way's delivery reports (without one, a channel that
        // never yields).
        let (_no_reports, none) = mpsc::unbounded_channel();
        let mut reports = self.stages.delivery.take_reports().unwrap_or(none);
        let mut burst = Vec::with_capacity(ACK_BURST);
        loop {
            delivering.extend(self.stages.delivery.take_outgoing());
            let wake_at = self.next_wake();
            if let Some(at) = wake_at.filter(|at| wake_set != Some(*at)) {
                wake.as_mut().reset(at);
                wake_set = Some(at);
            }
            let open = self.stages.scoring.any_breaker_open();
            let accepting = input_open && self.ledger.has_room() && !open;
            let holding = open && self.stages.scoring.queued() > 0;
            tokio::select! {
                biased;
                Some(control) = inputs.control.recv() => self.on_control(control),
                Some(new) = inputs.scorers.recv() => self.on_scorer(new),
                Some(rules) = inputs.policies.recv() => self.on_policy(rules),
                Some(update) = inputs.matching.recv() => self.stages.matching.apply(update),
                Some(ack) = delivering.next() => {
                    self.on_ack(ack);
                    // One produce response acknowledges many records: those
                    // already in share this turn (and its `after_event`).
                    for _ in 1..ACK_BURST {
                        match delivering.next().now_or_never() {
                            Some(Some(ack)) => self.on_ack(ack),
                            _ => break,
                        }
                    }
                }
                n = reports.recv_many(&mut burst, ACK_BURST), if self.stages.delivery.awaits_reports() => {
                    self.on_reports(burst.drain(..n));
                }
                _ = abort.cancelled(), if self.stages.delivery.awaits_reports() => self.abandon_reported(),
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
        self.wait_out(delivering, reports).await;
        self.stages.positions.flush().await;
        (
            self.ledger.into_summary(),
            self.stages.delivery.into_fatal(),
        )
    }

    /// What is still out when the loop ends (revoked partitions' records)
    /// is waited for, so that the producer is done with it; its answers
    /// count for nothing any more.
    async fn wait_out(
        &mut self,
        mut delivering: FuturesUnordered<futures::future::BoxFuture<'static, Ack>>,
        mut reports: mpsc::UnboundedReceiver<crate::producer::reports::Report>,
    ) {
        let abort = self.shutdown.abort.clone();
        loop {
            delivering.extend(self.stages.delivery.take_outgoing());
            let reported = self.stages.delivery.awaits_reports();
            if delivering.is_empty() && !reported {
                return;
            }
            tokio::select! {
                Some(_) = delivering.next() => {}
                Some(report) = reports.recv(), if reported => {
                    let _ = self.stages.delivery.reported(report);
                }
                _ = abort.cancelled(), if reported => {
                    let _ = self.stages.delivery.abandon_reported();
                }
                else => return,
            }
        }
    }

    /// The work every event of the loop may have made possible.
    fn after_event(&mut self) {
        self.close_expired();
        self.dispatch();
        self.finish_revokes(false);
        self.answer_seal();
        self.stages.positions.send();
        let now = Instant::now();
        if self.watchdog.due(now) {
            self.check_stalls();
        }
        if self.stages.scoring.next_tick().is_some_and(|t| now >= t) {
            self.adjust_batching();
        }
    }

    /// When the loop must wake with nothing else to do: a batch's deadline,
    /// a revoke's or a seal's, positions to hand over again, the watchdog,
    /// a breaker's probe, a latency controller's tick.
    fn next_wake(&self) -> Option<Instant> {
        let stages = &self.stages;
        [
            stages.batching.next_deadline(),
            self.revokes.next_deadline(),
            stages.delivery.seal_deadline(),
            stages.positions.retry_at(),
            self.watchdog.next_look(self.ledger.in_flight()),
            stages.scoring.next_probe(),
            stages.scoring.next_tick(),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

#[cfg(test)]
mod tests;
