//! Verdicts written in Avro per second, one thread, the verdict record
//! alone (no Kafka): what `output.format = "avro"` costs per verdict.
//! `cargo run --release -p modstream-bench --example avro_verdicts [N]`

use modstream::event::{Event, Priority};
use modstream::inference::manifest::Manifest;
use modstream::schema::verdict::VerdictEncoder;
use modstream::tp::Tp;
use modstream::verdict::{Answer, Scorer, VerdictPayload};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let manifest: Manifest = serde_json::from_value(serde_json::json!({
        "name": "profanity", "version": "1", "input_kind": "text", "inputs": ["text"],
        "output": "p", "labels": ["clean", "offensive"], "score_label": "offensive",
    }))
    .expect("a manifest");
    let scorer = Scorer::named("profanity", &manifest);
    let encoder = VerdictEncoder::with_id(7);
    let tp = Tp {
        topic: "posts".into(),
        partition: 3,
    };
    let event = Event {
        event_id: "e-123456".into(),
        text: "a post".into(),
        user_id: Some("u-9".into()),
        lang: None,
        created_at_ms: Some(1_764_800_000_000),
        priority: Priority::Normal,
        metadata: None,
        tenant: Some("kids".into()),
        warnings: Vec::new(),
    };
    let mut bytes = 0usize;
    let start = std::time::Instant::now();
    for i in 0..n {
        let answer = Answer {
            source: &tp,
            offset: i as i64,
            key: None,
            event: &event,
            timestamp_ms: Some(1_764_800_000_000),
        };
        let p = (i % 100) as f32 / 100.0;
        bytes += write(&scorer, &encoder, answer, &[1.0 - p, p]);
    }
    let took = start.elapsed().as_secs_f64();
    println!(
        "{n} Avro verdicts in {took:.3} s: {:.0} verdicts/s, {:.2} µs each, {} bytes each",
        n as f64 / took,
        took * 1e6 / n as f64,
        bytes / n
    );
}

/// The service's Avro path: the verdict's body written straight by the
/// encoder.
fn write(scorer: &Scorer, encoder: &VerdictEncoder, answer: Answer<'_>, p: &[f32]) -> usize {
    let avro = |body: &VerdictPayload<'_>| encoder.encode(body);
    let (record, _) = scorer
        .verdict_record_with("verdicts", answer, p, avro)
        .expect("fits");
    record.payload.map_or(0, |b| b.len())
}
