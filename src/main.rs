//! The `modstream` binary: parses the command line and calls the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use modstream::config::{ExecutionProvider, InferenceSettings, Settings, TelemetrySettings};
use modstream::inference::Model;
use modstream::shutdown::Shutdown;
use modstream::telemetry::Health;
use modstream::tools::generator::{Mix, generate_mix};
use modstream::tools::{demo, send};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "modstream",
    version,
    about = "Content moderation at stream scale: Kafka in, ONNX model, verdicts out"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Join the consumer group and moderate events until SIGINT/SIGTERM.
    Run {
        /// Configuration file (default: config/modstream.toml if present).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print the effective configuration (secrets redacted) and exit.
        #[arg(long)]
        print_config: bool,
        /// Judge the backlog and stop: once the group has committed every
        /// input partition through the end offset it had at the start,
        /// drain, commit, print the summary and exit 0 (a backfill, a
        /// one-off rescoring).
        #[arg(long)]
        until_caught_up: bool,
    },
    /// Load a model, print its inputs and outputs, and score the given texts.
    CheckModel {
        /// The model directory: model.onnx and manifest.json (relative paths
        /// are looked for here, then in the repository this binary was built
        /// in).
        #[arg(long, default_value = "models/profanity-check")]
        model: PathBuf,
        /// Execution providers in order of preference (cuda, tensorrt,
        /// cpu); the placement of the model's nodes on them is printed.
        #[arg(long, value_delimiter = ',', default_value = "cpu")]
        providers: Vec<ExecutionProvider>,
        /// The GPU to use (CUDA device number).
        #[arg(long, default_value_t = 0)]
        device_id: i32,
        /// Fail unless a GPU provider can be used.
        #[arg(long)]
        require_gpu: bool,
        /// Texts to score, one argument each (quote each text).
        texts: Vec<String>,
    },
    /// Produce generated posts (benign, abusive, urgent, 1 % malformed) to a topic.
    Produce {
        #[arg(
            long,
            env = "MODSTREAM__KAFKA__BOOTSTRAP_SERVERS",
            default_value = "127.0.0.1:9092"
        )]
        bootstrap: String,
        #[arg(long, default_value = "moderation.events")]
        topic: String,
        /// Events to send.
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        /// Events per second (0: as fast as possible).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Keep going: send `count` events again and again.
        #[arg(long)]
        forever: bool,
        /// Fraction of posts written from the abusive samples.
        #[arg(long, default_value_t = 0.2)]
        abusive_share: f64,
        /// Fraction of posts marked urgent (they skip the batching deadline).
        #[arg(long, default_value_t = 0.05)]
        urgent_share: f64,
        /// Every n-th record is malformed (0: none).
        #[arg(long, default_value_t = 100)]
        malformed_every: usize,
    },
    /// Measure throughput and latency against the raw model (hands over to
    /// `modstream-bench`, built beside this binary).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Judge a range of an input topic again into another topic (its own
    /// consumer; the live group's offsets are not touched).
    Rescore {
        #[command(flatten)]
        options: modstream::tools::rescore::RescoreOptions,
    },
    /// Create the topics the configuration names (inputs, verdicts, dead
    /// letters, analytics, routes, changelog, lists), each with the
    /// settings it needs; says which already exist.
    Topics {
        #[command(subcommand)]
        action: TopicsAction,
    },
    /// Find an event in a topic and show how the current policy and models
    /// judge it, and why.
    Explain {
        #[command(flatten)]
        options: modstream::tools::explain::ExplainOptions,
    },
    /// How much of the stream violates each label (95 % intervals), and
    /// the policy's precision and recall, from the samples
    /// (`output.samples_topic`) and the labels people gave them.
    Prevalence {
        #[command(flatten)]
        options: modstream::tools::prevalence::PrevalenceOptions,
    },
    /// A manifest.json for a model directory (model.onnx, and for a
    /// transformer tokenizer.json and config.json), from the graph's inputs
    /// and config.json; says every default it took.
    InitModel {
        #[command(flatten)]
        options: modstream::tools::init_model::InitModelOptions,
    },
    /// A text's normal form, as known-bad lists and waves match it, and its
    /// hash (a list item's `hash`).
    Normalize {
        /// The text (one argument; quote it).
        text: String,
    },
    /// How many instances and partitions for a rate at a p99, from a bench
    /// report of your own hardware (`modstream bench`).
    Plan {
        #[command(flatten)]
        options: modstream::tools::plan::PlanOptions,
    },
    /// Run the pipeline on an embedded Kafka cluster with generated posts.
    Demo {
        /// Events to produce (all at once; without --rate).
        #[arg(long, default_value_t = 5000)]
        events: usize,
        /// Give up waiting for verdicts after this many seconds.
        #[arg(long, default_value_t = 120)]
        max_seconds: u64,
        /// The model directory (default: models/profanity-check).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Paced mode: send this many events per second (with /metrics served).
        #[arg(long)]
        rate: Option<f64>,
        /// Paced mode: for this many seconds (default: until Ctrl-C).
        #[arg(long, requires = "rate")]
        seconds: Option<u64>,
        /// Paced mode: where /metrics, /healthz and /readyz are served.
        #[arg(long, default_value = "127.0.0.1:9464")]
        listen: std::net::SocketAddr,
    },
}

