//! The cascade sweep (`--cascade DIR`): the configured model first and the
//! transformer DIR only where the first one's `offensive` score is in a
//! band, one run per band of `--cascade-bands`, against DIR judging every
//! event alone, on two streams: the bench's own and one where half the
//! posts mix a clean post with an abusive phrase (borderline for a
//! bag-of-words model). Each run is at saturation on the default cell
//! (64 / 20 ms), `--workers` workers per model; the reference runs before
//! the bands and after them, and counts at the faster of the two. Agreement is read from the
//! verdicts the pipeline wrote: the share of events whose verdict is the
//! one DIR on every event gave.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::BenchOptions;
use super::formats::{Encoding, ModelSetup};
use super::measure::{self, Batching, Clock};
use crate::print::Print;
use modstream::tools::generator::{GeneratedEvent, generate, post_text};
use modstream::tools::report::CascadeRow;

/// A score band `FROM-TO` (`0.3-0.7`) of the first model's label.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Band {
    pub from: f32,
    pub to: f32,
}

impl Band {
    /// The policy's default band.
    pub const DEFAULT: Band = Band {
        from: modstream::policy::DEFAULT_BAND[0],
        to: modstream::policy::DEFAULT_BAND[1],
    };
}

impl std::fmt::Display for Band {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.from, self.to)
    }
}

impl std::str::FromStr for Band {
    type Err = String;

    fn from_str(s: &str) -> Result<Band, String> {
        let (from, to) = s
            .split_once('-')
            .ok_or_else(|| format!("{s:?}: write a band as FROM-TO, e.g. 0.3-0.7"))?;
        let number = |x: &str| {
            x.trim()
                .parse::<f32>()
                .map_err(|e| format!("{s:?}: {x:?} is not a number: {e}"))
        };
        let band = Band {
            from: number(from)?,
            to: number(to)?,
        };
        if !(0.0..=1.0).contains(&band.from) || !(band.from..=1.0).contains(&band.to) {
            return Err(format!("{s:?}: a band is 0 <= FROM <= TO <= 1"));
        }
        Ok(band)
    }
}

/// The streams of the sweep.
const STREAMS: [&str; 2] = ["bench", "borderline"];

/// The stream's events: the bench's skewed posts, or the same with every
/// other post a clean one followed by the first words of an abusive one.
fn stream(name: &str, count: usize) -> Vec<GeneratedEvent> {
    let mut events = generate(count, 0, "c-");
    if name == "borderline" {
        for (i, e) in events.iter_mut().enumerate().filter(|(i, _)| i % 2 == 1) {
            let abusive = post_text(i, true);
            let phrase: Vec<&str> = abusive.split_whitespace().take(3).collect();
            let text = format!("{} {}", post_text(i, false), phrase.join(" "));
            if let Ok(Value::Object(mut o)) = serde_json::from_slice(&e.payload) {
                o.insert("text".into(), text.clone().into());
                e.payload = Value::Object(o).to_string().into_bytes();
                e.text = Some(text);
            }
        }
    }
    events
}

const THRESHOLDS: &str = "{ review_at = 0.5, block_at = 0.85 }";

/// The policy: `second` alone on every event (no band), or `first` with
/// `second` where `first` is unsure.
fn policy(band: Option<Band>) -> String {
    let second = format!("models.second.offensive = {THRESHOLDS}\n");
    match band {
        None => format!("version = \"bench\"\n[[rules]]\nid = \"transformer\"\n{second}"),
        Some(b) => format!(
            "version = \"bench\"\n[[rules]]\nid = \"cascade\"\nmodels.first.offensive = {THRESHOLDS}\n{second}\
             cascade.second = {{ after = \"first\", label = \"offensive\", band = [{}, {}] }}\n",
            b.from, b.to
        ),
    }
}

/// The two models and a policy over them, written under `dir`.
pub(super) fn setup(
    opts: &BenchOptions,
    transformer: &Path,
    band: Option<Band>,
    dir: &Path,
) -> anyhow::Result<Encoding> {
    let first = measure::inference_settings(opts).model_dir;
    let model = |name: &str, dir: &Path| super::models::lane(opts, name, dir);
    let name = band.map_or("every".to_string(), |b| format!("{}-{}", b.from, b.to));
    let path = dir.join(format!("cascade-{name}.toml"));
    std::fs::write(&path, policy(band))?;
    Ok(Encoding::with_models(ModelSetup {
        models: vec![model("first", &first), model("second", transformer)],
        policy: path,
        tenant_every: 0,
    }))
}

