//! The open loop's schedule: when each request of a `--request-rate` level is due.
//!
//! Arrivals are a Poisson process, as vLLM's benchmark sends them at a request rate: the gaps
//! between requests are independent and exponentially distributed with mean `1 / rate`. The
//! schedule is a pure function of the seed and the rate (splitmix64, then inversion of the
//! exponential's distribution), so a run is repeatable to the nanosecond, and it is decided
//! before any request is sent: a slow server cannot push the next send back.

use std::time::Duration;

use tokenmeter::rng::SplitMix64;

/// The seeded offsets (from the level's start) at which requests are due, ascending, without
/// end.
#[derive(Debug, Clone)]
pub struct Arrivals {
    rng: SplitMix64,
    /// Mean gap, seconds.
    mean_gap: f64,
    /// The current offset, seconds.
    at: f64,
}

impl Arrivals {
    /// The schedule of one level at `rate` requests/s (finite, above 0). The rate is mixed into
    /// the seed, so each level has its own arrivals whatever the levels around it.
    pub fn new(rate: f64, seed: u64) -> Arrivals {
        Arrivals {
            rng: SplitMix64::new(seed ^ rate.to_bits().rotate_left(17)),
            mean_gap: 1.0 / rate,
            at: 0.0,
        }
    }

    /// The next gap, seconds: `-ln(1 - u) x mean` for `u` uniform in [0, 1).
    fn gap(&mut self) -> f64 {
        let u = self.rng.unit();
        -(1.0 - u).ln() * self.mean_gap
    }
}

impl Iterator for Arrivals {
    type Item = Duration;

    /// The first request is due one gap after the start, as every other one after its
    /// predecessor (the process has no memory of when the level began).
    fn next(&mut self) -> Option<Duration> {
        self.at += self.gap();
        Duration::try_from_secs_f64(self.at).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(rate: f64, seed: u64, n: usize) -> Vec<f64> {
        let at: Vec<f64> = Arrivals::new(rate, seed)
            .take(n)
            .map(|d| d.as_secs_f64())
            .collect();
        std::iter::once(at[0])
            .chain(at.windows(2).map(|w| w[1] - w[0]))
            .collect()
    }

    /// Over 10,000 gaps at 4 requests/s the mean gap is 0.25 s within 4% (the standard error
    /// of the mean of an exponential is mean / sqrt(N) = 1%, so this is four of them); the
    /// spread is an exponential's (standard deviation equal to the mean, within 5%), and
    /// e^-1 = 36.8% of the gaps are longer than the mean (within 2 points, four standard errors).
    #[test]
    fn gaps_are_exponential_with_the_rates_mean() {
        for seed in [0, 1, 42] {
            let g = gaps(4.0, seed, 10_000);
            let n = g.len() as f64;
            let mean = g.iter().sum::<f64>() / n;
            assert!((mean / 0.25 - 1.0).abs() < 0.04, "seed {seed}: mean {mean}");
            let sd = (g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
            assert!((sd / mean - 1.0).abs() < 0.05, "seed {seed}: sd {sd}");
            let long = g.iter().filter(|&&x| x > 0.25).count() as f64 / n;
            assert!((long - (-1f64).exp()).abs() < 0.02, "seed {seed}: {long}");
            assert!(g.iter().all(|&x| x >= 0.0));
        }
    }

    #[test]
    fn a_seed_gives_the_same_schedule_exactly_and_another_seed_another() {
        let a: Vec<Duration> = Arrivals::new(10.0, 7).take(1000).collect();
        let b: Vec<Duration> = Arrivals::new(10.0, 7).take(1000).collect();
        assert_eq!(a, b);
        let c: Vec<Duration> = Arrivals::new(10.0, 8).take(1000).collect();
        assert_ne!(a, c);
        // Another rate at the same seed is another schedule, not this one scaled.
        let d: Vec<Duration> = Arrivals::new(20.0, 7).take(1000).collect();
        assert!(a
            .iter()
            .zip(&d)
            .any(|(x, y)| (x.as_secs_f64() / y.as_secs_f64() - 2.0).abs() > 1e-6));
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }
}
