//! The matcher's cost curves (`--list-items`, `--wave-clusters`): the
//! matcher alone, one thread, holding a known-bad list of N items or N wave
//! clusters, then inspecting the bench's generated posts (a tenth of them
//! replaced by list texts on the list curve, so that matches are found as
//! well as missed). The peak RSS is reset before each build (Linux:
//! `clear_refs`), so its rise is the build's.

use std::time::Instant;

use super::BenchOptions;
use super::print::Print;
use modstream::config::{ListFile, ListMode, MatchingSettings};
use modstream::matching::Matcher;
use modstream::tools::campaign::{distinct_texts, list_file};
use modstream::tools::report::{Held, MatcherCurveRow};

/// Words of a list item or a cluster's post.
const WORDS: usize = 10;

pub(super) fn rows(opts: &BenchOptions) -> anyhow::Result<Vec<MatcherCurveRow>> {
    let mut rows = Vec::new();
    for &n in &opts.list_items {
        rows.push(list_point(opts, n)?);
    }
    for &n in &opts.wave_clusters {
        rows.push(waves_point(opts, n)?);
    }
    for r in &rows {
        r.print();
    }
    Ok(rows)
}

/// The settings a list of `n` items loads under: the shipped ones, with
/// `max_bytes` raised to hold the list (the row says what it holds).
pub(super) fn list_settings(file: &std::path::Path) -> MatchingSettings {
    MatchingSettings {
        lists: vec![ListFile {
            name: "spam".into(),
            file: file.to_path_buf(),
            mode: ListMode::Decide,
        }],
        max_bytes: usize::MAX / 2,
        ..MatchingSettings::default()
    }
}

/// A list file of `n` distinct items under the bench's output folder.
pub(super) fn write_list(opts: &BenchOptions, n: usize) -> anyhow::Result<std::path::PathBuf> {
    std::fs::create_dir_all(&opts.out_dir)?;
    let file = std::path::absolute(opts.out_dir.join(format!("list-{n}.jsonl")))?;
    std::fs::write(&file, list_file(distinct_texts(n, WORDS, 0x11575)))?;
    Ok(file)
}

fn list_point(opts: &BenchOptions, n: usize) -> anyhow::Result<MatcherCurveRow> {
    let file = write_list(opts, n)?;
    let settings = list_settings(&file);
    let (matcher, build_s, rss_rise_bytes) = built(|| Ok(Matcher::new(&settings)?))?;
    let _ = std::fs::remove_file(&file);
    // Every tenth post is a list text (an exact match), spread over the list.
    let listed: Vec<String> = distinct_texts(n, WORDS, 0x11575)
        .step_by((n / 1000).max(1))
        .collect();
    let mut texts = post_texts(opts);
    for (i, text) in texts.iter_mut().enumerate().filter(|(i, _)| i % 10 == 0) {
        *text = listed[(i / 10) % listed.len()].clone();
    }
    Ok(inspected(
        Held::ListItems,
        n,
        matcher,
        build_s,
        rss_rise_bytes,
        &texts,
    ))
}

fn waves_point(opts: &BenchOptions, n: usize) -> anyhow::Result<MatcherCurveRow> {
    let settings = MatchingSettings {
        waves: true,
        max_clusters: n.max(MatchingSettings::default().max_clusters),
        ..MatchingSettings::default()
    };
    let fill: Vec<String> = distinct_texts(n, WORDS, 0xC105).collect();
    let (matcher, build_s, rss_rise_bytes) = built(|| {
        let mut matcher = Matcher::new(&settings)?;
        inspect_all(&mut matcher, &fill);
        Ok(matcher)
    })?;
    Ok(inspected(
        Held::WaveClusters,
        n,
        matcher,
        build_s,
        rss_rise_bytes,
        &post_texts(opts),
    ))
}

/// The bench's generated posts' texts (`--events` of them).
fn post_texts(opts: &BenchOptions) -> Vec<String> {
    (opts.variant.events(opts.events, "mc-").into_iter())
        .map(|e| e.text.unwrap_or_default())
        .collect()
}

/// Builds the matcher: the seconds it took and the peak RSS's rise.
fn built(build: impl FnOnce() -> anyhow::Result<Matcher>) -> anyhow::Result<(Matcher, f64, u64)> {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = super::process::rss_bytes();
    let started = Instant::now();
    let matcher = build()?;
    let build_s = started.elapsed().as_secs_f64();
    let rise = super::process::peak_rss_bytes().saturating_sub(before);
    Ok((matcher, build_s, rise))
}

fn inspected(
    held: Held,
    n: usize,
    mut matcher: Matcher,
    build_s: f64,
    rss_rise_bytes: u64,
    texts: &[String],
) -> MatcherCurveRow {
    let bytes = matcher.bytes();
    let started = Instant::now();
    let matched = inspect_all(&mut matcher, texts);
    MatcherCurveRow {
        held,
        at: n as u64,
        build_s,
        bytes,
        rss_rise_bytes,
        events: texts.len(),
        matcher_us: started.elapsed().as_secs_f64() * 1e6 / texts.len().max(1) as f64,
        matched_share: matched as f64 / texts.len().max(1) as f64,
    }
}

/// Inspects every text in turn, each from its own user, all at one instant;
/// how many a list item matched.
fn inspect_all(matcher: &mut Matcher, texts: &[String]) -> usize {
    let now = tokio::time::Instant::now();
    let mut matched = 0;
    for (offset, text) in texts.iter().enumerate() {
        let source = modstream::tp::Source {
            tp: modstream::tp::Tp::new("m", 0),
            offset: offset as i64,
        };
        let user = format!("u{offset}");
        let post = modstream::matching::Post {
            event_id: "e",
            text,
            user: Some(&user),
            source: &source,
            rule_lists: None,
        };
        let inspection = std::hint::black_box(matcher.inspect(&post, now));
        matched += usize::from(inspection.marks.is_some_and(|m| m.matched.is_some()));
    }
    matched
}
