//! Wire formats: one extractor per API, behind one trait.
//!
//! A framing decoder (in `read`: SSE, NDJSON, or the whole body for plain JSON) splits the
//! response into [`Message`]s; an [`Extractor`] reads each message and says how many output tokens
//! it carries, and keeps what the stream reports about itself (model, usage) in a [`Summary`].
//! Extractors never fail: a message they cannot read is counted in [`Summary::malformed`].
//!
//! [`detect::Auto`] recognises the format from the first message (the request path is the
//! tie-breaker). [`timings`] reads what three engines state about a request's time. This module imports nothing above it: the reader chooses an extractor from
//! here, and the metrics take only the label enums ([`Api`], [`TokenSource`]). Adding a format
//! touches: its file here; this file (the module, the [`Api`] variant, `Api::KNOWN`,
//! [`Api::as_str`], [`extractor`]); `detect.rs` (what only it sends, its paths in `path_hint`;
//! `detect/shape.rs` when a top-level key tells it apart that `Key` does not list yet; cases in
//! `detect/tests.rs`); `operation.rs` (its OpenTelemetry operation, `Operation::of_api`, and its
//! paths'); `read/mod.rs` (its framing in `stream_framing` when the content type does not say);
//! `metrics/otel.rs` (its provider name, `provider`);
//! `timings.rs` if its stream states the engine's timings; and the corpus tests
//! (`tests/it/corpus.rs`). ARCHITECTURE.md lists the docs it goes into.

pub mod anthropic;
pub mod cohere;
pub mod cumulative;
pub mod detect;
pub mod gemini;
pub mod json;
pub mod llamacpp;
pub mod ollama;
pub mod openai;
pub mod operation;
pub mod replicate;
pub mod request;
pub mod responses;
pub mod sglang;
pub mod text;
pub mod tgi;
pub mod timings;
pub mod triton;
pub mod watsonx;

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
    /// OpenAI chat.completions and completions (and every server compatible with them).
    OpenAi,
    /// The OpenAI Responses API.
    Responses,
    /// Anthropic Messages.
    Anthropic,
    /// HuggingFace text-generation-inference native `/generate_stream`.
    Tgi,
    /// llama.cpp server native `/completion`.
    LlamaCpp,
    /// Ollama native `/api/generate` and `/api/chat`.
    Ollama,
    /// SGLang native `/generate`.
    Sglang,
    /// NVIDIA Triton `generate_stream`.
    Triton,
    /// Google Gemini `streamGenerateContent`.
    Gemini,
    /// Cohere v2 chat.
    Cohere,
    /// IBM watsonx.ai `generation/text_stream`.
    Watsonx,
    /// Replicate prediction streams (`event: output` with plain-text data).
    Replicate,
    /// Not a format we read: proxied and timed only.
    Unknown,
}

impl Api {
    /// Every variant that `--api` can pin, in `--help` order.
    pub const KNOWN: [Api; 12] = [
        Api::OpenAi,
        Api::Responses,
        Api::Anthropic,
        Api::Tgi,
        Api::LlamaCpp,
        Api::Ollama,
        Api::Sglang,
        Api::Triton,
        Api::Gemini,
        Api::Cohere,
        Api::Watsonx,
        Api::Replicate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenAi => "openai",
            Api::Responses => "responses",
            Api::Anthropic => "anthropic",
            Api::Tgi => "tgi",
            Api::LlamaCpp => "llamacpp",
            Api::Ollama => "ollama",
            Api::Sglang => "sglang",
            Api::Triton => "triton",
            Api::Gemini => "gemini",
            Api::Cohere => "cohere",
            Api::Watsonx => "watsonx",
            Api::Replicate => "replicate",
            Api::Unknown => "unknown",
        }
    }

    /// The variant `--api` names, if any (`auto` is not a variant: it is the absence of a pin).
    pub fn from_name(name: &str) -> Option<Api> {
        Api::KNOWN.into_iter().find(|a| a.as_str() == name)
    }
}

