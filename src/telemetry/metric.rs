//! Every metric the service exports, in one table: name, type, unit and
//! help written once each; and the label values that are known in advance,
//! as enums.
//!
//! Names follow Prometheus conventions: `_total` counters, `_seconds`
//! histograms, labels of low cardinality only (topic, partition, verdict,
//! reason, kind); never event ids or text.

/// A metric's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Counter,
    Gauge,
    Histogram,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Type,
    pub unit: metrics::Unit,
    pub help: &'static str,
}

/// Declares each metric's name constant and its row in [`TABLE`] (and its
/// name in [`ALL`]) from one line.
macro_rules! metric_table {
    ($($(#[doc = $doc:expr])* $ident:ident = $name:literal, $kind:ident, $unit:ident, $help:literal;)*) => {
        $( $(#[doc = $doc])* pub const $ident: &str = $name; )*
        /// Every metric, with its type, unit and help.
        pub const TABLE: &[Metric] = &[
            $( Metric { name: $name, kind: Type::$kind, unit: metrics::Unit::$unit, help: $help }, )*
        ];
        /// Every metric name the service exports.
        pub const ALL: &[&str] = &[ $( $name, )* ];
    };
}

metric_table! {
    /// Records consumed from the input topics. Labels: topic.
    CONSUMED_TOTAL = "modstream_events_consumed_total", Counter, Count, "records consumed from the input topics";
    /// Verdicts acknowledged by the broker. Labels: verdict.
    VERDICTS_TOTAL = "modstream_verdicts_total", Counter, Count, "verdicts acknowledged by the broker";
    /// Dead-letter records acknowledged by the broker. Labels: reason.
    DLQ_TOTAL = "modstream_dlq_total", Counter, Count, "dead-letter records acknowledged by the broker";
    /// Optional event fields left out (missing is not counted: of another
    /// type or out of range), the event moderated without them. Labels:
    /// field (user_id, lang, created_at, priority, tenant, metadata).
    FIELD_WARNINGS_TOTAL = "modstream_field_warnings_total", Counter, Count, "optional event fields left out (another type or out of range), by field; the event is moderated without them";
    /// Records acknowledged by the broker. Labels: kind (verdict, dlq).
    PRODUCED_TOTAL = "modstream_records_produced_total", Counter, Count, "records acknowledged by the broker";
    /// Input topics the cluster does not list (looked at every 10 s).
    INPUT_TOPICS_MISSING = "modstream_input_topics_missing", Gauge, Count, "input topics the cluster does not list now (looked at every 10 s); /readyz names them";
    /// Where each model runs: 1 for each provider a worker's session of it
    /// runs on (`cpu`, `cuda`, `tensorrt`). Labels: model, provider.
    MODEL_PROVIDER = "modstream_model_provider", Gauge, Count, "1 for each execution provider that runs a worker's session of the model (cpu, cuda, tensorrt)";
    /// A GPU session's warm-up node runs on the CPU beside its provider
    /// (the most of any worker; 0 on CPU). Labels: model.
    MODEL_CPU_NODES = "modstream_model_cpu_nodes", Gauge, Count, "node runs of a GPU session's warm-up on the CPU beside its provider (0 on CPU)";
    /// Analytics records (decision, wave, sample) given up: their topic
    /// failed or they were not acknowledged within
    /// `output.analytics_timeout`; their offsets went on. Labels: kind.
    ANALYTICS_GIVEN_UP_TOTAL = "modstream_analytics_given_up_total", Counter, Count, "decision, wave and sample records given up (their topic failed, or output.analytics_timeout passed); moderation went on";
    /// Failed delivery attempts (each is retried). Labels: kind.
    DELIVERY_FAILURES_TOTAL = "modstream_delivery_failures_total", Counter, Count, "failed delivery attempts, each retried";
    /// Records the broker refused for good (also cut down): their offsets
    /// are committed so that the partition goes on. Labels: kind.
    UNDELIVERABLE_TOTAL = "modstream_undeliverable_total", Counter, Count, "records the broker refused for good, also cut down; their offsets are committed";
    /// Verdicts acknowledged, by the policy rule that decided them. Labels:
    /// rule (the ids of the policy file, never event data), verdict.
    POLICY_VERDICTS_TOTAL = "modstream_policy_verdicts_total", Counter, Count, "verdicts acknowledged, by the policy rule that decided them";
    /// When the policy in force took over (Unix seconds).
    POLICY_LOADED_TIMESTAMP_SECONDS = "modstream_policy_loaded_timestamp_seconds", Gauge, Seconds, "when the policy in force took over, Unix time";
    /// Events scored, per model. Labels: model (inference.models names).
    MODEL_EVENTS_TOTAL = "modstream_model_events_total", Counter, Count, "events scored, per model";
    /// Events per model run.
    BATCH_SIZE = "modstream_batch_size", Histogram, Count, "events per model run";
    /// From a batch's first event to its close, seconds.
    BATCH_WAIT_SECONDS = "modstream_batch_wait_seconds", Histogram, Seconds, "first event to batch close";
    /// One model run, seconds.
    INFERENCE_SECONDS = "modstream_inference_seconds", Histogram, Seconds, "duration of one model run";
    /// Failed model runs.
    INFERENCE_FAILURES_TOTAL = "modstream_inference_failures_total", Counter, Count, "failed model runs";
    /// Consumed and not yet delivered events.
    IN_FLIGHT_EVENTS = "modstream_in_flight_events", Gauge, Count, "consumed, not yet delivered events";
    /// Their bytes (key, value, headers), against `limits.max_in_flight_bytes`.
    IN_FLIGHT_BYTES = "modstream_in_flight_bytes", Gauge, Bytes, "bytes of consumed, not yet delivered records";
    /// Partitions paused for backpressure.
    PAUSED_PARTITIONS = "modstream_paused_partitions", Gauge, Count, "partitions paused for backpressure";
    /// Texts whose scores came from the score cache, and those it lacked.
    CACHE_HITS_TOTAL = "modstream_cache_hits_total", Counter, Count, "texts scored from the score cache";
    CACHE_MISSES_TOTAL = "modstream_cache_misses_total", Counter, Count, "texts the score cache lacked (scored by the model)";
    /// 1 while the circuit breaker on the model is open.
    INFERENCE_BREAKER_OPEN = "modstream_inference_breaker_open", Gauge, Count, "1 while the model fails every event and the circuit breaker holds events back";
    /// Partitions whose oldest undelivered event waited `limits.stall_after`.
    STALLED_PARTITIONS = "modstream_stalled_partitions", Gauge, Count, "partitions whose oldest undelivered event waited limits.stall_after or longer";
    /// Age of a partition's oldest undelivered event (0: none). Labels:
    /// topic, partition.
    OLDEST_PENDING_SECONDS = "modstream_oldest_pending_seconds", Gauge, Seconds, "age of the partition's oldest undelivered event, 0 when none";
    /// Offset commits. Labels: outcome (ok, error).
    COMMITS_TOTAL = "modstream_commits_total", Counter, Count, "offset commits by outcome";
    /// Rebalance events. Labels: kind (assign, revoke).
    REBALANCES_TOTAL = "modstream_rebalances_total", Counter, Count, "rebalance events by kind";
    /// Records from a partition this member no longer owns, left for the new owner.
    STALE_RECORDS_TOTAL = "modstream_stale_records_total", Counter, Count, "records of revoked partitions left for their new owner";
    /// Consumer errors. Labels: kind.
    ERRORS_TOTAL = "modstream_errors_total", Counter, Count, "consumer errors by kind";
    /// Input record timestamp to verdict acknowledgement, seconds.
    END_TO_END_SECONDS = "modstream_end_to_end_latency_seconds", Histogram, Seconds, "input record timestamp to verdict acknowledgement";
    /// Tokens fed to a token model (real ones, not padding).
    TOKENS_REAL_TOTAL = "modstream_tokens_real_total", Counter, Count, "tokens fed to a token model, padding excluded";
    /// Tokens fed to a token model including padding; real ÷ padded is the
    /// padding efficiency.
    TOKENS_PADDED_TOTAL = "modstream_tokens_padded_total", Counter, Count, "tokens fed to a token model, padding included";
    /// The batch size and deadline in use (fixed, or chosen for
    /// `batching.target_p99`).
    BATCH_TARGET_SIZE = "modstream_batch_target_size", Gauge, Count, "batch size in use (fixed, or chosen for batching.target_p99)";
    BATCH_TARGET_DELAY_SECONDS = "modstream_batch_target_delay_seconds", Gauge, Seconds, "batch deadline in use (fixed, or chosen for batching.target_p99)";
    /// The token budget per batch in use (`batching.max_batch_tokens`, or
    /// chosen for `batching.target_p99` by a controller counting tokens);
    /// 0 without one.
    BATCH_TARGET_TOKENS = "modstream_batch_target_tokens", Gauge, Count, "token budget per batch in use (batching.max_batch_tokens, or chosen for batching.target_p99); 0 without one";
    /// 1 while batching for throughput because the latency target cannot be
    /// held at the incoming rate (saturation).
    BATCHING_SATURATED = "modstream_batching_saturated", Gauge, Count, "1 while batching for throughput: the latency target cannot be held at the incoming rate";
    /// 1 while at saturation and the measured p99 is above `batching.target_p99`.
    LATENCY_TARGET_MISSED = "modstream_latency_target_missed", Gauge, Count, "1 while at saturation with the measured p99 above batching.target_p99";
    /// Hot reloads of the model and of the policy. Labels: outcome (loaded,
    /// refused).
    MODEL_RELOADS_TOTAL = "modstream_model_reloads_total", Counter, Count, "hot reloads of the model, by outcome (loaded, refused)";
    /// Versions of a model whose identity the hub holds: the one it started
    /// with and those a worker may still answer with. Labels: model.
    MODEL_VERSIONS_HELD = "modstream_model_versions_held", Gauge, Count, "versions of a model the hub holds: the first and those a worker may still answer with";
    POLICY_RELOADS_TOTAL = "modstream_policy_reloads_total", Counter, Count, "reloads of the policy on SIGHUP, by outcome (loaded, refused)";
    /// Shadow scoring: live and shadow verdicts of the same events (labels:
    /// live, shadow), events skipped because the shadow queue was full, and
    /// failures (label: stage = load, score, deliver, thread).
    SHADOW_AGREEMENT_TOTAL = "modstream_shadow_agreement_total", Counter, Count, "live and shadow verdicts of the same events (the confusion matrix)";
    SHADOW_SKIPPED_TOTAL = "modstream_shadow_skipped_total", Counter, Count, "events the shadow model skipped: its queue was full";
    SHADOW_FAILURES_TOTAL = "modstream_shadow_failures_total", Counter, Count, "shadow failures by stage (load, score, deliver, thread); the live path is never affected";
    /// Records behind the end of the partition (librdkafka statistics).
    /// Labels: topic, partition.
    CONSUMER_LAG = "modstream_consumer_lag", Gauge, Count, "records behind the partition end, per input partition";
    /// With `kafka.delivery = "exactly_once"`: transactions ended, by
    /// outcome (committed, or aborted and why); how long each lasted from
    /// begin to its end; the verdict and dead-letter records in each.
    TRANSACTIONS_TOTAL = "modstream_transactions_total", Counter, Count, "transactions ended, by outcome (committed, aborted_failed, aborted_timeout, aborted_rebalance, aborted_shutdown)";
    TRANSACTION_SECONDS = "modstream_transaction_seconds", Histogram, Seconds, "one transaction, from begin to commit or abort";
    /// With a Schema Registry input format: how long records have waited
    /// for an unreachable registry (0 when none waits), and the failed
    /// requests.
    SCHEMA_REGISTRY_WAIT_SECONDS = "modstream_schema_registry_wait_seconds", Gauge, Seconds, "how long records have waited, in order, for an unreachable schema registry; 0 when none waits";
    SCHEMA_REGISTRY_ERRORS_TOTAL = "modstream_schema_registry_errors_total", Counter, Count, "schema registry requests that got no usable answer (each is retried; records wait)";
    TRANSACTION_RECORDS = "modstream_transaction_records", Histogram, Count, "verdict and dead-letter records in one committed transaction";
    /// Matching (`[matching]`): known-bad list items matched (labels: list,
    /// of the configuration; verdict), the items each list holds, waves
    /// started, posts marked as in a wave, verdicts judged on reused
    /// scores, wave clusters kept and forgotten for room, and matching's
    /// time per event.
    LIST_MATCHES_TOTAL = "modstream_list_matches_total", Counter, Count, "events that matched a known-bad list item, by list and verdict";
    LIST_ITEMS = "modstream_list_items", Gauge, Count, "items in each known-bad list";
    LIST_RELOADS_TOTAL = "modstream_list_reloads_total", Counter, Count, "reloads of a list file, by list and outcome (loaded, refused)";
    LIST_TOPIC_REFUSED_TOTAL = "modstream_list_topic_refused_total", Counter, Count, "list topic records refused (not an item; logged with their key)";
    WAVES_STARTED_TOTAL = "modstream_waves_started_total", Counter, Count, "near-duplicate clusters that became waves";
    WAVE_POSTS_TOTAL = "modstream_wave_posts_total", Counter, Count, "posts marked as in a wave";
    VERDICTS_REUSED_TOTAL = "modstream_verdicts_reused_total", Counter, Count, "verdicts judged on the scores an earlier post of their wave with the same text was given, without a model run";
    WAVE_CLUSTERS = "modstream_wave_clusters", Gauge, Count, "near-duplicate clusters kept now";
    WAVE_CLUSTERS_EVICTED_TOTAL = "modstream_wave_clusters_evicted_total", Counter, Count, "clusters forgotten to make room (matching.max_clusters, matching.max_bytes) before their window ended";
    /// Bytes matching's state holds, against `matching.max_bytes`.
    /// Labels: part (lists, waves).
    MATCHING_BYTES = "modstream_matching_bytes", Gauge, Bytes, "bytes matching's state holds (lists, waves), against matching.max_bytes";
    /// Near-duplicate candidates left out by the bounds (a full bucket's
    /// oldest, and candidates past those a query compares). Labels: part.
    MATCHING_CANDIDATES_CUT_TOTAL = "modstream_matching_candidates_cut_total", Counter, Count, "near-duplicate candidates left out by the index's bounds (full buckets, comparisons per query)";
    /// List items refused because the lists would pass `matching.max_bytes`
    /// (a file: refused whole). Labels: list.
    LIST_ITEMS_OVER_BUDGET_TOTAL = "modstream_list_items_over_budget_total", Counter, Count, "list items refused because the lists would pass matching.max_bytes";
    /// 1 while the list topic's items may not all be in force: at start
    /// until it is read to its end offsets, and while it cannot be read; 0
    /// otherwise (and without a list topic).
    LIST_TOPIC_BEHIND = "modstream_list_topic_behind", Gauge, Count, "1 while the list topic is not read up to date (catching up at start, or it cannot be read)";
    STATE_ENTITIES = "modstream_state_entities", Gauge, Count, "entities whose state this instance holds (all its partitions)";
    STATE_BYTES = "modstream_state_bytes", Gauge, Bytes, "bytes charged for the entities' state, against state.max_bytes";
    STATE_EVICTED_TOTAL = "modstream_state_evicted_total", Counter, Count, "entities forgotten: the least recently seen past state.max_bytes, or idle past the longest window";
    STATE_RULES_FIRED_TOTAL = "modstream_state_rules_fired_total", Counter, Count, "events whose verdict a state rule raised, by rule";
    STATE_RESTORING_PARTITIONS = "modstream_state_restoring_partitions", Gauge, Count, "partitions whose state is being read back from the changelog (their verdicts wait)";
    STATE_RESTORED_ENTITIES_TOTAL = "modstream_state_restored_entities_total", Counter, Count, "entities read back from the changelog on assignment";
    MATCHER_SECONDS = "modstream_matcher_seconds", Histogram, Seconds, "matching's time on one event (normalise, lists, waves)";
    /// Verdicts the sampler drew for (`[sampling]`); with
    /// [`SAMPLES_TOTAL`] it gives the share sampled. Labels: tenant (the
    /// first 100 by name, then `_other`; `_none` without one).
    SAMPLING_EVENTS_TOTAL = "modstream_sampling_events_total", Counter, Count, "verdicts the sampler drew for, by tenant (the share sampled: samples / these)";
    /// Samples written with their verdict. Labels: tenant.
    SAMPLES_TOTAL = "modstream_samples_total", Counter, Count, "risk-weighted samples written for human labels, by tenant";
    /// Samples drawn but dropped by `sampling.max_per_second`. Labels: tenant.
    SAMPLES_DROPPED_TOTAL = "modstream_samples_dropped_total", Counter, Count, "samples drawn but dropped by the rate bound (sampling.max_per_second), by tenant";
}

/// Declares an enum of label values with `as_str()` and `ALL` (every value,
/// for [`super::register_zeroes`]).
macro_rules! label_values {
    ($(#[doc = $doc:expr])* $name:ident { $($variant:ident => $s:literal),* $(,)? }) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),* }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $s),* }
            }
        }
    };
}

label_values! {
    /// `modstream_errors_total{kind}`: where a consumer-side error happened.
    ErrorKind { Client => "client", Rebalance => "rebalance", Consume => "consume" }
}
label_values! {
    /// `modstream_rebalances_total{kind}`.
    RebalanceKind { Assign => "assign", Revoke => "revoke" }
}
label_values! {
    /// `modstream_commits_total{outcome}`.
    CommitOutcome { Ok => "ok", Error => "error" }
}
label_values! {
    /// `modstream_transactions_total{outcome}`: committed, or aborted
    /// because a record or the commit failed, because the commit did not
    /// finish within `kafka.transaction_timeout`, because a revoke could not
    /// drain in time, or because a shutdown gave up on deliveries.
    TxnOutcome {
        Committed => "committed",
        AbortedFailed => "aborted_failed",
        AbortedTimeout => "aborted_timeout",
        AbortedRebalance => "aborted_rebalance",
        AbortedShutdown => "aborted_shutdown",
    }
}
label_values! {
    /// `modstream_model_reloads_total{outcome}`, `modstream_policy_reloads_total{outcome}`.
    ReloadOutcome { Loaded => "loaded", Refused => "refused" }
}
label_values! {
    /// `modstream_shadow_failures_total{stage}`: where the shadow path failed.
    ShadowStage { Load => "load", Score => "score", Deliver => "deliver", Thread => "thread" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_in_the_table_once_with_a_unit_that_fits_its_name() {
        let mut names: Vec<&str> = TABLE.iter().map(|m| m.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TABLE.len(), "a name twice");
        assert_eq!(ALL.len(), TABLE.len());
        for m in TABLE {
            assert!(m.name.starts_with("modstream_"), "{}", m.name);
            if m.name.ends_with("_total") {
                assert_eq!(m.kind, Type::Counter, "{}", m.name);
            }
            if m.name.ends_with("_seconds") {
                assert_eq!(m.unit, metrics::Unit::Seconds, "{}", m.name);
            }
            assert!(!m.help.is_empty(), "{}", m.name);
        }
    }
}
