//! `--inject-usage`: exact token counts from OpenAI-compatible streams whose clients did not ask.
//!
//! When it applies is [`policy`]'s: `auto` (the default) once the upstream is known to be an
//! engine that adds nothing but the usage chunk.
//!
//! Without `stream_options.include_usage`, an OpenAI-compatible server sends no usage report and
//! tokenmeter can only count token-bearing chunks, which undercounts wherever a chunk carries
//! several tokens (speculative decoding, stream intervals, detokenizer batching). With the flag,
//! [`add_usage`] asks for the report in the request body, and [`StripUsage`] removes the one event
//! it adds from what the client sees: the usage-only chunk
//! `data: {..., "choices": [], "usage": {...}}`. The meter reads the upstream's bytes before the
//! filter, so it still sees the report.
//!
//! What the client sees is then byte for byte what it would have seen without the flag, for a
//! server that adds nothing but that chunk (vLLM, SGLang, TGI, llama.cpp). Limits, all forwarded
//! unchanged: a body over `--max-request-body` (not read), a request that already has
//! `stream_options` with other settings (`continuous_usage_stats` would change every chunk), and
//! anything that is not a streaming JSON request to `/chat/completions` or `/completions`.
//!
//! **Invariant:** the filter holds back at most the bytes of one incomplete event that might be
//! the usage chunk, and only until that event ends or shows it is not (a `"delta":`, `"text":` or
//! `"index":` key, which only choices have): content chunks are never delayed past their own last
//! byte. Everything but a usage-only event is forwarded unchanged, in order.
//!
//! Where an event ends is not decided here: the filter cuts the stream by the spans of
//! [`read::sse::frame`](crate::read::sse::frame), the framer the meter's SSE decoder reads its
//! lines by, and reads a held event's data through the same field rules. It only decides
//! whether a whole event is the usage chunk.

use std::borrow::Cow;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;
use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::protocol::request::Layout;
use crate::protocol::{detect, Api};
use crate::read::sse::{self, frame::Framer, frame::Segment};

pub mod policy;

pub use self::policy::{Policy, Setting};

/// The longest event the filter holds back. A usage chunk is well under 1 KiB; an event longer
/// than this is not one, and is forwarded as it comes.
pub const MAX_HELD: usize = 64 * 1024;

/// What `--inject-usage` puts into a request.
const STREAM_OPTIONS: &str = r#"{"include_usage":true}"#;

/// Keys only a choice has: an event holding one is not the usage-only chunk.
const CHOICE_KEYS: [&[u8]; 3] = [b"\"delta\":", b"\"text\":", b"\"index\":"];

/// Adds `"stream_options": {"include_usage": true}` to a streaming OpenAI-compatible request that
/// did not ask for usage. `layout` is where [`read`](crate::protocol::request::read) found the body's members: the body
/// is not parsed again. Returns the new body, or `None` to forward the body unchanged. Only
/// `stream_options` is written: every other byte of the body stays as the client sent it.
pub fn add_usage(path: &str, body: &[u8], layout: &Layout) -> Option<Vec<u8>> {
    if detect::path_hint(path) != Some(Api::OpenAi) {
        return None;
    }
    // Only a JSON object with `"stream": true` has an opening brace noted.
    let open = layout.open?;
    // Both writes keep the body JSON: a whole value the parser delimited is replaced by another,
    // or a member is put before the object's first one (`stream` is there, so it has one).
    let out = match layout.stream_options.clone() {
        None => {
            let mut out = Vec::with_capacity(body.len() + 40);
            out.extend_from_slice(body.get(..=open)?);
            out.extend_from_slice(b"\"stream_options\":");
            out.extend_from_slice(STREAM_OPTIONS.as_bytes());
            out.push(b',');
            out.extend_from_slice(body.get(open + 1..)?);
            out
        }
        Some(span) => {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Options {
                #[serde(default)]
                include_usage: Option<bool>,
            }
            let asked =
                match serde_json::from_slice::<Option<Options>>(body.get(span.clone())?).ok()? {
                    Some(o) => o.include_usage,
                    None => None,
                };
            if asked == Some(true) {
                return None;
            }
            let mut out = Vec::with_capacity(body.len() + 24);
            out.extend_from_slice(body.get(..span.start)?);
            out.extend_from_slice(STREAM_OPTIONS.as_bytes());
            out.extend_from_slice(body.get(span.end..)?);
            out
        }
    };
    Some(out)
}

