//! One loaded model: its session, how it is fed (strings, or tokens split
//! by length), warm-up, and scoring that isolates a bad input.

use std::time::{Duration, Instant};

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::Tensor;

use super::placement::{self, Placement};
use super::runtime::{environment, register_providers};
use super::{InferenceError, ScoreError, Scores};
use crate::config::{GraphOptimization, InferenceSettings, PadTo, RunLimit};
use crate::inference::manifest::{InputKind, Manifest, TOKEN_INPUTS};
use crate::inference::tokens::{self, Encoded, Encoder, Split};

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

/// Real and padded token counts (token models), for padding efficiency;
/// and the texts that were not truncated, their bytes and tokens, from which
/// the hub learns to predict a post's tokens ([`tokens::TokenEstimate`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TokenStats {
    pub real: u64,
    pub padded: u64,
    pub whole_texts: u64,
    pub whole_bytes: u64,
    pub whole_tokens: u64,
}

impl TokenStats {
    /// What was counted after `before`.
    pub fn since(self, before: TokenStats) -> TokenStats {
        TokenStats {
            real: self.real.saturating_sub(before.real),
            padded: self.padded.saturating_sub(before.padded),
            whole_texts: self.whole_texts.saturating_sub(before.whole_texts),
            whole_bytes: self.whole_bytes.saturating_sub(before.whole_bytes),
            whole_tokens: self.whole_tokens.saturating_sub(before.whole_tokens),
        }
    }
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
    /// The session is profiled until [`Model::placement`] reads where its
    /// nodes ran (GPU sessions, and `check-model`).
    profiled: bool,
    /// Node runs of its warm-up on another provider than the session's
    /// (the CPU beside a GPU provider).
    pub off_provider_nodes: usize,
}

/// A graph's inputs and outputs: (name, type) each.
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    pub inputs: Vec<(String, String)>,
    pub outputs: Vec<(String, String)>,
}

/// Whether a session is profiled for its nodes' placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// When a GPU provider runs it (nodes may fall back to the CPU).
    OnGpu,
    /// Always (`check-model` prints the placement).
    Always,
}

impl Model {
    pub fn load(settings: &InferenceSettings) -> Result<Model, InferenceError> {
        Model::load_profiled(settings, Profile::OnGpu)
    }

