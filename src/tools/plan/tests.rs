use super::*;

/// A hand-made report: two fixed cells and their latency points.
fn report() -> Report {
    serde_json::from_value(serde_json::json!({
        "machine": "2 cores", "model": "m 1", "intra_threads": 1, "workers": 2,
        "provider": "cpu", "broker": "embedded", "peak_rss_bytes": 1,
        "saturation": [
            {"max_batch_size": 8, "max_batch_delay_ms": 5, "events": 100,
             "pipeline_per_s": 10000.0, "raw_model_per_s": 1.0, "pipeline_over_raw": 1.0,
             "mean_batch_size": 8.0, "inference_share": 0.5, "run_sizes": {},
             "batch_wait_ms": 1.0, "inference_ms": 1.0, "produce_ms": 1.0},
            {"max_batch_size": 64, "max_batch_delay_ms": 20, "events": 100,
             "pipeline_per_s": 20000.0, "raw_model_per_s": 1.0, "pipeline_over_raw": 1.0,
             "mean_batch_size": 60.0, "inference_share": 0.5, "run_sizes": {},
             "batch_wait_ms": 1.0, "inference_ms": 1.0, "produce_ms": 1.0}
        ],
        "latency": [
            {"max_batch_size": 8, "max_batch_delay_ms": 5, "offered_fraction": 0.5,
             "offered_per_s": 5000.0, "achieved_per_s": 5000.0, "p50_ms": 10.0,
             "p90_ms": 15.0, "p99_ms": 20.0, "p999_ms": 25.0, "max_ms": 30.0},
            {"max_batch_size": 64, "max_batch_delay_ms": 20, "offered_fraction": 0.5,
             "offered_per_s": 10000.0, "achieved_per_s": 10000.0, "p50_ms": 20.0,
             "p90_ms": 30.0, "p99_ms": 40.0, "p999_ms": 50.0, "max_ms": 60.0},
            {"max_batch_size": 64, "max_batch_delay_ms": 20, "offered_fraction": 0.75,
             "offered_per_s": 15000.0, "achieved_per_s": 15000.0, "p50_ms": 30.0,
             "p90_ms": 60.0, "p99_ms": 90.0, "p999_ms": 99.0, "max_ms": 120.0}
        ]
    }))
    .unwrap()
}

fn opts(rate: f64, p99: Option<f64>) -> PlanOptions {
    PlanOptions {
        rate,
        p99_ms: p99,
        report: None,
        headroom: 0.7,
        catch_up_seconds: 10.0,
        contender: None,
        gpu_rate: None,
        service_cost: None,
        json: false,
    }
}

/// The hand-made report with three runs of `--own-runs`.
fn with_own_runs() -> Report {
    let mut report = report();
    report.own_runs = [(90_000.0, 10.0), (100_000.0, 8.0), (80_000.0, 12.0)]
        .into_iter()
        .map(|(per_s, cpu)| crate::tools::report::OwnRun {
            events: 1000,
            per_s,
            cpu_us_per_verdict: Some(cpu),
            kafka_cpu_share: 0.2,
            peak_rss_bytes: 1,
            broker_cpu_us_per_verdict: None,
            state: None,
            tracing: None,
            floor: None,
        })
        .collect();
    report
}

#[test]
fn beside_a_gpu_the_cores_and_instances_from_the_services_own_cost() {
    // 200,000/s × 10 µs (the median) = 2 cores busy; at 70 %: 3 cores.
    // One instance: 90,000/s (the median) × 0.7 = 63,000/s: 4 instances.
    let g = gpu::ceiling(&with_own_runs(), 200_000.0, 0.7).unwrap();
    assert_eq!(g.cpu_us_per_verdict, 10.0);
    assert_eq!(g.instance_per_s, 90_000.0);
    assert!((g.cores_busy - 2.0).abs() < 1e-9, "{g:?}");
    assert_eq!((g.cores, g.instances, g.runs), (3, 4, 3));
    // A report without runs is refused with what to run.
    let e = gpu::ceiling(&report(), 200_000.0, 0.7).unwrap_err();
    assert!(e.to_string().contains("--own-runs"), "{e}");
    assert!(gpu::ceiling(&with_own_runs(), 0.0, 0.7).is_err());
}

