//! Cost curves as the work grows (`--partition-counts`, `--tenant-counts`,
//! `--post-bytes`, `--list-items`): at each point `modstream run` at its default
//! configuration with the configured model, its own process, on the same
//! number of events (verdicts/s, CPU per verdict, peak RSS), then the
//! pipeline in this process paced at half that rate (p99).

use super::BenchOptions;
use super::baseline;
use super::measure::{self, Batching, inference_settings};
use super::options::Variant;
use modstream::tools::generator::Lengths;
use modstream::tools::report::{Curve, CurveRow};

pub(super) async fn rows(opts: &BenchOptions) -> anyhow::Result<Vec<CurveRow>> {
    let mut rows = Vec::new();
    for &p in &opts.partition_counts {
        let row = point(opts, Curve::Partitions, p as u64, |v| {
            v.partitions = Some(p);
        })
        .await?;
        rows.push(row);
    }
    for &n in &opts.tenant_counts {
        let policy = tenant_policy(opts, n)?;
        let row = point(opts, Curve::Tenants, n as u64, |v| {
            v.tenants = n;
            v.policy = Some(policy.clone());
        })
        .await;
        let _ = std::fs::remove_file(&policy);
        rows.push(row?);
    }
    for &n in &opts.list_items {
        let file = super::matcher_curves::write_list(opts, n)?;
        let matching = format!(
            "[matching]\nmax_bytes = {}\nlists = [{{ name = \"spam\", file = {:?}, mode = \"decide\" }}]\n",
            usize::MAX / 2,
            file.display().to_string()
        );
        let settings = super::matcher_curves::list_settings(&file);
        let vary = |v: &mut Variant| v.matching = Some(settings);
        let row = point_with(opts, Curve::ListItems, n as u64, vary, &matching).await;
        let _ = std::fs::remove_file(&file);
        rows.push(row?);
    }
    for &bytes in &opts.post_bytes {
        let row = point(opts, Curve::PostBytes, bytes as u64, |v| {
            v.lengths = Lengths::Bytes(bytes);
        })
        .await?;
        rows.push(row);
    }
    Ok(rows)
}

async fn point(
    opts: &BenchOptions,
    curve: Curve,
    at: u64,
    vary: impl FnOnce(&mut Variant),
) -> anyhow::Result<CurveRow> {
    point_with(opts, curve, at, vary, "").await
}

/// A point whose `modstream run` also gets `extra` configuration (the
/// `[matching]` the variant's pipeline gets as settings).
async fn point_with(
    opts: &BenchOptions,
    curve: Curve,
    at: u64,
    vary: impl FnOnce(&mut Variant),
    extra: &str,
) -> anyhow::Result<CurveRow> {
    let mut o = opts.clone();
    vary(&mut o.variant);
    let events = o.variant.events(opts.events, "c-");
    let model_dir = std::path::absolute(inference_settings(&o).model_dir)?;
    let mut policy = (o.variant.policy.as_ref()).map_or(String::new(), |p| {
        format!("[policy]\nfile = {:?}\n", p.display().to_string())
    });
    policy.push_str(extra);
    let run = baseline::modstream(&o, &events, &model_dir, &policy).await?;
    let half = measure::latency(&o, Batching::fixed(64, 20), 0.5, run.per_s * 0.5).await?;
    let row = CurveRow {
        curve,
        at,
        events: events.len(),
        per_s: run.per_s,
        cpu_us_per_verdict: run.cpu_s_per_million(),
        peak_rss_bytes: run.peak_rss_bytes,
        p99_at_half_ms: half.p99_ms,
        verdict_partitions: (opts.verdict_partitions > 0).then_some(opts.verdict_partitions),
        mean_tokens: mean_tokens(&model_dir, &events)?,
    };
    println!(
        "curve {:?} at {at}: {:.0}/s, CPU {:?} µs per verdict, p99 at half {:.1} ms",
        curve, row.per_s, row.cpu_us_per_verdict, row.p99_at_half_ms
    );
    Ok(row)
}

/// A policy file of `n` tenant rules (`t0` … ) over the model's score
/// label, and a default rule.
fn tenant_policy(opts: &BenchOptions, n: usize) -> anyhow::Result<std::path::PathBuf> {
    let manifest =
        modstream::inference::manifest::Manifest::load(&inference_settings(opts).model_dir)?;
    let label = &manifest.labels[manifest.score_index()];
    let thresholds = format!("models.default.{label} = {{ review_at = 0.5, block_at = 0.85 }}");
    let mut policy = String::from("version = \"bench-tenants\"\n");
    for i in 0..n {
        policy.push_str(&format!(
            "[[rules]]\nid = \"t{i}\"\nwhen = {{ tenant = \"t{i}\" }}\n{thresholds}\n"
        ));
    }
    policy.push_str(&format!("[[rules]]\nid = \"default\"\n{thresholds}\n"));
    let path = std::env::temp_dir().join(format!(
        "modstream-bench-tenants-{n}-{}.toml",
        std::process::id()
    ));
    std::fs::write(&path, policy)?;
    Ok(path)
}

/// With a token model, the mean tokens per post its tokenizer gives.
fn mean_tokens(
    model_dir: &std::path::Path,
    events: &[modstream::tools::generator::GeneratedEvent],
) -> anyhow::Result<Option<f64>> {
    use modstream::inference::manifest::{InputKind, Manifest};
    let manifest = Manifest::load(model_dir)?;
    if manifest.input_kind != InputKind::Tokens {
        return Ok(None);
    }
    let file = manifest.tokenizer.as_deref().unwrap_or("tokenizer.json");
    let encoder = modstream::inference::tokens::Encoder::load(
        &model_dir.join(file),
        manifest.max_length.unwrap_or(512),
    )?;
    let texts: Vec<&str> = events.iter().filter_map(|e| e.text.as_deref()).collect();
    let mut tokens = 0usize;
    for t in &texts {
        tokens += encoder.encode(t)?.ids.len();
    }
    Ok(Some(tokens as f64 / texts.len().max(1) as f64))
}
