//! Recognising the wire format of a response without being told.
//!
//! The first message is the best witness: every format we read has a shape (a field, an event
//! name, a `type` value) no other format shares. The request path is the tie-breaker, because
//! paths lie in both directions: TGI, llama.cpp, SGLang and Ollama all serve OpenAI's
//! `/v1/chat/completions` too, llama.cpp serves its native API on `/completions`, and TGI and
//! SGLang share `/generate`. So [`Auto`] decides on the first message that shows a format. A
//! neutral message (a `ping`, an `error`, `[DONE]`: several formats send them) decides nothing;
//! a message no format explains (broken JSON, an unknown shape) means the path's format, whose
//! extractor then counts it as malformed. With no path hint, [`MAX_UNDECIDED`] messages that
//! tell nothing make the stream unknown.
//!
//! [`Auto::summary`] is the chosen extractor's, so its [`Summary::ended`] is what the meter sees,
//! also when the end marker is the first message (a lone `message_stop` or `"done": true` shows
//! its format, and is then read by it). Two end markers are neutral: `[DONE]` and Replicate's
//! `done` event. When one comes before anything has shown the format (an error, then `[DONE]`),
//! the stream is over all the same: [`Auto`] records the end itself and reads nothing after it.

use self::shape::{Key, Shape, Top};
use super::{extractor, is_done, Api, Extractor, Kinds, Message, Summary};

mod shape;

/// Messages an undecided [`Auto`] inspects before it settles for the path's format (or none).
/// Real streams decide on their first message; this bounds the work spent on one we cannot read.
pub const MAX_UNDECIDED: u32 = 16;

/// What one message says about the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniff {
    /// This format, and no other, sends such a message.
    Format(Api),
    /// Several formats send such a message (keep-alives, errors, the end sentinel).
    Neutral,
    /// No format we know sends it.
    Unknown,
}

/// The format a request path suggests, if any.
pub fn path_hint(path: &str) -> Option<Api> {
    let p = path.trim_end_matches('/');
    let api = if p.contains(":streamGenerateContent") || p.contains(":generateContent") {
        Api::Gemini
    } else if p.ends_with("/completions") {
        Api::OpenAi
    } else if p.ends_with("/completion") {
        Api::LlamaCpp
    } else if p.ends_with("/responses") || p.contains("/responses/") {
        Api::Responses
    } else if p.ends_with("/messages") {
        Api::Anthropic
    } else if p.ends_with("/api/generate") || p.ends_with("/api/chat") {
        Api::Ollama
    } else if p.contains("/v2/models/")
        && (p.ends_with("/generate_stream") || p.ends_with("/generate"))
    {
        Api::Triton
    } else if p.ends_with("/generate_stream") || p.ends_with("/generate") {
        // SGLang's native `/generate` is told apart by its first message.
        Api::Tgi
    } else if p.ends_with("/v2/chat") {
        Api::Cohere
    } else if p.contains("/generation/text") {
        Api::Watsonx
    } else if p.contains("/v1/streams/") {
        Api::Replicate
    } else {
        return None;
    };
    Some(api)
}

/// The format an event name or a JSON `type` value belongs to, when it is decisive.
fn by_type(t: &str) -> Option<Api> {
    match t {
        "message_start"
        | "message_delta"
        | "message_stop"
        | "content_block_start"
        | "content_block_delta"
        | "content_block_stop" => Some(Api::Anthropic),
        "message-start" | "message-end" | "content-start" | "content-delta" | "content-end"
        | "tool-plan-delta" | "tool-call-start" | "tool-call-delta" | "tool-call-end"
        | "citation-start" | "citation-end" => Some(Api::Cohere),
        t if t.starts_with("response.") => Some(Api::Responses),
        _ => None,
    }
}

/// Event names and `type` values that several formats use.
fn is_neutral_type(t: &str) -> bool {
    matches!(t, "ping" | "error" | "keep-alive" | "keepalive" | "done")
}

