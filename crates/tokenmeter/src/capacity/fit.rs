//! The step-cost fit: `t(b) = base + per_seq * b` through the per-concurrency medians, by
//! Theil-Sen.
//!
//! Two layers keep outliers out. Within one concurrency, the median time per token ignores
//! whatever hits fewer than half of its tokens: a stalled stream, the step that admitted a long
//! prompt, a client that read late and got ten tokens at once. Across concurrencies, Theil-Sen
//! (the median of the slopes between every pair of points, then the median intercept) ignores
//! whole points that are wrong, for instance a concurrency seen only during a prefill burst. It
//! needs no scale estimate and no tuning constant, unlike Huber's loss, and no iteration: with at
//! most 256 points it is 32,640 slopes, well under a millisecond every few seconds. The pairwise
//! slopes are weighted by the inverse of their variance ([`weighted_theil_sen`]): a median of
//! many samples is precise, one of twenty is not, and two levels far apart give a better slope
//! than two neighbours. Unweighted, the levels a ramp passes through for a moment outvoted the
//! levels it held, and the slope moved by 10% from one run to the next against the simulator.

use super::steps::Column;

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
    /// The standard error of `per_seq` ([`slope_error`]): how far the slope could be from the
    /// truth by noise alone. A slope within a few of these of zero is not a slope
    /// ([`super::support`]).
    pub slope_error: f64,
    /// The concurrencies between which the middle 80% of the samples lie (their 10th and 90th
    /// percentiles): where the traffic lived, which levels seen for a moment do not widen.
    pub central: (u32, u32),
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
    let weighted: Vec<(f64, f64, f64)> = used
        .iter()
        .map(|c| (f64::from(c.concurrency), c.median, c.samples as f64))
        .collect();
    let (base, per_seq) = weighted_theil_sen(&weighted)?;
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
    let slope_error = slope_error(&used, base, per_seq);
    let central = central(&used)?;
    // A step never gets cheaper with more sequences: a falling line is noise (or a window whose
    // levels came at different moments of other load), and the flat line through the samples'
    // median is the most the data can say. `support` then says it cannot answer.
    let (base, per_seq) = if per_seq < 0.0 {
        let flat: Vec<(f64, f64)> = used.iter().map(|c| (c.median, c.samples as f64)).collect();
        (weighted_median(flat)?, 0.0)
    } else {
        (base, per_seq)
    };
    Some(Fit {
        base,
        per_seq,
        r2,
        slope_error,
        central,
        samples: used.iter().map(|c| c.samples).sum(),
        points: used.len(),
        min_concurrency: used.iter().map(|c| c.concurrency).min()?,
        max_concurrency: used.iter().map(|c| c.concurrency).max()?,
    })
}

/// The relative error a median read from the summary carries whatever its samples: the bins are
/// 5.9% apart, and samples that all fall in one bin (a steady engine) give the bin's middle, up
/// to 2.9% off; 1.7% is that error's standard deviation (uniform over +-2.9%). Neighbouring
/// concurrencies whose steps fall in one bin read the same median, so without this floor two
/// well-sampled levels one apart would claim a slope they cannot see.
pub const MEDIAN_RESOLUTION: f64 = 0.017;

/// The 10th and 90th percentiles of the samples' concurrency over `used` (ascending columns).
fn central(used: &[&Column]) -> Option<(u32, u32)> {
    let total: u64 = used.iter().map(|c| c.samples).sum();
    let at = |q: f64| {
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut below = 0u64;
        used.iter()
            .find(|c| {
                below += c.samples;
                below >= rank
            })
            .map(|c| c.concurrency)
    };
    Some((at(0.1)?, at(0.9)?))
}

/// The median of a chi-square distribution of one degree of freedom: what the median of squared
/// standardized residuals is when the scatter is only the stated noise.
const CHI2_ONE_MEDIAN: f64 = 0.455;

