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
