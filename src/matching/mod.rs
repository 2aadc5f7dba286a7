//! Matching before the models (`[matching]`): known-bad lists, decided at
//! once, and near-duplicate waves, whose later posts reuse the scores of
//! the first one the models scored.
//!
//! The hub owns the [`Matcher`] and asks it about each valid event as it
//! arrives ([`Matcher::inspect`]); the answer is an [`Inspection`]: the
//! event's marks (a list item it matched, the wave it belongs to), the
//! cluster it joined, scores to reuse, and a wave record to write. Nothing
//! here waits: an event is inspected in microseconds and goes on, so no
//! partition or offset commit is held back by matching.
//!
//! Every list a rule names is consulted: a deciding list's match decides
//! (the strictest verdict of those that match), an annotating list's only
//! marks the reason when no deciding list matched. Scores are reused only
//! between posts of one wave with the same text ([`waves`]).
//!
//! Bounded: the lists' items and the wave clusters are charged in bytes
//! against `matching.max_bytes` (`modstream_matching_bytes`): the lists
//! first (a list file or topic item that would pass it is refused and
//! counted), the clusters in what is left.
//!
//! Every text is first normalised ([`normalize::normalize`]); list items
//! match on the normalised text's hash or on its word shingles'
//! similarity ([`lists`]); waves cluster by similarity ([`waves`]).
//! Lists come from files (reloaded on change and on SIGHUP by the reload
//! task) and from the list topic ([`topic`]); both reach the hub as
//! [`Update`]s on one bounded channel.

use std::sync::Arc;

use tokio::time::Instant;

use crate::config::{ListMode, MatchingSettings};
use crate::producer::record::{OutRecord, RecordKind};
use crate::telemetry::metric;
use crate::verdict::{ClusterId, ListMatch, Marks, ModelScores};

pub mod lists;
pub mod normalize;
pub mod similar;
pub mod topic;
pub mod watch;
pub mod waves;

pub use lists::{Item, List, ListError};
pub use similar::Fingerprinter;
pub use watch::ListWatch;
pub use waves::{WaveReport, WavesStats};

/// A change of the lists, for the hub's matcher.
pub enum Update {
    /// A list file loaded again: it replaces the list of its name.
    File(List),
    /// An item added (or replaced) on the list topic.
    TopicItem(Item),
    /// An item removed from the list topic (a null value).
    TopicRemoved(String),
    /// The list topic is read up to the end offsets it had at start: every
    /// update before this one is of an item written before the start.
    TopicCaughtUp,
}

/// An event as matching sees it.
pub struct Post<'a> {
    pub event_id: &'a str,
    pub text: &'a str,
    pub user: Option<&'a str>,
    /// Its input partition and offset.
    pub source: &'a crate::tp::Source,
    /// The lists its rule names (None: all).
    pub rule_lists: Option<&'a [String]>,
}

/// What matching found for one event.
#[derive(Debug, Default)]
pub struct Inspection {
    pub marks: Option<Box<Marks>>,
    pub cluster: Option<ClusterId>,
    /// Scores of the event's wave to use instead of running those models.
    pub reuse: Option<Arc<[ModelScores]>>,
    pub report: Option<WaveReport>,
}

/// The lists in force and the wave clusters, owned by the hub.
pub struct Matcher {
    settings: MatchingSettings,
    prints: Fingerprinter,
    /// The files' lists in configuration order, then the topic's.
    lists: Vec<List>,
    waves: Option<waves::Waves>,
    seconds: metrics::Histogram,
    lists_cut: metrics::Counter,
}

