//! Report rows built from what a run measured.

use std::collections::BTreeMap;

use modstream::tools::report::SaturationRow;

use crate::measure::{Batching, Saturated};

/// Power-of-two buckets of run sizes: "1", "2-3", "4-7", ...
pub fn run_size_histogram(sizes: &[u64]) -> BTreeMap<String, u64> {
    let mut h = BTreeMap::new();
    for (size, &n) in sizes.iter().enumerate().filter(|(s, n)| *s > 0 && **n > 0) {
        let low = 1usize << size.ilog2();
        let key = if low == 1 {
            "1".to_string()
        } else {
            format!("{low:>4}-{}", low * 2 - 1)
        };
        *h.entry(key).or_insert(0) += n;
    }
    h
}

pub fn mean_ms(total_seconds: f64, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        total_seconds * 1000.0 / count as f64
    }
}

/// The row of one saturation run of `events` events at `batching`;
/// `naive` is the unbucketed raw model (token models).
pub fn saturation_row(
    batching: Batching,
    events: usize,
    run: &Saturated,
    raw_model_per_s: f64,
    naive: Option<(f64, Option<f64>)>,
) -> SaturationRow {
    let Saturated {
        per_s: pipeline_per_s,
        ref summary,
        elapsed_s,
    } = *run;
    let mean_batch_size = if summary.batches > 0 {
        summary.verdicts as f64 / summary.batches as f64
    } else {
        0.0
    };
    SaturationRow {
        max_batch_size: batching.size,
        max_batch_delay_ms: batching.delay_ms,
        target_p99_ms: None,
        events,
        pipeline_per_s,
        raw_model_per_s,
        pipeline_over_raw: pipeline_per_s / raw_model_per_s,
        mean_batch_size,
        inference_share: summary.inference_seconds / elapsed_s,
        run_sizes: run_size_histogram(&summary.run_sizes),
        batch_wait_ms: mean_ms(summary.batch_wait_seconds, summary.closed_batches),
        inference_ms: mean_ms(summary.inference_seconds, summary.batches),
        produce_ms: mean_ms(summary.produce_seconds, summary.verdicts + summary.dlq),
        padding_efficiency: (summary.padded_tokens > 0)
            .then(|| summary.real_tokens as f64 / summary.padded_tokens as f64),
        mean_tokens: (summary.real_tokens > 0)
            .then(|| summary.real_tokens as f64 / summary.verdicts.max(1) as f64),
        raw_unbucketed_per_s: naive.map(|n| n.0),
        raw_unbucketed_padding_efficiency: naive.and_then(|n| n.1),
        raw_sessions: None,
        raw_cpu_us_per_event: None,
        own_process: None,
    }
}
