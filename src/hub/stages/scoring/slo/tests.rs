//! The controller against a simulated model and simulated arrivals, in
//! simulated time (instants computed from a paused clock): 4 partitions,
//! each with its own [`Batcher`], closed batches coalesced into runs of at
//! most the chosen size as the hub does, 2 workers, a model whose run takes
//! a fixed time plus a time per event, and a fixed time outside the
//! batching (producer and broker before the hub, delivery after).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::hub::partition::batcher::Batcher;

const TARGET: Duration = Duration::from_millis(50);
const MAX_SIZE: usize = 256;
const MAX_DELAY: Duration = Duration::from_millis(20);
const WORKERS: usize = 2;
const PARTITIONS: usize = 4;

/// A model run's time: `fixed + per_event · n`.
#[derive(Clone, Copy)]
struct Model {
    fixed: Duration,
    per_event: Duration,
}

/// A large cost per run and a small one per event (like a transformer on a
/// GPU), where the batch size matters.
const GPU_LIKE: Model = Model {
    fixed: Duration::from_micros(4_000),
    per_event: Duration::from_micros(50),
};
/// The profanity model on this project's 2-core machine (its raw runs of
/// 32 and 128): the cost is mostly per event, a run of 2 still costs three
/// times as much per event as one of 128.
const LINEAR: Model = Model {
    fixed: Duration::from_micros(580),
    per_event: Duration::from_micros(105),
};
const BEFORE_HUB: Duration = Duration::from_millis(5);
const DELIVERY: Duration = Duration::from_millis(2);
const STEP: Duration = Duration::from_micros(100);

impl Model {
    fn run_time(&self, n: usize) -> Duration {
        self.fixed + self.per_event * n as u32
    }

    /// What the workers can do at their best (full runs of `MAX_SIZE`).
    fn capacity(&self) -> f64 {
        WORKERS as f64 * MAX_SIZE as f64 / self.run_time(MAX_SIZE).as_secs_f64()
    }
}

fn capacity() -> f64 {
    GPU_LIKE.capacity()
}

/// One simulated run: `phases` of (seconds, events per second).
struct Outcome {
    /// p99 end-to-end latency per second of arrival time.
    p99_by_second: Vec<Duration>,
    /// The chosen size at each tick: (seconds since start, size).
    sizes: Vec<(f64, usize)>,
    /// Events scored per second, by second of completion.
    done_by_second: Vec<u64>,
    missed_seen: bool,
    throughput_mode_seen: bool,
}

struct Rng(u64);

impl Rng {
    /// Exponential inter-arrival time for `rate` events per second.
    fn gap(&mut self, rate: f64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let u = (self.0 >> 11) as f64 / (1u64 << 53) as f64;
        Duration::from_secs_f64(-(1.0 - u).ln() / rate)
    }
}

fn simulate(phases: &[(u64, f64)]) -> Outcome {
    simulate_with(GPU_LIKE, phases, None, None)
}

/// Events waiting in the topic from second `at` on (a lag: produced while
/// modstream was away, all at that instant), read as fast as
/// `max_in_flight` lets them in, as the hub does (`limits.max_in_flight`).
#[derive(Clone, Copy)]
struct Backlog {
    at: u64,
    events: u64,
    max_in_flight: u64,
}

/// A simulated event: when it was produced, when it reached the hub.
type Event = (Instant, Instant);

