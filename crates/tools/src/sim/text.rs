//! What the simulator "generates": a seeded pseudo-random generator, a small vocabulary, and the
//! output-length distribution.
//!
//! Everything a response contains is a function of `--seed` and the request's own text, never of
//! arrival order or timing, so two runs with the same seed answer the same request with the same
//! tokens, whatever else the server is doing at the time.

use std::fmt;
use std::str::FromStr;

/// The simulator's seeded generator: the crate's SplitMix64, good enough to pick words and
/// lengths, and reproducible from a request's seed.
pub use tokenmeter::rng::SplitMix64 as Rng;

/// FNV-1a, for folding a request's text into its seed.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xCBF2_9CE4_8422_2325)
    }
}

impl Fnv {
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}

/// The words the simulator speaks. Plain ASCII with no character JSON needs escaped, so a token
/// can be written into any wire format as it is. The index is the token id.
pub const VOCABULARY: [&str; 64] = [
    " the",
    " of",
    " and",
    " to",
    " a",
    " in",
    " is",
    " that",
    " for",
    " it",
    " as",
    " with",
    " was",
    " on",
    " be",
    " by",
    " this",
    " are",
    " or",
    " from",
    " at",
    " which",
    " an",
    " but",
    " not",
    " have",
    " has",
    " one",
    " can",
    " all",
    " more",
    " when",
    " model",
    " token",
    " batch",
    " latency",
    " server",
    " request",
    " stream",
    " decode",
    " prefill",
    " cache",
    " memory",
    " speed",
    " queue",
    " user",
    " time",
    " first",
    " each",
    " step",
    " GPU",
    " throughput",
    " kernel",
    " layer",
    " weights",
    " attention",
    " context",
    " prompt",
    " output",
    " second",
    ",",
    ".",
    " (",
    ")",
];

/// One generated token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    pub id: u32,
    pub text: &'static str,
}

/// Draws the tokens of one response.
#[derive(Debug, Clone)]
pub struct Words(Rng);

impl Words {
    pub fn new(rng: Rng) -> Self {
        Words(rng)
    }

    pub fn next_token(&mut self) -> Token {
        let id = (self.0.next_u64() % VOCABULARY.len() as u64) as usize;
        Token {
            id: id as u32,
            text: VOCABULARY[id],
        }
    }
}

/// How many tokens a response has when the request sets no limit: `N`, or `MIN-MAX` drawn
/// uniformly (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lengths {
    pub min: u32,
    pub max: u32,
}

impl Lengths {
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        rng.range(u64::from(self.min), u64::from(self.max)) as u32
    }
}

impl FromStr for Lengths {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let num = |x: &str| {
            x.trim()
                .parse::<u32>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| {
                    format!("{s:?} is not a token count (expected N or MIN-MAX, N >= 1)")
                })
        };
        let (min, max) = match s.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let n = num(s)?;
                (n, n)
            }
        };
        if min > max {
            return Err(format!("{s:?}: MIN is larger than MAX"));
        }
        Ok(Lengths { min, max })
    }
}

impl fmt::Display for Lengths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

/// Characters of English per token, roughly: the usual rule of thumb.
pub const CHARS_PER_TOKEN: usize = 4;

/// Roughly how many tokens `chars` characters of English make: [`CHARS_PER_TOKEN`] to a token,
/// at least one.
pub fn estimate_tokens(chars: usize) -> u32 {
    chars.div_ceil(CHARS_PER_TOKEN).clamp(1, u32::MAX as usize) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_words() {
        let a: Vec<Token> = {
            let mut w = Words::new(Rng::new(7));
            (0..100).map(|_| w.next_token()).collect()
        };
        let mut w = Words::new(Rng::new(7));
        let b: Vec<Token> = (0..100).map(|_| w.next_token()).collect();
        let mut w = Words::new(Rng::new(8));
        let c: Vec<Token> = (0..100).map(|_| w.next_token()).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn vocabulary_needs_no_json_escaping() {
        for w in VOCABULARY {
            assert_eq!(serde_json::to_string(w).expect("json"), format!("\"{w}\""));
        }
    }

    #[test]
    fn lengths_parse_and_stay_in_range() {
        assert_eq!("256".parse(), Ok(Lengths { min: 256, max: 256 }));
        assert_eq!("16-512".parse(), Ok(Lengths { min: 16, max: 512 }));
        for bad in ["0", "5-2", "x", "", "1-", "-3"] {
            assert!(bad.parse::<Lengths>().is_err(), "{bad}");
        }
        let l = Lengths { min: 3, max: 5 };
        let mut rng = Rng::new(1);
        let mut seen = [false; 3];
        for _ in 0..200 {
            let n = l.sample(&mut rng);
            assert!((3..=5).contains(&n));
            seen[(n - 3) as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
    }

    #[test]
    fn four_characters_per_token() {
        assert_eq!(estimate_tokens(0), 1);
        assert_eq!(estimate_tokens(4), 1);
        assert_eq!(estimate_tokens(5), 2);
        assert_eq!(estimate_tokens(400), 100);
    }
}
