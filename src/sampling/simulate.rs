//! A simulated stream with a known violation share, sampled the way the
//! service samples, for checking the estimators (the unit tests) and for
//! reading how many labels a given precision needs (`modstream prevalence
//! --widths`).
//!
//! The stated noisy model: a violating event's score is drawn from
//! N(0.7, 0.2), a harmless one's from N(0.1, 0.15), each clamped to 0..1;
//! the policy flags a score of at least [`THRESHOLD`]. So the model
//! misses some violations (recall about 0.84) and flags some harmless
//! events (about 0.4 % of them).

use super::estimate::{self, Estimate, Unit};
use super::inclusion_probability;
use crate::config::SamplingSettings;

/// The simulated policy's threshold.
pub const THRESHOLD: f64 = 0.5;

/// A stream: each event's score and whether it truly violates.
pub struct Population {
    pub scores: Vec<f64>,
    pub violating: Vec<bool>,
}

impl Population {
    /// `n` events of which `round(n × share)` violate, from `seed`.
    pub fn new(n: usize, share: f64, seed: u64) -> Population {
        let bad = (n as f64 * share).round() as usize;
        let mut scores = Vec::with_capacity(n);
        let mut violating = Vec::with_capacity(n);
        for i in 0..n {
            let v = i < bad;
            let (mean, sd) = if v { (0.7, 0.2) } else { (0.1, 0.15) };
            scores.push((mean + sd * normal(seed, i as u64)).clamp(0.0, 1.0));
            violating.push(v);
        }
        Population { scores, violating }
    }

    pub fn prevalence(&self) -> f64 {
        self.violating.iter().filter(|&&v| v).count() as f64 / self.violating.len() as f64
    }

    /// The model's true recall and precision at [`THRESHOLD`].
    pub fn recall_precision(&self) -> (f64, f64) {
        let flagged = |i: usize| self.scores[i] >= THRESHOLD;
        let n = self.scores.len();
        let tp = (0..n).filter(|&i| flagged(i) && self.violating[i]).count() as f64;
        let positives = self.violating.iter().filter(|&&v| v).count() as f64;
        let flags = (0..n).filter(|&i| flagged(i)).count() as f64;
        (tp / positives, tp / flags)
    }

    /// One sample (`replicate` picks an independent draw): each event in
    /// it with its inclusion probability, drawn by the service's rule.
    pub fn sample(&self, rates: &SamplingSettings, replicate: u64) -> Vec<(usize, f64)> {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&replicate.to_le_bytes());
        (0..self.scores.len())
            .filter_map(|i| {
                let p = inclusion_probability(rates, self.scores[i]);
                id[8..].copy_from_slice(&(i as u64).to_le_bytes());
                (super::unit(&id) < p).then_some((i, p))
            })
            .collect()
    }

    /// Prevalence, recall and precision estimated from one sample.
    pub fn estimate(&self, sample: &[(usize, f64)]) -> Estimates {
        let unit = |&(_, p): &(usize, f64), num: bool, den: bool| Unit {
            probability: p,
            numerator: num && den,
            denominator: den,
        };
        let flagged = |i: usize| self.scores[i] >= THRESHOLD;
        Estimates {
            prevalence: estimate::ratio(sample.iter().map(|s| unit(s, self.violating[s.0], true))),
            recall: estimate::ratio(
                sample
                    .iter()
                    .map(|s| unit(s, flagged(s.0), self.violating[s.0])),
            ),
            precision: estimate::ratio(
                sample
                    .iter()
                    .map(|s| unit(s, self.violating[s.0], flagged(s.0))),
            ),
        }
    }
}

/// The three estimates of one sample.
#[derive(Debug, Clone, Copy)]
pub struct Estimates {
    pub prevalence: Option<Estimate>,
    pub recall: Option<Estimate>,
    pub precision: Option<Estimate>,
}

/// A standard normal number for (seed, i), from two hashed uniforms
/// (Box–Muller): the same stream on every run and machine.
fn normal(seed: u64, i: u64) -> f64 {
    let uniform = |k: u64| {
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(&(i * 2 + k).to_le_bytes(), seed);
        ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let (u1, u2) = (uniform(0), uniform(1));
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}
