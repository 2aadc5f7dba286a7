//! The latency target (`batching.target_p99`): every [`TICK`] one controller
//! per model chooses its batch size and deadline from what it measures (the
//! model's time per run size, the arrival rate, the work waiting, and the
//! p99 of the latency outside batching), so that an event's wait for its
//! batch plus about two runs fits the target; when no choice can hold the
//! target at the incoming rate it batches for throughput instead and
//! reports the target missed. `batching.max_batch_size` and
//! `max_batch_delay` are the upper bounds; urgent events still close their
//! batch at once (the batcher does that).
//!
//! Its sizes are in the unit the hub counts for the model: events, or for
//! a token model with `batching.max_batch_tokens`, predicted tokens (the
//! choice is then the runs' token budget; see `hub::lanes::CostUnit`).
//!
//! Pure: time is passed in, so the tests drive it with a simulated model and
//! simulated arrivals.

use std::collections::VecDeque;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

/// How often the controller looks again.
pub const TICK: Duration = Duration::from_millis(100);
/// Latency percentiles are taken over the last this many ticks (1 s).
const WINDOW_TICKS: usize = 10;
/// Share of the budget that is planned for.
const HEADROOM: f64 = 0.8;
/// How busy the workers would be (share of time running the model) when
/// the controller calls it saturation, and when it no longer does.
const ENTER_BUSY: f64 = 0.9;
const LEAVE_BUSY: f64 = 0.75;
/// Fewer deliveries than this in the window give no p99 (a few slow
/// events at start-up are not a tail).
const MIN_SAMPLES: u64 = 20;
/// At saturation, a larger size is taken when its events per second of
/// model time are within this share of the best size's: each run also
/// costs dispatch, reordering and delivery that the model time leaves out,
/// and two sizes' means, measured at different moments on shared cores,
/// can differ by a tenth for the same work.
const LARGER_WITHIN: f64 = 0.15;
/// The correction learnt from the measured p99 (a factor on the planned
/// budget): shrunk by `CORRECTION_SHRINK` (not below `MIN_CORRECTION`)
/// while the p99 is over the target in latency mode, and grown back by
/// `CORRECTION_STEP` per tick (up to 1) while the p99 is below
/// `RELAX_BELOW` of the target: quick to back off, slow to trust again.
const CORRECTION_SHRINK: f64 = 0.8;
const MIN_CORRECTION: f64 = 0.3;
const CORRECTION_STEP: f64 = 0.05;
const RELAX_BELOW: f64 = 0.85;
/// The latency outside batching (before the hub and after the verdict)
/// takes more than this share of the planned target: the target is out of
/// reach whatever the batching, and reported so.
const OUT_OF_REACH_SHARE: f64 = 0.75;
/// The least share of the planned target kept for batching and the model,
/// even when the latency outside batching takes it all.
const MIN_BATCHING_SHARE: f64 = 0.25;
/// Saturation is left only once less than this share of the budget's work
/// waits (it is entered at the whole budget).
const LEAVE_QUEUED_SHARE: f64 = 0.25;
/// At saturation, a partition's batch closes at this share of the run size
/// (see `for_throughput`).
const THROUGHPUT_BATCH_SHARE: f64 = 0.125;
/// Weight of a new observation in the model-time means.
const ALPHA: f64 = 0.3;
/// Weight of the last tick's arrival rate in the rate's running mean when
/// it falls (a rise is taken at once).
const RATE_ALPHA: f64 = 0.3;

/// A batch size and deadline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub size: usize,
    pub delay: Duration,
}

/// What waits in the hub, at a tick.
#[derive(Debug, Clone, Copy, Default)]
pub struct Queue {
    /// Events in closed batches waiting for a worker of this model.
    pub waiting: usize,
    /// Partitions the batches are made in (those held).
    pub partitions: usize,
}

/// Whether the target can be held at the measured rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Below saturation: the largest runs that keep p99 under the target.
    Latency,
    /// At or above saturation: the most events per second.
    Throughput,
}

