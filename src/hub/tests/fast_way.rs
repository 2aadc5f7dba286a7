//! An offset whose verdict goes alone: the fast way (its report by token)
//! and the futures way give it the same fate, for every failure the
//! producer answers with.

use super::*;

const VERDICTS: &str = "moderation.verdicts";

/// What became of a batch's two offsets.
#[derive(Debug, PartialEq)]
struct Fared {
    /// The partition's position for the commit (at-least-once: the last
    /// stored; exactly-once: the seal's answer).
    committed: Option<i64>,
    /// Exactly-once: the seal asked for an abort.
    abort: bool,
    verdicts: u64,
    undeliverable: u64,
    abandoned: u64,
    fatal: bool,
}

/// Two events of one partition scored in one batch, their verdicts failing
/// as `fate` says, delivered through `outbox`.
async fn deliver(fate: Option<Fate>, outbox: Outbox) -> Fared {
    let exactly_once = fate == Some(Fate::InTransaction);
    let kafka = delivery_mode(exactly_once);
    let mut h = harness_of_model_on(test_settings(kafka), None, outbox);
    if let Some(fate) = fate {
        h.outbox.fail_topic(VERDICTS, fate);
    }
    h.two_answered().await;
    let (committed, abort) = h.committed_on_0(exactly_once);
    let summary = h.summary();
    Fared {
        committed,
        abort,
        verdicts: summary.verdicts,
        undeliverable: summary.undeliverable,
        abandoned: summary.abandoned,
        fatal: h.hub.stages.delivery.stopped(),
    }
}

/// Both ways, checking that the fast way was taken; its fate.
async fn both_ways(fate: Option<Fate>) -> Fared {
    let fast = Outbox::default();
    let by_reports = deliver(fate, fast.clone()).await;
    assert_eq!(fast.tokens(), 2, "both verdicts went the fast way");
    let by_futures = deliver(fate, Outbox::futures_only()).await;
    assert_eq!(by_reports, by_futures, "the two ways differ for {fate:?}");
    by_reports
}

#[tokio::test(start_paused = true)]
async fn delivered_both_ways_commits() {
    let fared = both_ways(None).await;
    assert_eq!((fared.committed, fared.verdicts), (Some(2), 2), "{fared:?}");
}

#[tokio::test(start_paused = true)]
async fn refused_for_good_both_ways_is_counted_and_committed_past() {
    let fared = both_ways(Some(Fate::Rejected)).await;
    assert_eq!(fared.committed, Some(2), "{fared:?}");
    assert_eq!((fared.verdicts, fared.undeliverable), (0, 2), "{fared:?}");
}

#[tokio::test(start_paused = true)]
async fn abandoned_both_ways_holds_the_offsets() {
    let fared = both_ways(Some(Fate::Abandoned)).await;
    assert!(fared.committed.is_none_or(|p| p == 0), "{fared:?}");
    assert_eq!((fared.verdicts, fared.abandoned), (0, 2), "{fared:?}");
}

#[tokio::test(start_paused = true)]
async fn fatal_both_ways_stops_without_committing() {
    let fared = both_ways(Some(Fate::Fatal)).await;
    assert!(fared.fatal, "{fared:?}");
    assert!(fared.committed.is_none_or(|p| p == 0), "{fared:?}");
}

#[tokio::test(start_paused = true)]
async fn failed_in_its_transaction_both_ways_aborts() {
    let fared = both_ways(Some(Fate::InTransaction)).await;
    assert!(fared.abort, "{fared:?}");
    assert_eq!(fared.verdicts, 0, "{fared:?}");
}

/// A report that comes after its offset was given up (abort) finds
/// nothing: no second acknowledgement, nothing counted twice.
#[tokio::test(start_paused = true)]
async fn a_report_after_its_offset_was_abandoned_is_ignored() {
    let mut h = harness();
    h.outbox.hold_topic(VERDICTS);
    h.push(record(0, 0, 0));
    h.push(record(0, 1, 0));
    let job = h.jobs.try_recv().unwrap();
    h.result(scored(&job));
    let mut reports = h.hub.stages.delivery.take_reports().unwrap();
    assert!(h.hub.stages.delivery.awaits_reports());
    let abandoned = h.hub.stages.delivery.abandon_reported();
    assert_eq!(abandoned.len(), 2);
    for ack in abandoned {
        h.hub.on_ack(ack);
    }
    assert_eq!(h.in_flight(), 0);
    h.outbox.release_topic(VERDICTS);
    for _ in 0..2 {
        let report = tokio::time::timeout(Duration::from_secs(1), reports.recv())
            .await
            .expect("reported once released")
            .unwrap();
        assert!(h.hub.stages.delivery.reported(report).is_none());
    }
    assert_eq!(h.summary().abandoned, 2);
    assert_eq!(h.summary().verdicts, 0);
}
