//! Verdicts in the output format (`output.format`, `output.cloudevents`):
//! JSON as the verdict module writes it, or Avro in the Schema Registry
//! wire format written straight from the verdict's body; optionally as a
//! CloudEvent (binary mode: `ce_*` headers; structured mode: a JSON
//! envelope) with the input's event id as subject.

use super::Composer;
use crate::config::CloudEventsOutput;
use crate::event::cloudevents::{Outgoing, STRUCTURED_CONTENT_TYPE};
use crate::producer::record::OutRecord;
use crate::schema::verdict::EncodeError;
use crate::verdict::{self, Answer, Judged, Timing};

impl Composer {
    /// A live verdict record for `topic` (`priority`: a routed copy's) in
    /// the configured format; `Err` when it does not fit the Avro schema
    /// (a bug: the record is dead-lettered).
    pub(super) fn verdict(
        &self,
        topic: &str,
        answer: &Answer<'_>,
        judged: &Judged<'_>,
        priority: Option<&str>,
    ) -> Result<OutRecord, EncodeError> {
        let mut out = match &self.encoder {
            None => verdict::verdict_record(topic, answer, judged, priority, Timing::Live),
            Some(encoder) => {
                let avro = |body: &verdict::VerdictPayload<'_>| encoder.encode(body);
                verdict::verdict_record_with(topic, answer, judged, priority, Timing::Live, avro)?
            }
        };
        let output = &self.output;
        if output.cloudevents == CloudEventsOutput::Off {
            return Ok(out);
        }
        let payload = out.payload.take().unwrap_or_default();
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let ce = Outgoing {
            id: format!(
                "{}-{}-{}",
                answer.source.topic, answer.source.partition, answer.offset
            ),
            source: &self.ce_source,
            subject: &answer.event.event_id,
            time: &time,
        };
        let content_type = match &self.encoder {
            Some(_) => "application/avro",
            None => "application/json",
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
                let data = serde_json::from_slice(&payload).map_err(EncodeError::NotJson)?;
                out.headers.push((
                    "content-type".into(),
                    Some(STRUCTURED_CONTENT_TYPE.as_bytes().to_vec()),
                ));
                out.payload = Some(ce.envelope(data));
            }
        }
        Ok(out)
    }
}
