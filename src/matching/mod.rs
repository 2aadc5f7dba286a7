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
//! Every text is first normalised ([`normalize::normalize`]); list items
//! match on the normalised text's hash or on its word shingles'
//! similarity ([`lists`]); waves cluster by similarity ([`waves`]).
//! Lists come from files (reloaded on change and on SIGHUP by the reload
//! task) and from the list topic ([`topic`]); both reach the hub as
//! [`Update`]s on one bounded channel.

use std::sync::Arc;

use tokio::time::Instant;

use crate::config::{ListMode, MatchingSettings};
use crate::record::{OutRecord, RecordKind};
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
pub use waves::WaveReport;

/// A change of the lists, for the hub's matcher.
pub enum Update {
    /// A list file loaded again: it replaces the list of its name.
    File(List),
    /// An item added (or replaced) on the list topic.
    TopicItem(Item),
    /// An item removed from the list topic (a null value).
    TopicRemoved(String),
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
}

impl Matcher {
    /// Loads every list file (a wrong one fails the start).
    pub fn new(settings: &MatchingSettings) -> Result<Matcher, ListError> {
        let prints = Fingerprinter;
        let mut lists = Vec::new();
        for l in &settings.lists {
            let similarity = settings.list_similarity;
            lists.push(List::load(&l.name, &l.file, l.mode, similarity, &prints)?);
        }
        if let Some(topic) = &settings.list_topic {
            let mode = settings.list_topic_mode;
            lists.push(List::new(topic, mode, settings.list_similarity));
        }
        for list in &lists {
            export_items(list);
        }
        Ok(Matcher {
            settings: settings.clone(),
            prints,
            lists,
            waves: settings.waves.then(|| waves::Waves::new(settings)),
            seconds: metrics::histogram!(metric::MATCHER_SECONDS),
        })
    }

    /// One event as it arrives: the first list (of those `rule_lists`
    /// names; None: all) with an item it matches, and its wave.
    pub fn inspect(
        &mut self,
        event_id: &str,
        text: &str,
        user: Option<&str>,
        rule_lists: Option<&[String]>,
        now: Instant,
    ) -> Inspection {
        let started = std::time::Instant::now();
        let inspection = self.inspect_text(event_id, text, user, rule_lists, now);
        self.seconds.record(started.elapsed().as_secs_f64());
        inspection
    }

    fn inspect_text(
        &mut self,
        event_id: &str,
        text: &str,
        user: Option<&str>,
        rule_lists: Option<&[String]>,
        now: Instant,
    ) -> Inspection {
        let normalized = normalize::normalize(text);
        if normalized.is_empty() {
            return Inspection::default();
        }
        let print = self.prints.of_normalized(&normalized);
        let applies =
            |l: &List| rule_lists.is_none_or(|names| names.iter().any(|n| **n == *l.name));
        let matched = self
            .lists
            .iter()
            .filter(|l| applies(l))
            .find_map(|l| l.find(&print).map(|found| (l, found)))
            .map(|(list, found)| {
                metrics::counter!(metric::LIST_MATCHES_TOTAL, "list" => list.name.to_string(), "verdict" => found.item.verdict.as_str())
                    .increment(1);
                ListMatch {
                    list: list.name.clone(),
                    id: found.item.id.clone(),
                    label: found.item.label.clone(),
                    verdict: found.item.verdict,
                    distance: found.distance,
                    decides: list.mode == ListMode::Decide,
                }
            });
        let now_ms = chrono::Utc::now().timestamp_millis();
        let joined = self
            .waves
            .as_mut()
            .and_then(|w| w.join(&print, event_id, user, now, now_ms));
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

    /// The scores an event of `cluster` was judged by, from its models.
    pub fn scored(&mut self, cluster: ClusterId, scores: &[ModelScores]) {
        if let Some(w) = &mut self.waves {
            w.scored(cluster, scores);
        }
    }

    /// The scores kept for `cluster`'s wave, to reuse (`matching.reuse`).
    pub fn kept(&self, cluster: ClusterId) -> Option<Arc<[ModelScores]>> {
        self.waves.as_ref()?.kept(cluster)
    }

    /// A model was reloaded: scores kept for reuse are of its old version.
    pub fn model_reloaded(&mut self) {
        if let Some(w) = &mut self.waves {
            w.forget_scores();
        }
    }

    pub fn apply(&mut self, update: Update) {
        match update {
            Update::File(list) => {
                tracing::info!(list = %list.name, items = list.len(), "list in force");
                export_items(&list);
                if let Some(old) = self.lists.iter_mut().find(|l| l.name == list.name) {
                    *old = list;
                }
            }
            Update::TopicItem(item) => {
                if let Some(list) = self.topic_list() {
                    list.insert(item);
                    export_items(list);
                }
            }
            Update::TopicRemoved(id) => {
                if let Some(list) = self.topic_list() {
                    list.remove(&id);
                    export_items(list);
                }
            }
        }
    }

    fn topic_list(&mut self) -> Option<&mut List> {
        let name = self.settings.list_topic.as_deref()?;
        self.lists.iter_mut().find(|l| &*l.name == name)
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
