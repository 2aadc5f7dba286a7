//! What runs around the pipeline rather than in it: `modstream demo` and
//! `modstream bench`, `modstream plan` (sizing from a bench report), the event generator and sender behind `modstream
//! produce`, a topic reader, and the embedded Kafka cluster. The
//! integration tests use them too.

pub mod bench;
pub mod demo;
pub mod embedded;
pub mod explain;
pub mod generator;
pub mod plan;
pub mod range;
pub mod read;
pub mod rescore;
pub mod send;
