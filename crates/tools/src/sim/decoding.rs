//! How many tokens one engine step makes for a sequence, and so how many one streamed event
//! carries: `--tokens-per-event N` (vLLM's `--stream-interval`, or any engine that sends several
//! tokens at once) and `--spec-acceptance R --spec-tokens K` (speculative decoding).
//!
//! A step is still one forward pass of the batch and one event per sequence; only the tokens it
//! yields change. With N tokens per step a request of `len` tokens finishes in `ceil(len / N)`
//! steps, its last event carrying the rest. Under speculative decoding a draft proposes up to K
//! tokens, each accepted with probability R until the first rejection, and the target model's
//! pass adds one token of its own: a step yields `1 + accepted` tokens, `(1 - R^(K+1)) / (1 - R)`
//! on average (K + 1 at R = 1). The draft never runs past the request's end: with `r` tokens to
//! go it proposes `min(K, r - 1)`.
//!
//! The engine draws each sequence's steps from a [`Steps`], and the response body replays a copy
//! of the same [`Steps`] to know where each event ends, so a slow reader that gets several steps
//! at once still gets one event per step. Both copies are seeded from `--seed` and the request,
//! so the sizes are deterministic as the tokens are ([`super::text`]).

use super::text::Rng;

/// `--tokens-per-event` or `--spec-acceptance`: the tokens each step makes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decoding {
    /// Every step makes this many tokens (at least 1; 1 is plain decoding).
    Fixed(u32),
    /// Speculative decoding: `draft` tokens proposed per step, each accepted with probability
    /// `acceptance` (0 to 1) until the first rejection.
    Speculative { acceptance: f64, draft: u32 },
}

impl Decoding {
    /// One token per step, one per event.
    pub const PLAIN: Decoding = Decoding::Fixed(1);

    pub fn is_speculative(&self) -> bool {
        matches!(self, Decoding::Speculative { .. })
    }

    /// The mean tokens of a step far from a request's end: N, or `(1 - R^(K+1)) / (1 - R)`.
    pub fn mean_tokens(&self) -> f64 {
        match *self {
            Decoding::Fixed(n) => f64::from(n),
            Decoding::Speculative { acceptance, draft } if acceptance >= 1.0 => {
                f64::from(draft) + 1.0
            }
            Decoding::Speculative { acceptance, draft } => {
                let k = i32::try_from(draft).unwrap_or(i32::MAX);
                (1.0 - acceptance.powi(k.saturating_add(1))) / (1.0 - acceptance)
            }
        }
    }
}

impl Default for Decoding {
    fn default() -> Self {
        Decoding::PLAIN
    }
}

/// Reads `--spec-acceptance`: a number from 0 to 1.
pub fn parse_acceptance(s: &str) -> Result<f64, String> {
    let r: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&r) {
        Ok(r)
    } else {
        Err(format!("{s} is not between 0 and 1"))
    }
}

/// What one step made for one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Step {
    /// Tokens made: the event's size.
    pub tokens: u32,
    /// Draft tokens proposed (0 outside speculative decoding, and on a request's last token).
    pub drafted: u32,
    /// Of those, accepted: `tokens - 1` under speculative decoding.
    pub accepted: u32,
}

/// Speculative decoding's tallies, as vLLM counts them: a draft is one step that proposed
/// tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct SpecCounts {
    /// `vllm:spec_decode_num_drafts_total`.
    pub drafts: u64,
    /// `vllm:spec_decode_num_draft_tokens_total`.
    pub draft_tokens: u64,
    /// `vllm:spec_decode_num_accepted_tokens_total`.
    pub accepted_tokens: u64,
}

impl SpecCounts {
    pub fn add(&mut self, s: Step) {
        if s.drafted > 0 {
            self.drafts += 1;
            self.draft_tokens += u64::from(s.drafted);
            self.accepted_tokens += u64::from(s.accepted);
        }
    }

    /// Accepted over proposed (`None` before any draft).
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.draft_tokens > 0).then(|| self.accepted_tokens as f64 / self.draft_tokens as f64)
    }

    /// Tokens per draft step: 1 + accepted per draft (`None` before any draft).
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        (self.drafts > 0).then(|| 1.0 + self.accepted_tokens as f64 / self.drafts as f64)
    }
}

/// The steps of one sequence: a [`Decoding`] and its own random stream. Clones draw the same
/// sizes when asked with the same remaining counts.
#[derive(Debug, Clone)]
pub struct Steps {
    decoding: Decoding,
    rng: Rng,
}

impl Steps {
    pub fn new(decoding: Decoding, seed: u64) -> Self {
        Steps {
            decoding,
            rng: Rng::new(seed),
        }
    }

    pub fn decoding(&self) -> Decoding {
        self.decoding
    }

    /// The next step of a sequence with `remaining` tokens to go: never more than that (0 when
    /// nothing remains), at least 1 otherwise.
    pub fn next(&mut self, remaining: u32) -> Step {
        if remaining == 0 {
            return Step::default();
        }
        match self.decoding {
            Decoding::Fixed(n) => Step {
                tokens: n.clamp(1, remaining),
                ..Step::default()
            },
            Decoding::Speculative { acceptance, draft } => {
                let drafted = draft.min(remaining - 1);
                let mut accepted = 0;
                while accepted < drafted && self.accept(acceptance) {
                    accepted += 1;
                }
                Step {
                    tokens: 1 + accepted,
                    drafted,
                    accepted,
                }
            }
        }
    }