/// True when `bytes` hold a key only a choice has: the event is content, not the usage chunk.
fn has_choice_key(bytes: &[u8]) -> bool {
    CHOICE_KEYS
        .iter()
        .any(|k| memchr::memmem::find(bytes, k).is_some())
}

/// True when an event's data is the usage-only chunk: `choices` present and empty, `usage` set.
/// `event` is the bytes of one whole event, its fields read by the decoder's rules (a BOM that
/// begins the stream is read as text here: an event right after it is never removed).
fn is_usage_only(event: &[u8]) -> bool {
    let mut data = Vec::new();
    sse::data_fields(event, |value| {
        data.extend_from_slice(value);
        data.push(b'\n');
    });
    #[derive(Deserialize)]
    struct Chunk {
        choices: Option<Vec<IgnoredAny>>,
        usage: Option<IgnoredAny>,
    }
    serde_json::from_slice::<Chunk>(&data)
        .is_ok_and(|c| c.choices.is_some_and(|c| c.is_empty()) && c.usage.is_some())
}

/// Where the current event's bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Held back: it may be the usage chunk.
    Holding,
    /// Forwarded as they come: it is not.
    Passing,
}

/// Where an LF that follows a CR goes: where its line's terminator went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LfOwner {
    /// The CR ended a line inside the current event.
    Current,
    /// The CR ended an event that was forwarded.
    Forwarded,
    /// The CR ended the usage chunk, which was removed.
    Removed,
}

/// A sans-IO filter over an SSE byte stream that removes usage-only events.
#[derive(Debug)]
pub struct UsageFilter {
    /// Where events end: the meter's decoder's own framer, so both cut the stream alike.
    framer: Framer,
    mode: Mode,
    /// Bytes of the current event carried over from earlier pieces (held back).
    held: Vec<u8>,
    /// `held[..scanned]` has been searched for choice keys.
    scanned: usize,
    /// Where the last line's terminator went, for the LF of a CRLF split across pieces.
    lf: LfOwner,
    removed: u64,
}

impl Default for UsageFilter {
    fn default() -> Self {
        UsageFilter {
            framer: Framer::default(),
            mode: Mode::Holding,
            held: Vec::new(),
            scanned: 0,
            lf: LfOwner::Current,
            removed: 0,
        }
    }
}

/// What one piece gives the client: runs of the piece itself, as slices of the same `Bytes`
/// while they are contiguous (the common case: the piece unchanged, or all but a removed event
/// at its end), copied into a new buffer only when something else comes between them (bytes
/// held from an earlier piece, a removed event in the middle).
struct Out<'a> {
    piece: &'a Bytes,
    /// The run of the piece forwarded last, not yet copied anywhere.
    run: Option<(usize, usize)>,
    copy: Option<BytesMut>,
}

impl<'a> Out<'a> {
    fn new(piece: &'a Bytes) -> Self {
        Out {
            piece,
            run: None,
            copy: None,
        }
    }

    fn flush_run(&mut self) {
        if let Some((s, e)) = self.run.take() {
            let piece = self.piece;
            self.copy
                .get_or_insert_with(|| BytesMut::with_capacity(piece.len()))
                .extend_from_slice(&piece[s..e]);
        }
    }

    /// Forwards `piece[start..end]`.
    fn slice(&mut self, start: usize, end: usize) {
        match &mut self.run {
            Some((_, e)) if *e == start => *e = end,
            _ => {
                self.flush_run();
                self.run = Some((start, end));
            }
        }
    }

    /// Forwards bytes that are not a slice of the piece.
    fn owned(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.flush_run();
        let len = self.piece.len();
        self.copy
            .get_or_insert_with(|| BytesMut::with_capacity(len + bytes.len()))
            .extend_from_slice(bytes);
    }

    fn finish(mut self) -> Bytes {
        if self.copy.is_none() {
            return match self.run {
                Some((s, e)) => self.piece.slice(s..e),
                None => Bytes::new(),
            };
        }
        self.flush_run();
        self.copy.map(BytesMut::freeze).unwrap_or_default()
    }
}

/// The current event's held bytes in this piece: `piece[start..end]`, after those carried in
/// `UsageFilter::held` from earlier pieces (an event's bytes in one piece are consecutive).
#[derive(Clone, Copy, Default)]
struct Hold {
    run: Option<(usize, usize)>,
}

