//! What the consumer thread hands the hub: owned records, each holding
//! its share of the byte budget (`limits.max_in_flight_bytes`) until its
//! verdict or dead-letter record is acknowledged.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::tp::{Generation, Tp};

/// One consumed record, owned.
#[derive(Debug)]
pub struct Ingested {
    pub tp: Tp,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The record's Kafka timestamp, ms since the epoch.
    pub timestamp_ms: Option<i64>,
    pub generation: Generation,
    pub received_at: tokio::time::Instant,
    /// Its share of `limits.max_in_flight_bytes`, held until its verdict or
    /// DLQ record is acknowledged (or it is dropped): released on drop.
    pub bytes: Option<OwnedSemaphorePermit>,
}

impl Ingested {
    /// Bytes it holds: key, value and headers.
    fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.payload.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
    }
}

/// The bytes of records consumed and not yet delivered, shared by the
/// consumer thread (which takes a record's share before forwarding it) and
/// the records themselves (which give it back when dropped).
#[derive(Clone)]
pub struct ByteBudget {
    semaphore: Arc<Semaphore>,
    total: usize,
}

impl ByteBudget {
    pub fn new(total: usize) -> Self {
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        ByteBudget {
            semaphore: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.total - self.semaphore.available_permits()
    }

    /// Take `record`'s share unless it has one; false while the budget is
    /// spent. A record larger than the whole budget takes all of it.
    fn take(&self, record: &mut Ingested) -> bool {
        if record.bytes.is_some() {
            return true;
        }
        let want = record.size().clamp(1, self.total).min(u32::MAX as usize) as u32;
        match self.semaphore.clone().try_acquire_many_owned(want) {
            Ok(permit) => {
                record.bytes = Some(permit);
                true
            }
            Err(_) => false,
        }
    }
}

pub(super) enum Forward {
    Sent,
    /// The hub's channel or the byte budget is full: keep it for later.
    Full(Ingested),
    Closed,
}

/// Hand a record to the hub if the byte budget and the channel allow.
pub(super) fn forward(
    tx: &mpsc::Sender<Ingested>,
    budget: &ByteBudget,
    mut record: Ingested,
) -> Forward {
    if !budget.take(&mut record) {
        return Forward::Full(record);
    }
    match tx.try_send(record) {
        Ok(()) => Forward::Sent,
        Err(mpsc::error::TrySendError::Full(record)) => Forward::Full(record),
        Err(mpsc::error::TrySendError::Closed(_)) => Forward::Closed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(value_len: usize) -> Ingested {
        Ingested {
            tp: Tp::new("posts", 0),
            offset: 0,
            key: Some(b"k".to_vec()),
            payload: Some(vec![b'x'; value_len]),
            headers: vec![("h".to_string(), None)],
            timestamp_ms: None,
            generation: Generation::default(),
            received_at: tokio::time::Instant::now(),
            bytes: None,
        }
    }

    #[test]
    fn the_byte_budget_holds_records_back_until_earlier_ones_are_done() {
        let budget = ByteBudget::new(100);
        let (tx, mut rx) = mpsc::channel(8);
        // 60 + key 1 + header name 1 = 62 bytes.
        assert!(matches!(forward(&tx, &budget, record(60)), Forward::Sent));
        assert_eq!(budget.used(), 62);
        let Forward::Full(held) = forward(&tx, &budget, record(60)) else {
            panic!("over the budget: held back");
        };
        assert!(held.bytes.is_none());
        // The first one is done (its verdict acknowledged): its bytes return.
        drop(rx.try_recv().unwrap());
        assert_eq!(budget.used(), 0);
        assert!(matches!(forward(&tx, &budget, held), Forward::Sent));
        drop(rx.try_recv().unwrap());
        // A record larger than the whole budget still goes, alone.
        assert!(matches!(forward(&tx, &budget, record(1000)), Forward::Sent));
        assert_eq!(budget.used(), 100);
    }
}
