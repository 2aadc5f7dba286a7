//! Deliver: an input offset's records (its verdict or dead letter, and
//! what goes with them) handed to the producer at once, in the order they
//! are ready; the broker's acknowledgement of all of them becomes one
//! [`Ack`], which this stage classifies ([`Acked`]). An offset whose one
//! record goes the fast way waits in [`Delivery::reported`] for its report
//! by token, which the hub's loop passes in; any other offset (copies
//! beside its record, re-sends waiting in its partition), and a fast-way
//! record whose report is a failure, is a future the loop polls. With
//! exactly-once, the transaction boundary ([`transaction`]) decides
//! whether records go now or wait for the next transaction.

use futures::future::BoxFuture;
use rdkafka::error::KafkaError;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::outputs::{Outcome, Outgoing};
use crate::config::Settings;
use crate::consumer::rebalance::Sealed;
use crate::producer::record::{OutRecord, RecordKind};
use crate::producer::reports::{Report, Token};
use crate::producer::{ProducerError, ServiceFailure};
use crate::tp::{Generation, Positions, Source, Tp};

pub(crate) mod transaction;

use transaction::{HandOver, TxnBoundary, TxnEpoch};

/// Hands a record to the broker; resolves once it is acknowledged (see
/// [`crate::producer::Sink`]). A trait so that tests can stand in for Kafka.
pub trait Deliver: Send + 'static {
    /// `source`: the input partition and offset the record answers.
    fn deliver(
        &self,
        record: OutRecord,
        source: Source,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), ProducerError>> + Send + 'static;

    /// A delivery failure concerning the whole service that lasts now.
    fn service_failure(&self) -> Option<ServiceFailure> {
        None
    }

    /// The reports of records sent by [`Deliver::send_reported`], taken
    /// once (`None`: every record goes by [`Deliver::deliver`]).
    fn take_reports(&self) -> Option<mpsc::UnboundedReceiver<Report>> {
        None
    }

    /// The fast way: enqueued now, its report later under the token.
    /// `None`: nothing was sent; [`Deliver::deliver`] takes the record.
    fn send_reported(&self, _record: &OutRecord, _source: &Source) -> Option<Token> {
        None
    }

    /// A record sent the fast way was acknowledged.
    fn delivered(&self, _record: &OutRecord) {}

    /// A record sent the fast way failed: its delivery goes on as
    /// [`Deliver::deliver`]'s would have after that failure.
    fn follow(
        &self,
        record: OutRecord,
        source: Source,
        _error: KafkaError,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), ProducerError>> + Send + 'static {
        self.deliver(record, source, cancel)
    }
}

/// The input record an output answers: its partition, the generation of
/// the partition state that accepted it, and its offset.
#[derive(Debug, Clone)]
pub(crate) struct InputOffset {
    pub tp: Tp,
    pub generation: Generation,
    pub offset: i64,
}