impl UsageFilter {
    /// Usage-only events removed so far.
    pub fn removed(&self) -> u64 {
        self.removed
    }

    /// True when bytes are held back, waiting for the rest of their event.
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Takes the next piece of the upstream's body; returns what the client gets now.
    pub fn feed(&mut self, data: &[u8]) -> Bytes {
        self.feed_bytes(&Bytes::copy_from_slice(data))
    }

    /// [`feed`](Self::feed) for a piece the caller owns as `Bytes`: what is forwarded unchanged
    /// is returned as slices of it, not copied.
    pub fn feed_bytes(&mut self, piece: &Bytes) -> Bytes {
        let mut out = Out::new(piece);
        let mut hold = Hold::default();
        let mut framer = self.framer;
        framer.feed(piece, |segment| match segment {
            Segment::Bom(run) | Segment::Partial(run) => {
                self.push(run.start, run.end, piece, &mut hold, &mut out)
            }
            Segment::NotBom(_) => {}
            Segment::Lf(at) => self.lf(at, piece, &mut hold, &mut out),
            Segment::Line { text, end, blank } => {
                // The line and the first byte of its terminator; whether an event ended is
                // decided before the LF of a CRLF, which then follows its CR.
                let first = text.end + 1;
                self.push(text.start, first, piece, &mut hold, &mut out);
                self.lf = if blank {
                    self.end_event(piece, &mut hold, &mut out)
                } else {
                    LfOwner::Current
                };
                if end > first {
                    self.lf(first, piece, &mut hold, &mut out);
                }
            }
        });
        self.framer = framer;
        self.release_if_content(piece, hold, &mut out);
        out.finish()
    }

    /// The body ended: whatever is held (an unterminated event) goes to the client.
    pub fn finish(&mut self) -> Bytes {
        self.mode = Mode::Holding;
        self.scanned = 0;
        Bytes::from(std::mem::take(&mut self.held))
    }

    /// Sends the LF at `piece[at]` where its CR went.
    fn lf(&mut self, at: usize, piece: &Bytes, hold: &mut Hold, out: &mut Out<'_>) {
        match self.lf {
            LfOwner::Current => self.push(at, at + 1, piece, hold, out),
            LfOwner::Forwarded => out.slice(at, at + 1),
            LfOwner::Removed => {}
        }
    }

    fn held_len(&self, hold: Hold) -> usize {
        self.held.len() + hold.run.map_or(0, |(s, e)| e - s)
    }

    /// Forwards the held bytes and forgets them.
    fn forward_held(&mut self, hold: &mut Hold, out: &mut Out<'_>) {
        out.owned(&self.held);
        if let Some((s, e)) = hold.run.take() {
            out.slice(s, e);
        }
        self.held.clear();
        self.scanned = 0;
    }

    /// Takes `piece[start..end]`, none of it a line terminator but perhaps the last byte.
    fn push(
        &mut self,
        start: usize,
        end: usize,
        piece: &Bytes,
        hold: &mut Hold,
        out: &mut Out<'_>,
    ) {
        match self.mode {
            Mode::Passing => out.slice(start, end),
            Mode::Holding => {
                let room = MAX_HELD.saturating_sub(self.held_len(*hold));
                let kept = (end - start).min(room);
                if kept > 0 {
                    match &mut hold.run {
                        Some((_, e)) if *e == start => *e = start + kept,
                        other => {
                            // Not reached (an event's pushed bytes are consecutive); kept
                            // correct anyway.
                            if let Some((s, e)) = other.take() {
                                self.held.extend_from_slice(&piece[s..e]);
                            }
                            *other = Some((start, start + kept));
                        }
                    }
                }
                if start + kept < end {
                    // Too long to be the usage chunk: the byte past the limit releases it.
                    self.forward_held(hold, out);
                    out.slice(start + kept, end);
                    self.mode = Mode::Passing;
                }
            }
        }
    }

