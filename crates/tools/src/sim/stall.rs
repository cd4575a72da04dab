//! `--stall-every N`: every Nth request pauses once, mid-stream, for `--stall-for` (default 1 s),
//! after `--stall-after` tokens, as a sequence does when a real engine preempts it (its KV cache
//! evicted under memory pressure) or a network path hiccups.
//!
//! A paused sequence leaves the batch, so the other sequences' steps get cheaper meanwhile, and
//! its own next token comes a whole pause after the last: the outliers a capacity fit has to
//! shrug off. Which requests stall depends only on their number, so a run is reproducible.

use std::time::Duration;

/// Which requests pause, when, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// Requests number `every`, `2 x every`, ... pause (at least 1).
    pub every: u64,
    /// Tokens a stalling request emits before its pause.
    pub after_tokens: u32,
    pub pause: Duration,
}

impl Stall {
    /// The pause of request number `id` (numbered from 1), if it has one: `(after how many
    /// tokens, for how long)`.
    pub fn of_request(&self, id: u64) -> Option<(u32, Duration)> {
        (self.every > 0 && id % self.every == 0).then_some((self.after_tokens, self.pause))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nth_request_stalls() {
        let s = Stall {
            every: 3,
            after_tokens: 5,
            pause: Duration::from_secs(1),
        };
        let stalling: Vec<u64> = (1..=10).filter(|&id| s.of_request(id).is_some()).collect();
        assert_eq!(stalling, [3, 6, 9]);
        assert_eq!(s.of_request(6), Some((5, Duration::from_secs(1))));
    }
}
