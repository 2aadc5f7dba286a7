//! modstream: content moderation at stream scale.
//!
//! Pipeline stages, in the order an event meets them:
//! [`consumer`] → [`hub`] (routing, with one [`partition`] state per
//! assigned partition: [`event`] validation, [`batcher`], [`offsets`]) →
//! [`inference`] ([`tokens`] for transformers) → [`verdict`] → [`producer`]
//! → back to the [`hub`] and the [`consumer`] for offsets. [`rebalance`] is
//! the revoke/assign protocol between consumer and hub (and, with
//! exactly-once, the end of each [`transaction`]); [`pipeline`] wires
//! the stages. The shared vocabulary sits below them: [`tp`] (partitions
//! and positions), [`scores`] (a model's scores of an event, or why none), [`record`] (output records), [`manifest`], [`client`]
//! (Kafka client configs; [`client_log`] their logs, without repeats), [`config`], [`telemetry`]. [`tools`] holds what
//! runs around the pipeline: demo, bench, the event generator, the embedded
//! cluster. docs/architecture.md has the layers (checked by tests/layers.rs).

pub mod client;
pub mod config;
pub mod consumer;
pub mod event;
pub mod hub;
pub mod inference;
pub mod matching;
pub mod pipeline;
pub mod policy;
pub mod producer;
pub mod sampling;
pub mod schema;
pub mod shutdown;
pub mod state;
pub mod telemetry;
pub mod tools;
pub mod tp;
pub mod verdict;
