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
    use Sniff::{Format as F, Neutral, Unknown};
    let cases = [
        (
            "",
            r#"{"object":"chat.completion.chunk","choices":[]}"#,
            F(Api::OpenAi),
        ),
        ("", r#"{"choices":[{"text":"a"}]}"#, F(Api::OpenAi)),
        ("message_start", "{}", F(Api::Anthropic)),
        (
            "",
            r#"{"type":"message_start","message":{}}"#,
            F(Api::Anthropic),
        ),
        (
            "",
            r#"{"type":"message","role":"assistant"}"#,
            F(Api::Anthropic),
        ),
        (
            "",
            r#"{"type":"response.created","response":{}}"#,
            F(Api::Responses),
        ),
        (
            "",
            r#"{"object":"response","output":[]}"#,
            F(Api::Responses),
        ),
        ("", r#"{"candidates":[]}"#, F(Api::Gemini)),
        ("", r#"[{"candidates":[]}]"#, F(Api::Gemini)),
        (
            "",
            r#"{"token":{"id":1},"generated_text":null}"#,
            F(Api::Tgi),
        ),
        ("", r#"[{"generated_text":"x"}]"#, F(Api::Tgi)),
        ("", r#"{"content":"a","stop":false}"#, F(Api::LlamaCpp)),
        (
            "",
            r#"{"created_at":"t","response":"a","done":false}"#,
            F(Api::Ollama),
        ),
        ("", r#"{"text":"a","meta_info":{}}"#, F(Api::Sglang)),
        (
            "",
            r#"{"model_name":"e","text_output":"a"}"#,
            F(Api::Triton),
        ),
        ("message-start", "{}", F(Api::Cohere)),
        ("", r#"{"model_id":"m","results":[]}"#, F(Api::Watsonx)),
        ("output", "Hello", F(Api::Replicate)),
        // Several formats send these.
        ("ping", r#"{"type":"ping"}"#, Neutral),
        ("", r#"{"type": "ping"}"#, Neutral),
        ("error", r#"{"type":"error","error":{}}"#, Neutral),
        ("", r#"{"error":{"message":"x"}}"#, Neutral),
        ("done", "{}", Neutral),
        ("", "[DONE]", Neutral),
        ("", "", Neutral),
        ("", "[]", Neutral),
        // No format explains these.
        ("", r#"{"choices":[{"delta":{"content"#, Unknown),
        ("", r#"{"id":"x"}"#, Unknown),
        ("", "garbage", Unknown),
        ("", "42", Unknown),
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

    // Broken JSON on an OpenAI path is OpenAI's malformed message, not a mystery.
    let mut a = Auto::new(path_hint("/v1/chat/completions"));
    assert_eq!(a.on_message(&msg("", r#"{"choices":[{"delta""#)), 0);
    assert_eq!((a.api(), a.summary().malformed), (Api::OpenAi, 1));
}

#[test]
fn a_lone_end_marker_shows_its_format_and_ends_the_stream() {
    let cases = [
        (Api::Anthropic, "message_stop", r#"{"type":"message_stop"}"#),
        (Api::Anthropic, "", r#"{"type":"message_stop"}"#),
        (
            Api::Responses,
            "",
            r#"{"type":"response.completed","response":{"usage":{"output_tokens":1}}}"#,
        ),
        (Api::Cohere, "", r#"{"type":"message-end","delta":{}}"#),
        (
            Api::Ollama,
            "",
            r#"{"model":"m","created_at":"t","response":"","done":true,"eval_count":3}"#,
        ),
        (
            Api::LlamaCpp,
            "",
            r#"{"content":"","stop":true,"tokens_predicted":3}"#,
        ),
        (
            Api::Tgi,
            "",
            r#"{"token":{"id":2},"generated_text":"a b","details":null}"#,
        ),
        (
            Api::Watsonx,
            "message",
            r#"{"model_id":"m","results":[{"generated_text":"","stop_reason":"eos_token"}]}"#,
        ),
    ];
    for (api, event, data) in cases {
        for hint in [None, Some(Api::OpenAi)] {
            let mut a = Auto::new(hint);
            assert!(!a.summary().ended);
            a.on_message(&msg(event, data));
            assert_eq!(a.api(), api, "{data}");
            assert!(a.summary().ended, "{data} with hint {hint:?}");
        }
    }
}

#[test]
fn a_neutral_end_marker_ends_an_undecided_stream() {
    // SGLang's native error, then its sentinel, on a path that suggests TGI.
    let mut a = Auto::new(path_hint("/generate"));
    a.on_message(&msg("", r#"{"error":{"message":"bad input"}}"#));
    assert!(!a.summary().ended);
    a.on_message(&msg("", "[DONE]"));
    assert!(a.summary().ended);
    assert_eq!((a.api(), a.summary().malformed), (Api::Tgi, 0));
    // Nothing after it is read, so the end holds.
    let late = r#"{"model":"m","created_at":"t","response":"x","done":false}"#;
    assert_eq!(a.on_message(&msg("", late)), 0);
    assert!(a.summary().ended);
    assert_eq!(a.api(), Api::Tgi);

    // A Replicate prediction with no output, and a sentinel with no path to go by.
    let mut a = Auto::new(path_hint("/v1/streams/abc"));
    a.on_message(&msg("done", "{}"));
    assert!(a.summary().ended);
    assert_eq!(a.api(), Api::Replicate);
    let mut a = Auto::new(None);
    a.on_message(&msg("", "[DONE]"));
    assert!(a.summary().ended);
    assert_eq!(a.api(), Api::Unknown);

    // Other neutral messages end nothing.
    let mut a = Auto::new(None);
    for (event, data) in [("ping", "{}"), ("error", "{}"), ("", ""), ("", "[]")] {
        a.on_message(&msg(event, data));
    }
    assert!(!a.summary().ended);
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
    assert_eq!(
        a.summary().malformed,
        0,
        "an unknown format has no malformed messages"
    );
    assert!(a.inner.is_some(), "gave up sniffing");
}

/// The sniff as it was written over a `serde_json::Value`: the oracle for [`shape`], which reads
/// the same facts without building the value.
fn sniff_by_value(msg: &Message<'_>) -> Sniff {
    use serde_json::{Map, Value};
    fn object(o: &Map<String, Value>) -> Sniff {
        let has = |k: &str| o.contains_key(k);
        let str_of = |k: &str| o.get(k).and_then(Value::as_str);
        if let Some(t) = str_of("type") {
            if let Some(api) = by_type(t) {
                return Sniff::Format(api);
            }
            if is_neutral_type(t) {
                return Sniff::Neutral;
            }
        }
        if str_of("type") == Some("message") && has("role") {
            return Sniff::Format(Api::Anthropic);
        }
        match str_of("object") {
            Some("chat.completion.chunk" | "chat.completion" | "text_completion") => {
                return Sniff::Format(Api::OpenAi)
            }
            Some("response") => return Sniff::Format(Api::Responses),
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
            Api::Cohere
        } else {
            return Sniff::Unknown;
        };
        Sniff::Format(api)
    }
    let quick = sniff(&Message {
        event: msg.event,
        data: b"",
    });
    if msg.event == "output" || by_type(msg.event).is_some() {
        return quick;
    }
    if is_neutral_type(msg.event)
        || msg.data == b"[DONE]"
        || msg.data.iter().all(u8::is_ascii_whitespace)
    {
        return Sniff::Neutral;
    }
    let Ok(value) = serde_json::from_slice::<Value>(msg.data) else {
        return Sniff::Unknown;
    };
    let first = match value {
        Value::Array(items) => match items.into_iter().next() {
            Some(v) => v,
            None => return Sniff::Neutral,
        },
        v => v,
    };
    match first.as_object() {
        Some(o) if o.is_empty() || o.contains_key("error") => Sniff::Neutral,
        Some(o) => object(o),
        None => Sniff::Unknown,
    }
}

#[test]
fn the_shape_reads_what_a_value_would_show() {
    let cases = [
        r#"{"object":"chat.completion.chunk","choices":[]}"#,
        r#"{"type":5,"choices":[]}"#,
        r#"{"type":"message_start","type":5}"#,
        r#"{"type":5,"type":"message_start"}"#,
        r#"{"\u0074ype":"message_start"}"#,
        r#"{"type":"mess\u0061ge","role":"assistant"}"#,
        r#"{"type":"message","role":"assistant"}"#,
        r#"{"object":{"nested":"chat.completion.chunk"},"id":"x"}"#,
        r#"{"object":["chat.completion.chunk"]}"#,
        r#"{"object":null,"choices":null}"#,
        r#"[{"candidates":[]},{"candidates":[]}]"#,
        r#"[[{"choices":[]}]]"#,
        r#"["choices"]"#,
        r#"[{"choices":[]}, oops]"#,
        r#"[]"#,
        r#"[null]"#,
        r#"{}"#,
        r#"{"error":"x","choices":[]}"#,
        r#"{"model_name":"m","model_version":"1"}"#,
        r#"{"model_name":"m"}"#,
        r#"{"content":"x","timings":{}}"#,
        r#"{"content":"x"}"#,
        r#"{"message":{},"finish_reason":"stop","usage":{}}"#,
        r#"{"results":[],"model_id":"m"}"#,
        r#"{"created_at":"t","done":false}"#,
        r#"{"token":{"id":1}}"#,
        r#"{"choices":[]} trailing"#,
        r#"{"choices":[]"#,
        r#""a string""#,
        "true",
        "null",
        "-1.5e3",
        "18446744073709551616",
        r#"{"type":"\ud800"}"#,
        r#"{"type":"ping"}"#,
        r#"{"type":"response.created"}"#,
        "  \n",
    ];
    for data in cases {
        let m = msg("", data);
        assert_eq!(sniff(&m), sniff_by_value(&m), "{data}");
    }
}

proptest::proptest! {
    /// Objects made of the keys detection looks at, and others, with values of every JSON kind
    /// (the type values that decide among them), alone or first in an array.
    #[test]
    fn the_shape_reads_what_a_value_would_show_for_generated_objects(
        entries in proptest::collection::vec((0usize..KEYS.len(), 0usize..VALUES.len()), 0..8),
        wrap in 0usize..3,
    ) {
        let body: Vec<String> = entries
            .iter()
            .map(|&(k, v)| format!("{:?}:{}", KEYS[k], VALUES[v]))
            .collect();
        let object = format!("{{{}}}", body.join(","));
        let data = match wrap {
            0 => object,
            1 => format!("[{object},{{}}]"),
            _ => format!("[{object}"),
        };
        let m = msg("", &data);
        proptest::prop_assert_eq!(sniff(&m), sniff_by_value(&m), "{}", data);
    }
}

const KEYS: &[&str] = &[
    "type",
    "object",
    "error",
    "role",
    "choices",
    "candidates",
    "usageMetadata",
    "meta_info",
    "text_output",
    "model_name",
    "model_version",
    "token",
    "generated_text",
    "results",
    "model_id",
    "created_at",
    "done",
    "content",
    "stop",
    "id_slot",
    "tokens_predicted",
    "timings",
    "message",
    "finish_reason",
    "usage",
    "id",
    "model",
];

const VALUES: &[&str] = &[
    r#""message_start""#,
    r#""message""#,
    r#""ping""#,
    r#""response.created""#,
    r#""chat.completion.chunk""#,
    r#""response""#,
    r#""content-delta""#,
    r#""x""#,
    "1",
    "-2.5",
    "null",
    "true",
    "[]",
    "{}",
    r#"[{"type":"message_start"}]"#,
    r#"{"type":"message_start","choices":[]}"#,
];
