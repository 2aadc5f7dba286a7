//! The checks of [`Settings::validate`](super::Settings::validate), by
//! section: each problem names its key and the reason.

use std::time::Duration;

use super::{
    BatchingSettings, ConfigError, ExecutionProvider, InferenceSettings, InputSettings,
    KafkaSettings, Limits, OutputSettings, Policy, Workers, invalid,
};

/// Consumer properties modstream sets itself: overriding them would break the
/// at-least-once guarantee or the meaning of another setting.
const RESERVED_CONSUMER: &[(&str, &str)] = &[
    (
        "enable.auto.offset.store",
        "offsets are stored only after delivery",
    ),
    (
        "enable.auto.commit",
        "modstream commits stored offsets itself (kafka.commit_interval)",
    ),
    ("group.id", "use kafka.group_id"),
    ("bootstrap.servers", "use kafka.bootstrap_servers"),
    (
        "enable.partition.eof",
        "modstream does not handle EOF events",
    ),
];
/// Consumer properties of the classic group protocol only.
const CLASSIC_ONLY: &[&str] = &[
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "group.protocol.type",
];
const RESERVED_PRODUCER: &[(&str, &str)] = &[
    ("bootstrap.servers", "use kafka.bootstrap_servers"),
    (
        "transactional.id",
        "with kafka.delivery = \"exactly_once\" it is <group_id>.<instance_id> (kafka.instance_id)",
    ),
    ("transaction.timeout.ms", "use kafka.transaction_timeout"),
];

pub(super) fn kafka(kafka: &KafkaSettings) -> Result<(), ConfigError> {
    if kafka.bootstrap_servers.trim().is_empty() {
        return Err(invalid("kafka.bootstrap_servers", "must not be empty"));
    }
    if kafka.group_id.trim().is_empty() {
        return Err(invalid("kafka.group_id", "must not be empty"));
    }
    consumer_properties(kafka)?;
    producer_properties(kafka)?;
    if kafka.exactly_once() {
        exactly_once(kafka)?;
    }
    timeouts(kafka)
}

/// What would break exactly-once: a consumer that reads offsets another
/// member's transaction has not committed yet, an instance id that cannot
/// be part of a transactional id, a message timeout past the transaction's.
fn exactly_once(kafka: &KafkaSettings) -> Result<(), ConfigError> {
    if kafka.consumer.get("isolation.level").map(String::as_str) == Some("read_uncommitted") {
        return Err(invalid(
            "kafka.consumer.isolation.level",
            "must be read_committed with kafka.delivery = \"exactly_once\": a new owner of a partition must wait for the offsets of the previous owner's open transaction (KIP-447), and aborted input must not be scored",
        ));
    }
    if let Some(id) = &kafka.instance_id
        && (id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)))
    {
        return Err(invalid(
            "kafka.instance_id",
            "must be letters, digits, '.', '_' or '-'",
        ));
    }
    let t = kafka.transaction_timeout;
    if t < Duration::from_secs(1) || t > Duration::from_secs(900) {
        return Err(invalid(
            "kafka.transaction_timeout",
            "must be between 1s and 15m (the broker's transaction.max.timeout.ms by default)",
        ));
    }
    if t <= kafka.commit_interval {
        return Err(invalid(
            "kafka.transaction_timeout",
            "must be longer than kafka.commit_interval (a transaction lasts one interval, then commits)",
        ));
    }
    if let Some(v) = kafka.producer.get("message.timeout.ms")
        && v.parse::<u128>().map_or(true, |ms| ms > t.as_millis())
    {
        return Err(invalid(
            "kafka.producer.message.timeout.ms",
            "must be a number of milliseconds no longer than kafka.transaction_timeout (librdkafka requires it)",
        ));
    }
    Ok(())
}

