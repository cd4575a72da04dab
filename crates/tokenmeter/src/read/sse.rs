//! A sans-IO Server-Sent Events decoder, as the WHATWG HTML standard specifies it.
//!
//! [`Decoder::feed`] takes bytes in pieces of any size and calls back with each complete event as a
//! [`Message`]. It never fails and never panics: lines end with CRLF, LF or a lone CR (even when the
//! CR and LF arrive in different pieces), a leading BOM is skipped, comments and unknown fields are
//! ignored. Where lines and events end is [`frame::Framer`]'s answer, the same one
//! `--inject-usage`'s filter cuts the stream by. Memory is bounded: only an incomplete line and the current event's data are kept, and a
//! line or event longer than the limit is dropped (and counted) instead of grown without bound.
//!
//! At the end of the stream, an event the stream left unterminated (no blank line after it) is
//! discarded, as the standard says and browsers do: a body cut off mid-event would otherwise be
//! read as a truncated, unparsable message. Real servers end every event with a blank line.

use super::{DecodeErrors, Message};

pub mod frame;

use frame::{Framer, Segment, BOM};

/// Splits an SSE byte stream into events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoder {
    max_line: usize,
    /// Where lines and events end (it keeps no bytes).
    framer: Framer,
    /// The incomplete line carried over from the previous piece.
    line: Vec<u8>,
    /// The current line is over the limit: skip bytes until its end.
    skipping: bool,
    /// The line being skipped is a comment, which is no error and belongs to no event.
    skipping_comment: bool,
    event: String,
    data: Vec<u8>,
    /// At least one `data:` field was seen for the current event.
    has_data: bool,
    /// The current event's data went over the limit: it is dropped at dispatch.
    data_overflow: bool,
    errors: DecodeErrors,
}

impl Decoder {
    /// A decoder that keeps at most `max_line` bytes of one line or one event's data.
    pub fn new(max_line: usize) -> Self {
        Decoder {
            max_line: max_line.max(1),
            framer: Framer::default(),
            line: Vec::new(),
            skipping: false,
            skipping_comment: false,
            event: String::new(),
            data: Vec::new(),
            has_data: false,
            data_overflow: false,
            errors: DecodeErrors::default(),
        }
    }

    /// What the decoder has counted so far.
    pub fn errors(&self) -> DecodeErrors {
        self.errors
    }

    /// Bytes held between calls: the incomplete line, the current event's data and its name.
    /// Each is bounded by the limit (the name can be up to 3x its input after lossy UTF-8
    /// replacement; the start of a BOM is not held, the framer knows its bytes).
    pub fn buffered(&self) -> usize {
        self.line.len() + self.data.len() + self.event.len()
    }

