//! The SSE decoder on random bytes in random pieces: it must not panic, must give the same events
//! (and count the same errors) as when it is fed the whole input at once, and must never hold more
//! than its limit allows.

#![no_main]

mod common;

use common::{pieces, Header, Owned};
use libfuzzer_sys::fuzz_target;
use tokenmeter::read::sse::Decoder;
use tokenmeter::read::DecodeErrors;

fn decode(parts: &[&[u8]], limit: usize) -> (Vec<Owned>, DecodeErrors) {
    let mut d = Decoder::new(limit);
    let mut out = Vec::new();
    let mut on =
        |m: tokenmeter::read::Message<'_>| out.push((m.event.to_owned(), m.data.to_vec()));
    for p in parts {
        d.feed(p, &mut on);
        // The line, the data and the event name are each bounded by the limit (the name up to 3x
        // after lossy UTF-8 replacement); the start of a BOM is not held.
        assert!(
            d.buffered() <= 5 * limit,
            "holds {} bytes with limit {limit}",
            d.buffered()
        );
    }
    d.finish(&mut on);
    assert_eq!(d.buffered(), 0, "finish left bytes behind");
    (out, d.errors())
}

fuzz_target!(|data: &[u8]| {
    let Some((h, body)) = Header::parse(data) else {
        return;
    };
    let whole = decode(&[body], h.limit);
    let split = decode(&pieces(body, h.max_piece, h.seed), h.limit);
    assert_eq!(whole, split, "split decode differs from whole decode");
});