#[derive(Subcommand)]
enum TopicsAction {
    /// Create what is missing (or, with --dry-run, print the kafka-topics.sh lines).
    Create {
        #[command(flatten)]
        options: modstream::tools::topics::TopicsOptions,
    },
}

// Long: one match arm per subcommand, each only hands its arguments on.
fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            config,
            print_config,
            until_caught_up,
        } => run(config, print_config, until_caught_up),
        Command::CheckModel {
            model,
            providers,
            device_id,
            require_gpu,
            texts,
        } => check_model(
            InferenceSettings {
                model_dir: modstream::tools::beside_the_binary(&model),
                execution_providers: providers,
                device_id,
                require_gpu,
                ..Default::default()
            },
            texts,
        ),
        Command::Produce {
            bootstrap,
            topic,
            count,
            rate,
            forever,
            abusive_share,
            urgent_share,
            malformed_every,
        } => produce(
            bootstrap,
            topic,
            count,
            rate,
            forever,
            Mix {
                malformed_every,
                abusive_share,
                urgent_share,
                repeat_share: None,
                lengths: Default::default(),
            },
        ),
        Command::Bench { args } => forward_to_bench(args),
        Command::Plan { options } => modstream::tools::plan::run(&options),
        Command::Rescore { options } => rescore(options),
        Command::Explain { options } => explain(&options),
        Command::Topics {
            action: TopicsAction::Create { options },
        } => topics_create(&options),
        Command::Prevalence { options } => prevalence(&options),
        Command::Normalize { text } => {
            let normal = modstream::matching::normalize::normalize(&text);
            let hash = modstream::matching::normalize::text_hash(&normal);
            println!("normal form  {normal}\nhash         {hash:016x}");
            Ok(())
        }
        Command::InitModel { options } => {
            modstream::telemetry::init_logging(&TelemetrySettings {
                log_level: "warn".into(),
                ..Default::default()
            });
            modstream::tools::init_model::run(&options)
                .map(|out| print!("{out}"))
                .map_err(Into::into)
        }
        Command::Demo {
            rate: Some(rate),
            seconds,
            listen,
            model,
            ..
        } => demo_paced(demo::PacedOptions {
            rate,
            seconds,
            listen,
            model_dir: model,
        }),
        Command::Demo {
            events,
            max_seconds,
            model,
            rate: None,
            ..
        } => demo(events, max_seconds, model),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("modstream: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn run(config: Option<PathBuf>, print_config: bool, until_caught_up: bool) -> anyhow::Result<()> {
    let settings = Settings::load(config.as_deref())?;
    if print_config {
        println!("{}", settings.redacted_dump());
        return Ok(());
    }
    modstream::telemetry::init_logging(&settings.telemetry);
    let metrics = modstream::telemetry::install_recorder()?;
    modstream::pipeline::register_zeroes(&settings);
    runtime()?.block_on(async {
        // A wrong policy or model is the error a start reports, whatever
        // else (a taken port) would fail after it.
        let loaded = modstream::pipeline::load(&settings)?;
        let health = Arc::new(Health::default());
        let stop_listener = CancellationToken::new();
        let listener = modstream::telemetry::serve(
            settings.telemetry.listen,
            metrics,
            health.clone(),
            stop_listener.clone(),
        )
        .await?;
        let shutdown = Shutdown::new();
        shutdown.listen_for_signals();
        let watch = until_caught_up.then(|| {
            modstream::pipeline::caught_up::stop_when_caught_up(&settings, shutdown.stop.clone())
        });
        let stop = shutdown.stop.clone();
        let result = modstream::pipeline::run_loaded(settings, loaded, shutdown, health).await;
        stop.cancel();
        if let Some(watch) = watch {
            let _ = watch.await;
        }
        stop_listener.cancel();
        let _ = listener.await;
        let summary = result?;
        if until_caught_up {
            println!(
                "caught up: consumed {}, verdicts {}, dead letters {}, committed",
                summary.consumed, summary.verdicts, summary.dlq
            );
        }
        Ok(())
    })
}

