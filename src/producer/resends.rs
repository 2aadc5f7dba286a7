//! Re-sends in offset order, per input partition.

use std::collections::BTreeMap;
use std::sync::Arc;
#[cfg(test)]
use std::time::Duration;

use crate::tp::{Source, Tp};

/// Records to be sent again, by input partition: each goes out only when
/// it has the lowest offset waiting in its partition, so that re-sends keep
/// offset order, and a new record of a partition with re-sends waiting
/// queues behind them instead of overtaking them.
/// An offset may wait twice: a partition revoked and assigned back to this
/// instance is consumed again while the first copies' re-sends still run,
/// so each offset counts its places.
#[derive(Default)]
pub(super) struct Resends {
    /// Read per record (foldhash: see the hub's partitions).
    waiting: std::sync::Mutex<foldhash::HashMap<Tp, Line>>,
    turn: tokio::sync::Notify,
}

/// One input partition's records waiting to be sent (again).
#[derive(Default)]
struct Line {
    /// Places by offset.
    places: BTreeMap<i64, usize>,
    /// A record of the partition failed and none sent again since was
    /// acknowledged: the way to the broker is in doubt.
    in_doubt: bool,
}

impl Resends {
    pub(super) fn any_waiting(&self, tp: &Tp) -> bool {
        self.waiting
            .lock()
            .is_ok_and(|w| w.get(tp).is_some_and(|line| !line.places.is_empty()))
    }

    pub(super) fn join(self: &Arc<Self>, source: &Source) -> Place {
        if let Ok(mut w) = self.waiting.lock() {
            *w.entry(source.tp.clone())
                .or_default()
                .places
                .entry(source.offset)
                .or_default() += 1;
        }
        Place {
            resends: self.clone(),
            source: source.clone(),
        }
    }

    /// A record of `tp` failed (it holds a place): its partition's next
    /// re-send goes alone, and the others are queued again once it is
    /// acknowledged.
    pub(super) fn doubt(&self, tp: &Tp) {
        if let Ok(mut w) = self.waiting.lock()
            && let Some(line) = w.get_mut(tp)
        {
            line.in_doubt = true;
        }
    }

    /// A record of `tp` sent again was acknowledged: the re-sends behind it
    /// go out without waiting for each other.
    pub(super) fn confirmed(&self, tp: &Tp) {
        if let Ok(mut w) = self.waiting.lock()
            && let Some(line) = w.get_mut(tp)
        {
            line.in_doubt = false;
        }
    }

    /// Whether a re-send of `tp` must be acknowledged before the next goes.
    pub(super) fn in_doubt(&self, tp: &Tp) -> bool {
        self.waiting
            .lock()
            .is_ok_and(|w| w.get(tp).is_some_and(|line| line.in_doubt))
    }

    /// No earlier offset of the partition waits.
    fn is_first(&self, Source { tp, offset }: &Source) -> bool {
        self.waiting.lock().map_or(true, |w| {
            w.get(tp)
                .and_then(|line| line.places.keys().next())
                .is_none_or(|first| first >= offset)
        })
    }
}

/// A record's place among its partition's re-sends; leaving it (dropping
/// it) lets the next one go.
pub(super) struct Place {
    resends: Arc<Resends>,
    source: Source,
}

impl Place {
    /// Wait until no earlier record of the partition waits.
    pub(super) async fn turn(&self) {
        loop {
            let notified = self.resends.turn.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.resends.is_first(&self.source) {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Ok(mut w) = self.resends.waiting.lock() {
            let Source { tp, offset } = &self.source;
            if let Some(line) = w.get_mut(tp) {
                if let Some(places) = line.places.get_mut(offset) {
                    *places -= 1;
                    if *places == 0 {
                        line.places.remove(offset);
                    }
                }
                if line.places.is_empty() {
                    w.remove(tp);
                }
            }
        }
        self.resends.turn.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(partition: i32, offset: i64) -> Source {
        Source {
            tp: Tp::new("in", partition),
            offset,
        }
    }

    async fn goes_now(place: &Place) -> bool {
        tokio::time::timeout(Duration::from_millis(20), place.turn())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn re_sends_of_a_partition_go_out_in_offset_order() {
        let resends = Arc::new(Resends::default());
        let late = resends.join(&source(0, 5));
        let early = resends.join(&source(0, 3));
        let elsewhere = resends.join(&source(1, 9));
        assert!(resends.any_waiting(&source(0, 0).tp));
        assert!(!goes_now(&late).await, "offset 5 waits for offset 3");
        assert!(goes_now(&early).await);
        assert!(goes_now(&elsewhere).await, "other partitions are not held");
        // Offset 3 handed to librdkafka: 5 is next, and wakes up.
        let waiting = tokio::spawn(async move {
            late.turn().await;
            late
        });
        drop(early);
        let late = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken when its turn came")
            .unwrap();
        drop(late);
        drop(elsewhere);
        assert!(!resends.any_waiting(&source(0, 0).tp));
    }

    /// The same offset twice (its partition came back and was consumed
    /// again while the first copy's re-sends ran): when one copy goes, the
    /// other is not left waiting for a turn that never comes (it was, and
    /// its partition's commits stopped for good).
    #[tokio::test]
    async fn an_offset_waiting_twice_is_never_stuck() {
        let resends = Arc::new(Resends::default());
        let first_copy = resends.join(&source(0, 7));
        let second_copy = resends.join(&source(0, 7));
        let later = resends.join(&source(0, 8));
        assert!(goes_now(&first_copy).await && goes_now(&second_copy).await);
        assert!(
            !goes_now(&later).await,
            "offset 8 waits for both copies of 7"
        );
        drop(first_copy);
        assert!(goes_now(&second_copy).await, "still its turn");
        assert!(!goes_now(&later).await, "7 still waits once");
        drop(second_copy);
        assert!(goes_now(&later).await);
        drop(later);
        assert!(!resends.any_waiting(&source(0, 0).tp));
    }
}
