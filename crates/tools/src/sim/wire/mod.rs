//! The simulator's wire formats: reading a request and writing its response, per dialect.
//!
//! Each format follows what the real servers send, as recorded in the corpus
//! (`../shared/corpus/`), and lives in its own file, as the proxy's extractors do in `protocol/`:
//!
//! - `openai.rs`: chat and completions as vLLM streams them (a role chunk first, written with
//!   the first token after prefill; `finish_reason` on the last token's chunk, a `choices: []`
//!   usage chunk when `stream_options.include_usage` is set, then `[DONE]`).
//! - `anthropic.rs`: Messages events (`message_start` ... `message_stop`, with `ping`).
//! - `ollama.rs`: NDJSON (`/api/chat`, `/api/generate`, a final line with `eval_count` and
//!   durations in ns).
//! - `tgi.rs`: `/generate_stream` (`data:` without a space, `details` on the last token) and
//!   `/generate`.
//!
//! This file holds what they share: the [`Dialect`] (`--api`), the [`Handler`] a POST path reaches,
//! the request fields every format reads ([`parse`]), and the [`Reply`] that dispatches to the
//! format's writers. Adding a format takes a file here and, in this one, a `Dialect` variant, its
//! `Handler`s and an arm in each dispatching `match` (the compiler lists the ones missing).
//!
//! One engine step is one event (one NDJSON line), carrying the tokens the step made: one by
//! default, so a client can count tokens by counting events; several with `--tokens-per-event`
//! or `--spec-acceptance` ([`super::decoding`]), their texts concatenated in the one event as
//! vLLM sends them, while every usage report states the true count. TGI is the exception: its
//! event holds one `token` object, so a step of several tokens is as many events, sent
//! together, as TGI streams speculative tokens. The writers append to a `String` the body reuses,
//! so a token costs no allocation.

mod anthropic;
mod ollama;
mod openai;
#[cfg(test)]
mod tests;
mod tgi;

use std::time::Duration;

use serde_json::{Map, Value};

use super::decoding::SpecCounts;
use super::prefix::BlockKeys;
use super::text::{Fnv, Token};

/// The API family the simulator imitates (`--api`). OpenAI's endpoints are served in every mode,
/// as vLLM, TGI, Ollama and llama.cpp all serve them; the others add their native API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Dialect {
    /// `/v1/chat/completions`, `/v1/completions` (vLLM, SGLang, llama.cpp, OpenAI).
    #[default]
    Openai,
    /// Adds `/v1/messages` (Anthropic Messages API).
    Anthropic,
    /// Adds `/api/chat`, `/api/generate`, `/api/tags` (Ollama's native NDJSON API).
    Ollama,
    /// Adds `/generate`, `/generate_stream` (Hugging Face TGI's native API).
    Tgi,
}

impl Dialect {
    /// The `--api` value, as `/sim/stats` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Openai => "openai",
            Dialect::Anthropic => "anthropic",
            Dialect::Ollama => "ollama",
            Dialect::Tgi => "tgi",
        }
    }
}

/// What a POST path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    Chat,
    Completions,
    Messages,
    OllamaChat,
    OllamaGenerate,
    TgiGenerate,
    TgiGenerateStream,
}

impl Handler {
    /// The route a POST to `path` reaches when the simulator speaks `dialect`, if any.
    pub fn find(dialect: Dialect, path: &str) -> Option<Handler> {
        let route = match path {
            "/v1/chat/completions" => Handler::Chat,
            "/v1/completions" => Handler::Completions,
            "/v1/messages" if dialect == Dialect::Anthropic => Handler::Messages,
            "/api/chat" if dialect == Dialect::Ollama => Handler::OllamaChat,
            "/api/generate" if dialect == Dialect::Ollama => Handler::OllamaGenerate,
            "/generate" if dialect == Dialect::Tgi => Handler::TgiGenerate,
            "/generate_stream" if dialect == Dialect::Tgi => Handler::TgiGenerateStream,
            _ => return None,
        };
        Some(route)
    }

    /// The format that reads and writes this route.
    pub fn dialect(self) -> Dialect {
        match self {
            Handler::Chat | Handler::Completions => Dialect::Openai,
            Handler::Messages => Dialect::Anthropic,
            Handler::OllamaChat | Handler::OllamaGenerate => Dialect::Ollama,
            Handler::TgiGenerate | Handler::TgiGenerateStream => Dialect::Tgi,
        }
    }
}

/// The most output tokens one request may ask for. A request's limit is honoured exactly, so a
/// typo of a few extra zeros would otherwise hold a batch slot for hours.
pub const MAX_OUTPUT_TOKENS: u64 = 1_000_000;

/// Why a request body was refused (the client gets a 400 saying so).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("the request body is not a JSON object")]
    NotJson,
    #[error("{0} must be an integer from 1 to {MAX_OUTPUT_TOKENS}")]
    BadLimit(&'static str),
}