/// `phases` of (seconds, events per second) arriving, and with `backlog`
/// that backlog besides; batched by the controller, or with `fixed` at that
/// size and deadline throughout (to compare with).
// Long: one loop over simulated time, as the hub's.
fn simulate_with(
    model: Model,
    phases: &[(u64, f64)],
    backlog: Option<Backlog>,
    fixed: Option<Choice>,
) -> Outcome {
    let start = Instant::now();
    let total: u64 = phases.iter().map(|p| p.0).sum();
    let end = start + Duration::from_secs(total);
    let rate_at = |t: Instant| {
        let mut s = (t - start).as_secs();
        for &(len, rate) in phases {
            if s < len {
                return rate;
            }
            s -= len;
        }
        0.0
    };
    let mut ctl = Controller::new(TARGET, MAX_SIZE, MAX_DELAY, WORKERS, start);
    let first = fixed.unwrap_or(ctl.choice());
    let mut batchers: Vec<Batcher<Event>> = (0..PARTITIONS)
        .map(|_| Batcher::new(first.size, first.delay))
        .collect();
    let mut ready: VecDeque<Vec<Event>> = VecDeque::new();
    // A busy worker: when its run ends, and the run.
    let mut workers: Vec<Option<(Instant, Vec<Event>)>> = vec![None; WORKERS];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut next_arrival = start + rng.gap(rate_at(start).max(1.0));
    let mut latencies: Vec<Vec<Duration>> = vec![Vec::new(); total as usize + 1];
    let mut done_by_second = vec![0u64; total as usize + 1];
    let mut out = Outcome {
        p99_by_second: vec![],
        sizes: vec![],
        done_by_second: vec![],
        missed_seen: false,
        throughput_mode_seen: false,
    };
    let mut turn = 0;
    let (mut read, mut in_flight) = (0u64, 0u64);
    let mut now = start;
    while now < end {
        loop {
            let lag = backlog.filter(|b| {
                now >= start + Duration::from_secs(b.at)
                    && read < b.events
                    && in_flight < b.max_in_flight
            });
            let (produced, at) = match lag {
                Some(b) => {
                    read += 1;
                    (start + Duration::from_secs(b.at), now)
                }
                None if next_arrival <= now => {
                    let at = next_arrival;
                    next_arrival = at + rng.gap(rate_at(at).max(1.0));
                    (at, at)
                }
                None => break,
            };
            in_flight += 1;
            turn = (turn + 1) % PARTITIONS;
            if let Some(batch) = batchers[turn].push((produced, at), 0, false, at).with {
                ready.push_back(batch.items);
            }
            ctl.arrived(1);
        }
        for b in &mut batchers {
            if let Some(batch) = b.close_expired(now) {
                ready.push_back(batch.items);
            }
        }
        for w in &mut workers {
            if let Some((finish, _)) = w
                && *finish <= now
                && let Some((finish, events)) = w.take()
            {
                let n = events.len() as u64;
                in_flight -= n;
                ctl.model_run(events.len(), model.run_time(events.len()));
                for (produced, arrived) in events {
                    let e2e = BEFORE_HUB + (finish - produced) + DELIVERY;
                    ctl.delivered(e2e, BEFORE_HUB + (arrived - produced), DELIVERY);
                    latencies[(arrived - start).as_secs() as usize].push(e2e);
                }
                done_by_second[(finish - start).as_secs() as usize] += n;
            }
        }
        let size = fixed.unwrap_or(ctl.choice()).size;
        for w in workers.iter_mut().filter(|w| w.is_none()) {
            let mut run = Vec::new();
            while let Some(next) = ready.front() {
                if !run.is_empty() && run.len() + next.len() > size {
                    break;
                }
                run.extend(ready.pop_front().unwrap_or_default());
            }
            if run.is_empty() {
                break;
            }
            *w = Some((now + model.run_time(run.len()), run));
        }
        if now >= ctl.next_tick() {
            let queue = Queue {
                waiting: ready.iter().map(Vec::len).sum(),
                partitions: PARTITIONS,
            };
            if let Some(choice) = ctl.tick(now, queue).filter(|_| fixed.is_none()) {
                for b in &mut batchers {
                    b.set_limits(choice.size, choice.delay);
                }
            }
            let status = ctl.status();
            if std::env::var_os("SLO_TRACE").is_some() {
                eprintln!(
                    "{:.2} {:?} size={} delay={:?} p99={:?} rate={:.0} corr={:.2} ready={}",
                    (now - start).as_secs_f64(),
                    status.mode,
                    status.choice.size,
                    status.choice.delay,
                    status.p99,
                    status.rate,
                    ctl.correction,
                    ready.len()
                );
            }
            out.sizes
                .push(((now - start).as_secs_f64(), status.choice.size));
            // The first second is spent measuring.
            if now - start >= Duration::from_secs(1) {
                out.missed_seen |= status.missed;
                out.throughput_mode_seen |= status.mode == Mode::Throughput;
            }
        }
        now += STEP;
    }
    out.p99_by_second = latencies
        .iter_mut()
        .take(total as usize)
        .map(|l| {
            let ms: Vec<f64> = l.iter().map(|d| d.as_secs_f64() * 1e3).collect();
            let p99 = crate::tools::stats::percentile(&ms, 0.99).unwrap_or_default();
            Duration::from_secs_f64(p99 / 1e3)
        })
        .collect();
    out.done_by_second = done_by_second;
    out
}

