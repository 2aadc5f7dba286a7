//! Metric names (all in one place) and logging set-up.
//!
//! Names follow Prometheus conventions: `_total` counters, `_seconds`
//! histograms, labels of low cardinality only (topic, partition, verdict,
//! reason, kind); never event ids or text.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

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
    /// Records the broker refused for good (also cut down): their offsets
    /// are committed so that the partition goes on. Labels: kind.
    pub const UNDELIVERABLE_TOTAL: &str = "modstream_undeliverable_total";
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
    /// Their bytes (key, value, headers), against `limits.max_in_flight_bytes`.
    pub const IN_FLIGHT_BYTES: &str = "modstream_in_flight_bytes";
    /// Partitions paused for backpressure.
    pub const PAUSED_PARTITIONS: &str = "modstream_paused_partitions";
    /// Texts whose scores came from the score cache, and those it lacked.
    pub const CACHE_HITS_TOTAL: &str = "modstream_cache_hits_total";
    pub const CACHE_MISSES_TOTAL: &str = "modstream_cache_misses_total";
    /// 1 while the circuit breaker on the model is open.
    pub const INFERENCE_BREAKER_OPEN: &str = "modstream_inference_breaker_open";
    /// Partitions whose oldest undelivered event waited `limits.stall_after`.
    pub const STALLED_PARTITIONS: &str = "modstream_stalled_partitions";
    /// Age of a partition's oldest undelivered event (0: none). Labels:
    /// topic, partition.
    pub const OLDEST_PENDING_SECONDS: &str = "modstream_oldest_pending_seconds";
    /// Offset commits. Labels: outcome (ok, error).
    pub const COMMITS_TOTAL: &str = "modstream_commits_total";
    /// Rebalance events. Labels: kind (assign, revoke).
    pub const REBALANCES_TOTAL: &str = "modstream_rebalances_total";
    /// Records from a partition this member no longer owns, left for the new owner.
    pub const STALE_RECORDS_TOTAL: &str = "modstream_stale_records_total";
    /// Consumer errors. Labels: kind.
    pub const ERRORS_TOTAL: &str = "modstream_errors_total";
    /// Input record timestamp to verdict acknowledgement, seconds.
    pub const END_TO_END_SECONDS: &str = "modstream_end_to_end_latency_seconds";
    /// Tokens fed to a token model (real ones, not padding).
    pub const TOKENS_REAL_TOTAL: &str = "modstream_tokens_real_total";
    /// Tokens fed to a token model including padding; real ÷ padded is the
    /// padding efficiency.
    pub const TOKENS_PADDED_TOTAL: &str = "modstream_tokens_padded_total";
    /// The batch size and deadline in use (fixed, or chosen for
    /// `batching.target_p99`).
    pub const BATCH_TARGET_SIZE: &str = "modstream_batch_target_size";
    pub const BATCH_TARGET_DELAY_SECONDS: &str = "modstream_batch_target_delay_seconds";
    /// 1 while batching for throughput because the latency target cannot be
    /// held at the incoming rate (saturation).
    pub const BATCHING_SATURATED: &str = "modstream_batching_saturated";
    /// 1 while at saturation and the measured p99 is above `batching.target_p99`.
    pub const LATENCY_TARGET_MISSED: &str = "modstream_latency_target_missed";
    /// Hot reloads of the model and of the policy. Labels: outcome (loaded,
    /// refused).
    pub const MODEL_RELOADS_TOTAL: &str = "modstream_model_reloads_total";
    pub const POLICY_RELOADS_TOTAL: &str = "modstream_policy_reloads_total";
    /// Shadow scoring: live and shadow verdicts of the same events (labels:
    /// live, shadow), events skipped because the shadow queue was full, and
    /// failures (label: stage = load, score, deliver, thread).
    pub const SHADOW_AGREEMENT_TOTAL: &str = "modstream_shadow_agreement_total";
    pub const SHADOW_SKIPPED_TOTAL: &str = "modstream_shadow_skipped_total";
    pub const SHADOW_FAILURES_TOTAL: &str = "modstream_shadow_failures_total";
    /// Records behind the end of the partition (librdkafka statistics).
    /// Labels: topic, partition.
    pub const CONSUMER_LAG: &str = "modstream_consumer_lag";

    /// Every metric the service exports.
    pub const ALL: &[&str] = &[
        CONSUMED_TOTAL,
        VERDICTS_TOTAL,
        DLQ_TOTAL,
        PRODUCED_TOTAL,
        DELIVERY_FAILURES_TOTAL,
        UNDELIVERABLE_TOTAL,
        BATCH_SIZE,
        BATCH_WAIT_SECONDS,
        INFERENCE_SECONDS,
        INFERENCE_FAILURES_TOTAL,
        IN_FLIGHT_EVENTS,
        IN_FLIGHT_BYTES,
        PAUSED_PARTITIONS,
        STALLED_PARTITIONS,
        OLDEST_PENDING_SECONDS,
        INFERENCE_BREAKER_OPEN,
        CACHE_HITS_TOTAL,
        CACHE_MISSES_TOTAL,
        COMMITS_TOTAL,
        REBALANCES_TOTAL,
        STALE_RECORDS_TOTAL,
        ERRORS_TOTAL,
        END_TO_END_SECONDS,
        TOKENS_REAL_TOTAL,
        TOKENS_PADDED_TOTAL,
        BATCH_TARGET_SIZE,
        BATCH_TARGET_DELAY_SECONDS,
        BATCHING_SATURATED,
        LATENCY_TARGET_MISSED,
        MODEL_RELOADS_TOTAL,
        POLICY_RELOADS_TOTAL,
        SHADOW_AGREEMENT_TOTAL,
        SHADOW_SKIPPED_TOTAL,
        SHADOW_FAILURES_TOTAL,
        CONSUMER_LAG,
    ];
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
    describe_counter!(
        metric::UNDELIVERABLE_TOTAL,
        Unit::Count,
        "records the broker refused for good, also cut down; their offsets are committed"
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
        metric::TOKENS_REAL_TOTAL,
        Unit::Count,
        "tokens fed to a token model, padding excluded"
    );
    describe_counter!(
        metric::TOKENS_PADDED_TOTAL,
        Unit::Count,
        "tokens fed to a token model, padding included"
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
        metric::IN_FLIGHT_BYTES,
        Unit::Bytes,
        "bytes of consumed, not yet delivered records"
    );
    describe_gauge!(
        metric::PAUSED_PARTITIONS,
        Unit::Count,
        "partitions paused for backpressure"
    );
    describe_counter!(
        metric::CACHE_HITS_TOTAL,
        Unit::Count,
        "texts scored from the score cache"
    );
    describe_counter!(
        metric::CACHE_MISSES_TOTAL,
        Unit::Count,
        "texts the score cache lacked (scored by the model)"
    );
    describe_gauge!(
        metric::INFERENCE_BREAKER_OPEN,
        Unit::Count,
        "1 while the model fails every event and the circuit breaker holds events back"
    );
    describe_gauge!(
        metric::STALLED_PARTITIONS,
        Unit::Count,
        "partitions whose oldest undelivered event waited limits.stall_after or longer"
    );
    describe_gauge!(
        metric::OLDEST_PENDING_SECONDS,
        Unit::Seconds,
        "age of the partition's oldest undelivered event, 0 when none"
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
    describe_histogram!(
        metric::END_TO_END_SECONDS,
        Unit::Seconds,
        "input record timestamp to verdict acknowledgement"
    );
    describe_gauge!(
        metric::BATCH_TARGET_SIZE,
        Unit::Count,
        "batch size in use (fixed, or chosen for batching.target_p99)"
    );
    describe_gauge!(
        metric::BATCH_TARGET_DELAY_SECONDS,
        Unit::Seconds,
        "batch deadline in use (fixed, or chosen for batching.target_p99)"
    );
    describe_gauge!(
        metric::BATCHING_SATURATED,
        Unit::Count,
        "1 while batching for throughput: the latency target cannot be held at the incoming rate"
    );
    describe_gauge!(
        metric::LATENCY_TARGET_MISSED,
        Unit::Count,
        "1 while at saturation with the measured p99 above batching.target_p99"
    );
    describe_counter!(
        metric::MODEL_RELOADS_TOTAL,
        Unit::Count,
        "hot reloads of the model, by outcome (loaded, refused)"
    );
    describe_counter!(
        metric::POLICY_RELOADS_TOTAL,
        Unit::Count,
        "reloads of the policy on SIGHUP, by outcome (loaded, refused)"
    );
    describe_counter!(
        metric::SHADOW_AGREEMENT_TOTAL,
        Unit::Count,
        "live and shadow verdicts of the same events (the confusion matrix)"
    );
    describe_counter!(
        metric::SHADOW_SKIPPED_TOTAL,
        Unit::Count,
        "events the shadow model skipped: its queue was full"
    );
    describe_counter!(
        metric::SHADOW_FAILURES_TOTAL,
        Unit::Count,
        "shadow failures by stage (load, score, deliver, thread); the live path is never affected"
    );
    describe_gauge!(
        metric::CONSUMER_LAG,
        Unit::Count,
        "records behind the partition end, per input partition"
    );
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot install the metrics recorder: {0}")]
    Recorder(String),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Install the Prometheus recorder (histogram buckets for the `_seconds`
/// metrics and the batch size) and describe every metric.
pub fn install_recorder() -> Result<PrometheusHandle, TelemetryError> {
    let seconds = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let sizes = [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(metric::BATCH_SIZE.into()), &sizes))
        .map_err(|e| TelemetryError::Recorder(e.to_string()))?
        .install_recorder()
        .map_err(|e| TelemetryError::Recorder(e.to_string()))?;
    describe_metrics();
    Ok(handle)
}

/// Every counter and gauge at 0 from the start, with its labels where they
/// are known before any event (input topics, verdict kinds, DLQ reasons,
/// record kinds, outcomes), so that alerts and dashboards find their series
/// on an idle instance. Per-partition series appear with their partitions.
pub fn register_zeroes(settings: &crate::config::Settings) {
    use metrics::{counter, gauge};
    for topic in &settings.input.topics {
        counter!(metric::CONSUMED_TOTAL, "topic" => topic.clone()).absolute(0);
    }
    for verdict in [
        crate::verdict::ALLOW,
        crate::verdict::REVIEW,
        crate::verdict::BLOCK,
    ] {
        counter!(metric::VERDICTS_TOTAL, "verdict" => verdict).absolute(0);
    }
    for reason in crate::event::RejectReason::ALL {
        counter!(metric::DLQ_TOTAL, "reason" => reason.code()).absolute(0);
    }
    for kind in ["verdict", "dlq"] {
        counter!(metric::PRODUCED_TOTAL, "kind" => kind).absolute(0);
        counter!(metric::DELIVERY_FAILURES_TOTAL, "kind" => kind).absolute(0);
        counter!(metric::UNDELIVERABLE_TOTAL, "kind" => kind).absolute(0);
    }
    for outcome in ["ok", "error"] {
        counter!(metric::COMMITS_TOTAL, "outcome" => outcome).absolute(0);
    }
    for kind in ["assign", "revoke"] {
        counter!(metric::REBALANCES_TOTAL, "kind" => kind).absolute(0);
    }
    for outcome in ["loaded", "refused"] {
        counter!(metric::MODEL_RELOADS_TOTAL, "outcome" => outcome).absolute(0);
        counter!(metric::POLICY_RELOADS_TOTAL, "outcome" => outcome).absolute(0);
    }
    let verdicts = [
        crate::verdict::ALLOW,
        crate::verdict::REVIEW,
        crate::verdict::BLOCK,
    ];
    for live in verdicts {
        for shadow in verdicts {
            counter!(metric::SHADOW_AGREEMENT_TOTAL, "live" => live, "shadow" => shadow)
                .absolute(0);
        }
    }
    for stage in ["load", "score", "deliver", "thread"] {
        counter!(metric::SHADOW_FAILURES_TOTAL, "stage" => stage).absolute(0);
    }
    counter!(metric::SHADOW_SKIPPED_TOTAL).absolute(0);
    for kind in ["client", "rebalance", "consume"] {
        counter!(metric::ERRORS_TOTAL, "kind" => kind).absolute(0);
    }
    for name in [
        metric::INFERENCE_FAILURES_TOTAL,
        metric::CACHE_HITS_TOTAL,
        metric::CACHE_MISSES_TOTAL,
        metric::STALE_RECORDS_TOTAL,
        metric::TOKENS_REAL_TOTAL,
        metric::TOKENS_PADDED_TOTAL,
    ] {
        counter!(name).absolute(0);
    }
    for name in [
        metric::IN_FLIGHT_EVENTS,
        metric::IN_FLIGHT_BYTES,
        metric::PAUSED_PARTITIONS,
        metric::STALLED_PARTITIONS,
        metric::INFERENCE_BREAKER_OPEN,
        metric::BATCHING_SATURATED,
        metric::LATENCY_TARGET_MISSED,
    ] {
        gauge!(name).set(0.0);
    }
    let b = &settings.batching;
    gauge!(metric::BATCH_TARGET_SIZE).set(b.max_batch_size as f64);
    gauge!(metric::BATCH_TARGET_DELAY_SECONDS).set(b.max_batch_delay.as_secs_f64());
}

/// What /readyz reports: ready once the model is loaded, the consumer has
/// joined (partitions assigned or waiting for an assignment) and the
/// producer reached the cluster, and while no partition is stalled.
#[derive(Debug, Default)]
pub struct Health {
    pub model_loaded: AtomicBool,
    pub consumer_ready: AtomicBool,
    pub producer_connected: AtomicBool,
    /// The model fails every event: the circuit breaker is open.
    pub model_failing: AtomicBool,
    /// Written by the hub's watchdog, read by /readyz.
    stalled: std::sync::Mutex<Vec<Stall>>,
    /// Written by the consumer thread: assigned partitions that lag yet are
    /// not fetched.
    unfetched: std::sync::Mutex<Vec<Stall>>,
    /// Deliveries failing for the whole service, and why.
    delivery_failing: std::sync::Mutex<Option<String>>,
}

/// A partition whose oldest undelivered event has waited too long.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stall {
    pub topic: String,
    pub partition: i32,
    /// The oldest undelivered offset: the committed position stays there.
    pub offset: i64,
    pub waiting_s: u64,
    /// Undelivered events of the partition.
    pub pending: usize,
}

