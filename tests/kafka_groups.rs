//! Consumer-group protocols on Apache Kafka 4.4: the classic protocol with
//! eager (`range,roundrobin`, librdkafka's default) and cooperative-sticky
//! assignment, and KIP-848 (`group.protocol = consumer`, the broker assigns).
//! Under steady load a second member joins, then dies by SIGKILL: nothing is
//! lost, and the longest time an input partition went without verdicts
//! after each hand-over is measured (target/tmp/reliability/, stdout).

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::load::{VerdictClock, produce_steady};
use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const RATE: u32 = 200;

#[derive(Clone, Copy, Debug)]
enum Protocol {
    ClassicEager,
    ClassicCooperative,
    Consumer,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::ClassicEager => "classic_eager",
            Protocol::ClassicCooperative => "classic_cooperative_sticky",
            Protocol::Consumer => "consumer_kip848",
        }
    }

    /// The consumer lines of the tests' config for this protocol.
    fn rewrite(self, config: &str) -> String {
        match self {
            Protocol::ClassicEager => config.to_string(),
            Protocol::ClassicCooperative => config.replace(
                "\"group.protocol\" = \"classic\"",
                "\"group.protocol\" = \"classic\"\n\"partition.assignment.strategy\" = \"cooperative-sticky\"",
            ),
            // The broker sets session and heartbeat (group.consumer.*, the
            // same 6 s / 500 ms in tests/kafka/server.properties).
            Protocol::Consumer => config
                .lines()
                .filter(|l| !l.starts_with("\"session.timeout.ms\"") && !l.starts_with("\"heartbeat.interval.ms\""))
                .map(|l| l.replace("\"group.protocol\" = \"classic\"", "\"group.protocol\" = \"consumer\""))
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// One member, a second joins at 8 s, is killed (SIGKILL) at 22 s; load
/// for 36 s. Returns (join gap, kill gap) in seconds.
fn hand_over(protocol: Protocol) -> (f64, f64) {
    let broker = Broker::start();
    broker.create_topic(INPUT, 6);
    broker.create_topic(VERDICTS, 6);
    broker.create_topic(DLQ, 1);
    let dir = tempfile::tempdir().unwrap();
    let group = format!("g-{}", protocol.name());
    let config = support::write_config(dir.path(), &broker.bootstrap(), &group);
    let text = protocol.rewrite(&std::fs::read_to_string(&config).unwrap());
    std::fs::write(&config, text).unwrap();
    let mut first = Modstream::start(&config, &format!("{}-a", protocol.name()), dir.path());
    let clock = VerdictClock::start(&broker.bootstrap());
    let events = support::events(&format!("{}-", protocol.name()), 0..(RATE as usize * 36));
    let load = produce_steady(broker.bootstrap(), events, RATE);
    std::thread::sleep(Duration::from_secs(8));
    let joined = Instant::now();
    let mut second = Modstream::start(&config, &format!("{}-b", protocol.name()), dir.path());
    std::thread::sleep(Duration::from_secs(14));
    assert!(second.is_running() && first.is_running());
    let killed = Instant::now();
    second.kill9();
    let second_log = support::log_of(dir.path(), &format!("{}-b", protocol.name()));
    let taken: usize = support::assignments(&second_log).iter().sum();
    assert!(
        taken > 0,
        "{}: the member that joined received partitions:\n{second_log}",
        protocol.name()
    );
    let acked = load.join().unwrap();
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(120));
    v.report(&format!("hand-over, {}", protocol.name()));
    let join_gap = clock
        .longest_gap(joined, joined + Duration::from_secs(14))
        .as_secs_f64();
    let kill_gap = clock
        .longest_gap(killed, killed + Duration::from_secs(12))
        .as_secs_f64();
    println!(
        "{}: longest time an input partition had no verdict after a join {join_gap:.2} s, after a kill -9 {kill_gap:.2} s",
        protocol.name()
    );
    let dir_out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reliability");
    let _ = std::fs::create_dir_all(&dir_out);
    std::fs::write(
        dir_out.join(format!("hand_over_{}.json", protocol.name())),
        serde_json::json!({
            "scenario": format!("hand-over gap, {}", protocol.name()),
            "acked_inputs": v.acked_inputs, "verdicts": v.verdicts,
            "lost": v.lost.len(), "duplicates": v.duplicates,
            "seconds_without_verdicts_after_join": join_gap,
            "seconds_without_verdicts_after_kill9": kill_gap,
        })
        .to_string(),
    )
    .unwrap();
    assert!(
        v.lost.is_empty(),
        "{}: lost {}",
        protocol.name(),
        v.lost.len()
    );
    assert!(first.terminate(Duration::from_secs(20)));
    (join_gap, kill_gap)
}

#[test]
fn classic_eager_hand_over_loses_nothing() {
    let _serial = serial();
    hand_over(Protocol::ClassicEager);
}

#[test]
fn classic_cooperative_sticky_hand_over_loses_nothing() {
    let _serial = serial();
    hand_over(Protocol::ClassicCooperative);
}

#[test]
fn kip848_consumer_protocol_hand_over_loses_nothing() {
    let _serial = serial();
    hand_over(Protocol::Consumer);
}
