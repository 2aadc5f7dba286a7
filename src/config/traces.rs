//! `[tracing]`: spans over OTLP/HTTP to a trace backend
//! ([`crate::telemetry::traces`]), off unless an endpoint is given.

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingSettings {
    /// The collector's OTLP/HTTP base URL (`/v1/traces` is appended), as
    /// OTEL_EXPORTER_OTLP_ENDPOINT; unset, those variables decide.
    pub endpoint: Option<String>,
    /// The share of posts without a sampled parent whose spans are kept
    /// (a post whose producer sampled it is always kept, one it did not
    /// never is: the parent decides).
    pub sampling_ratio: f64,
}

impl Default for TracingSettings {
    fn default() -> Self {
        TracingSettings {
            endpoint: None,
            sampling_ratio: 1.0,
        }
    }
}

/// An environment variable that names an OTLP endpoint for traces.
pub const OTEL_ENDPOINTS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

impl TracingSettings {
    /// On with `endpoint`, or with an OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
    /// variable; OTEL_SDK_DISABLED=true turns it off.
    pub fn enabled(&self) -> bool {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        !disabled && (self.endpoint.is_some() || OTEL_ENDPOINTS.iter().any(|n| env(n).is_some()))
    }
}

pub(super) fn validate(t: &TracingSettings) -> Result<(), ConfigError> {
    if !(0.0..=1.0).contains(&t.sampling_ratio) {
        return Err(invalid("tracing.sampling_ratio", "0 to 1"));
    }
    if let Some(endpoint) = &t.endpoint
        && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
    {
        return Err(invalid(
            "tracing.endpoint",
            "an http:// or https:// URL (OTLP over HTTP, e.g. http://127.0.0.1:4318)",
        ));
    }
    Ok(())
}