fn check_model(settings: InferenceSettings, mut texts: Vec<String>) -> anyhow::Result<()> {
    modstream::telemetry::init_logging(&TelemetrySettings {
        log_level: "warn".into(),
        ..Default::default()
    });
    let mut model = Model::load_profiled(&settings, modstream::inference::Profile::Always)?;
    let m = &model.manifest;
    println!(
        "model {} {} ({})",
        m.name,
        m.version,
        settings.model_dir.display()
    );
    for line in model.describe() {
        println!("  {line}");
    }
    println!(
        "  labels {:?}, activation {:?}, verdict from {:?}",
        m.labels, m.activation, m.score_label
    );
    println!("  provider {}", model.provider);
    for note in &m.notes {
        println!("  from config.json: {note}");
    }
    let labels = m.labels.clone();
    match model.warm_up(modstream::inference::RunLimit::posts(32)) {
        Ok(took) => println!("  warm-up {:.0} ms", took.as_secs_f64() * 1000.0),
        Err(e) => println!("  warm-up failed (synthetic inputs): {e}"),
    }
    print_placement(&mut model);
    let scores = model.score(&mut texts)?;
    let scorer =
        modstream::verdict::Scorer::new(&model.manifest, &modstream::config::Policy::default())?;
    for (text, s) in texts.iter().zip(scores) {
        let verdict = scorer.decide(&s);
        let pairs: Vec<String> = labels
            .iter()
            .zip(&s)
            .map(|(l, p)| format!("{l}={p:.3}"))
            .collect();
        println!("{verdict:<6} {}  {text}", pairs.join(" "));
    }
    Ok(())
}

/// Where the model's nodes ran in its warm-up, per provider, and those
/// off the session's provider.
fn print_placement(model: &mut Model) {
    use modstream::inference::placement;
    match model.placement() {
        Some(Ok(p)) => {
            println!("  placement (node runs of the warm-up by provider and op type):");
            for line in p.lines() {
                println!("    {line}");
            }
            let off = p.off_provider(model.provider);
            if !off.is_empty() {
                let int8 = off
                    .iter()
                    .any(|(op, _)| placement::INT8_OPS.contains(&op.as_str()));
                println!(
                    "  warning: {} runs some nodes on the CPU (copies on every run){}",
                    model.provider,
                    if int8 {
                        "; an int8 model: use the fp32 or fp16 model on a GPU"
                    } else {
                        ""
                    }
                );
            }
        }
        Some(Err(e)) => println!("  placement unknown: {e}"),
        None => {}
    }
}

