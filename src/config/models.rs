//! Several models (`[[inference.models]]`) and the policy file: each model
//! with its own directory, workers and run size, every other setting from
//! `[inference]`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, InferenceSettings, Settings, Workers, invalid};

/// One model of `[[inference.models]]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// How the policy names it (A-Z a-z 0-9 _ -).
    pub name: String,
    pub model_dir: PathBuf,
    /// Unset: `inference.workers`.
    pub workers: Option<Workers>,
    /// Unset: `inference.intra_threads`.
    pub intra_threads: Option<usize>,
    /// The largest run of this model (batches of several partitions are
    /// coalesced up to it); unset: `batching.max_batch_size`.
    pub max_batch_size: Option<usize>,
    /// Unset: `inference.cache_bytes`.
    pub cache_bytes: Option<u64>,
}

/// A model as the pipeline loads it: its name, its settings with every
/// default filled in, and its largest run.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub name: String,
    pub inference: InferenceSettings,
    pub max_batch: usize,
    /// `batching.max_batch_tokens`.
    pub max_tokens: Option<u64>,
}

impl ModelSpec {
    /// Its largest run.
    pub fn run_limit(&self) -> RunLimit {
        RunLimit {
            posts: self.max_batch,
            tokens: self.max_tokens,
        }
    }
}

/// The largest run a model is given: its posts, and with
/// `batching.max_batch_tokens` its tokens (a run of long posts holds fewer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimit {
    pub posts: usize,
    pub tokens: Option<u64>,
}

impl RunLimit {
    /// At most `posts` posts, whatever their length.
    pub fn posts(posts: usize) -> RunLimit {
        RunLimit {
            posts,
            tokens: None,
        }
    }

    /// The most posts of `len` tokens a run holds (at least one).
    pub fn rows_at(&self, len: usize) -> usize {
        let by_tokens = self.tokens.map_or(usize::MAX, |t| t as usize / len.max(1));
        self.posts.min(by_tokens).max(1)
    }
}

/// The name of the one model of a configuration without `[[inference.models]]`.
pub const SINGLE_MODEL: &str = "default";

impl Settings {
    /// The models, in the order they run on an event: `[[inference.models]]`,
    /// or the one model of `[inference]` named [`SINGLE_MODEL`].
    pub fn models(&self) -> Vec<ModelSpec> {
        let inf = &self.inference;
        let base = InferenceSettings {
            models: Vec::new(),
            ..inf.clone()
        };
        if inf.models.is_empty() {
            return vec![ModelSpec {
                name: SINGLE_MODEL.to_string(),
                inference: base,
                max_batch: self.batching.max_batch_size,
                max_tokens: self.batching.max_batch_tokens,
            }];
        }
        inf.models
            .iter()
            .map(|m| ModelSpec {
                name: m.name.clone(),
                inference: InferenceSettings {
                    model_dir: m.model_dir.clone(),
                    workers: m.workers.unwrap_or(base.workers),
                    intra_threads: m.intra_threads.unwrap_or(base.intra_threads),
                    cache_bytes: m.cache_bytes.unwrap_or(base.cache_bytes),
                    ..base.clone()
                },
                max_batch: m.max_batch_size.unwrap_or(self.batching.max_batch_size),
                max_tokens: self.batching.max_batch_tokens,
            })
            .collect()
    }
}

pub(super) fn validate(s: &Settings) -> Result<(), ConfigError> {
    let mut names = std::collections::HashSet::new();
    for (i, m) in s.inference.models.iter().enumerate() {
        let key = |k: &str| format!("inference.models[{i}].{k}");
        let name_ok = !m.name.is_empty()
            && m.name.len() <= 64
            && m.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
        if !name_ok {
            return Err(invalid(
                &key("name"),
                "1 to 64 characters of A-Z a-z 0-9 _ -",
            ));
        }
        if !names.insert(&m.name) {
            return Err(invalid(
                &key("name"),
                format!("{:?} names two models", m.name),
            ));
        }
        if m.max_batch_size.is_some_and(|n| n == 0 || n > 4096) {
            return Err(invalid(&key("max_batch_size"), "need 1 to 4096"));
        }
        if m.intra_threads == Some(0) || m.workers == Some(Workers::Count(0)) {
            return Err(invalid(
                &key("workers"),
                "need at least one worker and one thread",
            ));
        }
    }
    let several = s.inference.models.len() > 1;
    if s.policy.file.is_some() && !s.policy.labels.is_empty() {
        return Err(invalid(
            "policy.labels",
            "policy.file holds the thresholds; leave [policy.labels] out",
        ));
    }
    if several && !s.policy.labels.is_empty() {
        return Err(invalid(
            "policy.labels",
            "with several models the per-label thresholds go in policy.file",
        ));
    }
    if let Some(topic) = &s.output.decisions_topic
        && (topic.trim().is_empty() || s.input.topics.contains(topic) || *topic == s.output.topic)
    {
        return Err(invalid(
            "output.decisions_topic",
            "must be a topic of its own (not empty, not an input or the verdict topic)",
        ));
    }
    Ok(())
}
