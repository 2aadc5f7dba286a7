//! The schema stage, between the consumer thread and the hub: each record
//! whose schema id was not looked up yet waits here until the registry
//! answers, so that the hub decodes from memory.
//!
//! The registry unreachable (no answer, 5xx, refused credentials) is not
//! the records' fault: none is dead-lettered for it. The stage asks again
//! (`schema_registry.retry_backoff`, doubling up to 10 s) with every record
//! behind it waiting in order (the channels are bounded: the consumer stops
//! fetching), and it is never silent: /readyz reports
//! `registry_unreachable` with the reason, `modstream_schema_registry_wait_seconds`
//! grows, one warning is logged when the wait starts and one line when it
//! ends. It waits as long as the registry is down: giving up would mean
//! dead-lettering good events. A shutdown ends the wait (what waited stays
//! uncommitted and is read again).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::SchemaStore;
use crate::telemetry::Health;
use crate::telemetry::metric;

const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// What the stage needs to know of a record.
pub trait HasPayload {
    fn payload(&self) -> Option<&[u8]>;
}

pub struct Stage {
    pub store: Arc<SchemaStore>,
    pub health: Arc<Health>,
    pub backoff: Duration,
    pub stop: CancellationToken,
}

impl Stage {
    /// Forward `records` to `out` in order, each once its schema is known;
    /// ends when the input closes, the hub is gone, or a shutdown stops a
    /// wait.
    pub async fn run<T: HasPayload>(self, mut records: mpsc::Receiver<T>, out: mpsc::Sender<T>) {
        metrics::gauge!(metric::SCHEMA_REGISTRY_WAIT_SECONDS).set(0.0);
        while let Some(record) = records.recv().await {
            if let Some(id) = self.store.missing(record.payload())
                && !self.wait_for(id).await
            {
                return;
            }
            if out.send(record).await.is_err() {
                return;
            }
        }
    }

    /// Fetch schema `id`, asking again while the registry cannot answer;
    /// false when a shutdown ended the wait.
    async fn wait_for(&self, id: u32) -> bool {
        let started = tokio::time::Instant::now();
        let mut backoff = self.backoff;
        let mut waited = false;
        loop {
            let error = match self.store.fetch(id).await {
                Ok(()) => break,
                Err(e) => e,
            };
            metrics::counter!(metric::SCHEMA_REGISTRY_ERRORS_TOTAL).increment(1);
            let waiting = started.elapsed();
            metrics::gauge!(metric::SCHEMA_REGISTRY_WAIT_SECONDS).set(waiting.as_secs_f64());
            let why = format!(
                "schema id {id}: {error}; records wait in order (for {} s)",
                waiting.as_secs()
            );
            if !waited {
                tracing::warn!(id, error = %error, "the schema registry cannot be reached; records wait, in order, until it answers");
                waited = true;
            }
            self.health.set_registry_unreachable(Some(why));
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.stop.cancelled() => return false,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        if waited {
            tracing::info!(
                id,
                waited_s = started.elapsed().as_secs(),
                "the schema registry answers again; records go on"
            );
            self.health.set_registry_unreachable(None);
            metrics::gauge!(metric::SCHEMA_REGISTRY_WAIT_SECONDS).set(0.0);
        }
        true
    }
}
