//! The inference job table: the runs in inference, each with its model's
//! lane and the batches whose events it scores, and the ids jobs (runs and
//! the breakers' probes) are sent and answered under.

use crate::hub::partition::ReadyBatch;
use crate::inference::JobId;
use crate::policy::ModelId;

/// A run in inference: the model's lane and the batches whose events it
/// scores.
pub(super) struct Running {
    pub(super) lane: ModelId,
    pub(super) segments: Vec<ReadyBatch>,
}

#[derive(Default)]
pub(super) struct JobTable {
    // foldhash: looked up per result; the keys are ids this table gave.
    runs: foldhash::HashMap<JobId, Running>,
    next: JobId,
}

impl JobTable {
    /// An id for a job the table does not hold (a breaker's probe).
    pub(super) fn new_id(&mut self) -> JobId {
        self.next.take()
    }

    /// A run sent to `lane`'s workers: its id, under which its result is
    /// matched to its batches.
    pub(super) fn started(&mut self, lane: ModelId, segments: Vec<ReadyBatch>) -> JobId {
        let id = self.new_id();
        self.runs.insert(id, Running { lane, segments });
        id
    }

    /// The lane of run `id`, while it is in inference.
    pub(super) fn lane_of(&self, id: JobId) -> Option<ModelId> {
        self.runs.get(&id).map(|r| r.lane)
    }

    /// Run `id`'s result came back: its batches, once (`None` for an id
    /// the table does not hold).
    pub(super) fn finished(&mut self, id: JobId) -> Option<Running> {
        self.runs.remove(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_answered_once_and_probes_never_collide_with_runs() {
        let mut jobs = JobTable::default();
        let probe = jobs.new_id();
        let run = jobs.started(ModelId(1), Vec::new());
        assert_ne!(probe, run);
        assert_eq!(jobs.lane_of(run), Some(ModelId(1)));
        assert_eq!(jobs.lane_of(probe), None);
        assert!(jobs.finished(probe).is_none());
        assert_eq!(jobs.finished(run).map(|r| r.lane), Some(ModelId(1)));
        assert!(jobs.finished(run).is_none(), "a result is matched once");
    }
}
