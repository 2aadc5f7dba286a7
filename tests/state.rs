//! State rules on Apache Kafka 4.4: a velocity rule and a history rule,
//! through a kill -9 and a rebalance to a new member. Every verdict written
//! (copies from replays included) is checked against a recomputation from
//! the input in partition order: an owner that restored its state from the
//! changelog decides as one that never stopped. With exactly-once the kill
//! leaves a transaction open on the changelog, which the members after it
//! commit past: a restore that stopped at it would be behind.

mod support;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use modstream::tools::read::{Isolation, TopicReader};
use support::{Broker, DLQ, INPUT, Modstream, VERDICTS};

const CHANGELOG: &str = "state";
const PARTITIONS: i32 = 2;
const EVENTS: usize = 3000;
/// A minute of event time, in ms.
const MINUTE: i64 = 60_000;

const POLICY: &str = r#"
version = "state-v1"
[[rules]]
id = "default"
models.default.offensive = { review_at = 0.5, block_at = 0.85 }
[[state_rules]]
id = "long-run"
if = "user.posts_24h > 500"
raise = "review"
[[state_rules]]
id = "fast-poster"
if = "user.posts_1m > 5"
raise = "review"
label = "velocity"
[[state_rules]]
id = "repeat-offender"
if = "user.blocks_last3 >= 2"
raise = "block"
[[state_rules]]
id = "insult-run"
if = "user.offensive_over_0.3_10m >= 3"
raise = "review"
"#;

fn write_config(dir: &Path, bootstrap: &str, group: &str, exactly_once: Option<&str>) -> PathBuf {
    let base = match exactly_once {
        Some(instance) => support::eos::write_config(dir, bootstrap, group, instance, "1s"),
        None => support::write_config(dir, bootstrap, group),
    };
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let mut text = std::fs::read_to_string(&base).unwrap();
    text.push_str(&format!(
        "[policy]\nfile = \"{}\"\n[state]\nchangelog_topic = \"{CHANGELOG}\"\n",
        policy.display()
    ));
    std::fs::write(&base, text).unwrap();
    base
}

/// The events: one user in four posts is `spammer` (many posts a minute),
/// the rest spread over 300 users; texts from the sample posts (some
/// offensive); event time 100 ms apart, so a run covers five minutes.
/// (id, key = user, payload, timestamp).
fn events(t0: i64) -> Vec<(String, String, Vec<u8>, i64)> {
    let posts = modstream::tools::generator::sample_posts();
    (0..EVENTS)
        .map(|i| {
            let user = if i % 4 == 0 {
                "spammer".to_string()
            } else {
                format!("u{}", (i * 7) % 300)
            };
            let id = format!("s-{i}");
            let text = posts[(i * 13) % posts.len()].1;
            let payload = serde_json::json!({"event_id": id, "user_id": user, "text": text});
            (
                id,
                user,
                payload.to_string().into_bytes(),
                t0 + i as i64 * 100,
            )
        })
        .collect()
}

/// Produces in `chunks` acknowledged chunks, `pause` apart, keyed by user,
/// with each record's own timestamp.
fn produce(
    bootstrap: String,
    events: Vec<(String, String, Vec<u8>, i64)>,
    pause: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        use rdkafka::ClientConfig;
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("acks", "all")
            .create()
            .unwrap();
        for chunk in events.chunks(150) {
            for (_, key, payload, ts) in chunk {
                let mut record = BaseRecord::to(INPUT)
                    .key(key.as_str())
                    .payload(payload.as_slice())
                    .timestamp(*ts);
                while let Err((_, r)) = producer.send(record) {
                    record = r;
                    producer.poll(Duration::from_millis(20));
                }
            }
            producer
                .flush(Duration::from_secs(60))
                .expect("acknowledged");
            std::thread::sleep(pause);
        }
    })
}

/// An input record's place: (partition, offset).
type At = (i32, i64);

/// An input record, as the recomputation needs it.
struct Input {
    event_id: String,
    user: String,
    timestamp_ms: i64,
}

/// What a run left: the verdicts written for each input record (copies
/// from replays included), and the input records.
struct ReadBack {
    written: BTreeMap<At, Vec<Written>>,
    inputs: BTreeMap<At, Input>,
}

/// What the verdicts say of one input offset.
#[derive(Debug, Clone)]
struct Written {
    user: String,
    verdict: String,
    /// The verdict of the models alone (the highest threshold crossed).
    by_score: String,
    /// Its `offensive` score (f32, as the state compares it).
    offensive: f32,
    state_rule: Option<String>,
}

fn rank(v: &str) -> u8 {
    match v {
        "allow" => 0,
        "review" => 1,
        _ => 2,
    }
}

