//! Where the lines and events of a Server-Sent Events stream begin and end, as byte spans.
//!
//! The one answer to "where does this line, this event, end" over an SSE byte stream: the
//! [`Decoder`](super::Decoder) reads its fields from the spans, and `--inject-usage`'s filter
//! ([`crate::inject`]) forwards or removes whole events by them, so the two cannot disagree on
//! an edge case. [`Framer::feed`] takes bytes in pieces of any size and reports, in order, a
//! [`Segment`] for every run of them: lines end with CRLF, LF or a lone CR (even when the CR and
//! LF arrive in different pieces), a blank line ends an event, and a BOM is recognised only at
//! the very start (split across pieces or not). It keeps no bytes, only a few flags, so it costs
//! nothing per piece but the scan for line ends.

use std::ops::Range;

/// The byte order mark a stream may begin with (UTF-8).
pub const BOM: &[u8] = b"\xEF\xBB\xBF";

/// What a run of one piece's bytes is. Together a piece's segments cover every byte of it, in
/// order; ranges index the piece.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Bytes that continue a BOM at the very start of the stream (skipped if it completes).
    Bom(Range<usize>),
    /// The bytes reported as [`Segment::Bom`] so far were not a BOM after all: they are the
    /// first `n` bytes of the first line, `BOM[..n]` (they came in earlier segments).
    NotBom(usize),
    /// The piece ends inside a line: these bytes continue it (none is a line end).
    Partial(Range<usize>),
    /// A line ends in this piece: `text` is its bytes here (after any [`Segment::Partial`]s of
    /// earlier pieces) and its terminator is `text.end..end` (CR, LF or CRLF; a CR that ends
    /// the piece may yet be followed by an LF, which comes as [`Segment::Lf`]). `blank`: the
    /// line was empty (a BOM is no text), so it ends an event.
    Line {
        text: Range<usize>,
        end: usize,
        blank: bool,
    },
    /// The byte at this index is the LF of a CRLF whose CR ended the previous piece: it belongs
    /// to that line's terminator.
    Lf(usize),
}

/// Splits an SSE byte stream into lines and events without keeping any of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framer {
    /// BOM bytes matched at the start; `None` once past where a BOM can be.
    bom: Option<usize>,
    /// The previous piece ended in CR: a leading LF in the next piece belongs to it.
    after_cr: bool,
    /// The current line has text (in earlier pieces).
    in_line: bool,
}

impl Default for Framer {
    fn default() -> Self {
        Framer {
            bom: Some(0),
            after_cr: false,
            in_line: false,
        }
    }
}

impl Framer {
    /// A framer for bytes from the middle of a stream (say, one event's), where no BOM can be.
    pub fn mid_stream() -> Self {
        Framer {
            bom: None,
            ..Framer::default()
        }
    }

    /// Frames the next piece of the stream, calling `on` for each of its segments in order.
    #[inline]
    pub fn feed(&mut self, piece: &[u8], mut on: impl FnMut(Segment)) {
        let n = piece.len();
        let mut i = 0;
        if let Some(held) = self.bom {
            // Matched as a block, like the decoder always has: the BOM's bytes in this piece
            // either all continue it, or none of them does.
            let take = (BOM.len() - held).min(n);
            if BOM[held..held + take] == piece[..take] {
                if take > 0 {
                    on(Segment::Bom(0..take));
                }
                if held + take < BOM.len() {
                    self.bom = Some(held + take);
                    return;
                }
                i = take;
            } else if held > 0 {
                on(Segment::NotBom(held));
                self.in_line = true;
            }
            self.bom = None;
        }
        if self.after_cr && i < n {
            self.after_cr = false;
            if piece[i] == b'\n' {
                on(Segment::Lf(i));
                i += 1;
            }
        }
        while i < n {
            let Some(k) = memchr::memchr2(b'\n', b'\r', &piece[i..]) else {
                on(Segment::Partial(i..n));
                self.in_line = true;
                return;
            };
            let t = i + k;
            let end = match piece.get(t..) {
                Some([b'\r', b'\n', ..]) => t + 2,
                Some([b'\r']) => {
                    self.after_cr = true;
                    t + 1
                }
                _ => t + 1,
            };
            let blank = !self.in_line && t == i;
            on(Segment::Line {
                text: i..t,
                end,
                blank,
            });
            self.in_line = false;
            i = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of `input` fed in `pieces`, each as its bytes (a BOM included with the first).
    fn events(pieces: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut f = Framer::default();
        let (mut out, mut cur): (Vec<Vec<u8>>, Vec<u8>) = (Vec::new(), Vec::new());
        for p in pieces {
            f.feed(p, |s| match s {
                Segment::Bom(r) | Segment::Partial(r) => cur.extend_from_slice(&p[r]),
                Segment::NotBom(_) => {}
                Segment::Lf(i) => match out.last_mut() {
                    Some(last) if cur.is_empty() => last.push(p[i]),
                    _ => cur.push(p[i]),
                },
                Segment::Line { text, end, blank } => {
                    cur.extend_from_slice(&p[text.start..end]);
                    if blank {
                        out.push(std::mem::take(&mut cur));
                    }
                }
            });
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }

    /// Frames `input` whole, split at every offset and byte by byte: all must give `want`.
    fn check(input: &[u8], want: &[&[u8]]) {
        let want: Vec<Vec<u8>> = want.iter().map(|e| e.to_vec()).collect();
        assert_eq!(events(&[input]), want, "whole");
        for i in 0..=input.len() {
            let (a, b) = input.split_at(i);
            assert_eq!(events(&[a, b]), want, "split at {i}");
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(events(&bytes), want, "byte by byte");
    }

    #[test]
    fn events_end_at_blank_lines_whatever_the_line_ends() {
        check(
            b"data: a\n\ndata: b\r\n\r\n: c\r\rdata: d\n\n",
            &[
                b"data: a\n\n",
                b"data: b\r\n\r\n",
                b": c\r\r",
                b"data: d\n\n",
            ],
        );
        check(b"\n\r\n\r", &[b"\n", b"\r\n", b"\r"]);
    }

    #[test]
    fn an_unterminated_event_is_left_open() {
        check(b"data: a\n\ndata: b\n", &[b"data: a\n\n", b"data: b\n"]);
    }

    #[test]
    fn a_bom_is_no_text_only_at_the_start() {
        check(
            b"\xEF\xBB\xBF\ndata: a\n\n",
            &[b"\xEF\xBB\xBF\n", b"data: a\n\n"],
        );
        check(
            b"\xEF\xBB\n\ndata: a\n\n",
            &[b"\xEF\xBB\n\n", b"data: a\n\n"],
        );
        check(b"\n\xEF\xBB\xBF\n\n", &[b"\n", b"\xEF\xBB\xBF\n\n"]);
    }
}