/// What an input record holds until its outputs are acknowledged: when
/// the consumer thread polled it, and its share of the byte budget (given
/// back when dropped).
pub(crate) struct Hold {
    pub received_at: Instant,
    pub bytes: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// An input record's outputs, ready to be handed to the producer.
pub(crate) struct ReadyOutput {
    pub at: InputOffset,
    pub out: Outgoing,
    pub outcome: Outcome,
    pub hold: Hold,
}

/// What an offset's delivery resolves to.
pub struct Ack {
    at: InputOffset,
    outcome: Result<Outcome, ProducerError>,
    kind: RecordKind,
    /// Copies refused for good (reported once the offset is committed).
    refused_copies: Vec<Refused>,
    /// Enqueue to acknowledgement.
    took: std::time::Duration,
    /// When the consumer thread polled the input record.
    received_at: Instant,
    /// With exactly-once: the transaction it was handed over in.
    txn: TxnEpoch,
}

impl Ack {
    /// From the enqueueing of its records to their acknowledgement.
    pub(crate) fn took(&self) -> std::time::Duration {
        self.took
    }
}

/// What an acknowledgement means for its offset.
pub(crate) enum Acked {
    /// Every record is acknowledged: the offset is done. `refused`: copies
    /// the broker refused for good (reported; they never hold it back).
    Delivered {
        at: InputOffset,
        outcome: Outcome,
        refused: Vec<Refused>,
        received_at: Instant,
        took: std::time::Duration,
    },
    /// The verdict (or dead letter) was refused for good: the offset is
    /// committed past it, never pinned; `refused` names it first.
    Refused {
        at: InputOffset,
        refused: Vec<Refused>,
    },
    /// It failed inside a transaction, which aborts: the partition is read
    /// again, and the offset stays undelivered until then.
    InTransaction,
    /// Given up (shutdown, a copy abandoned): uncommitted.
    Abandoned,
    /// The producer cannot deliver any more: the run stops.
    Fatal,
}

/// A record the broker refused for good.
#[derive(Debug)]
pub(crate) struct Refused {
    pub kind: RecordKind,
    pub topic: String,
    pub error: String,
}

/// What an offset handed over keeps until its records are acknowledged,
/// to make its [`Ack`].
struct Pending {
    at: InputOffset,
    outcome: Outcome,
    kind: RecordKind,
    span: Option<crate::telemetry::traces::PostSpan>,
    /// Its share of the byte budget, given back with the acknowledgement.
    bytes: Option<tokio::sync::OwnedSemaphorePermit>,
    received_at: Instant,
    started: Instant,
    txn: TxnEpoch,
}

impl Pending {
    fn ack(self, delivered: Delivered) -> Ack {
        let Delivered {
            outcome: delivered,
            refused_copies,
        } = delivered;
        if let Some(span) = self.span {
            span.end(delivered.as_ref().map(|_| ()).map_err(ToString::to_string));
        }
        drop(self.bytes);
        Ack {
            at: self.at,
            outcome: delivered.map(|()| self.outcome),
            kind: self.kind,
            refused_copies,
            took: self.started.elapsed(),
            received_at: self.received_at,
            txn: self.txn,
        }
    }
}

/// An offset whose one record went the fast way: kept until its report.
struct Waiting {
    pending: Pending,
    /// Kept for the delivery that goes on if the report is a failure.
    record: OutRecord,
    source: Source,
}

pub(crate) struct Delivery<D: Deliver> {
    outbox: D,
    /// Cancelled when deliveries still retrying are given up.
    abort: CancellationToken,
    /// Offsets handed to the producer since the loop last looked, each
    /// resolving to its acknowledgement (the loop polls them).
    outgoing: Vec<BoxFuture<'static, Ack>>,
    /// Offsets sent the fast way, by their record's token, until its report.
    reported: foldhash::HashMap<Token, Waiting>,
    /// The fast way's reports, until the hub's loop takes them; `None`
    /// after, or when the outbox has no fast way.
    reports: Option<mpsc::UnboundedReceiver<Report>>,
    /// Whether the outbox has a fast way (it gave its reports).
    fast: bool,
    /// With `kafka.delivery = "exactly_once"`: the open transaction's state.
    txn: Option<TxnBoundary>,
    /// The error that stopped deliveries for good, if one did.
    fatal: Option<ProducerError>,
    /// Where verdicts and dead letters go (a refusal names its topic).
    verdict_topic: String,
    dlq_topic: String,
}

impl<D: Deliver> Delivery<D> {
    pub(crate) fn new(settings: &Settings, outbox: D, abort: CancellationToken) -> Delivery<D> {
        let reports = outbox.take_reports();
        Delivery {
            fast: reports.is_some(),
            reports,
            reported: foldhash::HashMap::default(),
            outbox,
            abort,
            outgoing: Vec::new(),
            txn: settings.kafka.exactly_once().then(TxnBoundary::default),
            fatal: None,
            verdict_topic: settings.output.topic.clone(),
            dlq_topic: settings.output.dlq_topic.clone(),
        }
    }

    /// With exactly-once, records go in offset order with the verdicts,
    /// dead letters included (see [`transaction`]).
    pub(crate) fn in_transactions(&self) -> bool {
        self.txn.is_some()
    }

    /// Enqueue an input record's outputs now (or, sealed, once the next
    /// transaction begins); the hub's loop polls for their acknowledgement.
    /// Its hold (its share of the byte budget) is given back after it.
    pub(crate) fn hand_over(&mut self, ready: ReadyOutput) {
        let epoch = match self.txn.as_mut() {
            None => TxnEpoch::default(),
            Some(txn) => match txn.hand_over() {
                HandOver::Hold => {
                    txn.hold(ready);
                    return;
                }
                HandOver::Send { epoch } => epoch,
            },
        };
        let ReadyOutput {
            at,
            out,
            outcome,
            hold: Hold { received_at, bytes },
        } = ready;
        let kind = out.main.kind;
        let source = Source {
            tp: at.tp.clone(),
            offset: at.offset,
        };
        let pending = Pending {
            at,
            outcome,
            kind,
            span: out.span,
            bytes,
            received_at,
            started: Instant::now(),
            txn: epoch,
        };
        // An offset with one record goes the fast way while deliveries are
        // not given up (the outbox may still decline: then by `deliver`).
        let fast = self.fast && out.also.is_empty() && !self.abort.is_cancelled();
        let token = fast
            .then(|| self.outbox.send_reported(&out.main, &source))
            .flatten();
        if let Some(token) = token {
            let waiting = Waiting {
                pending,
                record: out.main,
                source,
            };
            self.reported.insert(token, waiting);
            return;
        }
        let main = self
            .outbox
            .deliver(out.main, source.clone(), self.abort.clone());
        // Most offsets have no copies: their future is the record's own.
        let copies = (!out.also.is_empty()).then(|| {
            futures::future::join_all(out.also.into_iter().map(|r| {
                let copy = CopyOf {
                    kind: r.kind,
                    topic: r.topic.clone(),
                };
                let acked = self.outbox.deliver(r, source.clone(), self.abort.clone());
                async move { (copy, acked.await) }
            }))
        });
        self.outgoing.push(Box::pin(async move {
            // The offset is done when all its records are acknowledged.
            let (main, also) = match copies {
                None => (main.await, Vec::new()),
                Some(copies) => futures::future::join(main, copies).await,
            };
            pending.ack(combine(main, also))
        }));
    }

