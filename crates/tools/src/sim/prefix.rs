//! The prefix cache: the share of a prompt whose KV is read from earlier requests rather than
//! computed, so the step that admits the prompt is not charged its prefill.
//!
//! It is one of two kinds, or none ([`PrefixCaching`]):
//!
//! - `--prefix-cache-hit-rate` serves a fixed share of every prompt ([`PrefixCache`]).
//! - `--prefix-cache-tokens` learns from the prompts themselves, as vLLM's automatic prefix
//!   caching does ([`BlockCache`]): a prompt's text is cut into blocks of [`PREFIX_BLOCK_TOKENS`]
//!   tokens, each keyed by a hash of its text and of every block before it ([`BlockKeys`]), so a
//!   block is found only under the same prefix; a prompt's cached tokens are its leading blocks
//!   found in the cache, and then its blocks are kept, the least recently used evicted first.
//!   Replaying a recorded workload so reproduces the hits its shared prefixes made.
//!
//! **Invariant:** a prompt is looked up once, when its request arrives, never per token; the
//! cache holds at most `--prefix-cache-tokens / PREFIX_BLOCK_TOKENS` keys.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::engine::Job;
use super::text::{Fnv, CHARS_PER_TOKEN};

/// `--prefix-cache-hit-rate`: the share of every prompt's tokens served from the prefix cache.
///
/// Held in millionths, so the cached count is exact integer arithmetic: `floor(prompt x rate)`
/// for any rate given to six decimals, with no float rounding a 0.29 down to 0.28999.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixCache {
    millionths: u32,
}

/// [`PrefixCache`]'s unit.
const MILLION: u32 = 1_000_000;

impl PrefixCache {
    /// No prompt token is cached.
    pub const OFF: PrefixCache = PrefixCache { millionths: 0 };

    /// A hit rate from 0 to 1 (rounded to a millionth); `None` outside that range.
    pub fn new(rate: f64) -> Option<PrefixCache> {
        (0.0..=1.0).contains(&rate).then(|| PrefixCache {
            millionths: (rate * f64::from(MILLION)).round() as u32,
        })
    }

    /// The hit rate, 0 to 1.
    pub fn rate(&self) -> f64 {
        f64::from(self.millionths) / f64::from(MILLION)
    }

    pub fn is_off(&self) -> bool {
        self.millionths == 0
    }

    /// The tokens of a `prompt_tokens` prompt served from the cache: `floor(prompt x rate)`.
    pub fn cached(&self, prompt_tokens: u32) -> u32 {
        let c = u64::from(prompt_tokens) * u64::from(self.millionths) / u64::from(MILLION);
        // At most prompt_tokens, since millionths is at most a million.
        u32::try_from(c).unwrap_or(prompt_tokens)
    }

    /// The job for a prompt: its cached share taken from the cache.
    pub fn job(&self, prompt_tokens: u32, output_tokens: u32) -> Job {
        Job {
            prompt_tokens,
            cached_tokens: self.cached(prompt_tokens),
            output_tokens,
        }
    }
}

/// Reads `--prefix-cache-hit-rate`: a number from 0 to 1.
pub fn parse_hit_rate(s: &str) -> Result<PrefixCache, String> {
    let rate: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    PrefixCache::new(rate).ok_or_else(|| format!("{s} is not between 0 and 1"))
}

/// Tokens per block of the learnt prefix cache: vLLM's default `--block-size`, the unit its
/// automatic prefix caching hashes, shares and evicts.
pub const PREFIX_BLOCK_TOKENS: u32 = 16;

/// Characters of prompt text per block: the simulator counts a prompt's tokens as its characters
/// over [`CHARS_PER_TOKEN`] ([`super::text::estimate_tokens`]), so a block of 16 tokens is 64
/// characters of the text it counts.
pub const PREFIX_BLOCK_CHARS: usize = PREFIX_BLOCK_TOKENS as usize * CHARS_PER_TOKEN;

/// Where a prompt's cached tokens come from: the one prefix cache the flags chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixCaching {
    /// `--prefix-cache-hit-rate`: a fixed share of every prompt; [`PrefixCache::OFF`] (the
    /// default) caches nothing.
    Rate(PrefixCache),
    /// `--prefix-cache-tokens`: the leading blocks earlier prompts left in a [`BlockCache`] of
    /// this many tokens.
    Blocks { tokens: u32 },
}

impl Default for PrefixCaching {
    fn default() -> Self {
        PrefixCaching::Rate(PrefixCache::OFF)
    }
}