/// What one message shows about the format.
pub fn sniff(msg: &Message<'_>) -> Sniff {
    if msg.event == "output" {
        // Replicate's data is plain text, not JSON: the event name is all there is.
        return Sniff::Format(Api::Replicate);
    }
    if let Some(api) = by_type(msg.event) {
        return Sniff::Format(api);
    }
    if is_neutral_type(msg.event)
        || msg.data == b"[DONE]"
        || msg.data.iter().all(u8::is_ascii_whitespace)
    {
        return Sniff::Neutral;
    }
    // Gemini without `alt=sse`, and TGI's non-streaming answer, are JSON arrays: their first
    // element is read.
    match shape::read(msg.data) {
        Some(Top::Object(o)) if o.is_empty() || o.has(Key::Error) => Sniff::Neutral,
        Some(Top::Object(o)) => sniff_object(&o),
        Some(Top::Empty) => Sniff::Neutral,
        Some(Top::Other) | None => Sniff::Unknown,
    }
}

fn sniff_object(o: &Shape<'_>) -> Sniff {
    if let Some(t) = o.kind.as_deref() {
        if let Some(api) = by_type(t) {
            return Sniff::Format(api);
        }
        if is_neutral_type(t) {
            return Sniff::Neutral;
        }
    }
    sniff_shape(o).map_or(Sniff::Unknown, Sniff::Format)
}

/// The format an object's fields show, if any.
fn sniff_shape(o: &Shape<'_>) -> Option<Api> {
    use Key::*;
    let has = |k: Key| o.has(k);
    if o.kind.as_deref() == Some("message") && has(Role) {
        return Some(Api::Anthropic); // a non-streaming Messages response
    }
    match o.object.as_deref() {
        Some("chat.completion.chunk" | "chat.completion" | "text_completion") => {
            return Some(Api::OpenAi)
        }
        Some("response") => return Some(Api::Responses),
        _ => {}
    }
    let api = if has(Choices) {
        Api::OpenAi
    } else if has(Candidates) || has(UsageMetadata) {
        Api::Gemini
    } else if has(MetaInfo) {
        Api::Sglang
    } else if has(TextOutput) || (has(ModelName) && has(ModelVersion)) {
        Api::Triton
    } else if has(Token) || has(GeneratedText) {
        Api::Tgi
    } else if has(Results) && has(ModelId) {
        Api::Watsonx
    } else if has(CreatedAt) && has(Done) {
        Api::Ollama
    } else if has(Content) && (has(Stop) || has(IdSlot) || has(TokensPredicted) || has(Timings)) {
        Api::LlamaCpp
    } else if has(Message) && has(FinishReason) && has(Usage) {
        Api::Cohere // a non-streaming v2 chat response
    } else {
        return None;
    };
    Some(api)
}

/// An extractor that recognises the format, then hands every message to that format's extractor.
pub struct Auto {
    hint: Option<Api>,
    inner: Option<Box<dyn Extractor>>,
    undecided: u32,
    /// The summary while nothing is decided: empty, but for `ended` (see the module doc).
    none: Summary,
}

impl Auto {
    /// `hint` is the format the request path suggests.
    pub fn new(hint: Option<Api>) -> Self {
        Auto {
            hint,
            inner: None,
            undecided: 0,
            none: Summary::default(),
        }
    }
}

impl Extractor for Auto {
    fn api(&self) -> Api {
        match &self.inner {
            Some(x) => x.api(),
            None => self.hint.unwrap_or(Api::Unknown),
        }
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        if self.inner.is_none() {
            if self.none.ended {
                // Nothing that follows an end marker counts.
                return 0;
            }
            let api = match (sniff(msg), self.hint) {
                (Sniff::Format(api), _) | (Sniff::Unknown, Some(api)) => Some(api),
                (Sniff::Neutral, _) if is_done(msg) || msg.event == "done" => {
                    self.none.ended = true;
                    return 0;
                }
                (Sniff::Neutral | Sniff::Unknown, hint) => {
                    self.undecided += 1;
                    if self.undecided < MAX_UNDECIDED {
                        return 0;
                    }
                    hint
                }
            };
            self.inner = Some(extractor(api.unwrap_or(Api::Unknown)));
        }
        match &mut self.inner {
            Some(x) => x.on_message(msg),
            None => 0,
        }
    }

    fn summary(&self) -> &Summary {
        match &self.inner {
            Some(x) => x.summary(),
            None => &self.none,
        }
    }

    fn kinds(&self) -> Kinds {
        self.inner.as_ref().map_or(Kinds::NONE, |x| x.kinds())
    }
}

#[cfg(test)]
mod tests;
