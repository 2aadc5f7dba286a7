//! The verdict producer's delivery reports, routed by each record's token
//! (its delivery opaque, a plain number: nothing is allocated per record).
//!
//! An even token is a record the hub sent the fast way
//! ([`super::Sink::send_reported`]): its report goes to the hub's one
//! channel, which the hub's loop drains beside its other inputs. An odd
//! token is a record some future waits for (a routed copy, an analytics
//! record, a re-send): its report wakes that future through a oneshot
//! kept here until the report comes.
//!
//! The reports channel is unbounded, and bounded in fact: each report
//! answers one record handed over, and the hub hands over no more than
//! `limits.max_in_flight` events' records before their reports come.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{Producer, ProducerContext};
use tokio::sync::{mpsc, oneshot};

use super::delivery::{Delivery, Reported};
use super::record::OutRecord;
use super::{ProducerError, Sink};
use crate::client::log::QuietContext;
use crate::tp::Source;
use tokio_util::sync::CancellationToken;

/// A record's delivery opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(usize);

impl Token {
    /// A fast-way token (tests stand in for the producer with these).
    pub fn fast(n: usize) -> Token {
        Token(n << 1)
    }

    fn is_fast(self) -> bool {
        self.0 & 1 == 0
    }
}

/// What the broker answered for a record sent the fast way.
#[derive(Debug)]
pub struct Report {
    pub token: Token,
    pub result: Result<(), KafkaError>,
}

/// The verdict producer's context: librdkafka's logs without repeats, and
/// delivery reports by token.
pub struct VerdictContext {
    pub(super) quiet: QuietContext,
    reports: mpsc::UnboundedSender<Report>,
    /// The oneshots of records a future waits for, by (odd) token.
    waiting: Mutex<foldhash::HashMap<usize, oneshot::Sender<Result<(), KafkaError>>>>,
    next: AtomicUsize,
}

impl VerdictContext {
    /// The context and the receiving end of its fast-way reports.
    pub(super) fn new() -> (VerdictContext, mpsc::UnboundedReceiver<Report>) {
        let (reports, rx) = mpsc::unbounded_channel();
        let context = VerdictContext {
            quiet: QuietContext::default(),
            reports,
            waiting: Mutex::default(),
            next: AtomicUsize::new(1),
        };
        (context, rx)
    }

    /// A new fast-way token.
    pub(super) fn fast_token(&self) -> Token {
        Token::fast(self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// A new token whose report the returned receiver waits for; registered
    /// before the record is sent, since the report may come before `send`
    /// returns.
    pub(super) fn waited_token(&self) -> (Token, Reported) {
        let token = Token((self.next.fetch_add(1, Ordering::Relaxed) << 1) | 1);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.insert(token.0, tx);
        }
        (token, rx)
    }

    /// The record of this token was never queued: no report will come.
    pub(super) fn forget(&self, token: Token) {
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.remove(&token.0);
        }
    }

    /// The raw opaque of a token.
    pub(super) fn opaque(token: Token) -> usize {
        token.0
    }
}

impl ClientContext for VerdictContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.quiet.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.quiet.error(error, reason);
    }
}

impl ProducerContext for VerdictContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, delivery: &DeliveryResult<'_>, opaque: usize) {
        let token = Token(opaque);
        let result = match delivery {
            Ok(_) => Ok(()),
            Err((error, _)) => Err(error.clone()),
        };
        if token.is_fast() {
            // Only a hub that ended has dropped the receiver, and it ends
            // with nothing in flight.
            let _ = self.reports.send(Report { token, result });
            return;
        }
        let waiting = self.waiting.lock().ok().and_then(|mut w| w.remove(&opaque));
        if let Some(tx) = waiting {
            let _ = tx.send(result);
        }
    }
}

/// The fast way.
impl Sink {
    /// The fast way for a verdict or dead letter: enqueued now, its report
    /// later on [`Sink::take_reports`]'s channel under the returned token.
    /// `None` (nothing sent): the partition has re-sends waiting, the
    /// record is an analytics record, or librdkafka's queue refused it;
    /// [`Sink::deliver`] takes it, in line with the re-sends.
    pub fn send_reported(&self, record: &OutRecord, source: &Source) -> Option<Token> {
        if record.kind.is_analytics() || self.resends.any_waiting(&source.tp) {
            return None;
        }
        let token = self.producer.context().fast_token();
        (self.producer)
            .send(record.as_base_record(VerdictContext::opaque(token)))
            .ok()
            .map(|()| token)
    }

    /// The reports of records sent by [`Sink::send_reported`] (once; then
    /// `None`).
    pub fn take_reports(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Report>> {
        self.reports.lock().ok()?.take()
    }

    /// A record sent the fast way was acknowledged.
    pub fn delivered(&self, record: &OutRecord) {
        self.produced.of(record.kind).increment(1);
        self.service_failures.delivered(&record.topic);
    }

    /// A record sent the fast way failed with `error`: its delivery goes on
    /// as [`Sink::deliver`]'s would have after that failure (classified,
    /// then retried in line with its partition's re-sends, cut down or
    /// given up). Its place among the re-sends is taken now, before the
    /// hub hands anything more over: a later record of its partition then
    /// queues behind this one instead of going the fast way ahead of its
    /// re-send. (A delivery that ends without a re-send leaves the place
    /// at once.)
    pub fn follow(
        &self,
        record: OutRecord,
        source: Source,
        error: KafkaError,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), ProducerError>> + Send + 'static {
        let (failed, reported) = tokio::sync::oneshot::channel();
        let _ = failed.send(Err(error));
        let place = Some(self.resends.join(&source));
        Delivery::in_order(self, source, place).run(record, Some(Ok(reported)), cancel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::tests::{sink_on_embedded_broker, source, verdict_record};
    use std::time::Duration;

    /// The fast way skips the re-sends' line, so it is taken only while
    /// its partition has none: once a fast-way record's failure is known,
    /// the partition's next records go in line behind its re-send.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_failed_report_the_partition_goes_in_line_until_its_re_send_ends() {
        let (_broker, sink) = sink_on_embedded_broker();
        let record = verdict_record();
        assert!(sink.send_reported(&record, &source(0)).is_some());
        let timed_out =
            KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::MessageTimedOut);
        let re_send = sink.follow(
            record.clone(),
            source(0),
            timed_out,
            CancellationToken::new(),
        );
        assert!(
            sink.send_reported(&record, &source(1)).is_none(),
            "offset 1 went the fast way ahead of offset 0's re-send"
        );
        tokio::time::timeout(Duration::from_secs(30), re_send)
            .await
            .expect("re-sent and acknowledged")
            .expect("delivered");
        assert!(
            sink.send_reported(&record, &source(1)).is_some(),
            "the fast way again once the re-send is acknowledged"
        );
    }

    #[test]
    fn fast_and_waited_tokens_never_meet() {
        let (context, _rx) = VerdictContext::new();
        let fast: Vec<Token> = (0..50).map(|_| context.fast_token()).collect();
        let waited: Vec<Token> = (0..50).map(|_| context.waited_token().0).collect();
        assert!(fast.iter().all(|t| t.is_fast()));
        assert!(waited.iter().all(|t| !t.is_fast()));
        let all: std::collections::HashSet<Token> = fast.iter().chain(&waited).copied().collect();
        assert_eq!(all.len(), 100, "every token is new");
    }
}
