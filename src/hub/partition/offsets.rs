//! Which offset of a partition may be committed.
//!
//! Guarantee: the position handed out by [`OffsetTracker::position`] never
//! passes an event whose verdict or dead-letter record has not been
//! acknowledged by the broker, whatever order acknowledgements arrive in. When
//! every tracked event is acknowledged it reaches `last + 1`, so a restart
//! resumes exactly after the last delivered event.

use std::collections::BTreeMap;

use tokio::time::Instant;

/// Kafka's committed offset is the position of the *next* record to read,
/// not the last one processed: after delivering offset 41 we commit 42.
/// This is the only place that rule is written down.
pub fn next_offset(last_delivered: i64) -> i64 {
    last_delivered + 1
}

/// Offsets of one assigned partition that were consumed and are not yet
/// delivered.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    /// Undelivered offsets, with when each was tracked.
    pending: BTreeMap<i64, Instant>,
    highest_tracked: Option<i64>,
    last_reported: Option<i64>,
}

impl OffsetTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Record a consumed offset; offsets of a partition arrive in order.
    pub fn track(&mut self, offset: i64) {
        self.pending.insert(offset, Instant::now());
        self.highest_tracked = Some(self.highest_tracked.map_or(offset, |h| h.max(offset)));
    }

    /// Record that the offset's verdict or DLQ record was acknowledged.
    pub fn ack(&mut self, offset: i64) {
        self.pending.remove(&offset);
    }

    /// Events consumed and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The offset to commit: the first undelivered one, or the one after the
    /// highest tracked when all are delivered.
    pub fn position(&self) -> Option<i64> {
        match self.pending.first_key_value() {
            Some((&first_undelivered, _)) => Some(first_undelivered),
            None => self.highest_tracked.map(next_offset),
        }
    }

    /// The first undelivered offset and when it was tracked.
    pub fn oldest_pending(&self) -> Option<(i64, Instant)> {
        self.pending.first_key_value().map(|(o, t)| (*o, *t))
    }

    /// The position if it moved since the last call (to store it once).
    pub fn take_new_position(&mut self) -> Option<i64> {
        let position = self.position()?;
        if self.last_reported.is_some_and(|last| last >= position) {
            return None;
        }
        self.last_reported = Some(position);
        Some(position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn next_offset_is_one_past_the_last_delivered() {
        assert_eq!(next_offset(0), 1);
        assert_eq!(next_offset(41), 42);
    }

    #[test]
    fn position_waits_for_the_earliest_undelivered_event() {
        let mut t = OffsetTracker::new();
        assert_eq!(t.position(), None);
        for o in 10..15 {
            t.track(o);
        }
        t.ack(12);
        t.ack(13);
        assert_eq!(t.position(), Some(10));
        t.ack(10);
        assert_eq!(t.take_new_position(), Some(11));
        assert_eq!(
            t.take_new_position(),
            None,
            "unchanged position is reported once"
        );
        t.ack(11);
        assert_eq!(t.position(), Some(14));
        t.ack(14);
        assert_eq!(t.take_new_position(), Some(15));
        assert_eq!(t.in_flight(), 0);
    }

    proptest! {
        /// For any order of acknowledgements, the committable position never
        /// passes an unacknowledged event, and reaches last + 1 at the end.
        #[test]
        fn committed_never_passes_an_unacknowledged_event(
            gaps in proptest::collection::vec(1i64..4, 1..200),
            seed in any::<u64>(),
        ) {
            let mut offsets = Vec::new();
            let mut o = 0i64;
            for g in gaps { o += g; offsets.push(o); }
            let mut t = OffsetTracker::new();
            for &o in &offsets { t.track(o); }
            // A deterministic shuffle driven by the seed.
            let mut order = offsets.clone();
            let mut s = seed | 1;
            for i in (1..order.len()).rev() {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                order.swap(i, (s % (i as u64 + 1)) as usize);
            }
            let mut unacked: BTreeSet<i64> = offsets.iter().copied().collect();
            let mut last_position = i64::MIN;
            for o in order {
                t.ack(o);
                unacked.remove(&o);
                let p = t.position().unwrap();
                if let Some(&first) = unacked.first() {
                    prop_assert!(p <= first, "position {} passes unacknowledged {}", p, first);
                }
                prop_assert!(p >= last_position, "position went backwards");
                last_position = p;
            }
            prop_assert_eq!(t.position(), Some(next_offset(*offsets.last().unwrap())));
        }
    }
}
