//! The runs beside the grid: the score cache against repeated texts, memory
//! under overload, a shadow model's cost, at-least-once against
//! exactly-once, and the adaptive cell under a step in load.

use modstream::tools::generator::{Mix, generate, generate_mix};

use super::measure::{self, Batching, Clock};
use super::print::Print;
use super::{
    BenchOptions, ChoicePoint, DeliveryRow, OverloadRow, RepeatRow, SaturationRow, ShadowRow,
    StepBin, StepTrace,
};

/// The score cache off and on at each share of repeated texts.
pub(super) async fn repeat_sweep(opts: &BenchOptions) -> anyhow::Result<Vec<RepeatRow>> {
    let mut repeats = Vec::new();
    for &share in &opts.repeat_shares {
        let mix = Mix {
            malformed_every: 0,
            repeat_share: Some(share),
            ..Default::default()
        };
        let events = generate_mix(opts.events, &mix, "r-");
        let cell = Batching::fixed(64, 20);
        let off = measure::saturation_of(opts, cell, events.clone())
            .await?
            .per_s;
        let on_opts = BenchOptions {
            cache_bytes: opts.repeat_cache_bytes,
            ..opts.clone()
        };
        let on = measure::saturation_of(&on_opts, cell, events).await?.per_s;
        let row = RepeatRow {
            repeat_share: share,
            cache_bytes: opts.repeat_cache_bytes,
            cache_off_per_s: off,
            cache_on_per_s: on,
        };
        row.print();
        repeats.push(row);
    }
    Ok(repeats)
}

/// A separate `modstream run` offered `opts.overload` × the largest batch
/// size's saturation, and at 25 %: peak RSS of each.
pub(super) async fn overload_row(
    opts: &BenchOptions,
    saturation: &[SaturationRow],
) -> anyhow::Result<Option<OverloadRow>> {
    let last = *opts.batch_sizes.last().unwrap_or(&1);
    let Some(sat) = saturation.iter().find(|r| r.max_batch_size == last) else {
        return Ok(None);
    };
    if opts.overload <= 0.0 {
        return Ok(None);
    }
    let b = Batching::fixed(sat.max_batch_size, sat.max_batch_delay_ms);
    let seconds = 3;
    let (_, light) =
        measure::peak_rss_under_load(opts, b, sat.pipeline_per_s * 0.25, seconds).await?;
    let rate = sat.pipeline_per_s * opts.overload;
    let (events, peak) = measure::peak_rss_under_load(opts, b, rate, seconds).await?;
    let row = OverloadRow {
        offered_multiple: opts.overload,
        offered_per_s: rate,
        seconds: events as f64 / rate,
        events,
        peak_rss_bytes: peak,
        light_load_peak_rss_bytes: light,
        bound_bytes: Some(
            light
                + modstream::config::Limits::default().max_in_flight_bytes as u64
                + measure::RSS_HEADROOM_BYTES,
        ),
    };
    row.print();
    Ok(Some(row))
}

/// The default cell at saturation without and with the shadow model.
pub(super) async fn shadow_row(opts: &BenchOptions) -> anyhow::Result<Option<ShadowRow>> {
    let Some(dir) = &opts.shadow_model else {
        return Ok(None);
    };
    let cell = Batching::fixed(64, 20);
    let off_opts = BenchOptions {
        shadow_model: None,
        ..opts.clone()
    };
    let off = measure::saturation(&off_opts, cell).await?.per_s;
    let on = measure::saturation(opts, cell).await?.per_s;
    let row = ShadowRow {
        shadow_model: dir.display().to_string(),
        off_per_s: off,
        on_per_s: on,
    };
    row.print();
    Ok(Some(row))
}

