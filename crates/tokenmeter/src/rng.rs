//! SplitMix64 (Steele, Lea, Flood 2014): the one small seeded generator the crate and the tools
//! share, for reproducible draws (the capacity replay's arrivals, the simulator's words and
//! lengths, the bench's Poisson gaps). Tiny, fast and well mixed from any seed, zero included;
//! never for anything that needs unpredictability. A leaf: it imports nothing of the crate.

/// SplitMix64's state.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

/// The golden-ratio increment each draw adds to the state.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a well-mixed 64 bits from any 64, on its own a good hash of a
/// counter or a seed.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// Uniform in `[0, 1)`, on 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `(0, 1]`: never 0, for a logarithm.
    pub fn unit_open(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Below `n` (0 when `n` is 0). The modulo bias is below 2^-40 for any `n` under 2^24.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// In `lo..=hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below(hi - lo + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference sequence from seed 1234567 (the generator's published test vector).
    #[test]
    fn draws_the_reference_sequence() {
        let mut r = SplitMix64::new(1234567);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423
            ]
        );
    }

    #[test]
    fn ranges_and_units_stay_in_bounds() {
        let mut r = SplitMix64::new(0);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            let o = r.unit_open();
            assert!(o > 0.0 && o <= 1.0);
            assert!((3..=5).contains(&r.range(3, 5)));
            assert_eq!(r.range(7, 7), 7);
            assert!(r.below(4) < 4);
        }
        assert_eq!(r.below(0), 0);
    }
}
