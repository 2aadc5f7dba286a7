//! Shutdown: the first SIGINT/SIGTERM stops fetching and drains (finish
//! in-flight batches, deliver, commit, exit 0); a second one exits at once.

use tokio_util::sync::CancellationToken;

#[derive(Clone, Default)]
pub struct Shutdown {
    /// Stop fetching; finish and deliver what is in flight, then commit.
    pub stop: CancellationToken,
    /// Give up on deliveries still retrying (their offsets stay uncommitted).
    pub abort: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stop on the first signal; exit the process on the second.
    pub fn listen_for_signals(&self) {
        let this = self.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("signal received; draining (send another to exit at once)");
            this.stop.cancel();
            wait_for_signal().await;
            tracing::warn!("second signal; exiting without draining");
            this.abort.cancel();
            std::process::exit(130);
        });
    }
}

/// The first SIGINT/SIGTERM cancels the returned token (a tool stops what
/// it feeds and lets the pipeline finish); a second one exits at once.
pub fn on_signal() -> CancellationToken {
    let interrupted = CancellationToken::new();
    let token = interrupted.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        token.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal; exiting at once");
        std::process::exit(130);
    });
    interrupted
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers there is nothing to wait for.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
