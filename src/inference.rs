//! Model loading and the inference workers.
//!
//! Guarantee: model runs never happen on the async runtime. Each worker is a
//! dedicated OS thread that owns its own ONNX Runtime `Session` and takes jobs
//! from a bounded channel; every job gets exactly one result back, success or
//! error, so the pipeline can account for every event it sent.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ort::session::Session;
use ort::value::Tensor;
use serde::Deserialize;

use crate::config::InferenceSettings;

#[derive(Debug, thiserror::Error)]
pub enum InferenceError {
    #[error(
        "ONNX Runtime library not found (looked at {looked_at}); run scripts/fetch-onnxruntime.sh or set ORT_DYLIB_PATH"
    )]
    RuntimeMissing { looked_at: String },
    #[error("cannot load ONNX Runtime from {path}: {message}")]
    RuntimeLoad { path: PathBuf, message: String },
    #[error("cannot read model manifest {path}: {message}")]
    Manifest { path: PathBuf, message: String },
    #[error("cannot load model {path}: {source}")]
    ModelLoad {
        path: PathBuf,
        #[source]
        source: ort::Error,
    },
    #[error("model does not match its manifest: {0}")]
    Mismatch(String),
    #[error("model run failed: {0}")]
    Run(#[from] ort::Error),
    #[error("inference worker stopped")]
    WorkerGone,
}

/// `manifest.json` beside `model.onnx`.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub version: String,
    /// "text": one string per event.
    pub input_kind: String,
    pub inputs: Vec<String>,
    pub output: String,
    pub labels: Vec<String>,
    /// The label whose probability drives allow / review / block.
    pub score_label: String,
}

impl Manifest {
    pub fn load(model_dir: &Path) -> Result<Manifest, InferenceError> {
        let path = model_dir.join("manifest.json");
        let err = |message: String| InferenceError::Manifest {
            path: path.clone(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        if manifest.input_kind != "text" || manifest.inputs.len() != 1 {
            return Err(err(
                "only input_kind \"text\" with one input is supported".into()
            ));
        }
        if !manifest.labels.contains(&manifest.score_label) {
            return Err(err(format!(
                "score_label {:?} is not among labels",
                manifest.score_label
            )));
        }
        Ok(manifest)
    }

    pub fn score_index(&self) -> usize {
        self.labels
            .iter()
            .position(|l| *l == self.score_label)
            .unwrap_or(0)
    }
}

/// Where the ONNX Runtime library is: `ORT_DYLIB_PATH`, then
/// `inference.runtime_library`, then the cache that
/// `scripts/fetch-onnxruntime.sh` fills.
pub fn find_runtime_library(settings: &InferenceSettings) -> Result<PathBuf, InferenceError> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        candidates.push(PathBuf::from(p));
    } else if let Some(p) = &settings.runtime_library {
        candidates.push(p.clone());
    } else {
        candidates.push(default_cache_dir().join("onnxruntime-1.31.1/libonnxruntime.so.1.31.1"));
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| InferenceError::RuntimeMissing {
            looked_at: candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// `$MODSTREAM_CACHE_DIR`, else `$XDG_CACHE_HOME/modstream`, else `~/.cache/modstream`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MODSTREAM_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("modstream");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/modstream")
}

/// Load ONNX Runtime once per process.
fn environment(
    settings: &InferenceSettings,
) -> Result<&'static ort::environment::Environment, InferenceError> {
    static ENV: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();
    let path = find_runtime_library(settings)?;
    let env = ENV.get_or_init(|| {
        ort::init_from(&path)
            .map_err(|e| e.to_string())?
            .with_name("modstream")
            .build()
            .map_err(|e| e.to_string())
    });
    env.as_ref().map_err(|message| InferenceError::RuntimeLoad {
        path,
        message: message.clone(),
    })
}

/// One loaded model: a session plus its manifest.
pub struct Model {
    session: Session,
    pub manifest: Manifest,
}

impl Model {
    pub fn load(settings: &InferenceSettings) -> Result<Model, InferenceError> {
        let manifest = Manifest::load(&settings.model_dir)?;
        let env = environment(settings)?;
        let path = settings.model_dir.join("model.onnx");
        let load = |source| InferenceError::ModelLoad {
            path: path.clone(),
            source,
        };
        let session = Session::builder(env)
            .map_err(load)?
            .with_execution_providers(execution_providers(&settings.execution_providers))
            .map_err(|e| load(e.into()))?
            .with_intra_threads(settings.intra_threads)
            .map_err(|e| load(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| load(e.into()))?
            .commit_from_file(&path)
            .map_err(load)?;
        let model = Model { session, manifest };
        model.check_signature()?;
        Ok(model)
    }

    fn check_signature(&self) -> Result<(), InferenceError> {
        let m = &self.manifest;
        let inputs: Vec<&str> = self.session.inputs().iter().map(|i| i.name()).collect();
        if inputs != m.inputs.iter().map(String::as_str).collect::<Vec<_>>() {
            return Err(InferenceError::Mismatch(format!(
                "inputs are {inputs:?}, manifest says {:?}",
                m.inputs
            )));
        }
        if !self.session.outputs().iter().any(|o| o.name() == m.output) {
            return Err(InferenceError::Mismatch(format!(
                "no output named {:?}",
                m.output
            )));
        }
        Ok(())
    }

    /// Names and types of the model's inputs and outputs, for `check-model`.
    pub fn describe(&self) -> Vec<String> {
        let inputs = self
            .session
            .inputs()
            .iter()
            .map(|i| format!("input  {}: {}", i.name(), i.dtype()));
        let outputs = self
            .session
            .outputs()
            .iter()
            .map(|o| format!("output {}: {}", o.name(), o.dtype()));
        inputs.chain(outputs).collect()
    }

    /// Score texts in one forward pass: one probability per label per text.
    pub fn score(&mut self, texts: &mut [String]) -> Result<Vec<Vec<f32>>, InferenceError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        // ONNX Runtime takes C strings: an interior NUL would fail tensor
        // creation, so it becomes a space (the tokenizer splits there anyway).
        for t in texts.iter_mut().filter(|t| t.contains('\0')) {
            *t = t.replace('\0', " ");
        }
        let input = Tensor::from_string_array(([texts.len(), 1usize], &*texts))?;
        let outputs = self
            .session
            .run(ort::inputs![self.manifest.inputs[0].as_str() => input])?;
        let (shape, data) = outputs[self.manifest.output.as_str()].try_extract_tensor::<f32>()?;
        let labels = self.manifest.labels.len();
        if shape.len() != 2 || shape[0] as usize != texts.len() || shape[1] as usize != labels {
            return Err(InferenceError::Mismatch(format!(
                "output shape {shape:?}, expected [{}, {labels}]",
                texts.len()
            )));
        }
        Ok(data.chunks(labels).map(<[f32]>::to_vec).collect())
    }

