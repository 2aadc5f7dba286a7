//! Model loading and the inference workers.
//!
//! Guarantee: model runs never happen on the async runtime. Each worker is a
//! dedicated OS thread that owns its own ONNX Runtime `Session` and takes jobs
//! from a bounded channel; every job gets exactly one result back, success or
//! error, so the pipeline can account for every event it sent.
//!
//! [`model`] is one session and how it is fed; [`runtime`] finds and loads
//! the ONNX Runtime library and registers execution providers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::InferenceSettings;
use crate::inference::manifest::{Manifest, ManifestError};
use crate::inference::score_cache::ScoreCache;
use crate::inference::tokens::TokenError;

pub mod manifest;
mod model;
pub mod placement;
mod runtime;
pub mod score_cache;
pub mod scores;
pub mod tokens;

pub use crate::config::RunLimit;
pub use model::{Model, Profile, Signature, TokenStats};
pub use runtime::{default_cache_dir, find_runtime_library};

use model::catching_panics;

#[derive(Debug, thiserror::Error)]
pub enum InferenceError {
    #[error(
        "ONNX Runtime library not found (looked at {looked_at}); run scripts/fetch-onnxruntime.sh or set ORT_DYLIB_PATH"
    )]
    RuntimeMissing { looked_at: String },
    #[error("cannot load ONNX Runtime from {path}: {message}")]
    RuntimeLoad { path: PathBuf, message: String },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("cannot load model {path}")]
    ModelLoad {
        path: PathBuf,
        #[source]
        source: ort::Error,
    },
    #[error("model does not match its manifest: {0}")]
    Mismatch(String),
    /// Not a `#[source]`: its text goes into dead-letter records whole.
    #[error("model run failed: {0}")]
    Run(ort::Error),
    #[error("inference.require_gpu is set but no GPU provider can be used: {0}")]
    GpuUnavailable(String),
    #[error(
        "inference.require_gpu is set but {provider} runs some of the model's nodes on the CPU (copies between the devices on every run): {ops}{hint}"
    )]
    CpuNodes {
        provider: String,
        ops: String,
        hint: &'static str,
    },
    #[error("cannot set the CPU provider's options (inference.session): {0}")]
    SessionOption(String),
    #[error(transparent)]
    Tokens(#[from] TokenError),
    #[error("inference worker stopped")]
    WorkerGone,
    #[error("cannot start an inference worker thread")]
    Thread(#[source] std::io::Error),
}

impl From<ort::Error> for InferenceError {
    fn from(e: ort::Error) -> Self {
        InferenceError::Run(e)
    }
}

/// A job's number, given by the hub in order: what a result is matched
/// against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct JobId(pub u64);

impl JobId {
    /// This one, and the number after it for the next job.
    pub fn take(&mut self) -> JobId {
        let id = *self;
        self.0 += 1;
        id
    }
}

/// A batch of texts to score; `id` lets the pipeline find its events again.
#[derive(Debug)]
pub struct InferenceJob {
    pub id: JobId,
    pub texts: Vec<String>,
}

pub use crate::inference::scores::{ScoreError, Scores};

#[derive(Debug)]
pub struct InferenceResult {
    pub id: JobId,
    /// One entry per text, in job order.
    pub scores: Vec<Scores>,
    /// The job's texts, handed back (a batch whose run failed may be tried
    /// again).
    pub texts: Vec<String>,
    pub elapsed: Duration,
    /// Tokens this job fed the model, real and padded (token models).
    pub tokens: TokenStats,
    /// Which loaded model (and policy) scored it: 0 for the one the pipeline
    /// started with, then the version of each [`Swap`] ([`crate::pipeline::reload`]);
    /// the hub maps it to the scorer that makes the verdicts.
    pub version: u64,
    /// The worker that ran it (its versions only grow: see [`Swap`]).
    pub worker: usize,
}

/// What a worker switches to before its next job: a new session (a new
/// model, loaded and warmed up beside the old one) and its score cache, or
/// only a new version (a new policy for the same model); its results carry
/// `version` from then on.
pub struct Swap {
    /// The new session and the settings it was loaded with (its resolved
    /// directory: a worker that must reload after a panic loads that one).
    pub model: Option<(Model, InferenceSettings)>,
    pub cache: Option<Arc<ScoreCache>>,
    pub version: u64,
}

/// The worker threads. Dropping the job sender stops them.
pub struct InferencePool {
    jobs: async_channel::Sender<InferenceJob>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// One per worker: what it switches to at its next job boundary.
    swaps: Vec<std::sync::mpsc::Sender<Swap>>,
    pub manifest: Manifest,
    /// Where each worker's session runs, as it was loaded.
    pub sessions: Vec<SessionPlacement>,
}

/// Where one worker's session runs: the provider that runs it (`cpu`,
/// `cuda`, `tensorrt`) and its warm-up's node runs on another provider.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SessionPlacement {
    pub provider: &'static str,
    pub cpu_nodes: usize,
}

