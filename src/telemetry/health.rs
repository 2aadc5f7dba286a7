//! What /readyz reports ([`Health`]), the one way stalls are reported
//! ([`StallReporter`]), and the HTTP server for /metrics, /healthz, /readyz.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use super::{TelemetryError, metric};
use crate::tp::Tp;

/// What /readyz reports: ready once the model is loaded, the consumer has
/// joined (partitions assigned or waiting for an assignment) and the
/// producer reached the cluster, and while no partition is stalled.
#[derive(Debug, Default)]
pub struct Health {
    pub model_loaded: AtomicBool,
    pub consumer_ready: AtomicBool,
    pub producer_connected: AtomicBool,
    /// The model fails every event: the circuit breaker is open.
    pub model_failing: AtomicBool,
    /// Written by the hub's watchdog ([`StallKind::Undelivered`]), read by
    /// /readyz. A lock, not a channel: /readyz reads the latest state
    /// whenever it is asked, and writers hold it only to swap a vector.
    stalled: std::sync::Mutex<Vec<Stall>>,
    /// Written by the consumer thread ([`StallKind::Unfetched`]): assigned
    /// partitions that lag yet are not fetched.
    unfetched: std::sync::Mutex<Vec<Stall>>,
    /// Deliveries failing for the whole service, and why.
    delivery_failing: std::sync::Mutex<Option<String>>,
    /// With exactly-once: the last transaction could not commit within
    /// `kafka.transaction_timeout` and was aborted, and why (cleared by the
    /// next commit).
    transaction_failing: std::sync::Mutex<Option<String>>,
    /// With a Schema Registry input format: the registry cannot be reached
    /// for a schema the next record needs, since when and why (cleared once
    /// it answers). Records wait, in order, meanwhile.
    registry_unreachable: std::sync::Mutex<Option<String>>,
    /// With `matching.list_topic`: why its items may not all be in force
    /// (still read to its end at start, or it cannot be read); written by
    /// its reader, cleared once it reads up to date.
    list_topic: std::sync::Mutex<Option<String>>,
    /// With `state.changelog_topic`: partitions whose state is being read
    /// back (`TOPIC-PARTITION` → what the restore is doing or why it
    /// cannot); their verdicts wait.
    restoring: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
    /// Analytics topics (decisions, waves, samples) whose records are given
    /// up now, and why: reported, not failing readiness (moderation goes
    /// on without them).
    analytics_failing: std::sync::Mutex<Option<String>>,
    /// Input topics the cluster does not list: nothing of theirs can be
    /// consumed (a condition of readiness).
    input_missing: std::sync::Mutex<Vec<MissingTopic>>,
    /// Where each model runs (set as the models load; reported, not a
    /// condition of readiness).
    models: std::sync::Mutex<Vec<ModelPlacement>>,
    /// This run's faults (its metrics count those of the whole process).
    pub faults: super::FaultTally,
}

/// Where a model runs: the providers its workers' sessions run on, how
/// many workers, and the most node runs any worker's warm-up made on the
/// CPU beside a GPU provider.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelPlacement {
    pub model: String,
    pub providers: Vec<&'static str>,
    pub workers: usize,
    pub cpu_nodes: usize,
}

impl ModelPlacement {
    /// `modstream_model_provider{model,provider}` 1 per provider, and
    /// `modstream_model_cpu_nodes{model}`.
    pub fn export(&self) {
        for provider in &self.providers {
            metrics::gauge!(metric::MODEL_PROVIDER, "model" => self.model.clone(), "provider" => *provider).set(1.0);
        }
        metrics::gauge!(metric::MODEL_CPU_NODES, "model" => self.model.clone())
            .set(self.cpu_nodes as f64);
    }
}

/// A partition whose oldest undelivered event has waited too long.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stall {
    pub topic: String,
    pub partition: i32,
    /// The oldest undelivered offset: the committed position stays there.
    pub offset: i64,
    pub waiting_s: u64,
    /// Undelivered events of the partition.
    pub pending: usize,
}

