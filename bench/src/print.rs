//! The tables the bench prints as its runs go (stderr; bench.md and the
//! charts are drawn from the report afterwards).

use modstream::tools::report::{
    BaselineRow, CascadeRow, CostRow, DeliveryRow, FloodRow, FloorRow, FormatRow, LatencyRow,
    MatchRow, ModelRow, OverloadRow, OwnRun, RelayRun, RepeatRow, SamplingRow, SaturationRow,
    SessionRow, ShadowRow, StepTrace,
};

/// A row printed as one line (or a few) of the bench's running table.
pub trait Print {
    fn print(&self);
}

impl Print for SaturationRow {
    fn print(&self) {
        let opt =
            |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
        if let Some(t) = self.target_p99_ms {
            eprint!("adaptive, p99 target {t} ms, bounds: ");
        }
        let own = self.own_process.as_ref();
        eprintln!(
            "{:>6} {:>6}ms {:>11.0} {:>9.0} {:>6.2} {:>7.1} {:>8.1} {:>8.1} {:>8.1} {:>6} {:>10} {:>8} {:>8} {:>8} {:>7}",
            self.max_batch_size,
            self.max_batch_delay_ms,
            self.pipeline_per_s,
            self.raw_model_per_s,
            self.pipeline_over_raw,
            self.mean_batch_size,
            self.batch_wait_ms,
            self.inference_ms,
            self.produce_ms,
            opt(self.padding_efficiency, 2),
            opt(self.raw_unbucketed_per_s, 0),
            opt(own.map(|o| o.per_s), 0),
            opt(own.and_then(|o| o.cpu_us_per_verdict), 1),
            opt(self.raw_cpu_us_per_event, 1),
            opt(self.cpu_over_raw(), 2),
        );
    }
}

impl Print for ModelRow {
    fn print(&self) {
        eprintln!(
            "{}: {:.0}/s at saturation; at half of it p50 {:.1} ms, p99 {:.1} ms; {:.0} µs in model runs per verdict",
            self.contender,
            self.saturation_per_s,
            self.p50_ms,
            self.p99_ms,
            self.model_us_per_verdict
        );
    }
}

impl Print for FormatRow {
    fn print(&self) {
        eprintln!(
            "{:?}: {:.0}/s at saturation; at half of it p50 {:.1} ms, p99 {:.1} ms; decoding {:.1} µs/event ({:.1} % of an event's CPU at saturation)",
            self.format,
            self.saturation_per_s,
            self.p50_ms,
            self.p99_ms,
            self.decode_us,
            self.decode_share * 100.0
        );
    }
}

impl Print for DeliveryRow {
    fn print(&self) {
        eprintln!(
            "{} (commit_interval {} ms): {:.0}/s at saturation; at {:.0}/s p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.delivery,
            self.commit_interval_ms,
            self.saturation_per_s,
            self.offered_per_s,
            self.p50_ms,
            self.p99_ms,
            self.max_ms
        );
    }
}

impl Print for BaselineRow {
    fn print(&self) {
        eprintln!(
            "default config vs plain Python, {} events: modstream {:.0}/s, {} MiB peak; Python {:.0}/s, {} MiB peak ({:.2}×)",
            self.events,
            self.modstream_per_s,
            self.modstream_peak_rss_bytes >> 20,
            self.python_per_s,
            self.python_peak_rss_bytes >> 20,
            self.modstream_per_s / self.python_per_s
        );
        if let Some(one) = &self.python_one_thread {
            eprintln!(
                "  Python with onnxruntime on 1 intra-op thread: {:.0}/s, {} MiB peak ({:.2}×)",
                one.per_s,
                one.peak_rss_bytes >> 20,
                self.modstream_per_s / one.per_s
            );
        }
    }
}

impl Print for RelayRun {
    fn print(&self) {
        eprintln!(
            "the Kafka client's floor (kcat → kcat), {} events: {:.0}/s, {} µs CPU per record, peak RSS {} MiB",
            self.events,
            self.per_s,
            self.cpu_us_per_record
                .map_or("—".to_string(), |v| format!("{v:.2}")),
            self.peak_rss_bytes >> 20
        );
    }
}

