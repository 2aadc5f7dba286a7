//! The hub's side of entity state ([`crate::state`]): a new partition's
//! state is read back from the changelog before its first verdict, and a
//! dropped partition's state goes with it.

use super::{Deliver, Hub};
use crate::partition::{Partition, StateSlot};
use crate::state::restore::{Job, Restored};
use crate::tp::{Generation, Tp};

/// The restore thread's ends, as the hub holds them.
pub struct Restores {
    pub jobs: std::sync::mpsc::Sender<Job>,
    pub restored: tokio::sync::mpsc::Receiver<Restored>,
}

impl<D: Deliver> Hub<D> {
    /// A partition's first record (`first`, the offset it starts from):
    /// its state is read back before its verdicts go out.
    pub(super) fn restore_state(&mut self, tp: &Tp, generation: Generation, first: i64) {
        let Some(jobs) = &self.restore_jobs else {
            return;
        };
        let Some(partition) = self.partitions.get_mut(tp) else {
            return;
        };
        let cancel = tokio_util::sync::CancellationToken::new();
        partition.set_state(StateSlot::Restoring(cancel.clone()));
        let job = Job {
            tp: tp.clone(),
            generation,
            before: first,
            cancel,
        };
        if jobs.send(job).is_err() {
            tracing::error!(topic = %tp.topic, partition = tp.partition, "the state restore thread is gone; this partition's verdicts wait");
        }
    }

    /// A restore's end: the state takes over and the partition's verdicts
    /// go out. A restore of a partition dropped (or read again) since is
    /// dropped.
    pub(super) fn on_restored(&mut self, restored: Restored) {
        let Restored {
            tp,
            generation,
            mut store,
            ..
        } = restored;
        let Some(partition) = self.partitions.get_mut(&tp) else {
            return;
        };
        if partition.generation() != generation || !partition.restoring() {
            return;
        }
        if let Some(keeper) = self.state.as_mut() {
            keeper.restored(&mut store);
        }
        partition.set_state(StateSlot::Ready(store));
        self.emit_in_order(&tp);
    }

    /// A partition is dropped: its state's charge is given back, or its
    /// restore stopped.
    pub(super) fn state_dropped(&mut self, partition: &mut Partition) {
        match partition.take_state() {
            StateSlot::Off => {}
            StateSlot::Restoring(cancel) => cancel.cancel(),
            StateSlot::Ready(store) => {
                if let Some(keeper) = self.state.as_mut() {
                    keeper.dropped(&store);
                }
            }
        }
    }
}
