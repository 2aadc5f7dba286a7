//! The stages of an event's way through the hub, in the order it meets
//! them. Each stage is a part that owns its state and answers with a typed
//! value; the hub ([`super::route`]) hands that value to the next stage:
//!
//! ```text
//! take in and decode   intake      Ingested      -> Decoded (a Pending event, or a rejection)
//! match                matching    &mut Pending  -> its marks, cluster, reused scores
//! batch                (the partition's batcher, with batching's choice)  -> ReadyBatch
//! score                scoring     ReadyBatch    -> Queued / Ran (the batch with its scores)
//! judge                judge       &Pending      -> Judgement (policy, then state rules)
//! compose              outputs     Judgement     -> Outgoing + Outcome
//! deliver              delivery    ReadyOutput   -> Acked
//! store the position   positions   a partition's new position (or the seal's answer)
//! ```
//!
//! A feature that may be off (matching, state rules, sampling, shadow,
//! traces, a Schema Registry format) is a stage, or a part of one, that
//! answers as if absent when off: the hub never asks whether it is on.
//! [`Stages::new`] builds the chain in this order, once.

use std::sync::Arc;

use crate::config::Settings;
use crate::policy::Ruleset;
use crate::telemetry::Health;

pub(crate) mod batching;
pub(crate) mod delivery;
pub(crate) mod intake;
pub(crate) mod judge;
pub(crate) mod matching;
pub(crate) mod outputs;
pub(crate) mod positions;
pub(crate) mod scoring;
pub(crate) mod state;

use batching::Batching;
use delivery::{Deliver, Delivery};
use intake::Intake;
use matching::Matching;
use outputs::Composer;
use positions::PositionBook;
use scoring::{ModelLane, Scoring};
use state::StateRules;

/// The chain: one field per stage, in the order an event meets them.
pub(crate) struct Stages<D: Deliver> {
    pub(crate) intake: Intake,
    pub(crate) matching: Matching,
    pub(crate) batching: Batching,
    pub(crate) scoring: Scoring,
    pub(crate) state: StateRules,
    pub(crate) outputs: Composer,
    pub(crate) delivery: Delivery<D>,
    pub(crate) positions: PositionBook,
}

/// What the chain is built from besides the settings.
pub(crate) struct Parts<D: Deliver> {
    /// One per model, in the order they score an event.
    pub models: Vec<ModelLane>,
    /// The policy at start.
    pub rules: Ruleset,
    pub outbox: D,
    pub positions: async_channel::Sender<crate::tp::Positions>,
    pub health: Arc<Health>,
    pub abort: tokio_util::sync::CancellationToken,
}

impl<D: Deliver> Stages<D> {
    /// The chain with every optional stage absent (the hub's `with_*`
    /// builders put in those that are on).
    pub(crate) fn new(settings: &Settings, parts: Parts<D>) -> Stages<D> {
        let scoring = Scoring::new(settings, parts.models, parts.health);
        let (choice, tokens) = scoring.partition_choice();
        let batching = Batching::new(choice, tokens);
        Stages {
            intake: Intake::new(settings, Arc::new(parts.rules), scoring.max_length()),
            matching: Matching::off(settings.output.waves_topic.clone()),
            batching,
            scoring,
            state: StateRules::off(),
            outputs: Composer::new(settings),
            delivery: Delivery::new(settings, parts.outbox, parts.abort),
            positions: PositionBook::new(parts.positions),
        }
    }
}
