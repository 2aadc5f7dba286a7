//! Batch: how every partition's batches close. The size, deadline and
//! token budget in force (fixed, or chosen by the models' latency
//! controllers: each partition closes its batches at the smallest size,
//! token budget and earliest deadline of them, see
//! [`super::scoring::Lanes::partition_choice`]), and the open batches'
//! deadlines in time order ([`deadlines`]). The batches themselves are
//! each partition's ([`crate::hub::partition`]).

use tokio::time::Instant;

use super::scoring::slo::Choice;
use crate::hub::partition::{Partition, Partitions};
use crate::telemetry::metric;
use crate::tp::{Generation, Tp};

mod deadlines;

use deadlines::Deadlines;

pub(crate) struct Batching {
    /// The partitions' batch size and deadline now.
    choice: Choice,
    /// The partitions' budget of predicted tokens per batch now
    /// (`batching.max_batch_tokens`, or less where a controller chose less).
    tokens: Option<u64>,
    /// The open batches' deadlines in time order.
    deadlines: Deadlines,
}

impl Batching {
    /// `choice` and `tokens`: the lanes' at start.
    pub(crate) fn new(choice: Choice, tokens: Option<u64>) -> Batching {
        export_choice(choice);
        Batching {
            choice,
            tokens,
            deadlines: Deadlines::default(),
        }
    }

    /// The partitions' batch size and deadline now.
    pub(crate) fn choice(&self) -> Choice {
        self.choice
    }

    /// The partitions' token budget per batch now.
    #[cfg(test)]
    pub(crate) fn tokens(&self) -> Option<u64> {
        self.tokens
    }

    /// A new partition's state, batching by what is in force.
    pub(crate) fn partition(&self, tp: Tp, generation: Generation) -> Partition {
        Partition::new(tp, generation, self.choice.size, self.choice.delay)
            .with_token_budget(self.tokens)
    }

    /// After an event joined `partition`'s batch: a batch opened, or the
    /// open one's deadline moved from `before`.
    pub(crate) fn joined(&mut self, partition: &Partition, before: Option<Instant>) {
        if let Some(due) = partition.deadline().filter(|d| Some(*d) != before) {
            self.deadlines.opened(due, partition.tp());
        }
    }

    /// When the loop must wake to close a batch.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.next()
    }

    /// The open batches due by `now`, closed, in deadline order.
    pub(crate) fn close_due(
        &mut self,
        now: Instant,
        partitions: &mut Partitions,
    ) -> Vec<crate::hub::partition::ReadyBatch> {
        let mut closed = Vec::new();
        for tp in self.deadlines.due(now) {
            let Some(partition) = partitions.get_mut(&tp) else {
                continue;
            };
            closed.extend(partition.close_expired(now));
            if let Some(later) = partition.deadline() {
                self.deadlines.opened(later, &tp);
            }
        }
        closed
    }

    /// The lanes chose anew: if that changes what is in force, every
    /// partition's open and next batches take it (their deadlines move
    /// with it). Returns the new choice if it changed.
    pub(crate) fn follow(
        &mut self,
        choice: Choice,
        tokens: Option<u64>,
        partitions: &mut Partitions,
    ) -> Option<Choice> {
        if choice == self.choice && tokens == self.tokens {
            return None;
        }
        self.tokens = tokens;
        self.set(choice, partitions);
        Some(choice)
    }

    /// Every partition's open and next batches take `choice` (and the
    /// token budget in force).
    pub(crate) fn set(&mut self, choice: Choice, partitions: &mut Partitions) {
        self.choice = choice;
        for partition in partitions.values_mut() {
            partition.set_batching(choice.size, choice.delay, self.tokens);
        }
        let open =
            (partitions.iter()).filter_map(|(tp, p)| p.deadline().map(|at| (at, tp.clone())));
        self.deadlines.rebuild(open);
        export_choice(choice);
        metrics::gauge!(metric::BATCH_TARGET_TOKENS).set(self.tokens.unwrap_or(0) as f64);
    }

    /// Deadline entries held (stale ones included).
    #[cfg(test)]
    pub(crate) fn deadlines_held(&self) -> usize {
        self.deadlines.len()
    }
}

/// The partitions' batch size and deadline in use, as metrics.
fn export_choice(choice: Choice) {
    metrics::gauge!(metric::BATCH_TARGET_SIZE).set(choice.size as f64);
    metrics::gauge!(metric::BATCH_TARGET_DELAY_SECONDS).set(choice.delay.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn choice(size: usize, ms: u64) -> Choice {
        Choice {
            size,
            delay: Duration::from_millis(ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_partitions_batch_closes_at_its_deadline_and_a_new_choice_moves_it() {
        let mut batching = Batching::new(choice(4, 20), None);
        let mut partitions = Partitions::default();
        let tp = Tp::new("posts", 0);
        let mut p = batching.partition(tp.clone(), Generation(0));
        p.track(0);
        let before = p.deadline();
        let event = crate::hub::partition::tests::pending(&tp, Generation(0), 0);
        let closed = p.push(event, false, Instant::now());
        assert!(closed.iter().all(Option::is_none), "open");
        batching.joined(&p, before);
        partitions.insert(tp.clone(), p);
        let start = Instant::now();
        assert_eq!(
            batching.next_deadline(),
            Some(start + Duration::from_millis(20))
        );
        // A controller shortens the deadline: the open batch takes it too.
        assert_eq!(
            batching.follow(choice(4, 5), None, &mut partitions),
            Some(choice(4, 5))
        );
        assert_eq!(batching.follow(choice(4, 5), None, &mut partitions), None);
        assert_eq!(
            batching.next_deadline(),
            Some(start + Duration::from_millis(5))
        );
        tokio::time::advance(Duration::from_millis(4)).await;
        assert!(
            batching
                .close_due(Instant::now(), &mut partitions)
                .is_empty()
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        let closed = batching.close_due(Instant::now(), &mut partitions);
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].items.len(), 1);
        assert_eq!(batching.deadlines_held(), 0);
    }
}
