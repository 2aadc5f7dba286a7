//! Hot reload: a new model, or a new policy, without stopping.
//!
//! Every `inference.reload_interval` (and at once on SIGHUP) the watcher
//! looks at `inference.model_dir`: the directory it resolves to (a symlink
//! swapped to another version directory) and the size and modification time
//! of its manifest, model and tokenizer files. When they changed it loads
//! the model from the resolved directory in new sessions, one per worker,
//! beside the running ones, and warms each up (the same rule as at start: a
//! failed warm-up is a warning); only when all loaded, and the policy
//! accepts the new labels, does the hub learn the new version's scorer and
//! each worker switch, at its next job (a batch boundary). The verdicts then
//! carry the new model's name and version. A model that fails to load is
//! refused: the old one keeps serving, the error is logged and counted
//! (`modstream_model_reloads_total{outcome="refused"}`), /readyz stays ready,
//! and the same files are not tried again until they change.
//!
//! SIGHUP also reads the configuration file again and applies its `policy`
//! section (validated first; a bad one is refused the same way).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::SystemTime;

use tokio_util::sync::CancellationToken;

use crate::config::{InferenceSettings, Policy, Settings};
use crate::inference::{self, Swap};
use crate::manifest::Manifest;
use crate::score_cache::ScoreCache;
use crate::telemetry::metric::{self, ReloadOutcome};
use crate::verdict::{NewScorer, Scorer};

/// What identifies the model files on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    resolved: PathBuf,
    files: Vec<(String, u64, Option<SystemTime>)>,
}

/// The model directory as it is now; `None` when it cannot be read.
pub fn fingerprint(model_dir: &Path) -> Option<Fingerprint> {
    let resolved = std::fs::canonicalize(model_dir).ok()?;
    let files = ["manifest.json", "model.onnx", "tokenizer.json"]
        .into_iter()
        .filter_map(|name| {
            let meta = std::fs::metadata(resolved.join(name)).ok()?;
            Some((name.to_string(), meta.len(), meta.modified().ok()))
        })
        .collect();
    Some(Fingerprint { resolved, files })
}

/// The running model and policy, and the workers to switch.
pub struct Reloader {
    pub settings: Settings,
    pub max_batch: usize,
    pub swaps: Vec<Sender<Swap>>,
    /// The hub learns each new version's scorer here, before any worker
    /// can answer with it.
    pub scorers: tokio::sync::mpsc::Sender<NewScorer>,
    /// What is loaded now (and what was last refused, not to retry it).
    pub loaded: Option<Fingerprint>,
    pub refused: Option<Fingerprint>,
    pub manifest: Manifest,
    /// The version last handed out (0: the model the pipeline started with).
    pub version: u64,
}

