//! The MiniLM-L6 transformer (built by scripts/build-minilm-model.sh, which
//! the test command runs): tokenization and scores must match what the
//! build script's NumPy reference forward pass computed, length bucketing
//! must not change scores, and the whole pipeline must moderate with it.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use modstream::config::{ExecutionProvider, InferenceSettings, PadTo};
use modstream::inference::Model;
use modstream::inference::tokens::Encoder;
use modstream::shutdown::Shutdown;
use modstream::tools::demo::{self, DEMO_DLQ, DEMO_INPUT, DEMO_VERDICTS};
use modstream::tools::embedded::EmbeddedBroker;
use modstream::tools::{generator, read, send};

fn model_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/minilm-l6");
    assert!(
        dir.join("model.onnx").is_file(),
        "{} missing: run scripts/build-minilm-model.sh (scripts/test.sh does)",
        dir.display()
    );
    dir
}

fn settings(pad_to: &str) -> InferenceSettings {
    InferenceSettings {
        model_dir: model_dir(),
        pad_to: match pad_to {
            "bucket" => PadTo::Bucket,
            _ => PadTo::Longest,
        },
        ..Default::default()
    }
}

#[derive(serde::Deserialize)]
struct Check {
    text: String,
    ids: Vec<i64>,
    probabilities: Vec<f32>,
}

