//! The input-format sweep (`--formats`): the same events as today's JSON,
//! as a nested post read by a mapping, and as Avro and Protobuf in the
//! Schema Registry wire format (schemas registered in `--registry-url`),
//! each at saturation and at half of it, the same way; then the decoding
//! alone (value to event, one thread) for the share of an event's CPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prost_reflect::{DynamicMessage, MessageDescriptor};
use serde_json::{Value, json};

use super::BenchOptions;
use super::measure::{self, Batching, Clock};
use crate::print::Print;
use modstream::config::{InputFormat, Mapping, Settings};
use modstream::schema::codec::{Codec, Texts};
use modstream::schema::{RegistryClient, SchemaStore};
use modstream::tools::generator::{GeneratedEvent, generate};
use modstream::tools::report::FormatRow;

pub use modstream::tools::report::BenchFormat;

const AVRO: &str = r#"{"type": "record", "name": "Post", "namespace": "bench", "fields": [
  {"name": "id", "type": "string"}, {"name": "title", "type": "string"},
  {"name": "body", "type": "string"}, {"name": "created_utc", "type": "double"},
  {"name": "community", "type": "string"}]}"#;
const PROTO: &str = "syntax = \"proto3\"; package bench; message Post { string id = 1; string title = 2; string body = 3; double created_utc = 4; string community = 5; }";

/// How the bench's events are written, and which models judge them, for
/// one contender of a sweep (set by the format and model sweeps).
#[derive(Clone, Default)]
pub struct Encoding {
    encoder: Option<Arc<Encoder>>,
    models: Option<Arc<ModelSetup>>,
}

/// Several models and a policy over them (`--second-model`): every
/// `tenant_every`-th event gets the tenant the policy gives the second
/// model (1: every event).
#[derive(Debug)]
pub struct ModelSetup {
    pub models: Vec<modstream::config::ModelSettings>,
    pub policy: std::path::PathBuf,
    pub tenant_every: usize,
}

/// The tenant whose events the second model scores.
pub const SECOND_MODEL_TENANT: &str = "second";

impl std::fmt::Debug for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match (&self.encoder, &self.models) {
            (None, None) => "json",
            (Some(_), _) => "encoded",
            (None, Some(_)) => "json, several models",
        })
    }
}

impl Encoding {
    pub fn with_models(setup: ModelSetup) -> Encoding {
        Encoding {
            encoder: None,
            models: Some(Arc::new(setup)),
        }
    }

    /// The policy file of a several-models contender.
    pub fn policy_file(&self) -> Option<&std::path::Path> {
        self.models.as_ref().map(|m| m.policy.as_path())
    }

    /// The events with their payloads rewritten.
    pub fn apply(&self, mut events: Vec<GeneratedEvent>) -> Vec<GeneratedEvent> {
        if let Some(e) = &self.encoder {
            for event in &mut events {
                event.payload = e.encode(&event.payload);
            }
        }
        if let Some(m) = self.models.as_ref().filter(|m| m.tenant_every > 0) {
            for (i, event) in events.iter_mut().enumerate() {
                if i % m.tenant_every == 0
                    && let Ok(Value::Object(mut o)) = serde_json::from_slice(&event.payload)
                {
                    o.insert("tenant".into(), SECOND_MODEL_TENANT.into());
                    event.payload = Value::Object(o).to_string().into_bytes();
                }
            }
        }
        events
    }

    /// The settings that read them.
    pub fn configure(&self, s: &mut Settings) {
        if let Some(m) = &self.models {
            s.inference.models = m.models.clone();
            s.policy.file = Some(m.policy.clone());
        }
        let Some(e) = &self.encoder else {
            return;
        };
        s.input.format = e.input_format();
        s.input.mapping = Mapping {
            id: e.pointer("/id"),
            text: vec![e.pointer("/title"), e.pointer("/body")],
            tenant: e.pointer("/community"),
            created_at: e.pointer("/created_utc"),
            ..Mapping::default()
        };
        s.schema_registry.url = e.registry.clone();
    }
}

