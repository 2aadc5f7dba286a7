//! Risk-weighted sampling (`[sampling]`, on with `output.samples_topic`):
//! a share of verdicts, drawn with a probability that grows with a model's
//! score, written with their event, verdict and reason for people to
//! label; `modstream prevalence` weights each label by the inverse of its
//! probability ([`estimate`]) to estimate how much of the stream violates
//! a policy, and how well the model finds it.
//!
//! The draw is a hash of the event id, not a random number: an event
//! judged again with the same scores (after a crash, a rebalance, an
//! aborted transaction) is drawn the same way, with the same probability
//! (its score is rounded to 1/1000 first, so that a rerun's last-digit
//! differences do not change it). The rate bound is not a function of the
//! event: a drawn event it drops in one run may be written in another. So
//! that the report can count what the bound gave up, each drop is a record
//! of its own ([`Draw::Dropped`]), keyed by the event id like its sample;
//! an event read again by the same instance (an aborted transaction, a
//! revoke whose drain gave up) gets the answer it got the first time,
//! without spending the bound again. The hub owns the [`Sampler`] and asks
//! it about each verdict ([`Sampler::draw`]); the sample (or drop) record
//! goes out with the verdict (same acknowledgement, same transaction).

use std::collections::HashMap;

use tokio::time::Instant;

use crate::config::SamplingSettings;
use crate::telemetry::metric;
use crate::tp::Source;

pub mod estimate;
pub mod records;
pub mod simulate;

/// Tenants labelled by name in the metrics; later ones are counted as
/// [`OTHER_TENANTS`] (tenants come from events, labels must stay few).
pub const MAX_TENANT_LABELS: usize = 100;
pub const OTHER_TENANTS: &str = "_other";
/// The tenant label of events without a tenant.
pub const NO_TENANT: &str = "_none";
/// Rate-bound buckets kept at most (a full bucket is the same as none,
/// and is forgotten first).
const MAX_BUCKETS: usize = 4096;
/// Answers remembered by input position, for an event read again (the
/// last this many drawn events).
const REMEMBERED: usize = 65_536;
const SEED: u64 = 0x5a3d_1e77_c0de_f00d;

/// The probability of sampling an event of this risk score: `min_rate +
/// (max_rate - min_rate) × s`, the score clamped to 0..1 and rounded to
/// 1/1000.
pub fn inclusion_probability(rates: &SamplingSettings, score: f64) -> f64 {
    let s = (score.clamp(0.0, 1.0) * 1000.0).round() / 1000.0;
    (rates.min_rate + (rates.max_rate - rates.min_rate) * s).clamp(0.0, 1.0)
}

/// Where in 0..1 an event's id falls: it is sampled when that is below its
/// probability.
/// xxh3-128's high half: xxh3-64 of short ids ("p-12345") was measured
/// 3 standard deviations short of uniform below 0.05 on 20,000 of them.
pub fn unit(id: &[u8]) -> f64 {
    let high = (xxhash_rust::xxh3::xxh3_128_with_seed(id, SEED) >> 64) as u64;
    (high >> 11) as f64 / (1u64 << 53) as f64
}

/// What the sampler decided for one verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Draw {
    NotSampled,
    Sampled(Sample),
    /// Drawn, but over `sampling.max_per_second` for its tenant and rule:
    /// written as a drop record.
    Dropped(Sample),
}

/// A drawn event's sample: what its record says of its draw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub probability: f64,
    /// The risk score it was drawn by.
    pub score: f64,
}

/// One event as the sampler sees it.
pub struct Candidate<'a> {
    pub event_id: &'a str,
    pub tenant: Option<&'a str>,
    pub rule: &'a str,
    pub score: f64,
    /// Its input partition and offset: read again, the same answer.
    pub source: &'a Source,
}

