//! A prompt's length before anything has counted it: its request body's size, in tokens at the
//! ratio the requests whose prompts were counted showed.
//!
//! The split (`super::ledger`) charges a prompt's prefill while it runs, which is before most
//! streams state their usage (vLLM's comes with the last chunk). Without a tokenizer the body is
//! the one thing known at admission. Its size is a fair measure of a prompt (the JSON around
//! the text is a few hundred bytes, which only a short prompt notices, and a short prompt's
//! prefill is cheap), but bytes per token differ by tokenizer and language (about 4 for English
//! BPE, 1-2 for CJK text), so the ratio is learnt from the counts that come later.

/// Tokens per body byte before any prompt was counted: 4 bytes a token, the usual English BPE.
const PRIOR_TOKENS_PER_BYTE: f64 = 0.25;

/// The prior's weight, in bytes: one 4 KiB prompt outweighs it, so the first counted requests
/// take over at once.
const PRIOR_BYTES: f64 = 1024.0;

/// Each counted request keeps this much of the weight of those before it: about the last
/// hundred requests set the ratio, so a change of traffic moves it within seconds.
const DECAY: f64 = 0.99;

/// The learnt ratio of prompt tokens to body bytes.
#[derive(Debug, Clone, Copy)]
pub struct Estimate {
    tokens: f64,
    bytes: f64,
}

impl Default for Estimate {
    fn default() -> Self {
        Estimate {
            tokens: PRIOR_TOKENS_PER_BYTE * PRIOR_BYTES,
            bytes: PRIOR_BYTES,
        }
    }
}

impl Estimate {
    /// The prompt tokens of a body of `bytes`.
    pub fn tokens(&self, bytes: u64) -> f64 {
        bytes as f64 * self.tokens / self.bytes
    }

    /// A body of `bytes` held a prompt of `tokens` (all of it, cached or not).
    pub fn learn(&mut self, bytes: u64, tokens: u64) {
        if bytes == 0 {
            return;
        }
        self.tokens = self.tokens * DECAY + tokens as f64;
        self.bytes = self.bytes * DECAY + bytes as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_is_learnt_from_counted_prompts() {
        let mut e = Estimate::default();
        assert_eq!(e.tokens(4000), 1000.0);
        // Bodies of 7 bytes a token (a tokenizer with long tokens, JSON around them).
        for _ in 0..20 {
            e.learn(7000, 1000);
        }
        let got = e.tokens(14_000);
        assert!((got - 2000.0).abs() < 2000.0 * 0.01, "{got}");
        // An empty body teaches nothing.
        e.learn(0, 50);
        assert!((e.tokens(14_000) - got).abs() < 1e-9);
    }
}
