//! The simulator's wire formats: reading a request and writing its response, per API.
//!
//! Each format follows what the real servers send, as recorded in the corpus
//! (`../shared/corpus/`): OpenAI chat and completions as vLLM streams them (a role chunk first,
//! `finish_reason` on the last token's chunk, a `choices: []` usage chunk when
//! `stream_options.include_usage` is set, then `[DONE]`), Anthropic Messages events
//! (`message_start` ... `message_stop`, with `ping`), Ollama's NDJSON (`/api/chat`,
//! `/api/generate`, final line with `eval_count` and durations in ns), and TGI's `/generate_stream`
//! (`data:` without a space, `details` on the last token).
//!
//! One token is one event (one NDJSON line), so a client can count tokens by counting events. The
//! writers append to a `String` the body reuses, so a token costs no allocation.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::text::{Fnv, Token};

/// The API family the simulator imitates (`--api`). OpenAI's endpoints are served in every mode,
/// as vLLM, TGI, Ollama and llama.cpp all serve them; the others add their native API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Api {
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

/// What a POST path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Messages,
    OllamaChat,
    OllamaGenerate,
    TgiGenerate,
    TgiGenerateStream,
}

impl Endpoint {
    /// The endpoint a POST to `path` reaches under `api`, if any.
    pub fn route(api: Api, path: &str) -> Option<Endpoint> {
        let ep = match path {
            "/v1/chat/completions" => Endpoint::Chat,
            "/v1/completions" => Endpoint::Completions,
            "/v1/messages" if api == Api::Anthropic => Endpoint::Messages,
            "/api/chat" if api == Api::Ollama => Endpoint::OllamaChat,
            "/api/generate" if api == Api::Ollama => Endpoint::OllamaGenerate,
            "/generate" if api == Api::Tgi => Endpoint::TgiGenerate,
            "/generate_stream" if api == Api::Tgi => Endpoint::TgiGenerateStream,
            _ => return None,
        };
        Some(ep)
    }
}

/// The most output tokens one request may ask for. A request's limit is honoured exactly, so a
/// typo of a few extra zeros would otherwise hold a batch slot for hours.
pub const MAX_OUTPUT_TOKENS: u64 = 1_000_000;

/// Why a request body was refused (the client gets a 400 saying so).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
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
    /// TGI `parameters.details`.
    pub details: bool,
}

/// The fields whose text is the prompt, in every API we speak.
const PROMPT_FIELDS: [&str; 4] = ["messages", "prompt", "system", "inputs"];

fn walk_text(v: &Value, chars: &mut usize, hash: &mut Fnv) {
    match v {
        Value::String(s) => {
            *chars += s.chars().count();
            hash.write(s.as_bytes());
            hash.write(&[0]);
        }
        Value::Array(a) => a.iter().for_each(|x| walk_text(x, chars, hash)),
        Value::Object(o) => o.values().for_each(|x| walk_text(x, chars, hash)),
        _ => {}
    }
}

fn limit(
    obj: &Map<String, Value>,
    key: &str,
    name: &'static str,
) -> Result<Option<u32>, RequestError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_OUTPUT_TOKENS).contains(&n) => Ok(Some(n as u32)),
            _ => Err(RequestError::BadLimit(name)),
        },
    }
}

fn flag(obj: Option<&Map<String, Value>>, key: &str) -> Option<bool> {
    obj?.get(key)?.as_bool()
}

fn object<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    obj.get(key)?.as_object()
}

