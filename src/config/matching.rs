//! `[matching]`: known-bad lists and near-duplicate waves, matched before
//! the models (see [`crate::matching`]).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MatchingSettings {
    /// Known-bad list files (one JSON item per line), loaded at start and
    /// reloaded when they change or on SIGHUP.
    pub lists: Vec<ListFile>,
    /// A compacted topic of list items (key = item id, null value =
    /// removed), read from its start by every instance; its items form one
    /// list named after the topic.
    pub list_topic: Option<String>,
    /// What a match of the topic's list does.
    pub list_topic_mode: ListMode,
    /// At start the list topic is read to the end offsets it had then,
    /// before the consumer joins its group, for at most this long.
    #[serde(with = "humantime_serde")]
    pub list_topic_wait: Duration,
    /// Past `list_topic_wait`: the start fails (`fail`), or goes on with
    /// /readyz saying the list topic is not read yet (`start`).
    pub list_topic_late: ListTopicLate,
    /// A text matches a list item when the estimated Jaccard similarity of
    /// their word shingles is at least this (1 = exact matches only).
    pub list_similarity: f64,
    /// Near-duplicate waves across the partitions this instance owns.
    pub waves: bool,
    /// A cluster is forgotten once no post joined it for this long.
    #[serde(with = "humantime_serde")]
    pub wave_window: Duration,
    /// A cluster is a wave from this many posts ...
    pub wave_posts: u32,
    /// ... by at least this many distinct users.
    pub wave_users: u32,
    /// Similarity (as `list_similarity`) at which a post joins a cluster.
    pub wave_similarity: f64,
    /// Texts of fewer words (normalised) join no cluster: short replies
    /// ("thanks!", "lol") are alike by nature, not by campaign.
    pub wave_min_words: usize,
    /// At most this many clusters are kept (the least recently joined is
    /// forgotten first, counted).
    pub max_clusters: usize,
    /// Posts of a wave reuse the scores of its first scored post instead
    /// of running the models again.
    pub reuse: bool,
    /// At most one wave record per wave this often as it grows.
    #[serde(with = "humantime_serde")]
    pub wave_report_interval: Duration,
    /// Bytes matching's state may hold: the lists' items, then the wave
    /// clusters in what is left (the least recently joined go first).
    pub max_bytes: usize,
}

/// What a start does when the list topic is not read to its end within
/// `matching.list_topic_wait`.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ListTopicLate {
    /// The start fails, naming the topic and what it could not read.
    #[default]
    Fail,
    /// The service starts; /readyz fails until the topic is read.
    Start,
}

/// One list file.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListFile {
    /// The list's name: in the verdict's reason, the metrics and policy rules.
    pub name: String,
    pub file: PathBuf,
    #[serde(default)]
    pub mode: ListMode,
}

/// What a list's match does.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ListMode {
    /// The item's verdict decides; no model runs.
    #[default]
    Decide,
    /// The models decide; the match is written in the reason.
    Annotate,
}

impl Default for MatchingSettings {
    fn default() -> Self {
        MatchingSettings {
            lists: Vec::new(),
            list_topic: None,
            list_topic_mode: ListMode::Decide,
            list_topic_wait: Duration::from_secs(30),
            list_topic_late: ListTopicLate::Fail,
            list_similarity: 0.7,
            waves: false,
            wave_window: Duration::from_secs(600),
            wave_posts: 20,
            wave_users: 5,
            wave_similarity: 0.6,
            wave_min_words: 6,
            max_clusters: 20_000,
            reuse: true,
            wave_report_interval: Duration::from_secs(10),
            max_bytes: 128 * 1024 * 1024,
        }
    }
}

impl MatchingSettings {
    /// Whether anything is matched at all.
    pub fn enabled(&self) -> bool {
        !self.lists.is_empty() || self.list_topic.is_some() || self.waves
    }

    /// Every list's name: the files', then the topic's.
    pub fn list_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.lists.iter().map(|l| l.name.clone()).collect();
        names.extend(self.list_topic.clone());
        names
    }
}

pub(super) fn validate(m: &MatchingSettings) -> Result<(), ConfigError> {
    let names = m.list_names();
    for (i, name) in names.iter().enumerate() {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !ok {
            return Err(invalid(
                "matching.lists.name",
                format!(
                    "{name:?}: 1 to 64 characters of A-Z a-z 0-9 _ - . (a list topic's name too)"
                ),
            ));
        }
        if names[..i].contains(name) {
            return Err(invalid(
                "matching.lists.name",
                format!("{name:?} names two lists"),
            ));
        }
    }
    for (key, s) in [
        ("matching.list_similarity", m.list_similarity),
        ("matching.wave_similarity", m.wave_similarity),
    ] {
        if !(s > 0.0 && s <= 1.0) {
            return Err(invalid(key, "a similarity above 0, at most 1"));
        }
    }
    if m.max_bytes < 1024 * 1024 {
        return Err(invalid("matching.max_bytes", "at least 1 MiB (1048576)"));
    }
    if m.list_topic.is_some() && m.list_topic_wait.is_zero() {
        return Err(invalid("matching.list_topic_wait", "must be above 0"));
    }
    if m.waves {
        if m.wave_window.is_zero() {
            return Err(invalid("matching.wave_window", "must be above 0"));
        }
        if m.wave_posts < 2 {
            return Err(invalid("matching.wave_posts", "at least 2"));
        }
        if m.max_clusters == 0 {
            return Err(invalid("matching.max_clusters", "at least 1"));
        }
    }
    Ok(())
}
