//! Spans, exported over OTLP/HTTP (`[tracing]`, and the standard `OTEL_*`
//! variables), as OpenTelemetry's messaging conventions describe a batch
//! consumer:
//! - one span per post, `process TOPIC` (consumer), from the consumer
//!   thread's poll to its verdict's acknowledgement, the child of the
//!   post's own trace context when it carries one (else a trace of its
//!   own); its verdict's `traceparent` names this span;
//! - one span per model run, `score MODEL`, linked to the trace context of
//!   each post of its batch that carries one, with the batch's size, the
//!   model and version, and the time its oldest post waited for the run
//!   against the time in the model.
//!
//! Off, none of this runs: the hub holds no [`Traces`].

use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};

use super::trace_context::TraceContext;
use crate::config::TracingSettings;

/// Spans are recorded and exported; cheap to clone.
#[derive(Clone)]
pub struct Traces {
    tracer: SdkTracer,
    group: std::sync::Arc<str>,
}

/// The exporter's owner: [`Exporting::shutdown`] sends what is left.
pub struct Exporting {
    provider: SdkTracerProvider,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot start the OTLP span exporter: {0}")]
pub struct TracesError(String);

/// With tracing on ([`TracingSettings::enabled`]): the spans' recorder
/// and their exporter.
pub fn start(
    settings: &TracingSettings,
    group: &str,
) -> Result<Option<(Traces, Exporting)>, TracesError> {
    if !settings.enabled() {
        return Ok(None);
    }
    let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_http();
    if let Some(endpoint) = &settings.endpoint {
        exporter = exporter.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
    }
    let exporter = exporter.build().map_err(|e| TracesError(e.to_string()))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("modstream");
    }
    let mut provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build());
    // OTEL_TRACES_SAMPLER, when set, is read by the SDK itself.
    if std::env::var_os("OTEL_TRACES_SAMPLER").is_none() {
        let ratio = Sampler::TraceIdRatioBased(settings.sampling_ratio);
        provider = provider.with_sampler(Sampler::ParentBased(Box::new(ratio)));
    }
    let provider = provider.build();
    let traces = Traces {
        tracer: provider.tracer("modstream"),
        group: group.into(),
    };
    Ok(Some((traces, Exporting { provider })))
}

impl Exporting {
    /// Sends the spans still held (blocking: the exporter's own thread
    /// answers, within its timeout).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(Duration::from_secs(10)) {
            tracing::warn!(error = %e, "spans not all exported at shutdown");
        }
    }
}

/// A post as its span describes it.
pub struct Post<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// Its producer's trace context, if it carries one.
    pub parent: Option<&'a TraceContext>,
    pub received_at: Instant,
    pub rule: &'a str,
    pub verdict: &'static str,
    /// The state rule that raised its verdict, if one did.
    pub state_rule: Option<&'a str>,
}

/// A post's span, open until its verdict is acknowledged.
pub struct PostSpan {
    span: opentelemetry_sdk::trace::Span,
}

impl std::fmt::Debug for PostSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PostSpan")
            .field(self.span.span_context())
            .finish()
    }
}

/// A model run as its span describes it.
pub struct Run<'a> {
    pub model: &'a str,
    pub version: &'a str,
    pub size: usize,
    /// Time in the model.
    pub elapsed: Duration,
    /// When its oldest post was polled.
    pub oldest: Option<Instant>,
    /// The trace contexts of its posts that carry one.
    pub links: Vec<TraceContext>,
}