/// What the simulator needs from a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub stream: bool,
    pub include_usage: bool,
    /// The request's output limit, honoured exactly (as with vLLM's `ignore_eos`).
    pub max_tokens: Option<u32>,
    pub model: Option<String>,
    /// Characters of prompt text (messages, prompt, system, inputs), for the prompt token estimate.
    pub prompt_chars: usize,
    /// A hash of that text and the request's `seed`: what makes the output deterministic.
    pub prompt_hash: u64,
    /// The keys of the full blocks of that text ([`BlockKeys`]: its strings' characters joined,
    /// a top-level `system` first), for the learnt prefix cache; empty unless read with
    /// [`parse_with_keys`].
    pub prefix_keys: Vec<u64>,
    /// TGI `parameters.details`.
    pub details: bool,
}

/// What a format reads from a request besides the prompt and the model.
#[derive(Debug, Clone, Copy, Default)]
struct Options<'a> {
    stream: bool,
    include_usage: bool,
    max_tokens: Option<u32>,
    /// The request's `seed`, wherever the format puts it.
    seed: Option<&'a Value>,
    details: bool,
}

/// The fields whose text is the prompt, in every API we speak.
const PROMPT_FIELDS: [&str; 4] = ["messages", "prompt", "system", "inputs"];

/// The same fields in the order a server puts their text before the model: a top-level `system`
/// (Anthropic's, Ollama's) first, as a chat template does. The prefix cache's blocks are cut from
/// the prompt's text in this order, so a shared system prompt is a shared prefix; the
/// [`PROMPT_FIELDS`] order stays what the output's seed hashes.
const PREFIX_FIELDS: [&str; 4] = ["system", "messages", "prompt", "inputs"];

/// Every string under `v`, in order (an object's values in its keys' order).
fn walk_text(v: &Value, f: &mut impl FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter().for_each(|x| walk_text(x, f)),
        Value::Object(o) => o.values().for_each(|x| walk_text(x, f)),
        _ => {}
    }
}

/// An output limit field: absent or null is no limit; anything but 1..=MAX is refused.
fn limit(
    obj: &Map<String, Value>,
    key: &str,
    name: &'static str,
) -> Result<Option<u32>, BodyError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_OUTPUT_TOKENS).contains(&n) => Ok(Some(n as u32)),
            _ => Err(BodyError::BadLimit(name)),
        },
    }
}

fn flag(obj: Option<&Map<String, Value>>, key: &str) -> Option<bool> {
    obj?.get(key)?.as_bool()
}

fn object<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    obj.get(key)?.as_object()
}

/// Reads a request body for `route`.
pub fn parse(route: Handler, body: &[u8]) -> Result<Parsed, BodyError> {
    read(route, body, false)
}

/// [`parse`], with the keys of the prompt's full blocks ([`Parsed::prefix_keys`]), for the
/// learnt prefix cache.
pub fn parse_with_keys(route: Handler, body: &[u8]) -> Result<Parsed, BodyError> {
    read(route, body, true)
}

fn read(route: Handler, body: &[u8], with_keys: bool) -> Result<Parsed, BodyError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| BodyError::NotJson)?;
    let obj = v.as_object().ok_or(BodyError::NotJson)?;
    let mut chars = 0;
    let mut hash = Fnv::default();
    for f in PROMPT_FIELDS {
        if let Some(x) = obj.get(f) {
            walk_text(x, &mut |s| {
                chars += s.chars().count();
                hash.write(s.as_bytes());
                hash.write(&[0]);
            });
        }
    }
    let mut keys = BlockKeys::default();
    if with_keys {
        for f in PREFIX_FIELDS {
            if let Some(x) = obj.get(f) {
                walk_text(x, &mut |s| keys.write(s));
            }
        }
    }
    let o = match route.dialect() {
        Dialect::Openai => openai::options(route, obj)?,
        Dialect::Anthropic => anthropic::options(obj)?,
        Dialect::Ollama => ollama::options(obj)?,
        Dialect::Tgi => tgi::options(route, obj)?,
    };
    if let Some(s) = o.seed.and_then(Value::as_i64) {
        hash.write(&s.to_le_bytes());
    }
    Ok(Parsed {
        stream: o.stream,
        include_usage: o.include_usage,
        max_tokens: o.max_tokens,
        model: obj
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map(str::to_string),
        prompt_chars: chars,
        prompt_hash: hash.finish(),
        prefix_keys: keys.finish(),
        details: o.details,
    })
}

