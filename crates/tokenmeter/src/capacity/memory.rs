//! The memory end of the capacity answer: the engine's KV cache and its cap on sequences.
//!
//! Decode speed and prefill are two bottlenecks; the third is memory. Every running sequence
//! holds its context in the KV cache (its uncached prompt and the answer so far, in blocks of
//! the engine's block size), and an engine whose cache is full cannot admit a new request: it
//! queues it, and when a running sequence needs a block that is not there, it preempts the
//! newest one and recomputes it later (vLLM's scheduler). With long contexts this binds long
//! before decode speed does.
//!
//! Two numbers describe it: the cache's size in tokens and the block size, from the engine's
//! own metrics (`--engine-metrics`) or the flags (`--kv-cache-tokens`, `--block-size`); and the
//! engine's cap on running sequences (`--max-num-seqs`). The flags win where both are given,
//! so an operator can correct an engine that states its cache wrongly.
//!
//! From the live mix the model takes each request's **footprint over its life**: a request
//! with `p` uncached prompt tokens and `o` output tokens holds `ceil((p + k - 1) / B)` blocks
//! while it makes its `k`-th token (the step that makes token `k` computes the KV of the
//! prompt, or of token `k - 1`). A closed-loop client spends its time in requests in proportion to
//! their output, so the blocks one client holds on average are the sum of those footprints
//! over the mix divided by its output tokens; the `kv_cache` bound is the number of such
//! clients the cache holds. The replay ([`super::replay`]) admits by blocks and preempts as the
//! engine does, so the first-token bound includes the wait for memory too.
//!
//! Prompt tokens the prefix cache served are not counted: they sit in blocks shared with other
//! requests, which a per-request footprint cannot apportion (the wire's view of memory beside
//! the engine's own usage shows how much sharing there is).

/// `--block-size`'s default, vLLM's on GPUs: 16 tokens a block.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

/// What the engine's memory holds, as far as it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// The KV cache's size in tokens; `None`: not known, no memory bound.
    pub kv_cache_tokens: Option<u64>,
    /// Tokens per KV block (at least 1).
    pub block_size: u32,
    /// The engine's cap on running sequences; `None`: not known.
    pub max_num_seqs: Option<u32>,
}

impl Memory {
    /// Nothing known: no memory bound.
    pub const UNKNOWN: Memory = Memory {
        kv_cache_tokens: None,
        block_size: DEFAULT_BLOCK_SIZE,
        max_num_seqs: None,
    };
}

impl Default for Memory {
    fn default() -> Self {
        Memory::UNKNOWN
    }
}

/// What one source says about the memory; any field may be missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stated {
    pub kv_cache_tokens: Option<u64>,
    pub block_size: Option<u32>,
    pub max_num_seqs: Option<u32>,
}

impl Stated {
    /// `self` where it says something, `engine` where it does not: the flags over the engine.
    pub fn over(self, engine: Stated) -> Memory {
        // A zero says nothing (a flag left at 0, an engine that has not allocated yet).
        fn first<T: Default + PartialEq>(a: Option<T>, b: Option<T>) -> Option<T> {
            a.filter(|v| *v != T::default())
                .or(b.filter(|v| *v != T::default()))
        }
        Memory {
            kv_cache_tokens: first(self.kv_cache_tokens, engine.kv_cache_tokens),
            block_size: first(self.block_size, engine.block_size).unwrap_or(DEFAULT_BLOCK_SIZE),
            max_num_seqs: first(self.max_num_seqs, engine.max_num_seqs),
        }
    }
}

impl Memory {
    /// Whole blocks in the cache; `None` when its size is not known.
    pub fn blocks(&self) -> Option<u64> {
        self.kv_cache_tokens
            .map(|t| t / u64::from(self.block_size.max(1)))
    }

