//! Model loading and the inference workers.
//!
//! Guarantee: model runs never happen on the async runtime. Each worker is a
//! dedicated OS thread that owns its own ONNX Runtime `Session` and takes jobs
//! from a bounded channel; every job gets exactly one result back, success or
//! error, so the pipeline can account for every event it sent.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ort::session::Session;
use ort::value::Tensor;
use serde::Deserialize;

use crate::config::{ExecutionProvider, InferenceSettings, PadTo};
use crate::tokens::{self, Activation, Encoded, Encoder, Split, TokenError};

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

/// `manifest.json` beside `model.onnx`.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub version: String,
    pub input_kind: InputKind,
    pub inputs: Vec<String>,
    pub output: String,
    /// Output columns; for token models may come from `config.json` `id2label`.
    #[serde(default)]
    pub labels: Vec<String>,
    /// The label whose probability drives allow / review / block when the
    /// policy has no per-label thresholds.
    pub score_label: String,
    /// "none" (the output is already probabilities), "softmax" or "sigmoid".
    /// Default: "none" for text models; for token models from `config.json`
    /// `problem_type` (multi_label_classification: sigmoid, else softmax).
    #[serde(default, rename = "activation")]
    declared_activation: Option<Activation>,
    #[serde(skip)]
    pub activation: Activation,
    /// Token models: the `tokenizer.json` file, relative to the model directory.
    #[serde(default)]
    pub tokenizer: Option<String>,
    /// Token models: longer texts are truncated to this many tokens.
    #[serde(default)]
    pub max_length: Option<usize>,
}

/// What a model is fed (manifest `input_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputKind {
    /// One string tensor per event (the model tokenizes itself).
    Text,
    /// A transformer fed `input_ids`, `attention_mask` (and
    /// `token_type_ids` when the graph has it) from `tokenizer`.
    Tokens,
}

/// The part of a Hugging Face `config.json` that modstream reads.
#[derive(Debug, Deserialize)]
struct HfConfig {
    #[serde(default)]
    id2label: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    problem_type: Option<String>,
    #[serde(default)]
    max_position_embeddings: Option<usize>,
}

pub const TOKEN_INPUTS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];