pub struct Encoder {
    format: BenchFormat,
    registry: Option<String>,
    id: u32,
    avro: Option<apache_avro::Schema>,
    proto: Option<MessageDescriptor>,
}

impl Encoder {
    fn input_format(&self) -> InputFormat {
        match self.format {
            BenchFormat::Json | BenchFormat::MappedJson => InputFormat::Json,
            BenchFormat::Avro => InputFormat::Avro,
            BenchFormat::Protobuf => InputFormat::Protobuf,
        }
    }

    /// Mapped JSON nests the post; the registry formats are flat records.
    fn pointer(&self, field: &str) -> String {
        match (self.format, field) {
            (BenchFormat::MappedJson, "/community") => "/community/name".into(),
            (BenchFormat::MappedJson, f) => format!("/post{f}"),
            (_, f) => f.into(),
        }
    }

    /// A generator payload (`{"event_id", "text", ...}`) as this format.
    fn encode(&self, payload: &[u8]) -> Vec<u8> {
        let v: Value = serde_json::from_slice(payload).unwrap_or_default();
        let (id, text) = (
            v["event_id"].as_str().unwrap_or_default(),
            v["text"].as_str().unwrap_or_default(),
        );
        let created = 1_796_099_449.85;
        match self.format {
            BenchFormat::Json => payload.to_vec(),
            BenchFormat::MappedJson => json!({
                "post": {"id": id, "title": "", "body": text, "created_utc": created},
                "author": {"id": 42}, "community": {"name": "bench"},
            })
            .to_string()
            .into_bytes(),
            BenchFormat::Avro => {
                use apache_avro::types::Value as A;
                let record = A::Record(vec![
                    ("id".into(), A::String(id.into())),
                    ("title".into(), A::String(String::new())),
                    ("body".into(), A::String(text.into())),
                    ("created_utc".into(), A::Double(created)),
                    ("community".into(), A::String("bench".into())),
                ]);
                let schema = self.avro.as_ref().unwrap_or(&apache_avro::Schema::Null);
                let body = apache_avro::to_avro_datum(schema, record).unwrap_or_default();
                self.framed(&[], &body)
            }
            BenchFormat::Protobuf => {
                let Some(desc) = &self.proto else {
                    return Vec::new();
                };
                let mut m = DynamicMessage::new(desc.clone());
                use prost_reflect::Value as P;
                m.set_field_by_name("id", P::String(id.into()));
                m.set_field_by_name("body", P::String(text.into()));
                m.set_field_by_name("created_utc", P::F64(created));
                m.set_field_by_name("community", P::String("bench".into()));
                use prost::Message;
                self.framed(&[0], &m.encode_to_vec())
            }
        }
    }

    fn framed(&self, indexes: &[u8], body: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(indexes);
        out.extend_from_slice(body);
        out
    }
}

/// The encoding of `format`, its schema registered under `<input>-value`
/// (the bench's topics are fresh per run; the subject is shared by name).
pub async fn encoding(format: BenchFormat, registry: Option<&str>) -> anyhow::Result<Encoding> {
    if format == BenchFormat::Json {
        return Ok(Encoding::default());
    }
    let mut e = Encoder {
        format,
        registry: registry.map(str::to_string),
        id: 0,
        avro: None,
        proto: None,
    };
    let (schema_type, text) = match format {
        BenchFormat::Avro => ("AVRO", AVRO),
        BenchFormat::Protobuf => ("PROTOBUF", PROTO),
        _ => {
            return Ok(Encoding {
                encoder: Some(Arc::new(e)),
                models: None,
            });
        }
    };
    let url =
        registry.ok_or_else(|| anyhow::anyhow!("--formats avro,protobuf need --registry-url"))?;
    let client = RegistryClient::new(&modstream::config::SchemaRegistrySettings {
        url: Some(url.to_string()),
        ..Default::default()
    })
    .map_err(anyhow::Error::msg)?;
    e.id = client
        .register(
            &format!("bench-{}-value", schema_type.to_lowercase()),
            text,
            schema_type,
        )
        .await?;
    match Codec::build(&Texts {
        schema_type: schema_type.into(),
        schema: text.into(),
        references: Vec::new(),
    })
    .map_err(anyhow::Error::msg)?
    {
        Codec::Avro { schema, .. } => e.avro = Some(schema),
        Codec::Protobuf { pool, file } => {
            e.proto = pool
                .get_file_by_name(&file)
                .and_then(|f| f.messages().next());
        }
        Codec::JsonSchema => {}
    }
    Ok(Encoding {
        encoder: Some(Arc::new(e)),
        models: None,
    })
}