fn checks() -> Vec<Check> {
    let text = std::fs::read_to_string(model_dir().join("check.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn token_ids_match_the_python_tokenizer() {
    let encoder = Encoder::load(&model_dir().join("tokenizer.json"), 128).unwrap();
    for c in checks() {
        let ids = encoder.encode(&c.text).unwrap().ids;
        assert_eq!(ids, c.ids, "token ids of {:?}", c.text);
        assert!(ids.len() <= 128);
    }
}

#[test]
fn scores_match_the_reference_forward_pass_batched_and_alone() {
    let checks = checks();
    let mut texts: Vec<String> = checks.iter().map(|c| c.text.clone()).collect();
    assert!(texts.len() >= 10);
    for pad_to in ["longest", "bucket"] {
        let mut m = Model::load(&settings(pad_to)).unwrap();
        assert_eq!(
            m.manifest.labels,
            ["clean", "offensive"],
            "labels from config.json id2label"
        );
        let batched = m.score(&mut texts).unwrap();
        for (c, got) in checks.iter().zip(&batched) {
            for (g, want) in got.iter().zip(&c.probabilities) {
                assert!(
                    (g - want).abs() < 1e-4,
                    "{pad_to}: {:?} scored {got:?}, reference {:?}",
                    c.text,
                    c.probabilities
                );
            }
        }
        for (i, text) in texts.iter().enumerate().take(4) {
            let alone = m.score(&mut [text.clone()]).unwrap();
            assert!((alone[0][1] - batched[i][1]).abs() < 1e-4);
        }
    }
}

#[test]
fn splitting_by_length_keeps_padding_low_on_mixed_lengths() {
    // 15 short posts and one long one: padded to the longest in one pass, the
    // short ones would carry ~100 padding tokens each.
    let mut texts: Vec<String> = generator::sample_posts()
        .iter()
        .take(15)
        .map(|(_, t)| t.to_string())
        .collect();
    texts.push(texts.join(" "));
    let mut bucketed = Model::load(&settings("longest")).unwrap();
    bucketed.score(&mut texts).unwrap();
    let one_pass = InferenceSettings {
        pass_overhead_tokens: 1 << 30,
        ..settings("longest")
    };
    let mut single = Model::load(&one_pass).unwrap();
    single.score(&mut texts).unwrap();
    assert_eq!(bucketed.tokens.real, single.tokens.real);
    let efficiency = |m: &Model| m.tokens.real as f64 / m.tokens.padded as f64;
    assert!(
        efficiency(&bucketed) > 0.7 && efficiency(&single) < 0.3,
        "bucketed {:.2}, one pass {:.2}",
        efficiency(&bucketed),
        efficiency(&single)
    );
}

#[test]
fn hostile_texts_score_without_crashing() {
    let mut m = Model::load(&settings("longest")).unwrap();
    let mut texts = vec![
        "nul\0inside\0text".to_string(),
        "\u{1F600}\u{1F621} emoji only".to_string(),
        "\u{5e9}\u{5dc}\u{5d5}\u{5dd} RTL".to_string(),
        "e\u{301}\u{301}\u{301} combining".to_string(),
        " ".to_string(),
        "".to_string(),
        "word ".repeat(20_000),
    ];
    let n = texts.len();
    let results = m.score_isolating(&mut texts);
    assert_eq!(results.len(), n);
    for r in &results {
        let p = r.as_ref().expect("every text scores");
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    }
    assert!(
        m.tokens.padded <= (n * 128) as u64,
        "truncated to max_length"
    );
}

#[test]
fn gpu_providers_fall_back_to_cpu_unless_required() {
    // This machine's ONNX Runtime is the CPU build: CUDA cannot register.
    // On a GPU build with a usable GPU the same settings must run on CUDA,
    // with and without require_gpu.
    let fallback = InferenceSettings {
        execution_providers: vec![ExecutionProvider::Cuda, ExecutionProvider::Cpu],
        ..settings("longest")
    };
    let mut m = Model::load(&fallback).unwrap();
    assert_eq!(m.score(&mut ["hello".to_string()]).unwrap().len(), 1);
    let required = InferenceSettings {
        require_gpu: true,
        ..fallback
    };
    if m.provider == "CUDAExecutionProvider" {
        let mut gpu = Model::load(&required).expect("require_gpu is met on a usable GPU");
        assert_eq!(gpu.provider, "CUDAExecutionProvider");
        assert_eq!(gpu.score(&mut ["hello".to_string()]).unwrap().len(), 1);
        return;
    }
    assert_eq!(m.provider, "CPUExecutionProvider");
    let err = Model::load(&required)
        .err()
        .expect("require_gpu fails on CPU");
    assert!(err.to_string().contains("require_gpu"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_moderates_with_the_transformer() {
    let broker =
        EmbeddedBroker::start(&[(DEMO_INPUT, 2), (DEMO_VERDICTS, 2), (DEMO_DLQ, 1)]).unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let events = generator::generate(300, 100, "t-");
    let valid: HashSet<String> = events
        .iter()
        .filter(|e| e.text.is_some())
        .map(|e| e.event_id.clone())
        .collect();
    send::produce_all(&bootstrap, DEMO_INPUT, &events)
        .await
        .unwrap();

    let mut settings = demo::demo_settings(&bootstrap, "g-minilm").unwrap();
    settings.inference.model_dir = model_dir();
    settings.inference.workers = modstream::config::Workers::Count(2);
    settings.batching.max_batch_size = 16;
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let b = bootstrap.clone();
    let want = valid.len();
    let verdicts = tokio::task::spawn_blocking(move || {
        read::read_topic(&b, DEMO_VERDICTS, 2, want, Duration::from_secs(120))
    })
    .await
    .unwrap()
    .unwrap();
    shutdown.stop.cancel();
    let summary = tokio::time::timeout(Duration::from_secs(60), pipeline)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    let mut seen = HashSet::new();
    for v in &verdicts {
        let json: serde_json::Value = serde_json::from_slice(&v.payload).unwrap();
        assert_eq!(json["model"]["name"], "minilm-l6-moderation");
        let offensive = json["scores"]["offensive"].as_f64().unwrap();
        let clean = json["scores"]["clean"].as_f64().unwrap();
        assert!(
            (offensive + clean - 1.0).abs() < 1e-4,
            "softmax over the labels"
        );
        seen.insert(json["event_id"].as_str().unwrap().to_string());
    }
    assert_eq!(seen, valid, "one verdict per valid event");
    assert_eq!(summary.verdicts as usize, valid.len());
    assert!(summary.real_tokens > 0 && summary.real_tokens <= summary.padded_tokens);
}

/// The int8 copy (scripts/quantize_minilm_model.py, run by the build script)
/// against fp32, through modstream, on held-out posts built as the script
/// builds them: the labelled posts and posts of every length. Bounds: the
/// verdict at 0.5 agrees on at least 95 % of them and no probability moves
/// by more than 0.2; the manifest records the script's own numbers, which
/// must be within the same bounds.
#[test]
fn the_int8_model_stays_close_to_fp32_within_stated_bounds() {
    let int8_dir = model_dir().with_file_name("minilm-l6-int8");
    let int8 = InferenceSettings {
        model_dir: int8_dir.clone(),
        ..settings("longest")
    };
    let mut q = Model::load(&int8).unwrap();
    let mut f = Model::load(&settings("longest")).unwrap();
    assert_eq!(q.manifest.version, format!("{}-int8", f.manifest.version));
    let recorded = q
        .manifest
        .quantization
        .clone()
        .expect("the manifest records its quantization");
    let posts: Vec<String> = generator::sample_posts()
        .iter()
        .map(|(_, t)| t.to_string())
        .collect();
    let words: Vec<&str> = posts.iter().flat_map(|p| p.split_whitespace()).collect();
    let mut texts = posts.clone();
    for n in (1..161).step_by(3) {
        let start = (n * 7) % words.len();
        texts.push(
            words
                .iter()
                .cycle()
                .skip(start)
                .take(n)
                .copied()
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    assert_eq!(
        texts.len(),
        recorded.held_out_posts,
        "the same held-out set as the script"
    );
    let fp = f.score(&mut texts.clone()).unwrap();
    let qs = q.score(&mut texts).unwrap();
    let agree = fp
        .iter()
        .zip(&qs)
        .filter(|(a, b)| (a[1] >= 0.5) == (b[1] >= 0.5))
        .count() as f64
        / texts.len() as f64;
    let max_diff = fp
        .iter()
        .zip(&qs)
        .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
        .fold(0.0f32, f32::max);
    eprintln!(
        "int8 vs fp32 through modstream: {} posts, agreement {:.1} %, max |diff| {max_diff:.4}; recorded by the build: {:.1} %, {:.4}",
        texts.len(),
        agree * 100.0,
        recorded.verdict_agreement * 100.0,
        recorded.max_probability_difference
    );
    assert!(
        agree >= 0.95 && recorded.verdict_agreement >= 0.95,
        "{agree} {recorded:?}"
    );
    assert!(
        max_diff <= 0.2 && recorded.max_probability_difference <= 0.2,
        "{max_diff} {recorded:?}"
    );
}