/// What one run's verdicts said: the verdict by event id, and how many
/// events the transformer scored.
#[derive(Default)]
struct Seen {
    verdicts: HashMap<String, String>,
    by_transformer: usize,
    /// Wall time in model runs (every model's, summed) per verdict.
    model_us_per_verdict: f64,
}

async fn run_one(
    opts: &BenchOptions,
    events: Vec<GeneratedEvent>,
    encoding: Encoding,
) -> anyhow::Result<(f64, Seen)> {
    let o = opts.with_encoding(encoding);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let into = seen.clone();
    let measure::Saturated { per_s, summary, .. } = measure::saturation_read(
        &o,
        Batching::fixed(64, 20),
        events,
        Clock::Verdicts,
        move |v| {
            let mut s = into.lock().unwrap_or_else(|e| e.into_inner());
            let models = v["reason"]["models"].as_array();
            if models.is_some_and(|m| m.iter().any(|m| m["id"] == "second")) {
                s.by_transformer += 1;
            }
            let id = v["event_id"].as_str().unwrap_or_default().to_string();
            s.verdicts
                .insert(id, v["verdict"].as_str().unwrap_or_default().to_string());
        },
    )
    .await?;
    anyhow::ensure!(summary.dlq == 0, "{} dead letters", summary.dlq);
    let mut seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    seen.model_us_per_verdict = summary.inference_seconds * 1e6 / summary.verdicts.max(1) as f64;
    Ok((per_s, seen))
}

pub async fn rows(opts: &BenchOptions) -> anyhow::Result<Vec<CascadeRow>> {
    let Some(transformer) = opts
        .cascade
        .as_ref()
        .filter(|_| !opts.cascade_bands.is_empty())
    else {
        return Ok(Vec::new());
    };
    std::fs::create_dir_all(&opts.out_dir)?;
    let mut rows = Vec::new();
    for name in STREAMS {
        let events = stream(name, opts.events);
        let every = setup(opts, transformer, None, &opts.out_dir)?;
        let (first_per_s, reference) = run_one(opts, events.clone(), every.clone()).await?;
        let mut bands = Vec::new();
        for band in &opts.cascade_bands {
            let encoding = setup(opts, transformer, Some(*band), &opts.out_dir)?;
            bands.push((*band, run_one(opts, events.clone(), encoding).await?));
        }
        // The reference again after the bands: its row has the faster of the
        // two runs, and the second run's agreement with the first.
        let (again_per_s, again) = run_one(opts, events.clone(), every).await?;
        let every_per_s = first_per_s.max(again_per_s);
        let n = events.len();
        let mut row = |band: Option<Band>, per_s: f64, seen: &Seen| {
            let agree = seen
                .verdicts
                .iter()
                .filter(|(id, v)| reference.verdicts.get(*id) == Some(v))
                .count();
            let row = CascadeRow {
                stream: name.to_string(),
                band: band.map(|b| [b.from, b.to]),
                transformer_share: seen.by_transformer as f64 / n as f64,
                saturation_per_s: per_s,
                over_every_event: per_s / every_per_s,
                agreement: agree as f64 / n as f64,
                model_us_per_verdict: Some(seen.model_us_per_verdict),
            };
            row.print();
            rows.push(row);
        };
        row(None, every_per_s, &again);
        for (band, (per_s, seen)) in &bands {
            row(Some(*band), *per_s, seen);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_parse_and_wrong_ones_say_why() {
        assert_eq!("0.3-0.7".parse::<Band>(), Ok(Band { from: 0.3, to: 0.7 }));
        assert!(
            "0.7-0.3"
                .parse::<Band>()
                .unwrap_err()
                .contains("FROM <= TO")
        );
        assert!("0.3".parse::<Band>().unwrap_err().contains("FROM-TO"));
        assert!("a-1".parse::<Band>().unwrap_err().contains("not a number"));
    }

    #[test]
    fn the_borderline_stream_mixes_every_other_post() {
        let bench = stream("bench", 10);
        let borderline = stream("borderline", 10);
        assert_eq!(bench[0].text, borderline[0].text);
        for i in [1, 3, 9] {
            let (plain, mixed) = (
                bench[i].text.clone().unwrap(),
                borderline[i].text.clone().unwrap(),
            );
            assert!(mixed.len() > plain.len(), "{mixed}");
            let v: Value = serde_json::from_slice(&borderline[i].payload).unwrap();
            assert_eq!(v["text"], mixed);
        }
    }
}
