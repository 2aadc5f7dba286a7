//! Token models (BERT-style transformers): text to token ids, batches split
//! by token length, padded tensors, logits to probabilities.
//!
//! Why buckets: a forward pass costs its padded size (texts × longest). Posts
//! are mostly short with a long tail, so one long post in a batch of 64 makes
//! the other 63 pay for its length. Splitting a batch into length buckets
//! (one pass each) keeps padding low; `padding_efficiency` measures it.

use std::path::Path;

use ndarray::Array2;
use tokenizers::{Tokenizer, TruncationParams};

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot load tokenizer {path}: {message}")]
    Load { path: String, message: String },
    #[error("tokenization failed: {0}")]
    Encode(String),
}

/// How logits become probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// The model already outputs probabilities.
    #[default]
    None,
    /// Single-label classification: the labels compete.
    Softmax,
    /// Multi-label classification: each label on its own.
    Sigmoid,
}

impl Activation {
    pub fn parse(name: &str) -> Option<Activation> {
        match name {
            "none" => Some(Activation::None),
            "softmax" => Some(Activation::Softmax),
            "sigmoid" => Some(Activation::Sigmoid),
            _ => None,
        }
    }

    /// Hugging Face `config.json` `problem_type`.
    pub fn from_problem_type(problem_type: Option<&str>) -> Activation {
        match problem_type {
            Some("multi_label_classification") => Activation::Sigmoid,
            _ => Activation::Softmax,
        }
    }

    pub fn apply(self, logits: &[f32]) -> Vec<f32> {
        match self {
            Activation::None => logits.to_vec(),
            Activation::Sigmoid => logits.iter().map(|z| 1.0 / (1.0 + (-z).exp())).collect(),
            Activation::Softmax => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exp: Vec<f32> = logits.iter().map(|z| (z - max).exp()).collect();
                let sum: f32 = exp.iter().sum();
                exp.iter().map(|e| e / sum).collect()
            }
        }
    }
}

/// One tokenized text (special tokens included, truncated).
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    pub ids: Vec<i64>,
    pub type_ids: Vec<i64>,
}

/// `tokenizer.json` with truncation to the model's maximum length.
pub struct Encoder {
    tokenizer: Tokenizer,
    pub max_length: usize,
}

impl Encoder {
    pub fn load(path: &Path, max_length: usize) -> Result<Encoder, TokenError> {
        let load = |message: String| TokenError::Load {
            path: path.display().to_string(),
            message,
        };
        let mut tokenizer = Tokenizer::from_file(path).map_err(|e| load(e.to_string()))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length,
                ..Default::default()
            }))
            .map_err(|e| load(e.to_string()))?;
        Ok(Encoder {
            tokenizer,
            max_length,
        })
    }

    pub fn encode(&self, text: &str) -> Result<Encoded, TokenError> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| TokenError::Encode(e.to_string()))?;
        Ok(Encoded {
            ids: enc.get_ids().iter().map(|&i| i64::from(i)).collect(),
            type_ids: enc.get_type_ids().iter().map(|&i| i64::from(i)).collect(),
        })
    }
}

/// One forward pass: which texts of the batch, padded to what length.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    pub members: Vec<usize>,
    pub padded_len: usize,
}

/// Split a batch by token length: each text goes to the smallest bucket
/// bound that holds it (`max_length` closes the last bucket); one pass per
/// non-empty bucket, padded to the bucket bound or to its longest text.
/// Every text is in exactly one pass; passes come shortest first.
pub fn plan(
    lengths: &[usize],
    buckets: &[usize],
    max_length: usize,
    pad_to_bucket: bool,
) -> Vec<Pass> {
    let mut bounds: Vec<usize> = buckets
        .iter()
        .copied()
        .filter(|&b| b < max_length)
        .collect();
    bounds.push(max_length);
    let mut passes: Vec<Pass> = bounds
        .iter()
        .map(|&b| Pass {
            members: Vec::new(),
            padded_len: if pad_to_bucket { b } else { 0 },
        })
        .collect();
    for (i, &len) in lengths.iter().enumerate() {
        let slot = bounds
            .iter()
            .position(|&b| len <= b)
            .unwrap_or(bounds.len() - 1);
        let pass = &mut passes[slot];
        pass.members.push(i);
        if !pad_to_bucket {
            pass.padded_len = pass.padded_len.max(len.min(max_length));
        }
    }
    passes.retain(|p| !p.members.is_empty());
    passes
}