    /// A blank line ended the current event (its bytes are pushed already).
    fn end_event(&mut self, piece: &Bytes, hold: &mut Hold, out: &mut Out<'_>) -> LfOwner {
        let owner = match self.mode {
            Mode::Holding => {
                // The event's bytes in one slice: the piece's own when nothing was carried.
                let run = hold.run.map_or(&[][..], |(s, e)| &piece[s..e]);
                let whole: Cow<'_, [u8]> = if self.held.is_empty() {
                    Cow::Borrowed(run)
                } else {
                    Cow::Owned([&self.held[..], run].concat())
                };
                // An event with a choice key is never removed: pieces may already have released
                // it for that key, and whether it is removed must not depend on how it was split.
                if !has_choice_key(&whole) && is_usage_only(&whole) {
                    self.removed += 1;
                    self.held.clear();
                    hold.run = None;
                    LfOwner::Removed
                } else {
                    self.forward_held(hold, out);
                    LfOwner::Forwarded
                }
            }
            Mode::Passing => LfOwner::Forwarded,
        };
        self.held.clear();
        hold.run = None;
        self.scanned = 0;
        self.mode = Mode::Holding;
        owner
    }

    /// At the end of a piece: forwards a held event as soon as it shows it is not the usage
    /// chunk, else keeps its bytes for the next piece.
    fn release_if_content(&mut self, piece: &Bytes, mut hold: Hold, out: &mut Out<'_>) {
        if self.mode != Mode::Holding || self.held_len(hold) == 0 {
            return;
        }
        if self.held.is_empty() {
            // The event began in this piece: search it all, forward it as a slice.
            if let Some((s, e)) = hold.run {
                if has_choice_key(&piece[s..e]) {
                    out.slice(s, e);
                    self.mode = Mode::Passing;
                    return;
                }
            }
        }
        if let Some((s, e)) = hold.run.take() {
            self.held.extend_from_slice(&piece[s..e]);
        }
        // Search only what is new, with an overlap for a key split across pieces.
        let from = self.scanned.saturating_sub(8);
        if has_choice_key(&self.held[from..]) {
            let mut none = Hold::default();
            self.forward_held(&mut none, out);
            self.mode = Mode::Passing;
        } else {
            self.scanned = self.held.len();
        }
    }
}

/// A response body with the usage-only events removed (see the module doc).
#[pin_project]
pub struct StripUsage<B> {
    #[pin]
    inner: B,
    filter: UsageFilter,
    ended: bool,
}

impl<B> StripUsage<B> {
    pub fn new(inner: B) -> Self {
        StripUsage {
            inner,
            filter: UsageFilter::default(),
            ended: false,
        }
    }
}

impl<B> Body for StripUsage<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        loop {
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.filter.feed_bytes(&data);
                        // An empty data frame would be an empty chunk: poll on instead.
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(None) => {
                    *this.ended = true;
                    let rest = this.filter.finish();
                    if rest.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
                other => return other,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.inner.is_end_stream() && !self.filter.holding())
    }

    fn size_hint(&self) -> SizeHint {
        // Bytes may be removed: the upstream's length no longer holds.
        SizeHint::default()
    }
}

