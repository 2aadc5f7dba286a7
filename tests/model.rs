//! The shipped model through ONNX Runtime, as the inference workers use it.

use modstream::config::InferenceSettings;
use modstream::inference::Model;

fn model() -> Model {
    Model::load(&InferenceSettings::default())
        .expect("the shipped model loads (run scripts/test.sh, which fetches ONNX Runtime)")
}

#[test]
fn abusive_posts_score_higher_than_benign_ones() {
    let mut m = model();
    let mut texts = vec![
        "Have a lovely day, see you at the garden club".to_string(),
        "Shut the fuck up, you worthless idiot".to_string(),
    ];
    let scores = m.score(&mut texts).unwrap();
    let offensive = m.manifest.score_index();
    assert_eq!(scores.len(), 2);
    assert!(scores[0][offensive] < 0.5, "benign scored {:?}", scores[0]);
    assert!(
        scores[1][offensive] > 0.85,
        "abusive scored {:?}",
        scores[1]
    );
    for s in &scores {
        assert!(
            (s.iter().sum::<f32>() - 1.0).abs() < 1e-4,
            "probabilities sum to 1"
        );
    }
}

#[test]
fn hostile_texts_score_without_crashing() {
    let mut m = model();
    let mut texts = vec![
        "nul\0inside\0text".to_string(),
        "\u{1F600}\u{1F621} emoji only".to_string(),
        "\u{5e9}\u{5dc}\u{5d5}\u{5dd} RTL".to_string(),
        "e\u{301}\u{301}\u{301} combining".to_string(),
        " ".to_string(),
        "x".repeat(64 * 1024),
    ];
    let n = texts.len();
    let results = m.score_isolating(&mut texts);
    assert_eq!(results.len(), n);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
}

#[test]
fn a_batch_scores_like_its_events_one_by_one() {
    let mut m = model();
    let posts: Vec<String> = modstream::tools::generator::sample_posts()
        .iter()
        .map(|(_, t)| t.to_string())
        .collect();
    let batched = m.score(&mut posts.clone()).unwrap();
    for (i, post) in posts.iter().enumerate() {
        let alone = m.score(&mut [post.clone()]).unwrap();
        assert!(
            (alone[0][1] - batched[i][1]).abs() < 1e-5,
            "batching changed the score of {post:?}"
        );
    }
}

/// The score cache changes nothing a verdict says: the same texts scored
/// with the cache (first filling it, then from it) and without it get the
/// same scores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_scores_equal_the_models_own() {
    use modstream::inference::{InferenceJob, InferencePool};
    // The only test in this binary that installs a metrics recorder.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let posts: Vec<String> = modstream::tools::generator::sample_posts()
        .into_iter()
        .map(|(_, t)| t.to_string())
        .collect();
    let run = |cache_bytes: u64, rounds: usize| {
        let posts = posts.clone();
        async move {
            let (tx, mut rx) = tokio::sync::mpsc::channel(4);
            let pool = InferencePool::start(
                &InferenceSettings {
                    cache_bytes,
                    workers: modstream::config::Workers::Count(1),
                    ..Default::default()
                },
                modstream::inference::RunLimit::posts(64),
                tx,
            )
            .unwrap();
            let mut all = Vec::new();
            for round in 0..rounds {
                pool.jobs()
                    .send(InferenceJob {
                        id: modstream::inference::JobId(round as u64),
                        texts: posts.clone(),
                    })
                    .await
                    .unwrap();
                all.push(rx.recv().await.unwrap().scores);
            }
            tokio::task::spawn_blocking(move || pool.shutdown())
                .await
                .unwrap();
            all
        }
    };
    let plain = run(0, 1).await;
    let cached = run(1 << 20, 2).await;
    assert_eq!(cached[0], plain[0], "filling the cache");
    assert_eq!(cached[1], plain[0], "served from the cache");
    let exposition = metrics.render();
    let hits = format!("modstream_cache_hits_total {}", posts.len());
    assert!(
        exposition.lines().any(|l| l == hits),
        "the second round came from the cache: {exposition}"
    );
}
