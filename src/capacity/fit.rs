//! The step-cost fit: `t(b) = base + per_seq * b` through the per-concurrency medians, by
//! Theil-Sen.
//!
//! Two layers keep outliers out. Within one concurrency, the median time per token ignores
//! whatever hits fewer than half of its tokens: a stalled stream, the step that admitted a long
//! prompt, a client that read late and got ten tokens at once. Across concurrencies, Theil-Sen
//! (the median of the slopes between every pair of points, then the median intercept) ignores
//! up to 29% of whole points that are wrong, for instance a concurrency seen only during a
//! prefill burst. It needs no scale estimate and no tuning constant, unlike Huber's loss, and no
//! iteration: with at most 256 points it is 32,640 slopes, well under a millisecond every few
//! seconds. Each concurrency counts once however many samples it has, so the busiest level does
//! not decide the slope alone; levels with too few samples to have a stable median are left out.

use super::summary::Column;

/// Samples a concurrency needs before its median is used: the median of 20 draws has a spread
/// of about a quarter of the samples' own (1.25 / sqrt(20)).
pub const MIN_SAMPLES: u64 = 20;

/// Distinct concurrencies needed for a fit: two points always fit a line exactly, a third is
/// the first that can disagree (and gives r² a meaning).
pub const MIN_POINTS: usize = 3;

/// A fitted step-cost line and how far it can be trusted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// Seconds per step with no sequence (the weights' read), the intercept.
    pub base: f64,
    /// Seconds added per sequence in the batch, the slope.
    pub per_seq: f64,
    /// 1 - (residual / total) sum of squares over the medians the fit used, each weighted by its
    /// samples; 1 is a perfect line, 0 no better than a flat one, negative worse (a robust line
    /// is not the least-squares one).
    pub r2: f64,
    /// Token samples behind the medians the fit used.
    pub samples: u64,
    /// Concurrencies the fit used.
    pub points: usize,
    /// The lowest and highest of them: outside, an answer is an extrapolation.
    pub min_concurrency: u32,
    pub max_concurrency: u32,
}

impl Fit {
    /// Predicted seconds per token for one stream at concurrency `b`.
    pub fn step(&self, b: f64) -> f64 {
        self.base + self.per_seq * b
    }
}

/// Fits the columns that have enough samples; `None` until there are [`MIN_POINTS`] of them.
pub fn fit(columns: &[Column]) -> Option<Fit> {
    let used: Vec<&Column> = columns
        .iter()
        .filter(|c| c.samples >= MIN_SAMPLES)
        .collect();
    if used.len() < MIN_POINTS {
        return None;
    }
    let xy: Vec<(f64, f64)> = used
        .iter()
        .map(|c| (f64::from(c.concurrency), c.median))
        .collect();
    let (base, per_seq) = theil_sen(&xy)?;
    // r² weighted by each concurrency's samples: a level seen for a moment while clients joined
    // counts for little, the levels the traffic lived at for much, as they do for the answers.
    let w: Vec<f64> = used.iter().map(|c| c.samples as f64).collect();
    let total: f64 = w.iter().sum();
    let mean = xy.iter().zip(&w).map(|(p, w)| p.1 * w).sum::<f64>() / total;
    let ss_tot: f64 = xy
        .iter()
        .zip(&w)
        .map(|(p, w)| w * (p.1 - mean).powi(2))
        .sum();
    let ss_res: f64 = xy
        .iter()
        .zip(&w)
        .map(|(p, w)| w * (p.1 - (base + per_seq * p.0)).powi(2))
        .sum();
    let r2 = if ss_tot > 0.0 {
        1.0 - ss_res / ss_tot
    } else if ss_res == 0.0 {
        1.0
    } else {
        0.0
    };
    Some(Fit {
        base,
        per_seq,
        r2,
        samples: used.iter().map(|c| c.samples).sum(),
        points: used.len(),
        min_concurrency: used.iter().map(|c| c.concurrency).min()?,
        max_concurrency: used.iter().map(|c| c.concurrency).max()?,
    })
}

