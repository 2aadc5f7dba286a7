//! State rules (with `state.changelog_topic`; absent otherwise): the
//! entity state of each owned partition ([`crate::state`]), read back from
//! the changelog before the partition's first verdict, and the state step
//! of each judged event (it counts the event, may raise its verdict, and
//! gives the changelog records that go with it).
//!
//! Guarantee: no verdict of a partition goes out while its state is being
//! read back ([`StateRules::holds`]), so a verdict is never decided from
//! state behind the partition's committed offsets; a restore answered for
//! a partition state dropped since (a revoke, a rewind) is dropped.

use std::sync::mpsc::Sender;

use tokio_util::sync::CancellationToken;

use crate::hub::partition::Pending;
use crate::policy::Verdict;
use crate::state::restore::{Job, Restored};
use crate::state::{Judging, Keeper, Step, Store};
use crate::tp::{Generation, Tp};

/// The restore thread's ends, as the hub holds them.
pub struct Restores {
    pub jobs: Sender<Job>,
    pub restored: tokio::sync::mpsc::Receiver<Restored>,
}

/// The state-rules stage: present with a keeper, absent without.
pub(crate) struct StateRules(Option<Kept>);

struct Kept {
    keeper: Keeper,
    /// Each owned partition's state: being read back, or ready.
    stores: foldhash::HashMap<Tp, Slot>,
    /// The restore thread's jobs.
    jobs: Sender<Job>,
}

/// One partition's state, of the partition state `generation`.
enum Slot {
    /// Being read back; cancelled when the partition is dropped first.
    Restoring {
        generation: Generation,
        cancel: CancellationToken,
    },
    Ready {
        generation: Generation,
        store: Store,
    },
}

impl StateRules {
    /// State rules are off: no event counts, no verdict waits.
    pub(crate) fn off() -> StateRules {
        StateRules(None)
    }

    /// State kept by `keeper`, each new partition's read back by the
    /// restore thread that takes `jobs`.
    pub(crate) fn new(keeper: Keeper, jobs: Sender<Job>) -> StateRules {
        StateRules(Some(Kept {
            keeper,
            stores: Default::default(),
            jobs,
        }))
    }

    /// A partition state's first record (`first`, the offset it starts
    /// from): its state is read back before its verdicts go out.
    pub(crate) fn opened(&mut self, tp: &Tp, generation: Generation, first: i64) {
        self.dropped(tp);
        let Some(kept) = &mut self.0 else {
            return;
        };
        let cancel = CancellationToken::new();
        let job = Job {
            tp: tp.clone(),
            generation,
            before: first,
            cancel: cancel.clone(),
        };
        (kept.stores).insert(tp.clone(), Slot::Restoring { generation, cancel });
        if kept.jobs.send(job).is_err() {
            tracing::error!(topic = %tp.topic, partition = tp.partition, "the state restore thread is gone; this partition's verdicts wait");
        }
    }

    /// Whether `tp`'s verdicts wait for its state to be read back.
    pub(crate) fn holds(&self, tp: &Tp) -> bool {
        self.0
            .as_ref()
            .is_some_and(|kept| matches!(kept.stores.get(tp), Some(Slot::Restoring { .. })))
    }

    /// A restore's end: the state takes over; returns the partition whose
    /// verdicts may go now. A restore of a partition state dropped (or read
    /// again) since is dropped.
    pub(crate) fn restored(&mut self, restored: Restored) -> Option<Tp> {
        let kept = self.0.as_mut()?;
        let Restored {
            tp,
            generation,
            mut store,
            ..
        } = restored;
        let slot = kept.stores.get_mut(&tp)?;
        match slot {
            Slot::Restoring { generation: g, .. } if *g == generation => {}
            _ => return None,
        }
        kept.keeper.restored(&mut store);
        *slot = Slot::Ready { generation, store };
        Some(tp)
    }

    /// A partition is dropped: its state's charge is given back, or its
    /// restore stopped.
    pub(crate) fn dropped(&mut self, tp: &Tp) {
        let Some(kept) = &mut self.0 else {
            return;
        };
        match kept.stores.remove(tp) {
            None => {}
            Some(Slot::Restoring { cancel, .. }) => cancel.cancel(),
            Some(Slot::Ready { store, .. }) => kept.keeper.dropped(&store),
        }
    }

