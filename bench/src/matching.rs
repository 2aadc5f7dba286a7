//! Matching's sweep (`--match-shares`): at each near-duplicate share, the
//! same campaign stream (`modstream::tools::campaign`) on the default cell
//! (64 / 20 ms) at saturation with matching off, with a known-bad list of
//! 1,000 items only, and with that list plus waves and reuse; then the
//! matcher alone on the same texts, for its time per event.

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
        let off = measure::saturation_of(opts, cell, events.clone()).await?;
        let on_lists = measure::saturation_of(&with(&lists), cell, events.clone()).await?;
        let reused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = reused.clone();
        let on_reuse = measure::saturation_read(
            &with(&reuse),
            cell,
            events.clone(),
            Clock::ModelLoaded,
            move |v| {
                if v["reason"]["reused"] == true {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            },
        )
        .await?;
        let row = MatchRow {
            near_duplicate_share: share,
            off_per_s: off.per_s,
            lists_per_s: on_lists.per_s,
            reuse_per_s: on_reuse.per_s,
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

/// The matcher alone over the events' texts: µs per event.
fn matcher_us(settings: &MatchingSettings, events: &[GeneratedEvent]) -> anyhow::Result<f64> {
    let mut matcher = Matcher::new(settings)?;
    let now = tokio::time::Instant::now();
    let started = Instant::now();
    for e in events {
        let text = e.text.as_deref().unwrap_or_default();
        std::hint::black_box(matcher.inspect(&e.event_id, text, Some(&e.key), None, now));
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / events.len().max(1) as f64)
}
