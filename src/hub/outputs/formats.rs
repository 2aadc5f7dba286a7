//! Verdicts in the output format (`output.format`, `output.cloudevents`):
//! JSON as the verdict module writes it, or Avro in the Schema Registry
//! wire format; optionally as a CloudEvent (binary mode: `ce_*` headers;
//! structured mode: a JSON envelope) with the input's event id as subject.

use super::Composer;
use crate::config::CloudEventsOutput;
use crate::event::cloudevents::{Outgoing, STRUCTURED_CONTENT_TYPE};
use crate::record::OutRecord;
use crate::tp::Tp;

impl Composer {
    /// Put a JSON verdict record into the configured format; `Err` when it
    /// does not fit the Avro schema (a bug: the record is dead-lettered).
    pub(super) fn dress(
        &self,
        out: &mut OutRecord,
        event_id: &str,
        tp: &Tp,
        offset: i64,
    ) -> Result<(), crate::schema::verdict::EncodeError> {
        let output = &self.output;
        if output.cloudevents == CloudEventsOutput::Off && self.encoder.is_none() {
            return Ok(());
        }
        let json = out.payload.take().unwrap_or_default();
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let ce = Outgoing {
            id: format!("{}-{}-{offset}", tp.topic, tp.partition),
            source: &self.ce_source,
            subject: event_id,
            time: &time,
        };
        let (payload, content_type) = match &self.encoder {
            Some(encoder) => (encoder.encode(&json)?, "application/avro"),
            None => (json, "application/json"),
        };
        match output.cloudevents {
            CloudEventsOutput::Off => out.payload = Some(payload),
            CloudEventsOutput::Binary => {
                for (name, value) in ce.headers(content_type) {
                    out.headers.push((name.into(), Some(value)));
                }
                out.payload = Some(payload);
            }
            CloudEventsOutput::Structured => {
                let data = serde_json::from_slice(&payload)
                    .map_err(crate::schema::verdict::EncodeError::NotJson)?;
                out.headers.push((
                    "content-type".into(),
                    Some(STRUCTURED_CONTENT_TYPE.as_bytes().to_vec()),
                ));
                out.payload = Some(ce.envelope(data));
            }
        }
        Ok(())
    }
}