impl Health {
    pub fn ready(&self) -> bool {
        self.model_loaded.load(Ordering::SeqCst)
            && self.consumer_ready.load(Ordering::SeqCst)
            && self.producer_connected.load(Ordering::SeqCst)
            && !self.model_failing.load(Ordering::SeqCst)
            && self.stalled().is_empty()
            && self.unfetched().is_empty()
            && self.delivery_failing().is_none()
            && self.transaction_failing().is_none()
            && self.registry_unreachable().is_none()
            && self.list_topic().is_none()
            && self.restoring().is_empty()
            && self.input_missing().is_empty()
    }

    pub fn input_missing(&self) -> Vec<String> {
        self.input_missing
            .lock()
            .map(|m| m.iter().map(|t| t.name.clone()).collect())
            .unwrap_or_default()
    }

    /// For each missing input topic with a listed topic close to its name:
    /// "did you mean NAME".
    fn did_you_mean(&self) -> std::collections::BTreeMap<String, String> {
        let missing = self.input_missing.lock().map(|m| m.clone());
        (missing.unwrap_or_default().into_iter())
            .filter_map(|t| Some((t.name, format!("did you mean {}", t.did_you_mean?))))
            .collect()
    }

    pub fn set_input_missing(&self, topics: Vec<MissingTopic>) {
        metrics::gauge!(metric::INPUT_TOPICS_MISSING).set(topics.len() as f64);
        if let Ok(mut m) = self.input_missing.lock() {
            *m = topics;
        }
    }

    pub fn set_models(&self, models: Vec<ModelPlacement>) {
        if let Ok(mut m) = self.models.lock() {
            *m = models;
        }
    }

    pub fn models(&self) -> Vec<ModelPlacement> {
        self.models.lock().map(|m| m.clone()).unwrap_or_default()
    }

    pub fn analytics_failing(&self) -> Option<String> {
        self.analytics_failing.lock().ok().and_then(|d| d.clone())
    }

    pub fn set_analytics_failing(&self, why: Option<String>) {
        if let Ok(mut d) = self.analytics_failing.lock() {
            *d = why;
        }
    }

    pub fn list_topic(&self) -> Option<String> {
        self.list_topic.lock().ok().and_then(|d| d.clone())
    }

    pub fn set_list_topic(&self, why: Option<String>) {
        if let Ok(mut d) = self.list_topic.lock() {
            *d = why;
        }
    }

