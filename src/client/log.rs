//! librdkafka's own log lines and error callbacks, each shape at most once
//! per [`REPEAT_WINDOW`] with how many like it were held back: a broker
//! that cannot be reached otherwise logs a line for every attempt, from
//! every client, through both callbacks (about 780 in 30 s at start). One
//! gate serves the whole process. The last error is kept, for the reason a
//! start gives up. A leaf: it imports nothing of the crate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;

/// A line of one shape is logged at most once this often.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(10);

/// Shapes remembered at most (past it the memory starts again: a flood of
/// distinct lines is logged, not held).
const MAX_SHAPES: usize = 1024;

/// Lines by shape: digits left out, and librdkafka's timing suffix
/// ("(after 12ms in state CONNECT, 3 identical error(s) suppressed)").
#[derive(Default)]
pub struct RepeatGate {
    seen: Mutex<HashMap<String, Repeats>>,
}

struct Repeats {
    logged: Instant,
    held: u64,
}

impl RepeatGate {
    /// Whether to log `line` now: `Some(n)` with the `n` lines like it held
    /// back since it was last logged, or `None` to hold it back.
    pub fn admit(&self, line: &str) -> Option<u64> {
        let head = line.split(" (after ").next().unwrap_or(line);
        let shape: String = head.chars().filter(|c| !c.is_ascii_digit()).collect();
        let Ok(mut seen) = self.seen.lock() else {
            return Some(0);
        };
        if seen.len() >= MAX_SHAPES && !seen.contains_key(&shape) {
            seen.clear();
        }
        let now = Instant::now();
        match seen.get_mut(&shape) {
            Some(r) if now.duration_since(r.logged) < REPEAT_WINDOW => {
                r.held += 1;
                None
            }
            Some(r) => {
                r.logged = now;
                Some(std::mem::take(&mut r.held))
            }
            None => {
                seen.insert(
                    shape,
                    Repeats {
                        logged: now,
                        held: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

/// The process's gate: every client's lines and errors go through it.
pub fn gate() -> &'static RepeatGate {
    static GATE: std::sync::OnceLock<RepeatGate> = std::sync::OnceLock::new();
    GATE.get_or_init(RepeatGate::default)
}

/// Whether an error is a cause worth giving when a start gives up: "all
/// brokers are down" is what follows the cause, not the cause.
pub fn is_cause(error: &KafkaError) -> bool {
    error.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::AllBrokersDown)
}

/// The last error a client reported (why it cannot connect), shared with
/// whoever created the client (librdkafka's wrappers hide the context).
#[derive(Debug, Clone, Default)]
pub struct LastError(Arc<Mutex<Option<String>>>);

impl LastError {
    pub fn get(&self) -> Option<String> {
        self.0.lock().ok().and_then(|e| e.clone())
    }

    pub fn set(&self, reason: &str) {
        if let Ok(mut last) = self.0.lock() {
            *last = Some(reason.to_string());
        }
    }
}

/// A client context whose logs go through the [`gate`] and which keeps the
/// last error (every producer; the group consumer has its own context and
/// uses [`log_line`] and the [`gate`] the same way).
#[derive(Default)]
pub struct QuietContext {
    pub last_error: LastError,
}

impl ClientContext for QuietContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        log_line(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if is_cause(&error) {
            self.last_error.set(reason);
        }
        if let Some(held) = gate().admit(reason) {
            tracing::warn!(error = %error, reason, held_back = held, "kafka client error");
        }
    }
}

impl ConsumerContext for QuietContext {}

/// One of librdkafka's log lines, at its level, under the `librdkafka`
/// target, unless one like it (or an error callback's reason like it) was
/// logged within [`REPEAT_WINDOW`]. librdkafka prefixes a line with its
/// thread (`[thrd:...]: `), left out of its shape.
pub fn log_line(level: RDKafkaLogLevel, fac: &str, message: &str) {
    let bare = match message.strip_prefix("[thrd:") {
        Some(rest) => rest.split_once("]: ").map_or(message, |(_, m)| m),
        None => message,
    };
    let Some(held) = gate().admit(bare) else {
        return;
    };
    use RDKafkaLogLevel as L;
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error => {
            tracing::error!(target: "librdkafka", fac, held_back = held, "{message}")
        }
        L::Warning => tracing::warn!(target: "librdkafka", fac, held_back = held, "{message}"),
        L::Notice | L::Info => {
            tracing::info!(target: "librdkafka", fac, held_back = held, "{message}")
        }
        L::Debug => tracing::debug!(target: "librdkafka", fac, held_back = held, "{message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_line_is_held_back_and_counted() {
        let gate = RepeatGate::default();
        let line = |ms: u32| {
            format!(
                "Connect to ipv4#127.0.0.1:9 failed: Connection refused (after {ms}ms in state CONNECT)"
            )
        };
        assert_eq!(gate.admit(&line(0)), Some(0));
        for ms in 1..50 {
            assert_eq!(
                gate.admit(&line(ms)),
                None,
                "the same shape within the window"
            );
        }
        assert_eq!(gate.admit("another line"), Some(0));
        // librdkafka's own count of suppressed errors is part of the suffix.
        assert_eq!(
            gate.admit("Connect to ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT, 3 identical error(s) suppressed)"),
            None
        );
        // Past the window: logged again, with the count held back.
        if let Ok(mut seen) = gate.seen.lock() {
            for r in seen.values_mut() {
                r.logged -= REPEAT_WINDOW;
            }
        }
        assert_eq!(gate.admit(&line(99)), Some(50));
    }
}
