//! An offset's fate when its verdict and its decision record fare
//! differently: the verdict's own failure decides, a copy refused for good
//! is counted and committed past.

use super::*;

const VERDICTS: &str = "moderation.verdicts";
const DECISIONS: &str = "moderation.decisions";

/// What became of the batch's two offsets.
#[derive(Debug)]
struct Fared {
    /// The partition's position for the commit (at-least-once: the last
    /// stored; exactly-once: the seal's answer).
    committed: Option<i64>,
    /// Exactly-once: the seal asked for an abort.
    abort: bool,
    summary: RunSummary,
    fatal: bool,
}

/// Two events of one partition scored in one batch; their verdicts fail as
/// `verdict` says, their decision records as `copy` says.
async fn deliver(verdict: Option<Fate>, copy: Option<Fate>) -> Fared {
    let exactly_once = verdict == Some(Fate::InTransaction);
    let kafka = delivery_mode(exactly_once);
    let mut h = harness_adjusted(kafka, |s| {
        s.output.decisions_topic = Some(DECISIONS.to_string());
    });
    if let Some(fate) = verdict {
        h.outbox.fail_topic(VERDICTS, fate);
    }
    if let Some(fate) = copy {
        h.outbox.fail_topic(DECISIONS, fate);
    }
    h.two_answered().await;
    let sent = h.outbox.sent();
    assert_eq!(
        sent.iter().filter(|r| r.topic == DECISIONS).count(),
        2,
        "a decision record for each verdict"
    );
    let (committed, abort) = h.committed_on_0(exactly_once);
    Fared {
        committed,
        abort,
        summary: h.summary().clone(),
        fatal: h.hub.stages.delivery.stopped(),
    }
}

/// Neither offset is committed past.
fn held(fared: &Fared) {
    assert!(
        fared.committed.is_none_or(|p| p == 0),
        "committed past an undelivered verdict: {fared:?}"
    );
    assert_eq!(fared.summary.verdicts, 0, "{fared:?}");
}

#[tokio::test(start_paused = true)]
async fn verdict_delivered_and_copy_delivered_commit() {
    let fared = deliver(None, None).await;
    assert_eq!(fared.committed, Some(2), "{fared:?}");
    assert_eq!(fared.summary.verdicts, 2);
    assert_eq!(fared.summary.undeliverable, 0);
}

#[tokio::test(start_paused = true)]
async fn verdict_delivered_and_copy_refused_commit_and_count_both() {
    let fared = deliver(None, Some(Fate::Rejected)).await;
    assert_eq!(
        fared.committed,
        Some(2),
        "committed past the refused copies"
    );
    assert_eq!(fared.summary.undeliverable, 2, "each refused copy counted");
    assert_eq!(
        fared.summary.verdicts, 2,
        "the verdicts reached their topic and count as verdicts"
    );
}

#[tokio::test(start_paused = true)]
async fn verdict_abandoned_and_copy_delivered_hold_the_offset() {
    let fared = deliver(Some(Fate::Abandoned), None).await;
    held(&fared);
    assert_eq!(fared.summary.abandoned, 2);
}

#[tokio::test(start_paused = true)]
async fn verdict_abandoned_and_copy_refused_hold_the_offset() {
    let fared = deliver(Some(Fate::Abandoned), Some(Fate::Rejected)).await;
    held(&fared);
    assert_eq!(fared.summary.abandoned, 2);
    assert_eq!(fared.summary.undeliverable, 0, "nothing committed past");
}

#[tokio::test(start_paused = true)]
async fn verdict_fatal_and_copy_delivered_stop_without_committing() {
    let fared = deliver(Some(Fate::Fatal), None).await;
    held(&fared);
    assert!(fared.fatal, "the run stops on a fatal producer error");
}

#[tokio::test(start_paused = true)]
async fn verdict_fatal_and_copy_refused_stop_without_committing() {
    let fared = deliver(Some(Fate::Fatal), Some(Fate::Rejected)).await;
    held(&fared);
    assert!(fared.fatal, "the run stops on a fatal producer error");
}

#[tokio::test(start_paused = true)]
async fn verdict_failed_in_its_transaction_and_copy_delivered_abort() {
    let fared = deliver(Some(Fate::InTransaction), None).await;
    held(&fared);
    assert!(fared.abort, "the transaction must abort: {fared:?}");
}

#[tokio::test(start_paused = true)]
async fn verdict_failed_in_its_transaction_and_copy_refused_abort() {
    let fared = deliver(Some(Fate::InTransaction), Some(Fate::Rejected)).await;
    held(&fared);
    assert!(fared.abort, "the transaction must abort: {fared:?}");
}

#[tokio::test(start_paused = true)]
async fn a_copy_that_failed_otherwise_holds_the_offset_for_its_resend() {
    let fared = deliver(None, Some(Fate::Abandoned)).await;
    held(&fared);
    assert_eq!(fared.summary.abandoned, 2);
}

/// A verdict refused for good beside a copy abandoned at shutdown: the
/// offset is not committed past the copy (a restart sends both again).
#[tokio::test(start_paused = true)]
async fn verdict_refused_and_copy_abandoned_hold_the_offset() {
    let fared = deliver(Some(Fate::Rejected), Some(Fate::Abandoned)).await;
    held(&fared);
    assert_eq!(fared.summary.abandoned, 2);
    assert_eq!(fared.summary.undeliverable, 0, "nothing committed past");
}

/// An analytics copy given up (its topic failing) never holds its offset.
#[tokio::test(start_paused = true)]
async fn verdict_delivered_and_copy_given_up_commit() {
    let fared = deliver(None, Some(Fate::GivenUp)).await;
    assert_eq!(fared.committed, Some(2), "{fared:?}");
    assert_eq!(
        (fared.summary.verdicts, fared.summary.undeliverable),
        (2, 0)
    );
}
