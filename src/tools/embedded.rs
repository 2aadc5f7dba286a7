//! An in-process Kafka cluster (librdkafka's mock cluster) for `demo` and the
//! tests. The mock cluster is not `Send`: it lives on its own thread, which
//! creates the topics, reports the bootstrap address and keeps the cluster up
//! until [`EmbeddedBroker`] is dropped.

use std::sync::mpsc;
use std::thread::JoinHandle;

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer};

/// The cluster as the fault-injection closures see it.
pub type Cluster<'a> = MockCluster<'a, DefaultProducerContext>;
type Command = Box<dyn FnOnce(&Cluster<'_>) + Send>;

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot start the embedded Kafka cluster: {0}")]
    Start(String),
}

pub struct EmbeddedBroker {
    bootstrap: String,
    commands: Option<mpsc::Sender<Command>>,
    thread: Option<JoinHandle<()>>,
}

impl EmbeddedBroker {
    /// Start a one-broker cluster holding `topics` (name, partitions).
    pub fn start(topics: &[(&str, i32)]) -> Result<EmbeddedBroker, EmbeddedError> {
        Self::start_with_brokers(1, topics)
    }

    /// Start a cluster of `brokers` brokers holding `topics` (name, partitions).
    pub fn start_with_brokers(
        brokers: u32,
        topics: &[(&str, i32)],
    ) -> Result<EmbeddedBroker, EmbeddedError> {
        let topics: Vec<(String, i32)> = topics.iter().map(|(t, p)| (t.to_string(), *p)).collect();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<String, String>>();
        let (commands_tx, commands_rx) = mpsc::channel::<Command>();
        let thread = std::thread::Builder::new()
            .name("embedded-kafka".into())
            .spawn(move || {
                // A client with test.mock.num.brokers owns a mock cluster.
                let holder: BaseProducer = match ClientConfig::new()
                    .set("test.mock.num.brokers", brokers.to_string())
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
                    if let Err(e) = cluster.create_topic(topic, *partitions, brokers.min(3) as i32)
                    {
                        let _ = ready_tx.send(Err(format!("create topic {topic}: {e}")));
                        return;
                    }
                }
                let _ = ready_tx.send(Ok(cluster.bootstrap_servers()));
                // Runs fault-injection commands until the handle is dropped.
                while let Ok(command) = commands_rx.recv() {
                    command(&cluster);
                }
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
            commands: Some(commands_tx),
            thread: Some(thread),
        })
    }

    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Run `f` on the cluster's own thread (request errors, broker down/up,
    /// leader moves) and return its result.
    pub fn with_cluster<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Cluster<'_>) -> R + Send + 'static,
    ) -> R {
        let (tx, rx) = mpsc::channel();
        let command: Command = Box::new(move |cluster| {
            let _ = tx.send(f(cluster));
        });
        self.commands
            .as_ref()
            .expect("cluster running")
            .send(command)
            .expect("cluster thread alive");
        rx.recv().expect("cluster thread answered")
    }
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        drop(self.commands.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
