//! Token models (BERT-style transformers): text to token ids, batches split
//! by token length, padded tensors, logits to probabilities.
//!
//! Why split: a forward pass costs its padded size (texts × longest). Posts
//! are mostly short with a long tail, so one long post in a batch of 64 makes
//! the other 63 pay for its length. Splitting a batch by length (one pass per
//! group of similar lengths) keeps padding low; [`token_counts`] measures it.

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

/// How logits become probabilities (manifest `activation`: "none",
/// "softmax" or "sigmoid").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
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

/// A post's tokens predicted from its length in bytes, before it is
/// tokenized: the hub batches by this (`batching.max_batch_tokens`) while
/// the tokenizer runs in the workers. `2 + bytes × tokens per byte`, at most
/// the longest token model's `max_length` (longer posts are truncated).
/// Tokens per byte start at a quarter (English WordPiece: about four bytes a
/// token) and follow what the token models' runs measure on texts they did
/// not truncate, a moving average over about sixteen runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenEstimate {
    per_byte: f64,
    max_length: u64,
}

impl TokenEstimate {
    /// The special tokens of every text ([CLS] and [SEP]).
    const SPECIAL: u64 = 2;

    /// `max_length`: the longest token model's (`None`: no token model, no cap).
    pub fn new(max_length: Option<usize>) -> TokenEstimate {
        TokenEstimate {
            per_byte: 0.25,
            max_length: max_length.map_or(u64::MAX, |l| l as u64),
        }
    }

    /// The tokens predicted for a text of `bytes` bytes.
    pub fn of(&self, bytes: usize) -> u64 {
        let body = (bytes as f64 * self.per_byte).ceil() as u64;
        (Self::SPECIAL + body).min(self.max_length)
    }

    /// Tokens per byte now.
    pub fn per_byte(&self) -> f64 {
        self.per_byte
    }

    /// A run tokenized `texts` whole texts of `bytes` bytes into `tokens`
    /// tokens (special tokens included).
    pub fn learn(&mut self, texts: u64, bytes: u64, tokens: u64) {
        if texts == 0 || bytes == 0 {
            return;
        }
        let measured = tokens.saturating_sub(Self::SPECIAL * texts) as f64 / bytes as f64;
        self.per_byte = (self.per_byte * 15.0 + measured.clamp(0.01, 4.0)) / 16.0;
    }
}

/// One forward pass: which texts of the batch, padded to what length.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    pub members: Vec<usize>,
    pub padded_len: usize,
}

/// How a batch is split into forward passes.
#[derive(Debug, Clone, PartialEq)]
pub enum Split {
    /// Sort by length and cut where it pays: each pass is padded to its
    /// longest text; the cuts minimise padded tokens plus `pass_overhead`
    /// tokens per pass (a run's fixed cost, so that passes do not get tiny).
    Longest { pass_overhead: usize },
    /// Fixed shapes: each text goes to the smallest bucket bound that holds
    /// it (`max_length` closes the last bucket), padded to that bound.
    Buckets(Vec<usize>),
}

/// Split a batch into passes (see [`Split`]). Every text is in exactly one
/// pass, no pass is longer than `max_length`; passes come shortest first.
pub fn plan(lengths: &[usize], split: &Split, max_length: usize) -> Vec<Pass> {
    match split {
        Split::Longest { pass_overhead } => plan_sorted(lengths, max_length, *pass_overhead),
        Split::Buckets(buckets) => plan_buckets(lengths, buckets, max_length),
    }
}

