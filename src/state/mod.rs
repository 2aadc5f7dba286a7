//! What modstream remembers of an entity (a user, by default) between its
//! events, for the policy's state rules ([`crate::policy::state_rules`]).
//!
//! State is kept per input partition ([`Store`], owned by the hub's
//! partition) and changed where the partition's verdicts are produced, in
//! offset order: an event is counted, the state rules read its entity's
//! state, the verdict is raised if one fires, and the verdict of the models
//! and lists (before any raise) is counted.
//! So a rule fires from exactly the event that crosses its threshold.
//!
//! Durable: every change is a record of `state.changelog_topic` (compacted),
//! keyed by `INPUT_TOPIC/ENTITY`, on the input partition's number, its value
//! the entity's whole state (null: forgotten), its header
//! `modstream.source.offset` the input offset it answers. It goes out with
//! the verdict, through the same producer: at-least-once holds the offset
//! until it is acknowledged; exactly-once writes it in the same transaction.
//! A new owner reads the partition's changelog before producing any verdict
//! of it ([`restore`]), keeping only the changes of offsets before the first
//! one it reads: those are the committed ones, so its state is that of an
//! owner that never stopped. (A change of a later offset is dropped; its
//! event is read again and counts again, once.)
//!
//! Exact when the input is keyed by the entity (all its events in one
//! partition, in order); otherwise each partition counts the events it
//! holds (the start warns, [`keying`]).
//!
//! Time is the record's timestamp (set by the producer of the input, or
//! the broker), never a field of the event: a poster cannot spread its
//! posts over minutes by writing a time into them.
//!
//! Bounded: an entity holds at most a day of minute buckets and
//! `state.history` verdicts; past `state.max_bytes` for all partitions, the
//! least recently seen entity of the partition being updated is forgotten,
//! and an entity with nothing in the last day is forgotten when it is the
//! least recently seen; either writes a tombstone to the changelog, so a
//! restored owner forgets it too. (The budget spans all of an instance's
//! partitions: a new owner holding other partitions may forget other
//! entities later than the old one would have. Exact while within it.)

use std::borrow::Cow;

use hashlink::LinkedHashMap;

use crate::config::StateSettings;
use crate::event::Event;
use crate::policy::state_rules::{Fired, Subject, event_value};
use crate::policy::{Field, Ruleset, Verdict};
use crate::producer::record::{OutRecord, RecordKind};
use crate::telemetry::metric;
use crate::tp::Tp;

mod entity;
pub mod keying;
pub mod restore;

pub use entity::EntityState;

/// The header that carries the input offset a changelog record answers.
pub const OFFSET_HEADER: &str = "modstream.source.offset";

/// Idle entities looked at per event (bounded work on the verdicts' path).
const IDLE_CHECKS: usize = 2;

/// One input partition's entities, least recently seen first.
#[derive(Debug, Default)]
pub struct Store {
    // SipHash (the default): the keys are the users' own ids.
    entities: LinkedHashMap<String, EntityState>,
    bytes: usize,
}

impl Store {
    pub fn len(&self) -> usize {
        self.entities.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entities.is_empty()
    }

    /// What its entities are charged against `state.max_bytes`.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// An entity's state, as the changelog has it.
    pub fn get(&self, entity: &str) -> Option<&EntityState> {
        self.entities.get(entity)
    }

    fn charge(entity: &str, state: &EntityState) -> usize {
        entity.len() + state.bytes()
    }
}

/// What the state step made of one event: the rule that raised its
/// verdict, if one did, and the changelog records to write with it.
#[derive(Debug, Default)]
pub struct Step {
    pub fired: Option<Fired>,
    pub changelog: Vec<OutRecord>,
}

/// One event as the state step sees it.
pub struct Judging<'a> {
    pub tp: &'a Tp,
    pub offset: i64,
    pub event: &'a Event,
    /// The record's key (is the input keyed by the entity? [`keying`]).
    pub key: Option<&'a [u8]>,
    /// The record's timestamp (ms), if it has one.
    pub timestamp_ms: Option<i64>,
    pub rules: &'a Ruleset,
    /// The verdict of the models and lists.
    pub verdict: Verdict,
    /// The event's score for a label: the highest of the models that
    /// scored it; `None` where none has the label.
    pub score: &'a dyn Fn(&str) -> Option<f32>,
}