/// What the controller sees and decided, for metrics and logs.
#[derive(Debug, Clone, Copy)]
pub struct Status {
    pub choice: Choice,
    pub mode: Mode,
    /// End-to-end p99 over the last second, if any verdict was delivered.
    pub p99: Option<Duration>,
    /// Events per second arriving (running mean).
    pub rate: f64,
    /// The target is missed: the measured p99 is above it, at saturation or
    /// with the time outside batching alone taking most of the target.
    pub missed: bool,
    /// The p99 of the time before the hub received the records plus that
    /// of delivering verdicts: what batching cannot shorten.
    pub uncontrolled: Duration,
}

pub struct Controller {
    target: Duration,
    max_size: usize,
    max_delay: Duration,
    workers: usize,
    cost: ModelCost,
    arrivals: u64,
    rate: Option<f64>,
    last_tick: Instant,
    e2e: Window,
    outside: Window,
    delivery: Window,
    /// Learnt share of the budget (AIMD on the measured p99).
    correction: f64,
    status: Status,
}

impl Status {
    /// Why the target is missed, in words for the log.
    pub fn miss_cause(&self) -> &'static str {
        if self.mode == Mode::Latency {
            "the time before modstream receives the records (producer, broker, fetch) plus delivering the verdicts already takes the target"
        } else {
            "events arrive faster than the model can score them within the target"
        }
    }
}

impl Controller {
    pub fn new(
        target: Duration,
        max_size: usize,
        max_delay: Duration,
        workers: usize,
        now: Instant,
    ) -> Self {
        // Before any measurement: the largest batches (a backlog at start
        // clears fast) and a fifth of the target as the deadline.
        let choice = Choice {
            size: max_size.max(1),
            delay: max_delay.min(target / 5),
        };
        Controller {
            target,
            max_size: max_size.max(1),
            max_delay,
            workers: workers.max(1),
            cost: ModelCost::default(),
            arrivals: 0,
            rate: None,
            last_tick: now,
            e2e: Window::default(),
            outside: Window::default(),
            delivery: Window::default(),
            correction: 1.0,
            status: Status {
                choice,
                mode: Mode::Latency,
                p99: None,
                rate: 0.0,
                missed: false,
                uncontrolled: Duration::ZERO,
            },
        }
    }

    pub fn choice(&self) -> Choice {
        self.status.choice
    }

    pub fn status(&self) -> Status {
        self.status
    }

    pub fn next_tick(&self) -> Instant {
        self.last_tick + TICK
    }

    /// Events arrived for batching.
    pub fn arrived(&mut self, events: u64) {
        self.arrivals += events;
    }

    /// A model run of `size` events took `took`.
    pub fn model_run(&mut self, size: usize, took: Duration) {
        if size > 0 {
            self.cost.observe(size, took.as_secs_f64());
        }
    }

    /// A verdict was acknowledged: its end-to-end latency, the part before
    /// the hub received the record, and its delivery.
    pub fn delivered(&mut self, end_to_end: Duration, before_hub: Duration, delivery: Duration) {
        self.e2e.record(end_to_end);
        self.outside.record(before_hub);
        self.delivery.record(delivery);
    }

