//! Matching's sweep (`--match-shares`): at each near-duplicate share, the
//! same campaign stream (`modstream::tools::campaign`) on the default cell
//! (64 / 20 ms) at saturation with matching off, with a known-bad list of
//! 1,000 items only, and with that list plus waves and reuse; then the
//! matcher alone on the same texts, for its time per event. With
//! `--match-runs N` the three take turns N times and each row is their
//! medians.

use std::time::Instant;

use super::measure::{self, Batching, Clock};
use super::print::Print;
use super::{BenchOptions, MatchRow};
use modstream::config::{ListFile, ListMode, MatchingSettings};
use modstream::matching::Matcher;
use modstream::tools::campaign::{Campaign, generate_campaign, known_bad_list};
use modstream::tools::generator::GeneratedEvent;

pub(super) async fn rows(opts: &BenchOptions) -> anyhow::Result<Vec<MatchRow>> {
    if opts.match_shares.is_empty() {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(&opts.out_dir)?;
    let list_file = opts.out_dir.join("known-bad.jsonl");
    std::fs::write(&list_file, known_bad_list(1000))?;
    let lists = MatchingSettings {
        lists: vec![ListFile {
            name: "spam".into(),
            file: std::path::absolute(&list_file)?,
            mode: ListMode::Decide,
        }],
        ..MatchingSettings::default()
    };
    let reuse = MatchingSettings {
        waves: true,
        reuse: true,
        ..lists.clone()
    };
    let cell = Batching::fixed(64, 20);
    let mut rows = Vec::new();
    for &share in &opts.match_shares {
        let campaign = Campaign {
            share,
            ..Campaign::default()
        };
        let events: Vec<GeneratedEvent> = generate_campaign(opts.events, &campaign, "m-")
            .into_iter()
            .map(|p| p.event)
            .collect();
        let with = |m: &MatchingSettings| {
            let mut o = opts.clone();
            o.variant.matching = Some(m.clone());
            o
        };
        // The three contenders in turn, `--match-runs` times; the median
        // of each (one run's noise on this machine is about ±10 %).
        let (mut off, mut on_lists, mut on_reuse) = (Vec::new(), Vec::new(), Vec::new());
        let reused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..opts.match_runs.max(1) {
            off.push(
                measure::saturation_of(opts, cell, events.clone())
                    .await?
                    .per_s,
            );
            let lists_opts = with(&lists);
            on_lists.push(
                measure::saturation_of(&lists_opts, cell, events.clone())
                    .await?
                    .per_s,
            );
            let counted = reused.clone();
            counted.store(0, std::sync::atomic::Ordering::Relaxed);
            let count = move |v: &serde_json::Value| {
                if v["reason"]["reused"] == true {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            };
            let reuse_opts = with(&reuse);
            let run = measure::saturation_read(
                &reuse_opts,
                cell,
                events.clone(),
                Clock::ModelLoaded,
                count,
            );
            on_reuse.push(run.await?.per_s);
        }
        let row = MatchRow {
            near_duplicate_share: share,
            runs: off.len(),
            off_per_s: median(&mut off),
            lists_per_s: median(&mut on_lists),
            reuse_per_s: median(&mut on_reuse),
            reused_share: reused.load(std::sync::atomic::Ordering::Relaxed) as f64
                / events.len() as f64,
            lists_matcher_us: matcher_us(&lists, &events)?,
            waves_matcher_us: matcher_us(&reuse, &events)?,
        };
        row.print();
        rows.push(row);
    }
    Ok(rows)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The matcher alone over the events' texts: µs per event.
fn matcher_us(settings: &MatchingSettings, events: &[GeneratedEvent]) -> anyhow::Result<f64> {
    let mut matcher = Matcher::new(settings)?;
    let now = tokio::time::Instant::now();
    let started = Instant::now();
    for (offset, e) in events.iter().enumerate() {
        let source = modstream::tp::Source {
            tp: modstream::tp::Tp::new("m", 0),
            offset: offset as i64,
        };
        let post = modstream::matching::Post {
            event_id: &e.event_id,
            text: e.text.as_deref().unwrap_or_default(),
            user: Some(&e.key),
            source: &source,
            rule_lists: None,
        };
        std::hint::black_box(matcher.inspect(&post, now));
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / events.len().max(1) as f64)
}