/// An error body in the shape the route's API uses (OpenAI's when there is no route).
pub fn error_body(route: Option<Handler>, status: u16, message: &str) -> Value {
    match route.map(Handler::dialect) {
        Some(Dialect::Anthropic) => anthropic::error(message),
        Some(Dialect::Ollama) => ollama::error(message),
        Some(Dialect::Tgi) => tgi::error(message),
        Some(Dialect::Openai) | None => openai::error(status, message),
    }
}

/// How long the parts of a request took, for the formats that report it (Ollama; OpenAI with
/// `--enable-per-request-metrics`, as vLLM does).
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// Request received to first token.
    pub prefill: Duration,
    /// First token to last token.
    pub decode: Duration,
    /// As the engine timed them: waiting in its queue, and from admission to the first token.
    pub engine_queue: Option<Duration>,
    pub engine_prefill: Option<Duration>,
    /// Under speculative decoding, this request's drafts (vLLM's `speculative_decoding` in the
    /// per-request `metrics`).
    pub spec: Option<SpecCounts>,
}

/// Everything needed to write one response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub route: Handler,
    pub stream: bool,
    pub include_usage: bool,
    /// The model name as a JSON string literal (quoted and escaped).
    pub model: String,
    /// The request's number (as in `/sim/stats`).
    pub id: u64,
    /// Unix seconds, for `created`.
    pub created: u64,
    pub prompt_tokens: u32,
    /// Of the prompt, served from the prefix cache; `None` with the cache off (nothing stated).
    pub cached_tokens: Option<u32>,
    pub output_tokens: u32,
    /// The length came from the request's limit: finish reason "length" rather than "stop".
    pub limited: bool,
    pub details: bool,
    /// `--enable-per-request-metrics`: vLLM's `metrics` object on the usage chunk.
    pub per_request_metrics: bool,
}

fn json_string(s: &str) -> String {
    // Serializing a &str cannot fail.
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

impl Reply {
    /// The `Content-Type` of the body.
    pub fn content_type(&self) -> &'static str {
        match (self.stream, self.route.dialect()) {
            (false, _) => "application/json",
            (true, Dialect::Ollama) => "application/x-ndjson",
            (true, _) => "text/event-stream",
        }
    }

    /// Token `index` (0-based) is the last one.
    fn is_last(&self, index: u32) -> bool {
        index + 1 >= self.output_tokens
    }

    /// Whether the stream's head goes out with the first token rather than with the headers.
    /// vLLM's OpenAI server writes a chat stream's role chunk in the first turn of its loop
    /// over the engine's outputs, so after prefill, with the first token; a client that times
    /// the first chunk (LiteLLM's TTFT does) would otherwise read the headers' time.
    /// Anthropic's `message_start` goes out at once, as the Messages API sends it.
    pub fn head_waits_for_first_token(&self) -> bool {
        self.route.dialect() == Dialect::Openai
    }

    /// What a stream sends before its first token: with the headers, or just before the first
    /// token ([`Reply::head_waits_for_first_token`]).
    pub fn head(&self, out: &mut String) {
        match self.route.dialect() {
            Dialect::Openai => openai::head(self, out),
            Dialect::Anthropic => anthropic::head(self, out),
            Dialect::Ollama | Dialect::Tgi => {}
        }
    }

    /// The event of one step: `tokens`, the first of them number `index` (0-based), at least
    /// one. `text` is the whole output so far, these tokens included; only TGI reads it (it
    /// repeats the text on the last token), and writes one event per token.
    pub fn event(&self, index: u32, tokens: &[Token], text: &str, out: &mut String) {
        if tokens.is_empty() {
            return;
        }
        match self.route.dialect() {
            Dialect::Openai => openai::event(self, index, tokens, out),
            Dialect::Anthropic => anthropic::event(tokens, out),
            Dialect::Ollama => ollama::event(self, tokens, out),
            Dialect::Tgi => {
                for (i, tok) in (index..).zip(tokens) {
                    tgi::token(self, i, *tok, text, out);
                }
            }
        }
    }

    /// What a stream sends after its last token.
    pub fn tail(&self, t: &Timings, out: &mut String) {
        match self.route.dialect() {
            Dialect::Openai => openai::tail(self, t, out),
            Dialect::Anthropic => anthropic::tail(self, out),
            Dialect::Ollama => ollama::tail(self, t, out),
            // TGI's last token event carries the summary.
            Dialect::Tgi => {}
        }
    }

    /// A non-streaming response: one JSON document with the whole `text`.
    pub fn whole(&self, text: &str, t: &Timings) -> String {
        let text = json_string(text);
        let mut out = String::with_capacity(text.len() + 256);
        match self.route.dialect() {
            Dialect::Openai => openai::whole(self, &text, &mut out),
            Dialect::Anthropic => anthropic::whole(self, &text, &mut out),
            Dialect::Ollama => ollama::whole(self, &text, t, &mut out),
            Dialect::Tgi => tgi::whole(self, &text, &mut out),
        }
        out
    }
}
