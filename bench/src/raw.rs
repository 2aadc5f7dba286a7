//! The raw model on the pipeline's inference layout: as many sessions as
//! the pipeline has workers (each with its intra-op threads), scoring their
//! shares of the same batches at the same time, with no Kafka, no hub and
//! no verdicts. Its throughput is what the pipeline's cores could do with
//! the model alone; its CPU per event is what the model itself costs, the
//! floor of the pipeline's CPU per verdict.

use std::sync::Barrier;
use std::time::Instant;

use super::process::cpu_time_of;
use modstream::inference::Model;

/// One raw run over a set of texts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawRun {
    /// Sessions that scored at the same time.
    pub sessions: usize,
    pub per_s: f64,
    /// CPU seconds of this process (every thread, ONNX Runtime's own
    /// included) during the timed part, per event, in microseconds.
    pub cpu_us_per_event: f64,
}

/// Score `texts` in batches of `batch` (arrival order) on every model of
/// `models` at once, the batches dealt in turn as the hub hands runs to
/// whichever worker is free. Each session scores one warm-up batch before
/// the clock starts. The CPU time is the whole process's, so nothing else
/// should run in it meanwhile (the bench runs it between pipeline runs).
pub fn raw_on_sessions(
    models: &mut [Model],
    texts: &[String],
    batch: usize,
) -> anyhow::Result<RawRun> {
    anyhow::ensure!(
        !models.is_empty() && !texts.is_empty() && batch > 0,
        "nothing to score"
    );
    let sessions = models.len();
    let mut shares: Vec<Vec<Vec<String>>> = vec![Vec::new(); sessions];
    for (i, b) in texts.chunks(batch).enumerate() {
        shares[i % sessions].push(b.to_vec());
    }
    let start = Barrier::new(sessions + 1);
    let (cpu, elapsed) = std::thread::scope(|s| {
        let runs: Vec<_> = models
            .iter_mut()
            .zip(shares)
            .map(|(model, mut share)| {
                let start = &start;
                s.spawn(move || -> anyhow::Result<()> {
                    // Every thread reaches the barrier, even when its warm-up
                    // fails, so that none waits for ever.
                    let warm = match share.first() {
                        Some(first) => model.score(&mut first.clone()).map(|_| ()),
                        None => Ok(()),
                    };
                    start.wait();
                    warm?;
                    for b in &mut share {
                        model.score(b)?;
                    }
                    Ok(())
                })
            })
            .collect();
        start.wait();
        let before = cpu_time_of("self");
        let started = Instant::now();
        let joined: anyhow::Result<()> = runs.into_iter().try_for_each(|r| {
            r.join()
                .map_err(|_| anyhow::anyhow!("a raw scoring thread panicked"))?
        });
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = cpu_time_of("self")
            .zip(before)
            .map(|(after, before)| after.since(&before).total_s);
        joined.map(|()| (cpu, elapsed))
    })?;
    let events = texts.len() as f64;
    Ok(RawRun {
        sessions,
        per_s: events / elapsed,
        cpu_us_per_event: cpu.unwrap_or(f64::NAN) * 1e6 / events,
    })
}
