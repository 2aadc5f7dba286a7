//! `modstream bench` end to end on a tiny load: the report has its fields and
//! its counts match the run (no timing assertions: the machine is shared).

use std::time::Duration;

use modstream::bench::{BenchOptions, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_bench_writes_a_complete_report() {
    let out = tempfile::tempdir().unwrap();
    let report = tokio::time::timeout(
        Duration::from_secs(240),
        run(BenchOptions {
            events: 400,
            batch_sizes: vec![1, 16],
            delays_ms: vec![5],
            loads: vec![0.5],
            latency_seconds: 1,
            intra_threads: 1,
            out_dir: out.path().to_path_buf(),
        }),
    )
    .await
    .expect("bench finishes")
    .unwrap();

    assert_eq!(
        report.saturation.len(),
        2,
        "one saturation row per batch size × delay"
    );
    for row in &report.saturation {
        assert_eq!(row.events, 400);
        assert!(row.pipeline_per_s > 0.0 && row.raw_model_per_s > 0.0);
        assert!(row.mean_batch_size >= 1.0 && row.mean_batch_size <= row.max_batch_size as f64);
        assert!((row.pipeline_over_raw - row.pipeline_per_s / row.raw_model_per_s).abs() < 1e-9);
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
        2,
        "one latency row per batch size × load"
    );
    for row in &report.latency {
        assert!(row.p50_ms <= row.p99_ms && row.p99_ms <= row.max_ms);
        assert!(row.offered_per_s > 0.0);
    }
    assert!(report.peak_rss_bytes > 0);

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
    let svg = std::fs::read_to_string(out.path().join("bench.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
}
