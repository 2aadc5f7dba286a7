//! Take in and decode: a polled record read into an event by its topic's
//! mapping (from memory with a Schema Registry format: the schema stage
//! fetched its schema first), given the policy in force and the rule that
//! decides it, and its predicted tokens. A record that cannot be read is
//! answered with its rejection, to be dead-lettered in its place.

use std::sync::Arc;

use crate::config::Settings;
use crate::consumer::Ingested;
use crate::event::{self, Decoder, Priority, RejectReason};
use crate::hub::partition::Pending;
use crate::inference::TokenStats;
use crate::inference::tokens::TokenEstimate;
use crate::policy::Ruleset;
use crate::producer::record::Original;
use crate::schema::{SchemaError, SchemaStore};
use crate::telemetry::metric;
use crate::tp::{Generation, Tp};
use tokio::time::Instant;

pub(crate) struct Intake {
    decoder: Decoder,
    /// With a Schema Registry input format: the schemas the stage fetched.
    schemas: Option<Arc<SchemaStore>>,
    /// The policy new events are judged by.
    rules: Arc<Ruleset>,
    /// Predicts each post's tokens for `batching.max_batch_tokens`,
    /// learning from the token models' runs.
    tokens: TokenEstimate,
}

/// What a record was read into. Not boxed: the valid event moves on by
/// value into its batch, and a box would cost an allocation per event.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Decoded {
    /// A valid event, judged by `pending.rules`' rule `pending.rule`.
    Valid { pending: Pending, urgent: bool },
    /// A record that cannot be read: its dead letter goes in its place.
    Invalid(Unreadable),
}