    /// Feeds the next piece of the stream; calls `on` for every event it completes.
    pub fn feed(&mut self, chunk: &[u8], on: &mut dyn FnMut(Message<'_>)) {
        let mut framer = self.framer;
        framer.feed(chunk, |segment| match segment {
            Segment::Bom(_) | Segment::Lf(_) => {}
            // What looked like the start of a BOM is the first line's first bytes.
            Segment::NotBom(n) => self.push_partial(&BOM[..n]),
            Segment::Partial(text) => self.push_partial(&chunk[text]),
            Segment::Line { text, .. } => self.end_line(&chunk[text], on),
        });
        self.framer = framer;
    }

    /// The stream ended. An unterminated last event is discarded (see the module doc); the
    /// decoder is ready for a new stream.
    pub fn finish(&mut self, _on: &mut dyn FnMut(Message<'_>)) {
        let errors = self.errors;
        *self = Decoder::new(self.max_line);
        self.errors = errors;
    }

    /// A line ends with `head`, after whatever of it earlier pieces held.
    #[inline]
    fn end_line(&mut self, head: &[u8], on: &mut dyn FnMut(Message<'_>)) {
        if self.skipping {
            self.line.clear();
        } else if self.line.is_empty() {
            self.process_line(head, on);
        } else {
            self.push_partial(head);
            if !self.skipping {
                let line = std::mem::take(&mut self.line);
                self.process_line(&line, on);
                self.line = line;
                self.line.clear();
            }
        }
        self.skipping = false;
        self.skipping_comment = false;
    }

    fn push_partial(&mut self, bytes: &[u8]) {
        if self.skipping {
            return;
        }
        if self.line.len() + bytes.len() > self.max_line {
            let first = self.line.first().or(bytes.first());
            self.skipping = true;
            self.skipping_comment = first == Some(&b':');
            self.line.clear();
            self.too_long();
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    fn process_line(&mut self, line: &[u8], on: &mut dyn FnMut(Message<'_>)) {
        if line.is_empty() {
            self.dispatch(on);
            return;
        }
        if line.first() == Some(&b':') {
            return; // a comment
        }
        if line.len() > self.max_line {
            self.too_long();
            return;
        }
        let (field, value) = field(line);
        match field {
            b"data" => {
                if self.data.len() + value.len() + 1 > self.max_line {
                    if !self.data_overflow {
                        self.errors.line_too_long += 1;
                    }
                    self.data_overflow = true;
                    self.data.clear();
                } else if !self.data_overflow {
                    self.data.extend_from_slice(value);
                    self.data.push(b'\n');
                }
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event.push_str(&String::from_utf8_lossy(value));
            }
            // `id` and `retry` matter to a reconnecting client, not to a meter.
            _ => {}
        }
    }

    /// A line over the limit: counted, and it poisons the event it belongs to (whose data would be
    /// incomplete). A comment is neither an error nor part of an event.
    fn too_long(&mut self) {
        if self.skipping_comment {
            return;
        }
        self.errors.line_too_long += 1;
        self.data_overflow = true;
    }

    fn dispatch(&mut self, on: &mut dyn FnMut(Message<'_>)) {
        if self.has_data && !self.data_overflow {
            let data = self.data.strip_suffix(b"\n").unwrap_or(&self.data);
            on(Message {
                event: &self.event,
                data,
            });
        }
        self.event.clear();
        self.data.clear();
        self.has_data = false;
        self.data_overflow = false;
    }
}

/// A line's field name and value: the value follows the first colon, less one leading space;
/// a line without a colon is a field with an empty value. (A line beginning with a colon is a
/// comment, which the caller skips.)
pub fn field(line: &[u8]) -> (&[u8], &[u8]) {
    match line.iter().position(|&b| b == b':') {
        Some(i) => {
            let v = &line[i + 1..];
            (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
        }
        None => (line, &[][..]),
    }
}

/// Calls `on` with the value of every `data` field of `event`, the bytes of whole lines from the
/// middle of a stream (one event's, say), in order. Lines are framed as the decoder frames them.
pub fn data_fields(event: &[u8], mut on: impl FnMut(&[u8])) {
    Framer::mid_stream().feed(event, |segment| {
        if let Segment::Line { text, .. } = segment {
            let line = &event[text];
            if line.first() != Some(&b':') {
                if let (b"data", value) = field(line) {
                    on(value);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_pieces(pieces: &[&[u8]], max: usize) -> (Vec<(String, String)>, DecodeErrors) {
        let mut d = Decoder::new(max);
        let mut out = Vec::new();
        let mut on = |m: Message<'_>| {
            out.push((
                m.event.to_string(),
                String::from_utf8_lossy(m.data).into_owned(),
            ))
        };
        for p in pieces {
            d.feed(p, &mut on);
        }
        d.finish(&mut on);
        (out, d.errors())
    }

    /// Decodes `input` whole, then split at every byte offset, and checks all agree with `expect`.
    fn check(input: &[u8], expect: &[(&str, &str)]) {
        let expect: Vec<(String, String)> = expect
            .iter()
            .map(|(e, d)| (e.to_string(), d.to_string()))
            .collect();
        assert_eq!(decode_pieces(&[input], 1 << 20).0, expect, "whole input");
        for i in 0..=input.len() {
            let (a, b) = input.split_at(i);
            assert_eq!(decode_pieces(&[a, b], 1 << 20).0, expect, "split at {i}");
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(decode_pieces(&bytes, 1 << 20).0, expect, "byte by byte");
    }

    #[test]
    fn line_endings() {
        check(
            b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\n\n",
            &[("", "a"), ("", "b"), ("", "c"), ("", "d")],
        );
    }

    #[test]
    fn fields_comments_and_multiline_data() {
        check(
            b": keep-alive\nevent: delta\nid: 7\nretry: 10\ndata:x\ndata: y\n\nevent: e\n\n",
            &[("delta", "x\ny")],
        );
    }

    #[test]
    fn bom_is_skipped_only_at_start() {
        check(b"\xEF\xBB\xBFdata: a\n\n", &[("", "a")]);
        check(b"\xEF\xBB\xBF", &[]);
    }

    #[test]
    fn unterminated_final_event_is_discarded() {
        check(b"data: a\n\ndata: [DONE]", &[("", "a")]);
        check(b"data: a\n\ndata: b\n", &[("", "a")]);
        check(b"data: a\n\ndata: b\r", &[("", "a")]);
    }

    #[test]
    fn a_bom_anywhere_but_the_start_is_part_of_the_line() {
        // The second line's field name is "\u{FEFF}data", which is no field: ignored.
        check(
            b"\xEF\xBB\xBFdata: 1\n\n\xEF\xBB\xBFdata: 2\n\ndata: 3\n\n",
            &[("", "1"), ("", "3")],
        );
        // The start of a BOM that is not one is ordinary input.
        check(b"\xEF\xBBdata: 1\n\ndata: 2\n\n", &[("", "2")]);
    }

    #[test]
    fn a_long_comment_is_no_error_and_spoils_no_event() {
        let mut input = b"data: a\n:".to_vec();
        input.extend(std::iter::repeat(b'x').take(100));
        input.extend_from_slice(b"\ndata: b\n\n");
        for split in 0..input.len() {
            let (a, b) = input.split_at(split);
            let (events, errors) = decode_pieces(&[a, b], 32);
            assert_eq!(
                events,
                [("".to_string(), "a\nb".to_string())],
                "split at {split}"
            );
            assert_eq!(errors.line_too_long, 0, "split at {split}");
        }
    }

    #[test]
    fn empty_data_field_dispatches_empty_event() {
        check(b"data\n\ndata:\n\n", &[("", ""), ("", "")]);
    }

    #[test]
    fn long_line_is_skipped_counted_and_bounded() {
        let mut input = b"data: ok\n\ndata: ".to_vec();
        input.extend(std::iter::repeat(b'x').take(100));
        input.extend_from_slice(b"\n\ndata: after\n\n");
        for split in 0..input.len() {
            let (a, b) = input.split_at(split);
            let (events, errors) = decode_pieces(&[a, b], 32);
            let datas: Vec<&str> = events.iter().map(|(_, d)| d.as_str()).collect();
            assert_eq!(datas, ["ok", "after"], "split at {split}");
            assert_eq!(errors.line_too_long, 1, "split at {split}");
        }
    }

    #[test]
    fn many_data_lines_cannot_grow_an_event_without_bound() {
        let input = "data: 0123456789\n".repeat(100) + "\n";
        let mut d = Decoder::new(64);
        let mut n = 0;
        d.feed(input.as_bytes(), &mut |_| n += 1);
        assert_eq!(n, 0);
        assert!(d.data.capacity() <= 128);
        assert_eq!(d.errors().line_too_long, 1);
    }
}
