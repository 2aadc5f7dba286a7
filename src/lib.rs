//! modstream: content moderation at stream scale.
//!
//! Pipeline stages, in the order an event meets them:
//! [`consumer`] → [`event`] (validation) → [`batcher`] → [`inference`] →
//! [`verdict`] → [`producer`] → [`offsets`]; [`pipeline`] wires them.

pub mod batcher;
pub mod bench;
pub mod config;
pub mod consumer;
pub mod demo;
pub mod embedded;
pub mod event;
pub mod inference;
pub mod offsets;
pub mod pipeline;
pub mod producer;
pub mod shutdown;
pub mod telemetry;
pub mod tokens;
pub mod verdict;
