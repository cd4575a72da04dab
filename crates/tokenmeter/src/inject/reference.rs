//! The filter as it was first written, one byte at a time into new buffers: the model the
//! slicing filter is checked against (same bytes out of every piece, same events removed).
//!
//! It is deliberately independent of the SSE framer the filter and the meter's decoder share
//! (`read::sse::frame`): it finds line and event ends on its own, byte by byte, so a mistake in
//! the framer's piece-wise bookkeeping (a CRLF split across pieces, a BOM split at the start)
//! shows up as a difference instead of being copied into the model. Only the decision whether a
//! whole event is the usage chunk is shared.

use bytes::{Bytes, BytesMut};

use super::{has_choice_key, is_usage_only, LfOwner, Mode, MAX_HELD};

/// A BOM at the very start of a stream is no text: a line holding only it is blank.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// A sans-IO filter over an SSE byte stream that removes usage-only events.
#[derive(Debug)]
pub struct Reference {
    mode: Mode,
    held: Vec<u8>,
    /// `held[..scanned]` has been searched for choice keys.
    scanned: usize,
    /// Nothing but the terminator has been seen on the current line.
    line_empty: bool,
    /// The previous byte was a CR, whose LF may follow.
    after_cr: Option<LfOwner>,
    /// BOM bytes matched at the start; `None` once past where a BOM can be.
    bom: Option<usize>,
    removed: u64,
}

impl Default for Reference {
    fn default() -> Self {
        Reference {
            mode: Mode::Holding,
            held: Vec::new(),
            scanned: 0,
            line_empty: true,
            after_cr: None,
            bom: Some(0),
            removed: 0,
        }
    }
}

impl Reference {
    /// Usage-only events removed so far.
    pub fn removed(&self) -> u64 {
        self.removed
    }

    /// Takes the next piece of the upstream's body; returns what the client gets now.
    pub fn feed(&mut self, data: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(data.len());
        for &b in data {
            if let Some(k) = self.bom {
                if b == BOM[k] {
                    self.push(b, &mut out);
                    self.bom = (k + 1 < BOM.len()).then_some(k + 1);
                    continue;
                }
                // What looked like the start of a BOM is text.
                self.bom = None;
                if k > 0 {
                    self.line_empty = false;
                }
            }
            if let Some(owner) = self.after_cr.take() {
                if b == b'\n' {
                    match owner {
                        LfOwner::Current => self.push(b, &mut out),
                        LfOwner::Forwarded => out.extend_from_slice(b"\n"),
                        LfOwner::Removed => {}
                    }
                    continue;
                }
            }
            let terminator = b == b'\n' || b == b'\r';
            self.push(b, &mut out);
            if !terminator {
                self.line_empty = false;
                continue;
            }
            let owner = if self.line_empty {
                self.end_event(&mut out)
            } else {
                self.line_empty = true;
                LfOwner::Current
            };
            if b == b'\r' {
                self.after_cr = Some(owner);
            }
        }
        self.release_if_content(&mut out);
        out.freeze()
    }

    /// The body ended: whatever is held (an unterminated event) goes to the client.
    pub fn finish(&mut self) -> Bytes {
        self.mode = Mode::Holding;
        self.scanned = 0;
        Bytes::from(std::mem::take(&mut self.held))
    }

    fn push(&mut self, b: u8, out: &mut BytesMut) {
        match self.mode {
            Mode::Passing => out.extend_from_slice(&[b]),
            Mode::Holding if self.held.len() >= MAX_HELD => {
                // Too long to be the usage chunk.
                out.extend_from_slice(&self.held);
                out.extend_from_slice(&[b]);
                self.held.clear();
                self.scanned = 0;
                self.mode = Mode::Passing;
            }
            Mode::Holding => self.held.push(b),
        }
    }

    /// A blank line ended the current event (its bytes are pushed already).
    fn end_event(&mut self, out: &mut BytesMut) -> LfOwner {
        let owner = match self.mode {
            // An event with a choice key is never removed: pieces may already have released it
            // for that key, and whether it is removed must not depend on how it was split.
            Mode::Holding if !has_choice_key(&self.held) && is_usage_only(&self.held) => {
                self.removed += 1;
                LfOwner::Removed
            }
            Mode::Holding => {
                out.extend_from_slice(&self.held);
                LfOwner::Forwarded
            }
            Mode::Passing => LfOwner::Forwarded,
        };
        self.held.clear();
        self.scanned = 0;
        self.mode = Mode::Holding;
        self.line_empty = true;
        owner
    }

    /// Forwards a held event as soon as it shows it is not the usage chunk.
    fn release_if_content(&mut self, out: &mut BytesMut) {
        if self.mode != Mode::Holding || self.held.is_empty() {
            return;
        }
        // Search only what is new, with an overlap for a key split across pieces.
        let from = self.scanned.saturating_sub(8);
        let tail = &self.held[from..];
        if has_choice_key(tail) {
            out.extend_from_slice(&self.held);
            self.held.clear();
            self.scanned = 0;
            self.mode = Mode::Passing;
        } else {
            self.scanned = self.held.len();
        }
    }
}
