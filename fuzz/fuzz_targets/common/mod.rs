//! The input layout the targets share: a four-byte header that picks the decoder's limit and how
//! the body is cut into pieces, then the body. A fixed layout rather than `arbitrary`, so a real
//! stream seeds the corpus by prefixing four bytes (see `fuzz/README.md`).

#![allow(dead_code)]

/// Line limits to try: tiny ones reach the overflow paths on short inputs.
pub const LIMITS: [usize; 10] = [1, 2, 3, 4, 8, 16, 64, 256, 4096, 1 << 20];

/// Largest piece sizes to try; every piece is 0..=max bytes (empty pieces included).
pub const PIECES: [usize; 8] = [1, 2, 3, 5, 8, 64, 512, 1 << 16];

/// What the header says.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub limit: usize,
    pub max_piece: usize,
    pub seed: u64,
}

impl Header {
    pub const LEN: usize = 4;

    /// Splits `data` into the header and the body; `None` when it is too short.
    pub fn parse(data: &[u8]) -> Option<(Header, &[u8])> {
        let (h, body) = data.split_first_chunk::<{ Header::LEN }>()?;
        Some((
            Header {
                limit: LIMITS[usize::from(h[0]) % LIMITS.len()],
                max_piece: PIECES[usize::from(h[1]) % PIECES.len()],
                seed: u64::from(u16::from_le_bytes([h[2], h[3]])),
            },
            body,
        ))
    }
}

/// Cuts `body` into pieces of 0..=max bytes, sizes drawn from a xorshift seeded by `seed`.
pub fn pieces(body: &[u8], max: usize, seed: u64) -> Vec<&[u8]> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = (x % (max as u64 + 1)) as usize;
        let (piece, tail) = rest.split_at(n.min(rest.len()));
        out.push(piece);
        rest = tail;
    }
    out
}

/// A decoded message, owned, for comparing decodes.
pub type Owned = (String, Vec<u8>);
