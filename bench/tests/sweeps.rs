//! The bench's sweeps in process on tiny loads (transformer padding, an
//! external broker, delivery, formats, models, matching, sampling): each
//! reports its rows and table (no timing assertions: the machine is shared).

#[path = "../../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::Duration;

use modstream_bench::{BenchOptions, Report, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transformer_bench_reports_padding_and_the_unbucketed_baseline() {
    let model = support::repo_root().join("models/minilm-l6");
    assert!(
        model.join("model.onnx").is_file(),
        "run scripts/build-minilm-model.sh"
    );
    let report = tiny_bench(BenchOptions {
        events: 96,
        loads: vec![],
        model_dir: Some(model),
        token_budgets: vec![256],
        token_batch_size: 64,
        token_target_p99_ms: 200,
        ..tiny_options()
    })
    .await;
    assert!(report.model.starts_with("minilm-l6-moderation"));
    // By count (16) and by a budget of 256 tokens, on the long tail; then
    // the latency controller counting posts (bounded as the largest count)
    // and counting tokens.
    let by: Vec<_> = (report.token_batching.iter())
        .map(|r| (r.max_batch_size, r.max_batch_tokens, r.target_p99_ms))
        .collect();
    assert_eq!(
        by,
        vec![
            (16, None, None),
            (64, Some(256), None),
            (16, None, Some(200)),
            (64, Some(256), Some(200))
        ]
    );
    for r in &report.token_batching {
        assert!(r.saturation_per_s > 0.0 && r.events_per_run >= 1.0);
        assert!(r.padding_efficiency.is_some_and(|e| e > 0.0 && e <= 1.0));
    }
    let tables = modstream_bench::markdown(&report);
    assert!(tables.contains("**Batching by tokens against by count**"));
    assert!(tables.contains("p99 ≤ 200 ms, counting tokens (≤ 256 tokens (≤ 64 posts))"));
    let row = &report.saturation[0];
    let bucketed = row.padding_efficiency.expect("token models report padding");
    let unbucketed = row.raw_unbucketed_padding_efficiency.unwrap();
    assert!(bucketed > 0.0 && bucketed <= 1.0);
    assert!(
        unbucketed < bucketed,
        "buckets pad less than one pass per batch ({unbucketed:.2} vs {bucketed:.2})"
    );
    assert!(row.raw_unbucketed_per_s.unwrap() > 0.0);
    assert!(report.overload.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bench_runs_against_an_external_broker() {
    let broker = support::Broker::start();
    let report = tiny_bench(BenchOptions {
        bootstrap: Some(broker.bootstrap()),
        ..tiny_options()
    })
    .await;
    assert_eq!(report.broker, broker.bootstrap());
    assert_eq!(report.saturation.len(), 1);
    assert_eq!(report.saturation[0].events, 300);
    let runs: u64 = report.saturation[0].run_sizes.values().sum();
    assert!(runs > 0);
    assert_eq!(report.latency.len(), 1);
    assert!(report.latency[0].p50_ms <= report.latency[0].max_ms);
    // The broker's own round trip at the same load, without modstream.
    assert_eq!(report.broker_floor.len(), 1);
    let floor = &report.broker_floor[0];
    assert!(floor.events > 0 && floor.p50_ms > 0.0 && floor.p50_ms <= floor.max_ms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_sweep_measures_exactly_once_beside_at_least_once_on_kafka() {
    let broker = support::Broker::start();
    let report = tiny_bench(BenchOptions {
        bootstrap: Some(broker.bootstrap()),
        delivery_intervals_ms: vec![200],
        ..tiny_options()
    })
    .await;
    let modes: Vec<(&str, u64)> = report
        .delivery
        .iter()
        .map(|r| (r.delivery.as_str(), r.commit_interval_ms))
        .collect();
    assert_eq!(modes, vec![("at_least_once", 1000), ("exactly_once", 200)]);
    for r in &report.delivery {
        assert!(r.saturation_per_s > 0.0 && r.p50_ms <= r.p99_ms && r.p99_ms <= r.max_ms);
    }
    assert!(modstream_bench::markdown(&report).contains("At-least-once against exactly-once"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_format_sweep_measures_every_input_format_on_the_same_events() {
    use modstream_bench::formats::BenchFormat;
    let registry = support::registry::Registry::start();
    let all = vec![
        BenchFormat::Json,
        BenchFormat::MappedJson,
        BenchFormat::Avro,
        BenchFormat::Protobuf,
    ];
    let report = tiny_bench(BenchOptions {
        formats: all.clone(),
        registry_url: Some(registry.url()),
        ..tiny_options()
    })
    .await;
    let measured: Vec<BenchFormat> = report.formats.iter().map(|r| r.format).collect();
    assert_eq!(measured, all);
    for r in &report.formats {
        // Every event decoded and judged (the sweep fails on a dead letter).
        assert!(r.saturation_per_s > 0.0 && r.decode_us > 0.0, "{r:?}");
        assert!(r.p50_ms <= r.p99_ms, "{r:?}");
    }
    assert!(modstream_bench::markdown(&report).contains("**Input formats**"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_sweep_measures_one_model_against_two_on_the_same_events() {
    let second = support::repo_root().join("models/profanity-check");
    let report = tiny_bench(BenchOptions {
        second_model: Some(second),
        // Model time per verdict is compared below: over 300 events (five
        // runs of 64) one slow first run of a fresh session, or a core taken
        // by a test beside this one, could decide it.
        events: 1200,
        ..tiny_options()
    })
    .await;
    let shares: Vec<f64> = report.models.iter().map(|r| r.second_share).collect();
    assert_eq!(shares, [0.0, 1.0, 1.0, 0.25]);
    for r in &report.models {
        // Every event judged (the sweep fails on a dead letter).
        assert!(
            r.saturation_per_s > 0.0 && r.model_us_per_verdict > 0.0,
            "{r:?}"
        );
        assert!(r.p50_ms <= r.p99_ms, "{r:?}");
    }
    // Two models on every event spend more time in model runs per verdict.
    assert!(
        report.models[1].model_us_per_verdict > report.models[0].model_us_per_verdict,
        "{:?}",
        report.models
    );
    assert!(modstream_bench::markdown(&report).contains("**One model against two**"));
}

/// Matching's sweep at one share: a row with each contender's throughput,
/// reuse where the stream repeats, and the matcher's time; its table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_matching_sweep_measures_off_lists_and_reuse_on_one_stream() {
    let report = tiny_bench(BenchOptions {
        events: 1000,
        loads: vec![],
        match_shares: vec![0.6],
        ..tiny_options()
    })
    .await;
    let row = &report.matching[0];
    assert_eq!((row.near_duplicate_share, row.runs), (0.6, 1));
    assert!(
        row.off_per_s > 0.0 && row.lists_per_s > 0.0 && row.reuse_per_s > 0.0,
        "{row:?}"
    );
    assert!(
        row.reused_share > 0.2,
        "a stream of 60 % near-duplicates reuses: {row:?}"
    );
    assert!(row.lists_matcher_us > 0.0 && row.waves_matcher_us > 0.0);
    assert!(modstream_bench::markdown(&report).contains("**Matching before the models**"));
}

/// The matcher under its two floods: each row holds its time per event and
/// its state within the budget; the flood of variants cuts candidates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_matcher_floods_hold_the_budget_and_cut_candidates() {
    let report = tiny_bench(BenchOptions {
        events: 200,
        loads: vec![],
        match_floods: 3000,
        ..tiny_options()
    })
    .await;
    assert_eq!(report.match_floods.len(), 2);
    for row in &report.match_floods {
        assert!(row.matcher_us > 0.0 && row.clusters > 0, "{row:?}");
        assert!(row.bytes <= row.max_bytes, "{row:?}");
    }
    assert!(
        report.match_floods[0].candidates_cut > 0,
        "{:?}",
        report.match_floods[0]
    );
    assert!(modstream_bench::markdown(&report).contains("**The matcher under floods**"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampling_runs_measure_both_sides_and_the_share_sampled() {
    let report = tiny_bench(BenchOptions {
        events: 2000,
        loads: vec![],
        sampling_runs: 1,
        ..tiny_options()
    })
    .await;
    let row = report.sampling.as_ref().expect("a sampling row");
    assert_eq!(row.runs, 1);
    assert!(row.off_per_s > 0.0 && row.on_per_s > 0.0, "{row:?}");
    // The shipped rates: between 0.1 % and 2 % of the verdicts.
    assert!(
        row.sampled_share > 0.0 && row.sampled_share < 0.02,
        "{row:?}"
    );
    assert!(row.draw_ns > 0.0);
    assert!(modstream_bench::markdown(&report).contains("**Sampling for prevalence**"));
}

/// One batch size, one delay, one latency point of 1 s, no overload run.
fn tiny_options() -> BenchOptions {
    BenchOptions {
        events: 300,
        batch_sizes: vec![16],
        delays_ms: vec![5],
        loads: vec![0.5],
        latency_seconds: 1,
        intra_threads: 1,
        model_dir: None,
        bootstrap: None,
        broker_pid: None,
        providers: vec![modstream::config::ExecutionProvider::Cpu],
        require_gpu: false,
        workers: 1,
        cache_bytes: 0,
        overload: 0.0,
        target_p99_ms: 0,
        step_seconds: 0,
        repeat_shares: vec![],
        repeat_cache_bytes: 0,
        python: None,
        python_script: None,
        shadow_model: None,
        delivery_intervals_ms: vec![],
        variant: Default::default(),
        formats: vec![],
        registry_url: None,
        second_model: None,
        cascade: None,
        cascade_bands: vec![],
        cascade_band: modstream_bench::cascade::Band::DEFAULT,
        cost: vec![],
        session_sweep: false,
        match_shares: vec![],
        match_runs: 1,
        match_floods: 0,
        sampling_runs: 0,
        own_runs: 0,
        state_rules: false,
        kcat_floor: false,
        tracing_ratios: Vec::new(),
        state_restore: Vec::new(),
        token_budgets: Vec::new(),
        token_batch_size: 256,
        token_target_p99_ms: 0,
        partition_counts: Vec::new(),
        verdict_partitions: 0,
        tenant_counts: Vec::new(),
        post_bytes: Vec::new(),
        list_items: Vec::new(),
        wave_clusters: Vec::new(),
        out_dir: PathBuf::new(),
    }
}

async fn tiny_bench(opts: BenchOptions) -> Report {
    // The bench reads models/ and bench/ as a user runs it, from the root.
    std::env::set_current_dir(support::repo_root()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let opts = BenchOptions {
        out_dir: out.path().to_path_buf(),
        ..opts
    };
    tokio::time::timeout(Duration::from_secs(300), run(opts))
        .await
        .expect("bench finishes")
        .unwrap()
}
