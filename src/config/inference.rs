//! `[inference]`: the model (or models), its ONNX Runtime sessions and
//! workers, how token batches are padded, the breaker, the score cache,
//! hot reload and the shadow model.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ExecutionProvider, ModelSettings, PadTo, SessionOptions, Workers};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InferenceSettings {
    pub model_dir: PathBuf,
    /// Inference sessions, each on its own thread: "auto" (the default) or a
    /// number. See [`InferenceSettings::worker_count`].
    pub workers: Workers,
    pub intra_threads: usize,
    /// Path of libonnxruntime.so; `ORT_DYLIB_PATH` wins over it.
    pub runtime_library: Option<PathBuf>,
    /// Execution providers in order of preference: "cuda", "tensorrt", "cpu".
    pub execution_providers: Vec<ExecutionProvider>,
    /// GPU for the cuda / tensorrt providers.
    pub device_id: i32,
    /// Half precision where the provider supports it (TensorRT).
    pub fp16: bool,
    /// Fail at start when no GPU provider can be registered, instead of
    /// falling back to CPU with a warning.
    pub require_gpu: bool,
    /// Token models: how a batch is split by token length into forward
    /// passes so that short posts are not padded to a long one.
    /// "longest": sorted by length, cut where padding costs more than
    /// `pass_overhead_tokens` per extra pass, each pass padded to its
    /// longest text. "bucket": one pass per `length_buckets` bucket, padded
    /// to the bucket bound (fixed shapes, e.g. for TensorRT).
    pub pad_to: PadTo,
    /// Token models, pad_to = "longest": a pass's fixed cost in tokens.
    pub pass_overhead_tokens: usize,
    /// Token models: bucket bounds for pad_to = "bucket" (lengths above the
    /// last go to the model's max_length); also the lengths warmed up.
    pub length_buckets: Vec<usize>,
    /// Run each padded shape once at start so that the first real batch does
    /// not pay for allocations and kernel selection.
    pub warm_up: bool,
    /// The circuit breaker: after this many model runs in a row in which
    /// every event failed, the model is taken as broken: events wait instead
    /// of going to the DLQ, consumption pauses, /readyz fails, and a probe
    /// retries the model with backoff (1 s doubling to 30 s) until it works.
    /// 0: never.
    pub breaker_after: u32,
    /// Bytes of the score cache (texts seen again are scored once per
    /// loaded model); 0 turns it off.
    pub cache_bytes: u64,
    /// How often `modstream run` looks for a new model in `model_dir` (a
    /// changed manifest or model file, or a symlink swapped to another
    /// version directory) and loads it without stopping; SIGHUP looks at
    /// once and also re-reads `policy`. 0: only on SIGHUP.
    #[serde(with = "humantime_serde")]
    pub reload_interval: Duration,
    pub shadow: ShadowSettings,
    pub session: SessionOptions,
    /// Several models, each scoring the events its policy rules name (see [`ModelSettings`]).
    pub models: Vec<ModelSettings>,
}

impl Default for InferenceSettings {
    fn default() -> Self {
        InferenceSettings {
            model_dir: PathBuf::from("models/profanity-check"),
            workers: Workers::Auto,
            intra_threads: 1,
            runtime_library: None,
            execution_providers: vec![ExecutionProvider::Cpu],
            device_id: 0,
            fp16: false,
            require_gpu: false,
            pad_to: PadTo::Longest,
            pass_overhead_tokens: 24,
            length_buckets: vec![16, 32, 64, 128],
            warm_up: true,
            breaker_after: 5,
            cache_bytes: 0,
            reload_interval: Duration::from_secs(5),
            shadow: ShadowSettings::default(),
            session: SessionOptions::default(),
            models: Vec::new(),
        }
    }
}

/// A candidate model scoring a sample of the live events on spare capacity
/// (see [`crate::hub::stages::outputs::shadow`]).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShadowSettings {
    /// Its directory; unset: no shadow.
    pub model_dir: Option<PathBuf>,
    /// Share of the events it scores, 0 to 1 (by a hash of the event id).
    pub share: f64,
}

impl Default for ShadowSettings {
    fn default() -> Self {
        ShadowSettings {
            model_dir: None,
            share: 1.0,
        }
    }
}
