//! The hub's intake: a polled record is tracked, validated, and joins its
//! partition's batch (or becomes a dead-letter record at once); closed
//! batches join the dispatch queue.

use super::{Deliver, Hub, Outcome};
use crate::consumer::Ingested;
use crate::event::{self, Priority, RejectReason};
use crate::partition::{Partition, Pending, ReadyBatch, Rejected};
use crate::policy::ModelId;
use crate::record::Original;
use crate::schema::SchemaError;
use crate::telemetry::metric;
use crate::tp::{Generation, Tp};
use tokio::time::Instant;

impl<D: Deliver> Hub<D> {
    pub(super) fn on_record(&mut self, record: Ingested) {
        let stale = self.revokes.is_stale(&record.tp, record.generation);
        self.ledger.polled(stale);
        if stale {
            metrics::counter!(metric::STALE_RECORDS_TOTAL).increment(1);
            return;
        }
        // A revoke whose drain the consumer gave up on ends here, before the
        // partition's new assignment starts.
        if let Some(old) = self.partitions.get(&record.tp)
            && self.revokes.is_stale(&record.tp, old.generation())
        {
            self.finish_revokes(true);
        }
        let generation = self.track(&record);
        self.ledger.accepted();
        let original = Original {
            key: record.key,
            payload: record.payload,
            headers: record.headers,
            timestamp_ms: record.timestamp_ms,
        };
        match decode(
            &self.decoder,
            self.schemas.as_deref(),
            &record.tp.topic,
            &original,
        ) {
            Ok(event) => {
                let urgent = event.priority == Priority::Urgent;
                let tokens = self.token_estimate.of(event.text.len());
                let (rules, rule) = self.rule_for(&record.tp.topic, &event, tokens);
                let pending = Pending {
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
                };
                self.accept(pending, urgent);
            }
            Err(rejection) => {
                let out = self
                    .outputs
                    .rejected(&record.tp, record.offset, original, &rejection);
                let rejected = Rejected {
                    offset: record.offset,
                    out,
                    reason: rejection.reason,
                    received_at: record.received_at,
                    bytes: record.bytes,
                };
                self.on_invalid(record.tp, generation, rejected);
            }
        }
    }

    /// The record's offset counted as undelivered in its partition, made
    /// (its state restored, [`super::state`]) if this is its first record.
    /// Returns the partition state's generation: acknowledgements are
    /// matched against it, not the (newer) one a later rebalance stamps on
    /// records.
    fn track(&mut self, record: &Ingested) -> Generation {
        let (batch, max_batch_tokens) = (self.batch, self.batch_tokens);
        let mut new = false;
        let partition = self.partitions.entry(record.tp.clone()).or_insert_with(|| {
            new = true;
            Partition::new(
                record.tp.clone(),
                record.generation,
                batch.size,
                batch.delay,
            )
            .with_token_budget(max_batch_tokens)
        });
        partition.track(record.offset);
        let generation = partition.generation();
        if new {
            self.restore_state(&record.tp, generation, record.offset);
        }
        generation
    }

    /// A valid event, once matched (see [`super::matching`]), joins its
    /// partition's open batch.
    fn accept(&mut self, mut pending: Pending, urgent: bool) {
        self.inspect(&mut pending);
        let Some(partition) = self.partitions.get_mut(&pending.tp) else {
            return;
        };
        let at = pending.received_at;
        let before = partition.deadline();
        let closed = partition.push(pending, urgent, at);
        if let Some(due) = partition.deadline().filter(|d| Some(*d) != before) {
            self.deadlines.opened(due, partition.tp());
        }
        for batch in closed.into_iter().flatten() {
            self.enqueue(batch);
        }
    }

    /// The policy in force now and the rule that decides this event: it is
    /// judged by them from its first model to its verdict. The latency
    /// controllers of the models it names count its arrival (and its
    /// predicted `tokens`).
    fn rule_for(
        &mut self,
        topic: &str,
        event: &event::Event,
        tokens: u64,
    ) -> (
        std::sync::Arc<crate::policy::Ruleset>,
        crate::policy::RuleId,
    ) {
        let rules = self.rules.clone();
        let rule = rules.rule_for(topic, event);
        for (l, lane) in self.lanes.with_ids_mut() {
            if rules.rules()[rule.0].runs(l) {
                lane.arrived(1, tokens);
            }
        }
        (rules, rule)
    }

    /// An invalid event's dead-letter record goes out at once; with
    /// exactly-once in offset order with the verdicts, behind its
    /// partition's open batch (see [`super::transaction`]).
    fn on_invalid(&mut self, tp: Tp, generation: Generation, rejected: Rejected) {
        if self.txn.is_some() {
            let Some(partition) = self.partitions.get_mut(&tp) else {
                return;
            };
            if let Some(batch) = partition.push_rejected(rejected) {
                self.enqueue(batch);
            }
            self.emit_in_order(&tp);
            return;
        }
        self.deliver(super::ReadyOutput {
            at: super::InputOffset {
                tp,
                generation,
                offset: rejected.offset,
            },
            out: rejected.out.into(),
            outcome: Outcome::Dlq(rejected.reason),
            hold: super::Hold {
                received_at: rejected.received_at,
                bytes: rejected.bytes,
            },
        });
    }

    /// A closed batch goes to its first model's queue (urgent ones ahead of
    /// the others, see [`super::queue`]).
    pub(super) fn enqueue(&mut self, batch: ReadyBatch) {
        metrics::histogram!(metric::BATCH_WAIT_SECONDS).record(batch.waited.as_secs_f64());
        self.ledger.batch_closed(batch.waited);
        self.send_on(batch, ModelId(0));
    }

    /// Close the batches whose deadline has passed (see [`super::deadlines`]).
    pub(super) fn close_expired(&mut self) {
        let now = Instant::now();
        for tp in self.deadlines.due(now) {
            let Some(partition) = self.partitions.get_mut(&tp) else {
                continue;
            };
            let closed = partition.close_expired(now);
            if let Some(later) = partition.deadline() {
                self.deadlines.opened(later, &tp);
            }
            if let Some(batch) = closed {
                self.enqueue(batch);
            }
        }
    }

    pub(super) fn flush_all(&mut self) {
        let tps: Vec<Tp> = self.partitions.keys().cloned().collect();
        self.flush(&tps);
    }

    pub(super) fn flush(&mut self, tps: &[Tp]) {
        for tp in tps {
            if let Some(batch) = self.partitions.get_mut(tp).and_then(Partition::flush) {
                self.enqueue(batch);
            }
        }
    }
}

/// The event of a record by its topic's mapping; optional fields left out
/// are counted.
fn decode(
    decoder: &event::Decoder,
    schemas: Option<&crate::schema::SchemaStore>,
    topic: &str,
    original: &Original,
) -> Result<event::Event, event::Rejection> {
    let parts = event::RecordParts {
        key: original.key.as_deref(),
        payload: original.payload.as_deref(),
        headers: &original.headers,
    };
    let event = match schemas {
        None => decoder.decode(topic, parts)?,
        Some(store) => decoder.decode_with(topic, parts, |bytes| {
            store.decode(bytes).map_err(|e| match e {
                SchemaError::UnknownSchema(m) => event::reject(RejectReason::UnknownSchema, m),
                SchemaError::Undecodable(m) => event::reject(RejectReason::Undecodable, m),
            })
        })?,
    };
    for w in &event.warnings {
        metrics::counter!(metric::FIELD_WARNINGS_TOTAL, "field" => w.field.as_str()).increment(1);
    }
    Ok(event)
}
