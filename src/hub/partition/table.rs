//! The owned partitions, each one's state by its topic-partition.

use super::Partition;
use crate::tp::{Generation, Tp};

/// The partitions' table. foldhash: looked up per event and per
/// acknowledgement, where SipHash's DoS resistance buys nothing (the keys
/// are the assignment, not the posts).
#[derive(Default)]
pub struct Partitions(foldhash::HashMap<Tp, Partition>);

impl Partitions {
    /// Whether `tp`'s state is still the one of `generation` (a batch or
    /// an acknowledgement of a state dropped since is not its).
    pub fn current(&self, tp: &Tp, generation: Generation) -> bool {
        self.0.get(tp).is_some_and(|p| p.generation() == generation)
    }

    /// The generation of `tp`'s state (the default if it has none).
    pub fn generation_of(&self, tp: &Tp) -> Generation {
        self.0
            .get(tp)
            .map_or(Generation::default(), Partition::generation)
    }

    /// Events of these partitions consumed and not yet delivered.
    pub fn in_flight_of(&self, tps: &[Tp]) -> u64 {
        tps.iter()
            .filter_map(|tp| self.0.get(tp))
            .map(|p| p.in_flight() as u64)
            .sum()
    }
}

impl std::ops::Deref for Partitions {
    type Target = foldhash::HashMap<Tp, Partition>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Partitions {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}
