//! modstream against Apache Kafka 4.4 (one KRaft node), run the way a
//! user runs it: `modstream run` processes configured by file, real Kafka
//! clients (kcat) on the outside, crashes by SIGKILL, broker restarts.
//!
//! Each scenario asserts lost = 0 (every acknowledged input event has at least
//! one verdict) and prints lost / duplicates.

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

/// One scenario at a time: each starts several processes on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn topics(broker: &Broker, input_partitions: i32) {
    broker.create_topic(INPUT, input_partitions);
    broker.create_topic(VERDICTS, input_partitions);
    broker.create_topic(DLQ, 1);
}

#[test]
fn kcat_in_kcat_out_field_by_field() {
    let _serial = serial();
    let broker = Broker::start();
    topics(&broker, 3);
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-kcat");
    let _service = Modstream::start(&config, "kcat", dir.path());
    let b = broker.bootstrap();

    let mut lines = String::new();
    for (id, key, payload) in support::events("k-", 0..50) {
        let _ = id;
        lines.push_str(&format!("{key}\t{}\n", String::from_utf8(payload).unwrap()));
    }
    lines.push_str("bad-key\tthis is not json\n");
    support::kcat(&["-P", "-b", &b, "-t", INPUT, "-K", "\t"], Some(&lines));

    let deadline = Instant::now() + Duration::from_secs(60);
    let verdicts = loop {
        let out = support::kcat(
            &[
                "-C",
                "-b",
                &b,
                "-t",
                VERDICTS,
                "-o",
                "beginning",
                "-e",
                "-q",
                "-J",
            ],
            None,
        );
        let records: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if records.len() >= 50 || Instant::now() > deadline {
            break records;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(verdicts.len(), 50, "one verdict per event");
    for envelope in &verdicts {
        let v: serde_json::Value =
            serde_json::from_str(envelope["payload"].as_str().unwrap()).unwrap();
        let id = v["event_id"].as_str().unwrap();
        let i: usize = id.strip_prefix("k-").unwrap().parse().unwrap();
        assert_eq!(
            envelope["key"].as_str().unwrap(),
            format!("user-{}", i % 97),
            "same key as the input"
        );
        assert!(["allow", "review", "block"].contains(&v["verdict"].as_str().unwrap()));
        let clean = v["scores"]["clean"].as_f64().unwrap();
        let offensive = v["scores"]["offensive"].as_f64().unwrap();
        assert!((clean + offensive - 1.0).abs() < 1e-3);
        assert_eq!(v["model"]["name"], "alt-profanity-check");
        assert_eq!(v["model"]["version"], "1.9.1");
        assert_eq!(v["source"]["topic"], INPUT);
        assert!(v["source"]["partition"].as_i64().unwrap() < 3);
        assert!(v["source"]["offset"].as_i64().unwrap() >= 0);
        assert!(v["latency_ms"].as_i64().unwrap() >= 0);
        chrono::DateTime::parse_from_rfc3339(v["processed_at"].as_str().unwrap()).unwrap();
    }
    let dlq = support::kcat(
        &[
            "-C",
            "-b",
            &b,
            "-t",
            DLQ,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%k|%s|%h\n",
        ],
        None,
    );
    let dlq: Vec<&str> = dlq.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(dlq.len(), 1, "one DLQ record: {dlq:?}");
    assert!(
        dlq[0].starts_with("bad-key|this is not json|"),
        "original key and payload: {}",
        dlq[0]
    );
    assert!(
        dlq[0].contains("modstream.reason=invalid_json"),
        "{}",
        dlq[0]
    );
}

#[test]
fn scale_out_and_members_coming_and_going_lose_nothing() {
    let _serial = serial();
    let broker = Broker::start();
    topics(&broker, 6);
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-scale");
    let mut members: Vec<Modstream> = (0..3)
        .map(|i| Modstream::start(&config, &format!("m{i}"), dir.path()))
        .collect();

    let mut acked = support::produce(&broker.bootstrap(), &support::events("s-", 0..1500));
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(90));
    v.report("scale-out, 3 members");
    assert!(
        v.lost.is_empty(),
        "lost with 3 members: {:?}",
        &v.lost[..v.lost.len().min(10)]
    );

    // Members join and leave while load runs: each change waits for
    // verdicts to flow first (no fixed sleeps), and must happen before the
    // paced load has ended.
    let load = support::produce_paced(
        broker.bootstrap(),
        support::events("s-", 1500..4500),
        Duration::from_secs(24),
    );
    let flowing = |step: &str| {
        assert!(
            support::wait_for_progress(&broker.bootstrap(), 150, Duration::from_secs(30)),
            "verdicts flow before {step}"
        );
    };
    let under_load = |step: &str, load: &std::thread::JoinHandle<Vec<String>>| {
        assert!(
            !load.is_finished(),
            "{step} happened while events were flowing"
        );
    };
    flowing("m3 joins");
    members.push(Modstream::start(&config, "m3", dir.path()));
    under_load("m3 joining", &load);
    flowing("m0 leaves");
    assert!(
        members[0].terminate(Duration::from_secs(20)),
        "m0 drains and exits 0 on SIGTERM"
    );
    under_load("m0 leaving", &load);
    flowing("m4 joins");
    members.push(Modstream::start(&config, "m4", dir.path()));
    under_load("m4 joining", &load);
    flowing("m1 leaves");
    assert!(
        members[1].terminate(Duration::from_secs(20)),
        "m1 drains and exits 0 on SIGTERM"
    );
    under_load("m1 leaving", &load);
    flowing("the end of the load, after the last change");
    acked.extend(load.join().unwrap());

    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(120));
    v.report("scale-out, members added and removed under load");
    assert!(
        v.lost.is_empty(),
        "lost while members came and went: {}",
        v.lost.len()
    );
}