/// Where a request's token counts came from: the `source` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// The stream's own usage report.
    Usage,
    /// Per-event token ids or counts the format carries.
    TokenIds,
    /// Counting token-bearing events.
    Counted,
    /// The model's tokenizer over the text the response streamed (`--tokenizer`), where the
    /// stream gave no usage.
    Tokenizer,
}

impl TokenSource {
    /// Every variant, in exposition order.
    pub const ALL: [TokenSource; 4] = [
        TokenSource::Usage,
        TokenSource::TokenIds,
        TokenSource::Counted,
        TokenSource::Tokenizer,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TokenSource::Usage => "usage",
            TokenSource::TokenIds => "token_ids",
            TokenSource::Counted => "counted",
            TokenSource::Tokenizer => "tokenizer",
        }
    }
}

/// Why the model stopped, as the stream said: every format's own word for it, folded into the
/// two cases an engine distinguishes (vLLM's `finished_reason` `stop` and `length`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The model ended its answer: an end-of-sequence token, a stop string, a tool call.
    Stop,
    /// The output hit its limit: `max_tokens`, or the model's context length.
    Length,
}

impl Stop {
    /// The word for it in the request log and a span's `gen_ai.response.finish_reasons`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stop::Stop => "stop",
            Stop::Length => "length",
        }
    }

    /// Reads a format's finish reason: `length`, `max_tokens`, `MAX_TOKENS`,
    /// `max_output_tokens`, `limit`, `model_length` say the limit was hit; any other non-empty
    /// word (`stop`, `eos`, `eos_token`, `end_turn`, `stop_sequence`, `tool_calls`, `COMPLETE`,
    /// `STOP`, ...) that the model ended it. `not_finished` (watsonx, mid-stream) and an empty
    /// string say nothing.
    pub fn from_reason(reason: &str) -> Option<Stop> {
        let r = reason.trim();
        if r.is_empty() || r.eq_ignore_ascii_case("not_finished") || r == "null" {
            return None;
        }
        const LENGTH: [&str; 7] = [
            "length",
            "max_tokens",
            "max_output_tokens",
            "limit",
            "stopped_limit",
            "model_length",
            "model_context_window_exceeded",
        ];
        if LENGTH.iter().any(|l| r.eq_ignore_ascii_case(l)) {
            Some(Stop::Length)
        } else {
            Some(Stop::Stop)
        }
    }
}

/// The kind of output a token-bearing event carried, where its format marks it: the `kind`
/// label of `tokenmeter_time_to_first_output_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// Thinking: `reasoning_content` / `reasoning` deltas, Anthropic thinking blocks, Responses
    /// reasoning events, Gemini thought parts, Ollama `thinking`.
    Reasoning,
    /// The answer itself (and refusals): what a gateway waiting for `content` sees.
    Content,
    /// Tool-call (function-call) deltas.
    ToolCall,
}

impl OutputKind {
    /// Every variant, in exposition order (also the order of per-kind arrays).
    pub const ALL: [OutputKind; 3] = [
        OutputKind::Reasoning,
        OutputKind::Content,
        OutputKind::ToolCall,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OutputKind::Reasoning => "reasoning",
            OutputKind::Content => "content",
            OutputKind::ToolCall => "tool_call",
        }
    }
}

/// The kinds of output one message carried, as a set (a chunk may carry reasoning and content).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds(u8);

impl Kinds {
    pub const NONE: Kinds = Kinds(0);
    pub const REASONING: Kinds = Kinds(1 << 0);
    pub const CONTENT: Kinds = Kinds(1 << 1);
    pub const TOOL_CALL: Kinds = Kinds(1 << 2);