/// A record that cannot be read, and why.
pub(crate) struct Unreadable {
    pub tp: Tp,
    pub generation: Generation,
    pub offset: i64,
    pub original: Original,
    pub rejection: event::Rejection,
    pub received_at: Instant,
    pub bytes: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Intake {
    /// `max_length`: the longest token model's (its tokens are predicted).
    pub(crate) fn new(settings: &Settings, rules: Arc<Ruleset>, max_length: Option<usize>) -> Self {
        Intake {
            decoder: Decoder::new(&settings.input, &settings.limits),
            schemas: None,
            rules,
            tokens: TokenEstimate::new(max_length),
        }
    }

    /// Decode values with these schemas (a Schema Registry input format).
    pub(crate) fn set_schemas(&mut self, schemas: Option<Arc<SchemaStore>>) {
        self.schemas = schemas;
    }

    /// The policy in force.
    pub(crate) fn rules(&self) -> &Arc<Ruleset> {
        &self.rules
    }

    /// A new policy takes over: events taken in from now on are judged by
    /// it (events already taken in keep theirs).
    pub(crate) fn set_rules(&mut self, rules: Arc<Ruleset>) {
        self.rules = rules;
    }

    /// A token model ran: what its texts' tokens were, to predict better.
    pub(crate) fn learn(&mut self, t: TokenStats) {
        self.tokens
            .learn(t.whole_texts, t.whole_bytes, t.whole_tokens);
    }

    #[cfg(test)]
    pub(crate) fn token_estimate(&self) -> &TokenEstimate {
        &self.tokens
    }

    /// The record read into an event of the partition state `generation`
    /// (acknowledgements are matched against it).
    pub(crate) fn take_in(&self, record: Ingested, generation: Generation) -> Decoded {
        let original = Original {
            key: record.key,
            payload: record.payload,
            headers: record.headers,
            timestamp_ms: record.timestamp_ms,
        };
        match self.decode(&record.tp.topic, &original) {
            Ok(event) => {
                let urgent = event.priority == Priority::Urgent;
                let tokens = self.tokens.of(event.text.len());
                let rules = self.rules.clone();
                let rule = rules.rule_for(&record.tp.topic, &event);
                Decoded::Valid {
                    pending: Pending {
                        tp: record.tp,
                        generation,
                        offset: record.offset,
                        original,
                        event,
                        received_at: record.received_at,
                        tokens,
                        bytes: record.bytes,
                        rules,
                        rule,
                        scores: Vec::new(),
                        failed: None,
                        matching: Default::default(),
                    },
                    urgent,
                }
            }
            Err(rejection) => Decoded::Invalid(Unreadable {
                tp: record.tp,
                generation,
                offset: record.offset,
                original,
                rejection,
                received_at: record.received_at,
                bytes: record.bytes,
            }),
        }
    }

    /// The event of a record by its topic's mapping; optional fields left
    /// out are counted.
    fn decode(&self, topic: &str, original: &Original) -> Result<event::Event, event::Rejection> {
        let parts = event::RecordParts {
            key: original.key.as_deref(),
            payload: original.payload.as_deref(),
            headers: &original.headers,
        };
        let event = match self.schemas.as_deref() {
            None => self.decoder.decode(topic, parts)?,
            Some(store) => self.decoder.decode_with(topic, parts, |bytes| {
                store.decode(bytes).map_err(|e| match e {
                    SchemaError::UnknownSchema(m) => event::reject(RejectReason::UnknownSchema, m),
                    SchemaError::Undecodable(m) => event::reject(RejectReason::Undecodable, m),
                })
            })?,
        };
        for w in &event.warnings {
            metrics::counter!(metric::FIELD_WARNINGS_TOTAL, "field" => w.field.as_str())
                .increment(1);
        }
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intake(toml: &str) -> Intake {
        let settings = Settings::from_toml(&format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\ntopics = [\"posts\"]\n{toml}"
        ))
        .unwrap();
        let rules = Ruleset::from_config(&settings.policy, &[]).unwrap();
        Intake::new(&settings, Arc::new(rules), None)
    }

    fn record(payload: &[u8]) -> Ingested {
        Ingested {
            tp: Tp::new("posts", 3),
            offset: 7,
            key: Some(b"k".to_vec()),
            payload: Some(payload.to_vec()),
            headers: Vec::new(),
            timestamp_ms: Some(1),
            generation: Generation(5),
            received_at: Instant::now(),
            bytes: None,
        }
    }

    #[test]
    fn a_valid_record_becomes_an_event_of_the_partition_state_that_took_it_in() {
        let intake = intake("");
        let decoded = intake.take_in(
            record(br#"{"event_id":"e1","text":"hi","priority":"urgent"}"#),
            Generation(2),
        );
        let Decoded::Valid { pending, urgent } = decoded else {
            panic!("valid");
        };
        assert!(urgent);
        assert_eq!(pending.event.event_id, "e1");
        assert_eq!((pending.offset, pending.generation), (7, Generation(2)));
        assert!(
            Arc::ptr_eq(&pending.rules, intake.rules()),
            "the policy in force"
        );
        assert_eq!(pending.original.key.as_deref(), Some(&b"k"[..]));
    }

    #[test]
    fn an_unreadable_record_is_answered_with_its_reason_and_the_record_as_it_was() {
        let intake = intake("");
        let Decoded::Invalid(u) = intake.take_in(record(b"not json"), Generation(2)) else {
            panic!("invalid");
        };
        assert_eq!(u.rejection.reason, RejectReason::InvalidJson);
        assert_eq!(u.original.payload.as_deref(), Some(&b"not json"[..]));
        assert_eq!((u.offset, u.generation), (7, Generation(2)));
    }

    #[test]
    fn a_new_policy_judges_the_events_taken_in_after_it() {
        let mut intake = intake("");
        let before = intake.take_in(record(br#"{"event_id":"a","text":"x"}"#), Generation(0));
        let settings = Settings::from_toml(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\ntopics = [\"posts\"]",
        )
        .unwrap();
        let newer = Arc::new(Ruleset::from_config(&settings.policy, &[]).unwrap());
        intake.set_rules(newer.clone());
        let after = intake.take_in(record(br#"{"event_id":"b","text":"x"}"#), Generation(0));
        let rules_of = |d: Decoded| match d {
            Decoded::Valid { pending, .. } => pending.rules,
            Decoded::Invalid(_) => panic!("valid"),
        };
        assert!(!Arc::ptr_eq(&rules_of(before), &newer), "kept its own");
        assert!(Arc::ptr_eq(&rules_of(after), &newer));
    }
}
