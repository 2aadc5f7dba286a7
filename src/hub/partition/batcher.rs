//! Micro-batching of one partition's events.
//!
//! Guarantee: every pushed item leaves in exactly one closed batch, in push
//! order; no batch holds more than `max_batch_size` items; with a cost
//! budget (`batching.max_batch_tokens`), no batch of two or more items costs
//! more than the budget (one item over it goes alone); a batch closes no
//! later than `max_batch_delay` after its first item arrived (when the owner
//! calls [`Batcher::close_expired`] at [`Batcher::deadline`]); an urgent item
//! closes its batch at once.
//!
//! The batcher is pure: time is passed in (`now`), so tests drive it with
//! paused tokio time or any instants they like.

use std::time::Duration;

use tokio::time::Instant;

/// Why a batch closed; recorded in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    Full,
    /// The next item would have taken it over its cost budget.
    Budget,
    Deadline,
    Urgent,
    Flush,
}

#[derive(Debug)]
pub struct ClosedBatch<T> {
    pub items: Vec<T>,
    /// When the first item arrived.
    pub opened_at: Instant,
    pub reason: CloseReason,
}

/// What one push closed: the open batch when the item would have taken it
/// over its cost budget, and the item's own batch when the item closed it.
#[derive(Debug)]
pub struct Closed<T> {
    pub before: Option<ClosedBatch<T>>,
    pub with: Option<ClosedBatch<T>>,
}

impl<T> IntoIterator for Closed<T> {
    type Item = ClosedBatch<T>;
    type IntoIter = std::iter::Flatten<std::array::IntoIter<Option<ClosedBatch<T>>, 2>>;
    fn into_iter(self) -> Self::IntoIter {
        [self.before, self.with].into_iter().flatten()
    }
}

#[derive(Debug)]
pub struct Batcher<T> {
    max_batch_size: usize,
    max_batch_delay: Duration,
    /// The most a batch of two or more items may cost (`None`: no budget).
    max_batch_cost: Option<u64>,
    items: Vec<T>,
    cost: u64,
    opened_at: Option<Instant>,
}

impl<T> Batcher<T> {
    pub fn new(max_batch_size: usize, max_batch_delay: Duration) -> Self {
        assert!(
            max_batch_size > 0,
            "max_batch_size is validated to be at least 1"
        );
        Batcher {
            max_batch_size,
            max_batch_delay,
            max_batch_cost: None,
            items: Vec::new(),
            cost: 0,
            opened_at: None,
        }
    }

    /// A cost budget per batch (the tokens of `batching.max_batch_tokens`).
    pub fn with_cost_budget(mut self, max_batch_cost: Option<u64>) -> Self {
        self.max_batch_cost = max_batch_cost;
        self
    }

    /// A new cost budget (a latency controller that counts tokens changes
    /// it); the open batch closes before the next item that would pass it.
    pub fn set_cost_budget(&mut self, max_batch_cost: Option<u64>) {
        self.max_batch_cost = max_batch_cost;
    }

