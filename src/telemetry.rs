//! Metric names (all in one place) and logging set-up.
//!
//! Names follow Prometheus conventions: `_total` counters, `_seconds`
//! histograms, labels of low cardinality only (topic, partition, verdict,
//! reason, kind); never event ids or text.

use crate::config::TelemetrySettings;

pub mod metric {
    /// Records consumed from the input topics. Labels: topic.
    pub const CONSUMED_TOTAL: &str = "modstream_events_consumed_total";
    /// Verdicts acknowledged by the broker. Labels: verdict.
    pub const VERDICTS_TOTAL: &str = "modstream_verdicts_total";
    /// Dead-letter records acknowledged by the broker. Labels: reason.
    pub const DLQ_TOTAL: &str = "modstream_dlq_total";
    /// Records acknowledged by the broker. Labels: kind (verdict, dlq).
    pub const PRODUCED_TOTAL: &str = "modstream_records_produced_total";
    /// Failed delivery attempts (each is retried). Labels: kind.
    pub const DELIVERY_FAILURES_TOTAL: &str = "modstream_delivery_failures_total";
    /// Events per model run.
    pub const BATCH_SIZE: &str = "modstream_batch_size";
    /// From a batch's first event to its close, seconds.
    pub const BATCH_WAIT_SECONDS: &str = "modstream_batch_wait_seconds";
    /// One model run, seconds.
    pub const INFERENCE_SECONDS: &str = "modstream_inference_seconds";
    /// Failed model runs.
    pub const INFERENCE_FAILURES_TOTAL: &str = "modstream_inference_failures_total";
    /// Consumed and not yet delivered events.
    pub const IN_FLIGHT_EVENTS: &str = "modstream_in_flight_events";
    /// Partitions paused for backpressure.
    pub const PAUSED_PARTITIONS: &str = "modstream_paused_partitions";
    /// Offset commits. Labels: outcome (ok, error).
    pub const COMMITS_TOTAL: &str = "modstream_commits_total";
    /// Rebalance events. Labels: kind (assign, revoke).
    pub const REBALANCES_TOTAL: &str = "modstream_rebalances_total";
    /// Records from a partition this member no longer owns, left for the new owner.
    pub const STALE_RECORDS_TOTAL: &str = "modstream_stale_records_total";
    /// Consumer errors. Labels: kind.
    pub const ERRORS_TOTAL: &str = "modstream_errors_total";
}

/// Describe every metric with its unit (for /metrics HELP lines).
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        metric::CONSUMED_TOTAL,
        Unit::Count,
        "records consumed from the input topics"
    );
    describe_counter!(
        metric::VERDICTS_TOTAL,
        Unit::Count,
        "verdicts acknowledged by the broker"
    );
    describe_counter!(
        metric::DLQ_TOTAL,
        Unit::Count,
        "dead-letter records acknowledged by the broker"
    );
    describe_counter!(
        metric::PRODUCED_TOTAL,
        Unit::Count,
        "records acknowledged by the broker"
    );
    describe_counter!(
        metric::DELIVERY_FAILURES_TOTAL,
        Unit::Count,
        "failed delivery attempts, each retried"
    );
    describe_histogram!(metric::BATCH_SIZE, Unit::Count, "events per model run");
    describe_histogram!(
        metric::BATCH_WAIT_SECONDS,
        Unit::Seconds,
        "first event to batch close"
    );
    describe_histogram!(
        metric::INFERENCE_SECONDS,
        Unit::Seconds,
        "duration of one model run"
    );
    describe_counter!(
        metric::INFERENCE_FAILURES_TOTAL,
        Unit::Count,
        "failed model runs"
    );
    describe_gauge!(
        metric::IN_FLIGHT_EVENTS,
        Unit::Count,
        "consumed, not yet delivered events"
    );
    describe_gauge!(
        metric::PAUSED_PARTITIONS,
        Unit::Count,
        "partitions paused for backpressure"
    );
    describe_counter!(
        metric::COMMITS_TOTAL,
        Unit::Count,
        "offset commits by outcome"
    );
    describe_counter!(
        metric::REBALANCES_TOTAL,
        Unit::Count,
        "rebalance events by kind"
    );
    describe_counter!(
        metric::STALE_RECORDS_TOTAL,
        Unit::Count,
        "records of revoked partitions left for their new owner"
    );
    describe_counter!(metric::ERRORS_TOTAL, Unit::Count, "consumer errors by kind");
}

/// Text or JSON logs on stderr; RUST_LOG wins over `telemetry.log_level`.
pub fn init_logging(settings: &TelemetrySettings) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!("{},ort=warn,librdkafka=warn", settings.log_level))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if settings.log_format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
