//! The shared vocabulary of partitions and positions: a topic-partition,
//! where a record comes from, and the positions the hub hands the consumer
//! thread. A leaf: it imports nothing of the crate.

use std::sync::Arc;

/// A topic-partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tp {
    pub topic: Arc<str>,
    pub partition: i32,
}

impl Tp {
    pub fn new(topic: &str, partition: i32) -> Tp {
        Tp {
            topic: Arc::from(topic),
            partition,
        }
    }
}

/// Where a record comes from: its input partition and offset.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Source {
    pub tp: Tp,
    pub offset: i64,
}

/// A partition's position: the next offset to read there (everything
/// before it is done), as Kafka commits it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Position {
    pub tp: Tp,
    pub next: i64,
}

impl From<(Tp, i64)> for Position {
    /// An entry of a map from partition to position.
    fn from((tp, next): (Tp, i64)) -> Position {
        Position { tp, next }
    }
}

/// Positions of some partitions.
pub type Positions = Vec<Position>;

/// The consumer's rebalance generation: modstream counts one per rebalance
/// (not Kafka's group generation) and stamps every polled record with it,
/// and a partition's state with the one it was created in. Records polled
/// before their partition was revoked or rewound are stale.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation(pub u64);

/// A partition's lag: how many records are left to read there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lag {
    pub tp: Tp,
    pub records: i64,
}
