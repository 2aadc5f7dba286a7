//! What a process costs, read from `/proc` (Linux): its peak resident set
//! size and its CPU time, split by thread name into the Kafka client's
//! threads (librdkafka's own, `rdk:*`, and the two that poll it: modstream's
//! `kafka-consumer` and rust-rdkafka's producer polling thread), the
//! inference workers
//! (`inference-*`, and the ONNX Runtime threads they start, which inherit
//! the name) and the rest.

use procfs::process::Process;

/// A process by its `/proc` name: "self" or a pid.
fn process(pid: &str) -> Option<Process> {
    match pid {
        "self" => Process::myself().ok(),
        pid => Process::new(pid.parse().ok()?).ok(),
    }
}

/// Peak resident set size of this process, bytes.
pub fn peak_rss_bytes() -> u64 {
    peak_rss_of("self")
}

/// Peak resident set size of a process (`/proc/<pid>/status` VmHWM), bytes;
/// 0 once it is gone.
pub fn peak_rss_of(pid: &str) -> u64 {
    let status = process(pid).and_then(|p| p.status().ok());
    status.and_then(|s| s.vmhwm).map_or(0, |kb| kb * 1024)
}

/// Resident set size of this process now, bytes.
pub fn rss_bytes() -> u64 {
    let status = process("self").and_then(|p| p.status().ok());
    status.and_then(|s| s.vmrss).map_or(0, |kb| kb * 1024)
}

/// CPU seconds (user + system) of a process: all of it (threads that ended
/// included), and of its live threads by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTime {
    pub total_s: f64,
    pub kafka_s: f64,
    pub inference_s: f64,
}

impl CpuTime {
    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &CpuTime) -> CpuTime {
        CpuTime {
            total_s: self.total_s - earlier.total_s,
            kafka_s: self.kafka_s - earlier.kafka_s,
            inference_s: self.inference_s - earlier.inference_s,
        }
    }

    /// `self + other`, field by field (a job of several processes).
    pub fn plus(&self, other: &CpuTime) -> CpuTime {
        CpuTime {
            total_s: self.total_s + other.total_s,
            kafka_s: self.kafka_s + other.kafka_s,
            inference_s: self.inference_s + other.inference_s,
        }
    }
}

/// User + system CPU seconds of one `stat` (the kernel counts in clock
/// ticks, USER_HZ).
fn seconds(stat: &procfs::process::Stat) -> f64 {
    (stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64
}

/// Which part of the service a thread of its belongs to, by its name.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ThreadKind {
    Kafka,
    Inference,
    Other,
}

fn thread_kind(name: &str) -> ThreadKind {
    if name.starts_with("rdk:") || name == "kafka-consumer" || name.starts_with("producer poll") {
        ThreadKind::Kafka
    } else if name.starts_with("inference-") {
        ThreadKind::Inference
    } else {
        ThreadKind::Other
    }
}

/// The CPU time of a process now; None once it is gone.
pub fn cpu_time_of(pid: &str) -> Option<CpuTime> {
    let process = process(pid)?;
    let mut cpu = CpuTime {
        total_s: seconds(&process.stat().ok()?),
        ..CpuTime::default()
    };
    for task in process.tasks().ok()?.flatten() {
        let Ok(stat) = task.stat() else {
            continue;
        };
        match thread_kind(&stat.comm) {
            ThreadKind::Kafka => cpu.kafka_s += seconds(&stat),
            ThreadKind::Inference => cpu.inference_s += seconds(&stat),
            ThreadKind::Other => {}
        }
    }
    Some(cpu)
}

/// The `modstream` binary beside this one (cargo builds both into the same
/// directory; an install puts them side by side). None when the bench runs
/// inside another program (a test), which then cannot start `modstream run`.
pub fn service_binary() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    if exe.file_stem().is_none_or(|n| n != "modstream-bench") {
        return None;
    }
    let service = exe.with_file_name(format!("modstream{}", std::env::consts::EXE_SUFFIX));
    service.is_file().then_some(service)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_by_their_names() {
        assert_eq!(thread_kind("rdk:broker1"), ThreadKind::Kafka);
        assert_eq!(thread_kind("kafka-consumer"), ThreadKind::Kafka);
        assert_eq!(thread_kind("inference-0"), ThreadKind::Inference);
        assert_eq!(thread_kind("tokio-runtime-w"), ThreadKind::Other);
    }

    #[test]
    fn this_process_uses_cpu() {
        let before = cpu_time_of("self").unwrap();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let spent = cpu_time_of("self").unwrap().since(&before);
        assert!(spent.total_s >= 0.2, "{spent:?}");
        // The threads' time is within the process's.
        let now = cpu_time_of("self").unwrap();
        assert!(now.kafka_s + now.inference_s <= now.total_s);
        let rss = rss_bytes();
        assert!(
            rss > 0 && peak_rss_bytes() >= rss,
            "{rss} {}",
            peak_rss_bytes()
        );
        assert_eq!(peak_rss_of("999999999"), 0);
    }
}
