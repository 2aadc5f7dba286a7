//! A verdict's `processed_at`: formatted for every verdict (chrono's RFC
//! 3339), against the stamp the service writes (formatted once per
//! millisecond on a thread), each read from the clock as the service does,
//! taking turns for a few rounds. One thread, no Kafka.
//! `cargo run --release -p modstream-bench --example stamp [N] [ROUNDS]`

use std::hint::black_box;
use std::time::Instant;

use modstream::verdict::Stamp;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    for round in 1..=rounds {
        let every = per_call(n, || {
            let text = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            black_box(text.len())
        });
        let stamp = per_call(n, || {
            black_box(Stamp::at(chrono::Utc::now()).as_str().len())
        });
        println!(
            "round {round}: formatted each time {every:.1} ns, stamp {stamp:.1} ns per verdict ({:.2}x)",
            every / stamp
        );
    }
}

/// Nanoseconds per call of `f`, over `n` calls.
fn per_call(n: usize, mut f: impl FnMut() -> usize) -> f64 {
    let start = Instant::now();
    let mut sum = 0usize;
    for _ in 0..n {
        sum = sum.wrapping_add(f());
    }
    black_box(sum);
    start.elapsed().as_nanos() as f64 / n as f64
}
