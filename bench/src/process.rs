//! What a process costs, read from `/proc` (Linux): its peak resident set
//! size and its CPU time, split by thread name into the Kafka client's
//! threads (librdkafka's own, `rdk:*`, and the two that poll it: modstream's
//! `kafka-consumer` and rust-rdkafka's producer polling thread), the
//! inference workers
//! (`inference-*`, and the ONNX Runtime threads they start, which inherit
//! the name) and the rest.

/// Peak resident set size of this process, bytes.
pub fn peak_rss_bytes() -> u64 {
    peak_rss_of("self")
}

/// Peak resident set size of a process (`/proc/<pid>/status` VmHWM), bytes;
/// 0 once it is gone.
pub fn peak_rss_of(pid: &str) -> u64 {
    status_field(pid, "VmHWM:")
}

/// Resident set size of this process now, bytes.
pub fn rss_bytes() -> u64 {
    status_field("self", "VmRSS:")
}

/// A `/proc/<pid>/status` field in kB, as bytes (0 if unreadable).
fn status_field(pid: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
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
}

/// The clock ticks of `/proc/*/stat` (USER_HZ, 100 on Linux whatever the
/// kernel's own tick rate).
const TICKS_PER_S: f64 = 100.0;

/// (name, utime + stime in seconds) from one `stat` line; the name is in
/// parentheses and may hold spaces, the fields after it are counted from
/// its closing one (utime and stime are fields 14 and 15).
fn parse_stat(line: &str) -> Option<(String, f64)> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let name = line.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = line.get(close + 1..)?.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some((name, (ticks(11)? + ticks(12)?) as f64 / TICKS_PER_S))
}

/// The CPU time of a process now; None once it is gone.
pub fn cpu_time_of(pid: &str) -> Option<CpuTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, total_s) = parse_stat(&stat)?;
    let mut cpu = CpuTime {
        total_s,
        ..CpuTime::default()
    };
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Some((name, s)) = std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|l| parse_stat(&l))
        else {
            continue;
        };
        if name.starts_with("rdk:") || name == "kafka-consumer" || name.starts_with("producer poll")
        {
            cpu.kafka_s += s;
        } else if name.starts_with("inference-") {
            cpu.inference_s += s;
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
    fn a_stat_line_with_spaces_in_the_name() {
        let line = "4242 (rdk:broker 1) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 9";
        assert_eq!(parse_stat(line), Some(("rdk:broker 1".to_string(), 3.25)));
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
        assert!(peak_rss_bytes() > 0);
    }
}
