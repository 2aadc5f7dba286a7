//! Hot reload: a new model version, or a new policy, without stopping.
//!
//! Every `inference.reload_interval` (and at once on SIGHUP) the watcher
//! looks at each model's directory: the directory it resolves to (a symlink
//! swapped to another version directory) and the size and modification time
//! of its manifest, model and tokenizer files. When they changed it loads
//! the model from the resolved directory in new sessions, one per worker,
//! beside the running ones, and warms each up (the same rule as at start: a
//! failed warm-up is a warning); only when all loaded, and the policy still
//! fits the new labels, does the hub learn the new version and each worker
//! switch, at its next job (a batch boundary). The verdicts then carry the
//! new model's name and version. A model that fails to load is refused: the
//! old one keeps serving, the error is logged and counted
//! (`modstream_model_reloads_total{outcome="refused"}`), /readyz stays
//! ready, and the same files are not tried again until they change.
//!
//! The policy: `policy.file` is looked at on the same interval (its size
//! and modification time) and read again on SIGHUP; without a file, SIGHUP
//! reads the configuration's `[policy]` again. A new policy is checked
//! against every loaded model before it takes over, and refused whole
//! (logged, `modstream_policy_reloads_total{outcome="refused"}`) if any rule
//! is wrong: the old one stays. The hub stamps each event with the policy
//! in force when it arrived, so a change applies from one point of each
//! partition on, never to part of an event.
//!
//! The known-bad list files (`[matching] lists`) are looked at on the same
//! interval and read again on SIGHUP ([`crate::matching::ListWatch`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::SystemTime;

use tokio_util::sync::CancellationToken;

use crate::config::{InferenceSettings, ModelSpec, Policy, Settings};
use crate::inference::manifest::Manifest;
use crate::inference::score_cache::ScoreCache;
use crate::inference::{self, Swap};
use crate::policy::ModelId;
use crate::policy::{ModelLabels, Ruleset};
use crate::telemetry::metric::{self, ReloadOutcome};
use crate::verdict::{NewScorer, Scorer};

/// What identifies the model files on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    resolved: PathBuf,
    files: Vec<FileStamp>,
}

/// One model file as the directory lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    name: &'static str,
    len: u64,
    modified: Option<SystemTime>,
}

/// The model directory as it is now; `None` when it cannot be read.
pub fn fingerprint(model_dir: &Path) -> Option<Fingerprint> {
    let resolved = std::fs::canonicalize(model_dir).ok()?;
    let files = ["manifest.json", "model.onnx", "tokenizer.json"]
        .into_iter()
        .filter_map(|name| {
            let meta = std::fs::metadata(resolved.join(name)).ok()?;
            Some(FileStamp {
                name,
                len: meta.len(),
                modified: meta.modified().ok(),
            })
        })
        .collect();
    Some(Fingerprint { resolved, files })
}

/// The policy file as it is now (size, modification time).
fn file_stamp(path: &Path) -> Option<(u64, Option<SystemTime>)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()))
}

/// Where the policy comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicySource {
    File(PathBuf),
    /// The configuration's `[policy]` thresholds.
    Config(Policy),
}

impl PolicySource {
    pub fn of(settings: &Settings) -> PolicySource {
        match &settings.policy.file {
            Some(path) => PolicySource::File(path.clone()),
            None => PolicySource::Config(settings.policy.clone()),
        }
    }

    /// The ruleset for these models, checked.
    pub fn rules(&self, models: &[ModelLabels]) -> Result<Ruleset, crate::policy::PolicyError> {
        match self {
            PolicySource::File(path) => Ruleset::load(path, models),
            PolicySource::Config(policy) => Ruleset::from_config(policy, models),
        }
    }
}

/// One model's reload state.
pub struct ModelReload {
    pub spec: ModelSpec,
    pub swaps: Vec<Sender<Swap>>,
    /// What is loaded now (and what was last refused, not to retry it).
    pub loaded: Option<Fingerprint>,
    pub refused: Option<Fingerprint>,
    pub manifest: Manifest,
    /// The version last handed out (0: the model the pipeline started with).
    pub version: u64,
}

