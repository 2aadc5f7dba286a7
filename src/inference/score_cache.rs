//! The score cache: a text seen again (reposts, copy-paste spam waves, bots)
//! is scored once per loaded model. Shared by the inference workers,
//! bounded by bytes (`inference.cache_bytes`; 0 turns it off).
//!
//! Guarantee: a cached score is the one the model returned for the same
//! text with the same session settings, so a verdict is the same whether
//! its scores came from the cache or the model; failures are never cached.

use std::sync::Arc;

use crate::telemetry::metric;

use crate::inference::scores::{ScoreError, Scores};

pub struct ScoreCache {
    cache: moka::sync::Cache<String, Arc<[f32]>>,
}

/// Bytes an entry is charged beyond its text and scores (map and Arc overhead).
const ENTRY_OVERHEAD: usize = 64;

impl ScoreCache {
    pub fn new(max_bytes: u64) -> Self {
        let cache = moka::sync::Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|text: &String, scores: &Arc<[f32]>| {
                (text.len() + scores.len() * 4 + ENTRY_OVERHEAD).min(u32::MAX as usize) as u32
            })
            .build();
        ScoreCache { cache }
    }

    /// Scores for `texts` in order: cached ones from the cache, the others
    /// from `score`, which sees only those (in order); what it scores is kept.
    pub fn score(
        &self,
        texts: &mut [String],
        score: impl FnOnce(&mut [String]) -> Vec<Scores>,
    ) -> Vec<Scores> {
        let mut out: Vec<Option<Scores>> = texts
            .iter()
            .map(|t| self.cache.get(t).map(|s| Ok(s.to_vec())))
            .collect();
        let missed: Vec<usize> = (0..texts.len()).filter(|&i| out[i].is_none()).collect();
        metrics::counter!(metric::CACHE_HITS_TOTAL).increment((texts.len() - missed.len()) as u64);
        metrics::counter!(metric::CACHE_MISSES_TOTAL).increment(missed.len() as u64);
        if !missed.is_empty() {
            let mut to_score: Vec<String> = missed.iter().map(|&i| texts[i].clone()).collect();
            let mut scored = score(&mut to_score).into_iter();
            for &i in &missed {
                let result = scored.next().unwrap_or(Err(ScoreError::Missing));
                if let Ok(scores) = &result {
                    self.cache
                        .insert(texts[i].clone(), Arc::from(scores.as_slice()));
                }
                out[i] = Some(result);
            }
        }
        out.into_iter()
            .map(|s| s.unwrap_or(Err(ScoreError::Missing)))
            .collect()
    }

    /// Bytes held now (after pending evictions).
    pub fn weighted_size(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    /// A stand-in model: the score is the text's length; "bad" fails.
    fn model(calls: &mut Vec<Vec<String>>) -> impl FnOnce(&mut [String]) -> Vec<Scores> + '_ {
        move |batch: &mut [String]| {
            calls.push(batch.to_vec());
            batch
                .iter()
                .map(|t| {
                    if t == "bad" {
                        Err(ScoreError::Run("model failed".to_string()))
                    } else {
                        Ok(vec![t.len() as f32, 0.5])
                    }
                })
                .collect()
        }
    }

    #[test]
    fn repeated_texts_are_scored_once_and_get_the_same_scores() {
        let cache = ScoreCache::new(1 << 20);
        let mut calls = Vec::new();
        let first = cache.score(
            &mut texts(&["spam", "hello", "spam", "bad"]),
            model(&mut calls),
        );
        // The cache is filled after the batch: a repeat inside it is scored twice.
        assert_eq!(calls, vec![texts(&["spam", "hello", "spam", "bad"])]);
        let second = cache.score(
            &mut texts(&["hello", "bad", "spam", "new"]),
            model(&mut calls),
        );
        assert_eq!(
            calls[1],
            texts(&["bad", "new"]),
            "only misses reach the model"
        );
        assert_eq!(second[0], first[1], "same scores from the cache");
        assert_eq!(second[2], first[0]);
        assert!(second[1].is_err(), "failures are not cached");
        assert_eq!(second[3], Ok(vec![3.0, 0.5]));
    }

    #[test]
    fn the_cache_stays_within_its_bytes() {
        let cache = ScoreCache::new(10_000);
        let mut calls = Vec::new();
        let many: Vec<String> = (0..1000).map(|i| format!("post number {i}")).collect();
        let mut batch = many.clone();
        cache.score(&mut batch, model(&mut calls));
        assert!(cache.weighted_size() <= 10_000, "{}", cache.weighted_size());
    }
}