/// The rate bound's state of one tenant and rule: a token bucket.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Per-tenant counters, by label value.
struct TenantCounters {
    events: metrics::Counter,
    sampled: metrics::Counter,
    dropped: metrics::Counter,
}

/// The sampler: the rates, and the rate bound's buckets.
pub struct Sampler {
    settings: SamplingSettings,
    buckets: HashMap<(String, String), Bucket>,
    tenants: HashMap<String, TenantCounters>,
    /// The answers of the last [`REMEMBERED`] drawn events by position,
    /// oldest first.
    answered: HashMap<Source, Draw>,
    order: std::collections::VecDeque<Source>,
}

impl Sampler {
    pub fn new(settings: &SamplingSettings) -> Sampler {
        Sampler {
            settings: settings.clone(),
            buckets: HashMap::new(),
            tenants: HashMap::new(),
            answered: HashMap::new(),
            order: std::collections::VecDeque::new(),
        }
    }

    pub fn settings(&self) -> &SamplingSettings {
        &self.settings
    }

    /// Whether this event is sampled, and with what probability.
    pub fn draw(&mut self, c: &Candidate<'_>, now: Instant) -> Draw {
        let probability = inclusion_probability(&self.settings, c.score);
        let counters = self.counters(c.tenant);
        counters.events.increment(1);
        if unit(c.event_id.as_bytes()) >= probability {
            return Draw::NotSampled;
        }
        let (sampled, dropped) = (counters.sampled.clone(), counters.dropped.clone());
        let sample = Sample {
            probability,
            score: c.score,
        };
        // Read again (same draw, same probability): the first answer.
        if let Some(&first) = self.answered.get(c.source)
            && matches!(first, Draw::Sampled(s) | Draw::Dropped(s) if s == sample)
        {
            return first;
        }
        let key = (c.tenant.unwrap_or("").to_string(), c.rule.to_string());
        self.forget_idle(now);
        let rate = self.settings.max_per_second;
        let bucket = self.buckets.entry(key).or_insert(Bucket {
            tokens: rate,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate.max(1.0));
        bucket.at = now;
        let draw = if bucket.tokens < 1.0 {
            dropped.increment(1);
            Draw::Dropped(sample)
        } else {
            bucket.tokens -= 1.0;
            sampled.increment(1);
            Draw::Sampled(sample)
        };
        self.remember(c.source, draw);
        draw
    }

    fn remember(&mut self, source: &Source, draw: Draw) {
        if self.answered.insert(source.clone(), draw).is_none() {
            self.order.push_back(source.clone());
        }
        while self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.answered.remove(&old);
            }
        }
    }

    fn counters(&mut self, tenant: Option<&str>) -> &TenantCounters {
        let name = match tenant {
            None => NO_TENANT,
            Some(t) if self.tenants.contains_key(t) || self.tenants.len() < MAX_TENANT_LABELS => t,
            Some(_) => OTHER_TENANTS,
        };
        if !self.tenants.contains_key(name) {
            let label = name.to_string();
            let counters = TenantCounters {
                events: metrics::counter!(metric::SAMPLING_EVENTS_TOTAL, "tenant" => label.clone()),
                sampled: metrics::counter!(metric::SAMPLES_TOTAL, "tenant" => label.clone()),
                dropped: metrics::counter!(metric::SAMPLES_DROPPED_TOTAL, "tenant" => label.clone()),
            };
            self.tenants.insert(label, counters);
        }
        &self.tenants[name]
    }

    /// Bounds the buckets: those full again go first; past the bound, any.
    fn forget_idle(&mut self, now: Instant) {
        if self.buckets.len() < MAX_BUCKETS {
            return;
        }
        let rate = self.settings.max_per_second;
        self.buckets.retain(|_, b| {
            let refilled = b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate;
            refilled < rate.max(1.0)
        });
        if self.buckets.len() >= MAX_BUCKETS {
            self.buckets.clear();
        }
    }
}

#[cfg(test)]
mod tests;
