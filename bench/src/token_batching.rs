//! Batching by tokens against batching by count (`--token-budgets`), on a
//! long-tailed mix of post lengths: each count of `--batch-sizes` alone,
//! then each token budget (with `--token-batch-size` as its count bound),
//! and with `--token-target-p99-ms` the latency controller counting events
//! and counting tokens.
//! Every contender at saturation, then at the same paced rates: fractions
//! (`--loads`) of the best count-only contender's saturation.

use super::BenchOptions;
use super::measure::{self, Batching};
use modstream::tools::generator::Lengths;
use modstream::tools::report::TokenBatchRow;

/// The contender's options: the long tail, and its token budget.
fn options_of(opts: &BenchOptions, max_batch_tokens: Option<u64>) -> BenchOptions {
    let mut o = opts.clone();
    o.variant.lengths = Lengths::LongTail;
    o.variant.max_batch_tokens = max_batch_tokens;
    o
}

pub(super) async fn rows(opts: &BenchOptions) -> anyhow::Result<Vec<TokenBatchRow>> {
    if opts.token_budgets.is_empty() {
        return Ok(Vec::new());
    }
    let delay = opts.delays_ms.first().copied().unwrap_or(20);
    let fixed = |size| Batching::fixed(size, delay);
    let mut contenders: Vec<(Batching, Option<u64>)> =
        (opts.batch_sizes.iter().map(|&size| (fixed(size), None)))
            .chain((opts.token_budgets.iter()).map(|&t| (fixed(opts.token_batch_size), Some(t))))
            .collect();
    if opts.token_target_p99_ms > 0 {
        // Counting posts: bounded by the largest count contender (a bound
        // of `--token-batch-size` posts of 512 tokens makes a warm-up run
        // of minutes on CPU); counting tokens: by the largest budget.
        let adaptive = |size| Batching {
            target_p99_ms: Some(opts.token_target_p99_ms),
            ..fixed(size)
        };
        let most_posts = opts.batch_sizes.iter().copied().max().unwrap_or(64);
        let largest = opts.token_budgets.iter().copied().max();
        contenders.push((adaptive(most_posts), None));
        contenders.push((adaptive(opts.token_batch_size), largest));
    }
    let mut rows = Vec::new();
    let mut cells = Vec::new();
    for (cell, tokens) in contenders {
        let size = cell.size;
        let o = options_of(opts, tokens);
        let events = o.variant.events(opts.events, "s-");
        let sat = measure::saturation_of(&o, cell, events).await?;
        let s = &sat.summary;
        let row = TokenBatchRow {
            max_batch_size: size,
            max_batch_tokens: tokens,
            target_p99_ms: cell.target_p99_ms,
            events: opts.events,
            saturation_per_s: sat.per_s,
            events_per_run: opts.events as f64 / s.batches.max(1) as f64,
            padding_efficiency: (s.padded_tokens > 0)
                .then(|| s.real_tokens as f64 / s.padded_tokens as f64),
            paced: Vec::new(),
        };
        println!(
            "token batching: ≤ {size} posts, ≤ {tokens:?} tokens: {:.0}/s at saturation, {:.1} events per run",
            row.saturation_per_s, row.events_per_run
        );
        rows.push(row);
        cells.push(cell);
    }
    let best_count = (rows.iter())
        .filter(|r| r.max_batch_tokens.is_none() && r.target_p99_ms.is_none())
        .map(|r| r.saturation_per_s)
        .fold(0.0, f64::max);
    for &fraction in &opts.loads {
        for (row, &b) in rows.iter_mut().zip(&cells) {
            let o = options_of(opts, row.max_batch_tokens);
            let point = measure::latency(&o, b, fraction, best_count * fraction).await?;
            println!(
                "token batching: ≤ {} posts, ≤ {:?} tokens at {:.0}/s: p50 {:.1} ms, p99 {:.1} ms",
                row.max_batch_size,
                row.max_batch_tokens,
                point.offered_per_s,
                point.p50_ms,
                point.p99_ms
            );
            row.paced.push(point);
        }
    }
    Ok(rows)
}
