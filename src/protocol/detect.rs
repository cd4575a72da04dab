//! Recognising the wire format of a response without being told.
//!
//! The first message is the best witness: every format we read has a shape (a field, an event
//! name, a `type` value) no other format shares. The request path is the tie-breaker, because
//! paths lie in both directions: TGI, llama.cpp, SGLang and Ollama all serve OpenAI's
//! `/v1/chat/completions` too, llama.cpp serves its native API on `/completions`, and TGI and
//! SGLang share `/generate`. So [`Auto`] looks at each message until one is decisive (a `ping`,
//! an `error` or a `[DONE]` is not), and only falls back to the path's format when
//! [`MAX_UNDECIDED`] messages have told it nothing.

use serde_json::{Map, Value};

use super::{extractor, Api, Extractor, Message, Summary};

/// Messages an undecided [`Auto`] inspects before it settles for the path's format. Real streams
/// decide on their first message; this only bounds the work spent on a stream we cannot read.
pub const MAX_UNDECIDED: u32 = 16;

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

/// The format one message shows, if it is decisive.
pub fn sniff(msg: &Message<'_>) -> Option<Api> {
    if msg.event == "output" {
        // Replicate's data is plain text, not JSON: the event name is all there is.
        return Some(Api::Replicate);
    }
    if let Some(api) = by_type(msg.event) {
        return Some(api);
    }
    let first = match serde_json::from_slice::<Value>(msg.data).ok()? {
        // Gemini without `alt=sse`, and TGI's non-streaming answer, are JSON arrays.
        Value::Array(items) => items.into_iter().next()?,
        v => v,
    };
    sniff_object(first.as_object()?)
}

