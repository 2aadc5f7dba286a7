//! Kafka transactions for `kafka.delivery = "exactly_once"`: the verdict
//! producer's `init_transactions`, and one transaction's end (its input
//! offsets sent with the group's metadata, then commit; or abort), each
//! error sorted into the class that decides what happens next.
//!
//! Who calls what: the pipeline starts transactions before the consumer
//! joins (a broker without them fails the start here); the consumer thread
//! ends each transaction (`crate::consumer`), because the group's metadata
//! (KIP-447: generation and member id, which fence a zombie member's
//! commit) and the seek back after an abort are its own. The records of a
//! transaction are produced by the hub's deliveries through the same
//! producer (`crate::producer::Sink`).
//!
//! Bounds: each step is retried while librdkafka calls its error retriable,
//! and the whole end of a transaction (commit, or abort) takes at most
//! `kafka.transaction_timeout`; past that a commit becomes an abort and an
//! abort becomes [`TransactionError::Fatal`] (the process stops non-zero; a
//! restart with the same `transactional.id` fences this producer and aborts
//! what it left open).

use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::producer::VerdictProducer;
use crate::telemetry::metric::{self, TxnOutcome};
use crate::tp::{Position, Positions};

#[derive(Debug, thiserror::Error)]
pub enum TransactionError {
    #[error(
        "exactly_once: the cluster did not start transactions for transactional.id {id} within {waited_s} s: {reason} (it needs brokers with transactions, transaction.state.log.replication.factor and transaction.state.log.min.isr no higher than the number of brokers, and with ACLs Write and Describe on the transactional id)"
    )]
    Init {
        id: String,
        waited_s: u64,
        reason: String,
    },
    /// A newer producer with the same `transactional.id` started, or the
    /// coordinator aborted this one's transaction and bumped its epoch:
    /// this instance must not write again.
    #[error("fenced: {0}; a newer instance owns this transactional.id, this one stops")]
    Fenced(String),
    #[error("fatal transaction error: {0}")]
    Fatal(String),
    /// The transaction cannot commit: abort it, read its input again.
    #[error("the transaction must be aborted: {0}")]
    Abortable(String),
    #[error(
        "the transaction did not commit within kafka.transaction_timeout ({waited_ms} ms): {last}"
    )]
    TimedOut { waited_ms: u64, last: String },
}

/// What a failed step leads to.
enum Class {
    Retry,
    Abort,
    Fenced,
    Fatal,
}

fn classify(e: &KafkaError) -> Class {
    match e {
        KafkaError::Transaction(t) if t.is_fatal() => match t.code() {
            RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed => Class::Fenced,
            _ => Class::Fatal,
        },
        KafkaError::Transaction(t) if t.txn_requires_abort() => Class::Abort,
        KafkaError::Transaction(t) if t.is_retriable() => Class::Retry,
        // Flushing before the commit timed out: the commit may be retried.
        KafkaError::Flush(_) => Class::Retry,
        _ => Class::Abort,
    }
}

/// The verdict producer's transactions; the open one's start.
pub struct Transactions {
    producer: VerdictProducer,
    timeout: Duration,
    began: Instant,
}

const RETRY_PAUSE: Duration = Duration::from_millis(100);

impl Transactions {
    /// `init_transactions` (fencing any older producer with this
    /// `transactional.id` and aborting what it left open), then begin the
    /// first transaction. Blocking.
    pub fn start(
        producer: VerdictProducer,
        id: &str,
        timeout: Duration,
    ) -> Result<Transactions, TransactionError> {
        let init = |reason: String| TransactionError::Init {
            id: id.to_string(),
            waited_s: timeout.as_secs(),
            reason,
        };
        producer
            .init_transactions(timeout)
            .map_err(|e| init(e.to_string()))?;
        producer
            .begin_transaction()
            .map_err(|e| init(e.to_string()))?;
        tracing::info!(transactional_id = id, "transactions started");
        Ok(Transactions {
            producer,
            timeout,
            began: Instant::now(),
        })
    }

    /// How long the open transaction has lasted.
    pub fn age(&self) -> Duration {
        self.began.elapsed()
    }

    /// Send `offsets` (the next offset to read of each input partition) with
    /// the group's metadata, commit, and begin the next transaction.
    /// `records`: the verdict and dead-letter records it holds.
    pub fn commit(
        &mut self,
        offsets: &Positions,
        group: &ConsumerGroupMetadata,
        records: u64,
    ) -> Result<(), TransactionError> {
        let deadline = Instant::now() + self.timeout;
        if !offsets.is_empty() {
            let mut tpl = TopicPartitionList::new();
            for Position { tp, next } in offsets {
                tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(*next))
                    .map_err(|e| TransactionError::Abortable(e.to_string()))?;
            }
            self.retrying(deadline, |p, left| {
                p.send_offsets_to_transaction(&tpl, group, left)
            })?;
        }
        self.retrying(deadline, |p, left| p.commit_transaction(left))?;
        metrics::counter!(metric::TRANSACTIONS_TOTAL, "outcome" => TxnOutcome::Committed.as_str())
            .increment(1);
        metrics::histogram!(metric::TRANSACTION_SECONDS).record(self.age().as_secs_f64());
        metrics::histogram!(metric::TRANSACTION_RECORDS).record(records as f64);
        self.begin()
    }

    /// Abort the open transaction (its records become invisible to
    /// `read_committed` readers; librdkafka drops what it still holds) and
    /// begin the next. An abort that cannot finish within the bound is fatal.
    pub fn abort(&mut self, why: TxnOutcome) -> Result<(), TransactionError> {
        let deadline = Instant::now() + self.timeout;
        match self.retrying(deadline, |p, left| p.abort_transaction(left)) {
            Ok(()) => {}
            Err(TransactionError::TimedOut { last, .. } | TransactionError::Abortable(last)) => {
                return Err(TransactionError::Fatal(format!(
                    "the abort did not finish within kafka.transaction_timeout: {last}"
                )));
            }
            Err(e) => return Err(e),
        }
        metrics::counter!(metric::TRANSACTIONS_TOTAL, "outcome" => why.as_str()).increment(1);
        metrics::histogram!(metric::TRANSACTION_SECONDS).record(self.age().as_secs_f64());
        self.begin()
    }

    fn begin(&mut self) -> Result<(), TransactionError> {
        self.producer
            .begin_transaction()
            .map_err(|e| match classify(&e) {
                Class::Fenced => TransactionError::Fenced(e.to_string()),
                _ => TransactionError::Fatal(e.to_string()),
            })?;
        self.began = Instant::now();
        Ok(())
    }

    /// Run `step` until it succeeds, fails for a reason a retry cannot fix,
    /// or `deadline` passes.
    fn retrying(
        &self,
        deadline: Instant,
        step: impl Fn(&VerdictProducer, Duration) -> Result<(), KafkaError>,
    ) -> Result<(), TransactionError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let error = match step(&self.producer, left.max(Duration::from_millis(1))) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            match classify(&error) {
                Class::Fenced => return Err(TransactionError::Fenced(error.to_string())),
                Class::Fatal => return Err(TransactionError::Fatal(error.to_string())),
                Class::Abort => return Err(TransactionError::Abortable(error.to_string())),
                Class::Retry if Instant::now() + RETRY_PAUSE >= deadline => {
                    return Err(TransactionError::TimedOut {
                        waited_ms: self.timeout.as_millis() as u64,
                        last: error.to_string(),
                    });
                }
                Class::Retry => {
                    tracing::debug!(error = %error, "transaction step failed; retrying");
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }
}
