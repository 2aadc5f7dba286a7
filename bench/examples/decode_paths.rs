//! Records decoded per second, one thread, no Kafka: the decoder as it
//! runs (only what the mapping reads kept) against the same decoder given
//! the whole tree (`serde_json::Value` first, the way it decoded before),
//! taking turns on the same records. Two records: the generator's post
//! (every member mapped) and the same post with a 4 KiB object no field
//! reads (a feed's context). Prints one line per round and record.
//! `cargo run --release -p modstream-bench --example decode_paths [N] [ROUNDS]`

use std::time::Instant;

use modstream::config::Limits;
use modstream::event::{Decoder, RecordParts, RejectReason, reject};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse().ok());
    let n: usize = args.next().flatten().unwrap_or(200_000);
    let rounds: usize = args.next().flatten().unwrap_or(5);
    let decoder = Decoder::plain(&Limits::default());
    let post = serde_json::json!({
        "event_id": "e-123456", "text": "a post about nothing much", "user_id": "u-9",
        "lang": "en", "created_at": 1_764_800_000_000i64, "priority": "normal",
    });
    let mut large = post.clone();
    large["context"] = (0..64)
        .map(|i| {
            (
                format!("field_{i}"),
                serde_json::json!({"value": "x".repeat(48), "n": i}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    let records = [("post", post.to_string()), ("post+4KiB", large.to_string())];
    let whole = |bytes: &[u8]| {
        serde_json::from_slice(bytes).map_err(|e| reject(RejectReason::InvalidJson, e.to_string()))
    };
    for round in 1..=rounds {
        for (name, text) in &records {
            let record = RecordParts {
                key: None,
                payload: Some(text.as_bytes()),
                headers: &[],
            };
            let time = |f: &dyn Fn() -> bool| {
                let start = Instant::now();
                let decoded = (0..n).filter(|_| f()).count();
                assert_eq!(decoded, n, "every record decodes");
                n as f64 / start.elapsed().as_secs_f64()
            };
            let paths = time(&|| decoder.decode("posts", record).is_ok());
            let tree = time(&|| decoder.decode_with("posts", record, whole).is_ok());
            println!(
                "round {round} {name} ({} bytes): paths {paths:.0}/s, whole tree {tree:.0}/s, ratio {:.2}",
                text.len(),
                paths / tree
            );
        }
    }
}
