//! Reading a response body: its framing and the choice of the extractor that reads it.
//!
//! A [`Reader`] owns everything decoding takes for one response: the framing decoder ([`sse`],
//! [`ndjson`], or the whole-body buffer for a plain JSON document), the wire format's
//! [`Extractor`] (chosen by [`select`]: `--api` when pinned, else [`detect::Auto`]), and the
//! tokens counted so far. [`Reader::feed`] takes the bytes of one body frame and returns what
//! they said as a [`Chunk`]: the token-bearing events it completed, and whether the stream's end
//! marker has passed. It knows nothing of time or metrics; the meter times what it returns.
//!
//! **Invariant:** what a reader returns does not depend on how the body was split into frames,
//! it never panics, and its memory is bounded by `--max-line-bytes` (a longer line, event or
//! document is dropped and counted in [`DecodeErrors`]).

pub mod ndjson;
pub mod sse;
pub mod transcript;

pub use self::transcript::Transcript;

pub use crate::protocol::Message;
use crate::protocol::{self, detect, Api, Extractor, Kinds, OutputKind, Summary, TokenSource};

/// Errors a decoder counts instead of failing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DecodeErrors {
    /// Lines (or events, or a whole JSON document) longer than the limit, skipped unparsed.
    pub line_too_long: u64,
}

/// How a response body is split into messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `text/event-stream`.
    Sse,
    /// Newline-delimited JSON (Ollama).
    Ndjson,
    /// One JSON document: a non-streaming response, parsed once at the end.
    Json,
    /// Not something we can read: forwarded and timed only.
    Opaque,
}

/// The framing a content type names, if it names one we read. The media type is compared
/// without its parameters and case-insensitively (RFC 9110 §8.3.1), so
/// `Text/Event-Stream; charset=utf-8` is SSE. The one place that answers "is this SSE".
pub fn content_framing(content_type: &str) -> Option<Framing> {
    let mime = content_type.split(';').next().unwrap_or("").trim();
    let is = |name: &str| mime.eq_ignore_ascii_case(name);
    if is("text/event-stream") {
        Some(Framing::Sse)
    } else if is("application/x-ndjson")
        || is("application/ndjson")
        || is("application/jsonl")
        || is("application/x-jsonlines")
    {
        Some(Framing::Ndjson)
    } else if is("application/json") || ends_with_ignore_case(mime, "+json") {
        Some(Framing::Json)
    } else {
        None
    }
}

fn ends_with_ignore_case(s: &str, suffix: &str) -> bool {
    s.len() >= suffix.len()
        && s.as_bytes()[s.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

/// How an API frames a stream when the content type does not say.
fn stream_framing(api: Api) -> Framing {
    match api {
        Api::Ollama => Framing::Ndjson,
        Api::Unknown => Framing::Opaque,
        _ => Framing::Sse,
    }
}

/// Chooses the framing and extractor for a response.
///
/// `pin` is `--api` (`None`: auto). A stream (SSE or NDJSON) is read whatever its path, since
/// the first message tells its format; a plain JSON body only when the path or the pin says it
/// is an inference API, so that large JSON bodies of other endpoints are not buffered. A content
/// type we do not know is read only when the format is pinned or the path names one.
pub fn select(path: &str, content_type: &str, pin: Option<Api>) -> (Framing, Box<dyn Extractor>) {
    let hint = pin.or_else(|| detect::path_hint(path));
    let framing = match (content_framing(content_type), hint) {
        (Some(Framing::Json), None) => Framing::Opaque,
        (Some(f), _) => f,
        (None, Some(api)) => stream_framing(api),
        (None, None) => Framing::Opaque,
    };
    if framing == Framing::Opaque {
        return (framing, Box::<protocol::Opaque>::default());
    }
    let extractor = match pin {
        Some(api) => protocol::extractor(api),
        None => Box::new(detect::Auto::new(hint)),
    };
    (framing, extractor)
}

/// One token-bearing event (an SSE event, an NDJSON line) a chunk completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The output tokens the event carries (at least 1: events without tokens are not listed).
    pub tokens: u32,
    /// The kinds of output it carries, where the format marks them (else content).
    pub kinds: Kinds,
}

/// What one piece of the body said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// The token-bearing events the piece completed, in stream order.
    pub events: &'a [Event],
    /// Tokens of a whole non-streaming JSON document (only at [`Reader::finish`]): they count,
    /// but no event carried them, so they have no first token.
    pub document: u32,
    /// The model the stream had named by its first token-bearing event (fixed from then on;
    /// `None` before it, or when the stream named none by then).
    pub model: Option<&'a str>,
    /// The stream's end marker has passed (it stays set once set; see [`Summary::ended`]).
    pub ended: bool,
}