    /// Score a batch; if the run fails, retry it once (the failure may be
    /// transient), then score each text alone so that one bad input fails
    /// only itself.
    pub fn score_isolating(&mut self, texts: &mut [String]) -> Vec<Result<Vec<f32>, String>> {
        match self.score(texts).or_else(|_| self.score(texts)) {
            Ok(scores) => scores.into_iter().map(Ok).collect(),
            Err(e) if texts.len() == 1 => vec![Err(e.to_string())],
            Err(e) => {
                tracing::warn!(batch = texts.len(), error = %e, "batch run failed; scoring events one by one");
                texts
                    .chunks_mut(1)
                    .map(|one| match self.score(one) {
                        Ok(mut s) => s.pop().ok_or_else(|| "no score returned".to_string()),
                        Err(e) => Err(e.to_string()),
                    })
                    .collect()
            }
        }
    }
}

fn execution_providers(names: &[String]) -> Vec<ort::ep::ExecutionProviderDispatch> {
    names
        .iter()
        .map(|name| match name.as_str() {
            "cuda" => ort::ep::CUDA::default().build(),
            "tensorrt" => ort::ep::TensorRT::default().build(),
            _ => ort::ep::CPU::default().build(),
        })
        .collect()
}

/// A batch of texts to score; `id` lets the pipeline find its events again.
#[derive(Debug)]
pub struct InferenceJob {
    pub id: u64,
    pub texts: Vec<String>,
}

#[derive(Debug)]
pub struct InferenceResult {
    pub id: u64,
    /// One entry per text, in job order.
    pub scores: Vec<Result<Vec<f32>, String>>,
    pub elapsed: Duration,
}

/// The worker threads. Dropping the job sender stops them.
pub struct InferencePool {
    jobs: async_channel::Sender<InferenceJob>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub manifest: Manifest,
}

impl InferencePool {
    /// Load one session per worker and start the threads. Fails (before any
    /// event is consumed) if the runtime or the model cannot be loaded.
    pub fn start(
        settings: &InferenceSettings,
        results: tokio::sync::mpsc::Sender<InferenceResult>,
    ) -> Result<InferencePool, InferenceError> {
        let (jobs_tx, jobs_rx) = async_channel::bounded::<InferenceJob>(settings.workers * 2);
        let mut threads = Vec::new();
        let mut manifest = None;
        for worker in 0..settings.workers {
            let mut model = Model::load(settings)?;
            manifest.get_or_insert_with(|| model.manifest.clone());
            let jobs = jobs_rx.clone();
            let results = results.clone();
            let handle = std::thread::Builder::new()
                .name(format!("inference-{worker}"))
                .spawn(move || {
                    while let Ok(mut job) = jobs.recv_blocking() {
                        let started = Instant::now();
                        let scores = model.score_isolating(&mut job.texts);
                        let result = InferenceResult {
                            id: job.id,
                            scores,
                            elapsed: started.elapsed(),
                        };
                        if results.blocking_send(result).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| {
                    InferenceError::Mismatch(format!("cannot start worker thread: {e}"))
                })?;
            threads.push(handle);
        }
        Ok(InferencePool {
            jobs: jobs_tx,
            threads,
            manifest: manifest.ok_or(InferenceError::WorkerGone)?,
        })
    }

    /// Queue a job without waiting; gives it back when the queue is full.
    pub fn try_submit(&self, job: InferenceJob) -> Result<(), InferenceJob> {
        self.jobs.try_send(job).map_err(|e| e.into_inner())
    }

    /// Stop taking jobs and wait for the workers to finish the queued ones.
    pub fn shutdown(self) {
        self.jobs.close();
        for t in self.threads {
            let _ = t.join();
        }
    }
}