    /// New limits (the latency target's controller changes them); an open
    /// batch keeps its start and closes by the new deadline.
    pub fn set_limits(&mut self, max_batch_size: usize, max_batch_delay: Duration) {
        self.max_batch_size = max_batch_size.max(1);
        self.max_batch_delay = max_batch_delay;
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// When the open batch must close, if one is open.
    pub fn deadline(&self) -> Option<Instant> {
        self.opened_at.map(|t| t + self.max_batch_delay)
    }

    /// Add an item that costs `cost` of the budget; returns what it closed.
    pub fn push(&mut self, item: T, cost: u64, urgent: bool, now: Instant) -> Closed<T> {
        let over_budget = self
            .max_batch_cost
            .is_some_and(|budget| self.cost + cost > budget);
        let before = if over_budget && !self.items.is_empty() {
            self.close(CloseReason::Budget)
        } else {
            None
        };
        let opened_at = *self.opened_at.get_or_insert(now);
        self.items.push(item);
        self.cost += cost;
        let reason = if urgent {
            Some(CloseReason::Urgent)
        } else if self.items.len() >= self.max_batch_size {
            Some(CloseReason::Full)
        } else if self
            .max_batch_cost
            .is_some_and(|budget| self.cost >= budget)
        {
            // Nothing more fits (one item over the budget goes alone).
            Some(CloseReason::Budget)
        } else if now >= opened_at + self.max_batch_delay {
            // Only reachable with a zero delay: then every push closes.
            Some(CloseReason::Deadline)
        } else {
            None
        };
        Closed {
            before,
            with: reason.and_then(|r| self.close(r)),
        }
    }

    /// Close the open batch if its deadline has passed.
    pub fn close_expired(&mut self, now: Instant) -> Option<ClosedBatch<T>> {
        match self.deadline() {
            Some(deadline) if now >= deadline => self.close(CloseReason::Deadline),
            _ => None,
        }
    }

    /// Close whatever is open (revoke, shutdown).
    pub fn flush(&mut self) -> Option<ClosedBatch<T>> {
        self.close(CloseReason::Flush)
    }

    fn close(&mut self, reason: CloseReason) -> Option<ClosedBatch<T>> {
        let opened_at = self.opened_at.take()?;
        self.cost = 0;
        Some(ClosedBatch {
            items: std::mem::take(&mut self.items),
            opened_at,
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DELAY: Duration = Duration::from_millis(50);

    #[tokio::test(start_paused = true)]
    async fn a_lone_event_waits_exactly_the_deadline() {
        let mut b = Batcher::new(8, DELAY);
        let start = Instant::now();
        assert!(b.push(1, 0, false, Instant::now()).with.is_none());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            b.push(2, 0, false, Instant::now()).with.is_none(),
            "the deadline runs from the first event"
        );
        assert_eq!(b.deadline(), Some(start + DELAY));
        tokio::time::sleep(Duration::from_millis(39)).await;
        assert!(b.close_expired(Instant::now()).is_none());
        tokio::time::sleep_until(b.deadline().unwrap()).await;
        let batch = b.close_expired(Instant::now()).unwrap();
        assert_eq!(batch.items, vec![1, 2]);
        assert_eq!(batch.reason, CloseReason::Deadline);
        assert_eq!(Instant::now() - batch.opened_at, DELAY);
        assert!(b.deadline().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_closes_without_waiting() {
        let mut b = Batcher::new(3, DELAY);
        assert!(b.push('a', 0, false, Instant::now()).with.is_none());
        assert!(b.push('b', 0, false, Instant::now()).with.is_none());
        let batch = b.push('c', 0, false, Instant::now()).with.unwrap();
        assert_eq!(batch.items, vec!['a', 'b', 'c']);
        assert_eq!(batch.reason, CloseReason::Full);
        assert!(b.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_urgent_event_closes_its_batch_at_once_keeping_order() {
        let mut b = Batcher::new(100, Duration::from_secs(10));
        let _ = b.push(1, 0, false, Instant::now());
        let batch = b.push(2, 0, true, Instant::now()).with.unwrap();
        assert_eq!(batch.items, vec![1, 2]);
        assert_eq!(batch.reason, CloseReason::Urgent);
    }

    #[test]
    fn flush_returns_the_partial_batch_once() {
        let mut b = Batcher::new(10, DELAY);
        assert!(b.flush().is_none());
        let _ = b.push(7, 0, false, Instant::now());
        assert_eq!(b.flush().unwrap().items, vec![7]);
        assert!(b.flush().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_cost_budget_closes_before_the_post_that_would_overflow_it() {
        let mut b = Batcher::new(64, DELAY).with_cost_budget(Some(100));
        for (item, cost) in [(1, 30), (2, 30), (3, 30)] {
            assert!(b.push(item, cost, false, Instant::now()).with.is_none());
        }
        // 90 + 20 > 100: the open batch closes first, the item opens the next.
        let closed = b.push(4, 20, false, Instant::now());
        let before = closed.before.unwrap();
        assert_eq!(before.items, vec![1, 2, 3]);
        assert_eq!(before.reason, CloseReason::Budget);
        assert!(closed.with.is_none());
        // One post over the budget goes alone, at once, after the open batch.
        let closed: Vec<_> = b.push(5, 500, false, Instant::now()).into_iter().collect();
        let items: Vec<_> = closed.iter().map(|c| c.items.clone()).collect();
        assert_eq!(items, vec![vec![4], vec![5]]);
        assert!(b.is_empty());
        // An urgent post over the budget: both batches close, in order.
        let _ = b.push(6, 10, false, Instant::now());
        let closed = b.push(7, 95, true, Instant::now());
        assert_eq!(closed.before.unwrap().items, vec![6]);
        assert_eq!(closed.with.unwrap().reason, CloseReason::Urgent);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push { urgent: bool, cost: u64 },
        Advance(u64),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                6 => (proptest::bool::weighted(0.1), 1u64..300)
                    .prop_map(|(urgent, cost)| Op::Push { urgent, cost }),
                3 => (0u64..80).prop_map(Op::Advance),
            ],
            0..300,
        )
    }

    proptest! {
        /// No loss, no reorder, size bound, deadline bound, with the owner
        /// closing expired batches at their deadlines the way the pipeline does.
        #[test]
        fn batches_keep_every_item_in_order_within_bounds(
            max_size in 1usize..20,
            delay_ms in 0u64..100,
            budget in proptest::option::of(1u64..1_000),
            ops in ops(),
        ) {
            let delay = Duration::from_millis(delay_ms);
            let mut b = Batcher::new(max_size, delay).with_cost_budget(budget);
            let mut costs = Vec::new();
            let mut now = Instant::now();
            let mut next = 0u32;
            // Each closed batch with the instant it closed.
            let mut out: Vec<(ClosedBatch<u32>, Instant)> = Vec::new();
            for op in ops {
                match op {
                    Op::Push { urgent, cost } => {
                        out.extend(b.push(next, cost, urgent, now).into_iter().map(|c| (c, now)));
                        costs.push(cost);
                        next += 1;
                    }
                    Op::Advance(ms) => {
                        let target = now + Duration::from_millis(ms);
                        while let Some(deadline) = b.deadline().filter(|d| *d <= target) {
                            now = now.max(deadline);
                            if let Some(batch) = b.close_expired(now) { out.push((batch, now)); }
                        }
                        now = target;
                    }
                }
            }
            if let Some(batch) = b.flush() { out.push((batch, now)); }

            let all: Vec<u32> = out.iter().flat_map(|(c, _)| c.items.iter().copied()).collect();
            prop_assert_eq!(all, (0..next).collect::<Vec<_>>(), "lost or reordered");
            for (c, closed_at) in &out {
                prop_assert!(!c.items.is_empty());
                prop_assert!(c.items.len() <= max_size, "batch of {} > {}", c.items.len(), max_size);
                let cost: u64 = c.items.iter().map(|&i| costs[i as usize]).sum();
                if let Some(budget) = budget.filter(|_| c.items.len() > 1) {
                    prop_assert!(cost <= budget, "batch cost {} > {}", cost, budget);
                }
                if c.reason != CloseReason::Flush {
                    let waited = *closed_at - c.opened_at;
                    prop_assert!(waited <= delay, "waited {:?} > {:?}", waited, delay);
                }
            }
        }
    }
}