/// Reads a request body for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Parsed, RequestError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| RequestError::NotJson)?;
    let obj = v.as_object().ok_or(RequestError::NotJson)?;
    let mut chars = 0;
    let mut hash = Fnv::default();
    for f in PROMPT_FIELDS {
        if let Some(x) = obj.get(f) {
            walk_text(x, &mut chars, &mut hash);
        }
    }
    let options = object(obj, "options");
    let parameters = object(obj, "parameters");
    let seed = match endpoint {
        Endpoint::OllamaChat | Endpoint::OllamaGenerate => options.and_then(|o| o.get("seed")),
        Endpoint::TgiGenerate | Endpoint::TgiGenerateStream => {
            parameters.and_then(|p| p.get("seed"))
        }
        _ => obj.get("seed"),
    };
    if let Some(s) = seed.and_then(Value::as_i64) {
        hash.write(&s.to_le_bytes());
    }
    let (stream, max_tokens) = match endpoint {
        Endpoint::Chat => (
            flag(Some(obj), "stream").unwrap_or(false),
            match limit(obj, "max_completion_tokens", "max_completion_tokens")? {
                Some(n) => Some(n),
                None => limit(obj, "max_tokens", "max_tokens")?,
            },
        ),
        Endpoint::Completions | Endpoint::Messages => (
            flag(Some(obj), "stream").unwrap_or(false),
            limit(obj, "max_tokens", "max_tokens")?,
        ),
        Endpoint::OllamaChat | Endpoint::OllamaGenerate => {
            // Ollama streams unless told not to; a negative num_predict means "no limit".
            let num_predict = match options.and_then(|o| o.get("num_predict")) {
                Some(v) if v.as_i64().is_some_and(|n| n < 0) => None,
                _ => match options {
                    Some(o) => limit(o, "num_predict", "options.num_predict")?,
                    None => None,
                },
            };
            (flag(Some(obj), "stream").unwrap_or(true), num_predict)
        }
        Endpoint::TgiGenerate | Endpoint::TgiGenerateStream => (
            endpoint == Endpoint::TgiGenerateStream,
            match parameters {
                Some(p) => limit(p, "max_new_tokens", "parameters.max_new_tokens")?,
                None => None,
            },
        ),
    };
    Ok(Parsed {
        stream,
        include_usage: flag(object(obj, "stream_options"), "include_usage").unwrap_or(false),
        max_tokens,
        model: obj
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map(str::to_string),
        prompt_chars: chars,
        prompt_hash: hash.finish(),
        details: flag(parameters, "details").unwrap_or(false),
    })
}

/// How long the parts of a request took, for the formats that report it (Ollama).
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// Request received to first token.
    pub prefill: Duration,
    /// First token to last token.
    pub decode: Duration,
}

