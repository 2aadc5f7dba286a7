//! Estimates from a probability sample, each label weighted by the inverse
//! of its sample's inclusion probability.
//!
//! Every figure is a ratio of two weighted sums over the labelled samples,
//! `R = Σ w·a / Σ w·b` with `w = 1/π` (the Hájek estimator, which needs no
//! count of the whole stream): prevalence (`a`: has the label, `b`: any
//! sample), recall (`a`: flagged and has it, `b`: has it), precision (`a`:
//! flagged and has it, `b`: flagged). Its variance under Poisson sampling,
//! linearised: `v = Σ (1 − π)·w²·(a − R·b)² / (Σ w·b)²`. The 95 % interval
//! is Wilson's score interval at the effective sample size `R(1 − R)/v`
//! (Korn and Graubard), which stays inside 0..1 and does not collapse to a
//! point when a label is rare. The effective size is never taken above the
//! number of samples: sampling by risk can make the design's larger, and
//! in a small group that made intervals falsely narrow (4 samples weighing
//! as 47). Coverage is held by simulation in `src/sampling/tests.rs`, on a
//! whole stream and in small groups. Adjusting the size for the variance's
//! degrees of freedom (Satterthwaite, t) made recall's interval useless
//! where one missed violation was sampled ([0.24, 1.00] around 0.98 in the
//! end-to-end test), so it is not done.

/// The 0.975 quantile of the normal distribution.
pub const Z95: f64 = 1.959_963_984_540_054;

/// One labelled sample as an estimator sees it.
#[derive(Debug, Clone, Copy)]
pub struct Unit {
    /// Its inclusion probability, above 0.
    pub probability: f64,
    /// It counts in the ratio's numerator (implies `denominator`).
    pub numerator: bool,
    pub denominator: bool,
}

/// A ratio with its 95 % interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub low: f64,
    pub high: f64,
    /// Samples in the denominator.
    pub samples: usize,
    /// The effective sample size the interval was computed at.
    pub effective: f64,
}

impl Estimate {
    pub fn width(&self) -> f64 {
        self.high - self.low
    }

    pub fn covers(&self, x: f64) -> bool {
        self.low <= x && x <= self.high
    }
}

/// The weighted ratio of the units; None when no unit is in its denominator.
pub fn ratio(units: impl IntoIterator<Item = Unit>) -> Option<Estimate> {
    let units: Vec<Unit> = units.into_iter().filter(|u| u.denominator).collect();
    if units.is_empty() {
        return None;
    }
    let weight = |u: &Unit| 1.0 / u.probability;
    let total: f64 = units.iter().map(weight).sum();
    let hits: f64 = units.iter().filter(|u| u.numerator).map(weight).sum();
    let r = hits / total;
    let variance: f64 = units
        .iter()
        .map(|u| {
            let w = weight(u);
            let residual = f64::from(u8::from(u.numerator)) - r;
            (1.0 - u.probability) * w * w * residual * residual
        })
        .sum::<f64>()
        / (total * total);
    // The design's effective size; Kish's where the ratio is 0 or 1 and
    // there is no variance to read it from. Never above the samples
    // themselves (4 samples cannot weigh as 47), though sampling by risk
    // can make the design's larger where rare positives are drawn often.
    let kish = total * total / units.iter().map(|u| weight(u).powi(2)).sum::<f64>();
    let effective = if variance > 0.0 && r > 0.0 && r < 1.0 {
        r * (1.0 - r) / variance
    } else {
        kish
    }
    .min(units.len() as f64);
    let (low, high) = wilson(r, effective, Z95);
    Some(Estimate {
        value: r,
        low,
        high,
        samples: units.len(),
        effective,
    })
}

/// Wilson's score interval for a share `p` of `n` trials.
pub fn wilson(p: f64, n: f64, z: f64) -> (f64, f64) {
    if n <= 0.0 {
        return (0.0, 1.0);
    }
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}
