//! The hub's own loop ([`Hub::run`]): acknowledgements already in (futures
//! or the fast way's reports) are taken in bursts of up to [`ACK_BURST`] a
//! turn, and none is left behind: acknowledgements that all resolve while
//! the hub is idle still wake it, and every offset reaches its commit. At
//! abort, offsets waiting for their reports are abandoned, uncommitted.

use super::*;

const VERDICTS: &str = "moderation.verdicts";

/// The hub's loop over `events` records of partition 0 (input closed after
/// them), scored as they come; its task, and the last position stored.
struct Running {
    run: tokio::task::JoinHandle<(RunSummary, Option<ProducerError>)>,
    stored: tokio::task::JoinHandle<Option<i64>>,
    scorer: tokio::task::JoinHandle<()>,
}

/// Every verdict is held until released (so the whole input is taken in
/// and scored, then the acknowledgements all resolve at once).
fn run_held(events: i64, outbox: Outbox) -> (Running, Shutdown) {
    let mut settings = test_settings("");
    settings.batching.max_batch_size = 16;
    let Harness {
        hub,
        jobs,
        positions,
        ..
    } = harness_of_model_on(settings, None, outbox.clone());
    let shutdown = hub.shutdown.clone();
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
    (
        Running {
            run,
            stored,
            scorer,
        },
        shutdown,
    )
}

/// Wait (bounded) until the hub has handed every verdict over.
async fn all_handed_over(outbox: &Outbox, events: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while outbox.offsets().len() < events as usize {
        assert!(
            Instant::now() < deadline,
            "{} verdicts handed over",
            outbox.offsets().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn bursts_all_reach_their_commit(outbox: Outbox) {
    let events: i64 = 5 * ACK_BURST as i64 + 7;
    let (
        Running {
            run,
            stored,
            scorer,
        },
        _shutdown,
    ) = run_held(events, outbox.clone());
    // Released once the hub has handed every verdict over and sleeps.
    all_handed_over(&outbox, events).await;
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

#[tokio::test]
async fn acknowledgements_taken_in_bursts_all_reach_their_commit() {
    let outbox = Outbox::default();
    bursts_all_reach_their_commit(outbox.clone()).await;
    assert_eq!(outbox.tokens(), 5 * ACK_BURST + 7, "each verdict by report");
}

#[tokio::test]
async fn delivery_futures_taken_in_bursts_all_reach_their_commit() {
    let outbox = Outbox::futures_only();
    bursts_all_reach_their_commit(outbox.clone()).await;
    assert_eq!(outbox.tokens(), 0);
}

/// Shutdown gives up while every verdict waits for its report: the loop
/// ends (nothing waits for a report that may never matter), each offset
/// counted abandoned, none committed; the reports that come after find
/// nothing.
#[tokio::test]
async fn at_abort_offsets_waiting_for_their_reports_are_abandoned_uncommitted() {
    let events: i64 = 40;
    let outbox = Outbox::default();
    let (
        Running {
            run,
            stored,
            scorer,
        },
        shutdown,
    ) = run_held(events, outbox.clone());
    all_handed_over(&outbox, events).await;
    assert!(outbox.tokens() > 0, "the verdicts went the fast way");
    shutdown.abort.cancel();
    let (summary, fatal) = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the hub finished at abort")
        .unwrap();
    outbox.release_topic(VERDICTS);
    assert!(fatal.is_none());
    assert_eq!(summary.verdicts, 0, "{summary:?}");
    assert_eq!(summary.abandoned, events as u64, "{summary:?}");
    assert!(
        stored.await.unwrap().is_none_or(|p| p == 0),
        "nothing committed past an abandoned offset"
    );
    scorer.abort();
}
