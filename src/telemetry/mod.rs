//! Metrics (names in [`metric`]), /metrics, /healthz, /readyz
//! ([`health`]) and logging set-up. Every series at 0 from the start is
//! [`crate::pipeline::register_zeroes`]: it needs the label values of the
//! stages above this layer.

use std::net::SocketAddr;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::config::TelemetrySettings;

pub mod health;
pub mod metric;
mod tally;
pub mod trace_context;
pub mod traces;

pub use health::{Health, MissingTopic, ModelPlacement, Stall, StallKind, StallReporter, serve};
pub use tally::{FaultCounts, FaultTally};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot install the metrics recorder: {0}")]
    Recorder(String),
    #[error(
        "cannot listen on {addr} (telemetry.listen; MODSTREAM__TELEMETRY__LISTEN=127.0.0.1:0 takes any free port)"
    )]
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
