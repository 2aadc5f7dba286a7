//! `kafka.delivery`: at-least-once or exactly-once, and the transactional
//! id exactly-once uses.

use serde::{Deserialize, Serialize};

use super::KafkaSettings;

/// How verdicts reach downstream readers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryMode {
    /// Nothing lost; a crash re-sends the verdicts of uncommitted offsets.
    #[default]
    AtLeastOnce,
    /// Nothing lost and, for `read_committed` readers, nothing twice: Kafka
    /// transactions (KIP-98) with the group's metadata (KIP-447).
    ExactlyOnce,
}

impl KafkaSettings {
    pub fn exactly_once(&self) -> bool {
        self.delivery == DeliveryMode::ExactlyOnce
    }

    /// The verdict producer's `transactional.id` with `exactly_once`:
    /// `<group_id>.<instance_id>`, the instance id defaulting to the host
    /// name (`HOSTNAME`, else /etc/hostname, else `0`).
    pub fn transactional_id(&self) -> String {
        let instance = self.instance_id.clone().unwrap_or_else(|| {
            std::env::var("HOSTNAME")
                .ok()
                .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "0".to_string())
        });
        format!("{}.{}", self.group_id, instance)
    }
}