impl Manifest {
    pub fn load(model_dir: &Path) -> Result<Manifest, InferenceError> {
        let path = model_dir.join("manifest.json");
        let err = |message: String| InferenceError::Manifest {
            path: path.clone(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
        let mut m: Manifest = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        let hf_path = model_dir.join("config.json");
        let hf: Option<HfConfig> = match std::fs::read_to_string(&hf_path) {
            Ok(t) => Some(
                serde_json::from_str(&t).map_err(|e| err(format!("{}: {e}", hf_path.display())))?,
            ),
            Err(_) => None,
        };
        match m.input_kind {
            InputKind::Text if m.inputs.len() == 1 => {}
            InputKind::Text => {
                return Err(err("input_kind \"text\" takes exactly one input".into()));
            }
            InputKind::Tokens => {
                for input in &m.inputs {
                    if !TOKEN_INPUTS.contains(&input.as_str()) {
                        return Err(err(format!(
                            "token model input {input:?} is not one of {TOKEN_INPUTS:?}"
                        )));
                    }
                }
                if !m.inputs.iter().any(|i| i == "input_ids") {
                    return Err(err("token model needs an input_ids input".into()));
                }
                m.tokenizer
                    .get_or_insert_with(|| "tokenizer.json".to_string());
                if m.max_length.is_none() {
                    m.max_length = hf.as_ref().and_then(|h| h.max_position_embeddings);
                }
                if m.max_length.is_none_or(|l| l == 0) {
                    return Err(err("token model needs max_length > 0".into()));
                }
            }
        }
        if m.labels.is_empty() {
            let id2label = hf.as_ref().map(|h| &h.id2label).filter(|l| !l.is_empty());
            let Some(id2label) = id2label else {
                return Err(err(
                    "no labels (set \"labels\" or ship config.json with id2label)".into(),
                ));
            };
            let mut pairs: Vec<(usize, &String)> = id2label
                .iter()
                .map(|(k, v)| k.parse().map(|i| (i, v)))
                .collect::<Result<_, _>>()
                .map_err(|_| err("config.json id2label keys must be integers".into()))?;
            pairs.sort();
            if pairs.iter().enumerate().any(|(n, (i, _))| n != *i) {
                return Err(err("config.json id2label must number labels 0..n".into()));
            }
            m.labels = pairs.into_iter().map(|(_, l)| l.clone()).collect();
        }
        m.activation = match m.declared_activation {
            Some(activation) => activation,
            None if m.input_kind == InputKind::Tokens => {
                Activation::from_problem_type(hf.as_ref().and_then(|h| h.problem_type.as_deref()))
            }
            None => Activation::None,
        };
        if !m.labels.contains(&m.score_label) {
            return Err(err(format!(
                "score_label {:?} is not among labels {:?}",
                m.score_label, m.labels
            )));
        }
        Ok(m)
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

/// How a model takes its input.
enum Input {
    /// One string per text; the graph tokenizes.
    Text,
    /// A transformer: tokenized here, each batch split by length, padded.
    Tokens {
        encoder: Box<Encoder>,
        split: Split,
        /// Token lengths warmed up at start.
        warm_lengths: Vec<usize>,
    },
}

/// Real and padded token counts (token models), for padding efficiency.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TokenStats {
    pub real: u64,
    pub padded: u64,
}

/// One loaded model: a session, its manifest and how it is fed.
pub struct Model {
    session: Session,
    input: Input,
    pub manifest: Manifest,
    /// The execution provider that runs this session (first registered).
    pub provider: &'static str,
    /// Tokens fed since load, real and padded (zero for text models).
    pub tokens: TokenStats,
}

impl Model {
    pub fn load(settings: &InferenceSettings) -> Result<Model, InferenceError> {
        let manifest = Manifest::load(&settings.model_dir)?;
        let input = match manifest.input_kind {
            InputKind::Tokens => {
                let file = manifest.tokenizer.as_deref().unwrap_or("tokenizer.json");
                let max_length = manifest.max_length.unwrap_or(512);
                Input::Tokens {
                    encoder: Box::new(Encoder::load(&settings.model_dir.join(file), max_length)?),
                    split: match settings.pad_to {
                        PadTo::Bucket => Split::Buckets(settings.length_buckets.clone()),
                        PadTo::Longest => Split::Longest {
                            pass_overhead: settings.pass_overhead_tokens,
                        },
                    },
                    warm_lengths: settings.length_buckets.clone(),
                }
            }
            InputKind::Text => Input::Text,
        };
        let env = environment(settings)?;
        let path = settings.model_dir.join("model.onnx");
        let load = |source| InferenceError::ModelLoad {
            path: path.clone(),
            source,
        };
        let mut builder = Session::builder(env).map_err(load)?;
        let provider = register_providers(&mut builder, settings)?;
        let session = builder
            .with_intra_threads(settings.intra_threads)
            .map_err(|e| load(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| load(e.into()))?
            .commit_from_file(&path)
            .map_err(load)?;
        let model = Model {
            session,
            input,
            manifest,
            provider,
            tokens: TokenStats::default(),
        };
        model.check_signature()?;
        Ok(model)
    }

    fn check_signature(&self) -> Result<(), InferenceError> {
        let m = &self.manifest;
        let mut inputs: Vec<&str> = self.session.inputs().iter().map(|i| i.name()).collect();
        let mut expected: Vec<&str> = m.inputs.iter().map(String::as_str).collect();
        inputs.sort();
        expected.sort();
        if inputs != expected {
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

    /// Score texts: one probability per label per text, in input order.
    /// Text models run one forward pass; token models one per length bucket.
    pub fn score(&mut self, texts: &mut [String]) -> Result<Vec<Vec<f32>>, InferenceError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        match &self.input {
            Input::Text => self.score_text(texts),
            Input::Tokens { encoder, split, .. } => {
                let encoded = texts
                    .iter()
                    .map(|t| encoder.encode(t))
                    .collect::<Result<Vec<_>, _>>()?;
                let lengths: Vec<usize> = encoded.iter().map(|e| e.ids.len()).collect();
                let passes = tokens::plan(&lengths, split, encoder.max_length);
                let mut scores = vec![Vec::new(); texts.len()];
                for pass in &passes {
                    let rows = self.run_tokens(&encoded, pass)?;
                    for (&i, row) in pass.members.iter().zip(rows) {
                        scores[i] = row;
                    }
                }
                let (real, padded) = tokens::token_counts(&lengths, &passes);
                self.tokens.real += real;
                self.tokens.padded += padded;
                Ok(scores)
            }
        }
    }

    fn score_text(&mut self, texts: &mut [String]) -> Result<Vec<Vec<f32>>, InferenceError> {
        // ONNX Runtime takes C strings: an interior NUL would fail tensor
        // creation, so it becomes a space (the tokenizer splits there anyway).
        for t in texts.iter_mut().filter(|t| t.contains('\0')) {
            *t = t.replace('\0', " ");
        }
        let input = Tensor::from_string_array(([texts.len(), 1usize], &*texts))?;
        let outputs = self
            .session
            .run(ort::inputs![self.manifest.inputs[0].as_str() => input])?;
        probabilities(&self.manifest, &outputs, texts.len())
    }

    /// One forward pass of a token model over the pass's texts.
    fn run_tokens(
        &mut self,
        encoded: &[Encoded],
        pass: &tokens::Pass,
    ) -> Result<Vec<Vec<f32>>, InferenceError> {
        let [ids, mask, types] = tokens::tensors(encoded, pass);
        let mut inputs = Vec::with_capacity(3);
        for (name, array) in TOKEN_INPUTS.into_iter().zip([ids, mask, types]) {
            if self.manifest.inputs.iter().any(|i| i == name) {
                inputs.push((name, Tensor::from_array(array)?));
            }
        }
        let outputs = self.session.run(inputs)?;
        probabilities(&self.manifest, &outputs, pass.members.len())
    }

    /// Run every shape the model will see once (batch of 1 and of
    /// `max_batch`; for token models at each bucket length), so that the
    /// first real batch does not pay for allocations and kernel selection.
    pub fn warm_up(&mut self, max_batch: usize) -> Result<Duration, InferenceError> {
        let started = Instant::now();
        let sizes = [1, max_batch.max(1)];
        let lengths = match &self.input {
            Input::Text => Vec::new(),
            Input::Tokens {
                encoder,
                warm_lengths,
                ..
            } => {
                let mut l: Vec<usize> = warm_lengths
                    .iter()
                    .copied()
                    .filter(|&b| b < encoder.max_length)
                    .collect();
                l.push(encoder.max_length);
                l
            }
        };
        if lengths.is_empty() {
            for n in sizes {
                self.score_text(&mut vec!["warm up".to_string(); n])?;
            }
        }
        for len in lengths {
            for n in sizes {
                let one = Encoded {
                    ids: vec![100; len],
                    type_ids: vec![0; len],
                };
                let pass = tokens::Pass {
                    members: vec![0; n],
                    padded_len: len,
                };
                self.run_tokens(std::slice::from_ref(&one), &pass)?;
            }
        }
        Ok(started.elapsed())
    }

    /// Score a batch; if the run fails, retry it once (the failure may be
    /// transient), then score each text alone so that one bad input fails
    /// only itself. A row with a NaN or infinite score is a failure of its
    /// event, never a verdict.
    pub fn score_isolating(&mut self, texts: &mut [String]) -> Vec<Result<Vec<f32>, String>> {
        match self.score(texts).or_else(|_| self.score(texts)) {
            Ok(scores) => scores.into_iter().map(finite).collect(),
            Err(e) if texts.len() == 1 => vec![Err(e.to_string())],
            Err(e) => {
                tracing::warn!(batch = texts.len(), error = %e, "batch run failed; scoring events one by one");
                texts
                    .chunks_mut(1)
                    .map(|one| match self.score(one) {
                        Ok(mut s) => s
                            .pop()
                            .ok_or_else(|| "no score returned".to_string())
                            .and_then(finite),
                        Err(e) => Err(e.to_string()),
                    })
                    .collect()
            }
        }
    }
}

/// Run `score` on `texts`; a panic inside (tokenizer, ONNX Runtime) comes
/// back as its message instead of killing the worker thread, whose job
/// would then never be answered.
fn catching_panics(
    texts: &mut [String],
    score: impl FnOnce(&mut [String]) -> Vec<Result<Vec<f32>, String>>,
) -> Result<Vec<Result<Vec<f32>, String>>, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| score(texts))).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string())
    })
}