/// Optimal contiguous cuts of the length-sorted batch (dynamic programming,
/// O(n²) for n texts): cost of a pass = overhead + texts × its longest.
fn plan_sorted(lengths: &[usize], max_length: usize, overhead: usize) -> Vec<Pass> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    let len = |k: usize| lengths[order[k]].min(max_length);
    let n = order.len();
    // best[j]: cheapest split of the first j sorted texts; cut[j]: its last cut.
    let mut best = vec![0usize; n + 1];
    let mut cut = vec![0usize; n + 1];
    for j in 1..=n {
        let longest = len(j - 1);
        let (cost, from) = (0..j)
            .map(|i| (best[i] + overhead + (j - i) * longest, i))
            .min()
            .unwrap_or((0, 0));
        best[j] = cost;
        cut[j] = from;
    }
    let mut passes = Vec::new();
    let mut j = n;
    while j > 0 {
        let i = cut[j];
        passes.push(Pass {
            members: order[i..j].to_vec(),
            padded_len: len(j - 1),
        });
        j = i;
    }
    passes.reverse();
    passes
}

fn plan_buckets(lengths: &[usize], buckets: &[usize], max_length: usize) -> Vec<Pass> {
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
            padded_len: b,
        })
        .collect();
    for (i, &len) in lengths.iter().enumerate() {
        let slot = bounds
            .iter()
            .position(|&b| len <= b)
            .unwrap_or(bounds.len() - 1);
        passes[slot].members.push(i);
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
        let lengths = [10, 12, 120, 9, 30, 11];
        let passes = plan(&lengths, &Split::Longest { pass_overhead: 16 }, 128);
        let shapes: Vec<(Vec<usize>, usize)> = passes
            .iter()
            .map(|p| (p.members.clone(), p.padded_len))
            .collect();
        assert_eq!(
            shapes,
            vec![(vec![3, 0, 5, 1], 12), (vec![4], 30), (vec![2], 120)]
        );
        let (real, padded) = token_counts(&lengths, &passes);
        assert_eq!((real, padded), (192, 198));
        // One pass padded to the longest would be 6 × 120 = 720 tokens.
        let one = plan(
            &lengths,
            &Split::Longest {
                pass_overhead: 10_000,
            },
            128,
        );
        assert_eq!(one.len(), 1);
        assert_eq!(token_counts(&lengths, &one), (192, 720));
    }

    #[test]
    fn a_pass_overhead_keeps_passes_from_getting_tiny() {
        // 9, 10, 11, 12: one pass of 4 × 12 = 48 tokens beats four exact
        // passes (42 tokens) once each pass costs 16 more.
        let passes = plan(&[9, 10, 11, 12], &Split::Longest { pass_overhead: 16 }, 128);
        assert_eq!(passes.len(), 1);
        let passes = plan(&[9, 10, 11, 12], &Split::Longest { pass_overhead: 0 }, 128);
        assert_eq!(passes.len(), 4);
    }

    #[test]
    fn pad_to_bucket_gives_fixed_shapes() {
        let passes = plan(&[3, 17, 200], &Split::Buckets(vec![16, 32]), 64);
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
    fn a_posts_tokens_are_predicted_from_its_bytes_and_learned_from_runs() {
        let mut e = TokenEstimate::new(Some(128));
        assert_eq!(e.of(0), 2);
        assert_eq!(e.of(40), 12);
        assert_eq!(e.of(100_000), 128, "truncated at max_length");
        // Runs that find one token per two bytes (e.g. a script whose
        // characters are each a token) move the estimate there.
        for _ in 0..200 {
            e.learn(10, 1_000, 10 * 2 + 500);
        }
        assert!((e.per_byte() - 0.5).abs() < 0.01, "{}", e.per_byte());
        assert_eq!(e.of(40), 22);
        // Nothing learned from a run without whole texts.
        let before = e;
        e.learn(0, 0, 0);
        assert_eq!(e, before);
        assert_eq!(TokenEstimate::new(None).of(1 << 20), 2 + (1 << 18));
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
            overhead in 0usize..64,
            pad_to_bucket in any::<bool>(),
        ) {
            let split = if pad_to_bucket {
                Split::Buckets(vec![8, 16, 32, 64])
            } else {
                Split::Longest { pass_overhead: overhead }
            };
            let passes = plan(&lengths, &split, 128);
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