    pub fn restoring(&self) -> std::collections::BTreeMap<String, String> {
        self.restoring.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// A partition's restore: what it is doing, or `None` once done.
    pub fn set_restoring(&self, tp: &Tp, doing: Option<String>) {
        if let Ok(mut r) = self.restoring.lock() {
            let key = format!("{}-{}", tp.topic, tp.partition);
            match doing {
                Some(d) => r.insert(key, d),
                None => r.remove(&key),
            };
            metrics::gauge!(metric::STATE_RESTORING_PARTITIONS).set(r.len() as f64);
        }
    }

    pub fn registry_unreachable(&self) -> Option<String> {
        self.registry_unreachable
            .lock()
            .ok()
            .and_then(|d| d.clone())
    }

    pub fn set_registry_unreachable(&self, why: Option<String>) {
        if let Ok(mut d) = self.registry_unreachable.lock() {
            *d = why;
        }
    }

    pub fn transaction_failing(&self) -> Option<String> {
        self.transaction_failing.lock().ok().and_then(|d| d.clone())
    }

    pub fn set_transaction_failing(&self, why: Option<String>) {
        if let Ok(mut d) = self.transaction_failing.lock() {
            *d = why;
        }
    }

    pub fn stalled(&self) -> Vec<Stall> {
        self.stalled.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn delivery_failing(&self) -> Option<String> {
        self.delivery_failing.lock().ok().and_then(|d| d.clone())
    }

    pub fn set_delivery_failing(&self, why: Option<String>) {
        if let Ok(mut d) = self.delivery_failing.lock() {
            *d = why;
        }
    }

    fn set(&self, kind: StallKind, stalls: Vec<Stall>) {
        let slot = match kind {
            StallKind::Undelivered => &self.stalled,
            StallKind::Unfetched => &self.unfetched,
        };
        if let Ok(mut s) = slot.lock() {
            *s = stalls;
        }
        self.count_stalls();
    }

    pub fn unfetched(&self) -> Vec<Stall> {
        self.unfetched.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn count_stalls(&self) {
        let n = self.stalled().len() + self.unfetched().len();
        metrics::gauge!(metric::STALLED_PARTITIONS).set(n as f64);
        self.faults.stalled_now(n);
    }

    fn report(&self) -> String {
        serde_json::json!({
            "ready": self.ready(),
            "model_loaded": self.model_loaded.load(Ordering::SeqCst),
            "consumer_ready": self.consumer_ready.load(Ordering::SeqCst),
            "producer_connected": self.producer_connected.load(Ordering::SeqCst),
            "model_failing": self.model_failing.load(Ordering::SeqCst),
            "delivery_failing": self.delivery_failing(),
            "transaction_failing": self.transaction_failing(),
            "registry_unreachable": self.registry_unreachable(),
            "list_topic": self.list_topic(),
            "state_restoring": self.restoring(),
            "input_missing": self.input_missing(),
            "input_did_you_mean": self.did_you_mean(),
            "analytics_failing": self.analytics_failing(),
            "models": self.models(),
            "stalled": self.stalled(),
            "unfetched": self.unfetched(),
        })
        .to_string()
    }
}

/// A topic the configuration names and the cluster does not list, with
/// the listed topic whose name is closest to it, where one is close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingTopic {
    pub name: String,
    pub did_you_mean: Option<String>,
}

impl MissingTopic {
    /// `name`, missing among `listed`: the closest listed name (fewest
    /// edits, a transposition one edit) within two edits, or a fifth of the
    /// name's length for a long one; internal topics (`__...`) are not
    /// offered.
    pub fn among<'a>(name: &str, listed: impl IntoIterator<Item = &'a str>) -> MissingTopic {
        let within = (name.chars().count() / 5).max(2);
        let did_you_mean = (listed.into_iter())
            .filter(|t| !t.starts_with("__"))
            .map(|t| (strsim::damerau_levenshtein(name, t), t))
            .filter(|(edits, _)| *edits <= within)
            .min()
            .map(|(_, t)| t.to_string());
        MissingTopic {
            name: name.to_string(),
            did_you_mean,
        }
    }
}

impl std::fmt::Display for MissingTopic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.did_you_mean {
            Some(close) => write!(f, "{} (did you mean {close}?)", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

/// Which stall a [`StallReporter`] watches for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallKind {
    /// A partition's oldest undelivered event waited `limits.stall_after`
    /// (the hub's watchdog): its committed offset cannot move.
    Undelivered,
    /// An assigned partition lags behind its end yet gave no record for
    /// `limits.stall_after` (the consumer's fetch watchdog).
    Unfetched,
}

/// Reports stalls the one way: an error log once when a partition's stall
/// starts, an info log once when it ends, `modstream_stalled_partitions`,
/// and /readyz failing while any lasts.
pub struct StallReporter {
    kind: StallKind,
    health: Arc<Health>,
    reported: HashSet<Tp>,
}

impl StallReporter {
    pub fn new(kind: StallKind, health: Arc<Health>) -> StallReporter {
        StallReporter {
            kind,
            health,
            reported: HashSet::new(),
        }
    }

    /// Nothing stalled now.
    pub fn is_empty(&self) -> bool {
        self.reported.is_empty()
    }

