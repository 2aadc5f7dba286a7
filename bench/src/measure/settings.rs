//! The configuration of the pipeline under test: the batching a cell
//! runs at, the in-process runs' settings, and the same as TOML for a
//! `modstream run` of its own.

use std::time::Duration;

use super::super::BenchOptions;
use super::super::cell::Cell;
use modstream::config::InferenceSettings;

/// One batching configuration: fixed, or a latency target with `size` and
/// `delay_ms` as the upper bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Batching {
    pub size: usize,
    pub delay_ms: u64,
    pub target_p99_ms: Option<u64>,
}

impl Batching {
    pub fn fixed(size: usize, delay_ms: u64) -> Batching {
        Batching {
            size,
            delay_ms,
            target_p99_ms: None,
        }
    }

    /// "64 / 20 ms", or "p99 ≤ 50 ms (≤ 128 / 20 ms)".
    pub fn label(&self) -> String {
        match self.target_p99_ms {
            None => format!("{} / {} ms", self.size, self.delay_ms),
            Some(t) => format!("p99 ≤ {t} ms"),
        }
    }
}

pub(super) fn pipeline_settings(
    opts: &BenchOptions,
    cell: &Cell,
    b: Batching,
) -> anyhow::Result<modstream::config::Settings> {
    let mut s = modstream::config::Settings::from_toml(&cell.config(b.size, b.delay_ms))?;
    s.inference = inference_settings(opts);
    s.batching.target_p99 = b.target_p99_ms.map(Duration::from_millis);
    s.limits.max_in_flight = s.limits.max_in_flight.max(b.size * 4);
    if opts.variant.exactly_once {
        s.kafka.delivery = modstream::config::DeliveryMode::ExactlyOnce;
        s.kafka.instance_id = Some("bench".to_string());
    }
    if let Some(ms) = opts.variant.commit_interval_ms {
        s.kafka.commit_interval = Duration::from_millis(ms);
    }
    opts.variant.encoding.configure(&mut s);
    if let Some(m) = &opts.variant.matching {
        s.matching = m.clone();
    }
    s.batching.max_batch_tokens = opts.variant.max_batch_tokens;
    if let Some(policy) = &opts.variant.policy {
        s.policy.file = Some(policy.clone());
    }
    if opts.variant.sampling {
        s.output.samples_topic = Some(cell.samples.clone());
    }
    Ok(s)
}

/// The configuration of `modstream run` as its own process for `cell` at
/// `b`: the in-process runs' settings (the cell's Kafka settings, the
/// bench's inference options, the batching) written as TOML.
pub fn service_toml(opts: &BenchOptions, cell: &Cell, b: Batching) -> anyhow::Result<String> {
    let inference = inference_settings(opts);
    let model_dir = std::path::absolute(&inference.model_dir)?;
    // The cell's configuration ends in its [batching] table.
    let target = b
        .target_p99_ms
        .map_or(String::new(), |t| format!("target_p99 = \"{t}ms\""));
    let toml = [
        cell.config(b.size, b.delay_ms),
        target,
        "[inference]".to_string(),
        format!("model_dir = {:?}", model_dir.display().to_string()),
        format!("intra_threads = {}", inference.intra_threads),
        format!("workers = {}", inference.worker_count()),
        format!("cache_bytes = {}", inference.cache_bytes),
        format!(
            "execution_providers = {:?}",
            inference
                .execution_providers
                .iter()
                .map(|p| p.name())
                .collect::<Vec<_>>()
        ),
        format!("require_gpu = {}", inference.require_gpu),
        "[telemetry]".to_string(),
        "listen = \"127.0.0.1:0\"".to_string(),
        "log_level = \"warn\"".to_string(),
    ];
    Ok(toml.join("\n"))
}

pub fn inference_settings(opts: &BenchOptions) -> InferenceSettings {
    let mut inference = InferenceSettings {
        intra_threads: opts.intra_threads,
        workers: modstream::config::Workers::Count(opts.workers.max(1)),
        require_gpu: opts.require_gpu,
        cache_bytes: opts.cache_bytes,
        shadow: modstream::config::ShadowSettings {
            model_dir: opts.shadow_model.clone(),
            share: 1.0,
        },
        ..Default::default()
    };
    if !opts.providers.is_empty() {
        inference.execution_providers = opts.providers.clone();
    }
    if let Some(dir) = &opts.model_dir {
        inference.model_dir = dir.clone();
    }
    inference
}
