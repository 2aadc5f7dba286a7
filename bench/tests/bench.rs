//! `modstream bench` end to end on a tiny load: the report has its fields and
//! its counts match the run (no timing assertions: the machine is shared).
//! The sweeps run in process are in sweeps.rs.

#[path = "../../tests/support/mod.rs"]
mod support;

use modstream_bench::Report;

/// `modstream bench` as a user runs it (the overload run needs the binary).
fn bench_binary(out: &std::path::Path) -> Report {
    // The plain-Python baseline's venv (scripts/test.sh makes it first).
    let python = support::prepared_python("MODSTREAM_BASELINE_PYTHON", "py-baseline");
    let status = std::process::Command::new(support::modstream_binary())
        .current_dir(support::repo_root())
        .args([
            "bench",
            "--events",
            "400",
            "--batch-sizes",
            "1,16",
            "--delays-ms",
            "5",
            "--loads",
            "0.5",
            "--latency-seconds",
            "1",
            "--overload",
            "3",
            "--target-p99-ms",
            "50",
            "--step-seconds",
            "1",
            "--repeat-shares",
            "0,0.5",
            "--python",
            python.to_str().unwrap(),
            "--shadow-model",
            "models/profanity-check",
            "--own-runs",
            "2",
            "--kcat-floor",
            "--out",
        ])
        .arg(out)
        .status()
        .unwrap();
    assert!(status.success());
    written_report(out)
}

/// `modstream bench` on a small cell (400 events, batches of 16, no latency,
/// step, cache or overload runs) with `args` on top; the report it wrote
/// into `out`.
fn small_bench(out: &std::path::Path, args: &[&str]) -> Report {
    let status = std::process::Command::new(support::modstream_binary())
        .current_dir(support::repo_root())
        .args(["bench", "--events", "400", "--batch-sizes", "16"])
        .args(["--delays-ms", "5", "--loads", "--overload", "0"])
        .args([
            "--target-p99-ms",
            "0",
            "--step-seconds",
            "0",
            "--repeat-shares",
        ])
        .args(args)
        .arg("--out")
        .arg(out)
        .status()
        .unwrap();
    assert!(status.success());
    written_report(out)
}

/// The bench.json a run wrote into `out`.
fn written_report(out: &std::path::Path) -> Report {
    serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap()
}

