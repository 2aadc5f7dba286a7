//! `[state]`: what modstream remembers of an entity (a user, by default)
//! between its events, for the policy's state rules (see [`crate::state`]).

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StateSettings {
    /// The compacted topic every change of state is written to, one
    /// partition per input partition (state is off without it).
    pub changelog_topic: Option<String>,
    /// The event field that names an entity: `user_id` or `metadata.KEY`.
    pub entity: String,
    /// How state rules name the entity (`user.posts_1m`).
    pub entity_name: String,
    /// The verdicts kept per entity, for the `lastN` counters.
    pub history: u32,
    /// Bytes all partitions' state may hold: past it the least recently
    /// seen entity of the partition being updated is forgotten.
    pub max_bytes: usize,
}

impl Default for StateSettings {
    fn default() -> Self {
        StateSettings {
            changelog_topic: None,
            entity: "user_id".into(),
            entity_name: "user".into(),
            history: 10,
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

impl StateSettings {
    pub fn enabled(&self) -> bool {
        self.changelog_topic.is_some()
    }
}

pub(super) fn validate(s: &StateSettings) -> Result<(), ConfigError> {
    let metadata_key = s.entity.strip_prefix("metadata.");
    if s.entity != "user_id" && metadata_key.is_none_or(str::is_empty) {
        return Err(invalid("state.entity", "user_id or metadata.KEY"));
    }
    let name_ok = !s.entity_name.is_empty()
        && s.entity_name.len() <= 32
        && s.entity_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        // `metadata.KEY` in a state rule's `if` is a field of the event.
        && s.entity_name != "metadata";
    if !name_ok {
        return Err(invalid(
            "state.entity_name",
            "1 to 32 characters of A-Z a-z 0-9 _, not \"metadata\"",
        ));
    }
    if !(1..=64).contains(&s.history) {
        return Err(invalid("state.history", "1 to 64"));
    }
    if s.max_bytes < 1024 * 1024 {
        return Err(invalid("state.max_bytes", "at least 1 MiB (1048576)"));
    }
    if s.changelog_topic
        .as_ref()
        .is_some_and(|t| t.trim().is_empty())
    {
        return Err(invalid(
            "state.changelog_topic",
            "a topic name, or left out",
        ));
    }
    Ok(())
}
