//! What matching found for an event ([`crate::matching`]), written in its
//! verdict's `reason`: `"match": {"distance", "id", "label", "list",
//! "verdict"}` (a known-bad list's item), `"wave": {"first_seen", "id",
//! "size", "users"}` (a near-duplicate wave it belongs to) and
//! `"reused": true` (its scores are those of its wave's first scored post).

use std::sync::Arc;

use super::stamp::rfc3339;
use crate::policy::Verdict;

/// An event's marks; none for most events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Marks {
    pub matched: Option<ListMatch>,
    pub wave: Option<WaveNote>,
    pub reused: bool,
}

impl Marks {
    pub fn is_empty(&self) -> bool {
        self.matched.is_none() && self.wave.is_none() && !self.reused
    }

    /// The list item that decides the event (a match of a list in `decide`
    /// mode): no model runs on it.
    pub fn deciding(&self) -> Option<&ListMatch> {
        self.matched.as_ref().filter(|m| m.decides)
    }
}

/// A near-duplicate cluster, while its instance keeps it (numbered from 1
/// at start; not written anywhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId(pub u64);

/// A known-bad list's item that the event matched.
#[derive(Debug, Clone, PartialEq)]
pub struct ListMatch {
    pub list: Arc<str>,
    pub id: Arc<str>,
    pub label: Arc<str>,
    pub verdict: Verdict,
    /// 0 for the same normalised text; else 1 − the estimated similarity.
    pub distance: f32,
    /// The list decides (`mode = "decide"`), or only annotates.
    pub decides: bool,
}

/// The near-duplicate wave an event belongs to, as it stood when the event
/// joined it.
#[derive(Debug, Clone, PartialEq)]
pub struct WaveNote {
    /// The event id of the wave's first post.
    pub id: Arc<str>,
    pub size: u32,
    pub users: u32,
    /// When its first post was seen (ms since the epoch).
    pub first_seen_ms: i64,
}

#[derive(serde::Serialize)]
pub(super) struct MatchRef<'a> {
    pub distance: f64,
    pub id: &'a str,
    pub label: &'a str,
    pub list: &'a str,
    pub verdict: Verdict,
}

#[derive(serde::Serialize)]
pub(super) struct WaveRef<'a> {
    pub first_seen: String,
    pub id: &'a str,
    pub size: u32,
    pub users: u32,
}

impl<'a> From<&'a ListMatch> for MatchRef<'a> {
    fn from(m: &'a ListMatch) -> Self {
        MatchRef {
            // Two decimals: the estimate is not finer than that.
            distance: (f64::from(m.distance) * 100.0).round() / 100.0,
            id: &m.id,
            label: &m.label,
            list: &m.list,
            verdict: m.verdict,
        }
    }
}

impl<'a> From<&'a WaveNote> for WaveRef<'a> {
    fn from(w: &'a WaveNote) -> Self {
        WaveRef {
            first_seen: rfc3339(w.first_seen_ms),
            id: &w.id,
            size: w.size,
            users: w.users,
        }
    }
}
