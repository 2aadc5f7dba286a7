//! The wiring, in the order it starts: inference workers (the model loads
//! before any connection) → verdict producer → consumer thread (connects,
//! subscribes) → the hub, which owns the per-partition state and runs until
//! shutdown → then the workers stop and the consumer thread commits and
//! closes.
//!
//! ```text
//! consumer thread ──records, control──▶ hub ──jobs──▶ inference workers
//!       ▲                                   │ ◀──results──┘
//!       └──────────── positions ────────────┤
//!                                           └──records──▶ producer ──acks──▶ hub
//! ```
//!
//! Guarantees: see [`crate::hub`] (one outcome per record, offset order,
//! positions only after delivery) and [`crate::consumer::rebalance`] (revokes).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Settings;
use crate::consumer::{self, ConsumerError};
use crate::hub::{Deliver, Hub, Inputs, ModelLane};
use crate::inference::{InferenceError, InferencePool};
use crate::matching::Matcher;
use crate::pipeline::reload::PolicySource;
use crate::policy::{ModelLabels, Ruleset};
use crate::producer::record::OutRecord;
use crate::producer::{ProducerError, Sink};
use crate::shutdown::Shutdown;
use crate::telemetry::Health;
use crate::tp::Source;
use crate::verdict::{PolicyError, Scorer};

pub use crate::hub::RunSummary;
pub use zeroes::register_zeroes;

pub mod caught_up;
pub mod reload;
mod side_tasks;
mod start;
mod zeroes;