    /// True with probability `p`: a uniform draw from [0, 1) on 53 bits is below it (never at
    /// 0, always at 1).
    fn accept(&mut self, p: f64) -> bool {
        let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        u < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes of a whole request of `len` tokens.
    fn sizes(decoding: Decoding, seed: u64, len: u32) -> Vec<u32> {
        let mut s = Steps::new(decoding, seed);
        let mut out = Vec::new();
        let mut left = len;
        while left > 0 {
            let step = s.next(left);
            out.push(step.tokens);
            left -= step.tokens;
        }
        out
    }

    #[test]
    fn fixed_sizes_add_up_and_the_last_event_carries_the_rest() {
        let s = sizes(Decoding::Fixed(3), 0, 200);
        assert_eq!(s.len(), 67, "ceil(200 / 3) events");
        assert_eq!(s.iter().sum::<u32>(), 200);
        assert!(s[..66].iter().all(|&n| n == 3));
        assert_eq!(s[66], 2);
        assert_eq!(sizes(Decoding::Fixed(3), 0, 201), vec![3; 67]);
        assert_eq!(sizes(Decoding::Fixed(5), 0, 3), vec![3]);
        assert_eq!(sizes(Decoding::PLAIN, 0, 4), vec![1; 4]);
        let mut s = Steps::new(Decoding::Fixed(4), 0);
        assert_eq!(s.next(0), Step::default());
        assert_eq!(
            s.next(9),
            Step {
                tokens: 4,
                drafted: 0,
                accepted: 0
            }
        );
    }

    #[test]
    fn speculative_sizes_add_up_and_never_overshoot() {
        let d = Decoding::Speculative {
            acceptance: 0.8,
            draft: 4,
        };
        for len in [1, 2, 5, 17, 200, 1000] {
            let s = sizes(d, len.into(), len);
            assert_eq!(s.iter().sum::<u32>(), len, "{len}");
            assert!(s.iter().all(|&n| (1..=5).contains(&n)), "{s:?}");
        }
        // With one token to go nothing is drafted: the target's own token ends it.
        let mut s = Steps::new(d, 1);
        assert_eq!(
            s.next(1),
            Step {
                tokens: 1,
                drafted: 0,
                accepted: 0
            }
        );
        // Two to go: one draft token at most.
        let st = s.next(2);
        assert_eq!(st.drafted, 1);
        assert_eq!(st.tokens, 1 + st.accepted);
        // The extremes: all accepted, none accepted.
        let all = Decoding::Speculative {
            acceptance: 1.0,
            draft: 4,
        };
        assert_eq!(sizes(all, 0, 12), vec![5, 5, 2]);
        let none = Decoding::Speculative {
            acceptance: 0.0,
            draft: 4,
        };
        assert_eq!(sizes(none, 0, 6), vec![1; 6]);
    }

    #[test]
    fn the_same_seed_gives_the_same_sizes_and_a_clone_replays_them() {
        let d = Decoding::Speculative {
            acceptance: 0.6,
            draft: 3,
        };
        assert_eq!(sizes(d, 7, 500), sizes(d, 7, 500));
        assert_ne!(sizes(d, 7, 500), sizes(d, 8, 500));
        let mut a = Steps::new(d, 3);
        let _ = a.next(100);
        let mut b = a.clone();
        for left in [99, 50, 2, 1] {
            assert_eq!(a.next(left), b.next(left));
        }
    }

    /// The mean step size over many draws matches `(1 - r^(K+1)) / (1 - r)`: 100,000 steps with
    /// seed 42 for each rate, within 1% (the standard error of the mean is below 0.5% of it for
    /// every rate here).
    #[test]
    fn the_speculative_mean_matches_the_formula() {
        for (r, k) in [
            (0.0, 4),
            (0.3, 4),
            (0.5, 4),
            (0.7, 4),
            (0.9, 4),
            (0.8, 2),
            (0.6, 7),
        ] {
            let d = Decoding::Speculative {
                acceptance: r,
                draft: k,
            };
            let mut s = Steps::new(d, 42);
            let mut counts = SpecCounts::default();
            let n = 100_000u32;
            let mut tokens = 0u64;
            for _ in 0..n {
                // Far from the end: the draft is never cut.
                let step = s.next(u32::MAX);
                assert_eq!(step.drafted, k);
                tokens += u64::from(step.tokens);
                counts.add(step);
            }
            let mean = tokens as f64 / f64::from(n);
            let expect = (1.0 - f64::powi(r, k as i32 + 1)) / (1.0 - r);
            assert!((d.mean_tokens() - expect).abs() < 1e-12);
            assert!(
                (mean / expect - 1.0).abs() < 0.01,
                "r {r}, K {k}: mean {mean}, expected {expect}"
            );
            assert_eq!(counts.drafts, u64::from(n));
            assert_eq!(counts.draft_tokens, u64::from(n) * u64::from(k));
            assert_eq!(counts.accepted_tokens, tokens - u64::from(n));
            let len = counts.mean_acceptance_length().expect("drafts");
            assert!((len - mean).abs() < 1e-9);
        }
        let all = Decoding::Speculative {
            acceptance: 1.0,
            draft: 4,
        };
        assert_eq!(all.mean_tokens(), 5.0);
        assert_eq!(Decoding::Fixed(3).mean_tokens(), 3.0);
    }

    #[test]
    fn acceptance_parses_from_0_to_1() {
        assert_eq!(parse_acceptance("0.75"), Ok(0.75));
        assert_eq!(parse_acceptance("0"), Ok(0.0));
        assert_eq!(parse_acceptance("1"), Ok(1.0));
        for bad in ["1.01", "-0.1", "NaN", "lots", ""] {
            assert!(parse_acceptance(bad).is_err(), "{bad}");
        }
    }
}
