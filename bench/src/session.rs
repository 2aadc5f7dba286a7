//! The session-options sweep (`--session-sweep`): the configured model in
//! `modstream run` at its default configuration and with one session
//! option changed each time, each its own process on the same events
//! (verdicts/s, CPU seconds per million verdicts, peak RSS: read as the
//! Python baseline's); beside each, in this process with the same
//! settings, the time to load one session (median of 3) and the CPU a
//! session burns at a light load (a batch of 2 posts every 50 ms for 3 s,
//! CPU seconds per second; where spinning shows). For a token model also
//! what tokenizing costs beside scoring, one thread: the share that says
//! whether tokenization should move off the inference threads.

use std::time::{Duration, Instant};

use super::BenchOptions;
use super::baseline;
use super::measure;
use super::process::cpu_time_of;
use crate::print::Print;
use modstream::config::{
    GraphOptimization, InferenceSettings, MemoryArena, SessionOptions, Workers,
};
use modstream::inference::Model;
use modstream::inference::manifest::{InputKind, Manifest};
use modstream::inference::tokens::Encoder;
use modstream::tools::generator::{GeneratedEvent, generate};
use modstream::tools::report::{SessionRow, TokenizationRow};

/// A contender of the sweep.
struct Contender {
    name: &'static str,
    /// Workers and intra-op threads (None: the default, `workers = "auto"`
    /// with one thread each).
    layout: Option<(usize, usize)>,
    session: SessionOptions,
}

fn contenders() -> Vec<Contender> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let default = SessionOptions::default();
    let with = |f: &dyn Fn(&mut SessionOptions)| {
        let mut o = default.clone();
        f(&mut o);
        o
    };
    let c = |name, layout, session| Contender {
        name,
        layout,
        session,
    };
    vec![
        c("default", None, default.clone()),
        c("spinning", None, with(&|o| o.spinning = true)),
        c(
            "1 worker × all cores, spinning",
            Some((1, cores)),
            with(&|o| o.spinning = true),
        ),
        c(
            "1 worker × all cores, no spinning",
            Some((1, cores)),
            with(&|o| o.spinning = false),
        ),
        c(
            "graph optimization basic",
            None,
            with(&|o| o.graph_optimization = GraphOptimization::Basic),
        ),
        c(
            "graph optimization disabled",
            None,
            with(&|o| o.graph_optimization = GraphOptimization::Disabled),
        ),
        c(
            "memory arena on",
            None,
            with(&|o| o.memory_arena = MemoryArena::On),
        ),
        c(
            "memory arena off",
            None,
            with(&|o| o.memory_arena = MemoryArena::Off),
        ),
        // Again at the end: the first process of a sweep may pay for a cold
        // start that the others do not.
        c("default, again", None, default.clone()),
    ]
}

pub async fn rows(opts: &BenchOptions) -> anyhow::Result<Vec<SessionRow>> {
    if !opts.session_sweep {
        return Ok(Vec::new());
    }
    let events = generate(opts.events, 0, "o-");
    let model_dir = std::path::absolute(measure::inference_settings(opts).model_dir)?;
    let mut rows = Vec::new();
    for Contender {
        name,
        layout,
        session,
    } in contenders()
    {
        let mut extra = String::new();
        if let Some((workers, threads)) = layout {
            extra.push_str(&format!("workers = {workers}\nintra_threads = {threads}\n"));
        }
        extra.push_str(&format!(
            "[inference.session]\ngraph_optimization = {:?}\nspinning = {}\nmemory_arena = {:?}\n",
            session.graph_optimization.name(),
            session.spinning,
            session.memory_arena.name()
        ));
        let run = baseline::modstream(opts, &events, &model_dir, &extra).await?;
        let settings = InferenceSettings {
            session,
            intra_threads: layout.map_or(1, |(_, t)| t),
            workers: Workers::Count(1),
            ..measure::inference_settings(opts)
        };
        let (load_ms, light_load_cores) = in_process(&settings, &events)?;
        let row = SessionRow {
            contender: name.to_string(),
            events: events.len(),
            per_s: run.per_s,
            cpu_s_per_million: run.cpu_s_per_million(),
            peak_rss_bytes: run.peak_rss_bytes,
            load_ms,
            light_load_cores,
        };
        row.print();
        rows.push(row);
    }
    Ok(rows)
}

/// One session's load time (median of 3) and its CPU seconds per second
/// at a light load.
fn in_process(
    settings: &InferenceSettings,
    events: &[GeneratedEvent],
) -> anyhow::Result<(f64, f64)> {
    let mut loads = Vec::new();
    let mut model = None;
    for _ in 0..3 {
        let started = Instant::now();
        model = Some(Model::load(settings)?);
        loads.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let mut model = model.ok_or_else(|| anyhow::anyhow!("no session loaded"))?;
    let texts: Vec<String> = events
        .iter()
        .filter_map(|e| e.text.clone())
        .take(400)
        .collect();
    let mut batches = texts.chunks(2).cycle();
    model.score(&mut batches.next().unwrap_or_default().to_vec())?;
    let before = cpu_time_of("self").unwrap_or_default();
    let started = Instant::now();
    let mut next = started;
    while started.elapsed() < Duration::from_secs(3) {
        model.score(&mut batches.next().unwrap_or_default().to_vec())?;
        next += Duration::from_millis(50);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let spent = cpu_time_of("self").unwrap_or_default().since(&before);
    let load_ms = modstream::tools::stats::median(&loads).unwrap_or_default();
    Ok((load_ms, spent.total_s / started.elapsed().as_secs_f64()))
}

/// A token model: microseconds per post to tokenize (the model's own
/// tokenizer, one thread) and to score (tokenizing included: one session,
/// one thread, batches of 32); None for a text model or without the sweep.
pub fn tokenization(opts: &BenchOptions) -> anyhow::Result<Option<TokenizationRow>> {
    let settings = InferenceSettings {
        intra_threads: 1,
        workers: Workers::Count(1),
        ..measure::inference_settings(opts)
    };
    let manifest = Manifest::load(&settings.model_dir)?;
    if !opts.session_sweep || manifest.input_kind != InputKind::Tokens {
        return Ok(None);
    }
    let texts: Vec<String> = generate(opts.events, 0, "t-")
        .into_iter()
        .filter_map(|e| e.text)
        .collect();
    let file = manifest.tokenizer.as_deref().unwrap_or("tokenizer.json");
    let encoder = Encoder::load(
        &settings.model_dir.join(file),
        manifest.max_length.unwrap_or(512),
    )?;
    let started = Instant::now();
    for t in &texts {
        std::hint::black_box(encoder.encode(t)?);
    }
    let tokenize_us = started.elapsed().as_secs_f64() * 1e6 / texts.len().max(1) as f64;
    let mut model = Model::load(&settings)?;
    let (per_s, _) = measure::raw_model_throughput(&mut model, &texts, 32)?;
    let row = TokenizationRow {
        posts: texts.len(),
        tokenize_us,
        score_us: 1e6 / per_s,
    };
    eprintln!(
        "tokenizing {:.1} µs per post, {:.1} % of scoring it ({:.0} µs)",
        row.tokenize_us,
        row.tokenize_us / row.score_us * 100.0,
        row.score_us
    );
    Ok(Some(row))
}