fn sniff_object(o: &Map<String, Value>) -> Option<Api> {
    let has = |k: &str| o.contains_key(k);
    let str_of = |k: &str| o.get(k).and_then(Value::as_str);
    if let Some(api) = str_of("type").and_then(by_type) {
        return Some(api);
    }
    if str_of("type") == Some("message") && has("role") {
        return Some(Api::Anthropic); // a non-streaming Messages response
    }
    match str_of("object") {
        Some("chat.completion.chunk" | "chat.completion" | "text_completion") => {
            return Some(Api::OpenAi)
        }
        Some("response") => return Some(Api::Responses),
        _ => {}
    }
    let api = if has("choices") {
        Api::OpenAi
    } else if has("candidates") || has("usageMetadata") {
        Api::Gemini
    } else if has("meta_info") {
        Api::Sglang
    } else if has("text_output") || (has("model_name") && has("model_version")) {
        Api::Triton
    } else if has("token") || has("generated_text") {
        Api::Tgi
    } else if has("results") && has("model_id") {
        Api::Watsonx
    } else if has("created_at") && has("done") {
        Api::Ollama
    } else if has("content")
        && (has("stop") || has("id_slot") || has("tokens_predicted") || has("timings"))
    {
        Api::LlamaCpp
    } else if has("message") && has("finish_reason") && has("usage") {
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
    /// The summary while nothing is decided: empty.
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
            let found = sniff(msg);
            if found.is_none() {
                self.undecided += 1;
                if self.undecided < MAX_UNDECIDED {
                    return 0;
                }
            }
            self.inner = Some(extractor(found.or(self.hint).unwrap_or(Api::Unknown)));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg<'a>(event: &'a str, data: &'a str) -> Message<'a> {
        Message {
            event,
            data: data.as_bytes(),
        }
    }

    #[test]
    fn paths() {
        let cases = [
            ("/v1/chat/completions", Some(Api::OpenAi)),
            ("/openai/deployments/x/chat/completions", Some(Api::OpenAi)),
            ("/v1/completions", Some(Api::OpenAi)),
            ("/completion", Some(Api::LlamaCpp)),
            ("/v1/responses", Some(Api::Responses)),
            ("/v1/responses/resp_1", Some(Api::Responses)),
            ("/v1/messages", Some(Api::Anthropic)),
            ("/api/generate", Some(Api::Ollama)),
            ("/api/chat", Some(Api::Ollama)),
            ("/v2/models/ensemble/generate_stream", Some(Api::Triton)),
            ("/v2/models/vllm_model/generate", Some(Api::Triton)),
            ("/generate_stream", Some(Api::Tgi)),
            ("/generate", Some(Api::Tgi)),
            (
                "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
                Some(Api::Gemini),
            ),
            ("/v2/chat", Some(Api::Cohere)),
            ("/ml/v1/generation/text_stream", Some(Api::Watsonx)),
            ("/v1/streams/abc", Some(Api::Replicate)),
            ("/v1/embeddings", None),
            ("/", None),
        ];
        for (path, want) in cases {
            assert_eq!(path_hint(path), want, "{path}");
        }
    }

    #[test]
    fn first_messages() {
        let cases = [
            (
                "",
                r#"{"object":"chat.completion.chunk","choices":[]}"#,
                Some(Api::OpenAi),
            ),
            ("", r#"{"choices":[{"text":"a"}]}"#, Some(Api::OpenAi)),
            ("message_start", "{}", Some(Api::Anthropic)),
            (
                "",
                r#"{"type":"message_start","message":{}}"#,
                Some(Api::Anthropic),
            ),
            (
                "",
                r#"{"type":"message","role":"assistant","content":[]}"#,
                Some(Api::Anthropic),
            ),
            (
                "",
                r#"{"type":"response.created","response":{}}"#,
                Some(Api::Responses),
            ),
            (
                "",
                r#"{"object":"response","output":[]}"#,
                Some(Api::Responses),
            ),
            ("", r#"{"candidates":[]}"#, Some(Api::Gemini)),
            ("", r#"[{"candidates":[]}]"#, Some(Api::Gemini)),
            (
                "",
                r#"{"token":{"id":1},"generated_text":null}"#,
                Some(Api::Tgi),
            ),
            ("", r#"[{"generated_text":"x"}]"#, Some(Api::Tgi)),
            ("", r#"{"content":"a","stop":false}"#, Some(Api::LlamaCpp)),
            (
                "",
                r#"{"model":"m","created_at":"t","response":"a","done":false}"#,
                Some(Api::Ollama),
            ),
            ("", r#"{"text":"a","meta_info":{}}"#, Some(Api::Sglang)),
            (
                "",
                r#"{"model_name":"e","model_version":"1","text_output":"a"}"#,
                Some(Api::Triton),
            ),
            ("message-start", "{}", Some(Api::Cohere)),
            ("", r#"{"model_id":"m","results":[]}"#, Some(Api::Watsonx)),
            ("output", "Hello", Some(Api::Replicate)),
            // Not decisive: these appear in several formats.
            ("ping", r#"{"type":"ping"}"#, None),
            ("error", r#"{"type":"error","error":{}}"#, None),
            ("", r#"{"error":{"message":"x"}}"#, None),
            ("", "[DONE]", None),
            ("", "", None),
            ("", "[]", None),
        ];
        for (event, data, want) in cases {
            assert_eq!(sniff(&msg(event, data)), want, "{event} {data}");
        }
    }

    #[test]
    fn shape_beats_path_and_path_breaks_ties() {
        // TGI's OpenAI-compatible route on a path that says nothing.
        let mut a = Auto::new(None);
        assert_eq!(a.api(), Api::Unknown);
        a.on_message(&msg("", r#"{"choices":[{"delta":{"content":"a"}}]}"#));
        assert_eq!(a.api(), Api::OpenAi);

        // llama.cpp's native API on `/completions`.
        let mut a = Auto::new(path_hint("/completions"));
        assert_eq!(a.on_message(&msg("", r#"{"content":"a","stop":false}"#)), 1);
        assert_eq!(a.api(), Api::LlamaCpp);

        // A ping first does not make an OpenAI stream Anthropic.
        let mut a = Auto::new(path_hint("/v1/chat/completions"));
        assert_eq!(a.on_message(&msg("", r#"{"type":"ping"}"#)), 0);
        assert_eq!(
            a.on_message(&msg("", r#"{"choices":[{"delta":{"content":"a"}}]}"#)),
            1
        );
        assert_eq!(a.api(), Api::OpenAi);
    }

    #[test]
    fn undecided_streams_settle_for_the_path_or_unknown() {
        let mut a = Auto::new(Some(Api::Anthropic));
        for _ in 0..MAX_UNDECIDED {
            assert_eq!(a.on_message(&msg("error", "{}")), 0);
        }
        assert_eq!(a.api(), Api::Anthropic);
        assert_eq!(a.summary().malformed, 0);

        let mut a = Auto::new(None);
        for _ in 0..MAX_UNDECIDED * 2 {
            assert_eq!(a.on_message(&msg("", "not json")), 0);
        }
        assert_eq!(a.api(), Api::Unknown);
        assert!(a.inner.is_some(), "gave up sniffing");
    }
}