impl Health {
    pub fn ready(&self) -> bool {
        self.model_loaded.load(Ordering::SeqCst)
            && self.consumer_ready.load(Ordering::SeqCst)
            && self.producer_connected.load(Ordering::SeqCst)
            && !self.model_failing.load(Ordering::SeqCst)
            && self.stalled().is_empty()
            && self.unfetched().is_empty()
            && self.delivery_failing().is_none()
    }

    pub fn stalled(&self) -> Vec<Stall> {
        self.stalled.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn delivery_failing(&self) -> Option<String> {
        self.delivery_failing.lock().ok().and_then(|d| d.clone())
    }

    pub fn set_delivery_failing(&self, why: Option<String>) {
        if let Ok(mut d) = self.delivery_failing.lock() {
            *d = why;
        }
    }

    pub fn set_stalled(&self, stalled: Vec<Stall>) {
        if let Ok(mut s) = self.stalled.lock() {
            *s = stalled;
        }
        self.count_stalls();
    }

    pub fn unfetched(&self) -> Vec<Stall> {
        self.unfetched.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn set_unfetched(&self, unfetched: Vec<Stall>) {
        if let Ok(mut s) = self.unfetched.lock() {
            *s = unfetched;
        }
        self.count_stalls();
    }

    fn count_stalls(&self) {
        let n = self.stalled().len() + self.unfetched().len();
        metrics::gauge!(metric::STALLED_PARTITIONS).set(n as f64);
    }

    fn report(&self) -> String {
        serde_json::json!({
            "ready": self.ready(),
            "model_loaded": self.model_loaded.load(Ordering::SeqCst),
            "consumer_ready": self.consumer_ready.load(Ordering::SeqCst),
            "producer_connected": self.producer_connected.load(Ordering::SeqCst),
            "model_failing": self.model_failing.load(Ordering::SeqCst),
            "delivery_failing": self.delivery_failing(),
            "stalled": self.stalled(),
            "unfetched": self.unfetched(),
        })
        .to_string()
    }
}

/// Serve /metrics, /healthz and /readyz on `addr` until `stop` fires. Binds
/// before returning, so a taken port fails the start.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    health: Arc<Health>,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, TelemetryError> {
    use axum::http::{StatusCode, header};
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| TelemetryError::Listen { addr, source })?;
    let ready_health = health.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let body = metrics.render();
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let h = ready_health.clone();
                async move {
                    let status = if h.ready() {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    (
                        status,
                        [(header::CONTENT_TYPE, "application/json")],
                        h.report(),
                    )
                }
            }),
        );
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    }))
}

