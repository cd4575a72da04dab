//! The context term of the decode step: a step reads every running sequence's KV cache, so its
//! time grows with the tokens of context the batch holds, not only with the batch's size.
//!
//! The decode line (`t(b) = base + per_seq x b`, [`super::fit`]) is drawn through the median
//! token of each concurrency, whatever its context, so it holds at one context and is wrong
//! for a mix that is longer or shorter: after a shift from short to long contexts it promises
//! the long requests the short ones' speed (the short ones made most of the tokens, so the
//! medians are theirs). The term is fitted from finished requests, each of which knows its own
//! mean context over its decode (its uncached prompt and half its output, the KV the replay
//! holds for it) and the concurrency it decoded at, as the line's miss per sequence:
//!
//! `(seconds per token - t(b)) / b = per_kv_token x (context - c0)`
//!
//! through the window's requests by Theil-Sen (the decode fit's weighted estimator, weighted by
//! output tokens): the slope is the cost of a token of context, and `c0`, where the line
//! crosses zero, the context at which the line holds as it is. A step whose `b` sequences hold
//! `K` tokens then costs `t(b) + per_kv_token x (K - b x c0)`. A request's own context stands
//! for its batch's: right where contexts change over time (a shift), blind where long and short
//! run side by side in one batch (their steps are shared, so their speeds do not differ), which
//! leaves the term at zero rather than wrong.
//!
//! The term is taken only where the data can say it: [`MIN_REQUESTS`] requests of two tokens or
//! more whose contexts span [`MIN_SPREAD`] (the 90th percentile over the 10th), and only a
//! positive slope big enough to matter ([`MIN_EFFECT`]; a longer context never makes a step
//! faster). Otherwise there is no term and the model is the line alone, as before.

use super::fit::{weighted_theil_sen, Fit};
use super::workload::Request;

/// Requests needed for the term: with fewer, one slow request moves the slope.
pub const MIN_REQUESTS: usize = 40;

/// How far apart the window's contexts must be (90th over 10th percentile): closer, the term
/// is a slope through a cloud with no width, and any noise is a slope.
pub const MIN_SPREAD: f64 = 2.0;

/// The smallest term taken: one that moves a one-sequence step by less than this share across
/// the window's contexts (10th to 90th percentile) changes no answer and is taken for noise. A
/// noise slope would also carry the line's other misses (a request's mean time per token
/// includes the steps other prompts' prefills stretched) into every replayed step.
pub const MIN_EFFECT: f64 = 0.05;

/// The requests the fit uses at most, the most recent: the pairwise slopes are quadratic, and
/// 256 is the decode fit's own bound (32,640 slopes, well under a millisecond).
pub const MAX_REQUESTS: usize = 256;

/// The fitted term.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContextTerm {
    /// Seconds added to a step per token of context the batch holds beyond `mean` each.
    pub per_token: f64,
    /// The context per sequence at which the line holds as it is (`c0`).
    pub mean: f64,
    /// Requests the fit used.
    pub requests: usize,
}

impl ContextTerm {
    /// What a step holding `kv_tokens` of context in `batch` sequences costs beyond the line.
    pub fn extra(&self, batch: f64, kv_tokens: f64) -> f64 {
        self.per_token * (kv_tokens - batch * self.mean)
    }
}

/// A request's mean context over its decode: its uncached prompt and half its output.
fn context(r: &Request) -> f64 {
    f64::from(r.uncached()) + f64::from(r.output) / 2.0
}