/// A distinct value's hash in an entity's state: SHA-256's first 8 bytes,
/// so that a poster cannot choose values that collide (that count as one):
/// finding one pair takes about 2^32 tries, and each pair counts one less.
pub fn distinct_hash(value: &str) -> u64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(value.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// The state settings and what all partitions' state holds.
pub struct Keeper {
    topic: String,
    field: Field,
    name: String,
    history: usize,
    max_bytes: usize,
    bytes: usize,
    entities: usize,
    keying: keying::KeyingSample,
}

impl Keeper {
    /// `None` without `state.changelog_topic`.
    pub fn new(settings: &StateSettings) -> Option<Keeper> {
        let topic = settings.changelog_topic.clone()?;
        Some(Keeper {
            topic,
            field: Field::parse(&settings.entity).unwrap_or(Field::UserId),
            name: settings.entity_name.clone(),
            history: settings.history as usize,
            max_bytes: settings.max_bytes,
            bytes: 0,
            entities: 0,
            keying: keying::KeyingSample::default(),
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Counts an event in its entity's state, judges it by the state rules,
    /// and counts the verdict of its models and lists (never the raised one).
    pub fn step(&mut self, store: &mut Store, at: Judging<'_>) -> Step {
        let Some(id) = self.field.value(&at.tp.topic, at.event) else {
            return Step::default();
        };
        if let Some(k) = self.keying.saw(at.key, &id)
            && k.other_keys > 0
        {
            tracing::warn!(sampled = k.seen, other_keys = k.other_keys, entity = %self.name, "records whose key is not their entity's id: an entity's events may be in several partitions, and each partition's state counts only its own (key the input topic by the entity for exact state)");
        }
        let entity = format!("{}:{id}", self.name);
        let time_ms = at
            .timestamp_ms
            .filter(|t| *t > 0)
            .unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
        let minute = (time_ms / 60_000).clamp(0, i64::from(u32::MAX / 2)) as u32;
        let mut state = match store.entities.remove(&entity) {
            Some(state) => {
                self.uncharge(store, Store::charge(&entity, &state));
                state
            }
            None => EntityState::default(),
        };
        if state.post(minute) {
            self.count_tracked(&mut state, minute, &at);
        }
        let fired = self.fire(&entity, &state, minute, &at);
        // The models' and lists' verdict, not the raised one: a state rule
        // never feeds the counters it or another reads (a user blocked for
        // two blocks in three posts is not blocked forever by its own).
        state.verdict(minute, at.verdict, self.history);
        let mut changelog =
            vec![self.record(at.tp, at.offset, &entity, Some(&state), at.timestamp_ms)];
        let charge = Store::charge(&entity, &state);
        store.entities.insert(entity, state);
        self.bytes += charge;
        store.bytes += charge;
        self.entities += 1;
        self.forget(
            store,
            at.tp,
            at.offset,
            minute,
            at.timestamp_ms,
            &mut changelog,
        );
        if let Some(f) = &fired {
            metrics::counter!(metric::STATE_RULES_FIRED_TOTAL, "rule" => f.rule.clone())
                .increment(1);
        }
        self.export();
        Step { fired, changelog }
    }

    /// Counts the event's scores above the thresholds and its distinct
    /// values, for the counters of the rules in force.
    fn count_tracked(&self, state: &mut EntityState, minute: u32, at: &Judging<'_>) {
        let tracked = at.rules.state_tracked();
        for score in &tracked.scores {
            if (at.score)(&score.label).is_some_and(|s| s > score.over) {
                state.over(&score.key, minute);
            }
        }
        for of in &tracked.distinct {
            if let Some(value) = of.field.value(&at.tp.topic, at.event) {
                state.seen(&of.name, distinct_hash(&value), minute);
            }
        }
    }

    /// The first state rule that gives the highest raise above `verdict`.
    fn fire(
        &self,
        entity: &str,
        state: &EntityState,
        minute: u32,
        at: &Judging<'_>,
    ) -> Option<Fired> {
        let mut best: Option<Fired> = None;
        for rule in at.rules.state_rules() {
            if rule.raise <= best.as_ref().map_or(at.verdict, |b| b.raise)
                || !rule.when.matches(&at.tp.topic, at.event)
            {
                continue;
            }
            let holds = rule.conditions.iter().all(|c| {
                let value = match &c.subject {
                    Subject::Counter { counter, .. } => Some(state.value(counter, minute) as f64),
                    Subject::Event { field, .. } => event_value(field, &at.tp.topic, at.event),
                };
                value.is_some_and(|v| c.op.holds(v, c.than))
            });
            // A rule has a counter (StateRule::parse_conditions): it names it.
            let first = rule.conditions.iter().find_map(|c| match &c.subject {
                Subject::Counter { name, counter, .. } => Some((name, counter)),
                Subject::Event { .. } => None,
            });
            let (true, Some((name, counter))) = (holds, first) else {
                continue;
            };
            best = Some(Fired {
                rule: rule.id.clone(),
                entity: entity.to_string(),
                counter: name.clone(),
                value: state.value(counter, minute),
                raise: rule.raise,
                label: rule.label.clone(),
            });
        }
        best
    }

    /// Past the budget, the least recently seen entities of this partition
    /// go (never the one just updated); then up to [`IDLE_CHECKS`] idle ones.
    fn forget(
        &mut self,
        store: &mut Store,
        tp: &Tp,
        offset: i64,
        minute: u32,
        timestamp_ms: Option<i64>,
        changelog: &mut Vec<OutRecord>,
    ) {
        let mut idle_checks = 0;
        while store.entities.len() > 1 {
            let Some((entity, state)) = store.entities.front() else {
                break;
            };
            let over = self.bytes > self.max_bytes;
            if !over {
                if idle_checks == IDLE_CHECKS || !state.idle_at(minute) {
                    break;
                }
                idle_checks += 1;
            }
            let charge = Store::charge(entity, state);
            let Some((entity, _)) = store.entities.pop_front() else {
                break;
            };
            self.uncharge(store, charge);
            metrics::counter!(metric::STATE_EVICTED_TOTAL).increment(1);
            changelog.push(self.record(tp, offset, &entity, None, timestamp_ms));
        }
    }

    /// One entity's charge taken off.
    fn uncharge(&mut self, store: &mut Store, charge: usize) {
        self.bytes = self.bytes.saturating_sub(charge);
        store.bytes = store.bytes.saturating_sub(charge);
        self.entities = self.entities.saturating_sub(1);
    }

    /// A partition's state is dropped (revoked, or rewound).
    pub fn dropped(&mut self, store: &Store) {
        self.bytes = self.bytes.saturating_sub(store.bytes);
        self.entities = self.entities.saturating_sub(store.entities.len());
        self.export();
    }

    /// A restored partition's state takes over: charged, and past the
    /// budget its least recently seen entities are forgotten (in memory
    /// only: the next change of each is written whole).
    pub fn restored(&mut self, store: &mut Store) {
        self.bytes += store.bytes;
        self.entities += store.entities.len();
        while self.bytes > self.max_bytes {
            let Some((entity, state)) = store.entities.pop_front() else {
                break;
            };
            let charge = Store::charge(&entity, &state);
            self.uncharge(store, charge);
            metrics::counter!(metric::STATE_EVICTED_TOTAL).increment(1);
        }
        self.export();
    }

    fn export(&self) {
        metrics::gauge!(metric::STATE_ENTITIES).set(self.entities as f64);
        metrics::gauge!(metric::STATE_BYTES).set(self.bytes as f64);
    }

    /// The changelog record of an entity's state (`None`: forgotten).
    fn record(
        &self,
        tp: &Tp,
        offset: i64,
        entity: &str,
        state: Option<&EntityState>,
        timestamp_ms: Option<i64>,
    ) -> OutRecord {
        OutRecord {
            topic: self.topic.clone(),
            partition: Some(tp.partition),
            key: Some(changelog_key(&tp.topic, entity).into_bytes()),
            payload: state.map(|s| serde_json::to_vec(s).unwrap_or_default()),
            headers: vec![(
                Cow::Borrowed(OFFSET_HEADER),
                Some(offset.to_string().into_bytes()),
            )],
            timestamp_ms: timestamp_ms.filter(|t| *t > 0),
            kind: RecordKind::State,
        }
    }
}

/// `INPUT_TOPIC/ENTITY`: the input topic keeps two topics' partitions of
/// one number apart in the changelog's partition.
pub fn changelog_key(topic: &str, entity: &str) -> String {
    format!("{topic}/{entity}")
}

/// A store built from changelog records, in the order they were read.
#[derive(Debug, Default)]
pub struct Rebuild {
    store: Store,
}

impl Rebuild {
    /// One changelog record of the partition (`offset_header`: its
    /// [`OFFSET_HEADER`]'s value): kept when it answers an offset before
    /// `before` of `topic`.
    pub fn apply(
        &mut self,
        topic: &str,
        before: i64,
        key: &[u8],
        value: Option<&[u8]>,
        offset_header: Option<&[u8]>,
    ) -> Result<(), String> {
        let offset: Option<i64> = offset_header
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| h.parse().ok());
        let Some(offset) = offset else {
            return Err(format!("no {OFFSET_HEADER} header with an offset"));
        };
        let key = std::str::from_utf8(key).map_err(|_| "a key that is not UTF-8".to_string())?;
        let Some(entity) = key.strip_prefix(topic).and_then(|k| k.strip_prefix('/')) else {
            return Ok(());
        };
        if offset >= before {
            return Ok(());
        }
        if let Some(old) = self.store.entities.remove(entity) {
            self.store.bytes -= Store::charge(entity, &old);
        }
        if let Some(value) = value {
            let state: EntityState =
                serde_json::from_slice(value).map_err(|e| format!("not an entity's state: {e}"))?;
            self.store.bytes += Store::charge(entity, &state);
            self.store.entities.insert(entity.to_string(), state);
        }
        Ok(())
    }

    pub fn finish(self) -> Store {
        self.store
    }
}

#[cfg(test)]
mod tests;