#[test]
fn five_kill9_crashes_under_load_lose_nothing_and_never_commit_ahead() {
    let _serial = serial();
    let broker = Broker::start();
    topics(&broker, 4);
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-crash");

    let mut service = Modstream::start(&config, "crash", dir.path());

    let load = support::produce_paced(
        broker.bootstrap(),
        support::events("c-", 0..6000),
        Duration::from_secs(30),
    );
    for crash in 1..=5 {
        // Crash mid-stream: once the restarted service is producing verdicts.
        let progressed =
            support::wait_for_progress(&broker.bootstrap(), 200, Duration::from_secs(30));
        assert!(
            progressed,
            "crash {crash}: the (restarted) service wrote verdicts before the kill"
        );
        // Kill at a different point of the commit cycle each time.
        std::thread::sleep(Duration::from_millis(250 * crash));
        assert!(
            service.is_running(),
            "service died by itself before crash {crash}"
        );
        service.kill9();
        // With the process dead, its committed offsets are final: each must
        // not pass an input record whose verdict is not in the verdict topic.
        let committed = support::committed(&broker.bootstrap(), "g-crash", 4);
        let delivered = support::verdict_sources(&broker.bootstrap());
        for (partition, &c) in committed.iter().enumerate() {
            for offset in 0..c.max(0) {
                assert!(
                    delivered.contains(&(partition as i32, offset)),
                    "crash {crash}: committed {c} on partition {partition} passes undelivered offset {offset}"
                );
            }
        }
        // What the next run delivers again: verdicts past the commit.
        let ahead = delivered
            .iter()
            .filter(|(p, o)| committed.get(*p as usize).is_some_and(|&c| *o >= c))
            .count();
        println!("crash {crash}: committed {committed:?}, {ahead} verdicts delivered past it");
        service = Modstream::start(&config, "crash", dir.path());
    }
    let acked = load.join().unwrap();
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(120));
    v.report("kill -9 five times under load");
    assert!(v.lost.is_empty(), "lost after crashes: {}", v.lost.len());
    // Each kill lands 250 ms to 1.25 s after verdicts flowed, under a
    // steady load and a 500 ms commit interval: what was delivered since
    // the last commit is delivered again by the next run (at-least-once).
    // No duplicate at all would mean no kill hit a service at work.
    assert!(
        v.duplicates > 0,
        "kills mid-stream redo the verdicts delivered since the last commit"
    );
    assert!(service.terminate(Duration::from_secs(20)));
}