    /// Look again (call at [`Controller::next_tick`]); returns the new choice
    /// when it changed.
    pub fn tick(&mut self, now: Instant, queue: Queue) -> Option<Choice> {
        let elapsed = now.saturating_duration_since(self.last_tick).as_secs_f64();
        if elapsed <= 0.0 {
            return None;
        }
        self.last_tick = now;
        let instant_rate = self.arrivals as f64 / elapsed;
        self.arrivals = 0;
        let rate = match self.rate {
            Some(r) if instant_rate < r => r + RATE_ALPHA * (instant_rate - r),
            _ => instant_rate,
        };
        self.rate = Some(rate);

        let p99 = self.e2e.p99();
        let target = self.target.as_secs_f64();
        if let Some(p) = p99 {
            let p = p.as_secs_f64();
            if self.status.mode == Mode::Latency && p > target {
                self.correction = (self.correction * CORRECTION_SHRINK).max(MIN_CORRECTION);
            } else if p < RELAX_BELOW * target {
                self.correction = (self.correction + CORRECTION_STEP).min(1.0);
            }
        }
        let uncontrolled = self.outside.p99().unwrap_or_default().as_secs_f64()
            + self.delivery.p99().unwrap_or_default().as_secs_f64();
        // The budget for batching: the target less headroom and the learnt
        // correction, less what batching does not control. When that part
        // alone takes (nearly) the whole target, the target cannot be met
        // whatever the batching: keep some of it for batching and the model
        // rather than none, and say so.
        let planned = target * HEADROOM * self.correction;
        let out_of_reach = uncontrolled > target * HEADROOM * OUT_OF_REACH_SHARE;
        let budget = (planned - uncontrolled).max(planned * MIN_BATCHING_SHARE);

        // Saturation, with hysteresis: entered when the latency choice
        // would keep the workers busier than ENTER_BUSY, left below LEAVE_BUSY.
        let limit = match self.status.mode {
            Mode::Latency => ENTER_BUSY,
            Mode::Throughput => LEAVE_BUSY,
        };
        // Work already waiting for the workers: more than the budget's worth
        // is saturation whatever the arrival rate says (reading a backlog,
        // new events come in only as fast as verdicts leave, so the rate is
        // the throughput of the current choice, not the demand); it is left
        // only once less than LEAVE_QUEUED_SHARE of the budget's worth waits.
        let queued = self.queued_seconds(queue.waiting)
            > match self.status.mode {
                Mode::Latency => budget,
                Mode::Throughput => budget * LEAVE_QUEUED_SHARE,
            };
        let (choice, mode) = if self.cost.is_empty() {
            (self.status.choice, Mode::Latency)
        } else {
            match self.for_latency(rate, budget) {
                Some((choice, busy)) if busy <= limit && !queued => (choice, Mode::Latency),
                _ => (
                    self.for_throughput(rate, queue.partitions),
                    Mode::Throughput,
                ),
            }
        };
        let missed =
            (mode == Mode::Throughput || out_of_reach) && p99.is_some_and(|p| p > self.target);
        for w in [&mut self.e2e, &mut self.outside, &mut self.delivery] {
            w.rotate();
        }
        let changed = choice != self.status.choice;
        self.status = Status {
            choice,
            mode,
            p99,
            rate,
            missed,
            uncontrolled: Duration::from_secs_f64(uncontrolled.max(0.0)),
        };
        changed.then_some(choice)
    }

    /// Seconds the workers take to score `waiting` events in runs of the
    /// current size.
    fn queued_seconds(&self, waiting: usize) -> f64 {
        let size = self.status.choice.size;
        self.cost.estimate(size).map_or(0.0, |t| {
            waiting as f64 * t / (size as f64 * self.workers as f64)
        })
    }

    /// The size whose runs are largest while `d + 2·t(b)` fits the budget,
    /// with how busy it keeps the workers at `rate`; `None` when no size fits.
    fn for_latency(&self, rate: f64, budget: f64) -> Option<(Choice, f64)> {
        let mut best: Option<(f64, Choice, f64)> = None;
        for b in candidate_sizes(self.max_size) {
            let t = self.cost.estimate(b)?;
            let slack = budget - 2.0 * t;
            if slack < 0.0 {
                continue;
            }
            let delay = slack.min(self.max_delay.as_secs_f64());
            // The run the rate fills by the deadline (at least 1, at most b).
            let run = (rate * delay).clamp(1.0, b as f64);
            let run_time = self.cost.estimate(run.ceil() as usize)?;
            let busy = rate * run_time / (run * self.workers as f64);
            let choice = Choice {
                size: b,
                delay: Duration::from_secs_f64(delay),
            };
            // Largest runs; among equal runs, the shorter wait.
            let better = best.is_none_or(|(r, c, _)| {
                run > r + 1e-9 || (run >= r - 1e-9 && choice.delay < c.delay)
            });
            if better {
                best = Some((run, choice, busy));
            }
        }
        best.map(|(_, c, busy)| (c, busy))
    }

