//! Metrics (names in [`metric`]), /metrics, /healthz, /readyz
//! ([`health`]) and logging set-up.

use std::net::SocketAddr;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::config::TelemetrySettings;
use crate::event::RejectReason;
use crate::record::RecordKind;
use crate::verdict::Verdict;

pub mod health;
pub mod metric;

pub use health::{Health, Stall, StallKind, StallReporter, serve};
use metric::{CommitOutcome, ErrorKind, RebalanceKind, ReloadOutcome, ShadowStage};

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

/// Describe every metric with its unit (for /metrics HELP lines).
pub fn describe_metrics() {
    for m in metric::TABLE {
        match m.kind {
            metric::Type::Counter => metrics::describe_counter!(m.name, m.unit, m.help),
            metric::Type::Gauge => metrics::describe_gauge!(m.name, m.unit, m.help),
            metric::Type::Histogram => metrics::describe_histogram!(m.name, m.unit, m.help),
        }
    }
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
    for verdict in Verdict::ALL {
        counter!(metric::VERDICTS_TOTAL, "verdict" => verdict.as_str()).absolute(0);
    }
    for reason in RejectReason::ALL {
        counter!(metric::DLQ_TOTAL, "reason" => reason.code()).absolute(0);
    }
    for kind in RecordKind::ALL.map(RecordKind::as_str) {
        counter!(metric::PRODUCED_TOTAL, "kind" => kind).absolute(0);
        counter!(metric::DELIVERY_FAILURES_TOTAL, "kind" => kind).absolute(0);
        counter!(metric::UNDELIVERABLE_TOTAL, "kind" => kind).absolute(0);
    }
    for outcome in CommitOutcome::ALL {
        counter!(metric::COMMITS_TOTAL, "outcome" => outcome.as_str()).absolute(0);
    }
    for kind in RebalanceKind::ALL {
        counter!(metric::REBALANCES_TOTAL, "kind" => kind.as_str()).absolute(0);
    }
    for outcome in ReloadOutcome::ALL.iter().map(|o| o.as_str()) {
        counter!(metric::MODEL_RELOADS_TOTAL, "outcome" => outcome).absolute(0);
        counter!(metric::POLICY_RELOADS_TOTAL, "outcome" => outcome).absolute(0);
    }
    for live in Verdict::ALL {
        for shadow in Verdict::ALL {
            counter!(metric::SHADOW_AGREEMENT_TOTAL, "live" => live.as_str(), "shadow" => shadow.as_str())
                .absolute(0);
        }
    }
    for stage in ShadowStage::ALL {
        counter!(metric::SHADOW_FAILURES_TOTAL, "stage" => stage.as_str()).absolute(0);
    }
    for kind in ErrorKind::ALL {
        counter!(metric::ERRORS_TOTAL, "kind" => kind.as_str()).absolute(0);
    }
    for m in metric::TABLE {
        // Those without labels; the labelled ones are above.
        let labelled = [
            metric::CONSUMED_TOTAL,
            metric::VERDICTS_TOTAL,
            metric::DLQ_TOTAL,
            metric::PRODUCED_TOTAL,
            metric::DELIVERY_FAILURES_TOTAL,
            metric::UNDELIVERABLE_TOTAL,
            metric::COMMITS_TOTAL,
            metric::REBALANCES_TOTAL,
            metric::MODEL_RELOADS_TOTAL,
            metric::POLICY_RELOADS_TOTAL,
            metric::SHADOW_AGREEMENT_TOTAL,
            metric::SHADOW_FAILURES_TOTAL,
            metric::ERRORS_TOTAL,
            // Per partition: they appear with their partitions.
            metric::OLDEST_PENDING_SECONDS,
            metric::CONSUMER_LAG,
        ];
        if labelled.contains(&m.name) {
            continue;
        }
        match m.kind {
            metric::Type::Counter => counter!(m.name).absolute(0),
            metric::Type::Gauge => gauge!(m.name).set(0.0),
            metric::Type::Histogram => {}
        }
    }
    let b = &settings.batching;
    gauge!(metric::BATCH_TARGET_SIZE).set(b.max_batch_size as f64);
    gauge!(metric::BATCH_TARGET_DELAY_SECONDS).set(b.max_batch_delay.as_secs_f64());
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