#[test]
fn the_service_rides_out_a_broker_restart() {
    let _serial = serial();
    let mut broker = Broker::start();
    topics(&broker, 4);
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-restart");
    let mut service = Modstream::start(&config, "restart", dir.path());

    let load = support::produce_paced(
        broker.bootstrap(),
        support::events("b-", 0..3000),
        Duration::from_secs(15),
    );
    std::thread::sleep(Duration::from_secs(5));
    broker.stop();
    std::thread::sleep(Duration::from_secs(3));
    broker.restart();
    let acked = load.join().unwrap();
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(120));
    v.report("broker restart under load");
    assert!(
        v.lost.is_empty(),
        "lost across the broker restart: {}",
        v.lost.len()
    );
    assert!(service.is_running(), "the service recovered by itself");
    assert!(service.terminate(Duration::from_secs(20)));
}

/// A member that stops answering (frozen with SIGSTOP for longer than the
/// session timeout, as a stalled host or a GC pause would) is evicted; its
/// partitions go to the other member. When it wakes, acknowledgements of
/// work it no longer owns must not be committed over the new owner's.
#[test]
fn an_evicted_member_commits_nothing_for_partitions_it_lost() {
    let _serial = serial();
    let broker = Broker::start();
    topics(&broker, 4);
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-evict");
    let mut a = Modstream::start(&config, "a", dir.path());
    let mut b = Modstream::start(&config, "b", dir.path());
    let watch = support::CommitWatch::start(&broker.bootstrap(), "g-evict", 4);
    let load = support::produce_paced(
        broker.bootstrap(),
        support::events("v-", 0..4000),
        Duration::from_secs(20),
    );
    assert!(support::wait_for_progress(
        &broker.bootstrap(),
        300,
        Duration::from_secs(30)
    ));
    // Both members hold a share before a freezes (bounded: on a loaded
    // machine a can join after b has made progress with all four; a frozen
    // before joining would leave nothing to evict).
    let shared = |name: &str| {
        support::assignments(&support::log_of(dir.path(), name))
            .last()
            .is_some_and(|&n| n > 0 && n < 4)
    };
    let joining = Instant::now();
    while !(shared("a") && shared("b")) && joining.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        shared("a") && shared("b"),
        "both members hold partitions before a freezes:\na: {:?}\nb: {:?}",
        support::assignments(&support::log_of(dir.path(), "a")),
        support::assignments(&support::log_of(dir.path(), "b"))
    );
    let b_log_before = support::log_of(dir.path(), "b").len();
    a.signal("-STOP");
    // Frozen past session.timeout.ms (6 s) until b has taken every
    // partition (bounded: on a loaded machine the rebalance takes longer).
    let took_over = |log: &str| {
        log[b_log_before.min(log.len())..]
            .lines()
            .any(|l| l.contains("partitions assigned") && l.contains("partitions=4"))
    };
    let frozen = Instant::now();
    while frozen.elapsed() < Duration::from_secs(10)
        || (!took_over(&support::log_of(dir.path(), "b"))
            && frozen.elapsed() < Duration::from_secs(40))
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    a.signal("-CONT");
    let acked = load.join().unwrap();
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(120));
    v.report("member frozen past its session timeout, then resumed");
    assert!(
        v.lost.is_empty(),
        "lost after an eviction: {}",
        v.lost.len()
    );
    // The frozen member was evicted: b took over every partition.
    let b_log = support::log_of(dir.path(), "b");
    assert!(
        took_over(&b_log),
        "b was assigned all four partitions while a was frozen:\n{}",
        &b_log[b_log_before.min(b_log.len())..]
    );
    // Committed offsets never pass an event without a verdict, and never
    // moved backwards (a, awake again, committed nothing it had lost).
    assert!(b.terminate(Duration::from_secs(20)));
    assert!(a.terminate(Duration::from_secs(20)));
    let samples = watch.never_backwards();
    assert!(samples > 20, "committed offsets sampled {samples} times");
    let committed = support::committed(&broker.bootstrap(), "g-evict", 4);
    let delivered = support::verdict_sources(&broker.bootstrap());
    for (partition, &c) in committed.iter().enumerate() {
        for offset in 0..c.max(0) {
            assert!(
                delivered.contains(&(partition as i32, offset)),
                "committed {c} on partition {partition} passes undelivered offset {offset}"
            );
        }
    }
}

