//! Micro-batching of one partition's events.
//!
//! Guarantee: every pushed item leaves in exactly one closed batch, in push
//! order; no batch holds more than `max_batch_size` items; a batch closes no
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

#[derive(Debug)]
pub struct Batcher<T> {
    max_batch_size: usize,
    max_batch_delay: Duration,
    items: Vec<T>,
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
            items: Vec::new(),
            opened_at: None,
        }
    }

    /// New limits (the latency target's controller changes them); an open
    /// batch keeps its start and closes by the new deadline.
    pub fn set_limits(&mut self, max_batch_size: usize, max_batch_delay: Duration) {
        self.max_batch_size = max_batch_size.max(1);
        self.max_batch_delay = max_batch_delay;
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// When the open batch must close, if one is open.
    pub fn deadline(&self) -> Option<Instant> {
        self.opened_at.map(|t| t + self.max_batch_delay)
    }

    /// Add an item; returns the batch if this item closed it.
    pub fn push(&mut self, item: T, urgent: bool, now: Instant) -> Option<ClosedBatch<T>> {
        let opened_at = *self.opened_at.get_or_insert(now);
        self.items.push(item);
        let reason = if urgent {
            CloseReason::Urgent
        } else if self.items.len() >= self.max_batch_size {
            CloseReason::Full
        } else if now >= opened_at + self.max_batch_delay {
            // Only reachable with a zero delay: then every push closes.
            CloseReason::Deadline
        } else {
            return None;
        };
        self.close(reason)
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
        assert!(b.push(1, false, Instant::now()).is_none());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            b.push(2, false, Instant::now()).is_none(),
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
        assert!(b.push('a', false, Instant::now()).is_none());
        assert!(b.push('b', false, Instant::now()).is_none());
        let batch = b.push('c', false, Instant::now()).unwrap();
        assert_eq!(batch.items, vec!['a', 'b', 'c']);
        assert_eq!(batch.reason, CloseReason::Full);
        assert!(b.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_urgent_event_closes_its_batch_at_once_keeping_order() {
        let mut b = Batcher::new(100, Duration::from_secs(10));
        b.push(1, false, Instant::now());
        let batch = b.push(2, true, Instant::now()).unwrap();
        assert_eq!(batch.items, vec![1, 2]);
        assert_eq!(batch.reason, CloseReason::Urgent);
    }

    #[test]
    fn flush_returns_the_partial_batch_once() {
        let mut b = Batcher::new(10, DELAY);
        assert!(b.flush().is_none());
        b.push(7, false, Instant::now());
        assert_eq!(b.flush().unwrap().items, vec![7]);
        assert!(b.flush().is_none());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push { urgent: bool },
        Advance(u64),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                6 => proptest::bool::weighted(0.1).prop_map(|urgent| Op::Push { urgent }),
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
            ops in ops(),
        ) {
            let delay = Duration::from_millis(delay_ms);
            let mut b = Batcher::new(max_size, delay);
            let mut now = Instant::now();
            let mut next = 0u32;
            // Each closed batch with the instant it closed.
            let mut out: Vec<(ClosedBatch<u32>, Instant)> = Vec::new();
            for op in ops {
                match op {
                    Op::Push { urgent } => {
                        if let Some(batch) = b.push(next, urgent, now) { out.push((batch, now)); }
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
                if c.reason != CloseReason::Flush {
                    let waited = *closed_at - c.opened_at;
                    prop_assert!(waited <= delay, "waited {:?} > {:?}", waited, delay);
                }
            }
        }
    }
}
