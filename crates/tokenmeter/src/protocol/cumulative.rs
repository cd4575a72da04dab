//! Tokens per event from a running total that the stream repeats in its events.
//!
//! vLLM's `continuous_usage_stats`, Gemini's `usageMetadata`, SGLang's `meta_info`, llama.cpp's
//! `tokens_predicted` and watsonx's `generated_token_count` report the output tokens generated so
//! far. The difference between two reports is exactly how many tokens the later event carries,
//! which is what lets the meter spread an inter-token gap over a multi-token event (speculative
//! decoding, stream intervals) instead of taking it for one slow token.
//!
//! A difference is only trusted between two token-bearing events that both carried a report (or
//! from the start of the stream, where the total is 0). Once a token-bearing event arrives without
//! a report, the tokens since the last report are unknown: the next report would otherwise credit
//! them twice, once as counted events and once in the difference.

/// Turns a repeated running total into the tokens each token-bearing event carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cumulative {
    /// The total at the last token-bearing event, when it is known.
    base: Option<u64>,
}

impl Default for Cumulative {
    fn default() -> Self {
        // Before the first event, nothing has been generated.
        Cumulative { base: Some(0) }
    }
}

impl Cumulative {
    /// An event arrived with `total` (if it reported one) and `bearing` tokens by its own content
    /// (0 for an event without output). Returns the tokens it carries: at least `bearing`, and the
    /// growth of the total since the last token-bearing event when that is known.
    pub fn tokens(&mut self, total: Option<u64>, bearing: u32) -> u32 {
        if bearing == 0 {
            return 0;
        }
        let carried = match (self.base, total) {
            (Some(base), Some(t)) => {
                let grown = u32::try_from(t.saturating_sub(base)).unwrap_or(u32::MAX);
                grown.max(bearing)
            }
            _ => bearing,
        };
        self.base = total;
        carried
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[(Option<u64>, u32)]) -> Vec<u32> {
        let mut c = Cumulative::default();
        events.iter().map(|&(t, b)| c.tokens(t, b)).collect()
    }

    #[test]
    fn every_event_reporting_gives_exact_growth() {
        // vLLM: role chunk (0, no output), tokens, a speculative 3-token chunk, then the final
        // empty chunk whose end-of-sequence token no event showed.
        let got = run(&[
            (Some(0), 0),
            (Some(1), 1),
            (Some(2), 1),
            (Some(5), 1),
            (Some(6), 0),
        ]);
        assert_eq!(got, [0, 1, 1, 3, 0]);
    }

    #[test]
    fn first_report_counts_from_zero() {
        // Gemini: the first chunk already holds 68 thinking tokens.
        assert_eq!(run(&[(Some(68), 1), (Some(298), 1)]), [68, 230]);
    }

    #[test]
    fn a_report_after_unreported_events_is_not_credited_twice() {
        // Usage only in the last content chunk: the earlier chunks were already counted.
        assert_eq!(run(&[(None, 1), (None, 1), (Some(40), 1)]), [1, 1, 1]);
        // And reports resume being trusted after that.
        assert_eq!(run(&[(None, 1), (Some(4), 1), (Some(7), 1)]), [1, 1, 3]);
    }

    #[test]
    fn a_total_that_goes_backwards_still_counts_the_event() {
        assert_eq!(run(&[(Some(5), 1), (Some(3), 1)]), [5, 1]);
    }
}
