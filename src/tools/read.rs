//! Reading an output topic back (verdicts, dead letters): a consumer
//! outside any group's commits that reads every partition from the
//! beginning. Used by `demo`, `bench` and the tests. Blocking: call it from
//! a blocking context.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// One record read back from an output topic.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    /// The value (empty for a null value: see `null_value`).
    pub payload: Vec<u8>,
    pub null_value: bool,
    /// By name; a name given twice keeps its last value.
    pub headers: BTreeMap<String, Vec<u8>>,
    /// The record's Kafka timestamp, ms since the epoch.
    pub timestamp_ms: Option<i64>,
}

impl ReadRecord {
    fn from_message(m: &BorrowedMessage<'_>) -> ReadRecord {
        ReadRecord {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().unwrap_or_default().to_vec(),
            null_value: m.payload().is_none(),
            timestamp_ms: m.timestamp().to_millis(),
            headers: m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The payload as JSON (verdicts), if it is.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.payload).ok()
    }
}

/// Which records of transactions a reader sees: only committed ones
/// (librdkafka's default), or also those of open and aborted transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    ReadCommitted,
    ReadUncommitted,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

pub struct TopicReader {
    consumer: BaseConsumer,
    ends: crate::client::WrittenEnds,
    topic: String,
    partitions: i32,
}

impl TopicReader {
    /// Read `topic` from the beginning of each of its partitions (`None`:
    /// as many as the cluster's metadata says).
    pub fn from_beginning(
        bootstrap: &str,
        topic: &str,
        partitions: Option<i32>,
    ) -> Result<TopicReader, KafkaError> {
        Self::with_isolation(bootstrap, topic, partitions, Isolation::ReadCommitted)
    }

    /// [`TopicReader::from_beginning`] with this isolation level.
    pub fn with_isolation(
        bootstrap: &str,
        topic: &str,
        partitions: Option<i32>,
        isolation: Isolation,
    ) -> Result<TopicReader, KafkaError> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", bootstrap)
            .set("isolation.level", isolation.as_str())
            .set(
                "group.id",
                format!("modstream-reader-{}", std::process::id()),
            )
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "5")
            .set("fetch.error.backoff.ms", "5");
        let consumer: BaseConsumer = cfg.create()?;
        let ends = crate::client::WrittenEnds::new(&cfg)?;
        let partitions = match partitions {
            Some(n) => n,
            None => {
                let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
                metadata
                    .topics()
                    .first()
                    .map_or(0, |t| t.partitions().len() as i32)
            }
        };
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        Ok(TopicReader {
            consumer,
            ends,
            topic: topic.to_string(),
            partitions,
        })
    }

    pub fn partitions(&self) -> i32 {
        self.partitions
    }

    /// The next record, if one arrives within `timeout`.
    pub fn poll(&self, timeout: Duration) -> Result<Option<ReadRecord>, KafkaError> {
        match self.consumer.poll(timeout) {
            Some(Ok(m)) => Ok(Some(ReadRecord::from_message(&m))),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    /// Read until `want` records arrived or `timeout` passed, calling
    /// `on_record` at each.
    pub fn read(
        &self,
        want: usize,
        timeout: Duration,
        mut on_record: impl FnMut(&ReadRecord),
    ) -> Result<Vec<ReadRecord>, KafkaError> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        while out.len() < want && Instant::now() < deadline {
            if let Some(record) = self.poll(Duration::from_millis(50))? {
                on_record(&record);
                out.push(record);
            }
        }
        Ok(out)
    }

    /// Read every partition up to its high watermark as of now. Read
    /// committed, that waits for the transactions open now to end: the
    /// committed records written before the call all come back, those
    /// behind a stopped producer's open transaction too
    /// ([`crate::client::WrittenEnds`]).
    pub fn read_to_end(&self, timeout: Duration) -> Result<Vec<ReadRecord>, KafkaError> {
        let mut remaining: HashMap<i32, i64> = HashMap::new();
        for p in 0..self.partitions {
            let (_, high) = self.ends.of(&self.topic, p, Duration::from_secs(10))?;
            if high > 0 {
                remaining.insert(p, high);
            }
        }
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        while !remaining.is_empty() {
            if Instant::now() >= deadline {
                return Err(KafkaError::MessageConsumption(
                    rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                ));
            }
            match self.poll(Duration::from_millis(100))? {
                Some(record) => {
                    if remaining
                        .get(&record.partition)
                        .is_some_and(|high| record.offset + 1 >= *high)
                    {
                        remaining.remove(&record.partition);
                    }
                    out.push(record);
                }
                // A transaction's last offset is its marker, which is never
                // handed out: the position tells when the end was passed.
                None => self.passed(&mut remaining),
            }
        }
        Ok(out)
    }
}

impl TopicReader {
    /// Forget the partitions whose position reached their high watermark.
    fn passed(&self, remaining: &mut HashMap<i32, i64>) {
        let Ok(positions) = self.consumer.position() else {
            return;
        };
        remaining.retain(|p, high| {
            !matches!(
                positions.find_partition(&self.topic, *p).map(|e| e.offset()),
                Some(Offset::Offset(at)) if at >= *high
            )
        });
    }
}

/// Read `topic` from the beginning until `want` records arrived or `timeout`
/// passed.
pub fn read_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    want: usize,
    timeout: Duration,
) -> Result<Vec<ReadRecord>, KafkaError> {
    TopicReader::from_beginning(bootstrap, topic, Some(partitions))?.read(want, timeout, |_| {})
}