use side_tasks::SideTasks;
use start::{Joined, Lists, join_group};

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Inference(#[from] InferenceError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    State(#[from] crate::state::restore::RestoreError),
    #[error(transparent)]
    Traces(#[from] crate::telemetry::traces::TracesError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    #[error(transparent)]
    Producer(#[from] ProducerError),
    #[error(transparent)]
    Transaction(#[from] crate::producer::transaction::TransactionError),
    #[error(transparent)]
    List(#[from] crate::matching::ListError),
    #[error(transparent)]
    ListTopic(#[from] crate::matching::topic::TopicError),
    #[error("an output topic cannot take the service's records: {0}")]
    OutputTopic(#[from] crate::producer::topics::TopicCheckError),
    #[error(
        "{0} events were not delivered before kafka.shutdown_timeout; they stay uncommitted and are reprocessed after a restart"
    )]
    Abandoned(u64),
    #[error("schema registry: {0}")]
    RegistryClient(#[from] crate::schema::ClientError),
    #[error(
        "schema registry: cannot register the verdict schema within kafka.startup_timeout: {0}"
    )]
    VerdictSchema(crate::schema::FetchError),
}

impl Deliver for Sink {
    fn deliver(
        &self,
        record: OutRecord,
        source: Source,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), ProducerError>> + Send + 'static {
        Sink::deliver(self, record, source, cancel)
    }

    fn service_failure(&self) -> Option<crate::producer::ServiceFailure> {
        Sink::service_failure(self)
    }

    fn take_reports(
        &self,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<crate::producer::reports::Report>> {
        Sink::take_reports(self)
    }

    fn send_reported(
        &self,
        record: &OutRecord,
        source: &Source,
    ) -> Option<crate::producer::reports::Token> {
        Sink::send_reported(self, record, source)
    }

    fn delivered(&self, record: &OutRecord) {
        Sink::delivered(self, record)
    }

    fn follow(
        &self,
        record: OutRecord,
        source: Source,
        error: rdkafka::error::KafkaError,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), ProducerError>> + Send + 'static {
        Sink::follow(self, record, source, error, cancel)
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
    let loaded = load(&settings)?;
    run_loaded(settings, loaded, shutdown, health).await
}

/// The models, loaded, and the policy, checked against them: what a start
/// can get wrong by configuration alone, before it binds or connects
/// anything.
pub struct Loaded {
    models: Models,
    /// With `[matching]`: its list files, loaded.
    matcher: Option<Matcher>,
}

/// Load the models and check the policy (the first step of [`run`]), and
/// load the list files.
pub fn load(settings: &Settings) -> Result<Loaded, PipelineError> {
    let models = start_models(settings)?;
    let known = settings.matching.list_names();
    if let Some((rule, list)) = models.rules.unknown_list(&known) {
        return Err(PolicyError::new(
            format!("rules.{rule}.lists"),
            format!("no list is named {list:?} (the lists are {known:?})"),
        )
        .into());
    }
    models.rules.check_state(&settings.state)?;
    if let Some(label) = &settings.sampling.label {
        let index = (settings.sampling.model.as_ref())
            .and_then(|name| models.specs.iter().position(|m| &m.name == name))
            .unwrap_or(0);
        let labels = &models.pools[index].manifest.labels;
        if !labels.contains(label) {
            let model = &models.specs[index].name;
            return Err(PolicyError::new(
                "sampling.label",
                format!("model {model:?} has no label {label:?} (its labels are {labels:?})"),
            )
            .into());
        }
    }
    let matcher = (settings.matching.enabled())
        .then(|| Matcher::new(&settings.matching))
        .transpose()?;
    Ok(Loaded { models, matcher })
}

/// [`run_with_health`] with what [`load`] loaded.
// Long: the stages wired in start order, read top to bottom in one place.
pub async fn run_loaded(
    settings: Settings,
    loaded: Loaded,
    shutdown: Shutdown,
    health: Arc<Health>,
) -> Result<RunSummary, PipelineError> {
    let Loaded {
        models,
        mut matcher,
    } = loaded;
    health.model_loaded.store(true, Ordering::SeqCst);
    health.set_models(models.placements());
    let schemas = crate::schema::SchemaStore::from_settings(&settings)?;
    let verdict_encoder = register_verdict_schema(&settings).await?;
    let state = start::state(&settings, &health)?;
    let Joined {
        sink,
        consumer,
        consumer_done,
        channels,
        lists,
    } = join_group(
        &settings,
        &models.rules,
        matcher.as_mut(),
        &health,
        &shutdown,
    )
    .await?;

    // Hot reload: a new model (or, on SIGHUP, policy, lists) while
    // running; started last so that an early return leaves no task behind
    // (the list topic's reader, started before, stops with `lists`).
    let mut tasks = SideTasks::start(&settings, &sink, &health, &shutdown);
    let reloading = spawn_reloader(&settings, &models, lists, &shutdown, &mut tasks);
    let shadow = crate::hub::stages::outputs::shadow::Shadow::start(&settings);
    let records = schema_stage(
        &settings,
        schemas.clone(),
        channels.records,
        &health,
        &tasks.tracker,
        &tasks.stages_stop,
    );
    let lanes = models.lanes();
    let (state, restored) = match state {
        Some((keeper, restores)) => (Some((keeper, restores.jobs)), Some(restores.restored)),
        None => (None, None),
    };
    let (traces, exporting) =
        crate::telemetry::traces::start(&settings.tracing, &settings.kafka.group_id)?.unzip();
    let hub = Hub::new(
        settings,
        lanes,
        models.rules.clone(),
        sink.clone(),
        channels.positions,
        health.clone(),
        &shutdown,
    )
    .with_shadow(shadow)
    .with_formats(schemas, verdict_encoder)
    .with_matcher(matcher)
    .with_state(state)
    .with_traces(traces);
    let inputs = Inputs {
        records,
        control: channels.control,
        results: models.results,
        scorers: reloading.scorers,
        policies: reloading.policies,
        matching: reloading.lists,
        restored,
    };
    let (mut summary, producer_fatal) = hub.run(inputs).await;
    tasks.hub_stopped();
    health.consumer_ready.store(false, Ordering::SeqCst);
    let stopped = Stopped {
        aborted: shutdown.abort.is_cancelled(),
        sink,
        pools: models.pools,
        consumer,
        consumer_done,
    };
    let closed = stopped.close().await;
    if let Some(exporting) = exporting {
        // The spans still held go out (a blocking send, off the runtime).
        let _ = tokio::task::spawn_blocking(move || exporting.shutdown()).await;
    }
    tasks.wait().await;
    closed?;
    summary.faults = health.faults.counts();
    stopped_with(summary, producer_fatal)
}

impl crate::schema::stage::HasPayload for consumer::Ingested {
    fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }
}

/// With a Schema Registry input format, records pass the schema stage on
/// their way to the hub (it fetches each new schema id first, waiting in
/// order while the registry cannot answer).
fn schema_stage(
    settings: &Settings,
    schemas: Option<Arc<crate::schema::SchemaStore>>,
    records: mpsc::Receiver<consumer::Ingested>,
    health: &Arc<Health>,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) -> mpsc::Receiver<consumer::Ingested> {
    let Some(store) = schemas else {
        return records;
    };
    let (tx, rx) = mpsc::channel(records.max_capacity());
    let stage = crate::schema::stage::Stage {
        store,
        health: health.clone(),
        backoff: settings.schema_registry.retry_backoff,
        stop: stop.clone(),
    };
    tasks.spawn(stage.run(records, tx));
    rx
}

/// With `output.format = "avro"`: register the verdict schema under
/// `<output.topic>-value` before consuming, asking again within
/// `kafka.startup_timeout` while the registry cannot answer.
async fn register_verdict_schema(
    settings: &Settings,
) -> Result<Option<crate::schema::verdict::VerdictEncoder>, PipelineError> {
    if settings.output.format != crate::config::OutputFormat::Avro {
        return Ok(None);
    }
    let client = crate::schema::RegistryClient::new(&settings.schema_registry)?;
    let deadline = tokio::time::Instant::now() + settings.kafka.startup_timeout;
    loop {
        match crate::schema::verdict::VerdictEncoder::register(&client, &settings.output.topic)
            .await
        {
            Ok(encoder) => {
                tracing::info!(subject = %format!("{}-value", settings.output.topic), id = encoder.id(), "verdict schema registered");
                return Ok(Some(encoder));
            }
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(PipelineError::VerdictSchema(e));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot register the verdict schema yet; asking again");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

/// The run's result: its counts, or why it did not end cleanly.
fn stopped_with(
    summary: RunSummary,
    producer_fatal: Option<ProducerError>,
) -> Result<RunSummary, PipelineError> {
    tracing::info!(
        consumed = summary.consumed,
        verdicts = summary.verdicts,
        dlq = summary.dlq,
        abandoned = summary.abandoned,
        rewinds = summary.rewinds,
        "pipeline stopped"
    );
    if let Some(error) = producer_fatal {
        return Err(error.into());
    }
    if summary.abandoned > 0 {
        return Err(PipelineError::Abandoned(summary.abandoned));
    }
    Ok(summary)
}

/// With `kafka.delivery = "exactly_once"`: start the verdict producer's
/// transactions before the consumer joins (a cluster without them fails
/// the start, with the reason).
async fn start_transactions(
    settings: &Settings,
    sink: &Sink,
    health: &Arc<Health>,
    shutdown: &Shutdown,
) -> Result<Option<consumer::ExactlyOnce>, PipelineError> {
    let kafka = &settings.kafka;
    if !kafka.exactly_once() {
        return Ok(None);
    }
    let (producer, id) = (sink.producer(), kafka.transactional_id());
    let timeout = kafka.startup_timeout;
    let transactions = tokio::task::spawn_blocking(move || {
        crate::producer::transaction::Transactions::start(producer, &id, timeout)
    })
    .await
    .map_err(|_| ProducerError::Abandoned)??;
    Ok(Some(consumer::ExactlyOnce {
        transactions,
        health: health.clone(),
        timeout: kafka.transaction_timeout,
        shutdown_abort: shutdown.abort.clone(),
    }))
}

/// The models, loaded (before any connection), and the policy over them.
struct Models {
    specs: Vec<crate::config::ModelSpec>,
    pools: Vec<InferencePool>,
    /// What each model's sessions were loaded from, taken first: a change
    /// while they load is seen by the hot reload (at worst one reload too many).
    loaded: Vec<Option<crate::pipeline::reload::Fingerprint>>,
    results: mpsc::Receiver<crate::inference::InferenceResult>,
    rules: Ruleset,
}

fn start_models(settings: &Settings) -> Result<Models, PipelineError> {
    let specs = settings.models();
    let loaded = specs
        .iter()
        .map(|m| crate::pipeline::reload::fingerprint(&m.inference.model_dir))
        .collect();
    let workers: usize = specs.iter().map(|m| m.inference.worker_count()).sum();
    let (results_tx, results) = mpsc::channel(workers * 4);
    let mut pools = Vec::new();
    for spec in &specs {
        let pool = InferencePool::start(&spec.inference, spec.run_limit(), results_tx.clone())?;
        let m = &pool.manifest;
        let placement = pool.placement(&spec.name);
        tracing::info!(model = %spec.name, name = %m.name, version = %m.version, workers = spec.inference.worker_count(), providers = ?placement.providers, cpu_nodes = placement.cpu_nodes, "model loaded");
        placement.export();
        pools.push(pool);
    }
    let labels: Vec<ModelLabels> = specs
        .iter()
        .zip(&pools)
        .map(|(s, p)| ModelLabels::of(&s.name, &p.manifest))
        .collect();
    let rules = PolicySource::of(settings).rules(&labels)?;
    tracing::info!(version = %rules.version, rules = ?rules.rule_ids().collect::<Vec<_>>(), "policy in force");
    Ok(Models {
        specs,
        pools,
        loaded,
        results,
        rules,
    })
}

impl Models {
    /// Where each model runs (for /readyz).
    fn placements(&self) -> Vec<crate::telemetry::ModelPlacement> {
        (self.specs.iter().zip(&self.pools))
            .map(|(spec, pool)| pool.placement(&spec.name))
            .collect()
    }

    fn lanes(&self) -> Vec<ModelLane> {
        self.specs
            .iter()
            .zip(&self.pools)
            .map(|(spec, pool)| ModelLane {
                scorer: Scorer::named(&spec.name, &pool.manifest),
                jobs: pool.jobs(),
                workers: spec.inference.worker_count(),
                max_batch: spec.max_batch,
                max_length: (pool.manifest.max_length).filter(|_| {
                    pool.manifest.input_kind == crate::inference::manifest::InputKind::Tokens
                }),
            })
            .collect()
    }
}

/// The hot reload task, and where the hub learns each new model version
/// and policy.
struct Reloading {
    scorers: mpsc::Receiver<crate::verdict::NewScorer>,
    policies: mpsc::Receiver<Arc<Ruleset>>,
    lists: mpsc::Receiver<crate::matching::Update>,
    /// Stops the list topic's reader when dropped (at the end of the run).
    _list_topic: tokio_util::sync::DropGuard,
}

fn spawn_reloader(
    settings: &Settings,
    models: &Models,
    lists: Lists,
    shutdown: &Shutdown,
    tasks: &mut SideTasks,
) -> Reloading {
    let Lists {
        tx: lists_tx,
        rx: lists,
        list_topic,
    } = lists;
    // Reloads are rare and the hub takes each at once (first in its loop).
    let (scorers_tx, scorers) = mpsc::channel(4);
    let (policies_tx, policies) = mpsc::channel(4);
    let reloads = models
        .specs
        .iter()
        .zip(&models.pools)
        .zip(&models.loaded)
        .map(
            |((spec, pool), loaded)| crate::pipeline::reload::ModelReload {
                spec: spec.clone(),
                swaps: pool.swaps(),
                loaded: loaded.clone(),
                refused: None,
                manifest: pool.manifest.clone(),
                version: 0,
            },
        )
        .collect();
    let reloader = crate::pipeline::reload::Reloader::new(
        settings,
        reloads,
        models.rules.clone(),
        scorers_tx,
        policies_tx,
    )
    .with_lists(
        (!settings.matching.lists.is_empty())
            .then(|| crate::matching::ListWatch::new(&settings.matching, lists_tx)),
    );
    tasks.stop_with_hub(tasks.tracker.spawn(reloader.run(shutdown.stop.clone())));
    Reloading {
        scorers,
        policies,
        lists,
        _list_topic: list_topic,
    }
}

/// The consumer reached the cluster; check the producer does too (same
/// brokers, its own credentials). Not reaching it is a warning: deliveries
/// retry, and /readyz says so meanwhile.
async fn check_producer(sink: &Sink, timeout: std::time::Duration, health: &Health) {
    let sink = sink.clone();
    let reachable = tokio::task::spawn_blocking(move || sink.reachable(timeout))
        .await
        .unwrap_or(false);
    health.producer_connected.store(reachable, Ordering::SeqCst);
    if !reachable {
        tracing::warn!("the producer cannot reach the cluster yet; deliveries will retry");
    }
}

/// What is left to close once the hub has stopped.
struct Stopped {
    aborted: bool,
    sink: Sink,
    pools: Vec<InferencePool>,
    consumer: consumer::ConsumerThread,
    consumer_done: CancellationToken,
}

impl Stopped {
    /// Flush (or, after an abort, purge) the producer, stop the workers,
    /// then let the consumer thread commit and close.
    async fn close(self) -> Result<(), ConsumerError> {
        let Stopped {
            aborted,
            sink,
            pools,
            consumer,
            consumer_done,
        } = self;
        let _ = tokio::task::spawn_blocking(move || {
            if aborted {
                // kafka.shutdown_timeout is a bound: nothing more is sent.
                sink.purge();
            } else {
                let _ = sink.flush(std::time::Duration::from_secs(5));
            }
            for pool in pools {
                pool.shutdown();
            }
        })
        .await;
        consumer_done.cancel();
        let joined = tokio::task::spawn_blocking(move || consumer.join())
            .await
            .unwrap_or(Err(ConsumerError::Panicked));
        tracing::debug!("consumer thread joined");
        joined
    }
}
