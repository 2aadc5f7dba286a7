//! `modstream init-model DIR`: a manifest.json for a model directory from
//! what is already there: the graph's inputs and outputs (ONNX Runtime
//! reads `model.onnx`), and a Hugging Face `config.json` (`id2label`,
//! `problem_type`, `max_position_embeddings`, `_name_or_path`). It says
//! every default it took, and writes the file unless one exists (`--force`)
//! or it is asked only to print it (`--print`).

use std::path::{Path, PathBuf};

use crate::config::InferenceSettings;
use crate::inference::manifest::TOKEN_INPUTS;
use crate::inference::{Model, Signature};

/// The options of `modstream init-model`.
#[derive(Debug, Clone, clap::Args)]
pub struct InitModelOptions {
    /// The model directory: model.onnx, and for a transformer its
    /// tokenizer.json and config.json.
    pub dir: PathBuf,
    /// The model's name (default: config.json's `_name_or_path`, else the
    /// directory's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Its version (default: 0.1.0).
    #[arg(long)]
    pub version: Option<String>,
    /// The label whose score decides (default: the first of the usual
    /// harm labels among the model's, else its last label).
    #[arg(long)]
    pub score_label: Option<String>,
    /// Token models: texts are cut to this many tokens (default: 128, or
    /// config.json's max_position_embeddings if smaller).
    #[arg(long)]
    pub max_length: Option<usize>,
    /// Print the manifest, write nothing.
    #[arg(long)]
    pub print: bool,
    /// Write over an existing manifest.json.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum InitModelError {
    #[error(transparent)]
    Model(#[from] crate::inference::InferenceError),
    #[error("{0}")]
    Cannot(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// Labels that mean "nothing wrong": the score that decides is another's.
const BENIGN: [&str; 12] = [
    "clean",
    "neutral",
    "none",
    "ok",
    "safe",
    "normal",
    "non_toxic",
    "not_toxic",
    "negative",
    "label_0",
    "benign",
    "non-toxic",
];

/// What `init-model` proposes: the manifest, and the defaults it took.
#[derive(Debug)]
pub struct Proposal {
    pub manifest: serde_json::Value,
    pub defaults: Vec<String>,
}

/// The manifest for `opts.dir`, printed with its defaults, and written.
pub fn run(opts: &InitModelOptions) -> Result<String, InitModelError> {
    let settings = InferenceSettings {
        model_dir: opts.dir.clone(),
        ..InferenceSettings::default()
    };
    let signature = Model::signature(&settings)?;
    let proposal = propose(&opts.dir, &signature, opts)?;
    let text = serde_json::to_string_pretty(&proposal.manifest).unwrap_or_default();
    let mut out = String::new();
    for d in &proposal.defaults {
        out.push_str(&format!("default taken: {d}\n"));
    }
    let path = opts.dir.join("manifest.json");
    if opts.print {
        out.push_str(&text);
        out.push('\n');
        return Ok(out);
    }
    if path.exists() && !opts.force {
        out.push_str(&format!(
            "{} exists; not written (--force writes over it, --print shows the proposal):\n{text}\n",
            path.display()
        ));
        return Ok(out);
    }
    std::fs::write(&path, format!("{text}\n")).map_err(|source| InitModelError::Write {
        path: path.display().to_string(),
        source,
    })?;
    out.push_str(&format!(
        "wrote {}; check it: modstream check-model --model {} \"a text\"\n",
        path.display(),
        opts.dir.display()
    ));
    Ok(out)
}

/// The manifest of a graph with this signature in `dir`.
pub fn propose(
    dir: &Path,
    signature: &Signature,
    opts: &InitModelOptions,
) -> Result<Proposal, InitModelError> {
    let config: Option<serde_json::Value> = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let mut defaults = Vec::new();
    let inputs: Vec<&str> = signature.inputs.iter().map(|(n, _)| n.as_str()).collect();
    let tokens = inputs.contains(&"input_ids") && inputs.iter().all(|i| TOKEN_INPUTS.contains(i));
    let text = inputs.len() == 1 && signature.inputs[0].1.to_lowercase().contains("string");
    if !tokens && !text {
        return Err(InitModelError::Cannot(format!(
            "inputs {:?} are neither one string tensor (a text model) nor token inputs ({TOKEN_INPUTS:?})",
            signature.inputs
        )));
    }
    let outputs: Vec<&str> = signature.outputs.iter().map(|(n, _)| n.as_str()).collect();
    let output = ["logits", "probabilities"]
        .into_iter()
        .find(|o| outputs.contains(o))
        .or(outputs.first().copied())
        .ok_or_else(|| InitModelError::Cannot("the graph has no output".into()))?;
    if outputs.len() > 1 {
        defaults.push(format!("output {output:?} of {outputs:?}"));
    }
    let labels = labels_of(config.as_ref()).ok_or_else(|| {
        InitModelError::Cannot(
            "no labels: config.json has no id2label numbered 0..n; write \"labels\" in manifest.json by hand (docs/own-model.md)".into(),
        )
    })?;
    let score_label = score_label(&labels, opts, &mut defaults)?;
    let name = name_of(dir, config.as_ref(), opts, &mut defaults);
    let version = opts.version.clone().unwrap_or_else(|| {
        defaults.push("version \"0.1.0\" (--version chooses)".into());
        "0.1.0".into()
    });
    let mut manifest = serde_json::json!({
        "name": name,
        "version": version,
        "input_kind": if tokens { "tokens" } else { "text" },
        "inputs": inputs,
        "output": output,
        "labels": labels,
        "score_label": score_label,
    });
    if tokens {
        for (key, value) in token_keys(dir, config.as_ref(), opts, &mut defaults)? {
            manifest[key] = value;
        }
    } else {
        defaults
            .push("activation \"none\": a text model's output is taken as probabilities".into());
        manifest["activation"] = "none".into();
    }
    Ok(Proposal { manifest, defaults })
}

/// The label whose score decides: `--score-label`, else the last label
/// that is not a benign one.
fn score_label(
    labels: &[String],
    opts: &InitModelOptions,
    defaults: &mut Vec<String>,
) -> Result<String, InitModelError> {
    match &opts.score_label {
        Some(l) if labels.contains(l) => Ok(l.clone()),
        Some(l) => Err(InitModelError::Cannot(format!(
            "--score-label {l:?} is not among the labels {labels:?}"
        ))),
        None => {
            let chosen = labels
                .iter()
                .rev()
                .find(|l| !BENIGN.contains(&l.to_lowercase().as_str()))
                .or(labels.last())
                .cloned()
                .unwrap_or_default();
            defaults.push(format!(
                "score_label {chosen:?} of {labels:?} (--score-label chooses)"
            ));
            Ok(chosen)
        }
    }
}

/// `--name`, else config.json's `_name_or_path` (its last part), else the
/// directory's name.
fn name_of(
    dir: &Path,
    config: Option<&serde_json::Value>,
    opts: &InitModelOptions,
    defaults: &mut Vec<String>,
) -> String {
    opts.name.clone().unwrap_or_else(|| {
        let from_config = config
            .and_then(|c| c["_name_or_path"].as_str())
            .and_then(|p| p.rsplit('/').next())
            .filter(|n| !n.is_empty())
            .map(str::to_string);
        let name = from_config.unwrap_or_else(|| {
            (dir.canonicalize().ok())
                .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "model".into())
        });
        defaults.push(format!("name {name:?} (--name chooses)"));
        name
    })
}

/// A token model's keys: its tokenizer, max length and activation.
fn token_keys(
    dir: &Path,
    config: Option<&serde_json::Value>,
    opts: &InitModelOptions,
    defaults: &mut Vec<String>,
) -> Result<Vec<(&'static str, serde_json::Value)>, InitModelError> {
    if !dir.join("tokenizer.json").exists() {
        return Err(InitModelError::Cannot(format!(
            "a token model needs its tokenizer.json in {} (the tokenizer the model was trained with, as Hugging Face saves it)",
            dir.display()
        )));
    }
    let position = config.and_then(|c| c["max_position_embeddings"].as_u64());
    let max_length = opts.max_length.unwrap_or_else(|| {
        let l = position.map_or(128, |p| p.min(128) as usize);
        let from = position.map_or("no max_position_embeddings in config.json".into(), |p| {
            format!("config.json's max_position_embeddings is {p}")
        });
        defaults.push(format!(
            "max_length {l} ({from}; texts are cut there; --max-length chooses)"
        ));
        l
    });
    let problem = config.and_then(|c| c["problem_type"].as_str());
    let activation = match problem {
        Some("multi_label_classification") => "sigmoid",
        _ => "softmax",
    };
    let from = problem.map_or("no problem_type in config.json".into(), |p| {
        format!("config.json's problem_type is {p:?}")
    });
    defaults.push(format!("activation {activation:?} ({from})"));
    Ok(vec![
        ("tokenizer", "tokenizer.json".into()),
        ("max_length", max_length.into()),
        ("activation", activation.into()),
    ])
}

/// config.json's `id2label` in order, if it numbers its labels 0..n.
fn labels_of(config: Option<&serde_json::Value>) -> Option<Vec<String>> {
    let map = config?["id2label"].as_object()?;
    let mut pairs: Vec<(usize, String)> = map
        .iter()
        .map(|(k, v)| Some((k.parse().ok()?, v.as_str()?.to_string())))
        .collect::<Option<_>>()?;
    pairs.sort();
    let ordered = pairs.iter().enumerate().all(|(n, (i, _))| n == *i);
    (ordered && !pairs.is_empty()).then(|| pairs.into_iter().map(|(_, l)| l).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(dir: &Path) -> InitModelOptions {
        InitModelOptions {
            dir: dir.to_path_buf(),
            name: None,
            version: None,
            score_label: None,
            max_length: None,
            print: true,
            force: false,
        }
    }

    fn signature(inputs: &[(&str, &str)]) -> Signature {
        Signature {
            inputs: inputs
                .iter()
                .map(|(n, t)| (n.to_string(), t.to_string()))
                .collect(),
            outputs: vec![("logits".into(), "Tensor<f32>".into())],
        }
    }

    /// A Hugging Face classifier's folder: the proposal is a token model's
    /// manifest, its labels from id2label, the harm label deciding, the
    /// max length capped at 128, every default said.
    #[test]
    fn a_hugging_face_classifier_gets_a_token_manifest_with_its_defaults_said() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"_name_or_path": "org/toxic-bert", "id2label": {"0": "non_toxic", "1": "toxic"}, "max_position_embeddings": 512}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
        let sig = signature(&[
            ("input_ids", "Tensor<i64>"),
            ("attention_mask", "Tensor<i64>"),
        ]);
        let p = propose(dir.path(), &sig, &opts(dir.path())).unwrap();
        let m = &p.manifest;
        assert_eq!(m["input_kind"], "tokens");
        assert_eq!(m["name"], "toxic-bert");
        assert_eq!(m["labels"], serde_json::json!(["non_toxic", "toxic"]));
        assert_eq!(m["score_label"], "toxic");
        assert_eq!(
            (m["max_length"].as_u64(), m["activation"].as_str()),
            (Some(128), Some("softmax"))
        );
        let said = p.defaults.join("\n");
        assert!(
            said.contains("max_length 128")
                && said.contains("score_label")
                && said.contains("version"),
            "{said}"
        );
        // Without labels anywhere: the error says what to write.
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        let e = propose(dir.path(), &sig, &opts(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("labels"), "{e}");
    }
}
