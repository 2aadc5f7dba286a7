//! Exactly-once verdicts (`kafka.delivery = "exactly_once"`) against Apache
//! Kafka 4.4: crashes, a zombie member, members joining and leaving and the
//! transaction coordinator killed in a three-broker cluster. Each scenario
//! reads the outputs back twice: `read_committed` (what downstream services
//! read) must hold exactly one verdict or dead-letter record per input event;
//! `read_uncommitted` shows that the aborted duplicates exist, so that the
//! check can fail.

mod support;

use std::sync::Mutex;
use std::time::Duration;

use modstream::tools::read::Isolation;
use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn topics(broker: &Broker, partitions: i32) {
    broker.create_topic(INPUT, partitions);
    broker.create_topic(VERDICTS, partitions);
    broker.create_topic(DLQ, 1);
}

#[test]
fn five_kill9_crashes_leave_one_output_per_event_for_read_committed_readers() {
    let _serial = serial();
    let broker = Broker::start();
    topics(&broker, 4);
    let dir = tempfile::tempdir().unwrap();
    let config = support::eos::write_config(dir.path(), &broker.bootstrap(), "g-eos", "a", "1s");
    let mut service = Modstream::start(&config, "eos-crash", dir.path());
    // Steady: an open transaction always holds some records when killed.
    let load = support::load::produce_steady(
        broker.bootstrap(),
        support::eos::events("x-", 7000, 50),
        200,
    );
    for crash in 1..=5u32 {
        let progressed =
            support::wait_for_progress(&broker.bootstrap(), 300, Duration::from_secs(30));
        // A different point of the transaction each time.
        std::thread::sleep(Duration::from_millis(130 * u64::from(crash)));
        println!("crash {crash}: progress before the kill: {progressed}");
        assert!(service.is_running(), "died by itself before crash {crash}");
        service.kill9();
        // Same instance id: the restart fences the dead one and aborts its
        // open transaction.
        service = Modstream::start(&config, "eos-crash", dir.path());
    }
    let acked = load.join().unwrap();
    assert!(
        support::wait_for_committed_end(&broker.bootstrap(), "g-eos", 4, Duration::from_secs(90)),
        "committed offsets reach the end of every partition"
    );
    assert!(
        service.terminate(Duration::from_secs(20)),
        "exits 0 on SIGTERM"
    );
    let committed = support::eos::outputs(&broker.bootstrap(), &acked, Isolation::ReadCommitted);
    let uncommitted =
        support::eos::outputs(&broker.bootstrap(), &acked, Isolation::ReadUncommitted);
    assert_eq!(committed.lost, 0, "read_committed: lost");
    assert_eq!(committed.duplicates, 0, "read_committed: duplicates");
    assert_eq!(committed.records, acked.len());
    assert!(committed.dlq > 0, "dead letters are part of the count");
    assert!(
        uncommitted.duplicates > 0,
        "the crashes left aborted records behind (read_uncommitted sees them): else this test proves nothing"
    );
}

#[test]
fn exactly_once_is_refused_at_start_by_a_cluster_without_transactions() {
    let _serial = serial();
    // One broker that cannot place its transaction log (three replicas asked).
    let broker = Broker::start_with("\ntransaction.state.log.replication.factor=3\n");
    topics(&broker, 1);
    let dir = tempfile::tempdir().unwrap();
    let config = support::eos::write_config(dir.path(), &broker.bootstrap(), "g-no-txn", "a", "1s");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("[kafka]\n", "[kafka]\nstartup_timeout = \"5s\"\n");
    std::fs::write(&config, text).unwrap();
    let started = std::time::Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_modstream"))
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {stderr}");
    assert!(
        stderr.contains("did not start transactions") && stderr.contains("g-no-txn.a"),
        "names the reason and the transactional id: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "within the startup timeout"
    );
}
