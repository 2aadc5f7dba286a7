//! One entity's state: its events and verdicts per minute of event time
//! (the last 24 h of them), its events with a label's score above a
//! threshold per minute, the distinct values of fields it sent, and the
//! verdicts of its last events, in the form the changelog carries.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::policy::Verdict;
use crate::policy::state_rules::{Counter, DISTINCT_CAP, MAX_WINDOW_MINUTES, Tally};

/// A minute of an entity's events: `[minute, posts, allows, reviews, blocks]`
/// (minutes since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Bucket(u32, u32, u32, u32, u32);

impl Bucket {
    fn minute(&self) -> u32 {
        self.0
    }

    fn tally(&self, tally: &Tally) -> u32 {
        match tally {
            Tally::Posts => self.1,
            Tally::Verdicts(Verdict::Allow) => self.2,
            Tally::Verdicts(Verdict::Review) => self.3,
            Tally::Verdicts(Verdict::Block) => self.4,
            // Kept beside the buckets (EntityState::over).
            Tally::Over(_) => 0,
        }
    }

    fn count(&mut self, verdict: Verdict) {
        let n = match verdict {
            Verdict::Allow => &mut self.2,
            Verdict::Review => &mut self.3,
            Verdict::Block => &mut self.4,
        };
        *n = n.saturating_add(1);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntityState {
    /// In minute order, none older than the newest minus the longest window.
    #[serde(rename = "b")]
    buckets: VecDeque<Bucket>,
    /// The verdicts of its last events, oldest first, one letter each
    /// (`a`, `r`, `b`).
    #[serde(rename = "h")]
    history: String,
    /// Per score counter (`offensive>0.8`), its events per minute:
    /// `[minute, events]`, in minute order, as old as the buckets.
    #[serde(rename = "o", default, skip_serializing_if = "BTreeMap::is_empty")]
    over: BTreeMap<String, VecDeque<(u32, u32)>>,
    /// Per field (`metadata.url`), the values seen: `[hash, minute last
    /// seen]`, least recently seen first, at most [`DISTINCT_CAP`].
    #[serde(rename = "d", default, skip_serializing_if = "BTreeMap::is_empty")]
    distinct: BTreeMap<String, Vec<(u64, u32)>>,
}

impl EntityState {
    /// Counts an event of `minute` (before its verdict is known); false
    /// for one too late to count in any window ([`Self::bucket_mut`]).
    pub fn post(&mut self, minute: u32) -> bool {
        let Some(b) = self.bucket_mut(minute) else {
            return false;
        };
        b.1 = b.1.saturating_add(1);
        true
    }

    /// Counts the event of `minute` (one [`Self::post`] counted) for the
    /// score counter `key`.
    pub fn over(&mut self, key: &str, minute: u32) {
        let minutes = match self.over.get_mut(key) {
            Some(minutes) => minutes,
            None => self.over.entry(key.to_string()).or_default(),
        };
        let at = minutes.partition_point(|(m, _)| *m < minute);
        match minutes.get_mut(at) {
            Some((m, n)) if *m == minute => *n = n.saturating_add(1),
            _ => minutes.insert(at, (minute, 1)),
        }
    }

    /// The event of `minute` (one [`Self::post`] counted) has the value of
    /// hash `value` in `field`: now its most recently seen.
    pub fn seen(&mut self, field: &str, value: u64, minute: u32) {
        let values = match self.distinct.get_mut(field) {
            Some(values) => values,
            None => self.distinct.entry(field.to_string()).or_default(),
        };
        let last = match values.iter().position(|(v, _)| *v == value) {
            Some(at) => values.remove(at).1.max(minute),
            None => minute,
        };
        values.push((value, last));
        if values.len() > DISTINCT_CAP {
            values.remove(0);
        }
    }

    /// Counts the verdict of its event of `minute`, keeping the last
    /// `history` verdicts.
    pub fn verdict(&mut self, minute: u32, verdict: Verdict, history: usize) {
        if let Some(b) = self.bucket_mut(minute) {
            b.count(verdict);
        }
        self.history.push(letter(verdict));
        while self.history.len() > history {
            self.history.remove(0);
        }
    }

    /// A counter's value for an event of `minute`.
    pub fn value(&self, counter: &Counter, minute: u32) -> u64 {
        let window = |minutes: u32| minute.saturating_sub(minutes - 1)..=minute;
        match counter {
            Counter::Window {
                tally: Tally::Over(score),
                minutes,
            } => {
                let window = window(*minutes);
                (self.over.get(&score.key).into_iter().flatten())
                    .filter(|(m, _)| window.contains(m))
                    .map(|(_, n)| u64::from(*n))
                    .sum()
            }
            Counter::Window { tally, minutes } => {
                let window = window(*minutes);
                self.buckets
                    .iter()
                    .filter(|b| window.contains(&b.minute()))
                    .map(|b| u64::from(b.tally(tally)))
                    .sum()
            }
            Counter::Distinct { of, minutes } => {
                let window = window(*minutes);
                (self.distinct.get(&of.name).into_iter().flatten())
                    .filter(|(_, m)| window.contains(m))
                    .count() as u64
            }
            Counter::Last { verdict, n } => {
                let skip = self.history.len().saturating_sub(*n as usize);
                let want = letter(*verdict);
                self.history
                    .chars()
                    .skip(skip)
                    .filter(|c| *c == want)
                    .count() as u64
            }
        }
    }

    /// Nothing of it counts for an event of `minute` or later.
    pub fn idle_at(&self, minute: u32) -> bool {
        self.buckets
            .back()
            .is_none_or(|b| b.minute() + MAX_WINDOW_MINUTES <= minute)
    }

    /// What it is charged against `state.max_bytes` (its heap and the
    /// map's share), without its key.
    pub fn bytes(&self) -> usize {
        // A map entry: its key, its collection, the tree's share.
        let entry = |key: &String| key.capacity() + 64;
        let over: usize = (self.over.iter())
            .map(|(k, v)| entry(k) + v.capacity() * std::mem::size_of::<(u32, u32)>())
            .sum();
        let distinct: usize = (self.distinct.iter())
            .map(|(k, v)| entry(k) + v.capacity() * std::mem::size_of::<(u64, u32)>())
            .sum();
        std::mem::size_of::<EntityState>()
            + self.buckets.capacity() * std::mem::size_of::<Bucket>()
            + self.history.capacity()
            + over
            + distinct
            + 32
    }

    /// The bucket of `minute`, made if need be; `None` for a minute older
    /// than the longest window before the newest (an event that late
    /// counts in no window an event after it reads).
    fn bucket_mut(&mut self, minute: u32) -> Option<&mut Bucket> {
        let newest = self
            .buckets
            .back()
            .map_or(minute, Bucket::minute)
            .max(minute);
        if minute + MAX_WINDOW_MINUTES <= newest {
            return None;
        }
        let at = self.buckets.partition_point(|b| b.minute() < minute);
        if self.buckets.get(at).is_none_or(|b| b.minute() != minute) {
            self.buckets.insert(at, Bucket(minute, 0, 0, 0, 0));
        }
        let old = |m: u32| m + MAX_WINDOW_MINUTES <= newest;
        while self.buckets.front().is_some_and(|b| old(b.minute())) {
            self.buckets.pop_front();
        }
        for minutes in self.over.values_mut() {
            while minutes.front().is_some_and(|(m, _)| old(*m)) {
                minutes.pop_front();
            }
        }
        self.over.retain(|_, minutes| !minutes.is_empty());
        for values in self.distinct.values_mut() {
            values.retain(|(_, m)| !old(*m));
        }
        self.distinct.retain(|_, values| !values.is_empty());
        let at = self.buckets.partition_point(|b| b.minute() < minute);
        self.buckets.get_mut(at)
    }
}

fn letter(verdict: Verdict) -> char {
    match verdict {
        Verdict::Allow => 'a',
        Verdict::Review => 'r',
        Verdict::Block => 'b',
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(tally: Tally, minutes: u32) -> Counter {
        Counter::Window { tally, minutes }
    }

    #[test]
    fn windows_count_whole_minutes_back_from_the_event() {
        let mut s = EntityState::default();
        for minute in [100, 100, 101, 130, 160] {
            s.post(minute);
            s.verdict(minute, Verdict::Block, 10);
        }
        assert_eq!(s.value(&window(Tally::Posts, 1), 100), 2);
        assert_eq!(s.value(&window(Tally::Posts, 2), 101), 3);
        assert_eq!(s.value(&window(Tally::Posts, 30), 130), 2);
        assert_eq!(
            s.value(&window(Tally::Verdicts(Verdict::Block), 60), 160),
            3
        );
        assert_eq!(
            s.value(&window(Tally::Verdicts(Verdict::Block), 61), 160),
            5
        );
        // A later event's window does not reach back past its start.
        assert_eq!(s.value(&window(Tally::Posts, 1), 161), 0);
        // Buckets older than a day before the newest are dropped.
        s.post(100 + MAX_WINDOW_MINUTES);
        assert_eq!(s.buckets.front().map(Bucket::minute), Some(101));
        // An event that late counts nowhere.
        s.post(50);
        assert_eq!(s.value(&window(Tally::Posts, 1), 50), 0);
        assert!(!s.idle_at(100 + 2 * MAX_WINDOW_MINUTES - 1));
        assert!(s.idle_at(100 + 2 * MAX_WINDOW_MINUTES));
    }

    #[test]
    fn the_last_verdicts_are_kept_to_the_history() {
        let mut s = EntityState::default();
        for v in [
            Verdict::Block,
            Verdict::Allow,
            Verdict::Block,
            Verdict::Review,
        ] {
            s.post(1);
            s.verdict(1, v, 3);
        }
        assert_eq!(s.history, "abr");
        let blocks = |n| Counter::Last {
            verdict: Verdict::Block,
            n,
        };
        assert_eq!(s.value(&blocks(3), 1), 1);
        assert_eq!(s.value(&blocks(1), 1), 0);
        assert_eq!(s.value(&blocks(2), 1), 1);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, r#"{"b":[[1,4,1,1,2]],"h":"abr"}"#);
        assert_eq!(serde_json::from_str::<EntityState>(&json).unwrap(), s);
    }
}