impl PrefixCaching {
    /// Whether any prompt token can be served from a cache (and the usage states how many were).
    pub fn is_on(&self) -> bool {
        match self {
            PrefixCaching::Rate(r) => !r.is_off(),
            PrefixCaching::Blocks { tokens } => *tokens > 0,
        }
    }

    /// `--prefix-cache-hit-rate` (0 with the learnt cache).
    pub fn rate(&self) -> f64 {
        match self {
            PrefixCaching::Rate(r) => r.rate(),
            PrefixCaching::Blocks { .. } => 0.0,
        }
    }

    /// `--prefix-cache-tokens` (0 with a hit rate).
    pub fn tokens(&self) -> u32 {
        match self {
            PrefixCaching::Rate(_) => 0,
            PrefixCaching::Blocks { tokens } => *tokens,
        }
    }
}

/// A running server's prefix cache, in the kind its flags chose: what a request's cached tokens
/// are.
#[derive(Debug)]
pub enum PrefixLookup {
    Rate(PrefixCache),
    /// Locked once per request, for the lookup and the insertion of its blocks.
    Blocks(Mutex<BlockCache>),
}

impl PrefixLookup {
    pub fn new(caching: PrefixCaching) -> Self {
        match caching {
            PrefixCaching::Rate(r) => PrefixLookup::Rate(r),
            PrefixCaching::Blocks { tokens } => {
                PrefixLookup::Blocks(Mutex::new(BlockCache::new(tokens)))
            }
        }
    }

    /// Whether a lookup reads the prompt's [`BlockKeys`] (so they are worth computing).
    pub fn wants_keys(&self) -> bool {
        matches!(self, PrefixLookup::Blocks(_))
    }

    /// The job for a prompt of `prompt_tokens` tokens whose full blocks have `keys` (read only
    /// by the learnt cache): its cached tokens taken from the cache.
    pub fn job(&self, prompt_tokens: u32, keys: &[u64], output_tokens: u32) -> Job {
        let cached_tokens = match self {
            PrefixLookup::Rate(r) => r.cached(prompt_tokens),
            PrefixLookup::Blocks(cache) => cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .serve(keys, prompt_tokens),
        };
        Job {
            prompt_tokens,
            cached_tokens,
            output_tokens,
        }
    }
}

/// The keys of a prompt's full blocks of [`PREFIX_BLOCK_CHARS`] characters, written one string
/// of its text at a time (the strings' characters joined, as they are counted). A block's key is
/// a hash of its text seeded with the key before it, so equal keys mean equal text from the
/// prompt's start, as vLLM chains its block hashes. A partial last block has no key.
#[derive(Debug, Clone, Default)]
pub struct BlockKeys {
    keys: Vec<u64>,
    /// The block being filled: its hash so far, and its characters.
    open: Fnv,
    chars: usize,
}

impl BlockKeys {
    pub fn write(&mut self, s: &str) {
        let mut from = 0;
        for (at, c) in s.char_indices() {
            self.chars += 1;
            if self.chars == PREFIX_BLOCK_CHARS {
                let to = at + c.len_utf8();
                self.open.write(&s.as_bytes()[from..to]);
                from = to;
                let key = self.open.finish();
                self.keys.push(key);
                self.open = Fnv::default();
                self.open.write(&key.to_le_bytes());
                self.chars = 0;
            }
        }
        self.open.write(&s.as_bytes()[from..]);
    }

    /// The keys of the full blocks, first to last.
    pub fn finish(self) -> Vec<u64> {
        self.keys
    }
}

/// `--prefix-cache-tokens`: the blocks earlier prompts left, at most a fixed number of them, the
/// least recently used evicted first. Only the keys are held (the simulator has no KV to keep),
/// so its memory is bounded by its size in blocks.
#[derive(Debug)]
pub struct BlockCache {
    /// Blocks held at most.
    capacity: usize,
    /// Each block's key, and when it was last used.
    used: HashMap<u64, u64>,
    /// The same blocks by when they were last used: the first is the next evicted.
    by_age: BTreeMap<u64, u64>,
    /// Counts uses: the time of [`BlockCache::used`].
    clock: u64,
}

impl BlockCache {
    /// A cache of `tokens` tokens' worth of whole blocks.
    pub fn new(tokens: u32) -> Self {
        BlockCache {
            capacity: (tokens / PREFIX_BLOCK_TOKENS) as usize,
            used: HashMap::new(),
            by_age: BTreeMap::new(),
            clock: 0,
        }
    }