/// The term from the window's requests, against the line `fit`; `None` where the data cannot
/// say it (see the module documentation).
pub fn fit(recent: &[Request], line: &Fit) -> Option<ContextTerm> {
    let used: Vec<(f64, f64, f64, f64)> = recent
        .iter()
        .rev()
        .filter_map(|r| {
            let tps = r.tps.filter(|t| t.is_finite() && *t > 0.0)?;
            let batch = r.batch.filter(|b| b.is_finite() && *b > 0.0)?.max(1.0);
            (r.output >= 2).then(|| (context(r), batch, 1.0 / tps, f64::from(r.output)))
        })
        .take(MAX_REQUESTS)
        .collect();
    if used.len() < MIN_REQUESTS {
        return None;
    }
    let mut contexts: Vec<f64> = used.iter().map(|u| u.0).collect();
    contexts.sort_by(f64::total_cmp);
    let at = |q: f64| contexts[((contexts.len() - 1) as f64 * q).round() as usize];
    let (low, high) = (at(0.1), at(0.9));
    if high < MIN_SPREAD * low.max(1.0) {
        return None;
    }
    let points: Vec<(f64, f64, f64)> = used
        .iter()
        .map(|&(c, b, y, w)| (c, (y - line.step(b)) / b, w))
        .collect();
    let (at_zero, per_token) = weighted_theil_sen(&points)?;
    if !(per_token.is_finite() && per_token * (high - low) >= MIN_EFFECT * line.step(1.0)) {
        return None;
    }
    // Where the line holds, kept within the contexts seen: outside them it is the intercept's
    // guess, not the data's.
    let mean = (-at_zero / per_token).clamp(low, high);
    Some(ContextTerm {
        per_token,
        mean,
        requests: used.len(),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn line() -> Fit {
        Fit {
            base: 0.010,
            per_seq: 0.0005,
            r2: 1.0,
            samples: 1000,
            points: 4,
            min_concurrency: 1,
            slope_error: 0.0,
            central: (1, 64),
            max_concurrency: 8,
        }
    }

    /// A request of `prompt` uncached tokens and `output` tokens, decoded at `batch`, whose
    /// steps took the line's time plus `per_kv` per token of its batch's context.
    fn request(prompt: u32, output: u32, batch: f64, per_kv: f64, mean: f64) -> Request {
        let c = f64::from(prompt) + f64::from(output) / 2.0;
        let step = line().step(batch) + per_kv * batch * (c - mean);
        Request {
            at: Instant::now(),
            arrival: Instant::now(),
            prompt,
            cached: 0,
            output,
            ttft: Some(0.1),
            stated_prefill: None,
            stated_queue: None,
            step_end: None,
            tps: Some(1.0 / step),
            batch: Some(batch),
        }
    }

    #[test]
    fn a_shift_from_short_to_long_contexts_gives_the_slope_it_was_made_with() {
        // Short requests (200-token contexts) made the line, which holds there; long ones (3,100)
        // came later; 1 us per token of context.
        let per_kv = 1e-6;
        let mut recent = Vec::new();
        for i in 0..60u32 {
            let batch = f64::from(1 + i % 6);
            recent.push(request(100, 200, batch, per_kv, 200.0));
            recent.push(request(3000, 200, batch, per_kv, 200.0));
        }
        let term = fit(&recent, &line()).expect("a term");
        assert!((term.per_token / per_kv - 1.0).abs() < 1e-6, "{term:?}");
        assert!((term.mean - 200.0).abs() < 1e-6, "{term:?}");
        // A step of 4 long sequences: 4 x (3,100 - 200) tokens beyond where the line holds.
        assert!((term.extra(4.0, 4.0 * 3100.0) - 4.0 * 2900.0 * per_kv).abs() < 1e-12);
    }

    #[test]
    fn no_term_where_the_data_cannot_say_it() {
        // One context for everyone: no spread.
        let same: Vec<Request> = (0..100)
            .map(|i| request(500, 200, f64::from(1 + i % 4), 1e-6, 600.0))
            .collect();
        assert_eq!(fit(&same, &line()), None);
        // Too few requests.
        let few: Vec<Request> = (0..MIN_REQUESTS as u32 - 1)
            .map(|i| request(100 + 100 * (i % 2) * 30, 200, 2.0, 1e-6, 1000.0))
            .collect();
        assert_eq!(fit(&few, &line()), None);
        // Long contexts that are not slower (a batch that mixes them): no negative term.
        let flat: Vec<Request> = (0..100)
            .map(|i| request(if i % 2 == 0 { 100 } else { 3000 }, 200, 4.0, 0.0, 1650.0))
            .collect();
        assert_eq!(fit(&flat, &line()), None);
        // Requests without a concurrency or a speed say nothing.
        let blind: Vec<Request> = (0..100)
            .map(|i| Request {
                batch: None,
                ..request(if i % 2 == 0 { 100 } else { 3000 }, 200, 4.0, 1e-6, 1650.0)
            })
            .collect();
        assert_eq!(fit(&blind, &line()), None);
    }
}