#[test]
fn a_tiny_bench_writes_a_complete_report() {
    let out = tempfile::tempdir().unwrap();
    let report = bench_binary(out.path());

    assert_eq!(
        report.saturation.len(),
        3,
        "one saturation row per batch size × delay, and the adaptive cell"
    );
    let adaptive = &report.saturation[2];
    assert_eq!(adaptive.target_p99_ms, Some(50));
    assert_eq!(
        (adaptive.max_batch_size, adaptive.max_batch_delay_ms),
        (16, 5),
        "bounded by the grid's largest size and delay"
    );
    // `--own-runs`: the default configuration as its own process, twice on
    // the same events, and its table.
    assert_eq!(report.own_runs.len(), 2);
    for run in &report.own_runs {
        assert_eq!(run.events, 400);
        assert!(run.per_s > 0.0 && run.peak_rss_bytes > 0, "{run:?}");
    }
    assert!(modstream_bench::markdown(&report).contains(
        "**`modstream run` at its default configuration**, 2 runs on the same 400 events"
    ));
    // `--kcat-floor`: each round's relay read back every record (its CPU
    // per record, where the run spanned two samples, some and finite).
    for run in &report.own_runs {
        let floor = run.floor.as_ref().expect("the round's kcat floor");
        assert_eq!(floor.events, 400);
        assert!(floor.per_s > 0.0 && floor.peak_rss_bytes > 0, "{floor:?}");
        if let Some(cpu) = floor.cpu_us_per_record {
            assert!(cpu > 0.0 && cpu < 1e6, "{floor:?}");
        }
    }
    assert!(
        modstream_bench::markdown(&report)
            .contains("| kcat floor CPU µs per record | modstream ÷ floor |")
    );
    for row in &report.saturation {
        assert_eq!(row.events, 400);
        assert!(row.pipeline_per_s > 0.0 && row.raw_model_per_s > 0.0);
        assert!(row.mean_batch_size >= 1.0 && row.mean_batch_size <= row.max_batch_size as f64);
        assert!((row.pipeline_over_raw - row.pipeline_per_s / row.raw_model_per_s).abs() < 1e-9);
        // The run-size histogram counts every model run.
        let runs: u64 = row.run_sizes.values().sum();
        assert!(
            (runs as f64 - 400.0 / row.mean_batch_size).abs() < 0.5,
            "{row:?}"
        );
        assert!(row.batch_wait_ms >= 0.0 && row.inference_ms > 0.0 && row.produce_ms > 0.0);
        assert!(row.padding_efficiency.is_none(), "not a token model");
        // The raw model on the pipeline's one worker, and the cell as its
        // own `modstream run` process beside it.
        assert_eq!(row.raw_sessions, Some(1), "{row:?}");
        assert!(
            row.raw_cpu_us_per_event.is_some_and(|us| us > 0.0),
            "{row:?}"
        );
        let own = row
            .own_process
            .as_ref()
            .expect("the cell as its own process");
        assert!(own.per_s > 0.0 && own.peak_rss_bytes > 0, "{own:?}");
        if let (Some(cpu), Some(raw)) = (own.cpu_us_per_verdict, row.raw_cpu_us_per_event) {
            assert!((row.cpu_over_raw().unwrap() - cpu / raw).abs() < 1e-9);
        }
    }
    let unbatched = report
        .saturation
        .iter()
        .find(|r| r.max_batch_size == 1)
        .unwrap();
    assert_eq!(
        unbatched.mean_batch_size, 1.0,
        "the unbatched baseline runs one event per model run"
    );
    assert_eq!(
        report.latency.len(),
        3,
        "one latency row per batch size × load, and the adaptive cell's"
    );
    assert_eq!(report.latency[2].target_p99_ms, Some(50));
    for row in &report.latency {
        assert!(row.p50_ms <= row.p99_ms && row.p99_ms <= row.max_ms);
        assert!(
            row.urgent_events > 0,
            "the generated load has urgent events"
        );
        assert!(row.urgent_p50_ms <= row.urgent_p99_ms);
        assert!(row.offered_per_s > 0.0);
    }
    assert!(report.peak_rss_bytes > 0);
    let overload = report.overload.as_ref().expect("an overload row");
    assert_eq!(overload.offered_multiple, 3.0);
    assert!(
        overload.events > 0
            && overload.peak_rss_bytes > 0
            && overload.light_load_peak_rss_bytes > 0
    );
    let bound = overload
        .bound_bytes
        .expect("the overload run's memory bound");
    assert!(
        overload.peak_rss_bytes <= bound,
        "peak RSS {} MiB under overload, past the budget's bound {} MiB",
        overload.peak_rss_bytes >> 20,
        bound >> 20
    );

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("bench.json")).unwrap())
            .unwrap();
    for key in [
        "machine",
        "model",
        "saturation",
        "latency",
        "peak_rss_bytes",
    ] {
        assert!(json.get(key).is_some(), "bench.json has {key}");
    }

    // The step-load trace: 3 phases of 1 s in half seconds, every event
    // counted once, and the batch choices over the same clock.
    let step = report.step.as_ref().expect("a step-load trace");
    assert_eq!(step.bins.len(), 6);
    assert_eq!(step.factor, 4.0);
    let offered: f64 = step.bins.iter().map(|b| b.offered_per_s * 0.5).sum();
    let counted: usize = step.bins.iter().map(|b| b.events).sum();
    assert!(
        (counted as f64 - offered).abs() <= offered * 0.05 + 30.0,
        "{counted} events in the bins, {offered:.0} offered"
    );
    assert!(!step.choices.is_empty() && step.choices[0].t_s == 0.0);
    assert!(step.choices.iter().all(|c| (1..=16).contains(&c.size)));

    // The cache sweep and the Python baseline.
    assert_eq!(report.repeats.len(), 2);
    assert_eq!(report.repeats[1].repeat_share, 0.5);
    assert!(
        report
            .repeats
            .iter()
            .all(|r| r.cache_off_per_s > 0.0 && r.cache_on_per_s > 0.0)
    );
    let baseline = report.baseline.as_ref().expect("a baseline row");
    assert_eq!(baseline.events, 400);
    assert!(baseline.modstream_per_s > 0.0 && baseline.python_per_s > 0.0);
    assert!(baseline.modstream_peak_rss_bytes > 0 && baseline.python_peak_rss_bytes > 0);
    // Each process's own VmHWM: not the bench's (the old getrusage in a
    // child of the bench reported the bench's peak to the byte).
    assert_ne!(baseline.python_peak_rss_bytes, report.peak_rss_bytes);
    assert_ne!(baseline.modstream_peak_rss_bytes, report.peak_rss_bytes);
    // CPU seconds per million verdicts, of each process: a verdict costs
    // some CPU, and less than a second of it.
    // (modstream's run of 400 events may be over between two samples.)
    let python_cpu = baseline
        .python_cpu_s_per_million
        .expect("CPU time measured");
    assert!(python_cpu > 0.0 && python_cpu < 1e6, "{python_cpu}");
    if let Some(cpu) = baseline.modstream_cpu_s_per_million {
        assert!(cpu > 0.0 && cpu < 1e6, "{cpu} CPU-s per million");
    }
    // The stronger baseline (onnxruntime on one intra-op thread) ran too.
    let one = baseline
        .python_one_thread
        .as_ref()
        .expect("the 1-thread run");
    assert!(one.per_s > 0.0 && one.peak_rss_bytes > 0);

    let floor = baseline.kcat_floor.as_ref().expect("the kcat floor row");
    assert_eq!(floor.events, 400);
    assert!(floor.per_s > 0.0 && floor.peak_rss_bytes > 0, "{floor:?}");

    let shadow = report.shadow.as_ref().expect("a shadow row");
    assert!(shadow.off_per_s > 0.0 && shadow.on_per_s > 0.0);

    // The tables as markdown beside bench.json: what the report says.
    let md = std::fs::read_to_string(out.path().join("bench.md")).unwrap();
    assert_eq!(md, modstream_bench::markdown(&report));
    for table in [
        "**Throughput at saturation**",
        "**Latency against offered load**",
        "**Against a plain Python consumer**",
        "| Python, onnxruntime on 1 intra-op thread |",
        "| kcat → kcat, the Kafka client's floor (no work per record) |",
        "**A shadow model's cost**",
    ] {
        assert!(md.contains(table), "bench.md has {table}");
    }

    // Every chart, as SVG with its axis titles and as PNG.
    for name in ["latency", "throughput", "step", "cache"] {
        let svg = std::fs::read_to_string(out.path().join(format!("{name}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("second"),
            "{name}.svg"
        );
        let png = std::fs::read(out.path().join(format!("{name}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{name}.png");
    }
    let latency_svg = std::fs::read_to_string(out.path().join("latency.svg")).unwrap();
    assert!(latency_svg.contains("latency target 50 ms"));
}

/// The cascade's band sweep, the cost table and the session-options sweep
/// through the binary (the last two run `modstream run` processes), and
/// `modstream plan` costing a day from that report.
#[test]
fn the_cascade_cost_and_session_sweeps_report_what_users_pay() {
    let out = tempfile::tempdir().unwrap();
    let minilm = support::repo_root().join("models/minilm-l6");
    assert!(
        minilm.join("model.onnx").is_file(),
        "run scripts/build-minilm-model.sh"
    );
    let python = support::prepared_python("MODSTREAM_BASELINE_PYTHON", "py-baseline");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_modstream-bench"))
        .current_dir(support::repo_root())
        .args(["--events", "240", "--batch-sizes", "16", "--delays-ms", "5"])
        .args(["--loads", "--latency-seconds", "1", "--overload", "0"])
        .args([
            "--target-p99-ms",
            "50",
            "--step-seconds",
            "0",
            "--repeat-shares",
        ])
        .arg("--cascade")
        .arg(&minilm)
        .args([
            "--cascade-bands",
            "0.4-0.6,0-1",
            "--cost",
            "models/minilm-l6-int8",
        ])
        .arg("--python")
        .arg(&python)
        .args(["--session-sweep", "--out"])
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success());
    let report = written_report(out.path());

    // Per stream: the transformer on every event, then each band.
    assert_eq!(report.cascade.len(), 6, "{:?}", report.cascade);
    for stream in report.cascade.chunks(3) {
        let (every, narrow, whole) = (&stream[0], &stream[1], &stream[2]);
        assert_eq!(every.band, None);
        assert_eq!(
            (narrow.band, whole.band),
            (Some([0.4, 0.6]), Some([0.0, 1.0]))
        );
        assert_eq!(every.transformer_share, 1.0, "{every:?}");
        assert_eq!(
            whole.transformer_share, 1.0,
            "a band up to 1 takes every score"
        );
        assert!(narrow.transformer_share < 1.0, "{narrow:?}");
        // The whole band is the transformer deciding every event: the
        // verdicts are the reference's (a padding difference may flip one).
        assert!(
            whole.agreement >= 0.98 && every.agreement >= 0.98,
            "{stream:?}"
        );
        assert!(stream.iter().all(|r| r.saturation_per_s > 0.0));
        // No faster than the transformer's one worker can go at the model
        // time per verdict the same run recorded (only it works there): a
        // check of the clock, which starts at the first verdict (the first
        // run, at most 64 events, was scored before it). Loose, because 240
        // events are four runs or so and the mean model time includes the
        // first, cold run, which parallel tests may slow: a CI run read 1.12
        // where this machine reads 0.83. It does not see the dispatch order
        // (urgent batches pushed to the very front read 0.83 here too); the
        // hub's tests hold that.
        let after_first_run = (240.0 - 64.0) / 239.0;
        let busy =
            every.saturation_per_s * after_first_run * every.model_us_per_verdict.unwrap() / 1e6;
        eprintln!("{}: {busy:.2} workers busy of 1", every.stream);
        assert!(busy <= 1.5, "{busy:.2} workers busy of 1: {every:?}");
    }
    assert_eq!(report.cascade[3].stream, "borderline");

    // The cost table: the model alone (raw and Python beside it), then the
    // cascade (neither).
    assert_eq!(report.cost.len(), 2, "{:?}", report.cost);
    let (alone, cascade) = (&report.cost[0], &report.cost[1]);
    assert!(alone.raw_per_s.is_some_and(|r| r > 0.0) && alone.python_per_s.is_some());
    assert!(cascade.raw_per_s.is_none() && cascade.python_per_s.is_none());
    // MiniLM int8 is slow enough for its CPU time to be sampled.
    let cpu = alone.cpu_s_per_million.expect("CPU time measured");
    assert!(cpu > 0.0 && cpu < 1e6, "{cpu}");
    let band = modstream_bench::cascade::Band::DEFAULT;
    assert!(
        cascade.contender.ends_with(&format!("minilm-l6 at {band}")),
        "the policy's default band: {}",
        cascade.contender
    );
    for r in &report.cost {
        assert!(r.default_per_s > 0.0 && r.target_per_s > 0.0 && r.p99_at_half_ms > 0.0);
        assert!(r.peak_rss_bytes > 0, "{r:?}");
        assert!((0.0..1.0).contains(&r.kafka_cpu_share), "{r:?}");
    }

    // The session options: each its own process; spinning threads burn CPU
    // while the session waits for work, and off they do not.
    let names: Vec<&str> = report
        .session
        .iter()
        .map(|r| r.contender.as_str())
        .collect();
    assert_eq!(names.first(), Some(&"default"));
    assert_eq!(names.last(), Some(&"default, again"));
    assert_eq!(names.len(), 9, "{names:?}");
    assert!(
        report
            .session
            .iter()
            .all(|r| r.per_s > 0.0 && r.load_ms > 0.0)
    );
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        let light = |name: &str| {
            report
                .session
                .iter()
                .find(|r| r.contender.ends_with(name))
                .map(|r| r.light_load_cores)
                .unwrap()
        };
        assert!(
            light("cores, spinning") > light("no spinning") + 0.3,
            "{:?}",
            report.session
        );
    }

    let md = std::fs::read_to_string(out.path().join("bench.md")).unwrap();
    for table in [
        "**A cheap model first**",
        "**What a verdict costs**",
        "**Session options**",
    ] {
        assert!(md.contains(table), "bench.md has {table}");
    }
    let svg = std::fs::read_to_string(out.path().join("cascade.svg")).unwrap();
    assert!(svg.contains("band width"));

    // A day at 1,000 events/s from the first cost row, chosen by name.
    let plan = |extra: &[&str]| {
        let plan = std::process::Command::new(support::modstream_binary())
            .args(["plan", "--rate", "1000", "--json"])
            .args(extra)
            .arg("--from")
            .arg(out.path().join("bench.json"))
            .output()
            .unwrap();
        assert!(
            plan.status.success(),
            "{}",
            String::from_utf8_lossy(&plan.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&plan.stdout).unwrap()
    };
    let day_hours = |cpu: f64| 1000.0 * 86_400.0 / 1e6 * cpu / 3_600.0;
    let chosen = plan(&["--contender", &alone.contender]);
    let day = &chosen["day"];
    assert!(
        (day["cpu_hours"].as_f64().unwrap() - day_hours(cpu)).abs() < 1e-6 * day_hours(cpu),
        "{day}"
    );
    assert!(day["instance_hours"].as_f64().unwrap() > 0.0);
    // Without a row, the day is the report's main model's (the baseline
    // run's), and none where that run was too short to measure CPU time.
    let default = plan(&[]);
    let baseline_cpu = report
        .baseline
        .as_ref()
        .unwrap()
        .modstream_cpu_s_per_million;
    match baseline_cpu {
        Some(cpu) => assert!(
            (default["day"]["cpu_hours"].as_f64().unwrap() - day_hours(cpu)).abs()
                < 1e-6 * day_hours(cpu),
            "{default}"
        ),
        None => assert!(default["day"].is_null(), "{default}"),
    }
}

/// The list and waves curves as a user runs them: `modstream run` with each
/// list in its own process, and the matcher alone holding each list or
/// cluster count, finding the list texts among the posts.
#[test]
fn the_list_and_wave_curves_load_each_list_and_find_its_texts() {
    let out = tempfile::tempdir().unwrap();
    let report = small_bench(
        out.path(),
        &["--list-items", "50,500", "--wave-clusters", "0,200"],
    );
    use modstream::tools::report::{Curve, Held};
    let service: Vec<_> = (report.curves.iter())
        .filter(|c| c.curve == Curve::ListItems)
        .collect();
    assert_eq!(service.iter().map(|c| c.at).collect::<Vec<_>>(), [50, 500]);
    for c in &service {
        assert!(
            c.events == 400 && c.per_s > 0.0 && c.peak_rss_bytes > 0,
            "{c:?}"
        );
    }
    let lists: Vec<_> = (report.matcher_curves.iter())
        .filter(|c| c.held == Held::ListItems)
        .collect();
    assert_eq!(lists.len(), 2);
    assert!(lists[1].bytes > lists[0].bytes * 5, "{lists:?}");
    for l in &lists {
        // Every tenth post is a list text: each one is found.
        assert_eq!(l.matched_share, 0.1, "{l:?}");
    }
    let waves: Vec<_> = (report.matcher_curves.iter())
        .filter(|c| c.held == Held::WaveClusters)
        .collect();
    assert_eq!(waves.iter().map(|c| c.at).collect::<Vec<_>>(), [0, 200]);
    assert!(waves[0].bytes == 0 && waves[1].bytes > 0, "{waves:?}");
    let tables = modstream_bench::markdown(&report);
    assert!(tables.contains("**Cost as the known-bad list items grow**"));
    assert!(tables.contains("**The matcher alone as the wave clusters held grow**"));
}

/// `--own-runs --state-rules` and `--state-restore` on the embedded cluster:
/// the run with state wrote one change per verdict, the restore read back
/// every entity written, and both tables render.
#[test]
fn a_tiny_state_bench_counts_the_changelog_and_the_restore() {
    let out = tempfile::tempdir().unwrap();
    let report = small_bench(
        out.path(),
        &["--own-runs", "1", "--state-rules", "--state-restore", "200"],
    );
    let states: Vec<_> = report.own_runs.iter().map(|r| r.state.as_ref()).collect();
    assert_eq!(states.len(), 2, "a run without state, then one with it");
    assert!(states[0].is_none());
    let with = states[1].expect("the second run kept state");
    assert_eq!(with.changelog_records, 400, "one change per event");
    assert!(with.changelog_bytes_per_verdict > 50.0, "{with:?}");
    let restore = &report.state_restores[0];
    assert_eq!((restore.entities, restore.records), (200, 200));
    assert!(restore.entities_per_s > 0.0 && restore.state_bytes > 0);
    let tables = modstream_bench::markdown(&report);
    assert!(
        tables.contains("without and with state rules") && tables.contains("**State restore**")
    );
}

/// `--own-runs --tracing-ratios` on the embedded cluster: the run without
/// tracing exports nothing, the one at 100 % exports spans of every post
/// to the bench's sink, the one at 0 % (no parent) none, and the table
/// renders.
#[test]
fn a_tiny_tracing_bench_counts_what_each_ratio_exports() {
    let out = tempfile::tempdir().unwrap();
    let report = small_bench(out.path(), &["--own-runs", "1", "--tracing-ratios", "1,0"]);
    let traced: Vec<_> = (report.own_runs.iter())
        .map(|r| {
            r.tracing
                .as_ref()
                .map(|t| (t.sampling_ratio, t.otlp_bytes_per_verdict))
        })
        .collect();
    assert_eq!(traced.len(), 3, "off, 100 %, 0 %: {traced:?}");
    assert_eq!(traced[0], None);
    let (ratio, all) = traced[1].unwrap();
    assert_eq!(ratio, 1.0);
    // A post's span alone is over 100 bytes of OTLP.
    assert!(all > 100.0, "{traced:?}");
    assert_eq!(traced[2], Some((0.0, 0.0)));
    let tables = modstream_bench::markdown(&report);
    assert!(tables.contains("without and with tracing"), "{tables}");
}
