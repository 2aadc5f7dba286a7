//! Kafka client configuration, built in one place for every client
//! modstream creates: the group consumer, the verdict producer (also used by
//! `rescore`), the shadow producer and the rescore reader. modstream's own
//! settings come first and `kafka.consumer` / `kafka.producer` properties
//! after them (config validation refuses the ones that would break a
//! guarantee), so each client sees the user's properties the same way.

use rdkafka::ClientConfig;

use crate::config::KafkaSettings;

/// The verdict producer's own librdkafka retries end after this; then
/// [`crate::producer::Sink::deliver`] sends the record again. The default
/// (300 s) would hold a verdict, and its offset, for five minutes after a
/// broker hiccup.
pub const MESSAGE_TIMEOUT_MS: &str = "30000";

/// What a consumer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerRole {
    /// The live group member: offsets stored only after delivery, committed
    /// by modstream, lag statistics every 5 s.
    Group,
    /// A reader of a range under its own group id that never commits
    /// (`rescore`).
    RangeReader,
}

/// What a producer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerRole {
    /// Verdicts and dead-letter records: idempotent, `acks=all`.
    Verdicts,
    /// Shadow comparison records: fire and forget, larger batches.
    Shadow,
}

/// A consumer's configuration; `group_id` is its group.
pub fn consumer(kafka: &KafkaSettings, role: ConsumerRole, group_id: &str) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &kafka.bootstrap_servers)
        .set("group.id", group_id)
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    if role == ConsumerRole::Group {
        cfg.set("auto.offset.reset", "earliest")
            .set("statistics.interval.ms", "5000");
        if kafka.exactly_once() {
            // Offsets of a transaction not yet committed are not handed out
            // (KIP-447), nor aborted input.
            cfg.set("isolation.level", "read_committed");
        }
    }
    for (k, v) in &kafka.consumer {
        cfg.set(k, v);
    }
    cfg
}

/// A producer's configuration.
pub fn producer(kafka: &KafkaSettings, role: ProducerRole) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &kafka.bootstrap_servers);
    match role {
        ProducerRole::Verdicts => cfg
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", MESSAGE_TIMEOUT_MS),
        ProducerRole::Shadow => cfg.set("linger.ms", "20"),
    };
    if role == ProducerRole::Verdicts && kafka.exactly_once() {
        let timeout_ms = kafka.transaction_timeout.as_millis().to_string();
        let message_timeout_ms = kafka
            .transaction_timeout
            .as_millis()
            .min(MESSAGE_TIMEOUT_MS.parse().unwrap_or(u128::MAX))
            .to_string();
        cfg.set("transactional.id", kafka.transactional_id())
            .set("transaction.timeout.ms", timeout_ms)
            .set("message.timeout.ms", message_timeout_ms);
    }
    for (k, v) in &kafka.producer {
        cfg.set(k, v);
    }
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka() -> KafkaSettings {
        crate::config::Settings::from_toml(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\n[kafka.consumer]\n\"fetch.wait.max.ms\" = \"7\"\n[kafka.producer]\n\"linger.ms\" = \"50\"\n\"message.timeout.ms\" = \"9000\"\n[input]\ntopics = [\"in\"]\n[output]\ntopic = \"out\"\ndlq_topic = \"dlq\"",
        )
        .unwrap()
        .kafka
    }

    #[test]
    fn every_client_gets_modstreams_settings_then_the_users_properties() {
        let kafka = kafka();
        let group = consumer(&kafka, ConsumerRole::Group, "g");
        assert_eq!(group.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(group.get("statistics.interval.ms"), Some("5000"));
        assert_eq!(group.get("fetch.wait.max.ms"), Some("7"));
        let reader = consumer(&kafka, ConsumerRole::RangeReader, "r");
        assert_eq!(reader.get("group.id"), Some("r"));
        assert_eq!(reader.get("enable.auto.commit"), Some("false"));
        assert_eq!(reader.get("statistics.interval.ms"), None);
        assert_eq!(reader.get("fetch.wait.max.ms"), Some("7"));
        let verdicts = producer(&kafka, ProducerRole::Verdicts);
        assert_eq!(verdicts.get("enable.idempotence"), Some("true"));
        assert_eq!(verdicts.get("acks"), Some("all"));
        // The user's properties win over modstream's defaults.
        assert_eq!(verdicts.get("linger.ms"), Some("50"));
        assert_eq!(verdicts.get("message.timeout.ms"), Some("9000"));
        let shadow = producer(&kafka, ProducerRole::Shadow);
        assert_eq!(shadow.get("enable.idempotence"), None);
        assert_eq!(shadow.get("linger.ms"), Some("50"));
    }
}
