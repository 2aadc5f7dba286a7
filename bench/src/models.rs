//! The model sweep (`--second-model DIR`): the same events judged by the
//! configured model alone, then by it and a second model (a copy of the
//! first, to see what a second lane costs; then DIR) on every event, then by
//! both with DIR scoring a quarter of the events (the rule of one tenant),
//! each at saturation and at half of it, the same way. Each model gets
//! `--workers` workers.

use std::path::Path;

use super::BenchOptions;
use super::formats::{Encoding, ModelSetup, SECOND_MODEL_TENANT};
use super::measure::{self, Batching, Clock};
use crate::print::Print;
use modstream::config::{ModelSettings, Workers};
use modstream::tools::generator::generate;
use modstream::tools::report::ModelRow;

/// A policy over `first` and `second`: the first judges every event; the
/// second, with the same thresholds, those of the tenant (or every event).
fn policy(every_event: bool) -> String {
    let when = if every_event {
        String::new()
    } else {
        format!("when = {{ tenant = \"{SECOND_MODEL_TENANT}\" }}\n")
    };
    let second = "models.first.offensive = { review_at = 0.5, block_at = 0.85 }\nmodels.second.offensive = { review_at = 0.5, block_at = 0.85 }\n";
    let default = "[[rules]]\nid = \"default\"\nmodels.first.offensive = { review_at = 0.5, block_at = 0.85 }\n";
    if every_event {
        format!("version = \"bench\"\n[[rules]]\nid = \"both\"\n{second}")
    } else {
        format!("version = \"bench\"\n[[rules]]\nid = \"both\"\n{when}{second}{default}")
    }
}

/// A model of a several-models contender: `--workers` workers, the rest
/// from `[inference]`.
pub(super) fn lane(opts: &BenchOptions, name: &str, dir: &Path) -> ModelSettings {
    ModelSettings {
        name: name.to_string(),
        model_dir: dir.to_path_buf(),
        workers: Some(Workers::Count(opts.workers.max(1))),
        intra_threads: None,
        max_batch_size: None,
        cache_bytes: None,
    }
}

fn setup(opts: &BenchOptions, second: &Path, every: usize, dir: &Path) -> anyhow::Result<Encoding> {
    let first = measure::inference_settings(opts).model_dir;
    let model = |name: &str, dir: &Path| lane(opts, name, dir);
    let path = dir.join(format!("policy-every-{every}.toml"));
    std::fs::write(&path, policy(every == 1))?;
    Ok(Encoding::with_models(ModelSetup {
        models: vec![model("first", &first), model("second", second)],
        policy: path,
        tenant_every: every,
    }))
}

pub async fn rows(opts: &BenchOptions) -> anyhow::Result<Vec<ModelRow>> {
    let Some(second) = &opts.second_model else {
        return Ok(Vec::new());
    };
    std::fs::create_dir_all(&opts.out_dir)?;
    let first = measure::inference_settings(opts).model_dir;
    let name = |p: &Path| {
        p.file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned())
    };
    let contenders = [
        (name(&first), None, 0.0),
        (
            format!("{} + a copy of it", name(&first)),
            Some((first.clone(), 1)),
            1.0,
        ),
        (
            format!("{} + {}", name(&first), name(second)),
            Some((second.clone(), 1)),
            1.0,
        ),
        (
            format!("{} + {}", name(&first), name(second)),
            Some((second.clone(), 4)),
            0.25,
        ),
    ];
    let cell = Batching::fixed(64, 20);
    let mut rows = Vec::new();
    for (contender, models, share) in contenders {
        let encoding = match &models {
            None => Encoding::default(),
            Some((dir, every)) => setup(opts, dir, *every, &opts.out_dir)?,
        };
        let o = opts.with_encoding(encoding.clone());
        let events = encoding.apply(generate(opts.events, 0, "m-"));
        let measure::Saturated { per_s, summary, .. } =
            measure::saturation_clocked(&o, cell, events, Clock::Verdicts).await?;
        anyhow::ensure!(
            summary.dlq == 0,
            "{contender}: {} dead letters",
            summary.dlq
        );
        let latency = measure::latency(&o, cell, 0.5, per_s * 0.5).await?;
        let row = ModelRow {
            contender,
            second_share: share,
            saturation_per_s: per_s,
            p50_ms: latency.p50_ms,
            p99_ms: latency.p99_ms,
            model_us_per_verdict: summary.inference_seconds * 1e6 / summary.verdicts.max(1) as f64,
        };
        row.print();
        rows.push(row);
    }
    Ok(rows)
}
