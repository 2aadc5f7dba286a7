//! The codecs: a registry schema made ready to decode, and the decoding of
//! a record's bytes (after the wire header) into a JSON value the mapping
//! reads. Avro by `apache-avro`, Protobuf by `protox` (the schema text
//! compiled) and `prost-reflect`; JSON Schema values are JSON already.

use std::collections::HashMap;

use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, SerializeOptions};
use serde_json::Value;

/// Why a schema cannot be used, or a record's bytes cannot be read by it
/// (the text goes into the dead-letter record's reason).
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("not an Avro schema: {0}")]
    AvroSchema(String),
    #[error("not a Protobuf schema: {0}")]
    ProtobufSchema(String),
    #[error("schema type {0} is not read")]
    SchemaType(String),
    #[error("not Avro of its schema: {0}")]
    NotAvro(String),
    #[error("{0} bytes after the Avro record")]
    AfterAvro(usize),
    #[error("Avro value not readable as JSON: {0}")]
    AvroNotJson(String),
    #[error("not Protobuf of its schema: {0}")]
    NotProtobuf(#[from] prost::DecodeError),
    #[error("Protobuf message not readable as JSON: {0}")]
    ProtobufNotJson(serde_json::Error),
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("the message indexes end early")]
    IndexesEndEarly,
    #[error("a message index is too long")]
    IndexTooLong,
    #[error("{0} message indexes")]
    IndexCount(i64),
    #[error("message index {0}")]
    Index(i64),
    #[error("the schema's file is missing")]
    FileMissing,
    #[error("the schema has no message {0}")]
    NoMessage(usize),
    #[error("no nested message {index} in {parent}")]
    NoNestedMessage { index: usize, parent: String },
}

/// A schema ready to decode with.
pub enum Codec {
    /// The writer schema, with the named schemas it references.
    Avro {
        schema: apache_avro::Schema,
        named: Vec<apache_avro::Schema>,
    },
    /// The schema's file in a pool with its imports.
    Protobuf {
        pool: DescriptorPool,
        file: String,
    },
    JsonSchema,
}

/// The schema's text and that of each reference, by the name it is
/// imported by, in dependency order (references first).
pub struct Texts {
    pub schema_type: String,
    pub schema: String,
    pub references: Vec<(String, String)>,
}

const MAIN_PROTO: &str = "modstream-registry-schema.proto";

impl Codec {
    /// Build the codec; `Err` when the text is not a schema of its type.
    pub fn build(texts: &Texts) -> Result<Codec, CodecError> {
        match texts.schema_type.as_str() {
            "AVRO" => {
                let refs: Vec<&str> = texts.references.iter().map(|(_, t)| t.as_str()).collect();
                let (schema, named) = apache_avro::Schema::parse_str_with_list(&texts.schema, refs)
                    .map_err(|e| CodecError::AvroSchema(e.to_string()))?;
                Ok(Codec::Avro { schema, named })
            }
            "PROTOBUF" => {
                let mut files: HashMap<String, String> = texts.references.iter().cloned().collect();
                files.insert(MAIN_PROTO.to_string(), texts.schema.clone());
                let mut resolver = protox::file::ChainFileResolver::new();
                resolver.add(InMemory(files));
                resolver.add(protox::file::GoogleFileResolver::new());
                let mut compiler = protox::Compiler::with_file_resolver(resolver);
                compiler.include_imports(true);
                compiler
                    .open_file(MAIN_PROTO)
                    .map_err(|e| CodecError::ProtobufSchema(e.to_string()))?;
                Ok(Codec::Protobuf {
                    pool: compiler.descriptor_pool(),
                    file: MAIN_PROTO.to_string(),
                })
            }
            "JSON" => Ok(Codec::JsonSchema),
            other => Err(CodecError::SchemaType(other.to_string())),
        }
    }

    /// Which format it is, for a mismatch with `input.format`.
    pub fn kind(&self) -> &'static str {
        match self {
            Codec::Avro { .. } => "AVRO",
            Codec::Protobuf { .. } => "PROTOBUF",
            Codec::JsonSchema => "JSON",
        }
    }

    /// The value of `body` (the bytes after the magic byte and schema id).
    pub fn decode(&self, body: &[u8]) -> Result<Value, CodecError> {
        match self {
            Codec::Avro { schema, named } => {
                let mut reader = body;
                let value = apache_avro::from_avro_datum_schemata(
                    schema,
                    named.iter().collect(),
                    &mut reader,
                    None,
                )
                .map_err(|e| CodecError::NotAvro(e.to_string()))?;
                if !reader.is_empty() {
                    return Err(CodecError::AfterAvro(reader.len()));
                }
                Value::try_from(value).map_err(|e| CodecError::AvroNotJson(e.to_string()))
            }
            Codec::Protobuf { pool, file } => {
                let (indexes, rest) = message_indexes(body)?;
                let descriptor = message_at(pool, file, &indexes)?;
                let message = DynamicMessage::decode(descriptor, rest)?;
                let options = SerializeOptions::new()
                    .use_proto_field_name(true)
                    .stringify_64_bit_integers(false)
                    .skip_default_fields(false);
                message
                    .serialize_with_options(serde_json::value::Serializer, &options)
                    .map_err(CodecError::ProtobufNotJson)
            }
            Codec::JsonSchema => serde_json::from_slice(body).map_err(CodecError::NotJson),
        }
    }
}

/// A zig-zag varint, as the Confluent Protobuf wire format writes the
/// message indexes.
fn varint(bytes: &mut &[u8]) -> Result<i64, CodecError> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first().ok_or(CodecError::IndexesEndEarly)?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    Err(CodecError::IndexTooLong)
}