/// `kafka.consumer`: nothing modstream sets itself, known values for the
/// group protocol and isolation level, no classic-only key with KIP-848.
fn consumer_properties(kafka: &KafkaSettings) -> Result<(), ConfigError> {
    for (key, value) in &kafka.consumer {
        if let Some((_, why)) = RESERVED_CONSUMER.iter().find(|(k, _)| k == key) {
            return Err(invalid(
                &format!("kafka.consumer.{key}"),
                format!("cannot be set: {why}"),
            ));
        }
        if key == "isolation.level" && value != "read_committed" && value != "read_uncommitted" {
            return Err(invalid(
                "kafka.consumer.isolation.level",
                "must be read_committed or read_uncommitted",
            ));
        }
        if key == "group.protocol" && value != "classic" && value != "consumer" {
            return Err(invalid(
                "kafka.consumer.group.protocol",
                "must be classic or consumer (KIP-848, Kafka 4.0+)",
            ));
        }
    }
    if kafka.consumer.get("group.protocol").map(String::as_str) == Some("consumer") {
        // With KIP-848 the broker owns these (group.consumer.*); librdkafka
        // refuses them.
        for key in CLASSIC_ONLY {
            if kafka.consumer.contains_key(*key) {
                return Err(invalid(
                    &format!("kafka.consumer.{key}"),
                    "cannot be set with group.protocol = consumer: the broker sets it (group.consumer.* broker configs)",
                ));
            }
        }
    }
    Ok(())
}

/// `kafka.producer`: idempotent, `acks=all`, nothing modstream sets itself.
fn producer_properties(kafka: &KafkaSettings) -> Result<(), ConfigError> {
    for (key, value) in &kafka.producer {
        if let Some((_, why)) = RESERVED_PRODUCER.iter().find(|(k, _)| k == key) {
            return Err(invalid(
                &format!("kafka.producer.{key}"),
                format!("cannot be set: {why}"),
            ));
        }
        if key == "enable.idempotence" && value != "true" {
            return Err(invalid(
                "kafka.producer.enable.idempotence",
                "must stay true: retries must not duplicate or reorder verdicts",
            ));
        }
        if (key == "acks" || key == "request.required.acks") && value != "all" && value != "-1" {
            return Err(invalid(
                &format!("kafka.producer.{key}"),
                "must be all (-1): a verdict counts as delivered only when every in-sync replica has it",
            ));
        }
    }
    Ok(())
}

fn timeouts(kafka: &KafkaSettings) -> Result<(), ConfigError> {
    let session_timeout_ms: u64 = match kafka.consumer.get("session.timeout.ms") {
        Some(v) => v.parse().map_err(|_| {
            invalid(
                "kafka.consumer.session.timeout.ms",
                "must be a whole number of milliseconds",
            )
        })?,
        None => 45_000,
    };
    if kafka.drain_timeout.as_millis() as u64 >= session_timeout_ms {
        return Err(invalid(
            "kafka.drain_timeout",
            format!(
                "must be below session.timeout.ms ({session_timeout_ms} ms), or the group evicts this member while it drains"
            ),
        ));
    }
    if kafka.drain_timeout.is_zero() {
        return Err(invalid("kafka.drain_timeout", "must be greater than zero"));
    }
    if kafka.shutdown_timeout.is_zero() {
        return Err(invalid(
            "kafka.shutdown_timeout",
            "must be greater than zero",
        ));
    }
    if kafka.commit_interval.is_zero() {
        return Err(invalid(
            "kafka.commit_interval",
            "must be greater than zero",
        ));
    }
    Ok(())
}

pub(super) fn topics(input: &InputSettings, output: &OutputSettings) -> Result<(), ConfigError> {
    if input.topics.is_empty() {
        return Err(invalid("input.topics", "name at least one topic"));
    }
    for (key, topic) in [
        ("output.topic", &output.topic),
        ("output.dlq_topic", &output.dlq_topic),
    ] {
        if topic.trim().is_empty() {
            return Err(invalid(key, "must not be empty"));
        }
        if input.topics.contains(topic) {
            return Err(invalid(
                key,
                "must differ from every input topic (it would feed itself)",
            ));
        }
    }
    if output.topic == output.dlq_topic {
        return Err(invalid("output.dlq_topic", "must differ from output.topic"));
    }
    // Analytics records (decisions, waves, samples) are given up when their
    // topic fails; in the verdicts' or an input's topic they would mix
    // with what moderation depends on, or feed the service itself.
    for (key, topic) in output.analytics_topics() {
        if topic.trim().is_empty() {
            return Err(invalid(key, "must not be empty (leave it out for none)"));
        }
        if input.topics.iter().any(|t| t == topic) {
            return Err(invalid(
                key,
                "must differ from every input topic (it would feed itself)",
            ));
        }
        if *topic == output.topic || *topic == output.dlq_topic {
            return Err(invalid(
                key,
                "must differ from output.topic and output.dlq_topic (its records are given up when it fails; the verdicts' are not)",
            ));
        }
    }
    Ok(())
}