impl Matcher {
    /// Loads every list file (a wrong one fails the start).
    pub fn new(settings: &MatchingSettings) -> Result<Matcher, ListError> {
        let prints = Fingerprinter;
        let mut lists = Vec::new();
        for l in &settings.lists {
            let similarity = settings.list_similarity;
            lists.push(List::load(&l.name, &l.file, l.mode, similarity, &prints)?);
            let held: usize = lists.iter().map(List::bytes).sum();
            if held > settings.max_bytes {
                return Err(ListError::Budget {
                    list: l.name.clone(),
                    bytes: held,
                    max_bytes: settings.max_bytes,
                });
            }
        }
        if let Some(topic) = &settings.list_topic {
            let mode = settings.list_topic_mode;
            lists.push(List::new(topic, mode, settings.list_similarity));
        }
        for list in &lists {
            export_items(list);
        }
        let mut matcher = Matcher {
            settings: settings.clone(),
            prints,
            lists,
            waves: settings.waves.then(|| waves::Waves::new(settings)),
            seconds: metrics::histogram!(metric::MATCHER_SECONDS),
            lists_cut: metrics::counter!(metric::MATCHING_CANDIDATES_CUT_TOTAL, "part" => "lists"),
        };
        matcher.lists_changed();
        Ok(matcher)
    }

    /// One event as it arrives: the lists (of those its rule names) with an
    /// item it matches, and its wave.
    pub fn inspect(&mut self, post: &Post<'_>, now: Instant) -> Inspection {
        let started = std::time::Instant::now();
        let inspection = self.inspect_text(post, now);
        self.seconds.record(started.elapsed().as_secs_f64());
        inspection
    }

    fn inspect_text(&mut self, post: &Post<'_>, now: Instant) -> Inspection {
        let normalized = normalize::normalize(post.text);
        if normalized.is_empty() {
            return Inspection::default();
        }
        let print = self.prints.of_normalized(&normalized);
        let matched = self.list_match(&print, post.rule_lists);
        let now_ms = chrono::Utc::now().timestamp_millis();
        let joined = self.waves.as_mut().and_then(|w| {
            w.join(&waves::Post {
                print: &print,
                event_id: post.event_id,
                text: post.text,
                user: post.user,
                source: post.source,
                now,
                now_ms,
            })
        });
        let Some(joined) = joined else {
            return Inspection {
                marks: matched.map(|matched| {
                    Box::new(Marks {
                        matched: Some(matched),
                        ..Marks::default()
                    })
                }),
                ..Inspection::default()
            };
        };
        let marks = Marks {
            matched,
            wave: joined.wave,
            reused: false,
        };
        Inspection {
            marks: (!marks.is_empty()).then(|| Box::new(marks)),
            cluster: Some(joined.cluster),
            reuse: joined.reuse,
            report: joined.report,
        }
    }

    /// The match of the lists `rule_lists` names (None: all): a deciding
    /// list's, the strictest and nearest; else an annotating list's.
    fn list_match(
        &self,
        print: &similar::Fingerprint,
        rule_lists: Option<&[String]>,
    ) -> Option<ListMatch> {
        let applies =
            |l: &List| rule_lists.is_none_or(|names| names.iter().any(|n| **n == *l.name));
        let found = self
            .lists
            .iter()
            .filter(|l| applies(l))
            .filter_map(|l| l.find(print).map(|found| (l, found)))
            .min_by(|(la, a), (lb, b)| {
                let decides = |l: &List| l.mode == ListMode::Decide;
                (decides(lb).cmp(&decides(la)))
                    .then(b.item.verdict.cmp(&a.item.verdict))
                    .then(a.distance.total_cmp(&b.distance))
            });
        let cut: u64 = self.lists.iter().map(List::take_cut).sum();
        self.lists_cut.increment(cut);
        let (list, found) = found?;
        metrics::counter!(metric::LIST_MATCHES_TOTAL, "list" => list.name.to_string(), "verdict" => found.item.verdict.as_str())
            .increment(1);
        Some(ListMatch {
            list: list.name.clone(),
            id: found.item.id.clone(),
            label: found.item.label.clone(),
            verdict: found.item.verdict,
            distance: found.distance,
            decides: list.mode == ListMode::Decide,
        })
    }

    /// The scores an event of `cluster` was judged by from its models'
    /// runs, kept for later posts of its wave with the same text.
    pub fn scored(&mut self, cluster: ClusterId, text: &str, scores: &[ModelScores]) {
        if let Some(w) = &mut self.waves {
            w.scored(cluster, text, scores);
        }
    }

    /// The scores kept for this text in `cluster`'s wave, to reuse
    /// (`matching.reuse`).
    pub fn kept(&self, cluster: ClusterId, text: &str) -> Option<Arc<[ModelScores]>> {
        self.waves.as_ref()?.kept(cluster, text)
    }

