//! The Kafka client's own floor (`--kcat-floor`): a relay that does no work
//! per record, Debian's `kcat` consuming the input into a second `kcat`
//! producing to the verdict topic through a pipe, on the same events and
//! broker as `modstream run`, watched the same way (CPU of both processes
//! between the first and the last record read back, per record). No
//! consumer built on librdkafka can spend less per record than this.

use std::process::{Command, Stdio};

use super::BenchOptions;
use super::cell::Cell;
use super::watch::{TimedReader, watch_all};
use modstream::tools::generator::GeneratedEvent;
use modstream::tools::report::RelayRun;
use modstream::tools::send;

/// The key and the value of a record on one line: generated keys and JSON
/// values hold no tab and no raw newline.
const LINE: &str = "%k\t%s\n";

pub(super) async fn kcat_floor(
    opts: &BenchOptions,
    events: &[GeneratedEvent],
) -> anyhow::Result<RelayRun> {
    let cell = Cell::new(opts).await?;
    send::produce_all(&cell.bootstrap, &cell.input, events).await?;
    let reader = TimedReader::start(&cell, events.len()).await?;
    let spawn = |cmd: &mut Command| {
        cmd.spawn().map_err(|e| {
            anyhow::anyhow!("--kcat-floor needs kcat on PATH (Debian's package kcat): {e}")
        })
    };
    let mut consumer = spawn(
        Command::new("kcat")
            .args(["-C", "-q", "-b", &cell.bootstrap, "-t", &cell.input])
            // Out at the end of every partition: its output flushed, the
            // producer's input closed.
            .args(["-o", "beginning", "-e", "-f", LINE])
            .stdout(Stdio::piped()),
    )?;
    let pipe = consumer
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("kcat's output was not piped"))?;
    let producer = spawn(
        Command::new("kcat")
            .args(["-P", "-q", "-b", &cell.bootstrap, "-t", &cell.verdicts])
            .args(["-K", "\t"])
            .stdin(Stdio::from(pipe)),
    )?;
    let mut job = [consumer, producer];
    let watched = watch_all(&mut job, reader, true, opts.broker_pid).await;
    for child in &mut job {
        let _ = child.kill();
        let _ = child.wait();
    }
    let run = watched?;
    Ok(RelayRun {
        events: events.len(),
        per_s: run.per_s,
        peak_rss_bytes: run.peak_rss_bytes,
        cpu_us_per_record: run.cpu_s_per_million(),
    })
}
