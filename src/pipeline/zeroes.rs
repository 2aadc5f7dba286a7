//! Every series at 0 from the start ([`register_zeroes`]).

use crate::event::RejectReason;
use crate::producer::record::RecordKind;
use crate::telemetry::metric::{
    self, CommitOutcome, ErrorKind, RebalanceKind, ReloadOutcome, ShadowStage, TxnOutcome,
};
use crate::verdict::Verdict;

/// The labelled series of the models: shadow agreement and failures, errors, events per model.
fn register_model_zeroes(settings: &crate::config::Settings) {
    use metrics::counter;
    for live in Verdict::ALL {
        for shadow in Verdict::ALL {
            counter!(metric::SHADOW_AGREEMENT_TOTAL, "live" => live.as_str(), "shadow" => shadow.as_str())
                .absolute(0);
        }
    }
    for stage in ShadowStage::ALL {
        counter!(metric::SHADOW_FAILURES_TOTAL, "stage" => stage.as_str()).absolute(0);
    }
    for kind in ErrorKind::ALL {
        counter!(metric::ERRORS_TOTAL, "kind" => kind.as_str()).absolute(0);
    }
    for model in settings.models() {
        metrics::gauge!(metric::MODEL_VERSIONS_HELD, "model" => model.name.clone()).set(1.0);
        counter!(metric::MODEL_EVENTS_TOTAL, "model" => model.name).absolute(0);
    }
}

/// The metrics with labels, registered by their known label values.
const LABELLED: &[&str] = &[
    metric::CONSUMED_TOTAL,
    metric::VERDICTS_TOTAL,
    metric::DLQ_TOTAL,
    metric::FIELD_WARNINGS_TOTAL,
    metric::PRODUCED_TOTAL,
    metric::DELIVERY_FAILURES_TOTAL,
    metric::UNDELIVERABLE_TOTAL,
    metric::COMMITS_TOTAL,
    metric::REBALANCES_TOTAL,
    metric::TRANSACTIONS_TOTAL,
    metric::MODEL_RELOADS_TOTAL,
    metric::POLICY_RELOADS_TOTAL,
    // Per rule (the hub, from the policy) and per model (above).
    metric::POLICY_VERDICTS_TOTAL,
    metric::MODEL_EVENTS_TOTAL,
    // Per list (below).
    metric::LIST_MATCHES_TOTAL,
    metric::LIST_ITEMS,
    metric::LIST_RELOADS_TOTAL,
    // Per tenant, with sampling (below).
    metric::SAMPLING_EVENTS_TOTAL,
    metric::SAMPLES_TOTAL,
    metric::SAMPLES_DROPPED_TOTAL,
    // Per part of matching's state and per list (below).
    metric::MATCHING_BYTES,
    metric::MATCHING_CANDIDATES_CUT_TOTAL,
    metric::LIST_ITEMS_OVER_BUDGET_TOTAL,
    // Per record kind (below).
    metric::ANALYTICS_GIVEN_UP_TOTAL,
    // Per model, set as the models load.
    metric::MODEL_PROVIDER,
    metric::MODEL_CPU_NODES,
    metric::SHADOW_AGREEMENT_TOTAL,
    metric::SHADOW_FAILURES_TOTAL,
    metric::ERRORS_TOTAL,
    // Per partition: they appear with their partitions.
    metric::OLDEST_PENDING_SECONDS,
    metric::CONSUMER_LAG,
];

