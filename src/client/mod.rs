//! Kafka client configuration, built in one place for every client
//! modstream creates: the group consumer, the verdict producer (also used by
//! `rescore`), the shadow producer and the rescore reader. modstream's own
//! settings come first and `kafka.consumer` / `kafka.producer` properties
//! after them (config validation refuses the ones that would break a
//! guarantee), so each client sees the user's properties the same way.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;

use crate::config::{KafkaSettings, Limits, Settings};

pub mod log;

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

/// What librdkafka may hold of the input before modstream sees it, derived
/// from `limits.max_in_flight_bytes`, which bounds all of the input held:
/// librdkafka's own fetch queue (64 MiB by default) and each broker's fetch
/// response (up to 50 MiB) get an eighth of the budget each, and never less
/// than one record of `limits.max_payload_bytes`, so that the largest record
/// accepted still fits; the records in the hub get the rest
/// ([`FetchBounds::hub_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchBounds {
    /// `queued.max.messages.kbytes`: the consumer queue, in KiB.
    pub queued_kbytes: usize,
    /// `fetch.max.bytes`: one fetch response of one broker.
    pub fetch_max_bytes: usize,
}

/// librdkafka's maximum for the first property and its default for the
/// second (a larger budget never raises it).
const MAX_QUEUED_KBYTES: usize = 2_097_151;
const DEFAULT_FETCH_MAX_BYTES: usize = 52_428_800;

impl FetchBounds {
    pub fn of(limits: &Limits) -> FetchBounds {
        let share = (limits.max_in_flight_bytes / 8).max(limits.max_payload_bytes);
        FetchBounds {
            queued_kbytes: share.div_ceil(1024).clamp(1, MAX_QUEUED_KBYTES),
            fetch_max_bytes: share.min(DEFAULT_FETCH_MAX_BYTES),
        }
    }

    /// The records consumed and not yet delivered may hold what the budget
    /// leaves after librdkafka's two shares, and never less than one
    /// record of `limits.max_payload_bytes`.
    pub fn hub_bytes(&self, limits: &Limits) -> usize {
        (limits.max_in_flight_bytes)
            .saturating_sub(self.queued_kbytes * 1024 + self.fetch_max_bytes)
            .max(limits.max_payload_bytes)
    }

    /// The user's `kafka.consumer` properties that set either bound above
    /// its derived value.
    pub fn exceeded_by(&self, kafka: &KafkaSettings) -> Vec<Exceeded> {
        [
            ("queued.max.messages.kbytes", self.queued_kbytes),
            ("fetch.max.bytes", self.fetch_max_bytes),
        ]
        .into_iter()
        .filter_map(|(key, derived)| {
            let theirs = kafka.consumer.get(key)?;
            let over = theirs.trim().parse::<usize>().map_or(true, |v| v > derived);
            over.then(|| Exceeded {
                property: key,
                theirs: theirs.clone(),
                derived,
            })
        })
        .collect()
    }
}

/// A `kafka.consumer` property set above the bound the byte budget gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    pub property: &'static str,
    /// The user's value, as written.
    pub theirs: String,
    pub derived: usize,
}

