//! The hub's own loop ([`Hub::run`]): acknowledgements already in are taken
//! in bursts of up to [`ACK_BURST`] a turn, and none is left behind:
//! acknowledgements that all resolve while the hub is idle still wake it,
//! and every offset reaches its commit.

use super::*;

const VERDICTS: &str = "moderation.verdicts";

#[tokio::test]
async fn acknowledgements_taken_in_bursts_all_reach_their_commit() {
    let events: i64 = 5 * ACK_BURST as i64 + 7;
    let Harness {
        hub,
        outbox,
        jobs,
        positions,
        ..
    } = harness_adjusted("", |s| s.batching.max_batch_size = 16);
    // Every verdict waits until released: the whole input is taken in and
    // scored, then the acknowledgements all resolve at once.
    outbox.hold_topic(VERDICTS);
    let (records_tx, records) = mpsc::channel(events as usize);
    for offset in 0..events {
        records_tx.try_send(record(0, offset, 0)).unwrap();
    }
    drop(records_tx);
    let (results_tx, results) = mpsc::channel(16);
    let scorer = tokio::spawn(async move {
        while let Ok(job) = jobs.recv().await {
            if results_tx.send(scored(&job)).await.is_err() {
                break;
            }
        }
    });
    let stored = tokio::spawn(async move {
        let mut last = None;
        while let Ok(batch) = positions.recv().await {
            if let Some(p) = batch.iter().rev().find(|p| p.tp == tp(0)) {
                last = Some(p.next);
            }
        }
        last
    });
    let (_control_tx, control) = mpsc::channel(1);
    let (_scorers_tx, scorers) = mpsc::channel(1);
    let (_policies_tx, policies) = mpsc::channel(1);
    let (_matching_tx, matching) = mpsc::channel(1);
    let inputs = Inputs {
        records,
        control,
        results,
        scorers,
        policies,
        matching,
        restored: None,
    };
    let run = tokio::spawn(hub.run(inputs));
    // Released once the hub has handed every verdict over and sleeps.
    let deadline = Instant::now() + Duration::from_secs(10);
    while outbox.offsets().len() < events as usize {
        assert!(
            Instant::now() < deadline,
            "{} verdicts handed over",
            outbox.offsets().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    outbox.release_topic(VERDICTS);
    let (summary, fatal) = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the hub finished once every acknowledgement was in")
        .unwrap();
    assert!(fatal.is_none());
    assert_eq!(summary.consumed, events as u64);
    assert_eq!(summary.verdicts, events as u64, "{summary:?}");
    assert_eq!(outbox.offsets(), (0..events).collect::<Vec<_>>());
    assert_eq!(
        stored.await.unwrap(),
        Some(events),
        "committed through the last offset"
    );
    scorer.abort();
}
