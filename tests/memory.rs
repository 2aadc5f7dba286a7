//! Memory is bounded by what the config says: a flood of large records on
//! Apache Kafka (one KRaft node), with matching (waves, reuse) and
//! sampling on, keeps the service's peak RSS within
//! `limits.max_in_flight_bytes` (the hub's share) + `matching.max_bytes`
//! (lists and wave clusters) + what it held once the model was loaded and
//! the group joined + a stated constant (the allocator's slack; librdkafka's
//! queues are within the budget).

mod support;

use std::time::Duration;

use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

const PARTITIONS: i32 = 4;
/// 3,000 records of 200 KB: 572 MiB, far more than the 128 MiB budget.
const RECORDS: usize = 3000;
const RECORD_BYTES: usize = 200 * 1024;
/// The text scored (within `limits.max_text_bytes`); the rest of each
/// record is a field the mapping does not read.
const TEXT_BYTES: usize = 32 * 1024;
const BUDGET_MIB: u64 = 128;
/// `matching.max_bytes`: the flood's unique texts would hold more.
const MATCHING_MIB: u64 = 16;
/// What may come on top of the budget: the allocator's slack (librdkafka's
/// consumer queue and one fetch response take an eighth of the budget
/// each, the hub's records the rest). With librdkafka's shares on top of
/// the budget the release build's peak was settled + 183 MiB here, over
/// this bound; within it, settled + 149 and + 155 MiB (issue 50).
const CONSTANT_MIB: u64 = 32;

/// Each record's text unlike every other's (words drawn by its own walk):
/// each starts a wave cluster of its own, which keeps its shingles (about
/// 65 KB at 32 KiB of text): 3,000 of them would hold about 190 MiB
/// unless `matching.max_bytes` bounds them (without the bound this test's
/// peak was 426 MiB against a bound of 291).
fn large_events() -> Vec<(String, String, Vec<u8>)> {
    (0..RECORDS)
        .map(|i| {
            let id = format!("f-{i}");
            let mut text = String::new();
            let mut k = 0usize;
            while text.len() < TEXT_BYTES {
                let word =
                    modstream::tools::generator::spread((i * 1_000_003 + k) as u64) % 200_000;
                text.push_str(&format!("w{word} "));
                k += 1;
            }
            let attachment = "x".repeat(RECORD_BYTES - TEXT_BYTES - 64);
            let payload =
                serde_json::json!({"event_id": id, "text": text, "attachment": attachment})
                    .to_string()
                    .into_bytes();
            (id, format!("user-{}", i % 97), payload)
        })
        .collect()
}

/// A `/proc/PID/status` field in MiB (VmRSS, VmHWM).
fn status_mib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

#[test]
fn a_flood_of_large_records_stays_within_the_byte_budget() {
    support::init_logs();
    let broker = Broker::start();
    broker.create_topic(INPUT, PARTITIONS);
    broker.create_topic(VERDICTS, PARTITIONS);
    broker.create_topic(DLQ, 1);
    let dir = tempfile::tempdir().unwrap();
    broker.create_topic("samples", 1);
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-flood");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("[output]\n", "[output]\nsamples_topic = \"samples\"\n");
    std::fs::write(
        &config,
        format!(
            "{text}\n[matching]\nwaves = true\nreuse = true\nwave_posts = 5\nwave_users = 2\nmax_bytes = {}\n[sampling]\nmin_rate = 0.05\nmax_rate = 0.5\n",
            MATCHING_MIB * 1024 * 1024
        ),
    )
    .unwrap();

    // Settled: a first run loads the model, joins the group and writes the
    // warm-up's verdicts; what it holds then is the baseline.
    let mut first = Modstream::start(&config, "settle", dir.path());
    let warm = support::produce(&broker.bootstrap(), &support::events("w-", 0..20));
    let v = support::verify(&broker.bootstrap(), &warm, Duration::from_secs(90));
    assert!(v.lost.is_empty(), "warm-up lost {:?}", v.lost);
    let settled = status_mib(first.pid().expect("modstream runs"), "VmRSS:");
    assert!(first.terminate(Duration::from_secs(30)), "stops cleanly");

    // The flood waits in the topic before the second run starts on it.
    let flood = large_events();
    let acked = support::produce(&broker.bootstrap(), &flood);
    drop(flood);
    let mut service = Modstream::start(&config, "flood", dir.path());
    let pid = service.pid().expect("modstream runs");
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(300));
    let peak = status_mib(pid, "VmHWM:");
    println!(
        "flood of {RECORDS} × {} KiB: settled {settled} MiB, peak {peak} MiB, \
         bound {} MiB; lost {}, duplicates {}",
        RECORD_BYTES / 1024,
        settled + BUDGET_MIB + MATCHING_MIB + CONSTANT_MIB,
        v.lost.len(),
        v.duplicates
    );
    assert!(v.lost.is_empty(), "lost {} events", v.lost.len());
    assert!(settled > 0 && peak > 0, "RSS not read");
    assert!(
        peak <= settled + BUDGET_MIB + MATCHING_MIB + CONSTANT_MIB,
        "peak RSS {peak} MiB over settled {settled} + budget {BUDGET_MIB} + matching {MATCHING_MIB} + {CONSTANT_MIB} MiB"
    );
    assert!(service.terminate(Duration::from_secs(30)), "stops cleanly");
}

