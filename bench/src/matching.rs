//! Matching's sweep (`--match-shares`): at each near-duplicate share, the
//! same campaign stream (`modstream::tools::campaign`) on the default cell
//! (64 / 20 ms) at saturation with matching off, with a known-bad list of
//! 1,000 items only, and with that list plus waves and reuse; then the
//! matcher alone on the same texts, for its time per event. With
//! `--match-runs N` the three take turns N times and each row is their
//! medians. With `--match-floods N`, the matcher alone under two floods of
//! N posts built to cost it ([`floods`]).

use std::time::Instant;

use super::measure::{self, Batching, Clock};
use super::print::Print;
use super::{BenchOptions, FloodRow, MatchRow};
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
            off_per_s: median(&off),
            lists_per_s: median(&on_lists),
            reuse_per_s: median(&on_reuse),
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

/// The median of a row's runs (the options ask for at least one).
fn median(values: &[f64]) -> f64 {
    modstream::tools::stats::median(values).unwrap_or(f64::NAN)
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

/// The matcher alone (waves on, the shipped bounds) under two floods of
/// `--match-floods` posts: variants of one 20-word text with 5 words
/// replaced at random (about 0.45 similar to it, less to each other: each
/// starts a cluster, and they share bands), and posts of 600 words unlike
/// each other (each a cluster of about 1,200 shingles). The peak RSS is
/// reset before each (Linux: `clear_refs`), so its rise is the flood's.
pub(super) fn floods(opts: &BenchOptions) -> anyhow::Result<Vec<FloodRow>> {
    if opts.match_floods == 0 {
        return Ok(Vec::new());
    }
    let n = opts.match_floods;
    let spread = modstream::tools::generator::spread;
    let base: Vec<String> = (0..20).map(|w| format!("base{w}")).collect();
    let variants = (0..n).map(|i| {
        let mut words = base.clone();
        for k in 0..5 {
            let at = (spread((i * 5 + k) as u64) % 20) as usize;
            words[at] = format!("x{}", spread((i * 7 + k) as u64 ^ 0xF100D) % 1_000_000);
        }
        words.join(" ")
    });
    let long = (0..n).map(|i| {
        let words: Vec<String> = (0..600)
            .map(|k| format!("w{}", spread((i * 1_000_003 + k) as u64) % 500_000))
            .collect();
        words.join(" ")
    });
    let settings = MatchingSettings {
        waves: true,
        ..MatchingSettings::default()
    };
    let rows = [
        ("variants at 0.45 similarity", variants.collect::<Vec<_>>()),
        ("long posts unlike each other", long.collect::<Vec<_>>()),
    ]
    .into_iter()
    .map(|(flood, texts)| flood_row(flood, &texts, &settings))
    .collect::<anyhow::Result<Vec<_>>>()?;
    for r in &rows {
        r.print();
    }
    Ok(rows)
}

fn flood_row(
    flood: &str,
    texts: &[String],
    settings: &MatchingSettings,
) -> anyhow::Result<FloodRow> {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = super::process::rss_bytes();
    let mut matcher = Matcher::new(settings)?;
    let now = tokio::time::Instant::now();
    let started = Instant::now();
    for (offset, text) in texts.iter().enumerate() {
        let source = modstream::tp::Source {
            tp: modstream::tp::Tp::new("m", 0),
            offset: offset as i64,
        };
        let post = modstream::matching::Post {
            event_id: "e",
            text,
            user: Some("u"),
            source: &source,
            rule_lists: None,
        };
        std::hint::black_box(matcher.inspect(&post, now));
    }
    let matcher_us = started.elapsed().as_secs_f64() * 1e6 / texts.len().max(1) as f64;
    let stats = matcher.waves_stats().unwrap_or_default();
    Ok(FloodRow {
        flood: flood.to_string(),
        events: texts.len(),
        matcher_us,
        clusters: stats.clusters,
        bytes: matcher.bytes(),
        max_bytes: settings.max_bytes,
        evicted: stats.evicted,
        candidates_cut: stats.cut,
        rss_rise_bytes: super::process::peak_rss_bytes().saturating_sub(before),
    })
}
