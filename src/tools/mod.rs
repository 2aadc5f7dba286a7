//! What runs around the pipeline rather than in it: `modstream demo`,
//! `modstream plan` (sizing from a bench report, whose format is
//! [`report`]), the event generator and sender behind `modstream produce`, a
//! topic reader, the embedded Kafka cluster, and the median and percentile
//! helpers ([`stats`]). The integration tests and
//! the bench (the `modstream-bench` crate) use them too.

pub mod campaign;
pub mod demo;
pub mod embedded;
pub mod explain;
pub mod generator;
pub mod init_model;
pub mod plan;
pub mod prevalence;
pub mod range;
pub mod read;
pub mod report;
pub mod rescore;
pub mod send;
pub mod stats;
pub mod topics;

pub use crate::config::beside_the_binary;
