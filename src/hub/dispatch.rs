//! Dispatch: ready batches coalesced into model runs for the workers, and
//! the results taken back to their partitions.

use super::{Deliver, Hub};
use crate::inference::{InferenceJob, InferenceResult};
use crate::partition::Scored;
use crate::telemetry::metric;

impl<D: Deliver> Hub<D> {
    /// Coalesce ready batches (possibly of several partitions) into model runs
    /// of at most `max_batch_size` events, while the workers' queue has room.
    pub(super) fn dispatch(&mut self) {
        let max = self.batch.size;
        let capacity = self.dispatch_capacity;
        if self.breaker.open {
            self.probe(capacity);
            return;
        }
        while !self.ready.is_empty() && self.in_inference.len() < capacity {
            let mut segments = Vec::new();
            let mut size = 0;
            while let Some(next) = self.ready.front() {
                if size > 0 && size + next.items.len() > max {
                    break;
                }
                let Some(batch) = self.ready.pop_front() else {
                    break;
                };
                size += batch.items.len();
                segments.push(batch);
            }
            let texts = segments
                .iter_mut()
                .flat_map(|s| {
                    s.items
                        .iter_mut()
                        .map(|p| std::mem::take(&mut p.event.text))
                })
                .collect();
            let id = self.next_job_id;
            self.next_job_id += 1;
            metrics::histogram!(metric::BATCH_SIZE).record(size as f64);
            let sizes = &mut self.summary.run_sizes;
            if sizes.len() <= size {
                sizes.resize(size + 1, 0);
            }
            sizes[size] += 1;
            self.in_inference.insert(id, segments);
            if let Err(e) = self.jobs.try_send(InferenceJob { id, texts }) {
                // Cannot happen while in_inference bounds the queue; keep
                // the events anyway (scored as failed).
                tracing::error!("inference queue full despite the bound");
                self.on_inference_result(InferenceResult {
                    id,
                    scores: vec![],
                    texts: e.into_inner().texts,
                    elapsed: std::time::Duration::ZERO,
                    tokens: Default::default(),
                    version: 0,
                });
            }
        }
    }

    pub(super) fn on_inference_result(&mut self, result: InferenceResult) {
        if self.breaker.probe == Some(result.id) {
            self.on_probe(result);
            return;
        }
        let Some(segments) = self.in_inference.remove(&result.id) else {
            return;
        };
        let dead = !result.scores.is_empty() && result.scores.iter().all(Result::is_err);
        if !dead {
            self.breaker.dead_runs = 0;
            if let Some(i) = result.scores.iter().position(Result::is_ok) {
                self.breaker.last_scored = result.texts.get(i).cloned();
            }
        } else {
            self.breaker.dead_runs += 1;
            let limit = self.settings.inference.breaker_after;
            if limit > 0 && (self.breaker.open || self.breaker.dead_runs >= limit) {
                self.hold_back(segments, result);
                return;
            }
        }
        metrics::histogram!(metric::INFERENCE_SECONDS).record(result.elapsed.as_secs_f64());
        if let Some(controller) = self.slo.as_mut() {
            controller.model_run(result.scores.len(), result.elapsed);
        }
        self.summary.batches += 1;
        self.summary.inference_seconds += result.elapsed.as_secs_f64();
        self.summary.real_tokens += result.tokens.real;
        self.summary.padded_tokens += result.tokens.padded;
        metrics::counter!(metric::TOKENS_REAL_TOTAL).increment(result.tokens.real);
        metrics::counter!(metric::TOKENS_PADDED_TOTAL).increment(result.tokens.padded);
        // The model that scored it (a reload may have switched it).
        let scorer = self.reloaded.get(&result.version).cloned();
        let mut scores = result.scores.into_iter();
        // The shadow model needs the texts back (they went to the workers).
        let mut texts = self.shadow.is_some().then(|| result.texts.into_iter());
        for segment in segments {
            let scored: Vec<Scored> = segment
                .items
                .into_iter()
                .map(|mut p| {
                    p.scored_by = scorer.clone();
                    if let Some(text) = texts.as_mut().and_then(Iterator::next) {
                        p.event.text = text;
                    }
                    let s = scores
                        .next()
                        .unwrap_or_else(|| Err("no score returned".to_string()));
                    (p, s)
                })
                .collect();
            match self.partitions.get_mut(&segment.tp) {
                Some(partition) if partition.generation() == segment.generation => {
                    partition.scored(segment.seq, scored);
                }
                // Revoked meanwhile and the drain gave up: the next owner
                // reprocesses these events.
                _ => self.release(scored.len()),
            }
            self.emit_in_order(&segment.tp);
        }
    }
}
