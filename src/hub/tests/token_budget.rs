//! `batching.max_batch_tokens`: batches and model runs bounded by their
//! predicted tokens, not only their count.

use super::*;

/// A record of partition `p` whose text is `bytes` bytes long.
fn post(p: i32, offset: i64, bytes: usize) -> Ingested {
    let text = "a".repeat(bytes);
    Ingested {
        payload: Some(format!(r#"{{"event_id":"e{p}-{offset}","text":"{text}"}}"#).into_bytes()),
        ..record(p, offset, 0)
    }
}

/// The hub's prediction for each text of a run (no token model: uncapped).
fn predicted(job: &InferenceJob) -> u64 {
    let estimate = crate::inference::tokens::TokenEstimate::new(None);
    job.texts.iter().map(|t| estimate.of(t.len())).sum()
}

fn budgeted(tokens: u64) -> Harness {
    harness_adjusted("", |s| {
        s.batching.max_batch_size = 64;
        s.batching.max_batch_tokens = Some(tokens);
    })
}

#[tokio::test(start_paused = true)]
async fn a_long_post_closes_the_batch_before_it_and_is_run_alone() {
    let mut h = budgeted(100);
    // 40 bytes: 12 predicted tokens each; eight fill 96 of the 100.
    for offset in 0..8 {
        h.push(post(0, offset, 40));
    }
    assert!(h.jobs.try_recv().is_err(), "96 tokens: still open");
    // A post of 2,000 bytes (502 tokens) would take the batch over: the
    // eight go as one run and the long post as its own.
    h.push(post(0, 8, 2_000));
    let first = h.jobs.try_recv().expect("the eight short posts");
    let second = h.jobs.try_recv().expect("the long post");
    assert_eq!((first.texts.len(), predicted(&first)), (8, 96));
    assert_eq!(second.texts.len(), 1);
    // Nothing lost or reordered: every verdict, in offset order.
    h.result(scored(&first));
    h.result(scored(&second));
    h.acks(9).await;
    assert_eq!(h.outbox.offsets(), (0..9).collect::<Vec<_>>());
    assert_eq!(h.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn runs_coalesced_across_partitions_stay_within_the_budget() {
    let mut h = budgeted(100);
    // Hold the one worker's two runs so that the later batches queue.
    h.push(post(9, 0, 2_000));
    h.push(post(9, 1, 2_000));
    let held = [h.jobs.try_recv().unwrap(), h.jobs.try_recv().unwrap()];
    // Four partitions, each a deadline-closed batch of 5 × 12 = 60 tokens:
    // with a count of 64 they would go as one run of 20 posts, 240 tokens.
    for p in 0..4 {
        for offset in 0..5 {
            h.push(post(p, offset, 40));
        }
    }
    tokio::time::advance(Duration::from_millis(20)).await;
    h.hub.after_event();
    for job in &held {
        h.result(scored(job));
    }
    let mut runs = Vec::new();
    while let Ok(job) = h.jobs.try_recv() {
        runs.push((job.texts.len(), predicted(&job)));
        h.result(scored(&job));
    }
    assert_eq!(runs, vec![(5, 60), (5, 60), (5, 60), (5, 60)]);
    h.acks(22).await;
    assert_eq!(h.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_prediction_follows_what_the_token_models_runs_measure() {
    let mut h = budgeted(100);
    for offset in 0..2 {
        h.push(post(0, offset, 2_000));
    }
    let job = h.jobs.try_recv().unwrap();
    assert_eq!(h.hub.stages.intake.token_estimate().of(40), 12);
    // The model found a token per two bytes (2 × 2 special + 2,000 tokens).
    let mut result = scored(&job);
    result.tokens = TokenStats {
        whole_texts: 2,
        whole_bytes: 4_000,
        whole_tokens: 2_004,
        ..TokenStats::default()
    };
    h.result(result);
    let per_byte = h.hub.stages.intake.token_estimate().per_byte();
    assert!(per_byte > 0.26 && per_byte < 0.5, "{per_byte}");
}

/// A hub with a latency target and a token budget over one model, a token
/// model (`max_length`) or a text model.
fn targeted(token_model: bool) -> Harness {
    let mut settings = Settings::from_toml(
        r#"
        [kafka]
        bootstrap_servers = "127.0.0.1:1"
        [input]
        topics = ["posts"]
        [batching]
        max_batch_size = 64
        max_batch_delay = "20ms"
        target_p99 = "200ms"
        max_batch_tokens = 4096
        [inference]
        workers = 1
        "#,
    )
    .unwrap();
    settings.kafka.drain_timeout = Duration::from_secs(1);
    harness_of_model(settings, token_model.then_some(512))
}

/// Eight posts of 12 predicted tokens, closed by their deadline, scored in
/// 2 ms plus 0.05 ms per token; then the controllers look again.
async fn one_measured_run(h: &mut Harness) {
    for offset in 0..8 {
        h.push(post(0, offset, 40));
    }
    tokio::time::advance(Duration::from_millis(20)).await;
    h.hub.after_event();
    let job = h.jobs.try_recv().expect("the deadline closed the batch");
    let tokens = predicted(&job);
    assert_eq!((job.texts.len(), tokens), (8, 96));
    let mut result = scored(&job);
    result.elapsed = Duration::from_micros(2_000 + 50 * tokens);
    h.result(result);
    h.acks(8).await;
    tokio::time::advance(crate::hub::stages::scoring::slo::TICK).await;
    h.hub.after_event();
}

#[tokio::test(start_paused = true)]
async fn a_token_models_controller_chooses_the_token_budget_not_the_count() {
    let mut h = targeted(true);
    assert_eq!(
        h.hub.stages.batching.tokens(),
        Some(4096),
        "the bound, before a run"
    );
    one_measured_run(&mut h).await;
    // Its choice (in predicted tokens) became the partitions' and the runs'
    // token budget; the count stays the configured bound.
    let chosen = h.hub.stages.batching.tokens().expect("a budget");
    // At this rate (96 tokens in the first tick) a deadline fills runs of
    // far fewer tokens than the bound: the choice follows the tokens.
    assert!(chosen < 96, "{chosen}");
    assert_eq!(h.hub.stages.batching.choice().size, 64);
    // The next posts close their batches by that budget.
    for offset in 8..12 {
        h.push(post(0, offset, 40));
    }
    let mut runs = Vec::new();
    while let Ok(job) = h.jobs.try_recv() {
        runs.push(predicted(&job));
        h.result(scored(&job));
    }
    assert!(
        !runs.is_empty() && runs.iter().all(|&t| t <= chosen.max(12)),
        "{runs:?} over {chosen}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_text_models_controller_still_chooses_the_count() {
    let mut h = targeted(false);
    one_measured_run(&mut h).await;
    assert_eq!(
        h.hub.stages.batching.tokens(),
        Some(4096),
        "the budget stays the bound"
    );
    assert!(
        h.hub.stages.batching.choice().size < 64,
        "{:?}",
        h.hub.stages.batching.choice()
    );
}
