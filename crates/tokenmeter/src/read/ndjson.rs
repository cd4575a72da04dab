//! A sans-IO newline-delimited JSON decoder (Ollama's native streaming format).
//!
//! Each non-blank line is one [`Message`] with an empty event name. A trailing `\r` is trimmed, a
//! final line without a newline is completed by [`Decoder::finish`], and a line longer than the limit
//! is skipped and counted, so memory stays bounded whatever the upstream sends.

use super::{DecodeErrors, Message};

/// Splits an NDJSON byte stream into lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoder {
    max_line: usize,
    line: Vec<u8>,
    skipping: bool,
    errors: DecodeErrors,
}

impl Decoder {
    /// A decoder that keeps at most `max_line` bytes of one line.
    pub fn new(max_line: usize) -> Self {
        Decoder {
            max_line: max_line.max(1),
            line: Vec::new(),
            skipping: false,
            errors: DecodeErrors::default(),
        }
    }

    /// What the decoder has counted so far.
    pub fn errors(&self) -> DecodeErrors {
        self.errors
    }

    /// Bytes held between calls: the incomplete line, never more than the limit.
    pub fn buffered(&self) -> usize {
        self.line.len()
    }

    /// Feeds the next piece of the stream; calls `on` for every line it completes.
    pub fn feed(&mut self, mut chunk: &[u8], on: &mut dyn FnMut(Message<'_>)) {
        while let Some(end) = memchr::memchr(b'\n', chunk) {
            let head = &chunk[..end];
            if self.skipping {
                self.skipping = false;
            } else if self.line.is_empty() {
                self.emit(head, on);
            } else if self.line.len() + head.len() > self.max_line {
                self.errors.line_too_long += 1;
                self.line.clear();
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(head);
                self.emit(&line, on);
                line.clear();
                self.line = line;
            }
            chunk = &chunk[end + 1..];
        }
        if self.skipping || chunk.is_empty() {
            return;
        }
        if self.line.len() + chunk.len() > self.max_line {
            self.errors.line_too_long += 1;
            self.line.clear();
            self.skipping = true;
        } else {
            self.line.extend_from_slice(chunk);
        }
    }

    /// The stream ended: completes a final line that had no newline.
    pub fn finish(&mut self, on: &mut dyn FnMut(Message<'_>)) {
        let line = std::mem::take(&mut self.line);
        if !self.skipping {
            self.emit(&line, on);
        }
        self.skipping = false;
    }

    fn emit(&mut self, line: &[u8], on: &mut dyn FnMut(Message<'_>)) {
        if line.len() > self.max_line {
            self.errors.line_too_long += 1;
            return;
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        on(Message {
            event: "",
            data: line,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(pieces: &[&[u8]], max: usize) -> (Vec<String>, u64) {
        let mut d = Decoder::new(max);
        let mut out = Vec::new();
        let mut on = |m: Message<'_>| out.push(String::from_utf8_lossy(m.data).into_owned());
        for p in pieces {
            d.feed(p, &mut on);
        }
        d.finish(&mut on);
        (out, d.errors().line_too_long)
    }

    #[test]
    fn every_split_gives_the_same_lines() {
        let input = b"{\"a\":1}\n\n{\"b\":2}\r\n{\"c\":3}";
        for i in 0..=input.len() {
            let (a, b) = input.split_at(i);
            assert_eq!(
                lines(&[a, b], 1024),
                (
                    vec!["{\"a\":1}".into(), "{\"b\":2}".into(), "{\"c\":3}".into()],
                    0
                ),
                "split at {i}"
            );
        }
    }

    #[test]
    fn long_line_is_skipped_and_counted() {
        let input = format!("{{\"a\":1}}\n{}\n{{\"b\":2}}\n", "x".repeat(100));
        for i in 0..=input.len() {
            let (a, b) = input.as_bytes().split_at(i);
            let (got, errs) = lines(&[a, b], 16);
            assert_eq!(got, ["{\"a\":1}", "{\"b\":2}"], "split at {i}");
            assert_eq!(errs, 1, "split at {i}");
        }
    }
}