fn produce(
    bootstrap: String,
    topic: String,
    count: usize,
    rate: u64,
    forever: bool,
    mix: Mix,
) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    anyhow::ensure!(
        (0.0..=1.0).contains(&mix.abusive_share) && (0.0..=1.0).contains(&mix.urgent_share),
        "--abusive-share and --urgent-share are fractions between 0 and 1"
    );
    let progress = std::io::stderr().is_terminal();
    runtime()?.block_on(async {
        let producer = send::event_producer(&bootstrap)?;
        let mut round = 0u64;
        loop {
            let events = generate_mix(count, &mix, &format!("gen-{}-{round}-", std::process::id()));
            let schedule = send::Schedule {
                start: std::time::Instant::now(),
                rate: rate as f64,
                // Paced: each record carries its intended send time.
                stamp_from_ms: Some(chrono::Utc::now().timestamp_millis()),
            };
            let started = schedule.start;
            let mut shown = started;
            // Open loop: send on schedule; acknowledgements are awaited at the end.
            let pending = send::send_paced(&producer, &topic, &events, schedule, |sent| {
                if progress && shown.elapsed() >= Duration::from_millis(500) {
                    shown = std::time::Instant::now();
                    eprint!(
                        "\r{sent}/{} sent ({:.0}/s) ",
                        events.len(),
                        sent as f64 / started.elapsed().as_secs_f64()
                    );
                }
            })
            .await?;
            if progress {
                eprint!("\r");
            }
            send::await_deliveries(pending).await?;
            let secs = started.elapsed().as_secs_f64();
            eprintln!(
                "produced {} events to {topic} in {secs:.1}s ({:.0}/s)",
                events.len(),
                events.len() as f64 / secs
            );
            round += 1;
            if !forever {
                return Ok(());
            }
        }
    })
}

/// `modstream bench`: the bench is its own binary (it links the chart
/// library, which the service does not need); this one only hands over.
fn forward_to_bench(args: Vec<std::ffi::OsString>) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("finding this binary")?;
    let bench = exe.with_file_name(format!("modstream-bench{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        bench.is_file(),
        "{} not found; build it with `cargo build --release -p modstream-bench`",
        bench.display()
    );
    // exec only returns on failure.
    let error = std::process::Command::new(&bench).args(args).exec();
    Err(error).with_context(|| format!("starting {}", bench.display()))
}

fn rescore(opts: modstream::tools::rescore::RescoreOptions) -> anyhow::Result<()> {
    modstream::telemetry::init_logging(&TelemetrySettings {
        log_level: "warn".into(),
        ..Default::default()
    });
    let json = opts.json;
    let report = runtime()?.block_on(modstream::tools::rescore::run(opts))?;
    if json {
        use std::io::Write;
        writeln!(
            std::io::stdout(),
            "{}",
            serde_json::to_string_pretty(&report)?
        )?;
    } else {
        report.print();
    }
    Ok(())
}

fn prevalence(opts: &modstream::tools::prevalence::PrevalenceOptions) -> anyhow::Result<()> {
    modstream::telemetry::init_logging(&TelemetrySettings {
        log_level: "warn".into(),
        ..Default::default()
    });
    print!("{}", modstream::tools::prevalence::run(opts)?);
    Ok(())
}

fn explain(opts: &modstream::tools::explain::ExplainOptions) -> anyhow::Result<()> {
    modstream::telemetry::init_logging(&TelemetrySettings {
        log_level: "warn".into(),
        ..Default::default()
    });
    print!("{}", modstream::tools::explain::run(opts)?);
    Ok(())
}

fn topics_create(opts: &modstream::tools::topics::TopicsOptions) -> anyhow::Result<()> {
    modstream::telemetry::init_logging(&TelemetrySettings {
        log_level: "warn".into(),
        ..Default::default()
    });
    let settings = Settings::load(opts.config.as_deref())?;
    let text = if opts.dry_run {
        modstream::tools::topics::dry_run(&settings, opts)?
    } else {
        runtime()?.block_on(modstream::tools::topics::create(&settings, opts))?
    };
    print!("{text}");
    Ok(())
}

fn demo_paced(opts: demo::PacedOptions) -> anyhow::Result<()> {
    modstream::telemetry::init_logging(&TelemetrySettings {
        log_level: "warn".into(),
        ..Default::default()
    });
    runtime()?.block_on(demo::run_paced(opts))
}

fn demo(events: usize, max_seconds: u64, model: Option<PathBuf>) -> anyhow::Result<()> {
    modstream::telemetry::init_logging(&TelemetrySettings {
        log_level: "warn".into(),
        ..Default::default()
    });
    runtime()?.block_on(demo::run(demo::DemoOptions {
        events,
        max_duration: Duration::from_secs(max_seconds),
        model_dir: model,
    }))
}
