//! Percentiles of one level's samples: count, mean, and the percentiles the report shows.
//!
//! Percentiles interpolate linearly between the two closest ranks (numpy's default, "type 7" in
//! Hyndman and Fan), so a p50 of an even number of samples is the mean of the middle two and
//! p0/p100 are the minimum and maximum. Samples that are not finite are dropped first: a division
//! by a zero interval must not poison a whole level.

use serde::Serialize;

/// Count, mean and the percentiles the report shows, of one measure at one level.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub mean: f64,
    pub min: f64,
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// Summarises `samples` (sorting them in place); `None` when there is no finite sample.
    pub fn of(samples: &mut Vec<f64>) -> Option<Percentiles> {
        samples.retain(|x| x.is_finite());
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let q = |p| percentile(samples, p).unwrap_or(f64::NAN);
        Some(Percentiles {
            count: samples.len(),
            mean: samples.iter().sum::<f64>() / samples.len() as f64,
            min: samples[0],
            p10: q(0.1),
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            max: samples[samples.len() - 1],
        })
    }
}

/// The `q`-quantile (0 to 1) of ascending `sorted` samples, interpolating between closest ranks.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = q.clamp(0.0, 1.0) * last as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Time per output token, the common definition: the decode time after the first token divided
/// by the tokens after the first. `None` below two tokens, where there is no decode interval.
pub fn tpot(ttft: f64, e2e: f64, output_tokens: u64) -> Option<f64> {
    (output_tokens >= 2).then(|| (e2e - ttft) / (output_tokens - 1) as f64)
}

/// The decode speed one user saw, tokens/s: the inverse of [`tpot`].
pub fn request_tps(ttft: f64, e2e: f64, output_tokens: u64) -> Option<f64> {
    let decode = e2e - ttft;
    (output_tokens >= 2 && decode > 0.0).then(|| (output_tokens - 1) as f64 / decode)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_closest_ranks() {
        let s = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&s, 0.0), Some(1.0));
        assert_eq!(percentile(&s, 0.5), Some(2.5));
        assert_eq!(percentile(&s, 1.0), Some(4.0));
        // rank 0.9 x 3 = 2.7: 3 + 0.7 x (4 - 3)
        assert!((percentile(&s, 0.9).unwrap() - 3.7).abs() < 1e-12);
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn summary_sorts_and_drops_non_finite() {
        let mut v = vec![5.0, f64::NAN, 1.0, 3.0, f64::INFINITY];
        let s = Percentiles::of(&mut v).unwrap();
        assert_eq!((s.count, s.min, s.p50, s.max), (3, 1.0, 3.0, 5.0));
        assert_eq!(s.mean, 3.0);
        assert_eq!(Percentiles::of(&mut vec![f64::NAN]), None);
    }

    #[test]
    fn tpot_and_tps_follow_the_definitions() {
        // 101 tokens, first at 0.5 s, last at 2.5 s: 100 intervals in 2 s.
        assert_eq!(tpot(0.5, 2.5, 101), Some(0.02));
        assert_eq!(request_tps(0.5, 2.5, 101), Some(50.0));
        assert_eq!(tpot(0.5, 2.5, 1), None);
        assert_eq!(request_tps(0.5, 0.5, 10), None);
    }
}
