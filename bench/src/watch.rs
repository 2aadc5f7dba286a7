//! Watching a job's processes while a reader counts what they write: peak
//! RSS and CPU time from `/proc/PID`, sampled every 10 ms, and the CPU
//! seconds spent from the first sample after a verdict was read to the
//! last, per verdict read between those two samples (start-up does not
//! count); records per second from the records' own timestamps.

use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::cell::Cell;
use super::process::{CpuTime, cpu_time_of, peak_rss_of};
use modstream::tools::read::TopicReader;

/// What one process did with the events.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProcessRun {
    pub per_s: f64,
    pub peak_rss_bytes: u64,
    /// Between the first sample after a verdict was read and the last
    /// sample, and the verdicts read between those two samples.
    pub cpu: CpuTime,
    /// The broker's CPU seconds over the same span (`--broker-pid`).
    pub broker_cpu_s: Option<f64>,
    pub verdicts: usize,
    /// What the run wrote to its cell's state changelog.
    pub changelog: crate::state::Changelog,
}

impl ProcessRun {
    /// None where too few verdicts fell between two samples to say (a run
    /// over in a few tens of milliseconds).
    pub fn cpu_s_per_million(&self) -> Option<f64> {
        (self.verdicts >= 20 && self.cpu.total_s > 0.0)
            .then(|| self.cpu.total_s * 1e6 / self.verdicts as f64)
    }

    /// The broker's CPU microseconds per verdict over the same span.
    pub fn broker_cpu_us_per_verdict(&self) -> Option<f64> {
        let s = self.broker_cpu_s?;
        (self.verdicts >= 20).then(|| s * 1e6 / self.verdicts as f64)
    }

    /// The Kafka client's threads' share of the CPU time.
    pub fn kafka_share(&self) -> f64 {
        self.cpu.kafka_s / self.cpu.total_s.max(1e-9)
    }
}

/// One sample of a watched process: its CPU time, the broker's (with
/// `--broker-pid`) and the verdicts read by then.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    cpu: CpuTime,
    broker_s: Option<f64>,
    verdicts: usize,
}

/// Samples the process (and the broker, `broker_pid`) every 10 ms while
/// `reader` reads its verdicts; `exits_itself`: the process ends on its own
/// once done (its last sample is the last taken while it lived), else it
/// must outlive the reading.
pub(super) async fn watch(
    child: &mut Child,
    reader: TimedReader,
    exits_itself: bool,
    broker_pid: Option<u32>,
) -> anyhow::Result<ProcessRun> {
    watch_all(
        std::slice::from_mut(child),
        reader,
        exits_itself,
        broker_pid,
    )
    .await
}

/// [`watch`] over a job of several processes (a pipe of two): their CPU
/// time summed (one that ended at its last sample), their peaks summed
/// (each at its own peak).
pub(super) async fn watch_all(
    children: &mut [Child],
    reader: TimedReader,
    exits_itself: bool,
    broker_pid: Option<u32>,
) -> anyhow::Result<ProcessRun> {
    let pids: Vec<String> = children.iter().map(|c| c.id().to_string()).collect();
    let broker = broker_pid.map(|p| p.to_string());
    let TimedReader { read, task: reader } = reader;
    let mut peaks = vec![0u64; pids.len()];
    let mut known: Vec<Option<CpuTime>> = vec![None; pids.len()];
    let (mut first, mut last): (Option<Sample>, Sample) = (None, Sample::default());
    loop {
        for (peak, pid) in peaks.iter_mut().zip(&pids) {
            *peak = (*peak).max(peak_rss_of(pid));
        }
        let verdicts = read.load(Ordering::SeqCst);
        for (known, pid) in known.iter_mut().zip(&pids) {
            *known = cpu_time_of(pid).or(*known);
        }
        // A process that ended counts at its last sample: all it spent.
        let cpus: Option<Vec<CpuTime>> = known.iter().copied().collect();
        if let Some(cpus) = cpus {
            let broker_s = broker.as_deref().and_then(cpu_time_of).map(|c| c.total_s);
            last = Sample {
                cpu: cpus.iter().fold(CpuTime::default(), |sum, c| sum.plus(c)),
                broker_s,
                verdicts,
            };
            if first.is_none() && verdicts > 0 {
                first = Some(last);
            }
        }
        if reader.is_finished() {
            break;
        }
        let mut exited = 0;
        for child in children.iter_mut() {
            if let Some(status) = child.try_wait()? {
                if !(exits_itself && status.success()) {
                    reader.abort();
                    anyhow::bail!("the process exited before its last verdict: {status}");
                }
                exited += 1;
            }
        }
        if exited == children.len() {
            break;
        }
        // Fine enough that a run of a few hundred verdicts spans samples.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let per_s = reader.await??;
    let first = first.unwrap_or_default();
    Ok(ProcessRun {
        per_s,
        peak_rss_bytes: peaks.iter().sum(),
        cpu: last.cpu.since(&first.cpu),
        broker_cpu_s: last.broker_s.zip(first.broker_s).map(|(l, f)| l - f),
        verdicts: last.verdicts.saturating_sub(first.verdicts),
        changelog: Default::default(),
    })
}

/// A reader of a cell's verdicts, counting them as they come; its task
/// answers verdicts per second from their own timestamps.
pub(super) struct TimedReader {
    read: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<anyhow::Result<f64>>,
}

impl TimedReader {
    /// Reads `want` verdicts of `cell`, its consumer made (metadata read,
    /// partitions assigned) before this returns: started before the process
    /// it watches, it counts verdicts as they are written, not in one late
    /// first fetch that would leave no span to measure CPU time over.
    pub(super) async fn start(cell: &Cell, want: usize) -> anyhow::Result<TimedReader> {
        let (bootstrap, topic) = (cell.bootstrap.clone(), cell.verdicts.clone());
        let reader = tokio::task::spawn_blocking(move || {
            TopicReader::from_beginning(&bootstrap, &topic, None)
        })
        .await??;
        let read = Arc::new(AtomicUsize::new(0));
        let counted = read.clone();
        let task = tokio::task::spawn_blocking(move || timed_read(&reader, want, &counted));
        Ok(TimedReader { read, task })
    }
}

/// Reads `want` verdicts, counting them in `read`; verdicts per second
/// from their own timestamps.
fn timed_read(reader: &TopicReader, want: usize, read: &AtomicUsize) -> anyhow::Result<f64> {
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    let records = reader.read(want, Duration::from_secs(600), |r| {
        read.fetch_add(1, Ordering::SeqCst);
        if let Some(t) = r.timestamp_ms {
            first = first.min(t);
            last = last.max(t);
        }
    })?;
    anyhow::ensure!(
        records.len() == want,
        "only {} of {want} verdicts",
        records.len()
    );
    anyhow::ensure!(last > first, "verdict timestamps do not span any time");
    Ok((want - 1) as f64 * 1000.0 / (last - first) as f64)
}