/// The running models and policy, and where to announce new ones.
pub struct Reloader {
    pub settings: Settings,
    pub models: Vec<ModelReload>,
    /// The hub learns each new version here, before any worker can answer
    /// with it.
    pub scorers: tokio::sync::mpsc::Sender<NewScorer>,
    pub policies: tokio::sync::mpsc::Sender<Arc<Ruleset>>,
    pub source: PolicySource,
    pub rules: Ruleset,
    /// The policy file's stamp when last read.
    pub stamp: Option<(u64, Option<SystemTime>)>,
    /// The known-bad list files (`[matching] lists`), read again when they
    /// change and on SIGHUP.
    pub lists: Option<crate::matching::ListWatch>,
}

impl Reloader {
    pub fn new(
        settings: &Settings,
        models: Vec<ModelReload>,
        rules: Ruleset,
        scorers: tokio::sync::mpsc::Sender<NewScorer>,
        policies: tokio::sync::mpsc::Sender<Arc<Ruleset>>,
    ) -> Reloader {
        let source = PolicySource::of(settings);
        let stamp = settings.policy.file.as_deref().and_then(file_stamp);
        Reloader {
            settings: settings.clone(),
            models,
            scorers,
            policies,
            source,
            rules,
            stamp,
            lists: None,
        }
    }