    /// A model was reloaded: scores kept for reuse are of its old version.
    pub fn model_reloaded(&mut self) {
        if let Some(w) = &mut self.waves {
            w.forget_scores();
        }
    }

    /// A change of the lists. One that would take the lists past
    /// `matching.max_bytes` is refused (a file whole: the list in force
    /// stays), logged and counted.
    pub fn apply(&mut self, update: Update) {
        match update {
            Update::File(list) => {
                let Some(at) = self.lists.iter().position(|l| l.name == list.name) else {
                    return;
                };
                let held = self.lists_bytes() - self.lists[at].bytes() + list.bytes();
                if held > self.settings.max_bytes {
                    tracing::error!(list = %list.name, bytes = held, max_bytes = self.settings.max_bytes, "list file refused: the lists would pass matching.max_bytes; the list in force stays");
                    metrics::counter!(metric::LIST_ITEMS_OVER_BUDGET_TOTAL, "list" => list.name.to_string())
                        .increment(list.len() as u64);
                    return;
                }
                tracing::info!(list = %list.name, items = list.len(), "list in force");
                export_items(&list);
                self.lists[at] = list;
            }
            Update::TopicItem(item) => {
                let others = self.lists_bytes();
                let max_bytes = self.settings.max_bytes;
                let Some(list) = self.topic_list() else {
                    return;
                };
                let held = others - list.bytes() + list.bytes_with(&item);
                if held > max_bytes {
                    tracing::error!(list = %list.name, item = %item.id, bytes = held, max_bytes, "list topic item refused: the lists would pass matching.max_bytes");
                    metrics::counter!(metric::LIST_ITEMS_OVER_BUDGET_TOTAL, "list" => list.name.to_string())
                        .increment(1);
                    return;
                }
                list.insert(item);
                export_items(list);
            }
            Update::TopicRemoved(id) => {
                if let Some(list) = self.topic_list() {
                    list.remove(&id);
                    export_items(list);
                }
            }
            Update::TopicCaughtUp => return,
        }
        self.lists_changed();
    }

    fn topic_list(&mut self) -> Option<&mut List> {
        let name = self.settings.list_topic.as_deref()?;
        self.lists.iter_mut().find(|l| &*l.name == name)
    }

    fn lists_bytes(&self) -> usize {
        self.lists.iter().map(List::bytes).sum()
    }

    /// The lists' bytes exported; the clusters get what they leave.
    fn lists_changed(&mut self) {
        let lists = self.lists_bytes();
        metrics::gauge!(metric::MATCHING_BYTES, "part" => "lists").set(lists as f64);
        if let Some(w) = &mut self.waves {
            w.set_budget(self.settings.max_bytes.saturating_sub(lists));
        }
    }

    /// The wave clusters' state and what their bounds cost (None: no waves).
    pub fn waves_stats(&self) -> Option<WavesStats> {
        self.waves.as_ref().map(waves::Waves::stats)
    }

    /// Bytes the lists and the clusters hold now.
    pub fn bytes(&self) -> usize {
        self.lists_bytes() + self.waves.as_ref().map_or(0, waves::Waves::bytes)
    }

    /// A wave record for `output.waves_topic`, keyed by the wave's id.
    pub fn wave_record(topic: &str, report: &WaveReport) -> OutRecord {
        let body = serde_json::json!({
            "first_seen": crate::verdict::rfc3339(report.wave.first_seen_ms),
            "id": &*report.wave.id,
            "seen_at": crate::verdict::rfc3339(chrono::Utc::now().timestamp_millis()),
            "size": report.wave.size,
            "started": report.started,
            "users": report.wave.users,
        });
        OutRecord {
            topic: topic.to_string(),
            partition: None,
            key: Some(report.wave.id.as_bytes().to_vec()),
            payload: Some(body.to_string().into_bytes()),
            headers: Vec::new(),
            timestamp_ms: None,
            kind: RecordKind::Wave,
        }
    }
}

fn export_items(list: &List) {
    metrics::gauge!(metric::LIST_ITEMS, "list" => list.name.to_string()).set(list.len() as f64);
}

#[cfg(test)]
mod tests;