/// The message indexes (`[0]` written as a single 0) and the message bytes.
pub fn message_indexes(body: &[u8]) -> Result<(Vec<usize>, &[u8]), CodecError> {
    let mut rest = body;
    let count = varint(&mut rest)?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    if !(1..=32).contains(&count) {
        return Err(CodecError::IndexCount(count));
    }
    let mut indexes = Vec::new();
    for _ in 0..count {
        let i = varint(&mut rest)?;
        indexes.push(usize::try_from(i).map_err(|_| CodecError::Index(i))?);
    }
    Ok((indexes, rest))
}

fn message_at(
    pool: &DescriptorPool,
    file: &str,
    indexes: &[usize],
) -> Result<MessageDescriptor, CodecError> {
    let file = pool.get_file_by_name(file).ok_or(CodecError::FileMissing)?;
    let mut message = file
        .messages()
        .nth(indexes[0])
        .ok_or(CodecError::NoMessage(indexes[0]))?;
    for &i in &indexes[1..] {
        let child = message.child_messages().nth(i);
        message = child.ok_or_else(|| CodecError::NoNestedMessage {
            index: i,
            parent: message.full_name().to_string(),
        })?;
    }
    Ok(message)
}

/// The schema's `.proto` and its references by import name. A registry
/// returns each as `.proto` text, or (as some clients register it) as a
/// base64 serialized `FileDescriptorProto`.
struct InMemory(HashMap<String, String>);

impl protox::file::FileResolver for InMemory {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        let Some(source) = self.0.get(name) else {
            return Err(protox::Error::file_not_found(name));
        };
        if let Some(mut descriptor) = serialized_descriptor(source) {
            descriptor.name = Some(name.to_string());
            return Ok(protox::file::File::from_file_descriptor_proto(descriptor));
        }
        protox::file::File::from_source(name, source)
    }
}

/// `source` as a base64 `FileDescriptorProto`, if it is one (`.proto`
/// text has spaces or punctuation base64 does not).
fn serialized_descriptor(source: &str) -> Option<prost_types::FileDescriptorProto> {
    use base64::Engine;
    use prost::Message;
    let text = source.trim();
    if text.is_empty() || text.contains(|c: char| c.is_whitespace() || c == ';' || c == '{') {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    prost_types::FileDescriptorProto::decode(bytes.as_slice()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_indexes_follow_the_confluent_wire_format() {
        assert_eq!(message_indexes(&[0, 9]).unwrap(), (vec![0], &[9u8][..]));
        // [1, 0]: count 2 (zig-zag 4), 1 (2), 0 (0).
        assert_eq!(
            message_indexes(&[4, 2, 0, 7]).unwrap(),
            (vec![1, 0], &[7u8][..])
        );
        assert!(message_indexes(&[]).is_err());
        assert!(message_indexes(&[0x80]).is_err());
    }

    #[test]
    fn an_avro_record_decodes_to_json_by_its_writer_schema() {
        let texts = Texts {
            schema_type: "AVRO".into(),
            schema: r#"{"type":"record","name":"Post","fields":[{"name":"id","type":"string"},{"name":"likes","type":["null","long"]}]}"#.into(),
            references: Vec::new(),
        };
        let codec = Codec::build(&texts).unwrap();
        let Codec::Avro { schema, .. } = &codec else {
            panic!("avro")
        };
        let mut record = apache_avro::types::Record::new(schema).unwrap();
        record.put("id", "p1");
        record.put(
            "likes",
            apache_avro::types::Value::Union(1, Box::new(apache_avro::types::Value::Long(3))),
        );
        let bytes = apache_avro::to_avro_datum(schema, record).unwrap();
        assert_eq!(
            codec.decode(&bytes).unwrap(),
            serde_json::json!({"id": "p1", "likes": 3})
        );
        assert!(codec.decode(&[0xff, 0xff, 0xff]).is_err(), "garbage");
    }

    #[test]
    fn a_protobuf_message_decodes_by_its_index() {
        let texts = Texts {
            schema_type: "PROTOBUF".into(),
            schema: "syntax = \"proto3\"; message A { string x = 1; } message B { string id = 1; int64 n = 2; }".into(),
            references: Vec::new(),
        };
        let codec = Codec::build(&texts).unwrap();
        // B { id: "b", n: 5 }: index [1] = count 1 (2), 1 (2).
        let body = [2, 2, 0x0a, 1, b'b', 0x10, 5];
        assert_eq!(
            codec.decode(&body).unwrap(),
            serde_json::json!({"id": "b", "n": 5})
        );
        // The same schema as a base64 serialized FileDescriptorProto.
        let Codec::Protobuf { pool, file } = &codec else {
            panic!("protobuf")
        };
        use base64::Engine;
        use prost::Message;
        let descriptor = pool
            .get_file_by_name(file)
            .unwrap()
            .file_descriptor_proto()
            .clone();
        let serialized = Texts {
            schema_type: "PROTOBUF".into(),
            schema: base64::engine::general_purpose::STANDARD.encode(descriptor.encode_to_vec()),
            references: Vec::new(),
        };
        assert_eq!(
            Codec::build(&serialized).unwrap().decode(&body).unwrap(),
            serde_json::json!({"id": "b", "n": 5})
        );
        assert!(
            Codec::build(&Texts {
                schema_type: "PROTOBUF".into(),
                schema: "message {".into(),
                references: Vec::new()
            })
            .is_err()
        );
    }
}
