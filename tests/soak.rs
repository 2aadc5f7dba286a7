//! A soak on Apache Kafka: a paced load at 70 % of the service's own
//! saturation (measured first, on a backlog), with a model hot reload, a
//! second member joining and leaving, and a policy change at intervals.
//! Each sample reads the first member's RSS, open file descriptors and
//! threads, the p99 of the verdicts read since the last sample (their own
//! `latency_ms`) and what its hub holds (model versions, events and bytes
//! in flight, stalled partitions) from /metrics. At the end: lost 0, the
//! committed offsets at the end of every partition, no partition stalled,
//! both members stopped cleanly, and no growth beyond the bounds below.
//!
//! The two-minute soak runs in the suite. `scripts/soak.sh [--minutes M]`
//! runs the ignored one for `MODSTREAM_SOAK_MINUTES` and writes its report
//! (soak.json) and chart (soak.svg) to `MODSTREAM_SOAK_OUT`.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::load::{PacedLoad, VerdictReader};
use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

const PARTITIONS: i32 = 4;
const GROUP: &str = "g-soak";
/// RSS the first member may gain from the first sample after settling to
/// any later one: the score cache, librdkafka's queues and the allocator's
/// arenas fill within the first minutes, then stay.
const RSS_GROWTH_BOUND_MIB: f64 = 64.0;
/// Open file descriptors and threads it may gain meanwhile (a member
/// joining moves partitions; connections to the one broker stay).
const FD_GROWTH_BOUND: usize = 16;
const THREAD_GROWTH_BOUND: usize = 4;
/// Model versions the hub may hold at once: the first one, the one in
/// use, and one a worker may still answer with.
const VERSIONS_HELD_BOUND: f64 = 3.0;

/// When things happen in a soak.
struct Plan {
    duration: Duration,
    sample_every: Duration,
    reload_every: Duration,
    /// A second member joins at each multiple, and leaves half-way to the next.
    member_every: Duration,
    policy_every: Duration,
    load_share: f64,
    /// The backlog that measures the saturation first.
    saturation_events: usize,
    /// Samples at the start left out of the growth figures (warming up).
    settle_samples: usize,
}

#[test]
fn a_two_minute_soak_keeps_memory_state_and_latency_steady_and_loses_nothing() {
    let plan = Plan {
        duration: Duration::from_secs(120),
        sample_every: Duration::from_secs(10),
        reload_every: Duration::from_secs(15),
        member_every: Duration::from_secs(40),
        policy_every: Duration::from_secs(60),
        load_share: 0.7,
        saturation_events: 20_000,
        settle_samples: 3,
    };
    let report = soak(&plan);
    println!(
        "{}",
        serde_json::to_string_pretty(&report["summary"]).unwrap()
    );
}

