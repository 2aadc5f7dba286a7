//! The run's tasks beside the hub, and the shutdown watchdog among them.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::start;
use crate::config::Settings;
use crate::producer::Sink;
use crate::shutdown::Shutdown;
use crate::telemetry::Health;

/// The run's own tasks beside the hub (reload, the shutdown watchdog, the
/// input topics' watch, the schema stage), on one tracker: the run waits
/// for every one of them before it returns, none outlives it.
pub(super) struct SideTasks {
    pub(super) tracker: TaskTracker,
    /// Stopped when the hub has stopped.
    watchers: Vec<tokio::task::JoinHandle<()>>,
    /// Ends the schema stage's wait for a registry that does not answer;
    /// otherwise it ends once the consumer thread has closed its channel.
    pub(super) stages_stop: CancellationToken,
}

impl SideTasks {
    /// With the shutdown watchdog and the input topics' watch running.
    pub(super) fn start(
        settings: &Settings,
        sink: &Sink,
        health: &Arc<Health>,
        shutdown: &Shutdown,
    ) -> SideTasks {
        let tracker = TaskTracker::new();
        let watchers = vec![
            shutdown_watchdog(shutdown, settings.kafka.shutdown_timeout, &tracker),
            start::watch_input_topics(settings, sink, health, shutdown.stop.clone(), &tracker),
        ];
        SideTasks {
            tracker,
            watchers,
            stages_stop: shutdown.stop.child_token(),
        }
    }

    pub(super) fn stop_with_hub(&mut self, task: tokio::task::JoinHandle<()>) {
        self.watchers.push(task);
    }

    pub(super) fn hub_stopped(&self) {
        for task in &self.watchers {
            task.abort();
        }
        self.stages_stop.cancel();
    }

    pub(super) async fn wait(self) {
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// A drain that cannot finish (deliveries failing) ends after
/// kafka.shutdown_timeout: the rest stays uncommitted for the restart.
fn shutdown_watchdog(
    shutdown: &Shutdown,
    timeout: std::time::Duration,
    tasks: &TaskTracker,
) -> tokio::task::JoinHandle<()> {
    let (stop, abort) = (shutdown.stop.clone(), shutdown.abort.clone());
    tasks.spawn(async move {
        stop.cancelled().await;
        tokio::time::sleep(timeout).await;
        tracing::warn!(
            timeout_s = timeout.as_secs(),
            "shutdown timeout; abandoning undelivered events"
        );
        abort.cancel();
    })
}