/// The framing decoder's state.
enum Decoder {
    Sse(sse::Decoder),
    Ndjson(ndjson::Decoder),
    /// A whole JSON document, kept up to the line limit and parsed once at the end.
    Json {
        body: Vec<u8>,
        max: usize,
        overflow: bool,
    },
    Opaque,
}

/// Reads one response body.
pub struct Reader {
    decoder: Decoder,
    tally: Tally,
}

/// The extractor and what it has said, apart from the decoder that calls into it.
struct Tally {
    extractor: Box<dyn Extractor>,
    /// The events of the latest chunk (reused, so the per-frame path does not allocate).
    events: Vec<Event>,
    /// Output tokens counted from events (and a whole document) so far.
    counted: u64,
    /// The tokens of events that carried reasoning and nothing else.
    counted_reasoning: u64,
    /// The model the stream had named when its first token-bearing event came.
    first_model: Option<String>,
    /// The events' text, for a tokenizer to count (`None`: nobody counts it).
    transcript: Option<Box<Transcript>>,
}

impl Reader {
    /// A reader for a response whose body is not read (no response head yet, or a compressed
    /// body): it reports nothing, and its API is `unknown`.
    pub fn opaque() -> Self {
        Reader::with(Decoder::Opaque, Box::<protocol::Opaque>::default())
    }

    /// A reader for a response to `path` with `content_type`, keeping at most `max_line` bytes of
    /// one line (or of a JSON document). `pin` is `--api`.
    pub fn new(path: &str, content_type: &str, pin: Option<Api>, max_line: usize) -> Self {
        let (framing, extractor) = select(path, content_type, pin);
        let decoder = match framing {
            Framing::Sse => Decoder::Sse(sse::Decoder::new(max_line)),
            Framing::Ndjson => Decoder::Ndjson(ndjson::Decoder::new(max_line)),
            Framing::Json => Decoder::Json {
                body: Vec::new(),
                max: max_line,
                overflow: false,
            },
            Framing::Opaque => Decoder::Opaque,
        };
        Reader::with(decoder, extractor)
    }

    fn with(decoder: Decoder, extractor: Box<dyn Extractor>) -> Self {
        Reader {
            decoder,
            tally: Tally {
                extractor,
                events: Vec::new(),
                counted: 0,
                counted_reasoning: 0,
                first_model: None,
                transcript: None,
            },
        }
    }