/// Every counter and gauge at 0 from the start, with its labels where they
/// are known before any event (input topics, verdict kinds, DLQ reasons,
/// record kinds, outcomes), so that alerts and dashboards find their series
/// on an idle instance. Per-partition series appear with their partitions.
pub fn register_zeroes(settings: &crate::config::Settings) {
    use metrics::{counter, gauge};
    for topic in &settings.input.topics {
        counter!(metric::CONSUMED_TOTAL, "topic" => topic.clone()).absolute(0);
    }
    for verdict in Verdict::ALL {
        counter!(metric::VERDICTS_TOTAL, "verdict" => verdict.as_str()).absolute(0);
    }
    for reason in RejectReason::ALL {
        counter!(metric::DLQ_TOTAL, "reason" => reason.code()).absolute(0);
    }
    for field in crate::event::OptionalField::ALL {
        counter!(metric::FIELD_WARNINGS_TOTAL, "field" => field.as_str()).absolute(0);
    }
    for kind in RecordKind::ALL.into_iter().filter(|k| k.is_analytics()) {
        counter!(metric::ANALYTICS_GIVEN_UP_TOTAL, "kind" => kind.as_str()).absolute(0);
    }
    for kind in RecordKind::ALL.map(RecordKind::as_str) {
        counter!(metric::PRODUCED_TOTAL, "kind" => kind).absolute(0);
        counter!(metric::DELIVERY_FAILURES_TOTAL, "kind" => kind).absolute(0);
        counter!(metric::UNDELIVERABLE_TOTAL, "kind" => kind).absolute(0);
    }
    for outcome in CommitOutcome::ALL {
        counter!(metric::COMMITS_TOTAL, "outcome" => outcome.as_str()).absolute(0);
    }
    for outcome in TxnOutcome::ALL {
        counter!(metric::TRANSACTIONS_TOTAL, "outcome" => outcome.as_str()).absolute(0);
    }
    for kind in RebalanceKind::ALL {
        counter!(metric::REBALANCES_TOTAL, "kind" => kind.as_str()).absolute(0);
    }
    for outcome in ReloadOutcome::ALL.iter().map(|o| o.as_str()) {
        counter!(metric::MODEL_RELOADS_TOTAL, "outcome" => outcome).absolute(0);
        counter!(metric::POLICY_RELOADS_TOTAL, "outcome" => outcome).absolute(0);
    }
    register_model_zeroes(settings);
    register_matching_zeroes(settings);
    register_sampling_zeroes(settings);
    for m in metric::TABLE {
        // Those without labels; the labelled ones are above.
        if LABELLED.contains(&m.name) {
            continue;
        }
        match m.kind {
            metric::Type::Counter => counter!(m.name).absolute(0),
            metric::Type::Gauge => gauge!(m.name).set(0.0),
            metric::Type::Histogram => {}
        }
    }
    let b = &settings.batching;
    gauge!(metric::BATCH_TARGET_SIZE).set(b.max_batch_size as f64);
    gauge!(metric::BATCH_TARGET_DELAY_SECONDS).set(b.max_batch_delay.as_secs_f64());
    gauge!(metric::BATCH_TARGET_TOKENS).set(b.max_batch_tokens.unwrap_or(0) as f64);
}

/// With sampling: its series per tenant. Tenants come with their events;
/// events without one are `_none`, from the start.
fn register_sampling_zeroes(settings: &crate::config::Settings) {
    if settings.output.samples_topic.is_none() {
        return;
    }
    for name in [
        metric::SAMPLING_EVENTS_TOTAL,
        metric::SAMPLES_TOTAL,
        metric::SAMPLES_DROPPED_TOTAL,
    ] {
        metrics::counter!(name, "tenant" => crate::sampling::NO_TENANT).absolute(0);
    }
}

/// The series of each configured list (matches by verdict, items, reloads).
fn register_matching_zeroes(settings: &crate::config::Settings) {
    use metrics::counter;
    for list in settings.matching.list_names() {
        for verdict in [Verdict::Review, Verdict::Block] {
            counter!(metric::LIST_MATCHES_TOTAL, "list" => list.clone(), "verdict" => verdict.as_str())
                .absolute(0);
        }
        metrics::gauge!(metric::LIST_ITEMS, "list" => list.clone()).set(0.0);
        counter!(metric::LIST_ITEMS_OVER_BUDGET_TOTAL, "list" => list.clone()).absolute(0);
    }
    for part in ["lists", "waves"] {
        metrics::gauge!(metric::MATCHING_BYTES, "part" => part).set(0.0);
        counter!(metric::MATCHING_CANDIDATES_CUT_TOTAL, "part" => part).absolute(0);
    }
    for list in &settings.matching.lists {
        for outcome in ReloadOutcome::ALL.iter().map(|o| o.as_str()) {
            counter!(metric::LIST_RELOADS_TOTAL, "list" => list.name.clone(), "outcome" => outcome)
                .absolute(0);
        }
    }
}