    /// Blocks that `tokens` tokens of one sequence take.
    pub fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(u64::from(self.block_size.max(1)))
    }

    /// The blocks a closed-loop client holds on average over a mix of `(uncached prompt,
    /// output)` lengths (see the module docs); `None` without a request.
    pub fn mean_blocks(&self, mix: impl IntoIterator<Item = (u32, u32)>) -> Option<f64> {
        let b = u64::from(self.block_size.max(1));
        let (mut held, mut steps) = (0u128, 0u128);
        for (uncached, output) in mix {
            let (p, o) = (u64::from(uncached), u64::from(output.max(1)));
            // Contexts p ..= p + o - 1.
            let upto = ceil_sum((p + o).saturating_sub(1), b);
            held += u128::from(upto - ceil_sum(p.saturating_sub(1), b));
            steps += u128::from(o);
        }
        (steps > 0).then(|| held as f64 / steps as f64)
    }

    /// The closed-loop clients of the mix the cache holds: its blocks over a client's mean
    /// footprint, to the nearest whole client; `None` when the cache's size is not known or
    /// there is no request.
    ///
    /// Nearest, not down: the footprint is a mean over each request's life, and clients are
    /// at different points of theirs, so a cache that the mean overfills by less than half a
    /// client is full only at moments, which the engine absorbs with a preemption near the
    /// end of someone's answer and no missed first token. Against the simulator
    /// (`tests/it/memory_capacity.rs`: 3.9 clients' worth, four met a 1 s TTFT with
    /// preemptions, six did not) and against vLLM (a CPU vLLM here: 3.6 clients' worth, four
    /// met the class, six did not) rounding down answers one client short of the edge.
    pub fn kv_limit(&self, mix: impl IntoIterator<Item = (u32, u32)>) -> Option<u32> {
        let blocks = self.blocks()? as f64;
        let mean = self.mean_blocks(mix)?;
        let n = (blocks / mean.max(1.0)).round();
        Some(n.clamp(0.0, f64::from(u32::MAX)) as u32)
    }
}

/// `sum over t in 1..=n of ceil(t / b)`: with `n = q b + r`, each of the first `q` runs of
/// `b` adds `b x i` and the last `r` add `q + 1` each.
fn ceil_sum(n: u64, b: u64) -> u64 {
    let (q, r) = (n / b, n % b);
    b * q * (q + 1) / 2 + r * (q + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(tokens: u64, block: u32) -> Memory {
        Memory {
            kv_cache_tokens: Some(tokens),
            block_size: block,
            max_num_seqs: None,
        }
    }

    #[test]
    fn the_sum_of_ceilings_is_the_sum_it_stands_for() {
        for b in [1, 3, 16] {
            for n in 0..100 {
                let direct: u64 = (1..=n).map(|t: u64| t.div_ceil(b)).sum();
                assert_eq!(ceil_sum(n, b), direct, "n={n} b={b}");
            }
        }
    }

    #[test]
    fn a_client_holds_its_prompt_and_half_its_answer_on_average() {
        // 256 prompt tokens and 490 out in blocks of 128: 256..=745 tokens held, blocks 2..=6.
        let m = memory(2048, 128);
        let jobs = [(256, 490)];
        let direct: u64 = (256..=745u64).map(|t| t.div_ceil(128)).sum();
        let mean = m.mean_blocks(jobs).expect("a mean");
        assert!((mean - direct as f64 / 490.0).abs() < 1e-12, "{mean}");
        // 16 blocks over about 4.4 a client: 3.6 clients' worth, four to the nearest (issue
        // 38's vLLM case, where four met the class and six did not).
        assert_eq!(m.kv_limit(jobs), Some(4));
        // 14 blocks: 3.2, three.
        assert_eq!(memory(14 * 128, 128).kv_limit(jobs), Some(3));
        // Exactly full: 4 clients of one block each in a 4-block cache.
        let one = [(8, 8)];
        assert_eq!(memory(64, 16).kv_limit(one), Some(4));
    }

    #[test]
    fn long_answers_weigh_by_their_time_in_the_batch() {
        // A short request and a long one: the long one is where a client spends its time.
        let m = memory(1 << 20, 1);
        let jobs = [(0, 1), (0, 99)];
        // Held: 0, and 0..=98 (4,851); over 100 steps.
        assert!((m.mean_blocks(jobs).expect("a mean") - 48.51).abs() < 1e-9);
        assert_eq!(m.mean_blocks([]), None);
        assert_eq!(Memory::default().kv_limit(jobs), None);
    }

    #[test]
    fn the_flags_win_over_the_engine_and_zero_says_nothing() {
        let engine = Stated {
            kv_cache_tokens: Some(2048),
            block_size: Some(128),
            max_num_seqs: Some(8),
        };
        let flags = Stated {
            kv_cache_tokens: Some(4096),
            ..Stated::default()
        };
        assert_eq!(
            flags.over(engine),
            Memory {
                kv_cache_tokens: Some(4096),
                block_size: 128,
                max_num_seqs: Some(8)
            }
        );
        let zero = Stated {
            kv_cache_tokens: Some(0),
            block_size: Some(0),
            max_num_seqs: Some(0),
        };
        assert_eq!(zero.over(Stated::default()), Memory::default());
        assert_eq!(zero.over(engine), Stated::default().over(engine));
        assert_eq!(memory(2048, 128).blocks(), Some(16));
    }
}