    /// Reads the next piece of the body.
    pub fn feed(&mut self, data: &[u8]) -> Chunk<'_> {
        let tally = &mut self.tally;
        tally.events.clear();
        let mut on = |msg: Message<'_>| tally.on_message(&msg);
        match &mut self.decoder {
            Decoder::Sse(d) => d.feed(data, &mut on),
            Decoder::Ndjson(d) => d.feed(data, &mut on),
            Decoder::Json {
                body,
                max,
                overflow,
            } => {
                if *overflow {
                } else if body.len() + data.len() > *max {
                    *overflow = true;
                    *body = Vec::new();
                } else {
                    body.extend_from_slice(data);
                }
            }
            Decoder::Opaque => {}
        }
        self.tally.chunk(0)
    }

    /// The body ended: completes the decoder's pending input. `complete` is false when the body
    /// was cut short: it then ends in a fragment of a line, which is not an event and not
    /// malformed, and a partial JSON document is not parsed.
    pub fn finish(&mut self, complete: bool) -> Chunk<'_> {
        let tally = &mut self.tally;
        tally.events.clear();
        let mut document = 0;
        let mut on = |msg: Message<'_>| tally.on_message(&msg);
        match &mut self.decoder {
            Decoder::Sse(d) if complete => d.finish(&mut on),
            Decoder::Ndjson(d) if complete => d.finish(&mut on),
            Decoder::Sse(_) | Decoder::Ndjson(_) => {}
            Decoder::Json { body, overflow, .. } => {
                if complete && !*overflow && !body.is_empty() {
                    let tally = &mut self.tally;
                    document = tally.extractor.on_message(&Message {
                        event: "",
                        data: body,
                    });
                    tally.counted += u64::from(document);
                }
                *body = Vec::new();
            }
            Decoder::Opaque => {}
        }
        self.tally.chunk(document)
    }

    /// Keeps the text of every token-bearing event from now on, for a tokenizer (bounded:
    /// [`transcript::MAX_TEXT_BYTES`]).
    pub fn transcribe(&mut self) {
        self.tally.transcript.get_or_insert_with(Box::default);
    }

    /// The text kept since [`Reader::transcribe`], handed over once.
    pub fn take_transcript(&mut self) -> Option<Box<Transcript>> {
        self.tally.transcript.take()
    }

    /// Which parser reads this body (after detection, for an auto-detecting extractor).
    pub fn api(&self) -> Api {
        self.tally.extractor.api()
    }

    /// Everything the stream has reported about itself so far.
    pub fn summary(&self) -> &Summary {
        self.tally.extractor.summary()
    }

    /// Output tokens counted from events (and a whole document) so far.
    pub fn counted(&self) -> u64 {
        self.tally.counted
    }

    /// Reasoning tokens: the usage report's, else the tokens of events that carried reasoning
    /// and nothing else (an event mixing kinds cannot be split); `None` when there were none.
    pub fn reasoning(&self) -> Option<u64> {
        let counted = self.tally.counted_reasoning;
        self.summary()
            .reasoning_tokens
            .or((counted > 0).then_some(counted))
    }

    /// The response's output tokens by the order of truth (see [`Summary::output`]).
    pub fn output(&self) -> (u64, TokenSource) {
        self.summary().output(self.tally.counted)
    }

    /// What the framing decoder counted instead of failing.
    pub fn errors(&self) -> DecodeErrors {
        match &self.decoder {
            Decoder::Sse(d) => d.errors(),
            Decoder::Ndjson(d) => d.errors(),
            Decoder::Json { overflow, .. } => DecodeErrors {
                line_too_long: u64::from(*overflow),
            },
            Decoder::Opaque => DecodeErrors::default(),
        }
    }
}

impl Tally {
    fn on_message(&mut self, m: &Message<'_>) {
        let tokens = self.extractor.on_message(m);
        if tokens == 0 {
            return;
        }
        if self.counted == 0 {
            // The first token-bearing event: the model named so far is the one it is timed as.
            self.first_model = self.extractor.summary().model.clone();
        }
        let kinds = self.extractor.kinds();
        // An extractor that counted tokens always carries some kind; guard the contract anyway.
        let kinds = if kinds.is_empty() {
            Kinds::CONTENT
        } else {
            kinds
        };
        if kinds == Kinds::of(OutputKind::Reasoning) {
            self.counted_reasoning += u64::from(tokens);
        }
        self.events.push(Event { tokens, kinds });
        self.counted += u64::from(tokens);
        if let Some(t) = &mut self.transcript {
            t.on_event(self.extractor.api(), m.data, tokens);
        }
    }

    fn chunk(&self, document: u32) -> Chunk<'_> {
        Chunk {
            events: &self.events,
            document,
            model: self.first_model.as_deref(),
            ended: self.extractor.summary().ended,
        }
    }
}

#[cfg(test)]
mod tests;