    /// The fast way's reports, for the hub's loop to drain (once).
    pub(crate) fn take_reports(&mut self) -> Option<mpsc::UnboundedReceiver<Report>> {
        self.reports.take()
    }

    /// Whether offsets sent the fast way wait for their reports.
    pub(crate) fn awaits_reports(&self) -> bool {
        !self.reported.is_empty()
    }

    /// A fast-way record's report: its offset's acknowledgement, or, for a
    /// failure, nothing yet: its delivery goes on as a future the loop
    /// polls (classified, retried in line, cut down or given up). `None`
    /// as well for a token no longer waited for (given up at abort).
    pub(crate) fn reported(&mut self, report: Report) -> Option<Ack> {
        let waiting = self.reported.remove(&report.token)?;
        let Waiting {
            pending,
            record,
            source,
        } = waiting;
        match report.result {
            Ok(()) => {
                self.outbox.delivered(&record);
                Some(pending.ack(Delivered {
                    outcome: Ok(()),
                    refused_copies: Vec::new(),
                }))
            }
            Err(error) => {
                let more = self
                    .outbox
                    .follow(record, source, error, self.abort.clone());
                self.outgoing.push(Box::pin(async move {
                    pending.ack(Delivered {
                        outcome: more.await,
                        refused_copies: Vec::new(),
                    })
                }));
                None
            }
        }
    }

    /// Deliveries are given up (abort): every offset waiting for its
    /// report is abandoned, as a future waiting for its record is; a
    /// report that comes later finds nothing.
    pub(crate) fn abandon_reported(&mut self) -> Vec<Ack> {
        (self.reported.drain())
            .map(|(_, waiting)| {
                waiting.pending.ack(Delivered {
                    outcome: Err(ProducerError::Abandoned),
                    refused_copies: Vec::new(),
                })
            })
            .collect()
    }

    /// The deliveries handed over since the loop last looked.
    pub(crate) fn take_outgoing(&mut self) -> std::vec::Drain<'_, BoxFuture<'static, Ack>> {
        self.outgoing.drain(..)
    }

    /// What an offset's acknowledgement means (the open transaction counts
    /// it, and learns whether it must abort).
    pub(crate) fn acknowledged(&mut self, ack: Ack) -> Acked {
        let Ack {
            at,
            outcome,
            kind,
            refused_copies,
            took,
            received_at,
            txn,
        } = ack;
        if let Some(boundary) = self.txn.as_mut() {
            let failed = match &outcome {
                Err(ProducerError::InTransaction(error)) => Some(error.as_str()),
                _ => None,
            };
            boundary.acknowledged(txn, failed);
        }
        match outcome {
            Ok(outcome) => Acked::Delivered {
                at,
                outcome,
                refused: refused_copies,
                received_at,
                took,
            },
            Err(ProducerError::InTransaction(_)) => Acked::InTransaction,
            Err(ProducerError::Fatal(message)) => {
                if self.fatal.is_none() {
                    tracing::error!(error = %message, "stopping: the producer cannot deliver any more");
                    self.fatal = Some(ProducerError::Fatal(message));
                }
                Acked::Fatal
            }
            Err(ProducerError::Rejected(error)) => {
                let topic = match kind {
                    RecordKind::Dlq => self.dlq_topic.clone(),
                    _ => self.verdict_topic.clone(),
                };
                let mut refused = vec![Refused { kind, topic, error }];
                refused.extend(refused_copies);
                Acked::Refused { at, refused }
            }
            Err(_) => Acked::Abandoned,
        }
    }

    /// A delivery failure concerning the whole service that lasts now.
    pub(crate) fn service_failure(&self) -> Option<ServiceFailure> {
        self.outbox.service_failure()
    }

    /// Deliveries stop for good with `error` (the first such error is the
    /// run's); false if they had already stopped.
    pub(crate) fn stop_for_good(&mut self, error: ProducerError) -> bool {
        if self.fatal.is_some() {
            return false;
        }
        self.fatal = Some(error);
        true
    }

