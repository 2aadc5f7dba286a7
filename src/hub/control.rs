//! What the hub answers besides an event's way: the consumer thread's
//! control messages (a rebalance's revoke and assignment; with
//! exactly-once a transaction's seal, unseal and rewind), the hot reload's
//! new models and policies, the state restore's answers, and its timers
//! (the watchdog, the latency controllers, shutdown giving up).

use std::collections::HashSet;

use super::{Deliver, Hub};
use crate::consumer::rebalance::{Control, Positions, Sealed};
use crate::policy::Ruleset;
use crate::producer::ProducerError;
use crate::state::restore::Restored;
use crate::telemetry::metric;
use crate::tp::{Generation, Tp};
use crate::verdict::NewScorer;
use std::sync::Arc;
use tokio::time::Instant;

impl<D: Deliver> Hub<D> {
    pub(super) fn on_control(&mut self, event: Control) {
        match event {
            Control::Revoke {
                partitions,
                generation,
                done,
            } => {
                let in_flight = self.partitions.in_flight_of(&partitions);
                self.ledger.revoke_started(in_flight);
                self.flush(&partitions);
                self.revokes
                    .start(partitions, generation, self.drain_timeout, done);
            }
            Control::Assign { partitions, reply } => {
                tracing::debug!(partitions = partitions.len(), "assignment received");
                let _ = reply.send(self.revokes.take_resume(&partitions));
            }
            Control::Resumed { positions } => self.stages.positions.resumed(positions),
            Control::Seal { deadline, reply } => self.on_seal(deadline, reply),
            Control::Unseal => self.stages.delivery.unseal(),
            Control::Rewind {
                partitions,
                generation,
                done,
            } => self.on_rewind(partitions, generation, done),
        }
    }

    /// Answer revokes whose partitions are drained (or whose time is up):
    /// their state goes, their positions go to the consumer thread with
    /// the answer, and their queued batches will not be scored.
    pub(super) fn finish_revokes(&mut self, force: bool) {
        let partitions = &self.partitions;
        let ready = self
            .revokes
            .ready(force, |tp| partitions.get(tp).map_or(0, |p| p.in_flight()));
        for (revoked, done) in ready {
            let mut answer = Positions::new();
            for tp in &revoked {
                let mut last_of_state = None;
                if let Some(mut partition) = self.partitions.remove(tp) {
                    self.stages.state.dropped(tp);
                    last_of_state = partition.final_position();
                    self.ledger.dropped(partition.held_back());
                    metrics::gauge!(metric::OLDEST_PENDING_SECONDS, "topic" => tp.topic.to_string(), "partition" => tp.partition.to_string())
                        .set(0.0);
                }
                answer.extend(self.stages.positions.revoked(tp, last_of_state));
            }
            let revoked: HashSet<&Tp> = revoked.iter().collect();
            let dropped = self.stages.scoring.drop_queued(&revoked);
            self.ledger.dropped(dropped);
            self.revokes.answer(answer, done);
        }
    }

    /// The consumer thread ends the transaction (see
    /// [`super::stages::delivery::transaction`]).
    fn on_seal(&mut self, deadline: Instant, reply: std::sync::mpsc::Sender<Sealed>) {
        self.stages.delivery.seal(deadline, reply);
    }

    /// Answer a seal once its transaction is done.
    pub(super) fn answer_seal(&mut self) {
        let positions = &self.stages.positions;
        self.stages.delivery.answer_seal(|| positions.all());
    }

    /// The transaction was aborted and the consumer sought `partitions` back
    /// to their committed offsets: everything of theirs in the hub goes
    /// (results still in inference, and acknowledgements of the aborted
    /// records, are dropped when they come back: their partition state is
    /// gone or newer); records polled before `generation` are stale.
    fn on_rewind(
        &mut self,
        partitions: Vec<Tp>,
        generation: Generation,
        done: std::sync::mpsc::Sender<()>,
    ) {
        let rewound: HashSet<&Tp> = partitions.iter().collect();
        let mut dropped = self.stages.delivery.drop_held(&rewound);
        self.flush(&partitions);
        for tp in &partitions {
            if let Some(partition) = self.partitions.remove(tp) {
                self.stages.state.dropped(tp);
                dropped += partition.held_back();
            }
            self.stages.positions.forget(tp);
        }
        dropped += self.stages.scoring.drop_queued(&rewound);
        self.ledger.dropped(dropped);
        self.revokes.rewound(&partitions, generation);
        self.ledger.rewound();
        tracing::debug!(
            partitions = partitions.len(),
            dropped,
            "rewound after an abort"
        );
        let _ = done.send(());
    }

    /// A hot reload's new model version (before any result carries it):
    /// its lane knows it, and scores kept by the old one are not reused.
    pub(super) fn on_scorer(&mut self, new: NewScorer) {
        self.stages.scoring.reloaded(new);
        self.stages.matching.model_reloaded();
    }

    /// A new policy takes over: events accepted from now on are judged by
    /// it (events already accepted keep theirs).
    pub(super) fn on_policy(&mut self, rules: Arc<Ruleset>) {
        let intake = &mut self.stages.intake;
        tracing::info!(from = %intake.rules().version, to = %rules.version, rules = rules.rules().len(), "policy in force");
        self.ledger.policy_loaded(&rules);
        policy_loaded_at();
        intake.set_rules(rules);
    }

    /// A restore's end: the partition's verdicts go out now.
    pub(super) fn on_restored(&mut self, restored: Restored) {
        if let Some(tp) = self.stages.state.restored(restored) {
            self.emit_in_order(&tp);
        }
    }

    /// Shutdown gave up while the breaker holds events: they stay
    /// uncommitted for the restart.
    pub(super) fn give_up_held(&mut self) {
        let held = self.stages.scoring.give_up_held();
        self.ledger.gave_up(held);
    }

    /// The watchdog looks; deliveries failing for the whole service too
    /// long stop the run.
    pub(super) fn check_stalls(&mut self) {
        let failure = self.stages.delivery.service_failure();
        let Some(stop) = self.watchdog.look(&self.partitions, failure) else {
            return;
        };
        if self.stages.delivery.stopped() {
            return;
        }
        if let ProducerError::Service {
            topic,
            lasted_s,
            error,
        } = &stop
        {
            tracing::error!(%topic, lasted_s, error = %error, "stopping: deliveries fail for the whole service");
        }
        self.stages.delivery.stop_for_good(stop);
        self.shutdown.stop.cancel();
        self.shutdown.abort.cancel();
    }

    /// Each model's controller looks again; a new choice applies to that
    /// model's runs, and to every partition's open and next batches.
    pub(super) fn adjust_batching(&mut self) {
        let target = self.target_p99.unwrap_or_default();
        let now = Instant::now();
        let looked = (self.stages.scoring).adjust(now, self.partitions.len(), target);
        let (choice, tokens) = self.stages.scoring.partition_choice();
        if let Some(chosen) = (self.stages.batching).follow(choice, tokens, &mut self.partitions) {
            self.ledger.batching_chosen(chosen);
        }
        metrics::gauge!(metric::BATCHING_SATURATED).set(f64::from(u8::from(looked.saturated)));
        metrics::gauge!(metric::LATENCY_TARGET_MISSED).set(f64::from(u8::from(looked.missed)));
    }
}

/// When the policy in force took over.
pub(super) fn policy_loaded_at() {
    metrics::gauge!(metric::POLICY_LOADED_TIMESTAMP_SECONDS)
        .set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
}