/// The three input tensors of one pass: ids, attention mask, token types,
/// each [texts, padded_len], zero-padded.
pub fn tensors(encoded: &[Encoded], pass: &Pass) -> [Array2<i64>; 3] {
    let shape = (pass.members.len(), pass.padded_len);
    let mut ids = Array2::<i64>::zeros(shape);
    let mut mask = Array2::<i64>::zeros(shape);
    let mut types = Array2::<i64>::zeros(shape);
    for (row, &i) in pass.members.iter().enumerate() {
        let e = &encoded[i];
        let n = e.ids.len().min(pass.padded_len);
        for col in 0..n {
            ids[[row, col]] = e.ids[col];
            mask[[row, col]] = 1;
            types[[row, col]] = e.type_ids[col];
        }
    }
    [ids, mask, types]
}

/// Real and padded token counts of a plan, for padding efficiency.
pub fn token_counts(lengths: &[usize], passes: &[Pass]) -> (u64, u64) {
    passes.iter().fold((0, 0), |(real, padded), p| {
        let r: usize = p
            .members
            .iter()
            .map(|&i| lengths[i].min(p.padded_len))
            .sum();
        (
            real + r as u64,
            padded + (p.members.len() * p.padded_len) as u64,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_posts_are_not_padded_to_a_long_one() {
        let lengths = [10, 12, 120, 9, 30];
        let passes = plan(&lengths, &[16, 32, 64, 128], 128, false);
        assert_eq!(
            passes,
            vec![
                Pass {
                    members: vec![0, 1, 3],
                    padded_len: 12
                },
                Pass {
                    members: vec![4],
                    padded_len: 30
                },
                Pass {
                    members: vec![2],
                    padded_len: 120
                },
            ]
        );
        let (real, padded) = token_counts(&lengths, &passes);
        assert_eq!((real, padded), (181, 186));
        // One pass padded to the longest would be 5 × 120 = 600 tokens.
        let one = plan(&lengths, &[128], 128, false);
        assert_eq!(token_counts(&lengths, &one), (181, 600));
    }

    #[test]
    fn pad_to_bucket_gives_fixed_shapes() {
        let passes = plan(&[3, 17, 200], &[16, 32], 64, true);
        let lens: Vec<usize> = passes.iter().map(|p| p.padded_len).collect();
        assert_eq!(lens, vec![16, 32, 64]);
    }

    #[test]
    fn tensors_are_zero_padded_with_a_mask() {
        let enc = vec![
            Encoded {
                ids: vec![101, 7, 102],
                type_ids: vec![0, 0, 0],
            },
            Encoded {
                ids: vec![101, 102],
                type_ids: vec![0, 0],
            },
        ];
        let pass = Pass {
            members: vec![1, 0],
            padded_len: 3,
        };
        let [ids, mask, _] = tensors(&enc, &pass);
        assert_eq!(ids.as_slice().unwrap(), &[101, 102, 0, 101, 7, 102]);
        assert_eq!(mask.as_slice().unwrap(), &[1, 1, 0, 1, 1, 1]);
    }

    #[test]
    fn activations() {
        let p = Activation::Softmax.apply(&[0.0, 0.0]);
        assert_eq!(p, vec![0.5, 0.5]);
        let p = Activation::Softmax.apply(&[1000.0, 0.0]);
        assert!((p[0] - 1.0).abs() < 1e-6 && p[1] >= 0.0);
        let p = Activation::Sigmoid.apply(&[0.0, 10.0, -10.0]);
        assert!((p[0] - 0.5).abs() < 1e-6 && p[1] > 0.99 && p[2] < 0.01);
        assert_eq!(
            Activation::from_problem_type(Some("multi_label_classification")),
            Activation::Sigmoid
        );
        assert_eq!(Activation::from_problem_type(None), Activation::Softmax);
    }

    proptest! {
        #[test]
        fn every_text_in_exactly_one_pass_that_fits_it(
            lengths in proptest::collection::vec(1usize..300, 0..200),
            pad_to_bucket in any::<bool>(),
        ) {
            let passes = plan(&lengths, &[8, 16, 32, 64], 128, pad_to_bucket);
            let mut seen: Vec<usize> = passes.iter().flat_map(|p| p.members.clone()).collect();
            seen.sort();
            prop_assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
            for p in &passes {
                prop_assert!(p.padded_len <= 128);
                for &i in &p.members {
                    prop_assert!(p.padded_len >= lengths[i].min(128));
                }
            }
            let (real, padded) = token_counts(&lengths, &passes);
            prop_assert!(real <= padded);
        }
    }
}
