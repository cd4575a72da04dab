//! The prefix cache: the share of a prompt whose KV is read from earlier requests rather than
//! computed, so the step that admits the prompt is not charged its prefill.
//!
//! `--prefix-cache-hit-rate` serves a fixed share of every prompt ([`PrefixCache`]).

use super::engine::Job;

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
}
