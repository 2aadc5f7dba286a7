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

/// A default path relative to the repository (`models/...`, `docs/...`):
/// as given where it exists, else under the repository this binary was
/// built in (target/release/modstream is two levels below it), so that the
/// defaults work from any directory.
pub fn beside_the_binary(path: &std::path::Path) -> std::path::PathBuf {
    if path.is_absolute() || path.exists() {
        return path.to_path_buf();
    }
    let exe = std::env::current_exe().ok();
    let found = exe
        .iter()
        .flat_map(|e| e.ancestors().skip(1).take(4))
        .map(|dir| dir.join(path))
        .find(|p| p.exists());
    found.unwrap_or_else(|| path.to_path_buf())
}
