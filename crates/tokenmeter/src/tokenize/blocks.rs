//! A prompt's token ids cut into blocks, each named by a hash of every token up to and including
//! it, for the workload trace's `hash_ids` (`crate::workload`): two prompts get the same hash for
//! a block exactly when they share every token up to its end, as an engine's prefix cache keys its
//! blocks. The hash is 64 bits (SipHash-1-3 with fixed keys, Rust's `DefaultHasher`): a
//! collision among the prefixes a proxy sees in its life is beyond the odds of a disk error. The
//! ids themselves never leave the tokenizing thread.

use std::hash::{DefaultHasher, Hasher};

/// The blocks of `ids`, `block` tokens each (the last may be shorter): `ceil(ids / block)`
/// chained hashes. `block` 0 gives none.
pub fn chained(ids: &[u32], block: usize) -> Vec<u64> {
    if block == 0 {
        return Vec::new();
    }
    let mut prev = 0u64;
    ids.chunks(block)
        .map(|chunk| {
            let mut h = DefaultHasher::new();
            h.write_u64(prev);
            h.write_usize(chunk.len());
            for &id in chunk {
                h.write_u32(id);
            }
            prev = h.finish();
            prev
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_named_by_its_whole_prefix() {
        let a: Vec<u32> = (0..10).collect();
        let mut b = a.clone();
        b[7] = 99;
        let (ha, hb) = (chained(&a, 4), chained(&b, 4));
        assert_eq!(ha.len(), 3);
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        // The same tokens under another prefix are another block.
        let mut c = a.clone();
        c[0] = 42;
        let hc = chained(&c, 4);
        assert_ne!(ha[1], hc[1]);
        assert_ne!(ha[2], hc[2]);
        // A partial last block differs from the full one that begins with it.
        assert_ne!(chained(&a[..9], 4)[2], ha[2]);
        assert_eq!(chained(&a[..9], 4)[..2], ha[..2]);
        assert!(chained(&a, 0).is_empty());
        assert!(chained(&[], 4).is_empty());
    }
}