/// Scores that can make a verdict: all finite.
fn finite(scores: Vec<f32>) -> Result<Vec<f32>, String> {
    if scores.iter().all(|s| s.is_finite()) {
        Ok(scores)
    } else {
        Err(format!("the model returned a non-finite score: {scores:?}"))
    }
}

/// The manifest's output as probabilities: [rows, labels], activation applied.
fn probabilities(
    manifest: &Manifest,
    outputs: &ort::session::SessionOutputs<'_>,
    rows: usize,
) -> Result<Vec<Vec<f32>>, InferenceError> {
    let (shape, data) = outputs[manifest.output.as_str()].try_extract_tensor::<f32>()?;
    let labels = manifest.labels.len();
    if shape.len() != 2 || shape[0] as usize != rows || shape[1] as usize != labels {
        return Err(InferenceError::Mismatch(format!(
            "output shape {shape:?}, expected [{rows}, {labels}]"
        )));
    }
    Ok(data
        .chunks(labels)
        .map(|row| manifest.activation.apply(row))
        .collect())
}

/// Register the configured execution providers in order; the first one that
/// registers runs the session (CPU takes whatever it cannot). A GPU provider
/// that cannot be used is an error with `require_gpu`, else a warning.
fn register_providers(
    builder: &mut ort::session::builder::SessionBuilder,
    settings: &InferenceSettings,
) -> Result<&'static str, InferenceError> {
    let mut chosen = None;
    let mut failures = Vec::new();
    for provider in &settings.execution_providers {
        let ep = match provider {
            ExecutionProvider::Cuda => ort::ep::CUDA::default()
                .with_device_id(settings.device_id)
                .build(),
            ExecutionProvider::Tensorrt => ort::ep::TensorRT::default()
                .with_device_id(settings.device_id)
                .with_fp16(settings.fp16)
                .build(),
            ExecutionProvider::Cpu => {
                chosen.get_or_insert("CPUExecutionProvider");
                break;
            }
        };
        match ep.register(builder) {
            Ok(()) => {
                chosen.get_or_insert(ep.name());
            }
            Err(e) => failures.push(format!("{}: {e}", provider.name())),
        }
    }
    let gpu = chosen.is_some_and(|c| c != "CPUExecutionProvider");
    if !failures.is_empty() && settings.require_gpu && !gpu {
        return Err(InferenceError::GpuUnavailable(failures.join("; ")));
    }
    if !failures.is_empty() {
        tracing::warn!(failed = %failures.join("; "), "execution provider unavailable; falling back");
    }
    let chosen = chosen.unwrap_or("CPUExecutionProvider");
    if settings.fp16 && chosen != "TensorrtExecutionProvider" {
        tracing::warn!(
            provider = chosen,
            "inference.fp16 applies to TensorRT only; this session runs the model's own precision"
        );
    }
    Ok(chosen)
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
    /// The job's texts, handed back (a batch whose run failed may be tried
    /// again).
    pub texts: Vec<String>,
    pub elapsed: Duration,
    /// Tokens this job fed the model, real and padded (token models).
    pub tokens: TokenStats,
    /// The model (and policy) that scored it when it is not the one the
    /// pipeline started with (a hot reload, see [`crate::reload`]).
    pub scorer: Option<Arc<crate::verdict::Scorer>>,
}

