//! Whether the window can answer at all: a decode line whose slope the data determine.
//!
//! Traffic held at one level (a steady closed loop, the most common production state) puts
//! nearly every token at one concurrency and a few at its neighbours while clients join and
//! leave. Through such points any slope fits: noise made it negative in one run, so per-request
//! speed "rose" with the batch, and tiny in another, so the answer ran off to the curve's end.
//! A line is a slope only where the levels it was drawn through are far enough apart, and
//! sampled well enough, that the slope stands clear of its own noise: [`MIN_T`] standard errors
//! above zero ([`super::fit::slope_error`]). Open-loop and bursty traffic spread the concurrency
//! by themselves and pass; a single steady level does not, and the model then says it cannot
//! answer yet rather than export a number it cannot support (`tokenmeter_capacity_supported`
//! 0, no `max_concurrency` or `utilization`: an autoscaler holds on absent data).

use super::fit::Fit;

/// How many standard errors above zero a slope must stand. One steady level is caught before
/// this, by the middle of its samples ([`MIN_CENTRAL_SPAN`]); this bar only keeps a slope that
/// noise alone could give from passing for one. At 3 and at 2 a ramp over 1 to 4 streams on a
/// 10 ms + 0.2 ms engine (the memory test's small cache) was declared unknown now and then.
pub const MIN_T: f64 = 1.0;

/// The least spread of the middle 80% of the samples' concurrencies (10th to 90th percentile)
/// for a slope: a level and a tenth apart (a steady level has none; a ramp over 1-4 streams,
/// whose tokens come mostly at its top levels, has 3 to 4). Poisson arrivals holding `n` in flight wander
/// over about `n ± 1.3 sqrt(n)` (27-43 at 35, 135-165 at 150), bursts and ramps over far more;
/// a closed loop held at one level stays on it.
pub const MIN_CENTRAL_SPAN: u32 = 1;
pub const MIN_CENTRAL_RATIO: f64 = 1.1;

/// Why the model cannot answer yet: the `reason` label of `tokenmeter_capacity_unsupported`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsupported {
    /// Fewer than three concurrencies with enough samples: no fit yet.
    WarmingUp,
    /// The levels seen are too close together to tell the per-sequence cost from noise (one
    /// steady level).
    NarrowSpread,
    /// The levels are spread, but the step does not grow with the batch: nothing says where it
    /// starts to.
    NoSlowdown,
}

impl Unsupported {
    /// Every reason, in the order the label lists them.
    pub const ALL: [Unsupported; 3] = [
        Unsupported::WarmingUp,
        Unsupported::NarrowSpread,
        Unsupported::NoSlowdown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Unsupported::WarmingUp => "warming_up",
            Unsupported::NarrowSpread => "narrow_spread",
            Unsupported::NoSlowdown => "no_slowdown",
        }
    }

    /// The reason in words, for the page and `tokenmeter capacity`.
    pub fn explain(self) -> &'static str {
        match self {
            Unsupported::WarmingUp => {
                "fewer than three concurrencies have been seen with enough tokens to fit"
            }
            Unsupported::NarrowSpread => {
                "the traffic has stayed at one level: the step's cost per sequence cannot be told \
                 from noise until the concurrency varies (open-loop arrivals, bursts or a ramp)"
            }
            Unsupported::NoSlowdown => {
                "the step does not slow down over the concurrencies seen: nothing says where it \
                 would"
            }
        }
    }
}

/// Token samples at usable concurrencies past which a window without a fit is not warming up
/// but held at one or two levels: a few seconds of any real traffic.
pub const SETTLED_SAMPLES: u64 = 2_000;

/// A `reason` label in words, for a reader of the exposition (the page, `tokenmeter
/// capacity`); a reason this build does not know (a newer tokenmeter's) is shown as it is, its
/// underscores as spaces.
pub fn in_words(reason: &str) -> String {
    Unsupported::ALL
        .iter()
        .find(|u| u.as_str() == reason)
        .map_or_else(|| reason.replace('_', " "), |u| u.explain().to_string())
}