/// A metric's value in a Prometheus exposition (the first series of it).
fn metric(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Entity state is bounded by `state.max_bytes` under a flood of distinct
/// users (each a new entity, about 9 MiB of state for 50,000 of them
/// unbounded): the state's charge stays within its 2 MiB, the least
/// recently seen forgotten, and the process's peak RSS within settled +
/// the byte budget + `state.max_bytes` + the constant above.
#[test]
fn a_flood_of_distinct_users_keeps_the_state_within_its_budget() {
    const USERS: usize = 50_000;
    const STATE_MIB: u64 = 2;
    let broker = Broker::start();
    broker.create_topic(INPUT, PARTITIONS);
    broker.create_topic(VERDICTS, PARTITIONS);
    broker.create_topic(DLQ, 1);
    broker.create_topic("state", PARTITIONS);
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        "version = \"v\"\n[[rules]]\nid = \"default\"\nmodels.default.offensive = { review_at = 0.5, block_at = 0.85 }\n\
         [[state_rules]]\nid = \"fast\"\nif = \"user.posts_1m > 5\"\nraise = \"review\"\n",
    )
    .unwrap();
    let config = support::write_config(dir.path(), &broker.bootstrap(), "g-users");
    let port = support::free_port();
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    std::fs::write(
        &config,
        format!(
            "{text}\n[policy]\nfile = \"{}\"\n[state]\nchangelog_topic = \"state\"\nmax_bytes = {}\n",
            policy.display(),
            STATE_MIB * 1024 * 1024
        ),
    )
    .unwrap();
    let mut service = Modstream::start(&config, "users", dir.path());
    let pid = service.pid().expect("modstream runs");
    let warm = support::produce(&broker.bootstrap(), &support::events("w-", 0..20));
    let v = support::verify(&broker.bootstrap(), &warm, Duration::from_secs(90));
    assert!(v.lost.is_empty(), "warm-up lost {:?}", v.lost);
    let settled = status_mib(pid, "VmRSS:");
    let flood: Vec<_> = (0..USERS)
        .map(|i| {
            let (id, user) = (format!("u-{i}"), format!("user-{i}"));
            let payload =
                serde_json::json!({"event_id": id, "user_id": user, "text": "hello there"});
            (id, user, payload.to_string().into_bytes())
        })
        .collect();
    let acked = support::produce(&broker.bootstrap(), &flood);
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(300));
    assert!(v.lost.is_empty(), "lost {} events", v.lost.len());
    let peak = status_mib(pid, "VmHWM:");
    let (_, exposition) = support::http_get(port, "/metrics");
    let bytes = metric(&exposition, "modstream_state_bytes").expect("state bytes exported");
    let entities = metric(&exposition, "modstream_state_entities").expect("entities exported");
    let evicted = metric(&exposition, "modstream_state_evicted_total").unwrap_or(0.0);
    let bound = settled + BUDGET_MIB + STATE_MIB + CONSTANT_MIB;
    println!(
        "{USERS} one-post users: state {bytes} bytes, {entities} entities, {evicted} forgotten; RSS settled {settled} MiB, peak {peak} MiB, bound {bound} MiB"
    );
    assert!(
        bytes <= (STATE_MIB * 1024 * 1024) as f64,
        "state charge {bytes} over {STATE_MIB} MiB"
    );
    assert!(
        entities > 0.0 && entities + evicted >= USERS as f64,
        "{entities} held, {evicted} forgotten"
    );
    assert!(
        settled > 0 && peak <= bound,
        "peak RSS {peak} MiB over {bound} MiB"
    );
    assert!(service.terminate(Duration::from_secs(30)), "stops cleanly");
}
