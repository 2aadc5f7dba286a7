//! An in-process Kafka cluster (librdkafka's mock cluster) for `demo` and the
//! tests. The mock cluster is not `Send`: it lives on its own thread, which
//! creates the topics, reports the bootstrap address and keeps the cluster up
//! until [`EmbeddedBroker`] is dropped.

use std::sync::mpsc;
use std::thread::JoinHandle;

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot start the embedded Kafka cluster: {0}")]
    Start(String),
}

pub struct EmbeddedBroker {
    bootstrap: String,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EmbeddedBroker {
    /// Start a one-broker cluster holding `topics` (name, partitions).
    pub fn start(topics: &[(&str, i32)]) -> Result<EmbeddedBroker, EmbeddedError> {
        let topics: Vec<(String, i32)> = topics.iter().map(|(t, p)| (t.to_string(), *p)).collect();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<String, String>>();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("embedded-kafka".into())
            .spawn(move || {
                // A client with test.mock.num.brokers owns a mock cluster.
                let holder: BaseProducer = match ClientConfig::new()
                    .set("test.mock.num.brokers", "1")
                    .create()
                {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let Some(cluster) = holder.client().mock_cluster() else {
                    let _ = ready_tx.send(Err("no mock cluster".into()));
                    return;
                };
                // The default 3 s initial rebalance delay only slows demos and tests.
                // SAFETY: the pointer comes from a live client that owns the cluster.
                unsafe {
                    let raw = rdkafka::bindings::rd_kafka_handle_mock_cluster(
                        holder.client().native_ptr(),
                    );
                    if !raw.is_null() {
                        rdkafka::bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(raw, 0);
                    }
                }
                for (topic, partitions) in &topics {
                    if let Err(e) = cluster.create_topic(topic, *partitions, 1) {
                        let _ = ready_tx.send(Err(format!("create topic {topic}: {e}")));
                        return;
                    }
                }
                let _ = ready_tx.send(Ok(cluster.bootstrap_servers()));
                let _ = stop_rx.recv();
                drop(cluster);
                let _ = holder.flush(std::time::Duration::from_millis(100));
            })
            .map_err(|e| EmbeddedError::Start(e.to_string()))?;
        let bootstrap = ready_rx
            .recv()
            .map_err(|_| EmbeddedError::Start("cluster thread died".into()))?
            .map_err(EmbeddedError::Start)?;
        Ok(EmbeddedBroker {
            bootstrap,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