    /// Whether deliveries stopped for good.
    pub(crate) fn stopped(&self) -> bool {
        self.fatal.is_some()
    }

    /// The error that stopped deliveries for good, if one did.
    pub(crate) fn into_fatal(self) -> Option<ProducerError> {
        self.fatal
    }

    /// The consumer thread ends the transaction: hand nothing more over;
    /// answered once everything handed over is acknowledged. Without
    /// transactions it is answered at once, so that nothing waits.
    pub(crate) fn seal(&mut self, deadline: Instant, reply: std::sync::mpsc::Sender<Sealed>) {
        match self.txn.as_mut() {
            Some(txn) => txn.seal(deadline, reply),
            None => {
                let _ = reply.send(Sealed::default());
            }
        }
    }

    /// When a seal must be answered, acknowledged or not.
    pub(crate) fn seal_deadline(&self) -> Option<Instant> {
        self.txn.as_ref().and_then(TxnBoundary::deadline)
    }

    /// Answer a seal once its transaction is done (see
    /// [`TxnBoundary::answer_seal`]).
    pub(crate) fn answer_seal(&mut self, positions: impl FnOnce() -> Positions) {
        if let Some(txn) = self.txn.as_mut() {
            txn.answer_seal(positions);
        }
    }

    /// The next transaction began: the records that waited go out, in order.
    pub(crate) fn unseal(&mut self) {
        let Some(txn) = self.txn.as_mut() else {
            return;
        };
        for ready in txn.unseal() {
            self.hand_over(ready);
        }
    }

    /// Drops the waiting outputs of rewound partitions; how many.
    pub(crate) fn drop_held(&mut self, rewound: &std::collections::HashSet<&Tp>) -> usize {
        self.txn.as_mut().map_or(0, |txn| txn.drop_held(rewound))
    }
}

/// A routed copy or decision record, as its acknowledgement reports it.
#[derive(Debug, Clone, PartialEq)]
struct CopyOf {
    kind: RecordKind,
    topic: String,
}

/// One offset's fate, from the acknowledgements of all its records.
#[derive(Debug)]
struct Delivered {
    outcome: Result<(), ProducerError>,
    refused_copies: Vec<Refused>,
}

/// A failure that is not a refusal for good (abandoned, fatal, in a
/// transaction) decides, the verdict's (or dead letter's) own first, since
/// the offset is then read again and every record sent again with it; then
/// the verdict's refusal for good (committed past). Copies refused for good
/// are only reported: they never hold the offset back.
fn combine(
    main: Result<(), ProducerError>,
    copies: Vec<(CopyOf, Result<(), ProducerError>)>,
) -> Delivered {
    let mut refused_copies = Vec::new();
    let mut copy_failure = None;
    for (copy, acked) in copies {
        match acked {
            // Counted where it was given up; never holds the offset.
            Ok(()) | Err(ProducerError::GivenUp(_)) => {}
            Err(ProducerError::Rejected(error)) => refused_copies.push(Refused {
                kind: copy.kind,
                topic: copy.topic,
                error,
            }),
            Err(e) => {
                copy_failure.get_or_insert(e);
            }
        }
    }
    let outcome = match (main, copy_failure) {
        // A copy abandoned beside a verdict refused for good: committing
        // past the refusal would lose the copy, which a rerun sends again.
        (Err(ProducerError::Rejected(_)), Some(e)) => Err(e),
        (Err(e), _) => Err(e),
        (Ok(()), Some(e)) => Err(e),
        (Ok(()), None) => Ok(()),
    };
    Delivered {
        outcome,
        refused_copies,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(topic: &str) -> CopyOf {
        CopyOf {
            kind: RecordKind::Decision,
            topic: topic.into(),
        }
    }

    #[test]
    fn a_copy_refused_for_good_is_reported_and_never_holds_the_offset() {
        let d = combine(
            Ok(()),
            vec![
                (copy("a"), Err(ProducerError::Rejected("too large".into()))),
                (copy("b"), Err(ProducerError::GivenUp("failing".into()))),
            ],
        );
        assert!(d.outcome.is_ok());
        assert_eq!(d.refused_copies.len(), 1);
        assert_eq!(d.refused_copies[0].topic, "a");
    }

    #[test]
    fn an_abandoned_copy_keeps_a_refused_verdicts_offset_uncommitted() {
        let d = combine(
            Err(ProducerError::Rejected("too large".into())),
            vec![(copy("a"), Err(ProducerError::Abandoned))],
        );
        assert!(matches!(d.outcome, Err(ProducerError::Abandoned)));
        let d = combine(Err(ProducerError::Rejected("too large".into())), vec![]);
        assert!(matches!(d.outcome, Err(ProducerError::Rejected(_))));
    }
}