    /// [`Model::load`], profiled as `profile` says for [`Model::placement`].
    pub fn load_profiled(
        settings: &InferenceSettings,
        profile: Profile,
    ) -> Result<Model, InferenceError> {
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
        let provider = register_providers(&mut builder, settings, manifest.input_kind)?;
        let profiled = profile == Profile::Always || provider != placement::CPU;
        if profiled {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let prefix = std::env::temp_dir()
                .join(format!("modstream-placement-{}-{n}", std::process::id()));
            builder = builder.with_profiling(prefix).map_err(|e| load(e.into()))?;
        }
        let options = &settings.session;
        let level = match options.graph_optimization {
            GraphOptimization::Disabled => GraphOptimizationLevel::Disable,
            GraphOptimization::Basic => GraphOptimizationLevel::Level1,
            GraphOptimization::Extended => GraphOptimizationLevel::Level2,
            GraphOptimization::All => GraphOptimizationLevel::All,
        };
        let session = builder
            .with_intra_threads(settings.intra_threads)
            .map_err(|e| load(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| load(e.into()))?
            .with_optimization_level(level)
            .map_err(|e| load(e.into()))?
            .with_intra_op_spinning(options.spinning)
            .map_err(|e| load(e.into()))?
            .commit_from_file(&path)
            .map_err(load)?;
        let model = Model {
            session,
            input,
            manifest,
            provider,
            tokens: TokenStats::default(),
            profiled,
            off_provider_nodes: 0,
        };
        model.check_signature()?;
        Ok(model)
    }

    /// Where the session's nodes ran (after a run of its own if none ran
    /// yet), once; None for a session not profiled (a CPU one).
    pub fn placement(&mut self) -> Option<Result<Placement, InferenceError>> {
        if !std::mem::take(&mut self.profiled) {
            return None;
        }
        let run = self.score(&mut ["where do the nodes run".to_string()]);
        let file = self.session.end_profiling().map_err(InferenceError::from);
        Some(run.and(file).and_then(|path| {
            Placement::take_file(&path).map_err(|e| InferenceError::Mismatch(e.to_string()))
        }))
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

    /// The inputs and outputs of `model_dir/model.onnx` (name, type), read
    /// by ONNX Runtime without a manifest (`init-model` writes one from it).
    pub fn signature(settings: &InferenceSettings) -> Result<Signature, InferenceError> {
        let env = environment(settings)?;
        let path = settings.model_dir.join("model.onnx");
        let load = |source| InferenceError::ModelLoad {
            path: path.clone(),
            source,
        };
        let session = Session::builder(env)
            .map_err(load)?
            .commit_from_file(&path)
            .map_err(load)?;
        Ok(Signature {
            inputs: (session.inputs().iter())
                .map(|i| (i.name().to_string(), i.dtype().to_string()))
                .collect(),
            outputs: (session.outputs().iter())
                .map(|o| (o.name().to_string(), o.dtype().to_string()))
                .collect(),
        })
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
                let max_length = encoder.max_length;
                let passes = tokens::plan(&lengths, split, max_length);
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
                for (text, &len) in texts.iter().zip(&lengths) {
                    if len < max_length {
                        self.tokens.whole_texts += 1;
                        self.tokens.whole_bytes += text.len() as u64;
                        self.tokens.whole_tokens += len as u64;
                    }
                }
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

    /// Run every shape the model will see once (batch of 1 and of the
    /// largest run `limit` allows; for token models at each bucket length),
    /// so that the first real batch does not pay for allocations and kernel
    /// selection.
    pub fn warm_up(&mut self, limit: RunLimit) -> Result<Duration, InferenceError> {
        let started = Instant::now();
        let sizes = [1, limit.posts.max(1)];
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
            for n in [1, limit.rows_at(len)] {
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
    pub fn score_isolating(&mut self, texts: &mut [String]) -> Vec<Scores> {
        match self.score(texts).or_else(|_| self.score(texts)) {
            Ok(scores) => scores.into_iter().map(finite).collect(),
            Err(e) if texts.len() == 1 => vec![Err(ScoreError::Run(e.to_string()))],
            Err(e) => {
                tracing::warn!(batch = texts.len(), error = %e, "batch run failed; scoring events one by one");
                texts
                    .chunks_mut(1)
                    .map(|one| match self.score(one) {
                        Ok(mut s) => s.pop().ok_or(ScoreError::Missing).and_then(finite),
                        Err(e) => Err(ScoreError::Run(e.to_string())),
                    })
                    .collect()
            }
        }
    }
}

/// Run `score` on `texts`; a panic inside (tokenizer, ONNX Runtime) comes
/// back as its message instead of killing the worker thread, whose job
/// would then never be answered.
pub(super) fn catching_panics(
    texts: &mut [String],
    score: impl FnOnce(&mut [String]) -> Vec<Scores>,
) -> Result<Vec<Scores>, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| score(texts))).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string())
    })
}

/// Scores that can make a verdict: all finite.
fn finite(scores: Vec<f32>) -> Scores {
    if scores.iter().all(|s| s.is_finite()) {
        Ok(scores)
    } else {
        Err(ScoreError::NotFinite(scores))
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

    #[test]
    fn a_token_budget_bounds_the_warm_up_runs_rows_at_each_length() {
        let limit = super::RunLimit {
            posts: 256,
            tokens: Some(1024),
        };
        assert_eq!(limit.rows_at(8), 128);
        assert_eq!(limit.rows_at(512), 2);
        assert_eq!(
            limit.rows_at(4096),
            1,
            "one post over the budget goes alone"
        );
        assert_eq!(super::RunLimit::posts(256).rows_at(512), 256);
    }
}