    /// The set holding `kind`.
    pub const fn of(kind: OutputKind) -> Kinds {
        match kind {
            OutputKind::Reasoning => Kinds::REASONING,
            OutputKind::Content => Kinds::CONTENT,
            OutputKind::ToolCall => Kinds::TOOL_CALL,
        }
    }

    pub fn contains(self, kind: OutputKind) -> bool {
        self.0 & Kinds::of(kind).0 != 0
    }

    /// `kind` added when `yes`.
    #[must_use]
    pub fn with(self, kind: OutputKind, yes: bool) -> Kinds {
        if yes {
            Kinds(self.0 | Kinds::of(kind).0)
        } else {
            self
        }
    }

    /// Both sets in one.
    #[must_use]
    pub fn union(self, other: Kinds) -> Kinds {
        Kinds(self.0 | other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// What a stream has said about itself so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// The model the response names.
    pub model: Option<String>,
    /// Prompt tokens, from the stream's usage report.
    pub input_tokens: Option<u64>,
    /// Output tokens, from the stream's usage report (the latest report wins: never summed).
    pub output_tokens: Option<u64>,
    /// Output tokens, from per-event token ids or counts the format carries (exact, no usage).
    pub token_id_tokens: Option<u64>,
    /// Reasoning tokens, from the usage report's details (part of `output_tokens`).
    pub reasoning_tokens: Option<u64>,
    /// Prompt tokens read from the server's prompt cache, from the usage report.
    pub cached_read: Option<u64>,
    /// Prompt tokens written to the server's prompt cache, from the usage report.
    pub cached_write: Option<u64>,
    /// Messages that were not valid JSON of the expected shape.
    pub malformed: u64,
    /// Why the model stopped, where the stream said so (the latest reason wins).
    pub stop: Option<Stop>,
    /// The stream sent its format's own end marker (`data: [DONE]`, `message_stop`,
    /// `"done": true`, ...; `docs/formats.md` names each): the client has everything, and
    /// nothing that counts follows. Once set it stays set. Formats without one (Gemini, Triton)
    /// never set it. A non-streaming response is read only after its body ended, so there it
    /// does not matter; it is set where the document has the final event's shape.
    pub ended: bool,
    /// Where the engine says the request's time went (vLLM's `metrics`, Ollama's durations,
    /// llama.cpp's `timings`): the latest statement wins.
    pub engine: Option<timings::EngineTimings>,
}

impl Summary {
    /// The request's output tokens by the order of truth: the stream's usage report, else the
    /// token ids its events carried, else `counted` (the tokens of token-bearing events).
    pub fn output(&self, counted: u64) -> (u64, TokenSource) {
        match (self.output_tokens, self.token_id_tokens) {
            (Some(n), _) => (n, TokenSource::Usage),
            (None, Some(n)) => (n, TokenSource::TokenIds),
            (None, None) => (counted, TokenSource::Counted),
        }
    }

    /// Keeps the latest finish reason a stream gives (a message without one changes nothing).
    pub fn stopped(&mut self, reason: json::Reason) {
        if reason.0.is_some() {
            self.stop = reason.0;
        }
    }

    /// Keeps the first non-empty model name a stream gives.
    fn name_model(&mut self, model: Option<std::borrow::Cow<'_, str>>) {
        if self.model.is_none() {
            if let Some(m) = model.filter(|m| !m.is_empty()) {
                self.model = Some(m.into_owned());
            }
        }
    }
}

/// Whether a message is OpenAI's end sentinel, `data: [DONE]`. SGLang's native stream, Cohere
/// v2 and OpenRouter's Responses streams send it too, always last.
fn is_done(msg: &Message<'_>) -> bool {
    msg.data == b"[DONE]"
}

/// Reads the messages of one response.
pub trait Extractor: Send + Sync {
    /// Which parser this is (after detection, for an auto-detecting extractor).
    fn api(&self) -> Api;
    /// Looks at one message; returns the number of output tokens it carries (0: not token-bearing).
    fn on_message(&mut self, msg: &Message<'_>) -> u32;
    /// Everything the stream has reported about itself so far.
    fn summary(&self) -> &Summary;
    /// The kinds of output the latest message carried (read after `on_message` returned more
    /// than 0). A format that does not mark them carries content.
    fn kinds(&self) -> Kinds {
        Kinds::CONTENT
    }
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

/// A fresh extractor for one API.
pub fn extractor(api: Api) -> Box<dyn Extractor> {
    match api {
        Api::OpenAi => Box::<openai::OpenAi>::default(),
        Api::Responses => Box::<responses::Responses>::default(),
        Api::Anthropic => Box::<anthropic::Anthropic>::default(),
        Api::Tgi => Box::<tgi::Tgi>::default(),
        Api::LlamaCpp => Box::<llamacpp::LlamaCpp>::default(),
        Api::Ollama => Box::<ollama::Ollama>::default(),
        Api::Sglang => Box::<sglang::Sglang>::default(),
        Api::Triton => Box::<triton::Triton>::default(),
        Api::Gemini => Box::<gemini::Gemini>::default(),
        Api::Cohere => Box::<cohere::Cohere>::default(),
        Api::Watsonx => Box::<watsonx::Watsonx>::default(),
        Api::Replicate => Box::<replicate::Replicate>::default(),
        Api::Unknown => Box::<Opaque>::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_names_round_trip_and_are_unique() {
        for api in Api::KNOWN {
            assert_eq!(Api::from_name(api.as_str()), Some(api));
        }
        assert_eq!(Api::from_name("auto"), None);
        assert_eq!(Api::from_name("unknown"), None);
        let mut names: Vec<&str> = Api::KNOWN.iter().map(|a| a.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Api::KNOWN.len());
    }

    #[test]
    fn output_follows_the_order_of_truth() {
        let mut s = Summary::default();
        assert_eq!(s.output(7), (7, TokenSource::Counted));
        s.token_id_tokens = Some(9);
        assert_eq!(s.output(7), (9, TokenSource::TokenIds));
        s.output_tokens = Some(11);
        assert_eq!(s.output(7), (11, TokenSource::Usage));
    }
}

/// What every extractor's unit tests share.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Extractor, Kinds, Message, Summary};

    /// Feeds `(event, data)` messages to `x`; returns the tokens each carried and the summary.
    pub fn run<'a>(
        x: &mut dyn Extractor,
        events: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> (Vec<u32>, Summary) {
        let counts = events
            .into_iter()
            .map(|(event, data)| {
                x.on_message(&Message {
                    event,
                    data: data.as_bytes(),
                })
            })
            .collect();
        (counts, x.summary().clone())
    }

    /// Feeds `(event, data)` messages to `x`; returns the kinds of each token-bearing one (a
    /// message that carries no token has no kind to check) and the summary.
    pub fn kinds<'a>(
        x: &mut dyn Extractor,
        events: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> (Vec<Kinds>, Summary) {
        let mut kinds = Vec::new();
        for (event, data) in events {
            let tokens = x.on_message(&Message {
                event,
                data: data.as_bytes(),
            });
            if tokens > 0 {
                kinds.push(x.kinds());
            }
        }
        (kinds, x.summary().clone())
    }

    /// Feeds `(event, data)` messages to `x`; returns the index of the message after which
    /// [`Summary::ended`] first held (`None`: never), and checks that it then stays set.
    pub fn ended_at<'a>(
        x: &mut dyn Extractor,
        events: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Option<usize> {
        let mut at = None;
        for (i, (event, data)) in events.into_iter().enumerate() {
            x.on_message(&Message {
                event,
                data: data.as_bytes(),
            });
            match (at, x.summary().ended) {
                (None, true) => at = Some(i),
                (Some(first), false) => panic!("ended at {first}, then not at {i}"),
                _ => {}
            }
        }
        at
    }
}
