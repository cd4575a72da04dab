//! The time-per-token axis of the capacity summary: fixed log-spaced bins, and the median of a
//! histogram over them.
//!
//! Fixed bins (rather than a reservoir or a sketch) keep a histogram's size constant, make two
//! histograms addable (the sliding window sums its slots), and make the median deterministic.
//! Log spacing gives the same relative resolution everywhere: a 5 ms step on a small model and a
//! 200 ms step on a large one are read to the same few percent.

/// The smallest time per token told apart: 0.2 ms, 5,000 tokens/s for one stream, faster than
/// any decode step published today. Smaller values count in the first bin.
pub const MIN_SECONDS: f64 = 2e-4;

/// Bins per decade: neighbouring edges are 10^(1/40) = 5.9% apart, so a median interpolated
/// inside its bin is off by at most 2.9% even when every sample fell in one bin, and far less
/// when real jitter spreads them.
const PER_DECADE: usize = 40;

/// Five decades, 0.2 ms to 20 s per token: a stall of 20 s or more counts in the last bin (it
/// still counts, which is what keeps the median honest; its exact length does not matter).
pub const BINS: usize = 5 * PER_DECADE;

/// The bin a time per token falls in; out-of-range values are clamped to the first or last bin.
/// `None` for a value that is no time at all (NaN, negative, infinite).
pub fn index(seconds: f64) -> Option<usize> {
    if !seconds.is_finite() || seconds < 0.0 {
        return None;
    }
    if seconds <= MIN_SECONDS {
        return Some(0);
    }
    let i = ((seconds / MIN_SECONDS).log10() * PER_DECADE as f64).floor();
    Some((i as usize).min(BINS - 1))
}

/// The lower edge of bin `i` in seconds (bin `BINS` is the upper edge of the last).
pub fn lower_edge(i: usize) -> f64 {
    MIN_SECONDS * 10f64.powf(i as f64 / PER_DECADE as f64)
}

/// The median of a histogram over these bins, interpolated geometrically inside the bin that
/// holds it (the bins are log-spaced, so that is linear on their own scale). `None` when empty.
pub fn median(counts: &[u64]) -> Option<f64> {
    quantile(counts, 0.5)
}

/// The `q` quantile of a histogram over these bins, interpolated as [`median`] is. `None` when
/// empty.
pub fn quantile(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = total as f64 * q.clamp(0.0, 1.0);
    let mut below = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        if c > 0 && (below + c) as f64 >= rank {
            let frac = ((rank - below as f64) / c as f64).clamp(0.0, 1.0);
            let (lo, hi) = (lower_edge(i), lower_edge(i + 1));
            return Some(lo * (hi / lo).powf(frac));
        }
        below += c;
    }
    None
}

/// A robust standard deviation of a histogram: its interquartile range over 1.349 (the
/// normal's), so a minority of stalls does not inflate it. `None` when empty.
pub fn spread(counts: &[u64]) -> Option<f64> {
    Some((quantile(counts, 0.75)? - quantile(counts, 0.25)?) / 1.349)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_bin_whose_edges_hold_them() {
        for v in [3e-4, 1e-3, 0.0105, 0.042, 0.5, 1.0, 7.7] {
            let i = index(v).expect("a time");
            assert!(
                lower_edge(i) <= v && v < lower_edge(i + 1),
                "{v} in bin {i}"
            );
        }
        assert_eq!(index(0.0), Some(0));
        assert_eq!(index(1e-9), Some(0));
        assert_eq!(index(1e6), Some(BINS - 1));
        assert_eq!(index(f64::NAN), None);
        assert_eq!(index(-1.0), None);
        assert_eq!(index(f64::INFINITY), None);
        assert!((lower_edge(BINS) - 20.0).abs() < 1e-9);
    }

    #[test]
    fn the_median_is_within_half_a_bin_and_ignores_a_minority_of_outliers() {
        let mut counts = vec![0u64; BINS];
        // 60 samples at 10.5 ms, 40 stalls of 1 s: the median stays in 10.5 ms's bin.
        counts[index(0.0105).expect("a time")] += 60;
        counts[index(1.0).expect("a time")] += 40;
        let m = median(&counts).expect("not empty");
        assert!((m / 0.0105 - 1.0).abs() < 0.03, "{m}");
        // Spread evenly over a range, the interpolated median is close to the middle.
        let mut counts = vec![0u64; BINS];
        for k in 0..1000 {
            let v = 0.010 + 0.010 * f64::from(k) / 1000.0;
            counts[index(v).expect("a time")] += 1;
        }
        let m = median(&counts).expect("not empty");
        assert!((m / 0.015 - 1.0).abs() < 0.01, "{m}");
        assert_eq!(median(&vec![0; BINS]), None);
    }
}