impl InferencePool {
    /// Load one session per worker and start the threads. Fails (before any
    /// event is consumed) if the runtime or the model cannot be loaded.
    /// `limit` is the largest job (for the warm-up).
    pub fn start(
        settings: &InferenceSettings,
        limit: RunLimit,
        results: tokio::sync::mpsc::Sender<InferenceResult>,
    ) -> Result<InferencePool, InferenceError> {
        let workers = settings.worker_count();
        let (jobs_tx, jobs_rx) = async_channel::bounded::<InferenceJob>(workers * 2);
        let cache =
            (settings.cache_bytes > 0).then(|| Arc::new(ScoreCache::new(settings.cache_bytes)));
        let models = load_sessions(settings, workers, limit)?;
        let manifest = models
            .first()
            .map(|m| m.manifest.clone())
            .ok_or(InferenceError::WorkerGone)?;
        let sessions = models
            .iter()
            .map(|m| SessionPlacement {
                provider: placement::short_name(m.provider),
                cpu_nodes: m.off_provider_nodes,
            })
            .collect();
        let mut threads = Vec::new();
        let mut swaps = Vec::new();
        for (worker, model) in models.into_iter().enumerate() {
            let (swap_tx, swap_rx) = std::sync::mpsc::channel::<Swap>();
            swaps.push(swap_tx);
            let state = Worker {
                id: worker,
                model,
                settings: settings.clone(),
                cache: cache.clone(),
                version: 0,
            };
            let (jobs, results) = (jobs_rx.clone(), results.clone());
            let handle = std::thread::Builder::new()
                .name(format!("inference-{worker}"))
                .spawn(move || state.serve(jobs, swap_rx, results))
                .map_err(InferenceError::Thread)?;
            threads.push(handle);
        }
        Ok(InferencePool {
            jobs: jobs_tx,
            threads,
            swaps,
            manifest,
            sessions,
        })
    }

    /// Where the sessions of the model named `model` run, for /readyz and
    /// the metrics.
    pub fn placement(&self, model: &str) -> crate::telemetry::ModelPlacement {
        let mut providers: Vec<&'static str> = self.sessions.iter().map(|s| s.provider).collect();
        providers.sort_unstable();
        providers.dedup();
        crate::telemetry::ModelPlacement {
            model: model.to_string(),
            providers,
            workers: self.sessions.len(),
            cpu_nodes: self.sessions.iter().map(|s| s.cpu_nodes).max().unwrap_or(0),
        }
    }

    /// Senders of each worker's switches (for [`crate::pipeline::reload`]).
    pub fn swaps(&self) -> Vec<std::sync::mpsc::Sender<Swap>> {
        self.swaps.clone()
    }

    /// The workers' bounded job queue (`workers × 2` jobs).
    pub fn jobs(&self) -> async_channel::Sender<InferenceJob> {
        self.jobs.clone()
    }