/// At-least-once, then exactly-once at each transaction interval, the same
/// way: saturation on the same events (from the first verdict produced to
/// the last: start-up, the group join and the last commit are not
/// throughput), then paced at half the
/// at-least-once saturation (latency to the `read_committed` reader).
pub(super) async fn delivery_rows(opts: &BenchOptions) -> anyhow::Result<Vec<DeliveryRow>> {
    if opts.delivery_intervals_ms.is_empty() {
        return Ok(Vec::new());
    }
    anyhow::ensure!(
        opts.bootstrap.is_some(),
        "--delivery-intervals-ms needs --bootstrap (Apache Kafka)"
    );
    let cell = Batching::fixed(64, 20);
    let contenders = std::iter::once((false, None))
        .chain(opts.delivery_intervals_ms.iter().map(|&i| (true, Some(i))));
    let mut rows: Vec<DeliveryRow> = Vec::new();
    for (exactly_once, interval) in contenders {
        let mut o = opts.clone();
        o.variant.exactly_once = exactly_once;
        o.variant.commit_interval_ms = interval;
        let measure::Saturated { per_s, summary, .. } =
            measure::saturation_clocked(&o, cell, generate(opts.events, 0, "d-"), Clock::Verdicts)
                .await?;
        let rate = rows.first().map_or(per_s, |alo| alo.saturation_per_s) * 0.5;
        let latency = measure::latency(&o, cell, 0.5, rate).await?;
        let row = DeliveryRow {
            delivery: if exactly_once {
                "exactly_once"
            } else {
                "at_least_once"
            }
            .to_string(),
            commit_interval_ms: interval.unwrap_or(1000),
            saturation_per_s: per_s,
            rewinds: summary.rewinds,
            offered_per_s: rate,
            p50_ms: latency.p50_ms,
            p99_ms: latency.p99_ms,
            max_ms: latency.max_ms,
        };
        row.print();
        rows.push(row);
    }
    Ok(rows)
}

/// The adaptive cell under paced load at `base`/s for `opts.step_seconds`,
/// then `factor` × `base`, then `base` again; p99 by half second of intended
/// send time and the batch choices over the same clock.
pub(super) async fn step_trace(
    opts: &BenchOptions,
    b: Batching,
    base: f64,
    factor: f64,
) -> anyhow::Result<StepTrace> {
    let phase = opts.step_seconds as f64;
    let phases = [(phase, base), (phase, base * factor), (phase, base)];
    let run = measure::paced_run(opts, b, &phases).await?;
    const BIN: f64 = 0.5;
    let bins_n = (3.0 * phase / BIN).ceil() as usize;
    let mut bins: Vec<Vec<u64>> = vec![Vec::new(); bins_n];
    for &measure::Sample { intended, read, .. } in &run.samples {
        let t = intended.saturating_duration_since(run.start).as_secs_f64();
        if let Some(bin) = bins.get_mut((t / BIN) as usize) {
            bin.push(read.saturating_duration_since(intended).as_micros() as u64);
        }
    }
    let bins = bins
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let ms: Vec<f64> = l.iter().map(|&us| us as f64 / 1000.0).collect();
            let p99 = modstream::tools::stats::percentile(&ms, 0.99).unwrap_or(0.0);
            let t_s = i as f64 * BIN;
            StepBin {
                t_s,
                offered_per_s: if (phase..2.0 * phase).contains(&t_s) {
                    base * factor
                } else {
                    base
                },
                events: l.len(),
                p99_ms: p99,
            }
        })
        .collect();
    // The choice in force at the clock's start, then each change after it.
    let since = |at: std::time::Instant| {
        at.saturating_duration_since(run.start).as_secs_f64()
            - run.start.saturating_duration_since(at).as_secs_f64()
    };
    let mut choices: Vec<ChoicePoint> = Vec::new();
    for (at, c) in &run.summary.batch_choices {
        let point = ChoicePoint {
            t_s: since(*at).max(0.0),
            size: c.size,
            delay_ms: c.delay.as_secs_f64() * 1000.0,
        };
        match choices.last_mut() {
            Some(last) if point.t_s <= 0.0 => *last = point,
            _ => choices.push(point),
        }
    }
    Ok(StepTrace {
        target_p99_ms: b.target_p99_ms.unwrap_or_default(),
        base_per_s: base,
        factor,
        phase_seconds: phase,
        bins,
        choices,
    })
}
