//! A model's scores of one event, or why there are none: what the workers
//! answer, the score cache passes on and the hub dead-letters. A leaf: it
//! imports nothing of the crate.

/// Why an event has no scores from a model: its verdict becomes a
/// dead-letter record with this as the reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScoreError {
    /// The model run failed for this event (alone, when the batch's failed).
    #[error("{0}")]
    Run(String),
    #[error("no score returned")]
    Missing,
    #[error("the model returned a non-finite score: {0:?}")]
    NotFinite(Vec<f32>),
    #[error("inference panicked: {0}")]
    Panicked(String),
}

/// One event's scores, one per label, or why there are none.
pub type Scores = Result<Vec<f32>, ScoreError>;
