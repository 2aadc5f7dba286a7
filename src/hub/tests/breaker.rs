//! The circuit breaker through the hub: a model failing every event holds
//! its events back and is probed; at shutdown they stay uncommitted.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_model_that_fails_everything_is_retried_instead_of_flooding_the_dlq() {
    let mut h = harness_adjusted("", |s| s.inference.breaker_after = 2);
    assert!(
        !h.health
            .model_failing
            .load(std::sync::atomic::Ordering::SeqCst)
    );
    // One batch scored: its text becomes the probe.
    h.push(record(1, 0, 0));
    h.push(record(1, 1, 0));
    let good = h.jobs.try_recv().unwrap();
    h.result(scored(&good));
    h.acks(2).await;
    for offset in 0..6 {
        h.push(record(0, offset, 0));
    }
    let (first, second) = (h.jobs.try_recv().unwrap(), h.jobs.try_recv().unwrap());
    // One run in which every event failed: dead-lettered as before.
    h.result(failed(&first));
    h.acks(2).await;
    assert_eq!(h.summary().dlq, 2);
    let third = h.jobs.try_recv().expect("the next batch went out");
    // The second in a row opens the breaker: held, not dead-lettered,
    // and so is a failed run that was already under way.
    h.result(failed(&second));
    assert!(
        h.health
            .model_failing
            .load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(
        h.hub.stages.scoring.breaker_open(ModelId(0)),
        "no input is taken meanwhile"
    );
    h.result(failed(&third));
    assert!(h.jobs.try_recv().is_err(), "no batch goes to the model");
    // A probe after 1 s; it fails, the next comes 2 s later.
    tokio::time::advance(Duration::from_secs(1)).await;
    h.hub.after_event();
    let probe = h.jobs.try_recv().expect("a probe");
    assert_eq!(
        probe.texts,
        vec!["post 0".to_string()],
        "the last text scored"
    );
    h.result(failed(&probe));
    tokio::time::advance(Duration::from_secs(1)).await;
    h.hub.after_event();
    assert!(h.jobs.try_recv().is_err(), "backing off");
    tokio::time::advance(Duration::from_secs(1)).await;
    h.hub.after_event();
    let probe = h.jobs.try_recv().expect("the second probe");
    h.result(scored(&probe));
    assert!(
        !h.health
            .model_failing
            .load(std::sync::atomic::Ordering::SeqCst)
    );
    // The held batches go to the model again, with their texts.
    let (a, b) = (h.jobs.try_recv().unwrap(), h.jobs.try_recv().unwrap());
    let mut texts = [a.texts.clone(), b.texts.clone()].concat();
    texts.sort();
    assert_eq!(texts, ["post 2", "post 3", "post 4", "post 5"]);
    h.result(scored(&a));
    h.result(scored(&b));
    h.acks(4).await;
    assert_eq!((h.summary().dlq, h.summary().verdicts), (2, 6));
    assert_eq!(
        h.outbox.offsets(),
        vec![0, 1, 2, 3, 4, 5],
        "in offset order"
    );
    assert_eq!(h.in_flight(), 0);
    let stored = h.stored().concat();
    assert!(stored.contains(&at(0, 6)), "{stored:?}");
}

#[tokio::test(start_paused = true)]
async fn events_held_by_the_breaker_are_given_up_uncommitted_at_the_shutdown_timeout() {
    let mut h = harness_adjusted("", |s| s.inference.breaker_after = 1);
    h.push(record(0, 0, 0));
    h.push(record(0, 1, 0));
    let job = h.jobs.try_recv().unwrap();
    h.result(failed(&job));
    assert!(h.hub.stages.scoring.breaker_open(ModelId(0)));
    assert_eq!(h.in_flight(), 2);
    // kafka.shutdown_timeout passed: the watchdog cancelled `abort`.
    h.hub.give_up_held();
    assert_eq!(h.in_flight(), 0, "the run can end");
    assert_eq!(h.summary().abandoned, 2, "reported as abandoned");
    assert_eq!(h.summary().dlq, 0);
    assert!(
        h.stored().concat().iter().all(|p| p.next == 0),
        "nothing committed past them"
    );
}
