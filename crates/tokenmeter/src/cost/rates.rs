//! What the split (`super::ledger`) needs to know of the engine: what a decode step costs at a
//! batch size, and what prefill costs per prompt token. The capacity model publishes them at
//! each refit; until it can, the split is the equal share of the time in flight.
//!
//! The split needs less than a capacity answer: the decode requests in one batch share its step
//! equally whatever the line's slope, so a step's cost at the batch seen is enough. Traffic held
//! at one level has no fitted line but has that level's measured step (`Step::Levels`), which
//! is what lets it weigh a long prompt's prefill against the decode it stalled.

use std::sync::Arc;

/// A decode step's cost, in seconds of one engine.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The capacity model's fitted line: `base + per_seq x batch`.
    Line { base: f64, per_seq: f64 },
    /// No line yet: the median step measured at each level seen, `(level, seconds)`; a batch
    /// costs what the nearest level's did.
    Levels(Arc<[(f64, f64)]>),
}

/// The engine's costs as the split reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Rates {
    pub step: Step,
    /// Prefill, seconds per uncached prompt token (0 while unknown: prompts then weigh nothing
    /// beyond their share of the steps).
    pub prefill_per_token: f64,
    /// The prefill cost is the capacity model's believed fit (0 included: prompts too short to
    /// cost anything), not a first reading or unknown. The books settle their first seconds
    /// once it is.
    pub prefill_known: bool,
    /// The part of a step a request sent while the engine computes one for others waits to
    /// be admitted: half, for arrivals at any moment; all of it, for a closed loop's next
    /// request, sent the moment the step that ended the last one ended.
    pub admission_wait: f64,
}

/// [`Rates::admission_wait`] for arrivals at any moment: the running step's mean remainder.
pub const HALF_A_STEP: f64 = 0.5;

/// No step is taken as shorter than this: a microsecond is far below any engine's, and it
/// keeps a degenerate fit (a line through zero) from dividing by nothing.
const MIN_STEP_SECS: f64 = 1e-6;

impl Rates {
    /// Seconds of one decode step at `batch` sequences.
    pub fn step(&self, batch: f64) -> f64 {
        let s = match &self.step {
            Step::Line { base, per_seq } => base + per_seq * batch,
            Step::Levels(levels) => levels
                .iter()
                .min_by(|a, b| (a.0 - batch).abs().total_cmp(&(b.0 - batch).abs()))
                .map_or(MIN_STEP_SECS, |l| l.1),
        };
        if s.is_finite() {
            s.max(MIN_STEP_SECS)
        } else {
            MIN_STEP_SECS
        }
    }

    /// Seconds of prefill for `tokens` uncached prompt tokens.
    pub fn prefill(&self, tokens: f64) -> f64 {
        let p = self.prefill_per_token * tokens;
        if p.is_finite() {
            p.max(0.0)
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_costs_the_line_or_the_nearest_level() {
        let line = Rates {
            step: Step::Line {
                base: 0.016,
                per_seq: 0.0002,
            },
            prefill_per_token: 5e-5,
            prefill_known: true,
            admission_wait: HALF_A_STEP,
        };
        assert!((line.step(8.0) - 0.0176).abs() < 1e-12);
        assert!((line.prefill(2000.0) - 0.1).abs() < 1e-12);
        let levels = Rates {
            step: Step::Levels(Arc::from([(4.0, 0.02), (6.0, 0.03)])),
            prefill_per_token: 0.0,
            prefill_known: false,
            admission_wait: HALF_A_STEP,
        };
        assert_eq!(levels.step(1.0), 0.02);
        assert_eq!(levels.step(5.6), 0.03);
        let none = Rates {
            step: Step::Levels(Arc::from([])),
            prefill_per_token: f64::NAN,
            prefill_known: false,
            admission_wait: HALF_A_STEP,
        };
        assert_eq!(none.step(3.0), MIN_STEP_SECS);
        assert_eq!(none.prefill(10.0), 0.0);
    }
}