    /// Blocks it holds now.
    pub fn len(&self) -> usize {
        self.used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    /// The cached tokens of a prompt of `prompt_tokens` tokens whose full blocks have `keys`:
    /// its leading blocks found here, at most all its tokens but the last (vLLM always computes
    /// that one, for the logits of the first output token). Then its blocks are kept, as used
    /// now.
    pub fn serve(&mut self, keys: &[u64], prompt_tokens: u32) -> u32 {
        let hits = keys
            .iter()
            .take_while(|k| self.used.contains_key(k))
            .count();
        // Last first, so that a prompt's first blocks are the last of it evicted (vLLM frees a
        // request's blocks tail first): an evicted block hides every block after it, which
        // can then only be found behind it. Blocks past the capacity would be evicted at once.
        let keep = keys.len().min(self.capacity);
        for &key in keys[..keep].iter().rev() {
            self.touch(key);
        }
        let tokens = u32::try_from(hits)
            .unwrap_or(u32::MAX)
            .saturating_mul(PREFIX_BLOCK_TOKENS);
        tokens.min(prompt_tokens.saturating_sub(1))
    }

    /// Marks a block used now (adding it if new), evicting the least recently used past the
    /// capacity.
    fn touch(&mut self, key: u64) {
        self.clock += 1;
        if let Some(before) = self.used.insert(key, self.clock) {
            self.by_age.remove(&before);
        }
        self.by_age.insert(self.clock, key);
        while self.used.len() > self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.used.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cached_share_is_floor_of_prompt_times_rate_exactly() {
        let c = |rate: &str, prompt: u32| parse_hit_rate(rate).expect("valid").cached(prompt);
        assert_eq!(c("0", 2000), 0);
        assert_eq!(c("0.9", 2000), 1800);
        // 100 x 0.29 is 28.999999999999996 in floats; the cache holds millionths: 29.
        assert_eq!(c("0.29", 100), 29);
        assert_eq!(c("0.5", 7), 3);
        assert_eq!(c("1", 1234), 1234);
        assert_eq!(c("0.333333", 3), 0);
        assert_eq!(parse_hit_rate("0.25").expect("valid").rate(), 0.25);
        assert!(parse_hit_rate("1.01").is_err());
        assert!(parse_hit_rate("-0.1").is_err());
        assert!(parse_hit_rate("NaN").is_err());
        assert!(parse_hit_rate("lots").is_err());
        assert!(PrefixCache::new(0.0).expect("valid").is_off());
    }

    /// The keys of one prompt written as one string.
    fn keys(text: &str) -> Vec<u64> {
        let mut k = BlockKeys::default();
        k.write(text);
        k.finish()
    }

    /// `n` characters of text that never repeats a 64-character block, from `seed`.
    fn text(seed: u64, n: usize) -> String {
        let mut rng = super::super::text::Rng::new(seed);
        (0..n)
            .map(|_| char::from(b'a' + (rng.next_u64() % 26) as u8))
            .collect()
    }

    #[test]
    fn a_block_is_sixty_four_characters_and_only_full_blocks_have_keys() {
        assert_eq!(PREFIX_BLOCK_CHARS, 64);
        assert_eq!(keys(&text(1, 63)).len(), 0);
        assert_eq!(keys(&text(1, 64)).len(), 1);
        assert_eq!(keys(&text(1, 200)).len(), 3);
        // Characters, not bytes, as the prompt's tokens are counted: 64 two-byte characters.
        assert_eq!(keys(&"é".repeat(64)).len(), 1);
        assert_eq!(keys(&"é".repeat(63)).len(), 0);
    }

    #[test]
    fn the_keys_do_not_depend_on_where_the_strings_are_cut() {
        let t = text(2, 300);
        let whole = keys(&t);
        for cut in [0, 1, 63, 64, 65, 150, 299, 300] {
            let mut k = BlockKeys::default();
            k.write(&t[..cut]);
            k.write(&t[cut..]);
            assert_eq!(k.finish(), whole, "cut at {cut}");
        }
        // And in characters of several bytes.
        let wide = "aé€😀".repeat(40);
        let whole = keys(&wide);
        for (cut, _) in wide.char_indices() {
            let mut k = BlockKeys::default();
            k.write(&wide[..cut]);
            k.write(&wide[cut..]);
            assert_eq!(k.finish(), whole, "cut at byte {cut}");
        }
    }

    /// Two prompts sharing their first 200 characters share 3 whole blocks (192 characters):
    /// the second is served 48 tokens from the cache.
    #[test]
    fn a_shared_prefix_of_200_characters_hits_three_blocks() {
        let shared = text(3, 200);
        let first = format!("{shared}{}", text(4, 300));
        let second = format!("{shared}{}", text(5, 300));
        let tokens = |t: &str| super::super::text::estimate_tokens(t.chars().count());
        let mut cache = BlockCache::new(4096);
        assert_eq!(cache.serve(&keys(&first), tokens(&first)), 0, "empty");
        assert_eq!(cache.len(), 7);
        assert_eq!(cache.serve(&keys(&second), tokens(&second)), 48);
        // The second's 4 other blocks joined the first's 7.
        assert_eq!(cache.len(), 11);
    }

    /// A block is found only under the same prefix: the same text after a different first
    /// block hits nothing.
    #[test]
    fn a_different_first_block_hides_the_same_text_after_it() {
        let rest = text(6, 640);
        let a = format!("{}{rest}", text(7, 64));
        let b = format!("{}{rest}", text(8, 64));
        let mut cache = BlockCache::new(4096);
        cache.serve(&keys(&a), 176);
        assert_eq!(cache.serve(&keys(&b), 176), 0);
        // The same prompt again hits all 11 blocks.
        assert_eq!(cache.serve(&keys(&a), 177), 176);
    }

    /// A prompt that is all whole blocks is never served whole: its last token is computed.
    #[test]
    fn at_most_all_but_the_last_prompt_token_is_cached() {
        let t = text(9, 128);
        let mut cache = BlockCache::new(4096);
        assert_eq!(cache.serve(&keys(&t), 32), 0);
        assert_eq!(cache.serve(&keys(&t), 32), 31);
        assert_eq!(cache.serve(&keys(&t), 1), 0);
        assert_eq!(cache.serve(&[], 0), 0);
    }

    /// A cache of 4 blocks: the least recently used go first, and a prompt's own blocks tail
    /// first, so what stays of a prompt is always a prefix of it.
    #[test]
    fn the_least_recently_used_blocks_are_evicted_at_capacity() {
        let (a, b, c) = (
            keys(&text(10, 128)),
            keys(&text(11, 128)),
            keys(&text(12, 192)),
        );
        // 79 tokens hold 4 whole blocks.
        let mut cache = BlockCache::new(4 * PREFIX_BLOCK_TOKENS + 15);
        cache.serve(&a, 100);
        cache.serve(&b, 100);
        assert_eq!(cache.len(), 4);
        // a is used again: b is now the least recently used.
        assert_eq!(cache.serve(&a, 100), 32);
        // c's 3 blocks evict b's 2 and a's second; a's first block stays (a prompt's tail goes
        // first).
        cache.serve(&c, 100);
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.serve(&b, 100), 0);
        // b's 2 blocks came back in place of the oldest, a's first and c's third: c's first two
        // stay, a has none.
        assert_eq!(cache.serve(&c, 100), 32);
        assert_eq!(cache.serve(&a, 100), 0);
        assert_eq!(cache.len(), 4);
    }

    /// A prompt longer than the cache keeps its first blocks, the most it could ever hit.
    #[test]
    fn a_prompt_longer_than_the_cache_keeps_its_first_blocks() {
        let long = keys(&text(13, 64 * 10));
        let mut cache = BlockCache::new(3 * PREFIX_BLOCK_TOKENS);
        cache.serve(&long, 200);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.serve(&long, 200), 48);
        assert_eq!(cache.serve(&long[..2], 200), 32);
    }

    #[test]
    fn the_lookup_serves_either_kind() {
        let t = keys(&text(14, 128));
        let rate = PrefixLookup::new(PrefixCaching::Rate(PrefixCache::new(0.5).expect("valid")));
        assert!(!rate.wants_keys());
        assert_eq!(rate.job(100, &t, 3).cached_tokens, 50);
        let blocks = PrefixLookup::new(PrefixCaching::Blocks { tokens: 1024 });
        assert!(blocks.wants_keys());
        assert_eq!(blocks.job(100, &t, 3).cached_tokens, 0);
        let job = blocks.job(100, &t, 3);
        assert_eq!(
            (job.prompt_tokens, job.cached_tokens, job.output_tokens),
            (100, 32, 3)
        );
        assert!(!PrefixCaching::default().is_on());
        assert!(PrefixCaching::Blocks { tokens: 16 }.is_on());
    }
}
