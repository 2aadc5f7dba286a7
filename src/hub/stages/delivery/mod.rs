//! Deliver: an input offset's records (its verdict or dead letter, and
//! what goes with them) handed to the producer at once, in the order they
//! are ready; a future the hub's loop polls waits for the broker's
//! acknowledgement of all of them and resolves to one [`Ack`], which this
//! stage classifies ([`Acked`]). With exactly-once, the transaction
//! boundary ([`transaction`]) decides whether records go now or wait for
//! the next transaction.

use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::outputs::{Outcome, Outgoing};
use crate::config::Settings;
use crate::consumer::rebalance::Sealed;
use crate::producer::record::{OutRecord, RecordKind};
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

pub(crate) struct Delivery<D: Deliver> {
    outbox: D,
    /// Cancelled when deliveries still retrying are given up.
    abort: CancellationToken,
    /// Offsets handed to the producer since the loop last looked, each
    /// resolving to its acknowledgement (the loop polls them).
    outgoing: Vec<BoxFuture<'static, Ack>>,
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
        Delivery {
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
        let span = out.span;
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
        let started = Instant::now();
        self.outgoing.push(Box::pin(async move {
            // The offset is done when all its records are acknowledged.
            let (main, also) = match copies {
                None => (main.await, Vec::new()),
                Some(copies) => futures::future::join(main, copies).await,
            };
            let Delivered {
                outcome: delivered,
                refused_copies,
            } = combine(main, also);
            if let Some(span) = span {
                span.end(delivered.as_ref().map(|_| ()).map_err(ToString::to_string));
            }
            let outcome = delivered.map(|()| outcome);
            drop(bytes);
            Ack {
                at,
                outcome,
                kind,
                refused_copies,
                took: started.elapsed(),
                received_at,
                txn: epoch,
            }
        }));
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