/// The standard error of the slope of a line through `used` columns' medians, each weighted by
/// the inverse of its median's variance: the sampling error of a median (`1.2533 sd / sqrt(n)`,
/// the sd from the column's interquartile range) plus the summary's resolution
/// ([`MEDIAN_RESOLUTION`]). Where the medians scatter about the line by more than that (other
/// load on the machine), the error grows by the scatter: the reduced chi-square, when above 1,
/// read robustly (the median of the points' weighted squared residuals over 0.455, the median
/// of a chi-square of one degree), so that a few levels bursts or prefill stalls pushed off the
/// line, which Theil-Sen already outvotes, do not declare a well-spread slope unknown. The
/// slope of weighted least squares has this error; Theil-Sen's, which is what is fitted, is
/// within a few percent of it for well-behaved data.
pub fn slope_error(used: &[&Column], base: f64, per_seq: f64) -> f64 {
    let points: Vec<(f64, f64, f64)> = used
        .iter()
        .map(|c| {
            let sampling = 1.2533 * c.spread / (c.samples.max(1) as f64).sqrt();
            let resolution = MEDIAN_RESOLUTION * c.median;
            let var = (sampling * sampling + resolution * resolution).max(f64::MIN_POSITIVE);
            (f64::from(c.concurrency), c.median, 1.0 / var)
        })
        .collect();
    let total: f64 = points.iter().map(|p| p.2).sum();
    if points.len() < 3 || total <= 0.0 {
        return f64::INFINITY;
    }
    let mean_x = points.iter().map(|p| p.0 * p.2).sum::<f64>() / total;
    let sxx: f64 = points.iter().map(|p| p.2 * (p.0 - mean_x).powi(2)).sum();
    if sxx <= 0.0 {
        return f64::INFINITY;
    }
    let mut scaled: Vec<f64> = points
        .iter()
        .map(|p| p.2 * (p.1 - base - per_seq * p.0).powi(2))
        .collect();
    scaled.sort_by(f64::total_cmp);
    let chi2 = scaled[scaled.len() / 2] / CHI2_ONE_MEDIAN;
    (chi2.max(1.0) / sxx).sqrt()
}

/// The Theil-Sen line `(intercept, slope)` through points with distinct x; `None` for fewer
/// than two. Every point counts once.
pub fn theil_sen(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let weighted: Vec<(f64, f64, f64)> = points.iter().map(|&(x, y)| (x, y, 1.0)).collect();
    weighted_theil_sen(&weighted)
}

/// Theil-Sen over points `(x, y, n)` whose `y` is a median of `n` samples: the slope is the
/// weighted median of the pairwise slopes, each weighted by the inverse of its variance,
/// `(x_j - x_i)² / (1/n_i + 1/n_j)` (a median of `n` samples has a variance proportional to
/// `1/n`), and the intercept the median of `y - slope x` weighted by `n`. Points far apart and
/// well sampled decide the slope; a level seen for a moment (a few dozen samples while clients
/// joined) barely moves it, and wrong points are still outvoted as long as they carry less than
/// about a third of the weight.
pub fn weighted_theil_sen(points: &[(f64, f64, f64)]) -> Option<(f64, f64)> {
    let mut slopes = Vec::with_capacity(points.len() * points.len().saturating_sub(1) / 2);
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            let dx = b.0 - a.0;
            if dx != 0.0 && a.2 > 0.0 && b.2 > 0.0 {
                slopes.push(((b.1 - a.1) / dx, dx * dx / (1.0 / a.2 + 1.0 / b.2)));
            }
        }
    }
    let slope = weighted_median(slopes)?;
    let intercepts: Vec<(f64, f64)> = points.iter().map(|p| (p.1 - slope * p.0, p.2)).collect();
    Some((weighted_median(intercepts)?, slope))
}

/// The weighted median of `(value, weight)`: the value where the cumulative weight reaches half
/// (the mean of the two values on either side when it lands exactly on a boundary, so equal
/// weights give the ordinary median).
fn weighted_median(mut v: Vec<(f64, f64)>) -> Option<f64> {
    v.retain(|(x, w)| x.is_finite() && w.is_finite() && *w > 0.0);
    if v.is_empty() {
        return None;
    }
    v.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let half = v.iter().map(|p| p.1).sum::<f64>() / 2.0;
    let mut below = 0.0;
    for (i, &(x, w)) in v.iter().enumerate() {
        below += w;
        // Relative slack, so sums of equal weights that should meet half exactly do.
        if (below - half).abs() <= half * 1e-12 {
            return Some(v.get(i + 1).map_or(x, |next| (x + next.0) / 2.0));
        }
        if below > half {
            return Some(x);
        }
    }
    v.last().map(|p| p.0)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::capacity::steps::StepWindow;

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
        let s = StepWindow::new(Duration::from_secs(900), t0);
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
        // Weighted: a well-sampled line outweighs three noisy points off it; equal weights give
        // the plain estimate.
        let mut w: Vec<(f64, f64, f64)> = (1..=10)
            .map(|x| (f64::from(x), 1.0 + 2.0 * f64::from(x), 1000.0))
            .collect();
        w.extend([(2.5, 40.0, 20.0), (5.5, -9.0, 20.0), (7.5, 60.0, 20.0)]);
        let (a, b) = weighted_theil_sen(&w).expect("a line");
        assert!((a - 1.0).abs() < 1e-9 && (b - 2.0).abs() < 1e-9, "{a} {b}");
        assert_eq!(
            weighted_median(vec![(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 1.0)]),
            Some(2.5)
        );
        assert_eq!(
            weighted_median(vec![(1.0, 1.0), (2.0, 5.0), (3.0, 1.0)]),
            Some(2.0)
        );
        assert_eq!(theil_sen(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }

    #[test]
    fn too_few_samples_or_levels_give_no_fit() {
        let col = |c, samples| Column {
            concurrency: c,
            samples,
            median: 0.01 + 0.001 * f64::from(c),
            spread: 0.0005,
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
