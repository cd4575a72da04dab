//! The simulated engine's KV cache (`--kv-cache-tokens`, `--block-size`): a count of blocks,
//! and the rule that decides who gets them, as vLLM V1's scheduler does.
//!
//! A sequence holds `ceil(context / block_size)` blocks, its context being its prompt and the
//! tokens it has generated. Each step:
//!
//! 1. every running sequence, in the order it was admitted, gets the blocks the token it
//!    computes this step needs; when none are free, the running sequence admitted last is
//!    *preempted*: all its blocks are freed and it goes back to the front of the queue (which
//!    may be the sequence asking, when it is the last);
//! 2. then waiting sequences are admitted in order while fewer than `--max-num-seqs` run and
//!    the head of the queue's whole context fits in the free blocks (a preempted sequence
//!    *recomputes*: its prefill is its prompt and what it had generated; what it streamed is
//!    not sent again). The first that does not fit stops admission, so order is kept.
//!
//! So memory shows where vLLM shows it: a full cache is queueing in TTFT and preemptions in
//! the decode, and `/metrics` states `vllm:kv_cache_usage_perc`, `vllm:num_preemptions_total`
//! and `vllm:cache_config_info` for tests to hold tokenmeter's own view against.

/// `--kv-cache-tokens` and `--block-size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvConfig {
    /// Tokens the cache holds; a whole number of blocks is used.
    pub tokens: u32,
    /// Tokens per block (vLLM's `--block-size`, 16 by default).
    pub block_size: u32,
}

/// vLLM's default `--block-size`.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

/// The blocks of the cache: how many there are and how many are taken.
#[derive(Debug)]
pub struct KvCache {
    block_size: u32,
    total: u32,
    used: u32,
}

impl KvCache {
    pub fn new(cfg: KvConfig) -> Self {
        let block_size = cfg.block_size.max(1);
        KvCache {
            block_size,
            total: cfg.tokens / block_size,
            used: 0,
        }
    }

    /// Blocks that `tokens` tokens of context take.
    pub fn blocks_for(&self, tokens: u64) -> u32 {
        u32::try_from(tokens.div_ceil(u64::from(self.block_size))).unwrap_or(u32::MAX)
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn used(&self) -> u32 {
        self.used
    }

    pub fn free(&self) -> u32 {
        self.total - self.used
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Takes `n` blocks if that many are free.
    pub fn take(&mut self, n: u32) -> bool {
        if n > self.free() {
            return false;
        }
        self.used += n;
        true
    }

    /// Gives back `n` blocks.
    pub fn give(&mut self, n: u32) {
        self.used = self.used.saturating_sub(n);
    }

    /// The share of blocks taken, 0 to 1 (`vllm:kv_cache_usage_perc`, which is a ratio
    /// despite its name).
    pub fn usage(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        f64::from(self.used) / f64::from(self.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_up_and_the_count_is_kept() {
        let mut kv = KvCache::new(KvConfig {
            tokens: 100,
            block_size: 16,
        });
        // 100 tokens are 6 whole blocks; the 4 left over are not a block.
        assert_eq!(kv.total(), 6);
        assert_eq!(kv.blocks_for(0), 0);
        assert_eq!(kv.blocks_for(1), 1);
        assert_eq!(kv.blocks_for(16), 1);
        assert_eq!(kv.blocks_for(17), 2);
        assert!(kv.take(4));
        assert!(!kv.take(3), "2 free");
        assert_eq!((kv.used(), kv.free()), (4, 2));
        assert!((kv.usage() - 4.0 / 6.0).abs() < 1e-12);
        kv.give(4);
        assert_eq!(kv.used(), 0);
    }
}
