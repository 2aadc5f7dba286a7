//! The wiring, in the order it starts: inference workers (the model loads
//! before any connection) → verdict producer → consumer thread (connects,
//! subscribes) → the hub, which owns the per-partition state and runs until
//! shutdown → then the workers stop and the consumer thread commits and
//! closes.
//!
//! ```text
//! consumer thread ──records, rebalances──▶ hub ──jobs──▶ inference workers
//!       ▲                                   │ ◀──results──┘
//!       └──────────── positions ────────────┤
//!                                           └──records──▶ producer ──acks──▶ hub
//! ```
//!
//! Guarantees: see [`crate::hub`] (one outcome per record, offset order,
//! positions only after delivery) and [`crate::rebalance`] (revokes).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::consumer::{self, ConsumerError};
use crate::hub::{Deliver, Hub, Inputs};
use crate::inference::{InferenceError, InferencePool};
use crate::producer::{ProducerError, Sink};
use crate::record::OutRecord;
use crate::shutdown::Shutdown;
use crate::telemetry::Health;
use crate::tp::Source;
use crate::verdict::{PolicyError, Scorer};

pub use crate::hub::RunSummary;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Inference(#[from] InferenceError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    #[error(transparent)]
    Producer(#[from] ProducerError),
    #[error(
        "{0} events were not delivered before kafka.shutdown_timeout; they stay uncommitted and are reprocessed after a restart"
    )]
    Abandoned(u64),
}

impl Deliver for Sink {
    fn deliver(
        &self,
        record: OutRecord,
        source: Source,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<(), ProducerError>> {
        Box::pin(Sink::deliver(self, record, source, cancel))
    }

    fn service_failure(&self) -> Option<(String, std::time::Duration, String)> {
        Sink::service_failure(self)
    }
}

/// Run the pipeline until `shutdown` says stop and everything in flight is
/// delivered (or abandoned on abort). The model loads before any connection.
pub async fn run(settings: Settings, shutdown: Shutdown) -> Result<RunSummary, PipelineError> {
    run_with_health(settings, shutdown, Arc::default()).await
}

/// [`run`], reporting readiness (for /readyz) into `health`.
pub async fn run_with_health(
    settings: Settings,
    shutdown: Shutdown,
    health: Arc<Health>,
) -> Result<RunSummary, PipelineError> {
    // What the sessions are loaded from, taken first: a change while they
    // load is seen by the hot reload (at worst one reload too many).
    let loaded_model = crate::reload::fingerprint(&settings.inference.model_dir);
    let (results_tx, results) = mpsc::channel(settings.inference.worker_count() * 4);
    let pool = InferencePool::start(
        &settings.inference,
        settings.batching.max_batch_size,
        results_tx,
    )?;
    let scorer = Scorer::new(&pool.manifest, &settings.policy)?;
    tracing::info!(model = %pool.manifest.name, version = %pool.manifest.version, workers = settings.inference.worker_count(), "model loaded");
    health.model_loaded.store(true, Ordering::SeqCst);

    let sink = Sink::new(&settings.kafka, settings.limits.max_payload_bytes)?;
    let consumer_done = CancellationToken::new();
    let (consumer, channels) = consumer::start(
        &settings,
        health.clone(),
        shutdown.stop.clone(),
        consumer_done.clone(),
    )
    .await?;
    health.consumer_ready.store(true, Ordering::SeqCst);
    // The consumer reached the cluster; check the producer does too (same
    // brokers, its own credentials).
    {
        let (sink, timeout) = (sink.clone(), settings.kafka.startup_timeout);
        let reachable = tokio::task::spawn_blocking(move || sink.reachable(timeout))
            .await
            .unwrap_or(false);
        health.producer_connected.store(reachable, Ordering::SeqCst);
        if !reachable {
            tracing::warn!("the producer cannot reach the cluster yet; deliveries will retry");
        }
    }
    tracing::info!(topics = ?settings.input.topics, group = %settings.kafka.group_id, "consuming");

    // A drain that cannot finish (deliveries failing) ends after
    // kafka.shutdown_timeout: the rest stays uncommitted for the restart.
    let watchdog = {
        let (stop, abort, timeout) = (
            shutdown.stop.clone(),
            shutdown.abort.clone(),
            settings.kafka.shutdown_timeout,
        );
        tokio::spawn(async move {
            stop.cancelled().await;
            tokio::time::sleep(timeout).await;
            tracing::warn!(
                timeout_s = timeout.as_secs(),
                "shutdown timeout; abandoning undelivered events"
            );
            abort.cancel();
        })
    };

    // Hot reload: a new model (or, on SIGHUP, policy) while running;
    // started last so that an early return leaves no task behind.
    let (scorers_tx, scorers) = mpsc::channel(4);
    let reloader = tokio::spawn(
        crate::reload::Reloader {
            settings: settings.clone(),
            max_batch: settings.batching.max_batch_size,
            swaps: pool.swaps(),
            scorers: scorers_tx,
            loaded: loaded_model,
            refused: None,
            manifest: pool.manifest.clone(),
            version: 0,
        }
        .run(shutdown.stop.clone()),
    );
    let shadow = crate::shadow::Shadow::start(&settings);
    let hub = Hub::new(
        settings,
        scorer,
        pool.jobs(),
        sink.clone(),
        channels.positions,
        health.clone(),
        &shutdown,
    )
    .with_shadow(shadow);
    let inputs = Inputs {
        records: channels.records,
        rebalances: channels.rebalances,
        results,
        scorers,
    };
    let (summary, producer_fatal) = hub.run(inputs).await;
    watchdog.abort();
    reloader.abort();
    health.consumer_ready.store(false, Ordering::SeqCst);

    let aborted = shutdown.abort.is_cancelled();
    let _ = tokio::task::spawn_blocking(move || {
        if aborted {
            // kafka.shutdown_timeout is a bound: nothing more is sent.
            sink.purge();
        } else {
            let _ = sink.flush(std::time::Duration::from_secs(5));
        }
        pool.shutdown();
    })
    .await;
    consumer_done.cancel();
    let consumer_result = tokio::task::spawn_blocking(move || consumer.join())
        .await
        .unwrap_or(Err(ConsumerError::Panicked));
    tracing::debug!("consumer thread joined");
    tracing::info!(
        consumed = summary.consumed,
        verdicts = summary.verdicts,
        dlq = summary.dlq,
        abandoned = summary.abandoned,
        "pipeline stopped"
    );
    consumer_result?;
    if let Some(error) = producer_fatal {
        return Err(error.into());
    }
    if summary.abandoned > 0 {
        return Err(PipelineError::Abandoned(summary.abandoned));
    }
    Ok(summary)
}
