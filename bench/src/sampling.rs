//! Sampling's cost (`--sampling-runs N`): the default cell (64 / 20 ms) at
//! saturation on the generated stream with sampling off and on at the
//! shipped rates (`[sampling]` defaults), taking turns N times; the row is
//! their medians. Beside them, the share of the verdicts the draw picks
//! (the sampler's rule applied to each verdict's score) and the sampler's
//! own time per verdict, measured alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::measure::{self, Batching, Clock};
use super::print::Print;
use super::{BenchOptions, SamplingRow};
use modstream::config::SamplingSettings;
use modstream::sampling::{Candidate, Sampler, inclusion_probability, unit};
use modstream::tools::generator::generate;

pub(super) async fn row(opts: &BenchOptions) -> anyhow::Result<Option<SamplingRow>> {
    if opts.sampling_runs == 0 {
        return Ok(None);
    }
    let cell = Batching::fixed(64, 20);
    let events = generate(opts.events, 0, "sa-");
    let mut on_opts = opts.clone();
    on_opts.variant.sampling = true;
    let rates = SamplingSettings::default();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let drawn = Arc::new(AtomicUsize::new(0));
    let verdicts = Arc::new(AtomicUsize::new(0));
    for _ in 0..opts.sampling_runs {
        off.push(
            measure::saturation_of(opts, cell, events.clone())
                .await?
                .per_s,
        );
        drawn.store(0, Ordering::Relaxed);
        verdicts.store(0, Ordering::Relaxed);
        let (d, v, r) = (drawn.clone(), verdicts.clone(), rates.clone());
        let count = move |verdict: &serde_json::Value| {
            v.fetch_add(1, Ordering::Relaxed);
            let score = verdict["reason"]["models"][0]["scores"]["offensive"]
                .as_f64()
                .unwrap_or(0.0);
            let id = verdict["event_id"].as_str().unwrap_or_default();
            if unit(id.as_bytes()) < inclusion_probability(&r, score) {
                d.fetch_add(1, Ordering::Relaxed);
            }
        };
        let run =
            measure::saturation_read(&on_opts, cell, events.clone(), Clock::ModelLoaded, count);
        on.push(run.await?.per_s);
    }
    let row = SamplingRow {
        runs: off.len(),
        off_per_s: median(&off),
        on_per_s: median(&on),
        sampled_share: drawn.load(Ordering::Relaxed) as f64
            / verdicts.load(Ordering::Relaxed).max(1) as f64,
        draw_ns: draw_ns(&rates, &events),
    };
    row.print();
    Ok(Some(row))
}

/// The median of a row's runs (the options ask for at least one).
fn median(values: &[f64]) -> f64 {
    modstream::tools::stats::median(values).unwrap_or(f64::NAN)
}

/// The sampler alone: ns per verdict (a score of 0.1, one tenant).
fn draw_ns(
    rates: &SamplingSettings,
    events: &[modstream::tools::generator::GeneratedEvent],
) -> f64 {
    let mut sampler = Sampler::new(rates);
    let now = tokio::time::Instant::now();
    let started = Instant::now();
    for (offset, e) in events.iter().enumerate() {
        let source = modstream::tp::Source {
            tp: modstream::tp::Tp::new("posts", 0),
            offset: offset as i64,
        };
        let c = Candidate {
            event_id: &e.event_id,
            tenant: None,
            rule: "default",
            score: 0.1,
            source: &source,
        };
        std::hint::black_box(sampler.draw(&c, now));
    }
    started.elapsed().as_secs_f64() * 1e9 / events.len().max(1) as f64
}
