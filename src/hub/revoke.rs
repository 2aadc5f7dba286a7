//! The hub's side of a rebalance: drain revoked partitions, answer with
//! their positions, and tell an assignment where the last revoke ended.

use std::collections::HashSet;

use super::{Deliver, Hub};
use crate::partition::Partition;
use crate::rebalance::{Control, Positions};
use crate::telemetry::metric;
use crate::tp::Tp;

impl<D: Deliver> Hub<D> {
    pub(super) fn on_control(&mut self, event: Control) {
        match event {
            Control::Revoke {
                partitions,
                generation,
                done,
            } => {
                let in_flight = partitions
                    .iter()
                    .filter_map(|tp| self.partitions.get(tp))
                    .map(|p| p.in_flight() as u64)
                    .sum::<u64>();
                self.ledger.revoke_started(in_flight);
                self.flush(&partitions);
                self.revokes.start(
                    partitions,
                    generation,
                    self.settings.kafka.drain_timeout,
                    done,
                );
            }
            Control::Assign { partitions, reply } => {
                tracing::debug!(partitions = partitions.len(), "assignment received");
                let _ = reply.send(self.revokes.take_resume(&partitions));
            }
            Control::Resumed { positions } => self.positions.resumed(positions),
            Control::Seal { deadline, reply } => self.on_seal(deadline, reply),
            Control::Unseal => self.on_unseal(),
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
        let ready = self.revokes.ready(force, |tp| {
            partitions.get(tp).map_or(0, Partition::in_flight)
        });
        for (revoked, done) in ready {
            let mut answer = Positions::new();
            for tp in &revoked {
                let mut last_of_state = None;
                if let Some(mut partition) = self.partitions.remove(tp) {
                    self.state_dropped(&mut partition);
                    last_of_state = partition.final_position();
                    self.ledger.dropped(partition.held_back());
                    metrics::gauge!(metric::OLDEST_PENDING_SECONDS, "topic" => tp.topic.to_string(), "partition" => tp.partition.to_string())
                        .set(0.0);
                }
                answer.extend(self.positions.revoked(tp, last_of_state));
            }
            let revoked: HashSet<&Tp> = revoked.iter().collect();
            let dropped = self.drop_queued(&revoked);
            self.ledger.dropped(dropped);
            self.revokes.answer(answer, done);
        }
    }

    /// Take these partitions' batches off the dispatch queue (they will not
    /// be scored); returns how many events they held.
    pub(super) fn drop_queued(&mut self, tps: &HashSet<&Tp>) -> usize {
        let mut dropped = 0;
        for lane in self.lanes.iter_mut() {
            dropped += lane.drop_queued(tps);
        }
        dropped
    }
}
