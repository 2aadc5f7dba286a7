//! Where one run happens ([`Cell`]: a fresh embedded cluster, or fresh
//! topics and group on `--bootstrap`).

use std::time::Duration;

use rdkafka::ClientConfig;

use super::BenchOptions;
use modstream::tools::demo::{self, DEMO_DLQ, DEMO_INPUT, DEMO_VERDICTS};
use modstream::tools::embedded::EmbeddedBroker;

/// Partitions of every cell's input and verdict topics.
pub(super) const PARTITIONS: i32 = 4;

/// Where one run happens: a fresh embedded cluster, or (`--bootstrap`) fresh
/// topics and a fresh group on the given cluster, so that runs never see
/// each other's records.
/// The samples topic of the embedded cluster.
const DEMO_SAMPLES: &str = "moderation.samples";

pub(super) struct Cell {
    _embedded: Option<EmbeddedBroker>,
    /// Of the input and verdict topics.
    pub partitions: i32,
    /// Of the verdict topic (`--verdict-partitions`, else `partitions`).
    pub verdict_partitions: i32,
    pub bootstrap: String,
    pub input: String,
    pub verdicts: String,
    pub dlq: String,
    /// Sampling's records (`--sampling-runs`).
    pub samples: String,
    /// The state changelog (`--state-rules`), as many partitions as the input.
    pub state: String,
    pub group: String,
}

/// The state changelog of the embedded cluster.
const DEMO_STATE: &str = "moderation.state";

impl Cell {
    pub(super) async fn new(opts: &BenchOptions) -> anyhow::Result<Cell> {
        let partitions = opts.variant.partitions.unwrap_or(PARTITIONS);
        let verdict_partitions = match opts.verdict_partitions {
            0 => partitions,
            n => n,
        };
        let Some(bootstrap) = &opts.bootstrap else {
            let broker = EmbeddedBroker::start(&[
                (DEMO_INPUT, partitions),
                (DEMO_VERDICTS, verdict_partitions),
                (DEMO_DLQ, 1),
                // The shadow model's comparison records (`--shadow-model`).
                ("moderation.shadow", 1),
                (DEMO_SAMPLES, 1),
                (DEMO_STATE, partitions),
            ])?;
            return Ok(Cell {
                bootstrap: broker.bootstrap_servers().to_string(),
                _embedded: Some(broker),
                partitions,
                verdict_partitions,
                input: DEMO_INPUT.to_string(),
                verdicts: DEMO_VERDICTS.to_string(),
                dlq: DEMO_DLQ.to_string(),
                samples: DEMO_SAMPLES.to_string(),
                state: DEMO_STATE.to_string(),
                group: "bench".to_string(),
            });
        };
        static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let prefix = format!(
            "modstream-bench-{}-{}-{run}",
            std::process::id(),
            chrono::Utc::now().timestamp()
        );
        let cell = Cell {
            _embedded: None,
            partitions,
            verdict_partitions,
            bootstrap: bootstrap.clone(),
            input: format!("{prefix}-events"),
            verdicts: format!("{prefix}-verdicts"),
            dlq: format!("{prefix}-dlq"),
            samples: format!("{prefix}-samples"),
            state: format!("{prefix}-state"),
            group: prefix,
        };
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()?;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for (topic, partitions) in [
            (&cell.input, partitions),
            (&cell.verdicts, verdict_partitions),
            (&cell.dlq, 1),
            (&cell.samples, 1),
            (&cell.state, partitions),
        ] {
            // The cluster's default replication first; 1 where that is refused.
            let mut created = Err(String::new());
            for replication in [-1, 1] {
                let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
                created = match admin.create_topics([&new], &options).await {
                    Ok(mut r) => r
                        .pop()
                        .unwrap_or(Err((
                            topic.clone(),
                            rdkafka::types::RDKafkaErrorCode::Unknown,
                        )))
                        .map(|_| ())
                        .map_err(|(_, e)| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if created.is_ok() {
                    break;
                }
            }
            created.map_err(|e| anyhow::anyhow!("cannot create bench topic {topic}: {e}"))?;
        }
        Ok(cell)
    }

    pub(super) fn config(&self, batch: usize, delay_ms: u64) -> String {
        demo::demo_config_for(
            &self.bootstrap,
            &self.group,
            [&self.input, &self.verdicts, &self.dlq],
            batch,
            delay_ms,
        )
    }
}