/// Deliveries fail (the verdict topic is deleted once the service has
/// started: a start checks it exists), the in-flight bound is reached and
/// the partitions pause; a second member of the group (a plain consumer,
/// which commits nothing) joins and leaves (two rebalances); then the
/// topic is created again. Every partition is
/// fetched again and committed to its end: librdkafka keeps a pause across
/// unassign/assign, which used to leave them paused for good.
#[test]
fn a_rebalance_while_paused_leaves_no_partition_unfetched() {
    let _serial = serial();
    let broker = Broker::start();
    broker.create_topic(INPUT, 4);
    broker.create_topic(DLQ, 1);
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-paused");
    // The broker never creates topics (auto.create.topics.enable=false);
    // the producer must not ask either.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace(
            "drain_timeout = \"3s\"",
            "drain_timeout = \"3s\"\nshutdown_timeout = \"3s\"",
        )
        .replace(
            "\"linger.ms\" = 2",
            "\"linger.ms\" = 2\n\"allow.auto.create.topics\" = false",
        );
    std::fs::write(
        &config,
        format!("{text}\n[limits]\nmax_in_flight = 64\nstall_after = \"3s\"\n"),
    )
    .unwrap();
    broker.create_topic(VERDICTS, 4);
    let _first = Modstream::start(&config, "first", dir.path());
    std::thread::sleep(Duration::from_secs(4));
    broker.delete_topic(VERDICTS);
    let acked = support::produce(&broker.bootstrap(), &support::events("p-", 0..3000));
    std::thread::sleep(Duration::from_secs(4));
    support::member_joins_and_leaves(&broker.bootstrap(), "g-paused", Duration::from_secs(8));
    std::thread::sleep(Duration::from_secs(4));
    broker.create_topic(VERDICTS, 4);

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut committed = support::committed(&broker.bootstrap(), "g-paused", 4);
    let total = |c: &[i64]| c.iter().map(|o| (*o).max(0)).sum::<i64>();
    while total(&committed) < 3000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        committed = support::committed(&broker.bootstrap(), "g-paused", 4);
    }
    assert_eq!(
        total(&committed),
        3000,
        "every partition committed to its end within 60 s: {committed:?}"
    );
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(60));
    v.report("rebalances while paused, then the verdict topic appears");
    assert!(v.lost.is_empty(), "lost: {}", v.lost.len());
    // The watchdog said so while it lasted (limits.stall_after = 3 s), and
    // that it ended.
    let log = std::fs::read_to_string(log_dir(dir.path()).join("first.log")).unwrap();
    let stalled = log.rfind("partition stalled");
    let ended = log
        .rfind("partition making progress again")
        .max(log.rfind("stalled partition revoked"));
    assert!(
        stalled.is_some() && ended > stalled,
        "the stall was reported, then its end:\n{log}"
    );
    // The fetch watchdog has nothing to say: every partition was fetched
    // (without the pause fix it reports the stuck ones as not fetched).
    assert!(!log.contains("partition not fetched"), "{log}");
}

/// Where `Modstream::start` writes the service logs.
fn log_dir(dir: &std::path::Path) -> std::path::PathBuf {
    std::env::var_os("MODSTREAM_TEST_LOGDIR").map_or_else(|| dir.to_path_buf(), Into::into)
}
