//! `[sampling]`: risk-weighted samples of verdicts for human labels, from
//! which `modstream prevalence` estimates how much harm there is (see
//! [`crate::sampling`]). On when `output.samples_topic` is set.

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingSettings {
    /// The model whose score weights the draw (a `[[inference.models]]`
    /// name); default: the first model.
    pub model: Option<String>,
    /// The label whose score weights the draw; default: the highest score
    /// of the model's labels.
    pub label: Option<String>,
    /// The probability of sampling an event the model scores 0: the floor,
    /// so that content the model thinks harmless is sampled too.
    pub min_rate: f64,
    /// The probability of sampling an event the model scores 1. Between the
    /// two it grows in a straight line with the score.
    pub max_rate: f64,
    /// At most this many samples per second per tenant and rule (a burst of
    /// one second's worth): a wave cannot flood the reviewers. Samples over
    /// it are dropped and counted (the next sample written says how many).
    pub max_per_second: f64,
}

impl Default for SamplingSettings {
    fn default() -> Self {
        SamplingSettings {
            model: None,
            label: None,
            min_rate: 0.001,
            max_rate: 0.02,
            max_per_second: 20.0,
        }
    }
}

pub(super) fn validate(s: &SamplingSettings) -> Result<(), ConfigError> {
    if !(s.min_rate > 0.0 && s.min_rate <= 1.0) {
        return Err(invalid(
            "sampling.min_rate",
            "above 0 (every event must be able to be sampled, or the estimate is biased), at most 1",
        ));
    }
    if !(s.max_rate >= s.min_rate && s.max_rate <= 1.0) {
        return Err(invalid(
            "sampling.max_rate",
            "at least sampling.min_rate, at most 1",
        ));
    }
    if !(s.max_per_second > 0.0 && s.max_per_second.is_finite()) {
        return Err(invalid("sampling.max_per_second", "above 0"));
    }
    Ok(())
}
