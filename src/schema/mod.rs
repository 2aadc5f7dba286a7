//! Schema Registry formats (`input.format = "avro" | "protobuf" |
//! "json_schema"`, `output.format = "avro"`): the Confluent wire format
//! (magic byte 0, the schema id as 4 bytes big-endian, for Protobuf the
//! message indexes, then the encoded value).
//!
//! Schemas are fetched once per id and kept ([`SchemaStore`]). The fetch
//! happens in [`stage`], between the consumer and the hub, so that the hub
//! decodes from memory: a record whose schema the registry does not know
//! is a dead letter (`unknown_schema`); bytes that do not decode by their
//! schema are one too (`undecodable`). The registry unreachable is not the
//! record's fault: records wait in order, visibly, and go on once it
//! answers (see [`stage`]).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;

use crate::config::{InputFormat, Settings};

pub mod client;
pub mod codec;
pub mod stage;
pub mod verdict;

pub use client::{ClientError, FetchError, RegistryClient};
use codec::{Codec, Texts};

/// Why a record's value could not be read by its schema.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchemaError {
    #[error("{0}")]
    UnknownSchema(String),
    #[error("{0}")]
    Undecodable(String),
}

/// The schema id of a value in the wire format, if it is in it.
pub fn wire_id(bytes: &[u8]) -> Option<u32> {
    match bytes {
        [0, a, b, c, d, ..] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// How many references a schema may pull in (its own and theirs).
const MAX_REFERENCES: usize = 64;
/// Schema ids the registry did not know, kept (so that a flood of them
/// does not ask the registry each time), at most.
const MAX_UNKNOWN: u64 = 10_000;

/// The schemas of the ids seen so far.
pub struct SchemaStore {
    client: RegistryClient,
    format: InputFormat,
    /// Known schemas are never dropped: the hub decodes from here.
    known: RwLock<HashMap<u32, Arc<Codec>>>,
    /// Ids the registry does not have (or whose schema does not parse),
    /// with the reason.
    unknown: moka::sync::Cache<u32, SchemaError>,
}

impl SchemaStore {
    /// `None` when `input.format` needs no registry.
    pub fn from_settings(settings: &Settings) -> Result<Option<Arc<SchemaStore>>, ClientError> {
        if !settings.input.format.needs_registry() {
            return Ok(None);
        }
        let client = RegistryClient::new(&settings.schema_registry)?;
        Ok(Some(Arc::new(SchemaStore {
            client,
            format: settings.input.format,
            known: RwLock::new(HashMap::new()),
            unknown: moka::sync::Cache::new(MAX_UNKNOWN),
        })))
    }

    /// The schema id of `payload` when it is one not looked up yet.
    pub fn missing(&self, payload: Option<&[u8]>) -> Option<u32> {
        let id = wire_id(payload?)?;
        let known = self.known.read().is_ok_and(|k| k.contains_key(&id));
        (!known && !self.unknown.contains_key(&id)).then_some(id)
    }

    /// Ask the registry for `id` and keep the answer; `Err` only when the
    /// registry could not answer (the caller waits and asks again).
    pub async fn fetch(&self, id: u32) -> Result<(), FetchError> {
        let texts = match self.texts(id).await {
            Ok(t) => t,
            Err(FetchError::NotFound(what)) => {
                self.unknown.insert(
                    id,
                    SchemaError::UnknownSchema(format!(
                        "schema id {id}: the registry has no {what}"
                    )),
                );
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        match Codec::build(&texts) {
            Ok(codec) => {
                tracing::info!(id, schema_type = codec.kind(), "schema fetched");
                if let Ok(mut known) = self.known.write() {
                    known.insert(id, Arc::new(codec));
                }
            }
            Err(e) => {
                tracing::warn!(id, error = %e, "the registry's schema cannot be used; its records go to the DLQ");
                self.unknown
                    .insert(id, SchemaError::Undecodable(format!("schema id {id}: {e}")));
            }
        }
        Ok(())
    }

    /// The schema text and its references' (transitively).
    async fn texts(&self, id: u32) -> Result<Texts, FetchError> {
        let top = self.client.schema_by_id(id).await?;
        let mut references = Vec::new();
        let mut queue: Vec<_> = top.references.clone();
        let mut seen = std::collections::HashSet::new();
        while let Some(r) = queue.pop() {
            if !seen.insert((r.subject.clone(), r.version)) {
                continue;
            }
            if seen.len() > MAX_REFERENCES {
                return Err(FetchError::NotFound(format!(
                    "schema with at most {MAX_REFERENCES} references"
                )));
            }
            let s = self.client.subject_version(&r.subject, r.version).await?;
            queue.extend(s.references.iter().cloned());
            references.push((r.name.clone(), s.schema));
        }
        Ok(Texts {
            schema_type: top.schema_type.unwrap_or_else(|| "AVRO".into()),
            schema: top.schema,
            references,
        })
    }

    /// The value of a record in the wire format, from the schemas kept.
    pub fn decode(&self, bytes: &[u8]) -> Result<Value, SchemaError> {
        let Some(id) = wire_id(bytes) else {
            return Err(SchemaError::Undecodable(format!(
                "not in the Schema Registry wire format (a magic byte 0 and a schema id): input.format is {}",
                self.format_name()
            )));
        };
        let codec = self.known.read().ok().and_then(|k| k.get(&id).cloned());
        let Some(codec) = codec else {
            return Err(self.unknown.get(&id).unwrap_or_else(|| {
                SchemaError::UnknownSchema(format!("schema id {id} is not known"))
            }));
        };
        let expected = match self.format {
            InputFormat::Avro => "AVRO",
            InputFormat::Protobuf => "PROTOBUF",
            InputFormat::JsonSchema | InputFormat::Json => "JSON",
        };
        if codec.kind() != expected {
            return Err(SchemaError::Undecodable(format!(
                "schema id {id} is {}, input.format is {}",
                codec.kind(),
                self.format_name()
            )));
        }
        codec
            .decode(&bytes[5..])
            .map_err(|e| SchemaError::Undecodable(format!("schema id {id}: {e}")))
    }

    fn format_name(&self) -> &'static str {
        match self.format {
            InputFormat::Json => "json",
            InputFormat::Avro => "avro",
            InputFormat::Protobuf => "protobuf",
            InputFormat::JsonSchema => "json_schema",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_header_is_a_zero_then_the_id() {
        assert_eq!(wire_id(&[0, 0, 0, 1, 7, 42]), Some(263));
        assert_eq!(wire_id(&[1, 0, 0, 0, 1]), None);
        assert_eq!(wire_id(b"{\"a\":1}"), None);
        assert_eq!(wire_id(&[0, 0, 0]), None);
    }
}