#[cfg(test)]
mod reference;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::protocol::request;

    const CHAT: &str = "/v1/chat/completions";

    /// `add_usage` as the proxy calls it: on the layout of the one parse of the body.
    fn add_on(path: &str, body: &[u8]) -> Option<Vec<u8>> {
        add_usage(path, body, &request::read(body).1)
    }

    fn add(body: &str) -> Option<String> {
        add_on(CHAT, body.as_bytes()).map(|b| String::from_utf8(b).expect("utf-8"))
    }

    #[test]
    fn asks_for_usage_touching_nothing_else() {
        assert_eq!(
            add(r#"{"model":"m", "stream": true, "temperature":0.70,"seed":123456789012345678901234}"#)
                .as_deref(),
            Some(r#"{"stream_options":{"include_usage":true},"model":"m", "stream": true, "temperature":0.70,"seed":123456789012345678901234}"#)
        );
        assert_eq!(
            add("  {\"stream\":true,\"stream_options\":{\"include_usage\":false}}\n").as_deref(),
            Some("  {\"stream\":true,\"stream_options\":{\"include_usage\":true}}\n")
        );
        assert_eq!(
            add(r#"{"stream":true,"stream_options":null}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)
        );
        assert_eq!(
            add(r#"{"stream":true,"stream_options":{}}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)
        );
        let completions = add_on("/v1/completions", br#"{"prompt":"a","stream":true}"#);
        assert!(completions.is_some());
    }

    #[test]
    fn leaves_alone_what_it_must_not_change() {
        for body in [
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"stream":true,"stream_options":{"continuous_usage_stats":true}}"#,
            r#"{"stream":true,"stream_options":"x"}"#,
            r#"{"stream":false}"#,
            r#"{"stream":"true"}"#,
            r#"{"messages":[]}"#,
            r#"[{"stream":true}]"#,
            r#"{"stream":true"#,
            "\u{feff}{\"stream\":true}",
        ] {
            assert_eq!(add(body), None, "{body}");
        }
        // serde_json checks UTF-8 only in the strings it reads; such a body is read, not written.
        assert_eq!(add_on(CHAT, b"{\"stream\":true,\"x\":\"\xff\"}"), None);
        assert_eq!(add_on("/v1/messages", br#"{"stream":true}"#), None);
        assert_eq!(add_on("/api/chat", br#"{"stream":true}"#), None);
    }

    const CONTENT: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
    const USAGE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn filter_pieces(pieces: &[&[u8]]) -> (Vec<u8>, u64) {
        let mut f = UsageFilter::default();
        let mut out = Vec::new();
        for p in pieces {
            out.extend_from_slice(&f.feed(p));
        }
        out.extend_from_slice(&f.finish());
        (out, f.removed())
    }

    /// Filters `input` whole, split at every offset and byte by byte; all must give `want`.
    fn check(input: &str, want: &str, removed: u64) {
        let input = input.as_bytes();
        assert_eq!(
            filter_pieces(&[input]),
            (want.as_bytes().to_vec(), removed),
            "whole"
        );
        for i in 0..=input.len() {
            let (a, b) = input.split_at(i);
            let got = filter_pieces(&[a, b]);
            assert_eq!(got, (want.as_bytes().to_vec(), removed), "split at {i}");
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(
            filter_pieces(&bytes),
            (want.as_bytes().to_vec(), removed),
            "bytes"
        );
    }

    #[test]
    fn removes_exactly_the_usage_chunk() {
        let with = format!("{CONTENT}{CONTENT}{USAGE}{DONE}");
        check(&with, &format!("{CONTENT}{CONTENT}{DONE}"), 1);
        let crlf = with.replace('\n', "\r\n");
        check(
            &crlf,
            &format!("{CONTENT}{CONTENT}{DONE}").replace('\n', "\r\n"),
            1,
        );
        let cr = with.replace('\n', "\r");
        check(
            &cr,
            &format!("{CONTENT}{CONTENT}{DONE}").replace('\n', "\r"),
            1,
        );
    }

    #[test]
    fn everything_else_passes_unchanged() {
        for body in [
            format!(": ping\n\n{CONTENT}\n\nevent: x\ndata: {{}}\n\n{DONE}"),
            // Usage inside a content chunk (continuous usage stats) is not the extra chunk.
            "data: {\"choices\":[{\"index\":0,\"delta\":{}}],\"usage\":{\"completion_tokens\":1}}\n\n"
                .to_string(),
            "data: {\"choices\":[],\"usage\":null}\n\n".to_string(),
            "data: {\"choices\":[]\n\n".to_string(),
            // Unterminated at the end: forwarded at finish.
            format!("{CONTENT}data: {{\"choices\":[],\"usage\":{{}}}}"),
        ] {
            check(&body, &body, 0);
        }
    }

    #[test]
    fn a_leading_bom_is_no_text_so_a_blank_line_after_it_ends_an_event() {
        // As the meter's decoder reads it: the BOM and its blank line are an event of their own,
        // forwarded, and the usage chunk after them is removed alone.
        let bom = "\u{feff}";
        check(
            &format!("{bom}\n{USAGE}{DONE}"),
            &format!("{bom}\n{DONE}"),
            1,
        );
        check(
            &format!("{bom}\r\n{CONTENT}{USAGE}"),
            &format!("{bom}\r\n{CONTENT}"),
            1,
        );
    }

    #[test]
    fn content_is_not_held_back_past_its_choice_keys() {
        let mut f = UsageFilter::default();
        let (head, rest) = CONTENT.split_at(CONTENT.find("\"delta\":").expect("key") + 8);
        assert_eq!(
            &f.feed(head.as_bytes())[..],
            head.as_bytes(),
            "released at the key"
        );
        assert_eq!(&f.feed(rest.as_bytes())[..], rest.as_bytes());
        // A usage chunk is held until its end, then dropped.
        let (u1, u2) = USAGE.split_at(40);
        assert!(f.feed(u1.as_bytes()).is_empty());
        assert!(f.feed(u2.as_bytes()).is_empty());
        assert_eq!(f.removed(), 1);
    }

    #[test]
    fn a_long_event_is_forwarded_once_over_the_limit() {
        let long = format!("data: {}\n\n", "x".repeat(MAX_HELD + 10));
        let mut f = UsageFilter::default();
        let first = f.feed(&long.as_bytes()[..MAX_HELD + 1]);
        assert_eq!(first.len(), MAX_HELD + 1);
        assert!(!f.holding());
        let rest = f.feed(&long.as_bytes()[MAX_HELD + 1..]);
        assert_eq!([&first[..], &rest[..]].concat(), long.as_bytes());
    }

    // === The slicing filter against the byte-at-a-time model ===

    /// Pieces an SSE stream is made of, terminators of all three kinds among them.
    const PARTS: &[&[u8]] = &[
        b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}",
        b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}",
        b"data: {\"choices\":[{\"text\":\"y\"}]}",
        b"data: {\"choices\":[],\"usage\":{\"index\":1}}",
        b"data: [DONE]",
        b": keep-alive",
        b"event: x",
        b"data: {\"choices\":[],",
        b"\"usage\":{}}",
        b"\n",
        b"\n\n",
        b"\r",
        b"\r\n",
        b"\r\n\r\n",
        b"z",
        b"\xEF\xBB\xBF",
    ];

    /// Each piece's output and the count removed, with `feed_bytes` (the body's path) or the
    /// model.
    fn both(body: &[u8], cuts: &[usize]) -> ((Vec<Bytes>, u64), (Vec<Bytes>, u64)) {
        let mut pieces = Vec::new();
        let mut at = 0;
        for &c in cuts {
            let c = c.min(body.len());
            if c >= at {
                pieces.push(&body[at..c]);
                at = c;
            }
        }
        pieces.push(&body[at..]);
        let (mut f, mut r) = (UsageFilter::default(), reference::Reference::default());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for p in &pieces {
            a.push(f.feed_bytes(&Bytes::copy_from_slice(p)));
            b.push(r.feed(p));
        }
        a.push(f.finish());
        b.push(r.finish());
        ((a, f.removed()), (b, r.removed()))
    }

    proptest! {
        #[test]
        fn slices_give_every_piece_the_same_bytes_as_the_byte_at_a_time_filter(
            parts in prop::collection::vec(0..PARTS.len(), 0..40),
            mut cuts in prop::collection::vec(0usize..2000, 0..12),
        ) {
            let body: Vec<u8> = parts.iter().flat_map(|&i| PARTS[i].iter().copied()).collect();
            cuts.sort_unstable();
            let (got, want) = both(&body, &cuts);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_long_event_is_released_at_the_same_byte_as_the_byte_at_a_time_filter() {
        // Events around MAX_HELD, with no choice key, split near the limit.
        for len in [MAX_HELD - 1, MAX_HELD, MAX_HELD + 1, MAX_HELD + 100] {
            let mut body = b"data: ".to_vec();
            body.resize(len, b'a');
            body.extend_from_slice(b"\n\ndata: {\"choices\":[],\"usage\":{}}\n\n");
            for cut in [
                0,
                1,
                MAX_HELD - 7,
                MAX_HELD - 1,
                MAX_HELD,
                MAX_HELD + 1,
                len,
            ] {
                let (got, want) = both(&body, &[cut]);
                assert_eq!(got, want, "event of {len} bytes cut at {cut}");
            }
            let (got, want) = both(&body, &[MAX_HELD / 2, MAX_HELD + 3]);
            assert_eq!(got, want, "event of {len} bytes in three pieces");
        }
    }

    #[test]
    fn a_piece_of_whole_content_events_is_forwarded_without_a_copy() {
        let piece = Bytes::from(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n\
             data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n",
        );
        let out = UsageFilter::default().feed_bytes(&piece);
        assert_eq!(out, piece);
        assert_eq!(out.as_ptr(), piece.as_ptr(), "a slice of the same buffer");
        // The usage chunk at the end is cut off the same buffer.
        let mut with_usage = piece.to_vec();
        with_usage.extend_from_slice(b"data: {\"choices\":[],\"usage\":{}}\n\n");
        let with_usage = Bytes::from(with_usage);
        let out = UsageFilter::default().feed_bytes(&with_usage);
        assert_eq!(out, piece);
        assert_eq!(out.as_ptr(), with_usage.as_ptr());
    }
}
