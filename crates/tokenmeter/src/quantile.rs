//! Quantiles, in the two ways the crate reads them. Out of a Prometheus histogram's cumulative
//! buckets, exactly as PromQL's `histogram_quantile` reads it, so the page's figures and a
//! dashboard's agree; and of a sorted list by nearest rank, as the capacity model's replay and
//! its check read their samples. A leaf: it imports nothing of the crate; the page (`ui`), the
//! capacity model and the tools (`tools::exposition`) share it.

/// The `q`-quantile of cumulative buckets `(le, count)` (ascending), interpolated linearly
/// inside its bucket as PromQL's `histogram_quantile` does: the first bucket starts at 0, and a
/// quantile that falls in the `+Inf` bucket is the highest finite bound. Returns the value and
/// the bounds of the bucket that holds it (the estimate's resolution); `None` when the
/// histogram is empty.
pub fn histogram_quantile(q: f64, cumulative: &[(f64, f64)]) -> Option<(f64, (f64, f64))> {
    let total = cumulative.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let mut lower = (0.0, 0.0);
    for &(le, cum) in cumulative {
        if cum >= rank && cum > lower.1 {
            if le.is_infinite() {
                return Some((lower.0, (lower.0, le)));
            }
            let frac = (rank - lower.1) / (cum - lower.1);
            return Some((lower.0 + (le - lower.0) * frac, (lower.0, le)));
        }
        lower = (le, cum);
    }
    None
}

/// The `q`-quantile of `sorted` (ascending) by nearest rank: the smallest value with at least
/// a share `q` of the list at or below it; `None` for an empty list.
pub fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_follows_promql() {
        let h = [(1.0, 10.0), (2.0, 20.0), (f64::INFINITY, 30.0)];
        assert_eq!(histogram_quantile(0.5, &h), Some((1.5, (1.0, 2.0))));
        assert_eq!(histogram_quantile(0.1, &h), Some((0.3, (0.0, 1.0))));
        // In the +Inf bucket: the highest finite bound.
        assert_eq!(
            histogram_quantile(0.9, &h),
            Some((2.0, (2.0, f64::INFINITY)))
        );
        // An empty bucket below the rank is skipped, not divided by.
        let h = [(1.0, 0.0), (2.0, 0.0), (4.0, 4.0), (f64::INFINITY, 4.0)];
        assert_eq!(histogram_quantile(0.5, &h), Some((3.0, (2.0, 4.0))));
        assert_eq!(
            histogram_quantile(0.5, &[(1.0, 0.0), (f64::INFINITY, 0.0)]),
            None
        );
        assert_eq!(histogram_quantile(0.5, &[]), None);
    }
}
