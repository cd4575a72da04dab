//! Wire formats: one extractor per API, behind one trait.
//!
//! A decoder ([`crate::sse`], [`crate::ndjson`], or the whole body for plain JSON) splits the
//! response into [`Message`]s; an [`Extractor`] reads each message and says how many output tokens
//! it carries, and keeps what the stream reports about itself (model, usage) in a [`Summary`].
//! Extractors never fail: a message they cannot read is counted in [`Summary::malformed`].
//!
//! Adding a format is one file here plus corpus tests.

pub mod openai;
pub mod request;

/// One unit of a streamed body: an SSE event, one NDJSON line, or a whole JSON document.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// The SSE `event:` field, or `""` when there is none (always `""` for NDJSON and JSON).
    pub event: &'a str,
    /// The payload: SSE `data:` lines joined by `\n`, or the line / document itself.
    pub data: &'a [u8],
}

/// The API whose parser ran: the value of the `api` label. A closed set keeps the label bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    OpenAi,
    Unknown,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenAi => "openai",
            Api::Unknown => "unknown",
        }
    }
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

/// What a stream has said about itself so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// The model the response names.
    pub model: Option<String>,
    /// Prompt tokens, from the stream's usage report.
    pub input_tokens: Option<u64>,
    /// Output tokens, from the stream's usage report (the latest report wins: never summed).
    pub output_tokens: Option<u64>,
    /// Output tokens, from per-event token ids or counts the format carries (exact, no usage).
    pub token_id_tokens: Option<u64>,
    /// Messages that were not valid JSON of the expected shape.
    pub malformed: u64,
    /// The stream sent its own end marker (OpenAI's `data: [DONE]`): the client has everything.
    pub ended: bool,
}

/// Reads the messages of one response.
pub trait Extractor: Send + Sync {
    /// Which parser this is (after detection, for an auto-detecting extractor).
    fn api(&self) -> Api;
    /// Looks at one message; returns the number of output tokens it carries (0: not token-bearing).
    fn on_message(&mut self, msg: &Message<'_>) -> u32;
    /// Everything the stream has reported about itself so far.
    fn summary(&self) -> &Summary;
}

/// An extractor for formats we cannot read: counts nothing.
#[derive(Debug, Default)]
pub struct Opaque {
    summary: Summary,
}

impl Extractor for Opaque {
    fn api(&self) -> Api {
        Api::Unknown
    }
    fn on_message(&mut self, _msg: &Message<'_>) -> u32 {
        0
    }
    fn summary(&self) -> &Summary {
        &self.summary
    }
}

/// Chooses the framing and extractor for a response.
pub fn select(path: &str, content_type: &str) -> (Framing, Box<dyn Extractor>) {
    let ct = content_type.to_ascii_lowercase();
    let framing = if ct.starts_with("text/event-stream") {
        Framing::Sse
    } else if ct.starts_with("application/x-ndjson") {
        Framing::Ndjson
    } else if ct.starts_with("application/json") {
        Framing::Json
    } else {
        Framing::Opaque
    };
    if framing != Framing::Opaque && openai::handles_path(path) {
        (framing, Box::new(openai::OpenAi::default()))
    } else {
        (Framing::Opaque, Box::new(Opaque::default()))
    }
}