fn sizes_between(out: &Outcome, from: f64, to: f64) -> Vec<usize> {
    out.sizes
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .map(|(_, s)| *s)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn below_saturation_p99_stays_under_the_target_with_real_batches() {
    let rate = 0.5 * capacity();
    let out = simulate(&[(15, rate)]);
    // From the second second on (the first is spent measuring).
    for (s, p99) in out.p99_by_second.iter().enumerate().skip(1) {
        assert!(*p99 <= TARGET, "second {s}: p99 {p99:?} over {TARGET:?}");
    }
    let late = sizes_between(&out, 5.0, 15.0);
    assert!(
        late.iter().all(|s| *s >= 16),
        "at half load it batches (sizes {late:?})"
    );
    assert!(!out.throughput_mode_seen && !out.missed_seen);
}

#[tokio::test(start_paused = true)]
async fn a_step_in_load_grows_the_batches_and_keeps_the_target() {
    // 15 % of capacity, then ×4 for 10 s (60 %), then back.
    let low = 0.15 * capacity();
    let out = simulate(&[(10, low), (10, 4.0 * low), (10, low)]);
    for (s, p99) in out.p99_by_second.iter().enumerate().skip(1) {
        assert!(*p99 <= TARGET, "second {s}: p99 {p99:?} over {TARGET:?}");
    }
    let before = sizes_between(&out, 5.0, 10.0);
    let during = sizes_between(&out, 12.0, 20.0);
    let after = sizes_between(&out, 25.0, 30.0);
    let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
    let min = |v: &[usize]| v.iter().copied().min().unwrap_or(0);
    assert!(
        min(&during) > max(&before),
        "the step grows the batch size: before {before:?}, during {during:?}"
    );
    assert!(
        max(&after) < min(&during),
        "and it shrinks back: during {during:?}, after {after:?}"
    );
    // At the step it may take saturation for a moment (the larger sizes
    // were never measured before); the target is never missed.
    assert!(!out.missed_seen, "the target was held");
}

#[tokio::test(start_paused = true)]
async fn above_saturation_it_maximises_throughput_and_says_the_target_is_missed() {
    let out = simulate(&[(12, 1.5 * capacity())]);
    assert!(out.throughput_mode_seen && out.missed_seen);
    let late = sizes_between(&out, 4.0, 12.0);
    assert!(
        late.iter().all(|s| *s == MAX_SIZE),
        "the most efficient size is the largest here: {late:?}"
    );
    let scored: u64 = out.done_by_second[4..12].iter().sum();
    let per_s = scored as f64 / 8.0;
    assert!(
        per_s >= 0.95 * capacity(),
        "{per_s:.0}/s against a capacity of {:.0}/s",
        capacity()
    );
}

#[test]
fn model_cost_interpolates_and_never_guesses_an_unseen_size_cheap() {
    let mut cost = ModelCost::default();
    assert_eq!(cost.estimate(4), None);
    cost.observe(8, 0.002);
    assert_eq!(cost.estimate(1), Some(0.002), "below: the smallest seen");
    assert_eq!(cost.estimate(32), Some(0.008), "above: in proportion");
    cost.observe(64, 0.008);
    let mid = cost.estimate(36).unwrap();
    assert!((mid - 0.005).abs() < 1e-9, "between: linear ({mid})");
    // A noisy small run slower than a bigger one does not make the bigger cheaper.
    cost.observe(2, 0.010);
    assert!(cost.estimate(8).unwrap() >= 0.010);
}

#[test]
fn candidate_sizes_are_powers_of_two_and_the_maximum() {
    assert_eq!(
        candidate_sizes(100).collect::<Vec<_>>(),
        vec![1, 2, 4, 8, 16, 32, 64, 100]
    );
    assert_eq!(candidate_sizes(1).collect::<Vec<_>>(), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn a_backlog_is_cleared_at_full_speed_after_the_arrivals_stop() {
    // Light load first (the controller measures small runs), then 1.5 ×
    // capacity for 6 s leaves 3 s of work queued when the input
    // stops (as when modstream has read a topic's backlog to its end): the
    // arrival rate falls to nothing while the queue still holds seconds of
    // work, which is saturation, not a light load.
    for (name, model) in [("gpu-like", GPU_LIKE), ("linear", LINEAR)] {
        let cap = model.capacity();
        let out = simulate_with(
            model,
            &[(3, 0.3 * cap), (6, 1.5 * cap), (8, 0.0)],
            None,
            None,
        );
        let draining: u64 = out.done_by_second[10..12].iter().sum();
        let per_s = draining as f64 / 2.0;
        assert!(
            per_s >= 0.95 * model.capacity(),
            "{name}: the queue drained at {per_s:.0}/s against a capacity of {:.0}/s (sizes {:?})",
            model.capacity(),
            sizes_between(&out, 10.0, 12.0)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_backlog_read_as_fast_as_in_flight_allows_is_scored_as_fast_as_the_best_fixed_batching() {
    // The bench's saturation runs, or a consumer back after an outage:
    // light load, then the topic holds 6 s of work at once, and the hub
    // takes in a new event as each one leaves. The arrival rate is then
    // the throughput itself, whatever the batch size: only the queue
    // shows that the load is above what the model can do.
    for (name, model) in [("gpu-like", GPU_LIKE), ("linear", LINEAR)] {
        let cap = model.capacity();
        let backlog = Backlog {
            at: 3,
            events: (6.0 * cap) as u64,
            max_in_flight: 10_000,
        };
        // The backlog keeps the workers busy from second 3 to second 9 at best.
        let per_s = |fixed: Option<Choice>| {
            let out = simulate_with(model, &[(3, 0.2 * cap), (10, 0.0)], Some(backlog), fixed);
            let per_s = out.done_by_second[4..8].iter().sum::<u64>() as f64 / 4.0;
            (per_s, sizes_between(&out, 4.0, 8.0))
        };
        let best_fixed = [32, 128, MAX_SIZE]
            .into_iter()
            .flat_map(|size| [5, 20].map(|ms| (size, Duration::from_millis(ms))))
            .map(|(size, delay)| per_s(Some(Choice { size, delay })).0)
            .fold(0.0, f64::max);
        let (adaptive, sizes) = per_s(None);
        assert!(
            adaptive >= 0.95 * best_fixed,
            "{name}: {adaptive:.0}/s against {best_fixed:.0}/s at the best fixed size (sizes {sizes:?})"
        );
    }
}
