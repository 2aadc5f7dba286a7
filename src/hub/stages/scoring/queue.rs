//! A model's queue of closed batches waiting for its workers.
//!
//! Oldest first, except that an urgent batch goes ahead of the normal ones:
//! behind the urgent batches already waiting (first come, first served
//! among them too), and with its own partition's earlier batches moved just
//! ahead of it. A partition's verdicts leave in offset order, so an urgent
//! event's verdict waits for those batches anyway; jumping them would only
//! hold its verdict, and every later one of its partition, until they are
//! scored (reading a backlog where many batches close early as urgent, the
//! queue would run newest first). With several models, the partition's earlier batches waiting in the
//! other models' queues move ahead there too.

use std::collections::VecDeque;

use crate::hub::partition::ReadyBatch;

#[derive(Default)]
pub(super) struct RunQueue {
    batches: VecDeque<ReadyBatch>,
    /// The first `urgent` batches are the urgent part of the queue.
    urgent: usize,
}

impl RunQueue {
    /// A closed batch joins the queue (see the module's doc for where).
    pub(super) fn push(&mut self, batch: ReadyBatch) {
        if !batch.urgent {
            self.batches.push_back(batch);
            return;
        }
        self.promote_earlier(&batch);
        self.batches.insert(self.urgent, batch);
        self.urgent += 1;
    }

    /// `urgent`'s partition's earlier batches waiting here among the normal
    /// ones move to the end of the urgent part, in their order. With several
    /// models an urgent batch calls this on every other model's queue too:
    /// its verdict waits for its partition's earlier batches wherever they
    /// are.
    pub(super) fn promote_earlier(&mut self, urgent: &ReadyBatch) {
        let earlier = |b: &ReadyBatch| {
            b.tp == urgent.tp && b.generation == urgent.generation && b.seq < urgent.seq
        };
        let mut normal = self.batches.split_off(self.urgent);
        let (mut moved, rest): (VecDeque<_>, VecDeque<_>) = normal.drain(..).partition(earlier);
        self.urgent += moved.len();
        self.batches.append(&mut moved);
        self.batches.extend(rest);
    }

    /// Back to the head of the queue: a batch taken for a run that must be
    /// run again (it is the oldest work there is).
    pub(super) fn push_front(&mut self, batch: ReadyBatch) {
        self.batches.push_front(batch);
        self.urgent += 1;
    }

    /// The first batch, to change its events (not its place).
    pub(super) fn front_mut(&mut self) -> Option<&mut ReadyBatch> {
        self.batches.front_mut()
    }

    pub(super) fn pop_front(&mut self) -> Option<ReadyBatch> {
        let batch = self.batches.pop_front()?;
        self.urgent = self.urgent.saturating_sub(1);
        Some(batch)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Events in the queued batches.
    pub(super) fn events(&self) -> usize {
        self.batches.iter().map(|b| b.items.len()).sum()
    }

    /// Their predicted tokens.
    pub(super) fn tokens(&self) -> u64 {
        (self.batches.iter())
            .flat_map(|b| &b.items)
            .map(|p| p.tokens)
            .sum()
    }

    /// Keep only the batches `keep` says to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&ReadyBatch) -> bool) {
        let mut urgent = 0;
        let mut index = 0;
        self.batches.retain(|b| {
            let kept = keep(b);
            if kept && index < self.urgent {
                urgent += 1;
            }
            index += 1;
            kept
        });
        self.urgent = urgent;
    }

    /// Take every batch out.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = ReadyBatch> + '_ {
        self.urgent = 0;
        self.batches.drain(..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::partition::tests::tp;
    use crate::tp::Generation;

    fn batch(partition: i32, seq: u64, urgent: bool) -> ReadyBatch {
        ReadyBatch {
            tp: tp(partition),
            generation: Generation::default(),
            seq,
            items: Vec::new(),
            urgent,
            waited: std::time::Duration::ZERO,
        }
    }

    fn order(q: &mut RunQueue) -> Vec<(i32, u64)> {
        std::iter::from_fn(|| q.pop_front())
            .map(|b| (b.tp.partition, b.seq))
            .collect()
    }

    #[test]
    fn normal_batches_are_taken_oldest_first() {
        let mut q = RunQueue::default();
        for (p, s) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            q.push(batch(p, s, false));
        }
        assert_eq!(order(&mut q), vec![(0, 0), (1, 0), (0, 1), (1, 1)]);
    }

    #[test]
    fn an_urgent_batch_goes_ahead_of_other_partitions_with_its_own_earlier_batches() {
        let mut q = RunQueue::default();
        for (p, s) in [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0)] {
            q.push(batch(p, s, false));
        }
        // Partition 1's urgent batch 2 needs its batches 0 and 1 first.
        q.push(batch(1, 2, true));
        // A second urgent batch queues behind the first, not before it.
        q.push(batch(2, 1, true));
        assert_eq!(
            order(&mut q),
            vec![(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (0, 0), (0, 1)]
        );
    }

    #[test]
    fn a_backlog_of_mostly_urgent_batches_is_still_taken_oldest_first() {
        // Reading a backlog where most batches close early as urgent: the
        // queue must not run newest first (each partition's verdicts would
        // wait for its oldest batch, scored last).
        let mut q = RunQueue::default();
        for s in 0..4 {
            for p in 0..3 {
                q.push(batch(p, s, s % 2 == 1 || p == 2));
            }
        }
        let taken = order(&mut q);
        for p in 0..3 {
            let seqs: Vec<u64> = taken
                .iter()
                .filter(|(q, _)| *q == p)
                .map(|(_, s)| *s)
                .collect();
            assert_eq!(seqs, vec![0, 1, 2, 3], "partition {p}: {taken:?}");
        }
    }

    #[test]
    fn retain_and_push_front_keep_the_urgent_part_in_front() {
        let mut q = RunQueue::default();
        q.push(batch(0, 0, false));
        q.push(batch(1, 0, true));
        q.push(batch(2, 0, true));
        q.retain(|b| b.tp.partition != 1);
        q.push_front(batch(3, 0, false));
        q.push(batch(4, 0, true));
        assert_eq!(order(&mut q), vec![(3, 0), (2, 0), (4, 0), (0, 0)]);
        assert!(q.is_empty());
    }

    #[test]
    fn an_urgent_batch_promotes_its_partitions_earlier_batches_in_another_queue() {
        // Another model's queue: partition 1's batches 0 and 1 wait there
        // behind partition 0's; its urgent batch 2 joins a different queue.
        let mut other = RunQueue::default();
        for (p, s) in [(0, 0), (1, 0), (0, 1), (1, 1), (1, 3)] {
            other.push(batch(p, s, false));
        }
        other.promote_earlier(&batch(1, 2, true));
        // Batch 3 is later than the urgent one: it stays where it was.
        assert_eq!(
            order(&mut other),
            vec![(1, 0), (1, 1), (0, 0), (0, 1), (1, 3)]
        );
    }
}