/// `Ok` when `fit` can answer, else why not; `samples` are the window's token samples at the
/// concurrencies with enough of them (what tells a young window from a narrow one).
pub fn judge(fit: Option<&Fit>, samples: u64) -> Result<(), Unsupported> {
    let Some(f) = fit else {
        return Err(if samples >= SETTLED_SAMPLES {
            Unsupported::NarrowSpread
        } else {
            Unsupported::WarmingUp
        });
    };
    // Where the traffic lived: a steady level with a few moments at its neighbours is one
    // level, whatever slope those moments draw.
    let (lo, hi) = f.central;
    if hi < lo + MIN_CENTRAL_SPAN || f64::from(hi) < MIN_CENTRAL_RATIO * f64::from(lo) {
        return Err(Unsupported::NarrowSpread);
    }
    if f.per_seq <= 0.0 && f.slope_error.is_finite() && f.slope_error > 0.0 {
        // A flat or falling line that is itself well determined: the engine does not slow.
        let spread = f.max_concurrency.saturating_sub(f.min_concurrency);
        if spread >= 4 && f.min_concurrency > 0 && f.max_concurrency >= 2 * f.min_concurrency {
            return Err(Unsupported::NoSlowdown);
        }
        return Err(Unsupported::NarrowSpread);
    }
    // Written so that a NaN error reads as "not clear".
    let clear = f.per_seq >= MIN_T * f.slope_error;
    if !clear {
        return Err(Unsupported::NarrowSpread);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::capacity::fit::{fit, tests::Rng};
    use crate::capacity::steps::StepWindow;

    /// A window whose tokens came at concurrencies drawn by `level`, from a step of
    /// 16 ms + 0.2 ms per sequence with 3% jitter (the simulator's defaults, seen through a
    /// proxy).
    fn window(tokens: u32, mut level: impl FnMut(&mut Rng) -> f64) -> Option<Fit> {
        let t0 = Instant::now();
        let s = StepWindow::new(Duration::from_secs(900), t0);
        let mut rng = Rng::new(11);
        for _ in 0..tokens {
            let b = level(&mut rng).round().max(1.0);
            let t = (0.016 + 0.0002 * b) * (1.0 + 0.03 * rng.normal());
            s.push(b, t, 1, t0);
        }
        fit(&s.columns(t0))
    }

    #[test]
    fn one_steady_level_cannot_answer_and_spread_traffic_can() {
        // A closed loop of 24: every token at 24 but for a few while clients rejoin.
        let steady = window(60_000, |r| {
            24.0 - if r.uniform() < 0.03 {
                1.0 + (r.uniform() * 2.0).floor()
            } else {
                0.0
            }
        });
        assert_eq!(
            judge(steady.as_ref(), 60_000),
            Err(Unsupported::NarrowSpread)
        );
        // Poisson arrivals holding about 35 in flight: the count wanders by its square root.
        let open = window(60_000, |r| 35.0 + 6.0 * r.normal());
        let f = open.expect("a fit");
        assert_eq!(judge(Some(&f), f.samples), Ok(()), "{f:?}");
        assert!((f.per_seq / 0.0002 - 1.0).abs() < 0.25, "{f:?}");
        // A ramp through 1..64.
        let ramp = window(60_000, |r| 1.0 + (r.uniform() * 64.0).floor());
        assert_eq!(judge(ramp.as_ref(), 60_000), Ok(()));
        assert_eq!(judge(None, 100), Err(Unsupported::WarmingUp));
        // Two levels only, but long held: narrow, not young.
        assert_eq!(judge(None, 60_000), Err(Unsupported::NarrowSpread));
    }

    #[test]
    fn a_few_levels_pushed_off_the_line_do_not_hide_a_spread_slope() {
        // Bursts: levels 2..44, one in five of them seen only while prompts were prefilled,
        // their steps 30% slower. Theil-Sen outvotes them; the slope stays known.
        let t0 = Instant::now();
        let s = StepWindow::new(Duration::from_secs(900), t0);
        let mut rng = Rng::new(5);
        for b in 2..=44u32 {
            let off = if b % 5 == 0 { 1.3 } else { 1.0 };
            for _ in 0..400 {
                let t = (0.010 + 0.0005 * f64::from(b)) * off * (1.0 + 0.03 * rng.normal());
                s.push(f64::from(b), t, 1, t0);
            }
        }
        let f = fit(&s.columns(t0)).expect("a fit");
        assert_eq!(judge(Some(&f), f.samples), Ok(()), "{f:?}");
        assert!((f.per_seq / 0.0005 - 1.0).abs() < 0.1, "{f:?}");
    }

    #[test]
    fn a_falling_or_flat_line_is_never_a_negative_cost() {
        let t0 = Instant::now();
        let s = StepWindow::new(Duration::from_secs(900), t0);
        // Steps that get cheaper with the batch (another process left the machine midway).
        for b in 1..=32u32 {
            for _ in 0..200 {
                s.push(f64::from(b), 0.030 - 0.0003 * f64::from(b), 1, t0);
            }
        }
        let f = fit(&s.columns(t0)).expect("a fit");
        assert_eq!(f.per_seq, 0.0, "{f:?}");
        assert!(f.base > 0.0, "{f:?}");
        assert_eq!(judge(Some(&f), f.samples), Err(Unsupported::NoSlowdown));
    }
}