/// A consumer's configuration; `group_id` is its group.
pub fn consumer(settings: &Settings, role: ConsumerRole, group_id: &str) -> ClientConfig {
    let kafka = &settings.kafka;
    let bounds = FetchBounds::of(&settings.limits);
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &kafka.bootstrap_servers)
        .set("group.id", group_id)
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set(
            "queued.max.messages.kbytes",
            bounds.queued_kbytes.to_string(),
        )
        .set("fetch.max.bytes", bounds.fetch_max_bytes.to_string());
    if role == ConsumerRole::Group {
        cfg.set("auto.offset.reset", "earliest")
            .set("statistics.interval.ms", "5000")
            // An input topic created after the start (and a partition added
            // to one) is consumed within 10 s, not librdkafka's 5 min.
            .set("topic.metadata.refresh.interval.ms", "10000");
        if kafka.exactly_once() {
            // Offsets of a transaction not yet committed are not handed out
            // (KIP-447), nor aborted input.
            cfg.set("isolation.level", "read_committed");
        }
    }
    for Exceeded {
        property: key,
        theirs,
        derived,
    } in bounds.exceeded_by(kafka)
    {
        tracing::warn!(
            property = key,
            set = %theirs,
            derived,
            max_in_flight_bytes = settings.limits.max_in_flight_bytes,
            "kafka.consumer sets {key} above what limits.max_in_flight_bytes gives it: \
             librdkafka may hold more of the input than the byte budget says"
        );
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

/// Where a partition's records end, those of open transactions included:
/// its high watermark. A `read_committed` consumer's own query answers the
/// last stable offset instead, which a stopped producer's open transaction
/// holds back until the broker aborts it (past that producer's
/// `transaction.timeout.ms`, at the broker's next check, every
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms`), while
/// committed records of a later producer lie past it. A reader that must
/// see every committed record written before it began (a state restore,
/// a read back to the end) reads `read_committed` until its position
/// passes this end.
pub struct WrittenEnds(BaseConsumer);

impl WrittenEnds {
    /// From a reader's configuration, its isolation level replaced.
    pub fn new(reader: &ClientConfig) -> KafkaResult<WrittenEnds> {
        let mut cfg = reader.clone();
        cfg.set("isolation.level", "read_uncommitted");
        Ok(WrittenEnds(cfg.create()?))
    }

    /// The (low, high) watermarks of `topic`'s partition `partition`.
    pub fn of(&self, topic: &str, partition: i32, timeout: Duration) -> KafkaResult<(i64, i64)> {
        self.0.fetch_watermarks(topic, partition, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings::from_toml(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\n[kafka.consumer]\n\"fetch.wait.max.ms\" = \"7\"\n[kafka.producer]\n\"linger.ms\" = \"50\"\n\"message.timeout.ms\" = \"9000\"\n[input]\ntopics = [\"in\"]\n[output]\ntopic = \"out\"\ndlq_topic = \"dlq\"",
        )
        .unwrap()
    }

    #[test]
    fn every_client_gets_modstreams_settings_then_the_users_properties() {
        let settings = settings();
        let kafka = &settings.kafka;
        let group = consumer(&settings, ConsumerRole::Group, "g");
        assert_eq!(group.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(group.get("statistics.interval.ms"), Some("5000"));
        assert_eq!(group.get("fetch.wait.max.ms"), Some("7"));
        let reader = consumer(&settings, ConsumerRole::RangeReader, "r");
        assert_eq!(reader.get("group.id"), Some("r"));
        assert_eq!(reader.get("enable.auto.commit"), Some("false"));
        assert_eq!(reader.get("statistics.interval.ms"), None);
        assert_eq!(reader.get("fetch.wait.max.ms"), Some("7"));
        let verdicts = producer(kafka, ProducerRole::Verdicts);
        assert_eq!(verdicts.get("enable.idempotence"), Some("true"));
        assert_eq!(verdicts.get("acks"), Some("all"));
        // The user's properties win over modstream's defaults.
        assert_eq!(verdicts.get("linger.ms"), Some("50"));
        assert_eq!(verdicts.get("message.timeout.ms"), Some("9000"));
        let shadow = producer(kafka, ProducerRole::Shadow);
        assert_eq!(shadow.get("enable.idempotence"), None);
        assert_eq!(shadow.get("linger.ms"), Some("50"));
    }

    #[test]
    fn the_hub_holds_what_the_budget_leaves_after_librdkafkas_shares() {
        let mut settings = settings();
        let limits = &settings.limits;
        // 128 MiB: 16 MiB each for librdkafka, 96 MiB for the hub.
        assert_eq!(FetchBounds::of(limits).hub_bytes(limits), 96 * 1024 * 1024);
        // Never below one record of the largest size accepted.
        settings.limits.max_in_flight_bytes = 1024 * 1024;
        settings.limits.max_payload_bytes = 512 * 1024;
        let limits = &settings.limits;
        assert_eq!(FetchBounds::of(limits).hub_bytes(limits), 512 * 1024);
    }

    #[test]
    fn librdkafkas_queues_get_an_eighth_of_the_byte_budget_each() {
        let mut settings = settings();
        let group = consumer(&settings, ConsumerRole::Group, "g");
        // The default budget, 128 MiB: 16 MiB each.
        assert_eq!(group.get("queued.max.messages.kbytes"), Some("16384"));
        assert_eq!(group.get("fetch.max.bytes"), Some("16777216"));
        let reader = consumer(&settings, ConsumerRole::RangeReader, "r");
        assert_eq!(reader.get("queued.max.messages.kbytes"), Some("16384"));
        // Never below one record of the largest size accepted.
        settings.limits.max_in_flight_bytes = 1024 * 1024;
        settings.limits.max_payload_bytes = 512 * 1024;
        let bounds = FetchBounds::of(&settings.limits);
        assert_eq!(bounds.queued_kbytes, 512);
        assert_eq!(bounds.fetch_max_bytes, 512 * 1024);
        // A large budget keeps librdkafka's own fetch default.
        settings.limits.max_in_flight_bytes = 4 << 30;
        assert_eq!(
            FetchBounds::of(&settings.limits).fetch_max_bytes,
            52_428_800
        );
    }

    #[test]
    fn a_users_queue_bound_wins_and_is_reported_when_it_exceeds_the_budget() {
        let mut settings = settings();
        let bounds = FetchBounds::of(&settings.limits);
        assert!(bounds.exceeded_by(&settings.kafka).is_empty());
        settings
            .kafka
            .consumer
            .0
            .insert("queued.max.messages.kbytes".into(), "65536".into());
        settings
            .kafka
            .consumer
            .0
            .insert("fetch.max.bytes".into(), "1024".into());
        assert_eq!(
            bounds.exceeded_by(&settings.kafka),
            vec![Exceeded {
                property: "queued.max.messages.kbytes",
                theirs: "65536".to_string(),
                derived: 16384
            }]
        );
        let group = consumer(&settings, ConsumerRole::Group, "g");
        assert_eq!(group.get("queued.max.messages.kbytes"), Some("65536"));
        assert_eq!(group.get("fetch.max.bytes"), Some("1024"));
    }
}
