//! Medians and percentiles of small samples (a bench's repeats, the
//! latencies of one second), one convention everywhere: the median of an
//! even count is the mean of its middle two; a percentile is the nearest
//! rank (the smallest value with at least that share of the sample at or
//! below it). An empty sample has neither. Large streams of latencies use
//! an HDR histogram instead (`hdrhistogram`).

/// The median, or `None` for an empty sample.
pub fn median(values: &[f64]) -> Option<f64> {
    let sorted = sorted(values);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// The `q` quantile (0 < q ≤ 1) by nearest rank, or `None` for an empty
/// sample.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    let sorted = sorted(values);
    let n = sorted.len();
    let rank = (q * n as f64).ceil() as usize;
    sorted.get(rank.clamp(1, n.max(1)) - 1).copied()
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_odd_and_even_counts_and_of_none() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[0.9, 0.7, 1.0]), Some(0.9));
        assert_eq!(median(&[1.0, 0.5, 0.25, 0.75]), Some(0.625));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let hundred: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&hundred, 0.99), Some(99.0));
        assert_eq!(percentile(&hundred, 0.5), Some(50.0));
        assert_eq!(percentile(&hundred, 1.0), Some(100.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.99), None);
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&ten, 0.99), Some(10.0));
    }
}