/// The Theil-Sen line `(intercept, slope)` through points with distinct x; `None` for fewer
/// than two.
pub fn theil_sen(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let mut slopes = Vec::with_capacity(points.len() * points.len().saturating_sub(1) / 2);
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            if b.0 != a.0 {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    let slope = median(slopes)?;
    let intercepts: Vec<f64> = points.iter().map(|p| p.1 - slope * p.0).collect();
    Some((median(intercepts)?, slope))
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_unstable_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::capacity::summary::Summary;

    /// A deterministic stream of uniform and normal draws (xorshift, Box-Muller).
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Self {
            Rng(seed.max(1))
        }
        pub(crate) fn uniform(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
        pub(crate) fn normal(&mut self) -> f64 {
            let (u, v) = (self.uniform().max(1e-12), self.uniform());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        }
    }

    /// Pushes `per_level` tokens at each concurrency 1..=`top` of `t(b) = base + per_seq * b`
    /// with 5% normal jitter, of which a share `outliers` are stalls (1 s) or prefill-inflated
    /// steps (3x); returns the fit.
    fn fit_synthetic(base: f64, per_seq: f64, top: u32, per_level: u32, outliers: f64) -> Fit {
        let t0 = Instant::now();
        let s = Summary::new(Duration::from_secs(900), t0);
        let mut rng = Rng::new(7);
        for b in 1..=top {
            for _ in 0..per_level {
                let mut t = (base + per_seq * f64::from(b)) * (1.0 + 0.05 * rng.normal());
                let u = rng.uniform();
                if u < outliers / 2.0 {
                    t = 1.0;
                } else if u < outliers {
                    t *= 3.0;
                }
                // The measured concurrency is off by one now and then (a request joining).
                let c = f64::from(b) + if rng.uniform() < 0.1 { 1.0 } else { 0.0 };
                s.push(c, t, 1, t0);
            }
        }
        fit(&s.columns(t0)).expect("enough points")
    }

    #[test]
    fn a_clean_line_is_recovered_closely() {
        let f = fit_synthetic(0.010, 0.0005, 64, 400, 0.0);
        assert!((f.base / 0.010 - 1.0).abs() < 0.03, "{f:?}");
        assert!((f.per_seq / 0.0005 - 1.0).abs() < 0.03, "{f:?}");
        assert!(f.r2 > 0.99, "{f:?}");
        assert_eq!((f.min_concurrency, f.max_concurrency), (1, 65));
    }

    // A fifth of the tokens are stalls or prefill-inflated: the fit moves by under 5%.
    #[test]
    fn outliers_do_not_drag_the_fit() {
        let clean = fit_synthetic(0.020, 0.0010, 48, 400, 0.0);
        let dirty = fit_synthetic(0.020, 0.0010, 48, 400, 0.2);
        assert!((dirty.base / 0.020 - 1.0).abs() < 0.05, "{dirty:?}");
        assert!((dirty.per_seq / 0.0010 - 1.0).abs() < 0.05, "{dirty:?}");
        assert!((dirty.per_seq / clean.per_seq - 1.0).abs() < 0.05);
    }

    #[test]
    fn whole_wrong_points_are_outvoted() {
        // Ten levels on the line y = 1 + 2x, two far off it.
        let mut pts: Vec<(f64, f64)> = (1..=10)
            .map(|x| (f64::from(x), 1.0 + 2.0 * f64::from(x)))
            .collect();
        pts[3].1 = 100.0;
        pts[7].1 = -50.0;
        let (a, b) = theil_sen(&pts).expect("a line");
        assert!((a - 1.0).abs() < 1e-9 && (b - 2.0).abs() < 1e-9, "{a} {b}");
        assert_eq!(theil_sen(&[(1.0, 1.0)]), None);
        assert_eq!(theil_sen(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }

    #[test]
    fn too_few_samples_or_levels_give_no_fit() {
        let col = |c, samples| Column {
            concurrency: c,
            samples,
            median: 0.01 + 0.001 * f64::from(c),
        };
        assert_eq!(fit(&[col(1, 100), col(2, 100)]), None);
        assert_eq!(
            fit(&[col(1, 100), col(2, 100), col(3, MIN_SAMPLES - 1)]),
            None
        );
        let f = fit(&[col(1, 100), col(2, 100), col(3, MIN_SAMPLES)]).expect("a fit");
        assert_eq!((f.samples, f.points), (200 + MIN_SAMPLES, 3));
    }
}