#[test]
#[ignore = "long: scripts/soak.sh runs it"]
fn the_soak_scripts_soak_sh_asks_for() {
    let minutes: f64 = std::env::var("MODSTREAM_SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(30.0);
    let plan = Plan {
        duration: Duration::from_secs_f64(minutes * 60.0),
        sample_every: Duration::from_secs(60),
        reload_every: Duration::from_secs(60),
        member_every: Duration::from_secs(300),
        policy_every: Duration::from_secs(600),
        load_share: 0.7,
        saturation_events: 50_000,
        settle_samples: 2,
    };
    let report = soak(&plan);
    let out = std::env::var_os("MODSTREAM_SOAK_OUT").map_or_else(
        || Path::new(env!("CARGO_TARGET_TMPDIR")).join("soak"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join("soak.json"),
        serde_json::to_string_pretty(&report).unwrap() + "\n",
    )
    .unwrap();
    chart(&report, &out.join("soak.svg"));
    println!("soak report and chart in {}", out.display());
}

/// One sample of the first member.
#[derive(Debug, Clone, serde::Serialize)]
struct Sample {
    minute: f64,
    rss_mib: f64,
    fds: usize,
    threads: usize,
    /// Of the verdicts read since the previous sample (None: none read).
    p99_ms: Option<f64>,
    verdicts_read: usize,
    versions_held: f64,
    in_flight_events: f64,
    in_flight_mib: f64,
    stalled_partitions: f64,
}

fn soak(plan: &Plan) -> serde_json::Value {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    for (topic, partitions) in [(INPUT, PARTITIONS), (VERDICTS, PARTITIONS), (DLQ, 1)] {
        broker.create_topic(topic, partitions);
    }
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2, current) = (
        dir.path().join("v1"),
        dir.path().join("v2"),
        dir.path().join("current"),
    );
    model_version(&v1, "1.9.1");
    model_version(&v2, "1.9.1-soak");
    std::os::unix::fs::symlink(&v1, &current).unwrap();
    let policy = dir.path().join("policy.toml");
    write_policy(&policy, 0);
    let port = support::free_port();
    let config = config_of(dir.path(), "a", &bootstrap, &current, &policy, port);
    // The second member: the same but for its metrics port.
    let config_b = config_of(dir.path(), "b", &bootstrap, &current, &policy, 0);
    let mut a = Modstream::start(&config, "soak-a", dir.path());
    let pid = a.pid().unwrap();
    let verdicts = VerdictReader::start(&bootstrap, plan.saturation_events);

    // Saturation: a backlog, clocked by its verdicts' own timestamps.
    let backlog = support::events(support::load::PREFIX, 0..plan.saturation_events);
    support::produce(&bootstrap, &backlog);
    let deadline = Instant::now() + Duration::from_secs(120);
    while verdicts.distinct_below(plan.saturation_events) < plan.saturation_events {
        assert!(Instant::now() < deadline, "the backlog was not scored");
        std::thread::sleep(Duration::from_millis(200));
    }
    let saturation = verdicts.backlog_rate();
    // The samples' latencies are the paced load's, not the backlog's.
    verdicts.take_window();
    let rate = (saturation * plan.load_share).round() as u32;
    println!("soak: saturation {saturation:.0}/s, paced load {rate}/s");

    let load = PacedLoad::start(&bootstrap, plan.saturation_events, rate, plan.duration);
    let started = Instant::now();
    let mut b: Option<Modstream> = None;
    let (mut reloads, mut member_changes, mut policy_changes) = (0usize, 0usize, 0usize);
    let mut next_sample = started + plan.sample_every;
    let mut next_reload = started + plan.reload_every;
    let mut next_member = started + plan.member_every;
    let mut next_policy = started + plan.policy_every;
    let mut samples = Vec::new();
    while started.elapsed() < plan.duration {
        std::thread::sleep(Duration::from_millis(200));
        let now = Instant::now();
        if now >= next_reload {
            reloads += 1;
            let target = if reloads.is_multiple_of(2) { &v1 } else { &v2 };
            swap_link(&current, target);
            next_reload += plan.reload_every;
        }
        // A member joins only with time to run before the end (a SIGTERM
        // while it loads its model ends it by the signal, not by a drain).
        let time_to_run = started.elapsed() + plan.member_every / 2 < plan.duration;
        if now >= next_member && (b.is_some() || time_to_run) {
            member_changes += 1;
            match b.take() {
                None => {
                    b = Some(Modstream::start(&config_b, "soak-b", dir.path()));
                    next_member += plan.member_every / 2;
                }
                Some(mut member) => {
                    assert!(
                        member.terminate(Duration::from_secs(30)),
                        "the second member leaves cleanly"
                    );
                    next_member += plan.member_every / 2;
                }
            }
        }
        if now >= next_policy {
            policy_changes += 1;
            write_policy(&policy, policy_changes);
            next_policy += plan.policy_every;
        }
        if now >= next_sample {
            assert!(a.is_running(), "the first member runs");
            samples.push(sample(
                pid,
                port,
                started.elapsed().as_secs_f64() / 60.0,
                &verdicts,
            ));
            println!("soak: {:?}", samples.last().unwrap());
            next_sample += plan.sample_every;
        }
    }
    let acked = load.finish();
    if let Some(mut member) = b.take() {
        assert!(member.terminate(Duration::from_secs(30)));
    }
    let wanted: Vec<usize> = (0..plan.saturation_events).chain(acked).collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    while verdicts.lost(&wanted) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    let committed_at_end =
        support::wait_for_committed_end(&bootstrap, GROUP, PARTITIONS, Duration::from_secs(120));
    assert!(a.terminate(Duration::from_secs(30)), "exits 0 on SIGTERM");
    let (lost, duplicates) = (verdicts.lost(&wanted), verdicts.duplicates());
    verdicts.stop();

    let settled = &samples[plan.settle_samples.min(samples.len().saturating_sub(1))..];
    let rss: Vec<(f64, f64)> = settled.iter().map(|s| (s.minute, s.rss_mib)).collect();
    let p99: Vec<(f64, f64)> = settled
        .iter()
        .filter_map(|s| Some((s.minute, s.p99_ms?)))
        .collect();
    let first = &settled[0];
    let last = settled.last().unwrap();
    let max = |f: fn(&Sample) -> f64| settled.iter().map(f).fold(f64::MIN, f64::max);
    let summary = serde_json::json!({
        "acked": wanted.len(),
        "lost": lost,
        "duplicates": duplicates,
        "committed_at_end": committed_at_end,
        "settle_samples": plan.settle_samples,
        "rss_first_mib": first.rss_mib,
        "rss_last_mib": last.rss_mib,
        "rss_max_mib": max(|s| s.rss_mib),
        "rss_growth_mib_per_hour": slope(&rss) * 60.0,
        "fds_first": first.fds,
        "fds_last": last.fds,
        "threads_first": first.threads,
        "threads_last": last.threads,
        "p99_first_ms": p99.first().map_or(0.0, |p| p.1),
        "p99_last_ms": p99.last().map_or(0.0, |p| p.1),
        "p99_max_ms": p99.iter().map(|p| p.1).fold(0.0, f64::max),
        "p99_drift_ms_per_hour": slope(&p99) * 60.0,
        "versions_held_max": samples.iter().map(|s| s.versions_held).fold(0.0, f64::max),
        "reloads": reloads,
        "member_changes": member_changes,
        "policy_changes": policy_changes,
        "most_stalled": samples.iter().map(|s| s.stalled_partitions).fold(0.0, f64::max),
    });
    println!("soak summary: {summary}");
    assert_eq!(lost, 0, "lost events");
    assert!(committed_at_end, "committed offsets reach the end");
    assert!(reloads > 0 && member_changes > 1 && policy_changes > 0);
    assert_eq!(summary["most_stalled"], 0.0, "no partition stalled");
    assert!(
        summary["versions_held_max"].as_f64().unwrap() <= VERSIONS_HELD_BOUND,
        "the hub lets go of old model versions: {summary}"
    );
    assert!(
        summary["rss_max_mib"].as_f64().unwrap() <= first.rss_mib + RSS_GROWTH_BOUND_MIB,
        "RSS within {RSS_GROWTH_BOUND_MIB} MiB of its settled value: {summary}"
    );
    assert!(
        last.fds <= first.fds + FD_GROWTH_BOUND,
        "open files: {summary}"
    );
    assert!(
        last.threads <= first.threads + THREAD_GROWTH_BOUND,
        "threads: {summary}"
    );
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    serde_json::json!({
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "commit": commit,
        "minutes": plan.duration.as_secs_f64() / 60.0,
        "rate_per_s": rate,
        "load_share": plan.load_share,
        "saturation_per_s": saturation,
        "reload_every_s": plan.reload_every.as_secs(),
        "member_every_s": plan.member_every.as_secs(),
        "policy_every_s": plan.policy_every.as_secs(),
        "sample_every_s": plan.sample_every.as_secs(),
        "samples": samples,
        "summary": summary,
    })
}

/// A copy of the shipped model with another version in its manifest.
fn model_version(dir: &Path, version: &str) {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/profanity-check");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(shipped.join("model.onnx"), dir.join("model.onnx")).unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shipped.join("manifest.json")).unwrap())
            .unwrap();
    manifest["version"] = version.into();
    std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
}

/// Point `link` at `target` atomically (a new link renamed over the old).
fn swap_link(link: &Path, target: &Path) {
    let tmp = link.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

/// The `n`th policy: one rule, its review threshold moving each time.
fn write_policy(path: &Path, n: usize) {
    let review_at = if n.is_multiple_of(2) { 0.5 } else { 0.6 };
    let text = format!(
        "version = \"soak-{n}\"\n[[rules]]\nid = \"default\"\nmodels.default.offensive = {{ review_at = {review_at}, block_at = 0.85 }}\n"
    );
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn config_of(
    dir: &Path,
    member: &str,
    bootstrap: &str,
    model: &Path,
    policy: &Path,
    port: u16,
) -> PathBuf {
    let written = support::write_config(dir, bootstrap, GROUP);
    let config = dir.join(format!("{member}.toml"));
    let text: String = std::fs::read_to_string(&written)
        .unwrap()
        .lines()
        .map(|l| {
            if l.starts_with("model_dir") {
                format!(
                    "model_dir = {:?}\nreload_interval = \"1s\"\n",
                    model.display().to_string()
                )
            } else if l.starts_with("listen") {
                format!("listen = \"127.0.0.1:{port}\"\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    let text = format!(
        "{text}[policy]\nfile = {:?}\n[limits]\nstall_after = \"20s\"\n",
        policy.display().to_string()
    );
    std::fs::write(&config, text).unwrap();
    config
}

fn sample(pid: u32, port: u16, minute: f64, verdicts: &VerdictReader) -> Sample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let metrics = support::http_get(port, "/metrics").1;
    let gauge = |series: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let (latencies, read) = verdicts.take_window();
    Sample {
        minute,
        rss_mib: field("VmRSS:") / 1024.0,
        fds,
        threads: field("Threads:") as usize,
        p99_ms: percentile(latencies, 0.99),
        verdicts_read: read,
        versions_held: gauge("modstream_model_versions_held"),
        in_flight_events: gauge("modstream_in_flight_events"),
        in_flight_mib: gauge("modstream_in_flight_bytes") / 1_048_576.0,
        stalled_partitions: gauge("modstream_stalled_partitions"),
    }
}

fn percentile(mut values: Vec<i64>, q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let i = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1;
    Some(values[i] as f64)
}

/// Least-squares slope of y over x (per unit of x).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

fn chart(report: &serde_json::Value, path: &Path) {
    let series = |key: &str| -> Vec<(f64, f64)> {
        report["samples"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| Some((s["minute"].as_f64()?, s[key].as_f64()?)))
            .collect()
    };
    let panels = [
        ("RSS, MiB", "rss_mib"),
        ("p99 of the interval's verdicts, ms", "p99_ms"),
        ("open file descriptors", "fds"),
        ("model versions held", "versions_held"),
    ]
    .map(|(label, key)| modstream_bench::Panel {
        y_label: label,
        points: series(key),
    });
    let title = format!(
        "soak: {} events/s for {:.0} min, Apache Kafka, 2 cores",
        report["rate_per_s"],
        report["minutes"].as_f64().unwrap_or(0.0)
    );
    modstream_bench::time_series(path, &title, "minutes", &panels).unwrap();
}