    /// The stalls now; `owned` tells whether a partition that is no longer
    /// stalled is still this member's (it moves again) or not (revoked).
    pub fn report(&mut self, mut stalls: Vec<Stall>, owned: impl Fn(&Tp) -> bool) {
        stalls.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        let now: HashSet<Tp> = stalls
            .iter()
            .map(|s| Tp::new(&s.topic, s.partition))
            .collect();
        for stall in &stalls {
            if self.reported.insert(Tp::new(&stall.topic, stall.partition)) {
                let (topic, partition, offset) = (&stall.topic, stall.partition, stall.offset);
                let (waiting_s, pending) = (stall.waiting_s, stall.pending);
                match self.kind {
                    StallKind::Undelivered => {
                        tracing::error!(%topic, partition, offset, waiting_s, pending, "partition stalled: its oldest event has no verdict delivered yet")
                    }
                    StallKind::Unfetched => {
                        tracing::error!(%topic, partition, lag = pending, waiting_s, "partition not fetched: it lags behind its end, yet no record came")
                    }
                }
            }
        }
        self.reported.retain(|tp| {
            let still = now.contains(tp);
            if !still {
                let (topic, partition) = (&tp.topic, tp.partition);
                match (self.kind, owned(tp)) {
                    (StallKind::Undelivered, true) => tracing::info!(%topic, partition, "partition making progress again"),
                    (StallKind::Undelivered, false) => tracing::info!(%topic, partition, "stalled partition revoked; its next owner takes over"),
                    (StallKind::Unfetched, _) => tracing::info!(%topic, partition, "partition fetched again (or no longer assigned)"),
                }
            }
            still
        });
        self.health.set(self.kind, stalls);
    }
}

/// Serve /metrics, /healthz and /readyz on `addr` until `stop` fires. Binds
/// before returning, so a taken port fails the start.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    health: Arc<Health>,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, TelemetryError> {
    use axum::http::{StatusCode, header};
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| TelemetryError::Listen { addr, source })?;
    let ready_health = health.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let body = metrics.render();
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let h = ready_health.clone();
                async move {
                    let status = if h.ready() {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    (
                        status,
                        [(header::CONTENT_TYPE, "application/json")],
                        h.report(),
                    )
                }
            }),
        );
    // The bound address: a port 0 asked for is a port chosen here.
    let addr = listener.local_addr().unwrap_or(addr);
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stall(partition: i32) -> Stall {
        Stall {
            topic: "posts".into(),
            partition,
            offset: 7,
            waiting_s: 61,
            pending: 3,
        }
    }

    #[test]
    fn a_stall_fails_readiness_until_it_ends_and_each_kind_has_its_own_list() {
        let health = Arc::new(Health::default());
        for flag in [
            &health.model_loaded,
            &health.consumer_ready,
            &health.producer_connected,
        ] {
            flag.store(true, Ordering::SeqCst);
        }
        assert!(health.ready());
        let mut hub = StallReporter::new(StallKind::Undelivered, health.clone());
        let mut fetch = StallReporter::new(StallKind::Unfetched, health.clone());
        hub.report(vec![stall(2), stall(1)], |_| true);
        assert!(!health.ready());
        assert_eq!(
            health
                .stalled()
                .iter()
                .map(|s| s.partition)
                .collect::<Vec<_>>(),
            [1, 2]
        );
        assert!(health.unfetched().is_empty() && !hub.is_empty());
        fetch.report(vec![stall(4)], |_| true);
        hub.report(Vec::new(), |_| false);
        assert!(hub.is_empty() && health.stalled().is_empty());
        assert!(!health.ready(), "the fetch watchdog's stall still counts");
        fetch.report(Vec::new(), |_| true);
        assert!(health.ready());
    }

    #[test]
    fn a_missing_topic_names_the_closest_existing_one_only_when_close() {
        let listed = [
            "feed.posts.v2",
            "feed.posts.v1",
            "trust.verdicts",
            "__consumer_offsets",
        ];
        let hint = |name| MissingTopic::among(name, listed).did_you_mean;
        assert_eq!(hint("feed.post.v2").as_deref(), Some("feed.posts.v2"));
        assert_eq!(hint("feed.psots.v1").as_deref(), Some("feed.posts.v1"));
        // Nothing close: no guess, and never an internal topic.
        assert_eq!(hint("billing.events"), None);
        assert_eq!(hint("_consumer_offsets"), None);
        assert_eq!(
            MissingTopic::among("feed.post.v2", listed).to_string(),
            "feed.post.v2 (did you mean feed.posts.v2?)"
        );
    }
}
