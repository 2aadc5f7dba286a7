//! Verdicts in Avro (`output.format = "avro"`): the verdict schema is
//! registered under `<output.topic>-value` at start (the subject
//! registry-aware readers look up), and each verdict is written in the
//! wire format with the id the registry gave it.

use super::{FetchError, RegistryClient};

/// The verdict record of the README, field for field: the fields of the
/// verdict's body ([`crate::verdict::VerdictPayload`]), each record's in the
/// body's order. The encoder resolves the body's value against it by name,
/// so the order is for readers; a test in `verdict::tests` fails when a
/// field is in one and not the other.
pub const VERDICT_SCHEMA: &str = r#"{
  "type": "record", "name": "Verdict", "namespace": "dev.modstream",
  "fields": [
    {"name": "event_id", "type": "string"},
    {"name": "latency_ms", "type": ["null", "long"], "default": null},
    {"name": "model", "type": {"type": "record", "name": "ModelRef", "fields": [
      {"name": "name", "type": "string"}, {"name": "version", "type": "string"}]}},
    {"name": "processed_at", "type": "string"},
    {"name": "reason", "type": {"type": "record", "name": "Reason", "fields": [
      {"name": "human_review", "type": "boolean"},
      {"name": "match", "type": ["null", {"type": "record", "name": "ListMatch", "fields": [
        {"name": "distance", "type": "double"}, {"name": "id", "type": "string"},
        {"name": "label", "type": "string"}, {"name": "list", "type": "string"},
        {"name": "verdict", "type": "string"}]}], "default": null},
      {"name": "models", "type": {"type": "array", "items": {"type": "record", "name": "ModelReason", "fields": [
        {"name": "crossed", "type": {"type": "array", "items": {"type": "record", "name": "Crossing", "fields": [
          {"name": "label", "type": "string"}, {"name": "score", "type": "double"},
          {"name": "threshold", "type": "double"}, {"name": "verdict", "type": "string"}]}}},
        {"name": "deferred", "type": "boolean", "default": false},
        {"name": "id", "type": "string"}, {"name": "name", "type": "string"},
        {"name": "scores", "type": {"type": "map", "values": "double"}},
        {"name": "version", "type": "string"}]}}},
      {"name": "policy", "type": "string"},
      {"name": "reused", "type": "boolean", "default": false},
      {"name": "rule", "type": "string"},
      {"name": "state", "type": ["null", {"type": "record", "name": "StateFired", "fields": [
        {"name": "counter", "type": "string"}, {"name": "entity", "type": "string"},
        {"name": "label", "type": ["null", "string"], "default": null},
        {"name": "raise", "type": "string"}, {"name": "rule", "type": "string"},
        {"name": "value", "type": "long"}]}], "default": null},
      {"name": "wave", "type": ["null", {"type": "record", "name": "Wave", "fields": [
        {"name": "first_seen", "type": "string"}, {"name": "id", "type": "string"},
        {"name": "size", "type": "int"}, {"name": "users", "type": "int"}]}], "default": null}]},
     "default": {"human_review": false, "models": [], "policy": "", "rule": ""}},
    {"name": "review_priority", "type": ["null", "string"], "default": null},
    {"name": "scores", "type": {"type": "map", "values": "double"}},
    {"name": "source", "type": {"type": "record", "name": "SourceRef", "fields": [
      {"name": "offset", "type": "long"}, {"name": "partition", "type": "int"},
      {"name": "topic", "type": "string"}]}},
    {"name": "tenant", "type": ["null", "string"], "default": null},
    {"name": "verdict", "type": "string"},
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

    /// A verdict's body in the wire format, from its Avro value (no JSON
    /// on the way). Resolved by field name against the schema, which
    /// fills in the defaults of the fields the body leaves out (the JSON
    /// verdict omits an absent `tenant`, `match`, ...).
    pub fn encode(&self, body: &impl serde::Serialize) -> Result<Vec<u8>, EncodeError> {
        let body = apache_avro::to_value(body)
            .and_then(|v| v.resolve(&self.schema))
            .and_then(|v| apache_avro::to_avro_datum(&self.schema, v))
            .map_err(|e| EncodeError::DoesNotFit(short(&e.to_string())))?;
        let mut out = Vec::with_capacity(5 + body.len());
        out.push(0);
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }
}

/// The start of an Avro error (its messages print the whole schema).
fn short(message: &str) -> String {
    match message.char_indices().nth(300) {
        Some((end, _)) => format!("{}…", &message[..end]),
        None => message.to_string(),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_the_schema_does_not_have_is_refused_not_written_short() {
        apache_avro::Schema::parse_str(VERDICT_SCHEMA).expect("the schema parses");
        #[derive(serde::Serialize)]
        struct NotAVerdict {
            event_id: &'static str,
            colour: &'static str,
        }
        let refused = VerdictEncoder::with_id(7).encode(&NotAVerdict {
            event_id: "e",
            colour: "red",
        });
        assert!(
            matches!(refused, Err(EncodeError::DoesNotFit(_))),
            "{refused:?}"
        );
    }
}
