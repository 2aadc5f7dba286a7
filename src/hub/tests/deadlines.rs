//! Batches close at their deadlines through the deadline queue, including
//! when an older entry of the same partition is stale.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_stale_deadline_does_not_close_the_partitions_next_batch_early() {
    let mut h = harness();
    // Two records fill a batch of 2: it closes full, its deadline entry stays.
    h.push(record(0, 0, 0));
    h.push(record(0, 1, 0));
    assert!(h.jobs.try_recv().is_ok(), "closed full");
    tokio::time::advance(Duration::from_millis(15)).await;
    // A new batch opens 15 ms later: its deadline is 35 ms from the start.
    h.push(record(0, 2, 0));
    tokio::time::advance(Duration::from_millis(5)).await;
    h.hub.after_event();
    assert!(
        h.hub.partitions[&tp(0)].deadline().is_some(),
        "the first batch's deadline passed; the open one is not due"
    );
    assert!(h.jobs.try_recv().is_err());
    tokio::time::advance(Duration::from_millis(15)).await;
    h.hub.after_event();
    let job = h.jobs.try_recv().expect("closed at its own deadline");
    assert_eq!(job.texts, vec!["post 2".to_string()]);
    assert!(h.hub.partitions[&tp(0)].deadline().is_none());
}

#[tokio::test(start_paused = true)]
async fn many_partitions_each_close_at_their_own_deadline() {
    let mut h = harness();
    let open = |h: &Harness| -> Vec<i32> {
        let mut open: Vec<i32> = (h.hub.partitions.iter())
            .filter(|(_, p)| p.deadline().is_some())
            .map(|(tp, _)| tp.partition)
            .collect();
        open.sort();
        open
    };
    // Partition p gets one record at p ms (its batch is due at p + 20 ms).
    for p in 0..64 {
        h.push(record(p, 0, 0));
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    // The last look was at 63 ms: partitions 0 to 43 are due and closed.
    assert_eq!(open(&h), (44..64).collect::<Vec<_>>());
    h.hub.after_event();
    assert_eq!(open(&h), (45..64).collect::<Vec<_>>(), "at 64 ms");
    tokio::time::advance(Duration::from_millis(19)).await;
    h.hub.after_event();
    assert!(open(&h).is_empty());
    assert_eq!(
        h.hub.stages.batching.deadlines_held(),
        0,
        "every entry taken"
    );
}

#[tokio::test(start_paused = true)]
async fn an_open_batch_closes_by_the_deadline_a_new_choice_gives_it() {
    let mut h = harness();
    h.push(record(0, 0, 0));
    // The latency controller shortens the deadline from 20 ms to 5 ms.
    let choice = crate::hub::stages::scoring::slo::Choice {
        size: 2,
        delay: Duration::from_millis(5),
    };
    (h.hub.stages.batching).set(choice, &mut h.hub.partitions);
    tokio::time::advance(Duration::from_millis(5)).await;
    h.hub.after_event();
    assert!(h.jobs.try_recv().is_ok(), "closed at the new deadline");
}
