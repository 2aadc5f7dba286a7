//! A model's manifest (`manifest.json` beside `model.onnx`, with an
//! optional Hugging Face `config.json`): its name, version, inputs, output,
//! labels and activation. Read by the inference stage to feed the model and
//! by the verdict stage to name the labels.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::inference::tokens::Activation;

/// A manifest that cannot be read or does not describe a usable model.
#[derive(Debug, thiserror::Error)]
#[error("cannot read model manifest {path}: {message}")]
pub struct ManifestError {
    pub path: PathBuf,
    pub message: String,
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
    /// A quantized model: how, and how far its scores are from the
    /// reference it was quantized from (as its build measured them).
    #[serde(default)]
    pub quantization: Option<Quantization>,
    /// What the load took from elsewhere than manifest.json (config.json's
    /// labels, activation, max length), said once by who loads it.
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// What a manifest error says beside the problem: where its keys are.
const KEYS_HINT: &str = "manifest.json keys: docs/own-model.md; `modstream init-model DIR` writes one from the model and its config.json";

/// What a quantized model's manifest records of its build.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Quantization {
    pub method: String,
    pub reference: String,
    pub held_out_posts: usize,
    /// Share of the held-out posts whose verdict at 0.5 agrees with the reference.
    pub verdict_agreement: f64,
    /// Largest difference of a probability from the reference's.
    pub max_probability_difference: f64,
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

/// config.json's `id2label` in label order, or what is wrong with it.
fn labels_of(hf: Option<&HfConfig>) -> Result<Vec<String>, String> {
    let id2label = hf.map(|h| &h.id2label).filter(|l| !l.is_empty());
    let Some(id2label) = id2label else {
        return Err("no labels (set \"labels\" or ship config.json with id2label)".into());
    };
    let mut pairs: Vec<(usize, &String)> = id2label
        .iter()
        .map(|(k, v)| k.parse().map(|i| (i, v)))
        .collect::<Result<_, _>>()
        .map_err(|_| "config.json id2label keys must be integers".to_string())?;
    pairs.sort();
    if pairs.iter().enumerate().any(|(n, (i, _))| n != *i) {
        return Err("config.json id2label must number labels 0..n".into());
    }
    Ok(pairs.into_iter().map(|(_, l)| l.clone()).collect())
}

impl Manifest {
    pub fn load(model_dir: &Path) -> Result<Manifest, ManifestError> {
        let path = model_dir.join("manifest.json");
        let err = |message: String| ManifestError {
            path: path.clone(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| err(format!("{e} ({KEYS_HINT})")))?;
        let mut m: Manifest =
            serde_json::from_str(&text).map_err(|e| err(format!("{e} ({KEYS_HINT})")))?;
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
                    if let Some(l) = m.max_length {
                        m.notes.push(format!("max_length {l}: config.json's max_position_embeddings, manifest.json has none (posts are cut there, and warm-up runs every length bucket up to it: set max_length, e.g. 128, for short posts)"));
                    }
                }
                if m.max_length.is_none_or(|l| l == 0) {
                    return Err(err("token model needs max_length > 0".into()));
                }
            }
        }
        if m.labels.is_empty() {
            m.labels = labels_of(hf.as_ref()).map_err(err)?;
            m.notes
                .push(format!("labels {:?}: config.json's id2label", m.labels));
        }
        m.activation = match m.declared_activation {
            Some(activation) => activation,
            None if m.input_kind == InputKind::Tokens => {
                let problem = hf.as_ref().and_then(|h| h.problem_type.as_deref());
                let activation = Activation::from_problem_type(problem);
                let from = problem.map_or("no problem_type in config.json".into(), |p| {
                    format!("config.json's problem_type is {p:?}")
                });
                m.notes.push(format!("activation {activation:?}: {from}"));
                activation
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