    /// The size with the most events per second of model time (the larger
    /// one within [`LARGER_WITHIN`]), and a deadline that closes a
    /// partition's batch at an eighth of that size at most (at the rate
    /// shared evenly among the partitions; at most the configured deadline).
    ///
    /// Why not the configured deadline: runs are made of whole batches, so
    /// batches that close at, say, three quarters of the size leave every
    /// run a quarter empty (reading a backlog, events enter as verdicts
    /// leave, a run's worth at a time, and the batches of all partitions
    /// grow together). Batches of an eighth fill the runs nearly full, and
    /// at saturation no event waits for its batch longer than the queue
    /// would keep it anyway.
    fn for_throughput(&self, rate: f64, partitions: usize) -> Choice {
        let mut best = (0.0, self.max_size);
        for b in candidate_sizes(self.max_size) {
            let Some(t) = self.cost.estimate(b) else {
                continue;
            };
            let per_s = b as f64 / t.max(1e-9);
            if per_s >= best.0 * (1.0 - LARGER_WITHIN) {
                best = (per_s.max(best.0), b);
            }
        }
        let size = best.1;
        let per_partition = rate / partitions.max(1) as f64;
        let fill = size as f64 * THROUGHPUT_BATCH_SHARE / per_partition.max(1e-9);
        Choice {
            size,
            delay: Duration::from_secs_f64(fill.min(self.max_delay.as_secs_f64())),
        }
    }
}

/// 1, 2, 4, … and the maximum itself.
fn candidate_sizes(max: usize) -> impl Iterator<Item = usize> {
    let powers =
        std::iter::successors(Some(1usize), |b| b.checked_mul(2)).take_while(move |b| *b < max);
    powers.chain(std::iter::once(max))
}

/// The model's time per run, by size.
#[derive(Debug, Default)]
struct ModelCost {
    /// Per power-of-two bucket of sizes: running means of size and seconds.
    buckets: Vec<Option<(f64, f64)>>,
}

impl ModelCost {
    fn is_empty(&self) -> bool {
        self.buckets.iter().all(Option::is_none)
    }

    fn observe(&mut self, size: usize, seconds: f64) {
        let k = bucket(size);
        if self.buckets.len() <= k {
            self.buckets.resize(k + 1, None);
        }
        let slot = &mut self.buckets[k];
        *slot = Some(match *slot {
            Some((s, t)) => (s + ALPHA * (size as f64 - s), t + ALPHA * (seconds - t)),
            None => (size as f64, seconds),
        });
    }

    /// Seconds for a run of `size`: interpolated between measured sizes,
    /// never less than a smaller size's (measurements are noisy), the
    /// smallest measured time below them, and in proportion to size above.
    fn estimate(&self, size: usize) -> Option<f64> {
        let mut points: Vec<(f64, f64)> = Vec::new();
        for &(s, t) in self.buckets.iter().flatten() {
            let floor = points.last().map_or(0.0, |p| p.1);
            points.push((s, t.max(floor)));
        }
        let size = size as f64;
        let first = *points.first()?;
        let last = *points.last()?;
        if size <= first.0 {
            return Some(first.1);
        }
        if size >= last.0 {
            return Some(last.1 * size / last.0);
        }
        let i = points.iter().position(|p| p.0 >= size)?;
        let (a, b) = (points[i - 1], points[i]);
        let f = (size - a.0) / (b.0 - a.0).max(1e-9);
        Some(a.1 + f * (b.1 - a.1))
    }
}

fn bucket(size: usize) -> usize {
    (usize::BITS - size.max(1).leading_zeros() - 1) as usize
}

/// 1 µs to an hour, 3 significant digits.
fn micros() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3)
        .unwrap_or_else(|_| unreachable!("the bounds are valid"))
}

/// Latencies of the last [`WINDOW_TICKS`] ticks, in microseconds.
#[derive(Default)]
struct Window {
    ticks: VecDeque<Histogram<u64>>,
}

impl Window {
    fn record(&mut self, d: Duration) {
        if self.ticks.is_empty() {
            self.rotate();
        }
        if let Some(h) = self.ticks.back_mut() {
            h.saturating_record(d.as_micros().min(u64::MAX as u128) as u64);
        }
    }

    fn rotate(&mut self) {
        if self.ticks.len() >= WINDOW_TICKS {
            self.ticks.pop_front();
        }
        self.ticks.push_back(micros());
    }

    fn p99(&self) -> Option<Duration> {
        let mut all = micros();
        for h in &self.ticks {
            all.add(h).ok()?;
        }
        (all.len() >= MIN_SAMPLES).then(|| Duration::from_micros(all.value_at_quantile(0.99)))
    }
}

#[cfg(test)]
mod tests;