/// Text or JSON logs on stderr; RUST_LOG wins over `telemetry.log_level`.
/// ONNX Runtime's and librdkafka's own logs stay at warn unless a directive
/// names them (`RUST_LOG=ort=info`). Colour only on a terminal.
pub fn init_logging(settings: &TelemetrySettings) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let directives = std::env::var("RUST_LOG").unwrap_or_else(|_| settings.log_level.clone());
    let filter = EnvFilter::try_new(quiet_dependencies(&directives))
        .unwrap_or_else(|_| EnvFilter::new(quiet_dependencies(&settings.log_level)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if settings.log_format == crate::config::LogFormat::Json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// `directives` plus `ort=warn` and `librdkafka=warn`, unless they name
/// those targets themselves.
fn quiet_dependencies(directives: &str) -> String {
    let mut out = directives.trim().to_string();
    for target in ["ort", "librdkafka"] {
        let named = out
            .split(',')
            .any(|d| d.trim().split(['=', '[']).next() == Some(target));
        if !named {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(target);
            out.push_str("=warn");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::quiet_dependencies;

    #[test]
    fn onnx_runtime_and_librdkafka_stay_at_warn_unless_named() {
        assert_eq!(quiet_dependencies("info"), "info,ort=warn,librdkafka=warn");
        assert_eq!(
            quiet_dependencies("debug,ort=info"),
            "debug,ort=info,librdkafka=warn"
        );
        assert_eq!(
            quiet_dependencies("ort[span]=trace"),
            "ort[span]=trace,librdkafka=warn"
        );
        assert_eq!(quiet_dependencies(""), "ort=warn,librdkafka=warn");
    }
}
