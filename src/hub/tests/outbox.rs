//! The stand-in producer of the hub's tests.

use super::*;

/// Stands in for the producer: records what it was handed, in order, and
/// acknowledges at once, or fails as its [`Fates`] say. Records go the
/// fast way (reports by token) unless made with [`Outbox::futures_only`].
#[derive(Clone)]
pub(super) struct Outbox {
    sent: Arc<Mutex<Vec<OutRecord>>>,
    fates: Arc<Mutex<Fates>>,
    /// Topics whose records are acknowledged only once released.
    held: Arc<Mutex<HashMap<String, tokio::sync::watch::Sender<bool>>>>,
    /// The fast way's reports; `None` inside: every record by `deliver`.
    reports: Arc<Mutex<Option<FastWay>>>,
}

/// The stand-in's fast way: its reports channel, and the tokens it gave.
struct FastWay {
    tx: mpsc::UnboundedSender<Report>,
    rx: Option<mpsc::UnboundedReceiver<Report>>,
    tokens: usize,
}

impl Default for FastWay {
    fn default() -> FastWay {
        let (tx, rx) = mpsc::unbounded_channel();
        FastWay {
            tx,
            rx: Some(rx),
            tokens: 0,
        }
    }
}

/// How the stand-in producer fails: every record, or the records to one
/// topic (every record's fate first).
#[derive(Default)]
struct Fates {
    all: Option<Fate>,
    by_topic: HashMap<String, Fate>,
}

/// A delivery failure the producer reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Fate {
    Abandoned,
    Fatal,
    InTransaction,
    Rejected,
    GivenUp,
}

impl Fate {
    fn error(self) -> ProducerError {
        match self {
            Fate::Abandoned => ProducerError::Abandoned,
            Fate::Fatal => ProducerError::Fatal("injected".into()),
            Fate::InTransaction => ProducerError::InTransaction("injected".into()),
            Fate::Rejected => ProducerError::Rejected("Message size too large".into()),
            Fate::GivenUp => ProducerError::GivenUp("topic failing".into()),
        }
    }
}

impl Deliver for Outbox {
    fn deliver(
        &self,
        record: OutRecord,
        _source: Source,
        _cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), ProducerError>> + Send + 'static {
        let fate = self.fate(&record.topic);
        let held = self.held(&record.topic);
        self.sent.lock().unwrap().push(record);
        async move {
            if let Some(mut released) = held {
                let _ = released.wait_for(|r| *r).await;
            }
            fate.map_or(Ok(()), |f| Err(f.error()))
        }
    }

    fn take_reports(&self) -> Option<mpsc::UnboundedReceiver<Report>> {
        self.reports.lock().unwrap().as_mut()?.rx.take()
    }

    /// Reported at once (once released, for a held topic): a failure for
    /// a record with a fate, which [`Outbox::follow`] then gives.
    fn send_reported(&self, record: &OutRecord, _source: &Source) -> Option<Token> {
        let mut fast = self.reports.lock().unwrap();
        let fast = fast.as_mut()?;
        fast.tokens += 1;
        let token = Token::fast(fast.tokens);
        let result = match self.fate(&record.topic) {
            None => Ok(()),
            Some(_) => Err(rdkafka::error::KafkaError::MessageProduction(
                rdkafka::types::RDKafkaErrorCode::MessageTimedOut,
            )),
        };
        let report = Report { token, result };
        let tx = fast.tx.clone();
        match self.held(&record.topic) {
            None => {
                let _ = tx.send(report);
            }
            Some(mut released) => {
                tokio::spawn(async move {
                    let _ = released.wait_for(|r| *r).await;
                    let _ = tx.send(report);
                });
            }
        }
        self.sent.lock().unwrap().push(record.clone());
        Some(token)
    }

    /// Ends as the record's fate says now (the stand-in sends nothing
    /// again).
    fn follow(
        &self,
        record: OutRecord,
        _source: Source,
        _error: rdkafka::error::KafkaError,
        _cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), ProducerError>> + Send + 'static {
        let fate = self.fate(&record.topic);
        async move { fate.map_or(Ok(()), |f| Err(f.error())) }
    }
}

impl Default for Outbox {
    fn default() -> Outbox {
        Outbox {
            sent: Arc::default(),
            fates: Arc::default(),
            held: Arc::default(),
            reports: Arc::new(Mutex::new(Some(FastWay::default()))),
        }
    }
}

impl Outbox {
    /// Every record by `deliver`, none the fast way.
    pub(super) fn futures_only() -> Outbox {
        Outbox {
            reports: Arc::default(),
            ..Outbox::default()
        }
    }

    fn fate(&self, topic: &str) -> Option<Fate> {
        let fates = self.fates.lock().unwrap();
        fates.all.or_else(|| fates.by_topic.get(topic).copied())
    }

    /// How many records went the fast way.
    pub(super) fn tokens(&self) -> usize {
        self.reports
            .lock()
            .unwrap()
            .as_ref()
            .map_or(0, |f| f.tokens)
    }

    fn held(&self, topic: &str) -> Option<tokio::sync::watch::Receiver<bool>> {
        (self.held.lock().unwrap().get(topic)).map(|t| t.subscribe())
    }

    /// Every record fails so from now on (`None`: as the topics say).
    pub(super) fn fail_all(&self, fate: Option<Fate>) {
        self.fates.lock().unwrap().all = fate;
    }

    /// Records to this topic fail so.
    pub(super) fn fail_topic(&self, topic: &str, fate: Fate) {
        let mut fates = self.fates.lock().unwrap();
        fates.by_topic.insert(topic.to_string(), fate);
    }

    /// No topic fails any more.
    pub(super) fn heal_topics(&self) {
        self.fates.lock().unwrap().by_topic.clear();
    }

    /// Records to this topic are acknowledged only once released.
    pub(super) fn hold_topic(&self, topic: &str) {
        let (tx, _) = tokio::sync::watch::channel(false);
        self.held.lock().unwrap().insert(topic.to_string(), tx);
    }

    pub(super) fn release_topic(&self, topic: &str) {
        if let Some(tx) = self.held.lock().unwrap().get(topic) {
            tx.send_replace(true);
        }
    }

    pub(super) fn sent(&self) -> Vec<OutRecord> {
        self.sent.lock().unwrap().clone()
    }

    /// Source offsets of the verdicts handed over so far (to the verdict
    /// topic: routed copies left out).
    pub(super) fn offsets(&self) -> Vec<i64> {
        self.sent()
            .iter()
            .filter(|r| r.kind == crate::producer::record::RecordKind::Verdict)
            .filter(|r| r.topic == "moderation.verdicts")
            .map(|r| {
                let v: serde_json::Value =
                    serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
                v["source"]["offset"].as_i64().unwrap()
            })
            .collect()
    }
}
