//! modstream on a three-broker Apache Kafka cluster (KRaft, every node a
//! broker and a controller, replication factor 3, `min.insync.replicas` 2)
//! under steady load while brokers die by SIGKILL:
//! - the leader of input and verdict partitions killed, restarted, then
//!   another: nothing lost, committed to the end, no partition stalled, and
//!   the time without verdicts after each kill measured;
//! - two of three brokers down for a while: writes wait (nothing is
//!   dead-lettered for it) and resume when the brokers return.
//!
//! The numbers go to `target/tmp/reliability/` (docs/reliability.md) and to
//! stdout.

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::load::{VerdictClock, produce_steady};
use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const PARTITIONS: i32 = 4;
const RATE: u32 = 200;

/// A three-node cluster with the topics, and modstream's config naming
/// every node (`limits.stall_after` 30 s, half the default: a partition
/// whose oldest event waits that long, or that has a lag and gets no record
/// that long, is logged as stalled or not fetched).
fn cluster(dir: &std::path::Path, group: &str) -> (Broker, std::path::PathBuf) {
    let broker = Broker::cluster(3);
    broker.create_topic(INPUT, PARTITIONS);
    broker.create_topic(VERDICTS, PARTITIONS);
    broker.create_topic(DLQ, 1);
    let config = support::write_config(dir, &broker.all_bootstrap(), group);
    // librdkafka's default session timeout (45 s; heartbeat and poll
    // interval defaults with it), not the tests' 6 s: with 6 s a broker's
    // death made the member's session time out (no answer from the group
    // coordinator during the failover; Kafka fences a dead broker after 9 s),
    // so it revoked everything, waited for its drain and rejoined.
    let text: String = std::fs::read_to_string(&config)
        .unwrap()
        .lines()
        .filter(|l| {
            ![
                "\"session.timeout.ms\"",
                "\"heartbeat.interval.ms\"",
                "\"max.poll.interval.ms\"",
            ]
            .iter()
            .any(|key| l.starts_with(key))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(
        &config,
        format!("{text}\n[limits]\nstall_after = \"30s\"\n"),
    )
    .unwrap();
    (broker, config)
}

/// Every input partition committed to its end within `timeout`.
fn committed_to_the_end(broker: &Broker, group: &str, timeout: Duration) -> (Vec<i64>, Vec<i64>) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .unwrap();
    let ends: Vec<i64> = (0..PARTITIONS)
        .map(|p| {
            consumer
                .fetch_watermarks(INPUT, p, Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect();
    let deadline = Instant::now() + timeout;
    loop {
        let committed = support::committed(&broker.bootstrap(), group, PARTITIONS);
        if committed == ends || Instant::now() > deadline {
            return (committed, ends);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn write_row(name: &str, row: serde_json::Value) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reliability");
    let _ = std::fs::create_dir_all(&dir);
    std::fs::write(dir.join(format!("{name}.json")), row.to_string()).unwrap();
}

#[test]
fn killing_partition_leaders_one_at_a_time_loses_nothing_and_stalls_nothing() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let group = "g-leader-kill";
    let (mut broker, config) = cluster(dir.path(), group);
    let mut service = Modstream::start(&config, "leader-kill", dir.path());
    let clock = VerdictClock::start(&broker.all_bootstrap());
    let events = support::events("lk-", 0..(RATE as usize * 90));
    let load = produce_steady(broker.all_bootstrap(), events, RATE);
    std::thread::sleep(Duration::from_secs(8));

    // First the leader of input partition 0, then (after it is back) the
    // leader of verdict partition 0, or another node if that is the same.
    let mut kills = Vec::new();
    let first = broker.leader(INPUT, 0) as u32;
    let verdict_leaders: Vec<i32> = (0..PARTITIONS)
        .map(|p| broker.leader(VERDICTS, p))
        .collect();
    println!("killing node {first} (leads input 0; verdict leaders {verdict_leaders:?})");
    let at = Instant::now();
    broker.kill(first);
    kills.push((first, at));
    std::thread::sleep(Duration::from_secs(12));
    broker.start_node(first);
    broker.wait_for_all(Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(15));
    let mut second = broker.leader(VERDICTS, 0) as u32;
    if second == first {
        second = broker.node_ids().into_iter().find(|n| *n != first).unwrap();
    }
    println!("killing node {second}");
    let at = Instant::now();
    broker.kill(second);
    kills.push((second, at));
    std::thread::sleep(Duration::from_secs(12));
    broker.start_node(second);
    broker.wait_for_all(Duration::from_secs(60));

    let acked = load.join().unwrap();
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(120));
    v.report("three brokers, partition leaders killed one at a time");
    let gaps: Vec<f64> = kills
        .iter()
        .map(|(_, at)| {
            clock
                .longest_gap(*at, *at + Duration::from_secs(25))
                .as_secs_f64()
        })
        .collect();
    println!("longest time an input partition had no verdict after each kill: {gaps:?} s");
    let (committed, ends) = committed_to_the_end(&broker, group, Duration::from_secs(60));
    write_row(
        "kafka_cluster_leader_kills",
        serde_json::json!({
            "scenario": "three brokers, partition leaders killed one at a time (SIGKILL, restarted after 12 s)",
            "acked_inputs": v.acked_inputs, "verdicts": v.verdicts,
            "lost": v.lost.len(), "duplicates": v.duplicates,
            "killed_nodes": kills.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            "seconds_without_verdicts_after_each_kill": gaps,
            "committed": committed, "end_offsets": ends,
        }),
    );
    assert!(v.lost.is_empty(), "lost: {}", v.lost.len());
    assert_eq!(
        acked.len(),
        RATE as usize * 90,
        "the cluster took every input event"
    );
    assert_eq!(
        committed, ends,
        "every input partition committed to its end"
    );
    assert!(service.terminate(Duration::from_secs(30)));
    let log = support::log_of(dir.path(), "leader-kill");
    assert!(
        !log.contains("partition stalled") && !log.contains("partition not fetched"),
        "a partition stalled past limits.stall_after (30 s):\n{log}"
    );
}

#[test]
fn two_of_three_brokers_down_writes_wait_and_resume() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let group = "g-two-down";
    let (mut broker, config) = cluster(dir.path(), group);
    let mut service = Modstream::start(&config, "two-down", dir.path());
    let clock = VerdictClock::start(&broker.all_bootstrap());
    let events = support::events("td-", 0..(RATE as usize * 60));
    let load = produce_steady(broker.all_bootstrap(), events, RATE);
    std::thread::sleep(Duration::from_secs(8));
    let ids = broker.node_ids();
    let (b, c) = (ids[1], ids[2]);
    broker.kill(b);
    broker.kill(c);
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(20));
    broker.start_node(b);
    broker.start_node(c);
    broker.wait_for_all(Duration::from_secs(90));
    let outage = down.elapsed();
    println!("two of three brokers were down for {outage:?}");

    let acked = load.join().unwrap();
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(180));
    v.report("three brokers, two of them down for 20 s");
    let gap = clock
        .longest_gap(down, down + outage + Duration::from_secs(25))
        .as_secs_f64();
    println!("longest time an input partition had no verdict from the kill: {gap:.1} s");
    let (committed, ends) = committed_to_the_end(&broker, group, Duration::from_secs(90));
    let dlq = modstream::tools::read::TopicReader::from_beginning(&broker.bootstrap(), DLQ, None)
        .unwrap()
        .read_to_end(Duration::from_secs(30))
        .unwrap();
    write_row(
        "kafka_cluster_two_down",
        serde_json::json!({
            "scenario": "three brokers, two of them down for 20 s (SIGKILL, then restarted)",
            "acked_inputs": v.acked_inputs, "verdicts": v.verdicts,
            "lost": v.lost.len(), "duplicates": v.duplicates, "dlq_records": dlq.len(),
            "seconds_without_verdicts_after_each_kill": [gap],
            "committed": committed, "end_offsets": ends,
        }),
    );
    assert!(v.lost.is_empty(), "lost: {}", v.lost.len());
    assert!(
        dlq.is_empty(),
        "nothing dead-lettered for an outage: {} records",
        dlq.len()
    );
    assert_eq!(
        committed, ends,
        "every input partition committed to its end"
    );
    assert!(service.is_running(), "the service waited it out");
    assert!(service.terminate(Duration::from_secs(30)));
}