impl Print for FloorRow {
    fn print(&self) {
        eprintln!(
            "broker floor (produce → consume, no modstream) at {:.0}/s: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} events)",
            self.offered_per_s, self.p50_ms, self.p99_ms, self.max_ms, self.events
        );
    }
}

impl Print for ShadowRow {
    fn print(&self) {
        eprintln!(
            "shadow model {}: live {:.0}/s without, {:.0}/s with ({:.2}×)",
            self.shadow_model,
            self.off_per_s,
            self.on_per_s,
            self.on_per_s / self.off_per_s
        );
    }
}

impl Print for RepeatRow {
    fn print(&self) {
        eprintln!(
            "repeated texts {:>3.0} %: cache off {:>7.0}/s, on {:>7.0}/s ({:.2}×)",
            self.repeat_share * 100.0,
            self.cache_off_per_s,
            self.cache_on_per_s,
            self.cache_on_per_s / self.cache_off_per_s
        );
    }
}

pub fn print_saturation_header() {
    eprintln!(
        "{:>6} {:>8} {:>11} {:>9} {:>6} {:>7} {:>8} {:>8} {:>8} {:>6} {:>10} {:>8} {:>8} {:>8} {:>7}",
        "batch",
        "delay",
        "pipeline/s",
        "raw/s",
        "ratio",
        "mean n",
        "wait ms",
        "model ms",
        "prod ms",
        "pad eff",
        "unbucketed",
        "own/s",
        "cpu µs/v",
        "raw µs/e",
        "cpu÷raw"
    );
}

pub fn print_latency_header() {
    eprintln!(
        "{:>6} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "batch", "delay", "load", "offered/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"
    );
}

impl Print for LatencyRow {
    fn print(&self) {
        if let Some(t) = self.target_p99_ms {
            eprint!("adaptive, p99 target {t} ms: ");
        }
        eprintln!(
            "{:>6} {:>6}ms {:>6.0}% {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1}   urgent {:.1} / {:.1}",
            self.max_batch_size,
            self.max_batch_delay_ms,
            self.offered_fraction * 100.0,
            self.offered_per_s,
            self.p50_ms,
            self.p99_ms,
            self.p999_ms,
            self.max_ms,
            self.urgent_p50_ms,
            self.urgent_p99_ms
        );
    }
}

impl Print for OverloadRow {
    fn print(&self) {
        eprintln!(
            "overload: {} events offered at {:.0}× saturation ({:.0}/s for {:.1}s): peak RSS {} MiB (at 25 %: {} MiB; bound {} MiB)",
            self.events,
            self.offered_multiple,
            self.offered_per_s,
            self.seconds,
            self.peak_rss_bytes >> 20,
            self.light_load_peak_rss_bytes >> 20,
            self.bound_bytes
                .map_or("-".to_string(), |b| (b >> 20).to_string())
        );
    }
}