    /// Also watch the list files, handing new lists to the hub here.
    pub fn with_lists(mut self, lists: Option<crate::matching::ListWatch>) -> Reloader {
        self.lists = lists;
        self
    }

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
                tracing::info!("SIGHUP: reading the policy and the models again");
            }
            self.check_policy(sighup).await;
            if let Some(lists) = &mut self.lists {
                lists.check(sighup).await;
            }
            for l in 0..self.models.len() {
                self.check_model(l, sighup).await;
            }
        }
    }

    fn labels(&self) -> Vec<ModelLabels> {
        self.models
            .iter()
            .map(|m| ModelLabels::of(&m.spec.name, &m.manifest))
            .collect()
    }

    /// The policy file when it changed (or on SIGHUP); without a file, on
    /// SIGHUP the configuration's `[policy]`.
    async fn check_policy(&mut self, sighup: bool) {
        let source = match &self.source {
            PolicySource::File(path) => {
                let now = file_stamp(path);
                if !sighup && now == self.stamp {
                    return;
                }
                self.stamp = now;
                self.source.clone()
            }
            PolicySource::Config(_) if sighup => {
                let config = Settings::load(self.settings.source.as_deref());
                match config {
                    Ok(s) => PolicySource::Config(s.policy),
                    Err(error) => return refuse_policy(&error.to_string()),
                }
            }
            PolicySource::Config(_) => return,
        };
        let known = self.settings.matching.list_names();
        let checked = source
            .rules(&self.labels())
            .and_then(|rules| match rules.unknown_list(&known) {
                None => Ok(rules),
                Some((rule, list)) => Err(crate::policy::PolicyError::new(
                    format!("rules.{rule}.lists"),
                    format!("no list is named {list:?} (the lists are {known:?})"),
                )),
            })
            .and_then(|rules| rules.check_state(&self.settings.state).map(|()| rules));
        match checked {
            Ok(rules) if rules == self.rules => {}
            Ok(rules) => {
                tracing::info!(version = %rules.version, rules = ?rules.rule_ids().collect::<Vec<_>>(), "policy reloaded");
                metrics::counter!(metric::POLICY_RELOADS_TOTAL, "outcome" => ReloadOutcome::Loaded.as_str()).increment(1);
                let _ = self.policies.send(Arc::new(rules.clone())).await;
                self.rules = rules;
                self.source = source;
            }
            Err(error) => refuse_policy(&error.to_string()),
        }
    }

    /// Load model `l` again if its files changed (or `force`).
    async fn check_model(&mut self, l: usize, force: bool) {
        let model = &self.models[l];
        let Some(now) = fingerprint(&model.spec.inference.model_dir) else {
            return;
        };
        if Some(&now) == model.loaded.as_ref() || (!force && Some(&now) == model.refused.as_ref()) {
            return;
        }
        let inference = InferenceSettings {
            model_dir: now.resolved.clone(),
            ..model.spec.inference.clone()
        };
        let (workers, limit) = (model.swaps.len(), model.spec.run_limit());
        let loading = inference.clone();
        let loaded =
            tokio::task::spawn_blocking(move || inference::load_sessions(&loading, workers, limit))
                .await
                .map_err(|e| Refusal::Panicked(e.to_string()))
                .and_then(|r| r.map_err(Refusal::Load))
                .and_then(|sessions| self.fits(l, sessions));
        let model = &mut self.models[l];
        let Fitting {
            sessions,
            new_rules: rules,
        } = match loaded {
            Ok(fitting) => fitting,
            Err(error) => {
                tracing::error!(model = %model.spec.name, dir = %now.resolved.display(), %error, "new model refused; the running one keeps serving");
                metrics::counter!(metric::MODEL_RELOADS_TOTAL, "outcome" => ReloadOutcome::Refused.as_str()).increment(1);
                model.refused = Some(now);
                return;
            }
        };
        let manifest = sessions[0].manifest.clone();
        let cache =
            (inference.cache_bytes > 0).then(|| Arc::new(ScoreCache::new(inference.cache_bytes)));
        model.version += 1;
        let version = model.version;
        // The hub learns the version (and a policy re-derived for its
        // labels) before any worker can answer with it.
        if let Some(rules) = rules {
            let _ = self.policies.send(Arc::new(rules.clone())).await;
            self.rules = rules;
        }
        let model = &mut self.models[l];
        let scorer = Arc::new(Scorer::named(&model.spec.name, &manifest));
        let _ = self
            .scorers
            .send(NewScorer {
                model: ModelId(l),
                version,
                scorer,
            })
            .await;
        for (swap, session) in model.swaps.iter().zip(sessions) {
            let _ = swap.send(Swap {
                model: Some((session, inference.clone())),
                cache: cache.clone(),
                version,
            });
        }
        tracing::info!(
            model = %model.spec.name,
            from = %format!("{} {}", model.manifest.name, model.manifest.version),
            to = %format!("{} {}", manifest.name, manifest.version),
            dir = %now.resolved.display(),
            "model reloaded; the workers switch at their next batch"
        );
        metrics::counter!(metric::MODEL_RELOADS_TOTAL, "outcome" => ReloadOutcome::Loaded.as_str())
            .increment(1);
        model.manifest = manifest;
        model.loaded = Some(now);
        model.refused = None;
    }

    /// Whether the policy fits model `l`'s new sessions: every label a rule
    /// judges must be there. Without a policy file the rules follow the
    /// new manifest (its score_label): returned to be announced.
    fn fits(&self, l: usize, sessions: Vec<inference::Model>) -> Result<Fitting, Refusal> {
        let manifest = &sessions.first().ok_or(Refusal::NoWorker)?.manifest;
        let mut labels = self.labels();
        labels[l] = ModelLabels::of(&self.models[l].spec.name, manifest);
        if let PolicySource::Config(_) = self.source {
            let rules = self.source.rules(&labels)?;
            return Ok(Fitting {
                sessions,
                new_rules: (rules != self.rules).then_some(rules),
            });
        }
        let missing = self.rules.missing_labels(ModelId(l), &manifest.labels);
        if !missing.is_empty() {
            return Err(Refusal::LabelsMissing {
                version: self.rules.version.clone(),
                missing: missing.into_iter().map(str::to_string).collect(),
                has: manifest.labels.clone(),
            });
        }
        Ok(Fitting {
            sessions,
            new_rules: None,
        })
    }
}

/// Why a new model is refused (the running one keeps serving).
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("{0}")]
    Load(inference::InferenceError),
    #[error("the loading thread panicked: {0}")]
    Panicked(String),
    #[error("no worker to load for")]
    NoWorker,
    #[error("{0}")]
    Policy(#[from] crate::policy::PolicyError),
    #[error(
        "the policy (version {version}) judges labels this model lacks: {missing:?} (it has {has:?})"
    )]
    LabelsMissing {
        version: String,
        missing: Vec<String>,
        has: Vec<String>,
    },
}

/// A new model's sessions that the policy fits, and the rules that follow
/// its manifest when there is no policy file (None: unchanged).
struct Fitting {
    sessions: Vec<inference::Model>,
    new_rules: Option<Ruleset>,
}

fn refuse_policy(error: &str) {
    tracing::error!(%error, "new policy refused; the current one stays");
    metrics::counter!(metric::POLICY_RELOADS_TOTAL, "outcome" => ReloadOutcome::Refused.as_str())
        .increment(1);
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