/// Every verdict record by (partition, offset), and the timestamp and user
/// of every input record.
fn read_back(bootstrap: &str, isolation: Isolation) -> ReadBack {
    let verdicts = TopicReader::with_isolation(bootstrap, VERDICTS, None, isolation)
        .unwrap()
        .read_to_end(Duration::from_secs(60))
        .unwrap();
    let mut written: BTreeMap<At, Vec<Written>> = BTreeMap::new();
    let mut users = HashMap::new();
    let input = TopicReader::from_beginning(bootstrap, INPUT, Some(PARTITIONS))
        .unwrap()
        .read_to_end(Duration::from_secs(60))
        .unwrap();
    let mut inputs = BTreeMap::new();
    for r in &input {
        let user = String::from_utf8(r.key.clone().unwrap()).unwrap();
        let event_id = r.json().unwrap()["event_id"].as_str().unwrap().to_string();
        users.insert(event_id.clone(), user.clone());
        let timestamp_ms = r.timestamp_ms.unwrap();
        let input = Input {
            event_id,
            user,
            timestamp_ms,
        };
        inputs.insert((r.partition, r.offset), input);
    }
    for r in verdicts {
        let v = r.json().unwrap();
        let crossed = v["reason"]["models"][0]["crossed"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let by_score = crossed
            .iter()
            .map(|c| c["verdict"].as_str().unwrap().to_string())
            .max_by_key(|v| rank(v))
            .unwrap_or_else(|| "allow".into());
        let at = (
            v["source"]["partition"].as_i64().unwrap() as i32,
            v["source"]["offset"].as_i64().unwrap(),
        );
        written.entry(at).or_default().push(Written {
            user: users[v["event_id"].as_str().unwrap()].clone(),
            verdict: v["verdict"].as_str().unwrap().to_string(),
            by_score,
            offensive: v["reason"]["models"][0]["scores"]["offensive"]
                .as_f64()
                .unwrap() as f32,
            state_rule: v["reason"]["state"]["rule"].as_str().map(String::from),
        });
    }
    ReadBack { written, inputs }
}

/// The state rules of [`POLICY`] applied in each partition's offset order:
/// (offset → (verdict, rule that raised it)).
fn recompute(run: &ReadBack) -> BTreeMap<At, (String, Option<String>)> {
    // user → (minute → posts), and the last verdicts; every post is within
    // the day before the next.
    let mut posts: HashMap<String, HashMap<i64, u64>> = HashMap::new();
    let mut insults: HashMap<String, HashMap<i64, u64>> = HashMap::new();
    let mut history: HashMap<String, VecDeque<String>> = HashMap::new();
    let mut expected = BTreeMap::new();
    for (
        at,
        Input {
            user, timestamp_ms, ..
        },
    ) in &run.inputs
    {
        let Some(Written {
            by_score,
            offensive,
            ..
        }) = run.written.get(at).map(|w| &w[0])
        else {
            continue;
        };
        let minute = timestamp_ms / MINUTE;
        let minutes = posts.entry(user.clone()).or_default();
        *minutes.entry(minute).or_default() += 1;
        let (n, day) = (minutes[&minute], minutes.values().sum::<u64>());
        let insulting = insults.entry(user.clone()).or_default();
        if *offensive > 0.3 {
            *insulting.entry(minute).or_default() += 1;
        }
        let last_10m: u64 = (insulting.iter())
            .filter(|(m, _)| **m > minute - 10 && **m <= minute)
            .map(|(_, n)| n)
            .sum();
        let blocks = history.get(user).map_or(0, |h| {
            h.iter().rev().take(3).filter(|v| *v == "block").count()
        });
        let mut verdict = by_score.clone();
        let mut rule = None;
        if blocks >= 2 && rank(&verdict) < 2 {
            (verdict, rule) = ("block".into(), Some("repeat-offender".to_string()));
        } else if day > 500 && rank(&verdict) < 1 {
            // Crossed once, late in the run (the spammer's 501st post): a
            // post counted twice before it moves it.
            (verdict, rule) = ("review".into(), Some("long-run".to_string()));
        } else if n > 5 && rank(&verdict) < 1 {
            (verdict, rule) = ("review".into(), Some("fast-poster".to_string()));
        } else if last_10m >= 3 && rank(&verdict) < 1 {
            (verdict, rule) = ("review".into(), Some("insult-run".to_string()));
        }
        // The models' verdict is remembered, not the raised one.
        let h = history.entry(user.clone()).or_default();
        h.push_back(by_score.clone());
        if h.len() > 10 {
            h.pop_front();
        }
        expected.insert(*at, (verdict, rule));
    }
    expected
}

/// The verdicts' ends summed over the partitions: (committed, written),
/// the first as a read_committed reader sees it (the last stable offsets),
/// the second with open transactions' records (the high watermarks).
fn verdict_ends(bootstrap: &str) -> (i64, i64) {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let end = |isolation: Isolation| -> i64 {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("isolation.level", isolation.as_str())
            .create()
            .unwrap();
        (0..PARTITIONS)
            .map(|p| {
                (consumer.fetch_watermarks(VERDICTS, p, Duration::from_secs(10)))
                    .unwrap()
                    .1
            })
            .sum()
    };
    (
        end(Isolation::ReadCommitted),
        end(Isolation::ReadUncommitted),
    )
}

/// Kill -9 of the first member mid-run, a second one taking over, then a
/// third joining (a rebalance): every verdict as a never-stopped owner
/// would decide.
fn crash_and_rebalance(exactly_once: bool) {
    let broker = Broker::start();
    broker.create_topic(INPUT, PARTITIONS);
    broker.create_topic(VERDICTS, PARTITIONS);
    broker.create_topic(DLQ, 1);
    broker.create_topic(CHANGELOG, PARTITIONS);
    let dir = tempfile::tempdir().unwrap();
    let group = "g-state";
    let config = |instance: &str| {
        let sub = dir.path().join(instance);
        std::fs::create_dir_all(&sub).unwrap();
        write_config(
            &sub,
            &broker.bootstrap(),
            group,
            exactly_once.then_some(instance),
        )
    };
    // In the past (the broker refuses timestamps over an hour ahead), on a
    // minute's start.
    let now = chrono::Utc::now().timestamp_millis() - 20 * MINUTE;
    let t0 = now - now % MINUTE;
    if !exactly_once {
        a_narrow_changelog_is_refused_at_start(&broker, dir.path());
    }
    let mut first_part = events(t0);
    let last_part = first_part.split_off(EVENTS * 2 / 3);
    let load = produce(broker.bootstrap(), first_part, Duration::from_millis(300));
    let first = config("a");
    if exactly_once {
        // The transaction the kill leaves open outlives both takeovers (the
        // broker aborts it 30 to 40 s later): a member that restores while
        // it is open must still read what the members after it committed
        // past it. Long transactions: the kill finds one open.
        let text = std::fs::read_to_string(&first).unwrap();
        let text = (text.replace(
            "transaction_timeout = \"10s\"",
            "transaction_timeout = \"30s\"",
        ))
        .replace("commit_interval = \"1s\"", "commit_interval = \"3s\"");
        std::fs::write(&first, text).unwrap();
    }
    let mut a = Modstream::start(&first, "state-a", dir.path());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (committed, written) = verdict_ends(&broker.bootstrap());
        let open = written - committed;
        if committed >= 300 && (!exactly_once || open >= 100) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first member wrote verdicts ({committed} committed, {open} more written)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    a.kill9();
    if exactly_once {
        let (committed, written) = verdict_ends(&broker.bootstrap());
        assert!(written > committed, "the kill left a transaction open");
    }
    let mut b = Modstream::start(&config("b"), "state-b", dir.path());
    load.join().unwrap();
    assert!(
        support::wait_for_committed_end(
            &broker.bootstrap(),
            group,
            PARTITIONS,
            Duration::from_secs(90)
        ),
        "the second member took over and committed the first two thirds"
    );
    let mut c = Modstream::start(&config("c"), "state-c", dir.path());
    // The last third only once the third member owns a partition taken
    // from the second: it restores that state at the partition's next
    // record and decides the rest from it.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while !support::log_of(dir.path(), "state-c").contains("partitions assigned") {
        assert!(
            std::time::Instant::now() < deadline,
            "the third member was given a partition"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    produce(broker.bootstrap(), last_part, Duration::from_millis(300))
        .join()
        .unwrap();
    assert!(
        support::wait_for_committed_end(
            &broker.bootstrap(),
            group,
            PARTITIONS,
            Duration::from_secs(120)
        ),
        "every event committed"
    );
    assert!(b.terminate(Duration::from_secs(30)) && c.terminate(Duration::from_secs(30)));
    let restored = [&b, &c]
        .iter()
        .map(|m| {
            support::log_of(dir.path(), &m.name)
                .matches("state restored from the changelog")
                .count()
        })
        .sum::<usize>();
    let isolation = if exactly_once {
        Isolation::ReadCommitted
    } else {
        Isolation::ReadUncommitted
    };
    let reading = std::time::Instant::now();
    let run = read_back(&broker.bootstrap(), isolation);
    println!("read back in {:?}", reading.elapsed());
    assert_eq!(run.inputs.len(), EVENTS);
    let expected = recompute(&run);
    let unanswered: Vec<_> = (run.inputs.keys())
        .filter(|at| !run.written.contains_key(at))
        .collect();
    // On failure, what the members said of transactions, restores and
    // partitions, for whoever reads CI's output.
    let said = || {
        ["state-a", "state-b", "state-c"]
            .iter()
            .flat_map(|name| {
                let log = support::log_of(dir.path(), name);
                let lines: Vec<String> = (log.lines())
                    .filter(|l| {
                        ["transaction", "restore", "partition", "revoke", "assign"]
                            .iter()
                            .any(|w| l.contains(w))
                    })
                    .map(|l| format!("{name}: {l}"))
                    .collect();
                let from = lines.len().saturating_sub(40);
                lines[from..].to_vec()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        unanswered.is_empty(),
        "{} events without a verdict, e.g. {:?}; the members' logs:\n{}",
        unanswered.len(),
        &unanswered[..unanswered.len().min(5)],
        said()
    );
    let mut wrong = Vec::new();
    let (mut copies, mut fired) = (0, 0);
    for (at, want) in &expected {
        for w in &run.written[at] {
            copies += 1;
            let got = (w.verdict.clone(), w.state_rule.clone());
            if &got != want {
                wrong.push(format!(
                    "{at:?} {}: wrote {got:?}, expected {want:?}",
                    w.user
                ));
            }
        }
        fired += usize::from(want.1.is_some());
    }
    let mut by_rule: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, rule) in expected.values() {
        *by_rule
            .entry(rule.as_deref().unwrap_or("none"))
            .or_default() += 1;
    }
    println!(
        "{} events, {copies} verdicts written, {fired} raised by state rules ({by_rule:?}), {restored} restores",
        expected.len()
    );
    assert!(
        wrong.is_empty(),
        "{} verdicts differ from a never-stopped owner's, e.g.:\n{}",
        wrong.len(),
        wrong[..wrong.len().min(10)].join("\n")
    );
    assert!(
        fired > 100,
        "the rules fired ({fired}): else this proves nothing"
    );
    assert!(
        restored >= 2,
        "the takeover and the rebalance restored state ({restored})"
    );
    if exactly_once {
        assert_eq!(copies, EVENTS, "read_committed: one verdict per event");
        assert!(
            support::log_of(dir.path(), "state-b").contains("state restore held"),
            "the takeover's restore, held by the open transaction, said so"
        );
    }
    explain_names_the_state_that_fired(&config("explain"), &run, &expected);
}

/// A changelog with fewer partitions than the input stops the start,
/// naming the key.
fn a_narrow_changelog_is_refused_at_start(broker: &Broker, dir: &Path) {
    broker.create_topic("state-narrow", 1);
    let sub = dir.join("narrow");
    std::fs::create_dir_all(&sub).unwrap();
    let config = write_config(&sub, &broker.bootstrap(), "g-narrow", None);
    let text = std::fs::read_to_string(&config).unwrap().replace(
        &format!("changelog_topic = \"{CHANGELOG}\""),
        "changelog_topic = \"state-narrow\"",
    );
    std::fs::write(&config, text).unwrap();
    let mut narrow = Modstream::start(&config, "state-narrow", dir);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while narrow.is_running() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ne!(narrow.exit_code(), Some(0), "the start fails");
    let log = support::log_of(dir, "state-narrow");
    assert!(
        log.contains("state.changelog_topic")
            && log.contains("it has 1 partitions and input topic posts has 2"),
        "{log}"
    );
}

/// `modstream explain` of the first event each rule raised names the
/// state rule (read from the changelog before the event's offset).
fn explain_names_the_state_that_fired(
    config: &Path,
    run: &ReadBack,
    expected: &BTreeMap<At, (String, Option<String>)>,
) {
    let mut rules_seen = std::collections::HashSet::new();
    let firsts = (expected.values().zip(expected.keys()))
        .filter(|((_, rule), _)| rule.as_ref().is_some_and(|r| rules_seen.insert(r.clone())))
        .map(|(want, at)| (at, want));
    let mut explained = 0;
    for (at, (verdict, rule)) in firsts {
        let rule = rule.as_deref().unwrap();
        let event_id = &run.inputs[at].event_id;
        let out = std::process::Command::new(support::modstream_binary())
            .args([
                "explain",
                "--event-id",
                event_id,
                "--topic",
                INPUT,
                "--config",
            ])
            .arg(config)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "explain {event_id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = format!("state rule {rule:?}");
        assert!(
            text.contains(&want),
            "explain {event_id} ({verdict} by {rule}) says:\n{text}"
        );
        assert!(text.contains(&format!("verdict: {verdict}")), "{text}");
        explained += 1;
    }
    assert_eq!(
        explained, 4,
        "an event raised by each of the four rules explained"
    );
}

/// One scenario at a time: each runs a broker and three members.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_restored_owner_decides_as_one_that_never_stopped() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    crash_and_rebalance(false);
}

#[test]
fn exactly_once_state_is_never_read_from_an_aborted_transaction() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    crash_and_rebalance(true);
}