    /// Stop taking jobs and wait for the workers to finish the queued ones.
    pub fn shutdown(self) {
        self.jobs.close();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// `workers` sessions of the model, each warmed up (when
/// `inference.warm_up`): the one loading rule, at start and on hot reload.
/// A model that does not load fails the whole set. The warm-up inputs are
/// synthetic: a model may reject them and still score real events, so a
/// failed warm-up is only a warning (the first batches pay for it).
pub fn load_sessions(
    settings: &InferenceSettings,
    workers: usize,
    limit: RunLimit,
) -> Result<Vec<Model>, InferenceError> {
    let mut models = Vec::with_capacity(workers);
    for worker in 0..workers.max(1) {
        let mut model = Model::load(settings)?;
        let warm_up = match settings.warm_up.then(|| model.warm_up(limit)) {
            Some(Ok(took)) => Some(took),
            Some(Err(e)) => {
                tracing::warn!(worker, error = %e, "warm-up run failed; the first batches pay for it");
                None
            }
            None => None,
        };
        check_placement(&mut model, settings, worker)?;
        tracing::info!(
            worker,
            provider = model.provider,
            model = %model.manifest.name,
            warm_up = ?warm_up,
            "inference session ready"
        );
        models.push(model);
    }
    Ok(models)
}

/// A GPU session's nodes that ran on the CPU (see [`placement`]): with
/// `require_gpu` a refusal naming their op types, else a warning. Their
/// count stays on the model (`off_provider_nodes`).
fn check_placement(
    model: &mut Model,
    settings: &InferenceSettings,
    worker: usize,
) -> Result<(), InferenceError> {
    if model.manifest.quantization.is_some() && model.provider != placement::CPU {
        tracing::warn!(
            worker,
            provider = model.provider,
            "an int8 quantized model on a GPU provider: its integer ops have no GPU kernels and run on the CPU, with copies on every run; give the GPU the fp32 or fp16 model (docs/models.md)"
        );
    }
    let placement = match model.placement() {
        None => return Ok(()),
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            tracing::warn!(worker, error = %e, "cannot tell where the model's nodes run");
            return Ok(());
        }
    };
    let off = placement.off_provider(model.provider);
    model.off_provider_nodes = off.iter().map(|(_, n)| n).sum();
    if let Some(warning) = judge_placement(model.provider, &off, settings.require_gpu)? {
        tracing::warn!(worker, provider = model.provider, "{warning}");
    }
    Ok(())
}

/// What the op types that ran off the session's provider (`off`) mean:
/// nothing, a warning to log, or with `require_gpu` a refusal.
fn judge_placement(
    provider: &str,
    off: &[(String, usize)],
    require_gpu: bool,
) -> Result<Option<String>, InferenceError> {
    if off.is_empty() {
        return Ok(None);
    }
    let ops: Vec<String> = off.iter().map(|(op, n)| format!("{op} ×{n}")).collect();
    let int8 = off
        .iter()
        .any(|(op, _)| placement::INT8_OPS.contains(&op.as_str()));
    let hint = if int8 {
        " (an int8 dynamically quantized model: its integer ops have no GPU kernels; give a GPU provider the fp32 or fp16 model, keep int8 for CPU)"
    } else {
        ""
    };
    if require_gpu {
        return Err(InferenceError::CpuNodes {
            provider: provider.to_string(),
            ops: ops.join(", "),
            hint,
        });
    }
    Ok(Some(format!(
        "{provider} runs some of the model's nodes on the CPU (copies between the devices on every run): {}{hint}",
        ops.join(", ")
    )))
}

/// One worker thread's state: its session, what it was loaded with, its
/// score cache and the version its results carry.
struct Worker {
    id: usize,
    model: Model,
    settings: InferenceSettings,
    cache: Option<Arc<ScoreCache>>,
    version: u64,
}

impl Worker {
    /// Answer jobs until the queue closes or the hub is gone.
    fn serve(
        mut self,
        jobs: async_channel::Receiver<InferenceJob>,
        swaps: std::sync::mpsc::Receiver<Swap>,
        results: tokio::sync::mpsc::Sender<InferenceResult>,
    ) {
        while let Ok(job) = jobs.recv_blocking() {
            // A reload takes effect here, between two jobs.
            while let Ok(swap) = swaps.try_recv() {
                if let Some((fresh, loaded_with)) = swap.model {
                    self.model = fresh;
                    self.settings = loaded_with;
                    self.cache = swap.cache;
                }
                self.version = swap.version;
            }
            if results.blocking_send(self.run(job)).is_err() {
                break;
            }
        }
    }

    fn run(&mut self, mut job: InferenceJob) -> InferenceResult {
        let started = Instant::now();
        let before = self.model.tokens;
        let (model, cache) = (&mut self.model, &self.cache);
        let scores = match catching_panics(&mut job.texts, |texts| match cache {
            Some(cache) => cache.score(texts, |misses| model.score_isolating(misses)),
            None => model.score_isolating(texts),
        }) {
            Ok(scores) => scores,
            Err(panic) => {
                // The session may be left broken: load it again.
                let worker = self.id;
                tracing::error!(worker, error = %panic, "inference panicked; loading the model again");
                match Model::load(&self.settings) {
                    Ok(fresh) => self.model = fresh,
                    Err(e) => {
                        tracing::error!(worker, error = %e, "cannot load the model again; keeping the old session")
                    }
                }
                let failure = ScoreError::Panicked(panic);
                job.texts.iter().map(|_| Err(failure.clone())).collect()
            }
        };
        let after = self.model.tokens;
        InferenceResult {
            id: job.id,
            scores,
            texts: job.texts,
            elapsed: started.elapsed(),
            tokens: after.since(before),
            version: self.version,
            worker: self.id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CUDA session whose int8 ops fell back to the CPU: refused with
    /// require_gpu, naming the op types and what to do; else a warning.
    #[test]
    fn nodes_on_the_cpu_beside_a_gpu_provider_are_refused_or_warned_about() {
        let off = vec![
            ("DynamicQuantizeLinear".to_string(), 1),
            ("MatMulInteger".to_string(), 2),
        ];
        let e = judge_placement("CUDAExecutionProvider", &off, true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("require_gpu")
                && e.contains("CUDAExecutionProvider")
                && e.contains("DynamicQuantizeLinear ×1, MatMulInteger ×2")
                && e.contains("fp32 or fp16"),
            "{e}"
        );
        let warning = judge_placement("CUDAExecutionProvider", &off, false)
            .unwrap()
            .unwrap();
        assert!(warning.contains("MatMulInteger ×2"), "{warning}");
        assert_eq!(
            judge_placement("CUDAExecutionProvider", &[], true).unwrap(),
            None
        );
    }
}