impl Print for StepTrace {
    fn print(&self) {
        eprintln!(
            "step load: {:.0}/s → ×{} → back, {} s each; p99 by half second (ms): {}",
            self.base_per_s,
            self.factor,
            self.phase_seconds,
            self.bins
                .iter()
                .map(|b| format!("{:.0}", b.p99_ms))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}

impl Print for CascadeRow {
    fn print(&self) {
        let band = self
            .band
            .map_or("transformer on every event".to_string(), |[f, t]| {
                format!("band {f}-{t}")
            });
        eprintln!(
            "cascade, {} stream, {band}: {:.1} % to the transformer, {:.0} verdicts/s ({:.2}×), agreement {:.2} %",
            self.stream,
            self.transformer_share * 100.0,
            self.saturation_per_s,
            self.over_every_event,
            self.agreement * 100.0
        );
    }
}

impl Print for CostRow {
    fn print(&self) {
        eprintln!(
            "cost, {}: raw {} ; modstream default {:.0}/s, {} CPU-s per million ({:.1} % Kafka client), {} MiB peak; p99 target {:.0}/s; p99 at half {:.1} ms; Python {}",
            self.contender,
            self.raw_per_s
                .map_or("—".to_string(), |r| format!("{r:.0}/s")),
            self.default_per_s,
            self.cpu_s_per_million
                .map_or("—".to_string(), |v| format!("{v:.0}")),
            self.kafka_cpu_share * 100.0,
            self.peak_rss_bytes >> 20,
            self.target_per_s,
            self.p99_at_half_ms,
            self.python_per_s.map_or("—".to_string(), |p| format!(
                "{p:.0}/s, {:.0} CPU-s per million, {} MiB peak",
                self.python_cpu_s_per_million.unwrap_or_default(),
                self.python_peak_rss_bytes.unwrap_or_default() >> 20
            )),
        );
    }
}

impl Print for SessionRow {
    fn print(&self) {
        eprintln!(
            "session, {}: {:.0}/s, {} CPU-s per million, {} MiB peak; load {:.0} ms; light load {:.2} cores",
            self.contender,
            self.per_s,
            self.cpu_s_per_million
                .map_or("—".to_string(), |v| format!("{v:.0}")),
            self.peak_rss_bytes >> 20,
            self.load_ms,
            self.light_load_cores
        );
    }
}

impl Print for OwnRun {
    fn print(&self) {
        let config = match &self.tracing {
            Some(t) => format!("tracing at {} %", t.sampling_ratio * 100.0),
            None if self.state.is_some() => "state rules".into(),
            None => "default config".into(),
        };
        eprintln!(
            "modstream run ({config}), {} events: {:.0}/s, {} µs CPU per verdict ({:.0} % in the Kafka client's threads), peak RSS {} MiB",
            self.events,
            self.per_s,
            self.cpu_us_per_verdict
                .map_or("—".to_string(), |v| format!("{v:.1}")),
            self.kafka_cpu_share * 100.0,
            self.peak_rss_bytes >> 20
        );
    }
}

impl Print for SamplingRow {
    fn print(&self) {
        eprintln!(
            "sampling: off {:>7.0}/s, on {:>7.0}/s ({:.3}×), {:.2} % of verdicts sampled; sampler {:.0} ns/verdict",
            self.off_per_s,
            self.on_per_s,
            self.on_per_s / self.off_per_s,
            self.sampled_share * 100.0,
            self.draw_ns
        );
    }
}

impl Print for modstream::tools::report::MatcherCurveRow {
    fn print(&self) {
        eprintln!(
            "matcher holding {} {}: built in {:.2} s, {:.1} MiB held, peak RSS +{:.0} MiB; {:.2} µs/post over {} posts, {:.0} % matched",
            self.at,
            self.held.unit(),
            self.build_s,
            self.bytes as f64 / 1048576.0,
            self.rss_rise_bytes as f64 / 1048576.0,
            self.matcher_us,
            self.events,
            self.matched_share * 100.0
        );
    }
}

impl Print for FloodRow {
    fn print(&self) {
        eprintln!(
            "matcher under a flood of {} ({}): {:.1} µs/event; {} clusters, {:.1} of {:.0} MiB; {} evicted, {} candidates cut; peak RSS +{:.0} MiB",
            self.events,
            self.flood,
            self.matcher_us,
            self.clusters,
            self.bytes as f64 / 1048576.0,
            self.max_bytes as f64 / 1048576.0,
            self.evicted,
            self.candidates_cut,
            self.rss_rise_bytes as f64 / 1048576.0
        );
    }
}

impl Print for MatchRow {
    fn print(&self) {
        eprintln!(
            "near-duplicates {:>3.0} %: matching off {:>7.0}/s, lists {:>7.0}/s ({:.2}×), lists + waves + reuse {:>7.0}/s ({:.2}×, {:.0} % reused); matcher {:.1} µs/event (lists), {:.1} (with waves)",
            self.near_duplicate_share * 100.0,
            self.off_per_s,
            self.lists_per_s,
            self.lists_per_s / self.off_per_s,
            self.reuse_per_s,
            self.reuse_per_s / self.off_per_s,
            self.reused_share * 100.0,
            self.lists_matcher_us,
            self.waves_matcher_us
        );
    }
}
