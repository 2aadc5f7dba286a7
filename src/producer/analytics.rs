//! Analytics records (decisions, waves, samples: [`RecordKind::is_analytics`])
//! never hold moderation. An offset waits for one at most
//! `output.analytics_timeout`, retrying meanwhile; past it, or when its
//! delivery fails for good, the record is given up: counted
//! (`modstream_analytics_given_up_total{kind}`), logged, and its offset
//! goes on. They are not ordered with their partition's re-sends (their
//! consumers read them by key, not by offset), so one that waits holds no
//! other record back.
//!
//! A topic whose records fail (missing, not authorized) is closed: from
//! then on its records are given up at once, but for one try every
//! `analytics_timeout`, which opens it again when it succeeds. While one
//! is closed /readyz says which and why (`analytics_failing`), without
//! failing readiness: moderation goes on. With exactly-once a record's
//! failure still aborts its transaction (a transaction cannot commit
//! without it); the gate bounds that to one abort per topic and interval.
//!
//! [`RecordKind::is_analytics`]: crate::producer::record::RecordKind::is_analytics

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::producer::record::RecordKind;
use crate::telemetry::{Health, metric};

/// The closed topics: since when, the last error, and when the next try
/// may go.
#[derive(Default)]
pub(super) struct Gate {
    closed: Mutex<HashMap<String, Closed>>,
}

struct Closed {
    error: String,
    next_try: Instant,
}

/// Whether a record may go to its topic now.
pub(super) enum Pass {
    /// The topic works (or it is the one try of this interval).
    Go,
    /// Closed: given up at once, with the error that closed it.
    GiveUp(String),
}

impl Gate {
    pub(super) fn pass(&self, topic: &str, interval: Duration) -> Pass {
        let Ok(mut closed) = self.closed.lock() else {
            return Pass::Go;
        };
        match closed.get_mut(topic) {
            None => Pass::Go,
            Some(c) if Instant::now() >= c.next_try => {
                c.next_try = Instant::now() + interval;
                Pass::Go
            }
            Some(c) => Pass::GiveUp(c.error.clone()),
        }
    }

    pub(super) fn delivered(&self, topic: &str, health: &Health) {
        let Ok(mut closed) = self.closed.lock() else {
            return;
        };
        if closed.remove(topic).is_some() {
            tracing::info!(topic, "analytics topic works again");
            health.set_analytics_failing(describe(&closed));
        }
    }

    pub(super) fn failed(&self, topic: &str, error: &str, interval: Duration, health: &Health) {
        let Ok(mut closed) = self.closed.lock() else {
            return;
        };
        let first = !closed.contains_key(topic);
        closed.insert(
            topic.to_string(),
            Closed {
                error: error.to_string(),
                next_try: Instant::now() + interval,
            },
        );
        if first {
            tracing::error!(
                topic,
                error,
                "analytics records to this topic are given up until it works again; moderation goes on"
            );
        }
        health.set_analytics_failing(describe(&closed));
    }
}

/// What /readyz says of the closed topics.
fn describe(closed: &HashMap<String, Closed>) -> Option<String> {
    let mut topics: Vec<String> = closed
        .iter()
        .map(|(t, c)| format!("{t}: {}", c.error))
        .collect();
    topics.sort();
    (!topics.is_empty()).then(|| topics.join("; "))
}

/// A record given up: counted by kind.
pub(super) fn given_up(kind: RecordKind) {
    metrics::counter!(metric::ANALYTICS_GIVEN_UP_TOTAL, "kind" => kind.as_str()).increment(1);
}