pub(super) fn batching_and_limits(
    batching: &BatchingSettings,
    limits: &Limits,
) -> Result<(), ConfigError> {
    if batching.max_batch_size == 0 || batching.max_batch_size > 4096 {
        return Err(invalid(
            "batching.max_batch_size",
            "must be between 1 and 4096",
        ));
    }
    if batching
        .target_p99
        .is_some_and(|t| t < Duration::from_millis(1))
    {
        return Err(invalid("batching.target_p99", "must be at least 1ms"));
    }
    if batching
        .max_batch_tokens
        .is_some_and(|t| !(16..=1 << 24).contains(&t))
    {
        return Err(invalid(
            "batching.max_batch_tokens",
            "must be between 16 and 16777216",
        ));
    }
    if limits.max_payload_bytes == 0 {
        return Err(invalid(
            "limits.max_payload_bytes",
            "must be greater than zero",
        ));
    }
    if limits.max_text_bytes == 0 || limits.max_text_bytes > limits.max_payload_bytes {
        return Err(invalid(
            "limits.max_text_bytes",
            "must be between 1 and limits.max_payload_bytes",
        ));
    }
    if limits.max_in_flight < batching.max_batch_size {
        return Err(invalid(
            "limits.max_in_flight",
            "must be at least batching.max_batch_size",
        ));
    }
    if limits.max_in_flight_bytes < limits.max_payload_bytes {
        return Err(invalid(
            "limits.max_in_flight_bytes",
            "must be at least limits.max_payload_bytes",
        ));
    }
    if limits.stall_after < Duration::from_secs(1) {
        return Err(invalid("limits.stall_after", "must be at least 1s"));
    }
    Ok(())
}

pub(super) fn inference(inference: &InferenceSettings) -> Result<(), ConfigError> {
    if !(0.0..=1.0).contains(&inference.shadow.share) {
        return Err(invalid("inference.shadow.share", "must be between 0 and 1"));
    }
    if let Workers::Count(n) = inference.workers
        && !(1..=64).contains(&n)
    {
        return Err(invalid(
            "inference.workers",
            "must be \"auto\" or between 1 and 64",
        ));
    }
    if inference.intra_threads == 0 {
        return Err(invalid("inference.intra_threads", "must be at least 1"));
    }
    if inference.execution_providers.is_empty() {
        return Err(invalid(
            "inference.execution_providers",
            "name at least one (e.g. [\"cpu\"])",
        ));
    }
    let inf = inference;
    if inf.length_buckets.is_empty()
        || inf.length_buckets.contains(&0)
        || !inf.length_buckets.is_sorted()
    {
        return Err(invalid(
            "inference.length_buckets",
            "need ascending token lengths above zero, e.g. [16, 32, 64, 128]",
        ));
    }
    if inf.require_gpu
        && !inf
            .execution_providers
            .iter()
            .any(|e| *e != ExecutionProvider::Cpu)
    {
        return Err(invalid(
            "inference.require_gpu",
            "is set but execution_providers names no GPU provider (cuda or tensorrt)",
        ));
    }
    Ok(())
}

pub(super) fn policy(p: &Policy) -> Result<(), ConfigError> {
    let thresholds = std::iter::once(("policy".to_string(), (p.review_at, p.block_at))).chain(
        p.labels
            .iter()
            .map(|(l, t)| (format!("policy.labels.{l}"), (t.review_at, t.block_at))),
    );
    for (key, (review_at, block_at)) in thresholds {
        if !(0.0..=1.0).contains(&review_at)
            || !(0.0..=1.0).contains(&block_at)
            || review_at > block_at
        {
            return Err(invalid(&key, "need 0 <= review_at <= block_at <= 1"));
        }
    }
    Ok(())
}