impl Traces {
    /// A post's span, started when it was polled.
    pub fn post(&self, post: Post<'_>) -> PostSpan {
        let parent = match post.parent {
            Some(p) => Context::new().with_remote_span_context(span_context(p)),
            None => Context::new(),
        };
        let builder = self
            .tracer
            .span_builder(format!("process {}", post.topic))
            .with_kind(SpanKind::Consumer)
            .with_start_time(system_time(post.received_at));
        let mut span = self.tracer.build_with_context(builder, &parent);
        // The attributes only for a span that is kept (no sampler here
        // reads them): a post sampled out costs its ids and little else.
        if span.is_recording() {
            span.set_attributes([
                KeyValue::new("messaging.system", "kafka"),
                KeyValue::new("messaging.operation.name", "process"),
                KeyValue::new("messaging.operation.type", "process"),
                KeyValue::new("messaging.consumer.group.name", self.group.to_string()),
                KeyValue::new("messaging.destination.name", post.topic.to_string()),
                KeyValue::new(
                    "messaging.destination.partition.id",
                    post.partition.to_string(),
                ),
                KeyValue::new("messaging.kafka.offset", post.offset),
                KeyValue::new("modstream.rule", post.rule.to_string()),
                KeyValue::new("modstream.verdict", post.verdict),
            ]);
            if let Some(rule) = post.state_rule {
                span.set_attribute(KeyValue::new("modstream.state_rule", rule.to_string()));
            }
        }
        PostSpan { span }
    }

    /// A model run's span, recorded whole when its results are back.
    pub fn run(&self, run: Run<'_>) -> Option<TraceContext> {
        let now = Instant::now();
        let started = now.checked_sub(run.elapsed).unwrap_or(now);
        let waited = run
            .oldest
            .map_or(Duration::ZERO, |o| started.saturating_duration_since(o));
        let links = run
            .links
            .iter()
            .map(|c| Link::with_context(span_context(c)))
            .collect();
        let builder = self
            .tracer
            .span_builder(format!("score {}", run.model))
            .with_kind(SpanKind::Consumer)
            .with_start_time(system_time(started))
            .with_links(links)
            .with_attributes(vec![
                KeyValue::new("messaging.system", "kafka"),
                KeyValue::new("messaging.operation.name", "process"),
                KeyValue::new("messaging.operation.type", "process"),
                KeyValue::new("messaging.consumer.group.name", self.group.to_string()),
                KeyValue::new("messaging.batch.message_count", run.size as i64),
                KeyValue::new("modstream.model", run.model.to_string()),
                KeyValue::new("modstream.model.version", run.version.to_string()),
                KeyValue::new("modstream.batch.wait_ms", waited.as_secs_f64() * 1000.0),
                KeyValue::new("modstream.model_ms", run.elapsed.as_secs_f64() * 1000.0),
            ]);
        let mut span = self.tracer.build(builder);
        let context = trace_context(span.span_context());
        span.end();
        context
    }
}

impl PostSpan {
    /// The trace context its post's verdict carries: this span as parent.
    pub fn context(&self) -> Option<TraceContext> {
        trace_context(self.span.span_context())
    }

    /// Its verdict acknowledged (`Ok`) or not, now.
    pub fn end(mut self, delivered: Result<(), String>) {
        if let Err(e) = delivered {
            self.span.set_status(Status::error(e));
        }
        self.span.end();
    }
}

fn span_context(c: &TraceContext) -> SpanContext {
    let state = c
        .state
        .as_deref()
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    SpanContext::new(
        TraceId::from_bytes(c.trace_id),
        SpanId::from_bytes(c.span_id),
        TraceFlags::new(c.flags),
        true,
        state,
    )
}

fn trace_context(c: &SpanContext) -> Option<TraceContext> {
    if !c.is_valid() {
        return None;
    }
    let state = c.trace_state().header();
    Some(TraceContext {
        trace_id: c.trace_id().to_bytes(),
        span_id: c.span_id().to_bytes(),
        flags: c.trace_flags().to_u8(),
        state: (!state.is_empty()).then_some(state),
    })
}

/// The wall-clock time of a monotonic instant (spans carry wall time).
fn system_time(at: Instant) -> SystemTime {
    let ago = at.elapsed();
    SystemTime::now()
        .checked_sub(ago)
        .unwrap_or_else(SystemTime::now)
}