/// Everything needed to write one response.
#[derive(Debug, Clone)]
pub struct Response {
    pub endpoint: Endpoint,
    pub stream: bool,
    pub include_usage: bool,
    /// The model name as a JSON string literal (quoted and escaped).
    pub model: String,
    /// The request's number (as in `/sim/stats`).
    pub id: u64,
    /// Unix seconds, for `created`.
    pub created: u64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// The length came from the request's limit: finish reason "length" rather than "stop".
    pub limited: bool,
    pub details: bool,
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` for a time since the Unix epoch (UTC), as Ollama writes
/// `created_at`. Civil-from-days after Howard Hinnant's `chrono`-compatible algorithm.
fn rfc3339(t: Duration) -> String {
    let secs = t.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        t.subsec_micros()
    )
}

fn json_string(s: &str) -> String {
    // Serializing a &str cannot fail.
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

impl Response {
    /// The `Content-Type` of the body.
    pub fn content_type(&self) -> &'static str {
        match (self.stream, self.endpoint) {
            (false, _) => "application/json",
            (true, Endpoint::OllamaChat | Endpoint::OllamaGenerate) => "application/x-ndjson",
            (true, _) => "text/event-stream",
        }
    }

    fn finish_reason(&self) -> &'static str {
        match (self.endpoint, self.limited) {
            (Endpoint::Messages, true) => "max_tokens",
            (Endpoint::Messages, false) => "end_turn",
            (Endpoint::TgiGenerate | Endpoint::TgiGenerateStream, false) => "eos_token",
            (_, true) => "length",
            (_, false) => "stop",
        }
    }

    fn openai_prefix(&self, out: &mut String) {
        let (prefix, object) = match self.endpoint {
            Endpoint::Completions => ("cmpl", "text_completion"),
            _ => ("chatcmpl", "chat.completion.chunk"),
        };
        let _ = write!(
            out,
            "data: {{\"id\":\"{prefix}-sim-{}\",\"object\":\"{object}\",\"created\":{},\"model\":{},",
            self.id, self.created, self.model
        );
    }

    fn usage_json(&self) -> String {
        format!(
            "{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}}}",
            self.prompt_tokens,
            self.output_tokens,
            u64::from(self.prompt_tokens) + u64::from(self.output_tokens)
        )
    }

    /// What a stream sends before its first token (right away, with the headers).
    pub fn head(&self, out: &mut String) {
        match self.endpoint {
            Endpoint::Chat => {
                self.openai_prefix(out);
                out.push_str("\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]");
                if self.include_usage {
                    out.push_str(",\"usage\":null");
                }
                out.push_str("}\n\n");
            }
            Endpoint::Messages => {
                let _ = write!(
                    out,
                    "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_sim_{:016}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{},\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{},\"output_tokens\":1}}}}}}\n\n",
                    self.id, self.model, self.prompt_tokens
                );
                out.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
                out.push_str("event: ping\ndata: {\"type\": \"ping\"}\n\n");
            }
            _ => {}
        }
    }

    /// The event for token number `index` (0-based). `text` is the whole output so far, this
    /// token included; only TGI reads it (it repeats the text on the last token).
    pub fn token(&self, index: u32, tok: Token, text: &str, out: &mut String) {
        let last = index + 1 >= self.output_tokens;
        match self.endpoint {
            Endpoint::Chat | Endpoint::Completions => {
                self.openai_prefix(out);
                let finish = if last {
                    format!("\"{}\"", self.finish_reason())
                } else {
                    "null".to_string()
                };
                if self.endpoint == Endpoint::Chat {
                    let _ = write!(out, "\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}},\"logprobs\":null,\"finish_reason\":{finish}}}]", tok.text);
                } else {
                    let _ = write!(out, "\"choices\":[{{\"index\":0,\"text\":\"{}\",\"logprobs\":null,\"finish_reason\":{finish}}}]", tok.text);
                }
                if self.include_usage {
                    out.push_str(",\"usage\":null");
                }
                out.push_str("}\n\n");
            }
            Endpoint::Messages => {
                let _ = write!(out, "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}\n\n", tok.text);
            }
            Endpoint::OllamaChat | Endpoint::OllamaGenerate => {
                let _ = write!(
                    out,
                    "{{\"model\":{},\"created_at\":\"{}\",",
                    self.model,
                    rfc3339(unix_now())
                );
                if self.endpoint == Endpoint::OllamaChat {
                    let _ = writeln!(
                        out,
                        "\"message\":{{\"role\":\"assistant\",\"content\":\"{}\"}},\"done\":false}}",
                        tok.text
                    );
                } else {
                    let _ = writeln!(out, "\"response\":\"{}\",\"done\":false}}", tok.text);
                }
            }
            Endpoint::TgiGenerate | Endpoint::TgiGenerateStream => {
                let _ = write!(
                    out,
                    "data:{{\"index\":{},\"token\":{{\"id\":{},\"text\":\"{}\",\"logprob\":-0.25,\"special\":false}},",
                    index + 1,
                    tok.id,
                    tok.text
                );
                if last {
                    let _ = write!(
                        out,
                        "\"generated_text\":{},\"details\":{{\"finish_reason\":\"{}\",\"generated_tokens\":{},\"seed\":null,\"input_length\":{}}}}}\n\n",
                        json_string(text),
                        self.finish_reason(),
                        self.output_tokens,
                        self.prompt_tokens
                    );
                } else {
                    out.push_str("\"generated_text\":null,\"details\":null}\n\n");
                }
            }
        }
    }

    /// What a stream sends after its last token.
    pub fn tail(&self, t: &Timings, out: &mut String) {
        match self.endpoint {
            Endpoint::Chat | Endpoint::Completions => {
                if self.include_usage {
                    self.openai_prefix(out);
                    let _ = write!(out, "\"choices\":[],\"usage\":{}}}\n\n", self.usage_json());
                }
                out.push_str("data: [DONE]\n\n");
            }
            Endpoint::Messages => {
                out.push_str("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n");
                let _ = write!(out, "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{}}}}}\n\n", self.finish_reason(), self.output_tokens);
                out.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
            }
            Endpoint::OllamaChat | Endpoint::OllamaGenerate => {
                let _ = write!(
                    out,
                    "{{\"model\":{},\"created_at\":\"{}\",",
                    self.model,
                    rfc3339(unix_now())
                );
                if self.endpoint == Endpoint::OllamaChat {
                    out.push_str("\"message\":{\"role\":\"assistant\",\"content\":\"\"},");
                } else {
                    out.push_str("\"response\":\"\",");
                }
                self.ollama_done(t, out);
                out.push_str("}\n");
            }
            // TGI's last token event carries the summary.
            Endpoint::TgiGenerate | Endpoint::TgiGenerateStream => {}
        }
    }

    fn ollama_done(&self, t: &Timings, out: &mut String) {
        let _ = write!(
            out,
            "\"done_reason\":\"{}\",\"done\":true,\"total_duration\":{},\"load_duration\":0,\"prompt_eval_count\":{},\"prompt_eval_duration\":{},\"eval_count\":{},\"eval_duration\":{}",
            self.finish_reason(),
            (t.prefill + t.decode).as_nanos(),
            self.prompt_tokens,
            t.prefill.as_nanos(),
            self.output_tokens,
            t.decode.as_nanos()
        );
    }

    /// A non-streaming response: one JSON document with the whole `text`.
    pub fn whole(&self, text: &str, t: &Timings) -> String {
        let text = json_string(text);
        let mut out = String::with_capacity(text.len() + 256);
        match self.endpoint {
            Endpoint::Chat => {
                let _ = write!(out, "{{\"id\":\"chatcmpl-sim-{}\",\"object\":\"chat.completion\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":{text}}},\"logprobs\":null,\"finish_reason\":\"{}\"}}],\"usage\":{}}}", self.id, self.created, self.model, self.finish_reason(), self.usage_json());
            }
            Endpoint::Completions => {
                let _ = write!(out, "{{\"id\":\"cmpl-sim-{}\",\"object\":\"text_completion\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,\"text\":{text},\"logprobs\":null,\"finish_reason\":\"{}\"}}],\"usage\":{}}}", self.id, self.created, self.model, self.finish_reason(), self.usage_json());
            }
            Endpoint::Messages => {
                let _ = write!(out, "{{\"id\":\"msg_sim_{:016}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{},\"content\":[{{\"type\":\"text\",\"text\":{text}}}],\"stop_reason\":\"{}\",\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{},\"output_tokens\":{}}}}}", self.id, self.model, self.finish_reason(), self.prompt_tokens, self.output_tokens);
            }
            Endpoint::OllamaChat | Endpoint::OllamaGenerate => {
                let _ = write!(
                    out,
                    "{{\"model\":{},\"created_at\":\"{}\",",
                    self.model,
                    rfc3339(unix_now())
                );
                if self.endpoint == Endpoint::OllamaChat {
                    let _ = write!(
                        out,
                        "\"message\":{{\"role\":\"assistant\",\"content\":{text}}},"
                    );
                } else {
                    let _ = write!(out, "\"response\":{text},");
                }
                self.ollama_done(t, &mut out);
                out.push('}');
            }
            Endpoint::TgiGenerate | Endpoint::TgiGenerateStream => {
                let _ = write!(out, "{{\"generated_text\":{text}");
                if self.details {
                    let _ = write!(out, ",\"details\":{{\"finish_reason\":\"{}\",\"generated_tokens\":{},\"seed\":null,\"prefill\":[],\"tokens\":[]}}", self.finish_reason(), self.output_tokens);
                }
                out.push('}');
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::text::{Rng, Words};

    fn response(endpoint: Endpoint, stream: bool, n: u32) -> Response {
        Response {
            endpoint,
            stream,
            include_usage: true,
            model: json_string("m"),
            id: 7,
            created: 1_700_000_000,
            prompt_tokens: 5,
            output_tokens: n,
            limited: true,
            details: true,
        }
    }

    /// Renders a whole stream of `n` tokens.
    fn stream(endpoint: Endpoint, n: u32) -> String {
        let r = response(endpoint, true, n);
        let mut out = String::new();
        let mut text = String::new();
        let mut w = Words::new(Rng::new(1));
        r.head(&mut out);
        for i in 0..n {
            let t = w.next_token();
            text.push_str(t.text);
            r.token(i, t, &text, &mut out);
        }
        r.tail(&Timings::default(), &mut out);
        out
    }

    #[test]
    fn every_event_is_valid_json() {
        for ep in [
            Endpoint::Chat,
            Endpoint::Completions,
            Endpoint::Messages,
            Endpoint::TgiGenerateStream,
        ] {
            let body = stream(ep, 3);
            for line in body.lines().filter_map(|l| l.strip_prefix("data:")) {
                let l = line.trim_start();
                if l != "[DONE]" {
                    serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{ep:?}: {e}: {l}"));
                }
            }
        }
        for ep in [Endpoint::OllamaChat, Endpoint::OllamaGenerate] {
            let body = stream(ep, 3);
            assert_eq!(body.lines().count(), 4);
            for l in body.lines() {
                serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{ep:?}: {e}: {l}"));
            }
        }
        for ep in [
            Endpoint::Chat,
            Endpoint::Completions,
            Endpoint::Messages,
            Endpoint::OllamaChat,
            Endpoint::OllamaGenerate,
            Endpoint::TgiGenerate,
        ] {
            let r = response(ep, false, 2);
            let body = r.whole(" a \"quoted\"\n text", &Timings::default());
            let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{ep:?}: {e}"));
            assert!(v.is_object());
        }
    }

    #[test]
    fn openai_chat_stream_shape() {
        let body = stream(Endpoint::Chat, 2);
        let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 5, "{body}");
        assert!(events[0].contains("\"role\":\"assistant\",\"content\":\"\""));
        assert!(events[1].contains("\"finish_reason\":null"));
        assert!(events[2].contains("\"finish_reason\":\"length\""));
        assert!(events[3].contains(
            "\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}"
        ));
        assert_eq!(events[4], "data: [DONE]");
    }

    #[test]
    fn anthropic_stream_shape() {
        let body = stream(Endpoint::Messages, 2);
        let names: Vec<&str> = body
            .lines()
            .filter_map(|l| l.strip_prefix("event: "))
            .collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert!(body.contains("\"usage\":{\"input_tokens\":5,\"output_tokens\":1}"));
        assert!(body.contains("\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}"));
    }

    #[test]
    fn tgi_last_token_carries_details() {
        let body = stream(Endpoint::TgiGenerateStream, 3);
        let events: Vec<Value> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0]["index"], 1);
        assert!(events[1]["details"].is_null());
        assert_eq!(events[2]["details"]["generated_tokens"], 3);
        let text: String = events
            .iter()
            .map(|e| e["token"]["text"].as_str().expect("text"))
            .collect();
        assert_eq!(events[2]["generated_text"], text.as_str());
    }

    #[test]
    fn ollama_final_line_counts() {
        let body = stream(Endpoint::OllamaChat, 4);
        let last: Value = serde_json::from_str(body.lines().last().expect("line")).expect("json");
        assert_eq!(last["done"], true);
        assert_eq!(last["eval_count"], 4);
        assert_eq!(last["prompt_eval_count"], 5);
        assert_eq!(last["done_reason"], "length");
    }

    #[test]
    fn requests_are_read_per_api() {
        let p = parse(
            Endpoint::Chat,
            br#"{"model":"x","messages":[{"role":"user","content":"abcdefgh"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":9,"max_completion_tokens":12}"#,
        )
        .expect("valid");
        assert_eq!(
            (p.stream, p.include_usage, p.max_tokens, p.model.as_deref()),
            (true, true, Some(12), Some("x"))
        );
        assert_eq!(p.prompt_chars, "user".len() + "abcdefgh".len());
        let p = parse(
            Endpoint::OllamaChat,
            br#"{"messages":[],"options":{"num_predict":5}}"#,
        )
        .expect("valid");
        assert_eq!((p.stream, p.max_tokens), (true, Some(5)));
        let p = parse(
            Endpoint::OllamaGenerate,
            br#"{"prompt":"hi","stream":false,"options":{"num_predict":-1}}"#,
        )
        .expect("valid");
        assert_eq!((p.stream, p.max_tokens), (false, None));
        let p = parse(
            Endpoint::TgiGenerateStream,
            br#"{"inputs":"hi","parameters":{"max_new_tokens":20}}"#,
        )
        .expect("valid");
        assert_eq!((p.stream, p.max_tokens), (true, Some(20)));
        assert_eq!(parse(Endpoint::Chat, b"[1]"), Err(RequestError::NotJson));
        assert_eq!(
            parse(Endpoint::Messages, br#"{"max_tokens":0}"#),
            Err(RequestError::BadLimit("max_tokens"))
        );
        assert_eq!(
            parse(Endpoint::Completions, br#"{"max_tokens":"9"}"#),
            Err(RequestError::BadLimit("max_tokens"))
        );
    }

    #[test]
    fn the_seed_field_changes_the_hash_and_the_rest_does_not() {
        let h = |b: &[u8]| parse(Endpoint::Chat, b).expect("valid").prompt_hash;
        let base = h(br#"{"messages":[{"role":"user","content":"hi"}]}"#);
        assert_eq!(
            base,
            h(br#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#)
        );
        assert_ne!(
            base,
            h(br#"{"messages":[{"role":"user","content":"hi"}],"seed":1}"#)
        );
        assert_ne!(base, h(br#"{"messages":[{"role":"user","content":"ho"}]}"#));
    }

    #[test]
    fn routes_depend_on_the_api() {
        assert_eq!(Endpoint::route(Api::Openai, "/v1/messages"), None);
        assert_eq!(
            Endpoint::route(Api::Anthropic, "/v1/messages"),
            Some(Endpoint::Messages)
        );
        assert_eq!(
            Endpoint::route(Api::Tgi, "/v1/chat/completions"),
            Some(Endpoint::Chat)
        );
        assert_eq!(Endpoint::route(Api::Openai, "/generate"), None);
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(Duration::new(1_755_697_704, 316_155_000)),
            "2025-08-20T13:48:24.316155Z"
        );
        assert_eq!(
            rfc3339(Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000000Z"
        );
    }
}
