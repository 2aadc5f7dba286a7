//! The `modstream-bench` binary (also reached as `modstream bench`): parses
//! the command line and runs the bench, or only redraws from a saved report.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use modstream::config::TelemetrySettings;
use modstream_bench::BenchOptions;

/// Measure throughput and latency (embedded cluster or --bootstrap), against the raw model.
#[derive(Parser)]
#[command(name = "modstream bench", bin_name = "modstream bench", version)]
struct Cli {
    #[command(flatten)]
    options: Box<BenchOptions>,
    /// Only redraw the charts and bench.md from this saved bench.json.
    #[arg(long)]
    replot: Option<PathBuf>,
    /// Only rewrite the generated table blocks of this markdown file
    /// (docs/benchmarks.md) from the bench.json files they name.
    #[arg(long, conflicts_with = "replot")]
    update_docs: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match (cli.replot, cli.update_docs) {
        (Some(report), _) => {
            modstream_bench::replot(&report).map(|svg| println!("{}", svg.display()))
        }
        (None, Some(doc)) => modstream_bench::update_docs(&doc),
        (None, None) => bench(*cli.options),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn bench(opts: BenchOptions) -> anyhow::Result<()> {
    modstream::telemetry::init_logging(&TelemetrySettings {
        log_level: "warn".into(),
        ..Default::default()
    });
    anyhow::ensure!(
        !opts.batch_sizes.is_empty() && !opts.delays_ms.is_empty(),
        "give at least one batch size and one delay"
    );
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(modstream_bench::run(opts))?;
    Ok(())
}
