//! One stream's observations for the capacity model: the gap before each frame of tokens.
//!
//! Events that pass the proxy at the same instant came in one network read: the server (or a
//! client that read late) coalesced them, and only the first of them had a gap before it. Pushed
//! one by one they would read as one slow token followed by several that took no time at all,
//! which drags the per-concurrency medians apart; so the events of one instant are grouped, and
//! the group is pushed as `gap / tokens` once the next instant (or the end) shows it is complete.
//! Tokens that arrive at the same instant as the stream's first token share its wait (TTFT, not
//! a decode step) and are not observed.

use std::time::{Duration, Instant};

/// Where a stream's groups of tokens go: the capacity model ([`super::Capacity`]), which
/// implements it. A trait of this file's own, so the stream's bookkeeping needs nothing of the
/// model's module.
pub trait Gaps {
    /// `tokens` tokens came `gap` after the previous ones, while `decoding` requests decoded.
    fn push(&self, decoding: f64, gap: Duration, tokens: u32, at: Instant);
}

/// A group of tokens waiting to be pushed.
#[derive(Debug, Clone, Copy)]
struct Group {
    gap: Duration,
    tokens: u32,
    decoding: f64,
    at: Instant,
}

/// Per-stream state between token-bearing events.
#[derive(Debug, Default)]
pub struct StreamGaps {
    last: Option<Instant>,
    pending: Option<Group>,
}

impl StreamGaps {
    /// A token-bearing event carrying `tokens` passed at `now`, while `decoding` requests
    /// (this one included) were decoding.
    pub fn on_tokens(&mut self, cap: &impl Gaps, tokens: u32, decoding: f64, now: Instant) {
        let Some(last) = self.last else {
            self.last = Some(now);
            return;
        };
        if now <= last {
            if let Some(p) = &mut self.pending {
                p.tokens = p.tokens.saturating_add(tokens);
            }
            return;
        }
        self.flush(cap);
        self.pending = Some(Group {
            gap: now - last,
            tokens,
            decoding,
            at: now,
        });
        self.last = Some(now);
    }

    /// The stream ended: push what is pending.
    pub fn finish(&mut self, cap: &impl Gaps) {
        self.flush(cap);
    }

    fn flush(&mut self, cap: &impl Gaps) {
        if let Some(p) = self.pending.take() {
            cap.push(p.decoding, p.gap, p.tokens, p.at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::{Capacity, Inputs};

    #[test]
    fn a_coalesced_frame_is_one_observation_of_its_gap_over_its_tokens() {
        let t0 = Instant::now();
        let cap = Capacity::new(Inputs::default(), t0);
        let ms = |n| t0 + Duration::from_millis(n);
        let mut s = StreamGaps::default();
        // The first token and one more in the same read: no observation.
        s.on_tokens(&cap, 1, 4.0, ms(100));
        s.on_tokens(&cap, 1, 4.0, ms(100));
        // Steady 20 ms tokens, then a late read that brings four at once 80 ms later.
        for k in 1..=30 {
            s.on_tokens(&cap, 1, 4.0, ms(100 + 20 * k));
        }
        for _ in 0..4 {
            s.on_tokens(&cap, 1, 4.0, ms(100 + 20 * 30 + 80));
        }
        s.finish(&cap);
        let cols = cap.steps.columns(ms(1000));
        assert_eq!(cols.len(), 1);
        // 30 single tokens and a group of 4: 34 samples, every one 20 ms.
        assert_eq!((cols[0].concurrency, cols[0].samples), (4, 34));
        assert!((cols[0].median / 0.020 - 1.0).abs() < 0.03, "{:?}", cols[0]);
        // The decoding time: 30 gaps of 20 ms and one of 80 ms.
        let busy = cap.busy.mean(ms(2000));
        assert!((busy - 0.68 / 2.0).abs() < 1e-9, "{busy}");
    }
}
