//! Shadow scoring on librdkafka's mock cluster: the same events through a
//! run without a shadow, one with the MiniLM transformer as the shadow of
//! the profanity model, and one with a shadow model that cannot load. The
//! live verdicts are the same in all three; the comparison records carry
//! both models' scores of the same events.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use modstream::inference::Model;
use modstream::shutdown::Shutdown;
use modstream::tools::demo::{self, DEMO_DLQ, DEMO_INPUT, DEMO_VERDICTS};
use modstream::tools::embedded::EmbeddedBroker;
use modstream::tools::generator::{self, GeneratedEvent};
use modstream::tools::read::{self, ReadRecord};
use modstream::tools::send;

const SHADOW: &str = "moderation.shadow";
const EVENTS: usize = 400;

/// One run on a fresh cluster: (verdicts by event id, shadow records).
/// `compared`: how many comparison records to wait for.
async fn run(
    events: &[GeneratedEvent],
    shadow: Option<&Path>,
    compared: usize,
) -> (HashMap<String, serde_json::Value>, Vec<ReadRecord>) {
    let broker = EmbeddedBroker::start(&[
        (DEMO_INPUT, 4),
        (DEMO_VERDICTS, 4),
        (DEMO_DLQ, 1),
        (SHADOW, 1),
    ])
    .unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    send::produce_all(&bootstrap, DEMO_INPUT, events)
        .await
        .unwrap();
    let mut settings = demo::demo_settings(&bootstrap, "g-shadow").unwrap();
    settings.inference.shadow.model_dir = shadow.map(Path::to_path_buf);
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let b = bootstrap.clone();
    let verdicts = tokio::task::spawn_blocking(move || {
        read::read_topic(&b, DEMO_VERDICTS, 4, EVENTS, Duration::from_secs(60))
    })
    .await
    .unwrap()
    .unwrap();
    // The comparison records trail the live verdicts (or never come).
    let want = compared;
    let b = bootstrap.clone();
    let wait = if want > 0 {
        Duration::from_secs(90)
    } else {
        Duration::from_secs(3)
    };
    let compared =
        tokio::task::spawn_blocking(move || read::read_topic(&b, SHADOW, 1, want.max(1), wait))
            .await
            .unwrap()
            .unwrap();
    shutdown.stop.cancel();
    pipeline.await.unwrap().unwrap();
    let by_id = verdicts
        .iter()
        .map(|r| {
            let json = r.json().unwrap();
            (json["event_id"].as_str().unwrap().to_string(), json)
        })
        .collect();
    (by_id, compared)
}

/// Verdict and model equal, scores within 1e-6 (ONNX Runtime's sums may
/// differ in the last bits with the batch an event ran in, shadow or not).
fn same_judgement(id: &str, a: &serde_json::Value, b: &serde_json::Value) {
    assert_eq!(a["verdict"], b["verdict"], "verdict of {id}");
    assert_eq!(a["model"], b["model"], "model of {id}");
    for (label, score) in a["scores"].as_object().unwrap() {
        let other = b["scores"][label].as_f64().unwrap();
        assert!(
            (score.as_f64().unwrap() - other).abs() < 1e-6,
            "{label} score of {id}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_model_changes_nothing_live_and_its_records_carry_both_scores() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let minilm = root.join("models/minilm-l6");
    assert!(
        minilm.join("model.onnx").is_file(),
        "run scripts/build-minilm-model.sh"
    );
    let events = generator::generate(EVENTS, 0, "sh-");
    let texts: HashMap<&str, &str> = events
        .iter()
        .map(|e| (e.event_id.as_str(), e.text.as_deref().unwrap()))
        .collect();

    let (plain, none) = run(&events, None, 0).await;
    assert_eq!(plain.len(), EVENTS);
    assert!(none.is_empty());

    let (with_shadow, compared) = run(&events, Some(&minilm), EVENTS).await;
    assert_eq!(with_shadow.len(), EVENTS);
    for (id, v) in &plain {
        same_judgement(id, v, &with_shadow[id]);
    }
    assert_eq!(
        compared.len(),
        EVENTS,
        "one comparison record per event (share 1.0)"
    );
    let mut shadow_model = Model::load(&modstream::config::InferenceSettings {
        model_dir: minilm.clone(),
        ..Default::default()
    })
    .unwrap();
    let mut disagreements = 0;
    for (i, record) in compared.iter().enumerate() {
        let c = record.json().unwrap();
        let id = c["event_id"].as_str().unwrap();
        let live = &with_shadow[id];
        assert_eq!(c["live"]["verdict"], live["verdict"]);
        assert_eq!(c["live"]["scores"], live["scores"]);
        assert_eq!(c["live"]["model"]["name"], "alt-profanity-check");
        assert_eq!(c["shadow"]["model"]["name"], "minilm-l6-moderation");
        assert_eq!(c["source"]["topic"], DEMO_INPUT);
        let agree = c["live"]["verdict"] == c["shadow"]["verdict"];
        assert_eq!(c["agree"], agree);
        disagreements += usize::from(!agree);
        // The shadow's scores are the shadow model's own on that text (a
        // sample of them, scored here one at a time).
        if i % 20 == 0 {
            let mut text = vec![texts[id].to_string()];
            let expected = shadow_model.score(&mut text).unwrap().remove(0);
            let got = c["shadow"]["scores"]["offensive"].as_f64().unwrap();
            let index = shadow_model.manifest.score_index();
            assert!(
                (got - f64::from(expected[index])).abs() < 1e-4,
                "{id}: {got} vs {expected:?}"
            );
        }
    }
    println!("shadow disagreed with live on {disagreements} of {EVENTS} events");

    // A shadow model that cannot load: counted and logged, nothing live changes.
    let broken = tempfile::tempdir().unwrap();
    std::fs::copy(
        root.join("models/profanity-check/manifest.json"),
        broken.path().join("manifest.json"),
    )
    .unwrap();
    std::fs::write(broken.path().join("model.onnx"), b"not a model").unwrap();
    // This binary's one test: its recorder counts the runs above and this one.
    let load_failures = || support::metric_value("modstream_shadow_failures_total{stage=\"load\"}");
    let before = load_failures().unwrap_or(0.0);
    let (with_broken, nothing) = run(&events, Some(broken.path()), 0).await;
    assert!(
        nothing.is_empty(),
        "no comparison records from a broken shadow"
    );
    assert_eq!(
        load_failures(),
        Some(before + 1.0),
        "the shadow model that cannot load is counted once"
    );
    for (id, v) in &plain {
        same_judgement(id, v, &with_broken[id]);
    }
}