/// What a worker switches to before its next job: a new session (a new
/// model, loaded and warmed up beside the old one), its score cache, and the
/// scorer (model identity and policy) its results carry.
pub struct Swap {
    /// The new session and the settings it was loaded with (its resolved
    /// directory: a worker that must reload after a panic loads that one).
    pub model: Option<(Model, InferenceSettings)>,
    pub cache: Option<Arc<crate::score_cache::ScoreCache>>,
    pub scorer: Arc<crate::verdict::Scorer>,
}

/// The worker threads. Dropping the job sender stops them.
pub struct InferencePool {
    jobs: async_channel::Sender<InferenceJob>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// One per worker: what it switches to at its next job boundary.
    swaps: Vec<std::sync::mpsc::Sender<Swap>>,
    pub manifest: Manifest,
}

impl InferencePool {
    /// Load one session per worker and start the threads. Fails (before any
    /// event is consumed) if the runtime or the model cannot be loaded.
    /// `max_batch` is the largest job size (for the warm-up).
    pub fn start(
        settings: &InferenceSettings,
        max_batch: usize,
        results: tokio::sync::mpsc::Sender<InferenceResult>,
    ) -> Result<InferencePool, InferenceError> {
        let workers = settings.worker_count();
        let (jobs_tx, jobs_rx) = async_channel::bounded::<InferenceJob>(workers * 2);
        let cache = (settings.cache_bytes > 0)
            .then(|| Arc::new(crate::score_cache::ScoreCache::new(settings.cache_bytes)));
        let mut threads = Vec::new();
        let mut swaps = Vec::new();
        let mut manifest = None;
        for worker in 0..workers {
            let mut model = Model::load(settings)?;
            // The warm-up inputs are synthetic: a model may reject them and
            // still score real events, so a failure here is only a warning.
            let warm_up = match settings.warm_up.then(|| model.warm_up(max_batch)) {
                Some(Ok(took)) => Some(took),
                Some(Err(e)) => {
                    tracing::warn!(worker, error = %e, "warm-up run failed; the first batches pay for it");
                    None
                }
                None => None,
            };
            tracing::info!(
                worker,
                provider = model.provider,
                model = %model.manifest.name,
                warm_up = ?warm_up,
                "inference session ready"
            );
            manifest.get_or_insert_with(|| model.manifest.clone());
            let jobs = jobs_rx.clone();
            let results = results.clone();
            let mut settings = settings.clone();
            let mut cache = cache.clone();
            let (swap_tx, swap_rx) = std::sync::mpsc::channel::<Swap>();
            swaps.push(swap_tx);
            let mut scorer: Option<Arc<crate::verdict::Scorer>> = None;
            let handle = std::thread::Builder::new()
                .name(format!("inference-{worker}"))
                .spawn(move || {
                    while let Ok(mut job) = jobs.recv_blocking() {
                        // A reload takes effect here, between two jobs.
                        while let Ok(swap) = swap_rx.try_recv() {
                            if let Some((fresh, loaded_with)) = swap.model {
                                model = fresh;
                                settings = loaded_with;
                                cache = swap.cache;
                            }
                            scorer = Some(swap.scorer);
                        }
                        let started = Instant::now();
                        let before = model.tokens;
                        let scores = match catching_panics(&mut job.texts, |texts| match &cache {
                            Some(cache) => cache.score(texts, |misses| model.score_isolating(misses)),
                            None => model.score_isolating(texts),
                        }) {
                            Ok(scores) => scores,
                            Err(panic) => {
                                // The session may be left broken: load it again.
                                tracing::error!(worker, error = %panic, "inference panicked; loading the model again");
                                match Model::load(&settings) {
                                    Ok(fresh) => model = fresh,
                                    Err(e) => tracing::error!(worker, error = %e, "cannot load the model again; keeping the old session"),
                                }
                                let failure = format!("inference panicked: {panic}");
                                job.texts.iter().map(|_| Err(failure.clone())).collect()
                            }
                        };
                        let result = InferenceResult {
                            id: job.id,
                            scores,
                            texts: job.texts,
                            elapsed: started.elapsed(),
                            tokens: TokenStats {
                                real: model.tokens.real.saturating_sub(before.real),
                                padded: model.tokens.padded.saturating_sub(before.padded),
                            },
                            scorer: scorer.clone(),
                        };
                        if results.blocking_send(result).is_err() {
                            break;
                        }
                    }
                })
                .map_err(InferenceError::Thread)?;
            threads.push(handle);
        }
        Ok(InferencePool {
            jobs: jobs_tx,
            threads,
            swaps,
            manifest: manifest.ok_or(InferenceError::WorkerGone)?,
        })
    }

    /// Senders of each worker's switches (for [`crate::reload`]).
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_panic_while_scoring_becomes_a_failure_not_a_dead_worker() {
        let mut texts = vec!["a".to_string()];
        let got = super::catching_panics(&mut texts, |_| panic!("tokenizer blew up"));
        assert_eq!(got, Err("tokenizer blew up".to_string()));
        let got = super::catching_panics(&mut texts, |t| vec![Ok(vec![t.len() as f32])]);
        assert_eq!(got, Ok(vec![Ok(vec![1.0])]));
    }

    #[test]
    fn a_non_finite_score_is_a_failure_not_a_verdict() {
        assert_eq!(super::finite(vec![0.1, 0.9]), Ok(vec![0.1, 0.9]));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert!(super::finite(vec![0.5, bad]).is_err(), "{bad}");
        }
    }
}
