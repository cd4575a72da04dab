//! Numbers in order of first sight: what the workload trace writes for a prompt block's prefix
//! hash and for a conversation header's value, so a replay sees which recur and nothing of what
//! they were.
//!
//! Bounded: at most [`MAX_REMEMBERED`] values are remembered. Past that the memory starts afresh
//! and numbering goes on from where it was, so no two values ever share a number; a value first
//! seen before the reset gets a new number after it (a replay sees the prefix as new once).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Values remembered before the memory starts afresh: a million 64-bit hashes with their numbers
/// take about 32 MiB at the map's worst load. A million 512-token blocks are half a billion
/// distinct prompt tokens: days of a busy engine's unique prefixes, while the prefixes that recur
/// (system prompts, shared documents) are seen again long before a reset.
pub const MAX_REMEMBERED: usize = 1 << 20;

/// Numbers given out in order of first sight.
#[derive(Debug, Default)]
pub struct FirstSight {
    seen: HashMap<u64, u64, BuildHasherDefault<Unmixed>>,
    next: u64,
    limit: Option<usize>,
}

impl FirstSight {
    /// Remembering at most `limit` values (tests); [`MAX_REMEMBERED`] otherwise.
    pub fn with_limit(limit: usize) -> FirstSight {
        FirstSight {
            limit: Some(limit),
            ..FirstSight::default()
        }
    }

    /// The number of `value`: the one it got when first seen, or the next.
    pub fn number(&mut self, value: u64) -> u64 {
        if let Some(&n) = self.seen.get(&value) {
            return n;
        }
        if self.seen.len() >= self.limit.unwrap_or(MAX_REMEMBERED) {
            self.seen.clear();
        }
        let n = self.fresh();
        self.seen.insert(value, n);
        n
    }

    /// A number no value has: for a block the trace needs but the tokenizer did not give.
    pub fn fresh(&mut self) -> u64 {
        let n = self.next;
        self.next += 1;
        n
    }
}

/// The keys are already hashes (SipHash of a prefix, of a header value): hashing them again
/// would only cost time.
#[derive(Debug, Default)]
pub struct Unmixed(u64);

impl Hasher for Unmixed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_go_by_first_sight_and_never_repeat_after_a_reset() {
        let mut ids = FirstSight::with_limit(3);
        assert_eq!(
            [ids.number(77), ids.number(5), ids.number(77), ids.number(9)],
            [0, 1, 0, 2]
        );
        assert_eq!(ids.fresh(), 3);
        // Full: the memory starts afresh, the numbers go on.
        assert_eq!(ids.number(11), 4);
        assert_eq!(ids.number(77), 5);
        assert_eq!(ids.number(11), 4);
    }
}
