//! Shadow scoring: a candidate model (`inference.shadow.model_dir`) judges
//! a sample (`inference.shadow.share`) of the live events, and each
//! judgement goes to `output.shadow_topic` beside the live one, as a
//! comparison record: `{"event_id", "source", "live": {"model", "scores",
//! "verdict"}, "shadow": {...}, "agree"}`; `modstream_shadow_agreement_total
//! {live, shadow}` counts the confusion matrix.
//!
//! Guarantee: the shadow path never delays, changes or blocks a live verdict
//! or a commit. The hub offers an event only once its live verdict is
//! enqueued, with a non-blocking send into a bounded queue (full: the event
//! is skipped and counted); one thread of its own scores (one session, so it
//! takes at most one core of spare capacity) and a producer of its own sends
//! the records without acknowledgements the offsets wait for. A shadow model
//! that does not load, fails on events, or a topic that refuses the records
//! is only logged and counted (`modstream_shadow_failures_total{stage}`).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};

use crate::client::{self, ProducerRole};
use crate::config::{InferenceSettings, Settings};
use crate::inference::Model;
use crate::telemetry::metric::{self, ShadowStage};
use crate::verdict::Scorer;

/// Events waiting for the shadow model at most.
const QUEUE: usize = 4096;
/// Texts per shadow model run at most.
const BATCH: usize = 64;

/// One live verdict offered to the shadow.
pub struct ShadowJob {
    pub event_id: String,
    pub text: String,
    pub source: crate::tp::Source,
    pub live_probabilities: Vec<f32>,
    pub live: Arc<Scorer>,
}

/// The hub's side: offer live verdicts.
pub struct Shadow {
    queue: SyncSender<ShadowJob>,
    share: f64,
}

impl Shadow {
    /// Start the shadow thread if `inference.shadow.model_dir` is set and
    /// the model loads; otherwise `None` (a failure is logged and counted,
    /// the service runs without a shadow).
    pub fn start(settings: &Settings) -> Option<Shadow> {
        let dir = settings.inference.shadow.model_dir.clone()?;
        let inference = InferenceSettings {
            model_dir: dir.clone(),
            ..settings.inference.clone()
        };
        let loaded = Model::load(&inference)
            .map_err(|e| e.to_string())
            .and_then(|model| {
                let scorer =
                    Scorer::new(&model.manifest, &settings.policy).map_err(|e| e.to_string())?;
                Ok((model, scorer))
            });
        let (model, scorer) = match loaded {
            Ok(m) => m,
            Err(error) => {
                tracing::error!(dir = %dir.display(), %error, "shadow model not loaded; running without a shadow");
                metrics::counter!(metric::SHADOW_FAILURES_TOTAL, "stage" => ShadowStage::Load.as_str()).increment(1);
                return None;
            }
        };
        let producer = {
            let cfg = client::producer(&settings.kafka, ProducerRole::Shadow);
            match cfg.create_with_context::<_, ThreadedProducer<Counting>>(Counting) {
                Ok(p) => p,
                Err(error) => {
                    tracing::error!(%error, "shadow producer not created; running without a shadow");
                    metrics::counter!(metric::SHADOW_FAILURES_TOTAL, "stage" => ShadowStage::Load.as_str())
                        .increment(1);
                    return None;
                }
            }
        };
        tracing::info!(model = %model.manifest.name, version = %model.manifest.version, share = settings.inference.shadow.share, "shadow model loaded");
        let (queue, jobs) = std::sync::mpsc::sync_channel(QUEUE);
        let topic = settings.output.shadow_topic.clone();
        let spawned = std::thread::Builder::new()
            .name("shadow".into())
            .spawn(move || serve(jobs, model, scorer, producer, topic));
        if let Err(error) = spawned {
            tracing::error!(%error, "shadow thread not started; running without a shadow");
            return None;
        }
        Some(Shadow {
            queue,
            share: settings.inference.shadow.share,
        })
    }

    /// Whether this event is in the sample (by its id, so the same events
    /// are sampled on every run and every member).
    pub fn samples(&self, event_id: &str) -> bool {
        // FNV-1a: stable across runs and builds.
        let hash = event_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        (hash % 10_000) < (self.share * 10_000.0) as u64
    }

    /// Never blocks: a full queue skips the event (counted).
    pub fn offer(&self, job: ShadowJob) {
        match self.queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                metrics::counter!(metric::SHADOW_SKIPPED_TOTAL).increment(1);
            }
            Err(TrySendError::Disconnected(_)) => {
                metrics::counter!(metric::SHADOW_FAILURES_TOTAL, "stage" => ShadowStage::Thread.as_str()).increment(1);
            }
        }
    }
}

/// Counts delivery failures of comparison records.
struct Counting;

impl rdkafka::ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if result.is_err() {
            metrics::counter!(metric::SHADOW_FAILURES_TOTAL, "stage" => ShadowStage::Deliver.as_str()).increment(1);
        }
    }
}

#[derive(serde::Serialize)]
struct Comparison<'a> {
    agree: bool,
    event_id: &'a str,
    live: crate::verdict::Judgement<'a>,
    shadow: crate::verdict::Judgement<'a>,
    source: Source<'a>,
}

#[derive(serde::Serialize)]
struct Source<'a> {
    offset: i64,
    partition: i32,
    topic: &'a str,
}

fn serve(
    jobs: Receiver<ShadowJob>,
    mut model: Model,
    scorer: Scorer,
    producer: ThreadedProducer<Counting>,
    topic: String,
) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut texts: Vec<String> = batch
            .iter_mut()
            .map(|j| std::mem::take(&mut j.text))
            .collect();
        let scores = model.score_isolating(&mut texts);
        for (job, score) in batch.iter().zip(scores) {
            let Ok(probabilities) = score else {
                metrics::counter!(metric::SHADOW_FAILURES_TOTAL, "stage" => ShadowStage::Score.as_str()).increment(1);
                continue;
            };
            let live = job.live.judge(&job.live_probabilities);
            let shadow = scorer.judge(&probabilities);
            metrics::counter!(metric::SHADOW_AGREEMENT_TOTAL, "live" => live.verdict.as_str(), "shadow" => shadow.verdict.as_str())
                .increment(1);
            let record = Comparison {
                agree: live.verdict == shadow.verdict,
                event_id: &job.event_id,
                live,
                shadow,
                source: Source {
                    topic: &job.source.tp.topic,
                    partition: job.source.tp.partition,
                    offset: job.source.offset,
                },
            };
            let Ok(payload) = serde_json::to_vec(&record) else {
                continue;
            };
            let sent = producer.send(
                BaseRecord::to(&topic)
                    .key(job.event_id.as_bytes())
                    .payload(&payload),
            );
            if sent.is_err() {
                metrics::counter!(metric::SHADOW_FAILURES_TOTAL, "stage" => ShadowStage::Deliver.as_str()).increment(1);
            }
        }
    }
    let _ = rdkafka::producer::Producer::flush(&producer, std::time::Duration::from_secs(5));
}