impl Reloader {
    /// Watch until `stop`: on the interval and on SIGHUP.
    pub async fn run(mut self, stop: CancellationToken) {
        #[cfg(unix)]
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let interval = self.settings.inference.reload_interval;
        loop {
            let tick = async {
                if interval.is_zero() {
                    std::future::pending::<()>().await
                } else {
                    tokio::time::sleep(interval).await
                }
            };
            #[cfg(unix)]
            let hup = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hup = std::future::pending::<Option<()>>();
            let sighup = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick => false,
                _ = hup => true,
            };
            if sighup {
                tracing::info!("SIGHUP: reading the configuration and the model again");
                self.reread_policy().await;
            }
            self.check_model(sighup).await;
        }
    }

    /// SIGHUP: the configuration file's `policy`, validated, for the
    /// current model.
    async fn reread_policy(&mut self) {
        let source = self.settings.source.clone();
        let policy = Settings::load(source.as_deref()).map(|s| s.policy);
        match policy.map_err(|e| e.to_string()).and_then(|p| {
            Scorer::new(&self.manifest, &p)
                .map(|scorer| (p, scorer))
                .map_err(|e| e.to_string())
        }) {
            Ok((policy, _)) if policy == self.settings.policy => {}
            Ok((policy, scorer)) => {
                let version = self.announce(scorer).await;
                for swap in &self.swaps {
                    let _ = swap.send(Swap {
                        model: None,
                        cache: None,
                        version,
                    });
                }
                tracing::info!(?policy, "policy reloaded");
                metrics::counter!(metric::POLICY_RELOADS_TOTAL, "outcome" => ReloadOutcome::Loaded.as_str()).increment(1);
                self.settings.policy = policy;
            }
            Err(error) => {
                tracing::error!(%error, "new policy refused; the current one stays");
                metrics::counter!(metric::POLICY_RELOADS_TOTAL, "outcome" => ReloadOutcome::Refused.as_str())
                    .increment(1);
            }
        }
    }

    /// Tell the hub the next version's scorer; the workers are told after,
    /// so the hub always knows a version before a result carries it.
    async fn announce(&mut self, scorer: Scorer) -> u64 {
        self.version += 1;
        let _ = self.scorers.send((self.version, Arc::new(scorer))).await;
        self.version
    }

    /// Load the model again if its files changed (or `force`).
    async fn check_model(&mut self, force: bool) {
        let Some(now) = fingerprint(&self.settings.inference.model_dir) else {
            return;
        };
        if Some(&now) == self.loaded.as_ref() || (!force && Some(&now) == self.refused.as_ref()) {
            return;
        }
        let inference = InferenceSettings {
            model_dir: now.resolved.clone(),
            ..self.settings.inference.clone()
        };
        let (workers, max_batch, policy) = (
            self.swaps.len(),
            self.max_batch,
            self.settings.policy.clone(),
        );
        let loading = inference.clone();
        let loaded =
            tokio::task::spawn_blocking(move || load(&loading, &policy, workers, max_batch))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
        match loaded {
            Ok((models, scorer)) => {
                let manifest = models[0].manifest.clone();
                let cache = (inference.cache_bytes > 0)
                    .then(|| Arc::new(ScoreCache::new(inference.cache_bytes)));
                let version = self.announce(scorer).await;
                for (swap, model) in self.swaps.iter().zip(models) {
                    let _ = swap.send(Swap {
                        model: Some((model, inference.clone())),
                        cache: cache.clone(),
                        version,
                    });
                }
                tracing::info!(
                    from = %format!("{} {}", self.manifest.name, self.manifest.version),
                    to = %format!("{} {}", manifest.name, manifest.version),
                    dir = %now.resolved.display(),
                    "model reloaded; the workers switch at their next batch"
                );
                metrics::counter!(metric::MODEL_RELOADS_TOTAL, "outcome" => ReloadOutcome::Loaded.as_str()).increment(1);
                self.manifest = manifest;
                self.loaded = Some(now);
                self.refused = None;
            }
            Err(error) => {
                tracing::error!(dir = %now.resolved.display(), %error, "new model refused; the running one keeps serving");
                metrics::counter!(metric::MODEL_RELOADS_TOTAL, "outcome" => ReloadOutcome::Refused.as_str()).increment(1);
                self.refused = Some(now);
            }
        }
    }
}

/// `workers` sessions of the model (loaded and warmed up by the same rule
/// as at start: [`inference::load_sessions`]) and its scorer; any failure
/// refuses the whole reload.
fn load(
    settings: &InferenceSettings,
    policy: &Policy,
    workers: usize,
    max_batch: usize,
) -> Result<(Vec<inference::Model>, Scorer), String> {
    let models =
        inference::load_sessions(settings, workers, max_batch).map_err(|e| e.to_string())?;
    let manifest = &models.first().ok_or("no worker to load for")?.manifest;
    let scorer = Scorer::new(manifest, policy).map_err(|e| e.to_string())?;
    Ok((models, scorer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_follows_a_swapped_symlink_and_changed_files() {
        let dir = tempfile::tempdir().unwrap();
        for v in ["v1", "v2"] {
            std::fs::create_dir(dir.path().join(v)).unwrap();
            std::fs::write(dir.path().join(v).join("manifest.json"), "{}").unwrap();
            std::fs::write(dir.path().join(v).join("model.onnx"), v).unwrap();
        }
        let current = dir.path().join("current");
        std::os::unix::fs::symlink(dir.path().join("v1"), &current).unwrap();
        let first = fingerprint(&current).unwrap();
        assert_eq!(fingerprint(&current), Some(first.clone()), "stable");
        std::fs::remove_file(&current).unwrap();
        std::os::unix::fs::symlink(dir.path().join("v2"), &current).unwrap();
        let second = fingerprint(&current).unwrap();
        assert_ne!(first, second, "a swapped symlink is a new model");
        std::fs::write(dir.path().join("v2").join("model.onnx"), "longer now").unwrap();
        assert_ne!(fingerprint(&current).unwrap(), second, "a changed file too");
        assert_eq!(fingerprint(&dir.path().join("missing")), None);
    }
}
