//! The hub's side of exactly-once: seals, rewinds, dead letters in order.

use super::*;

const EXACTLY_ONCE: &str = r#"delivery = "exactly_once""#;

#[tokio::test(start_paused = true)]
async fn a_seal_answers_once_what_was_handed_over_is_acknowledged_and_holds_the_rest() {
    let mut h = harness_with(EXACTLY_ONCE);
    h.push(record(0, 0, 0));
    h.push(record(0, 1, 0));
    let first = h.jobs.try_recv().unwrap();
    h.result(scored(&first));
    let sealed = h.seal();
    assert!(
        sealed.try_recv().is_err(),
        "two records not acknowledged yet"
    );
    h.push(record(0, 2, 0));
    h.push(record(0, 3, 0));
    let second = h.jobs.try_recv().unwrap();
    h.result(scored(&second));
    assert_eq!(h.outbox.offsets(), vec![0, 1], "sealed: 2 and 3 wait");
    h.acks(2).await;
    let answer = sealed.try_recv().expect("answered once acknowledged");
    assert_eq!(
        answer.positions,
        vec![at(0, 2)],
        "exactly what was handed over"
    );
    assert_eq!((answer.records, answer.abort), (2, None));
    h.hub.on_control(Control::Unseal);
    assert_eq!(h.outbox.offsets(), vec![0, 1, 2, 3], "the next transaction");
    h.acks(2).await;
    assert_eq!(h.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_delivery_asks_for_an_abort_and_a_rewind_reads_the_partition_again() {
    let mut h = harness_with(EXACTLY_ONCE);
    h.outbox.fail_all(Some(Fate::InTransaction));
    h.push(record(0, 0, 0));
    h.push(record(0, 1, 0));
    let job = h.jobs.try_recv().unwrap();
    h.result(scored(&job));
    h.acks(2).await;
    let answer = h.seal().try_recv().expect("nothing outstanding");
    assert!(answer.abort.is_some(), "the transaction must abort");
    assert!(
        answer.positions.is_empty(),
        "no offset passed a failed record"
    );
    h.rewind(tp(0), 1);
    h.hub.on_control(Control::Unseal);
    assert_eq!(h.in_flight(), 0);
    h.outbox.fail_all(None);
    h.push(record(0, 1, 0));
    assert_eq!(h.summary().stale, 1, "polled before the seek: stale");
    h.push(record(0, 0, 1));
    h.push(record(0, 1, 1));
    let again = h.jobs.try_recv().expect("read again, scored again");
    h.result(scored(&again));
    h.acks(2).await;
    assert_eq!(h.seal().try_recv().unwrap().positions, vec![at(0, 2)]);
}

#[tokio::test(start_paused = true)]
async fn with_exactly_once_a_dead_letter_waits_for_the_verdicts_before_it() {
    let mut h = harness_with(EXACTLY_ONCE);
    h.push(record(0, 0, 0));
    let mut bad = record(0, 1, 0);
    bad.payload = Some(b"not json".to_vec());
    h.push(bad);
    assert!(h.outbox.sent().is_empty(), "offset 0 first");
    let job = h.jobs.try_recv().expect("the open batch closed behind it");
    h.result(scored(&job));
    let kinds: Vec<RecordKind> = h.outbox.sent().iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![RecordKind::Verdict, RecordKind::Dlq]);
    h.acks(2).await;
    assert_eq!(h.seal().try_recv().unwrap().positions, vec![at(0, 2)]);
}

#[tokio::test(start_paused = true)]
async fn after_an_abort_nothing_of_a_revoked_partition_goes_out_in_the_next_transaction() {
    let mut h = harness_with(EXACTLY_ONCE);
    h.push(record(0, 0, 0));
    h.push(record(0, 1, 0));
    let in_inference = h.jobs.try_recv().unwrap();
    // The revoke's drain times out on the consumer's side: the verdicts of
    // partition 0 are still in inference when the transaction is sealed.
    let _unanswered = h.revoke(tp(0), 1);
    let sealed = h.seal();
    h.result(scored(&in_inference));
    assert!(
        h.outbox.offsets().is_empty(),
        "sealed: the verdicts are held"
    );
    assert!(sealed.try_recv().is_ok(), "nothing was outstanding");
    // The consumer aborts (drain timed out) and rewinds what it owned and
    // what it lost.
    h.rewind(tp(0), 2);
    h.hub.on_control(Control::Unseal);
    h.hub.after_event();
    assert!(
        h.outbox.offsets().is_empty(),
        "the new owner reads partition 0 again: its held verdicts must not be in this member's next transaction"
    );
    assert_eq!(h.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_late_failure_of_an_aborted_transaction_does_not_abort_the_next_one() {
    let mut h = harness_with(EXACTLY_ONCE);
    h.outbox.fail_all(Some(Fate::InTransaction));
    h.push(record(0, 0, 0));
    h.push(record(0, 1, 0));
    let job = h.jobs.try_recv().unwrap();
    h.result(scored(&job));
    // Not acknowledged by the seal's deadline: an abort.
    let (reply, sealed) = std::sync::mpsc::channel();
    h.hub.on_control(Control::Seal {
        deadline: Instant::now(),
        reply,
    });
    h.hub.after_event();
    assert!(sealed.try_recv().unwrap().abort.is_some());
    let (done, _rewound) = std::sync::mpsc::channel();
    h.hub.on_control(Control::Rewind {
        partitions: vec![tp(0)],
        generation: crate::tp::Generation(1),
        done,
    });
    h.hub.on_control(Control::Unseal);
    // The aborted records' failures arrive in the next transaction.
    h.acks(2).await;
    h.outbox.fail_all(None);
    h.push(record(0, 0, 1));
    h.push(record(0, 1, 1));
    let again = h.jobs.try_recv().unwrap();
    h.result(scored(&again));
    h.acks(2).await;
    let answer = h.seal().try_recv().expect("answered");
    assert_eq!(
        answer.abort, None,
        "this transaction's records were delivered"
    );
    assert_eq!(answer.positions, vec![at(0, 2)]);
}