#[test]
fn the_arithmetic_on_a_hand_made_report() {
    // p99 ≤ 50 ms: the 64/20 cell at half load holds 10,000/s (40 ms).
    let p = plan(&report(), &opts(100_000.0, Some(50.0))).unwrap();
    assert_eq!(p.per_instance_per_s, 10_000.0);
    assert_eq!(p.measured_p99_ms, Some(40.0));
    // 100,000 ÷ (10,000 × 0.7) = 14.3 → 15 instances.
    assert_eq!(p.instances, 15);
    // ≥ 30, a multiple of 6.
    assert_eq!(p.partitions, 30);
    // 20,000/s at saturation × 10 s × 0.5.
    assert_eq!(p.lag_threshold, 100_000);
    assert_eq!(p.one_more_instance_adds_per_s, 7_000.0);
    assert!((p.per_instance_load_now - 100_000.0 / 15.0 / 10_000.0).abs() < 1e-12);
    assert!((p.per_instance_load_with_one_more - 100_000.0 / 16.0 / 10_000.0).abs() < 1e-12);

    // A looser p99 lets the 75 % point count: 15,000/s.
    let p = plan(&report(), &opts(100_000.0, Some(100.0))).unwrap();
    assert_eq!(p.per_instance_per_s, 15_000.0);
    assert_eq!(p.instances, 10); // 100,000 ÷ 10,500 = 9.5
    assert_eq!(p.partitions, 24);

    // No p99: the best saturation throughput; a small rate needs one.
    let p = plan(&report(), &opts(1_000.0, None)).unwrap();
    assert_eq!(
        (p.per_instance_per_s, p.instances, p.partitions),
        (20_000.0, 1, 6)
    );
}

#[test]
fn an_unreachable_p99_says_what_was_measured() {
    let e = plan(&report(), &opts(1_000.0, Some(10.0))).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("10 ms") && text.contains("20.0 ms"), "{text}");
    assert!(plan(&report(), &opts(0.0, None)).is_err());
}

#[test]
fn a_day_in_cpu_hours_and_instance_hours() {
    assert_eq!(plan(&report(), &opts(1_000.0, None)).unwrap().day, None);
    let mut r = report();
    r.cost = serde_json::from_value(serde_json::json!([
        {"contender": "minilm-l6", "events": 1, "default_per_s": 400.0,
         "cpu_s_per_million": 5000.0, "kafka_cpu_share": 0.01, "peak_rss_bytes": 1,
         "target_per_s": 1.0, "target_p99_ms": 50, "p99_at_half_ms": 1.0},
        {"contender": "minilm-l6-int8", "events": 1, "default_per_s": 700.0,
         "cpu_s_per_million": 2500.0, "kafka_cpu_share": 0.01, "peak_rss_bytes": 1,
         "target_per_s": 1.0, "target_p99_ms": 50, "p99_at_half_ms": 1.0}
    ]))
    .unwrap();
    // The report's main model has no CPU time (no baseline run): a
    // cost-table row, another model's, is not taken for it.
    assert_eq!(plan(&r, &opts(1_000.0, None)).unwrap().day, None);
    let minilm = PlanOptions {
        contender: Some("minilm-l6".into()),
        ..opts(1_000.0, None)
    };
    let p = plan(&r, &minilm).unwrap();
    // The capacity is the row's model's too, not the report's 20,000/s.
    assert_eq!(p.per_instance_per_s, 400.0);
    assert!(p.bench.starts_with("minilm-l6 on"), "{}", p.bench);
    // 1,000/s for a day = 86.4 million verdicts × 5,000 s = 120 CPU-hours;
    // ÷ (2 cores × 0.7) = 85.7 instance-hours.
    let day = p.day.unwrap();
    assert!((day.cpu_hours - 120.0).abs() < 1e-9, "{day:?}");
    assert!((day.instance_hours - 120.0 / 1.4).abs() < 1e-9);
    assert_eq!(day.cores, 2);
    // 1,000 ÷ (400 × 0.7) = 3.6 → 4 instances by verdicts/s, as planned.
    assert_eq!((day.instances_by_throughput, p.instances), (4, 4));
    let int8 = PlanOptions {
        contender: Some("int8".into()),
        ..opts(1_000.0, None)
    };
    let p = plan(&r, &int8).unwrap();
    assert_eq!(p.per_instance_per_s, 700.0);
    assert!((p.day.unwrap().cpu_hours - 60.0).abs() < 1e-9);
    // With a p99: the row's one latency point, at half its saturation.
    let held = plan(
        &r,
        &PlanOptions {
            p99_ms: Some(5.0),
            ..int8.clone()
        },
    )
    .unwrap();
    assert_eq!(
        (held.per_instance_per_s, held.measured_p99_ms),
        (350.0, Some(1.0))
    );
    let tight = PlanOptions {
        p99_ms: Some(0.5),
        ..int8
    };
    assert!(matches!(
        plan(&r, &tight),
        Err(PlanError::Unreachable { .. })
    ));
    let none = PlanOptions {
        contender: Some("bert".into()),
        ..opts(1_000.0, None)
    };
    let e = plan(&r, &none).unwrap_err().to_string();
    assert!(e.contains("bert") && e.contains("minilm-l6-int8"), "{e}");
}
