//! Verdicts in Avro (`output.format = "avro"`): the verdict schema is
//! registered under `<output.topic>-value` at start (the subject
//! registry-aware readers look up), and each verdict is written in the
//! wire format with the id the registry gave it.

use serde_json::Value;

use super::{FetchError, RegistryClient};

/// The verdict record of the README, field for field.
pub const VERDICT_SCHEMA: &str = r#"{
  "type": "record", "name": "Verdict", "namespace": "dev.modstream",
  "fields": [
    {"name": "event_id", "type": "string"},
    {"name": "verdict", "type": "string"},
    {"name": "scores", "type": {"type": "map", "values": "double"}},
    {"name": "model", "type": {"type": "record", "name": "ModelRef", "fields": [
      {"name": "name", "type": "string"}, {"name": "version", "type": "string"}]}},
    {"name": "source", "type": {"type": "record", "name": "SourceRef", "fields": [
      {"name": "topic", "type": "string"}, {"name": "partition", "type": "int"},
      {"name": "offset", "type": "long"}]}},
    {"name": "latency_ms", "type": ["null", "long"], "default": null},
    {"name": "processed_at", "type": "string"},
    {"name": "reason", "type": {"type": "record", "name": "Reason", "fields": [
      {"name": "human_review", "type": "boolean"},
      {"name": "models", "type": {"type": "array", "items": {"type": "record", "name": "ModelReason", "fields": [
        {"name": "crossed", "type": {"type": "array", "items": {"type": "record", "name": "Crossing", "fields": [
          {"name": "label", "type": "string"}, {"name": "score", "type": "double"},
          {"name": "threshold", "type": "double"}, {"name": "verdict", "type": "string"}]}}},
        {"name": "deferred", "type": "boolean", "default": false},
        {"name": "id", "type": "string"}, {"name": "name", "type": "string"},
        {"name": "scores", "type": {"type": "map", "values": "double"}},
        {"name": "version", "type": "string"}]}}},
      {"name": "policy", "type": "string"}, {"name": "rule", "type": "string"},
      {"name": "match", "type": ["null", {"type": "record", "name": "ListMatch", "fields": [
        {"name": "distance", "type": "double"}, {"name": "id", "type": "string"},
        {"name": "label", "type": "string"}, {"name": "list", "type": "string"},
        {"name": "verdict", "type": "string"}]}], "default": null},
      {"name": "reused", "type": "boolean", "default": false},
      {"name": "wave", "type": ["null", {"type": "record", "name": "Wave", "fields": [
        {"name": "first_seen", "type": "string"}, {"name": "id", "type": "string"},
        {"name": "size", "type": "int"}, {"name": "users", "type": "int"}]}], "default": null}]},
     "default": {"human_review": false, "models": [], "policy": "", "rule": ""}},
    {"name": "review_priority", "type": ["null", "string"], "default": null},
    {"name": "tenant", "type": ["null", "string"], "default": null},
    {"name": "warnings", "type": {"type": "array", "items": "string"}, "default": []}
  ]
}"#;

/// Writes verdicts in Avro with the registered schema's id.
#[derive(Clone)]
pub struct VerdictEncoder {
    schema: apache_avro::Schema,
    id: u32,
}

impl VerdictEncoder {
    /// Register the verdict schema under `<topic>-value`.
    pub async fn register(
        client: &RegistryClient,
        topic: &str,
    ) -> Result<VerdictEncoder, FetchError> {
        let id = client
            .register(&format!("{topic}-value"), VERDICT_SCHEMA, "AVRO")
            .await?;
        Ok(VerdictEncoder::with_id(id))
    }