/// Each of `opts.formats` on the default cell (64 / 20 ms): saturation on
/// the same events, then paced at half of it; then the decoding alone.
pub async fn rows(opts: &BenchOptions) -> anyhow::Result<Vec<FormatRow>> {
    let cell = Batching::fixed(64, 20);
    let mut rows = Vec::new();
    for &format in &opts.formats {
        let encoding = encoding(format, opts.registry_url.as_deref()).await?;
        let o = opts.with_encoding(encoding.clone());
        let events = generate(opts.events, 0, "f-");
        // Written in the format here; the latency run writes its own.
        let written = encoding.apply(events.clone());
        let measure::Saturated { per_s, summary, .. } =
            measure::saturation_clocked(&o, cell, written, Clock::Verdicts).await?;
        anyhow::ensure!(
            summary.dlq == 0,
            "{format:?}: {} dead letters: the events do not fit their mapping",
            summary.dlq
        );
        let latency = measure::latency(&o, cell, 0.5, per_s * 0.5).await?;
        let decode_us = decode_micros(&encoding, &o, &events).await?;
        // The CPU an event gets at saturation: every core's time over the
        // verdicts of a second.
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        let row = FormatRow {
            format,
            saturation_per_s: per_s,
            p50_ms: latency.p50_ms,
            p99_ms: latency.p99_ms,
            decode_us,
            decode_share: decode_us / (cores * 1e6 / per_s),
        };
        row.print();
        rows.push(row);
    }
    Ok(rows)
}

/// Microseconds per event to read the value into an event (registry
/// decoding and the mapping; schemas fetched once before), one thread.
async fn decode_micros(
    encoding: &Encoding,
    opts: &BenchOptions,
    events: &[GeneratedEvent],
) -> anyhow::Result<f64> {
    let mut s = modstream::tools::demo::demo_settings("127.0.0.1:1", "decode")?;
    s.inference = measure::inference_settings(opts);
    encoding.configure(&mut s);
    let encoded = encoding.apply(events.to_vec());
    let decoder = modstream::event::Decoder::new(&s.input, &s.limits);
    let store = SchemaStore::from_settings(&s).map_err(anyhow::Error::msg)?;
    if let (Some(store), Some(first)) = (&store, encoded.first())
        && let Some(id) = store.missing(Some(&first.payload))
    {
        store.fetch(id).await?;
    }
    let topic = s.input.topics[0].clone();
    let started = Instant::now();
    let mut accepted = 0usize;
    for e in &encoded {
        let parts = modstream::event::RecordParts {
            key: Some(e.key.as_bytes()),
            payload: Some(&e.payload),
            headers: &[],
        };
        let event = match &store {
            None => decoder.decode(&topic, parts),
            Some(store) => decoder.decode_with(&topic, parts, |b| {
                store.decode(b).map_err(|e| {
                    modstream::event::reject(
                        modstream::event::RejectReason::Undecodable,
                        e.to_string(),
                    )
                })
            }),
        };
        accepted += usize::from(event.is_ok());
    }
    let took = started.elapsed().max(Duration::from_nanos(1));
    anyhow::ensure!(
        accepted == encoded.len(),
        "{} events did not decode",
        encoded.len() - accepted
    );
    Ok(took.as_secs_f64() * 1e6 / encoded.len().max(1) as f64)
}