    /// The state step of a scored event judged `verdict` by its models and
    /// lists: the rule that raises it, if one does, and the changelog
    /// records that go with it (none while absent).
    pub(crate) fn step(&mut self, pending: &Pending, verdict: Verdict) -> Step {
        let Some(kept) = &mut self.0 else {
            return Step::default();
        };
        let Some(Slot::Ready { generation, store }) = kept.stores.get_mut(&pending.tp) else {
            return Step::default();
        };
        if *generation != pending.generation {
            return Step::default();
        }
        kept.keeper.step(
            store,
            Judging {
                tp: &pending.tp,
                offset: pending.offset,
                event: &pending.event,
                key: pending.original.key.as_deref(),
                timestamp_ms: pending.original.timestamp_ms,
                rules: &pending.rules,
                verdict,
                score: &|label| label_score(&pending.scores, label),
            },
        )
    }
}

/// The highest score for `label` among the models that scored an event.
fn label_score(scores: &[crate::verdict::ModelScores], label: &str) -> Option<f32> {
    scores
        .iter()
        .filter_map(|m| {
            let at = m.scorer.labels().iter().position(|l| l == label)?;
            m.probabilities.get(at).copied()
        })
        .reduce(f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StateSettings;
    use crate::hub::partition::tests::{pending, tp};

    fn with_user(offset: i64, user: &str) -> Pending {
        let mut p = pending(&tp(0), Generation(1), offset);
        p.event.user_id = Some(user.into());
        p
    }

    fn stage() -> (StateRules, std::sync::mpsc::Receiver<Job>) {
        let settings = StateSettings {
            changelog_topic: Some("state".into()),
            ..StateSettings::default()
        };
        let (jobs, taken) = std::sync::mpsc::channel();
        (
            StateRules::new(Keeper::new(&settings).unwrap(), jobs),
            taken,
        )
    }

    fn restored(generation: u64) -> Restored {
        Restored {
            tp: tp(0),
            generation: Generation(generation),
            store: Store::default(),
            records: 0,
            took: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn absent_it_holds_nothing_and_counts_nothing() {
        let mut state = StateRules::off();
        state.opened(&tp(0), Generation(1), 0);
        assert!(!state.holds(&tp(0)));
        let step = state.step(&with_user(0, "u1"), Verdict::Allow);
        assert!(step.fired.is_none() && step.changelog.is_empty());
    }

    #[test]
    fn a_partitions_verdicts_wait_for_its_own_restore_and_not_an_older_one() {
        let (mut state, taken) = stage();
        state.opened(&tp(0), Generation(1), 40);
        let job = taken.try_recv().expect("a restore job");
        assert_eq!(
            (job.tp, job.generation, job.before),
            (tp(0), Generation(1), 40)
        );
        assert!(state.holds(&tp(0)));
        // Not counted while held: no state to count in yet.
        assert!(
            state
                .step(&with_user(40, "u1"), Verdict::Allow)
                .changelog
                .is_empty()
        );
        // A restore of an older state of the partition is not its.
        assert_eq!(state.restored(restored(0)), None);
        assert!(state.holds(&tp(0)));
        assert_eq!(state.restored(restored(1)), Some(tp(0)));
        assert!(!state.holds(&tp(0)));
        let step = state.step(&with_user(40, "u1"), Verdict::Allow);
        assert_eq!(step.changelog.len(), 1, "the entity's new state");
    }

    #[test]
    fn a_dropped_partitions_restore_is_cancelled_and_its_late_answer_dropped() {
        let (mut state, taken) = stage();
        state.opened(&tp(0), Generation(1), 0);
        let job = taken.try_recv().unwrap();
        state.dropped(&tp(0));
        assert!(job.cancel.is_cancelled());
        assert!(!state.holds(&tp(0)));
        assert_eq!(state.restored(restored(1)), None, "dropped meanwhile");
        assert!(
            state
                .step(&with_user(0, "u1"), Verdict::Allow)
                .changelog
                .is_empty()
        );
    }
}