    pub fn with_id(id: u32) -> VerdictEncoder {
        // The schema is a constant of this file (a test parses it).
        let schema =
            apache_avro::Schema::parse_str(VERDICT_SCHEMA).unwrap_or(apache_avro::Schema::Null);
        VerdictEncoder { schema, id }
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    /// An encoder whose schema no verdict fits (tests of what a verdict
    /// that cannot be written becomes).
    #[cfg(test)]
    pub(crate) fn refusing() -> VerdictEncoder {
        VerdictEncoder {
            schema: apache_avro::Schema::Null,
            id: 1,
        }
    }

    /// A JSON verdict body in the wire format.
    pub fn encode(&self, json: &[u8]) -> Result<Vec<u8>, EncodeError> {
        let value: Value = serde_json::from_slice(json).map_err(EncodeError::NotJson)?;
        let avro = apache_avro::types::Value::from(value)
            .resolve(&self.schema)
            .map_err(|e| EncodeError::DoesNotFit(e.to_string()))?;
        let body = apache_avro::to_avro_datum(&self.schema, avro)
            .map_err(|e| EncodeError::Write(e.to_string()))?;
        let mut out = Vec::with_capacity(5 + body.len());
        out.push(0);
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }
}

/// Why a verdict cannot be written in its output format (a bug: the record is
/// dead-lettered).
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("{0}")]
    NotJson(serde_json::Error),
    #[error("the verdict does not fit its Avro schema: {0}")]
    DoesNotFit(String),
    #[error("{0}")]
    Write(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::codec::{Codec, Texts};

    #[test]
    fn a_verdict_round_trips_through_its_avro_schema() {
        apache_avro::Schema::parse_str(VERDICT_SCHEMA).expect("the schema parses");
        let encoder = VerdictEncoder::with_id(7);
        for verdict in [
            serde_json::json!({"event_id": "e", "verdict": "block", "scores": {"offensive": 0.9, "clean": 0.1},
                "model": {"name": "m", "version": "1"}, "source": {"topic": "t", "partition": 1, "offset": 5},
                "latency_ms": 12, "processed_at": "2026-12-01T00:00:00.000Z", "tenant": "kids",
                "warnings": ["created_at: x"], "review_priority": "high",
                "reason": {"human_review": false, "policy": "v1", "rule": "kids", "models": [
                    {"id": "p", "name": "m", "version": "1", "scores": {"offensive": 0.9, "clean": 0.1}, "deferred": false,
                     "crossed": [{"label": "offensive", "score": 0.9, "threshold": 0.6, "verdict": "block"}]}]}}),
            serde_json::json!({"event_id": "e3", "verdict": "block", "scores": {},
                "model": {"name": "", "version": ""}, "source": {"topic": "t", "partition": 0, "offset": 1},
                "latency_ms": 3, "processed_at": "2026-12-01T00:00:00.000Z",
                "reason": {"human_review": false, "policy": "v1", "rule": "kids", "models": [], "reused": true,
                    "match": {"distance": 0.25, "id": "s1", "label": "spam", "list": "spam", "verdict": "block"},
                    "wave": {"first_seen": "2026-12-01T00:00:00.000Z", "id": "e0", "size": 21, "users": 6}}}),
            serde_json::json!({"event_id": "e2", "verdict": "allow", "scores": {"offensive": 0.0},
                "model": {"name": "m", "version": "1"}, "source": {"topic": "t", "partition": 0, "offset": 0},
                "latency_ms": null, "processed_at": "2026-12-01T00:00:00.000Z"}),
        ] {
            let bytes = encoder.encode(verdict.to_string().as_bytes()).unwrap();
            assert_eq!(&bytes[..5], &[0, 0, 0, 0, 7]);
            let codec = Codec::build(&Texts {
                schema_type: "AVRO".into(),
                schema: VERDICT_SCHEMA.into(),
                references: Vec::new(),
            })
            .unwrap();
            let back = codec.decode(&bytes[5..]).unwrap();
            assert_eq!(back["event_id"], verdict["event_id"]);
            assert_eq!(back["scores"], verdict["scores"]);
            assert_eq!(
                back["tenant"],
                verdict.get("tenant").cloned().unwrap_or(Value::Null)
            );
            // The reason as written, or (a verdict without one) its default.
            let mut reason = verdict.get("reason").cloned().unwrap_or_else(
                || serde_json::json!({"human_review": false, "models": [], "policy": "", "rule": ""}),
            );
            // Matching's fields, as written or their defaults.
            let fields = reason.as_object_mut().unwrap();
            for (k, v) in [
                ("match", Value::Null),
                ("reused", false.into()),
                ("wave", Value::Null),
            ] {
                fields.entry(k).or_insert(v);
            }
            assert_eq!(back["reason"], reason);
        }
    }
}
