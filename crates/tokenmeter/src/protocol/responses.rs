//! The OpenAI Responses API (`/v1/responses`), as OpenAI, Azure, OpenRouter, DeepSeek, Bedrock
//! and LM Studio serve it.
//!
//! Every event names itself in its JSON `type` (the SSE `event:` line is optional: Bedrock and
//! Azure send data-only streams). An event is token-bearing when its type ends in `.delta` and it
//! carries a non-empty `delta`: output text, reasoning text and summaries, function-call and
//! custom-tool arguments alike. `response.completed` (or `.incomplete`, `.failed`) carries the
//! whole response, whose `usage` counts every output token, reasoning included. It is the last
//! event of every stream ([`Summary::ended`]), though OpenRouter follows it with a
//! `data: [DONE]`, which ends the stream too. A non-streaming response is that same object on
//! its own.
//!
//! Kinds come from the delta's type: `response.reasoning_text.delta`,
//! `response.reasoning_summary_text.delta` (any type naming `reasoning`) are reasoning;
//! `response.function_call_arguments.delta`, `response.custom_tool_call_input.delta`,
//! `response.mcp_call_arguments.delta` and `response.code_interpreter_call_code.delta` a tool
//! call; the rest (`response.output_text.delta`, `response.refusal.delta`, ...) content. Usage's
//! `output_tokens_details.reasoning_tokens` and `input_tokens_details.cached_tokens` are the
//! reasoning and cached-read counts.

use serde::Deserialize;

use super::json::{parse, Count, Str, Text};
use super::{is_done, Api, Extractor, Kinds, Message, OutputKind, Summary};

/// The Responses extractor.
#[derive(Debug, Default)]
pub struct Responses {
    summary: Summary,
    kinds: Kinds,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Str<'a>,
    #[serde(default)]
    delta: Text,
    #[serde(default, borrow)]
    response: Option<Response<'a>>,
    /// A non-streaming response is the response object itself.
    #[serde(default, borrow)]
    object: Str<'a>,
    #[serde(default, borrow)]
    model: Str<'a>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    output: Text,
}

#[derive(Deserialize)]
struct Response<'a> {
    #[serde(default, borrow)]
    model: Str<'a>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    output_tokens: Count,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Count,
}

#[derive(Deserialize)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Count,
}

/// The kind of output a delta event's type names.
fn delta_kind(kind: &str) -> OutputKind {
    if kind.contains("reasoning") {
        OutputKind::Reasoning
    } else if ["function_call", "tool_call", "mcp_call", "code_interpreter"]
        .iter()
        .any(|t| kind.contains(t))
    {
        OutputKind::ToolCall
    } else {
        OutputKind::Content
    }
}

impl Responses {
    fn take(&mut self, model: Str<'_>, usage: Option<Usage>) {
        self.summary.name_model(model.0);
        if let Some(u) = usage {
            if u.input_tokens.0.is_some() {
                self.summary.input_tokens = u.input_tokens.0;
            }
            if u.output_tokens.0.is_some() {
                self.summary.output_tokens = u.output_tokens.0;
            }
            if let Some(r) = u.output_tokens_details.and_then(|d| d.reasoning_tokens.0) {
                self.summary.reasoning_tokens = Some(r);
            }
            if let Some(c) = u.input_tokens_details.and_then(|d| d.cached_tokens.0) {
                self.summary.cached_read = Some(c);
            }
        }
    }
}

impl Extractor for Responses {
    fn api(&self) -> Api {
        Api::Responses
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        // The event line alone says the stream is over, whatever its data.
        if is_final(msg.event) || is_done(msg) {
            self.summary.ended = true;
        }
        let Some(ev) = parse::<Event<'_>>(msg.data, &mut self.summary.malformed) else {
            return 0;
        };
        if ev.object.as_deref() == Some("response") {
            self.take(ev.model, ev.usage);
            self.kinds = Kinds::CONTENT;
            return u32::from(ev.output.0);
        }
        if let Some(r) = ev.response {
            self.take(r.model, r.usage);
        }
        let kind = ev.kind.as_deref().unwrap_or(msg.event);
        if is_final(kind) {
            self.summary.ended = true;
        }
        self.kinds = Kinds::of(delta_kind(kind));
        u32::from(kind.ends_with(".delta") && ev.delta.0)
    }

    fn summary(&self) -> &Summary {
        &self.summary
    }

    fn kinds(&self) -> Kinds {
        self.kinds
    }
}

/// The event types that end a stream: the response's terminal state.
fn is_final(kind: &str) -> bool {
    matches!(
        kind,
        "response.completed" | "response.incomplete" | "response.failed"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::ended_at;

    fn run(events: &[(&str, &str)]) -> (Vec<u32>, Summary) {
        crate::protocol::testing::run(&mut Responses::default(), events.iter().copied())
    }

    #[test]
    fn delta_types_give_kinds_and_usage_details() {
        let mut x = Responses::default();
        let (kinds, _) = crate::protocol::testing::kinds(
            &mut x,
            [
                r#"{"type":"response.reasoning_summary_text.delta","delta":"Think"}"#,
                r#"{"type":"response.reasoning_text.delta","delta":"more"}"#,
                r#"{"type":"response.output_text.delta","delta":"Hi"}"#,
                r#"{"type":"response.function_call_arguments.delta","delta":"{\"a"}"#,
                r#"{"type":"response.output_text.delta","delta":""}"#,
                r#"{"type":"response.completed","response":{"model":"o4","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4},"output_tokens":30,"output_tokens_details":{"reasoning_tokens":20}}}}"#,
            ]
            .into_iter()
            .map(|d| ("", d)),
        );
        assert_eq!(
            kinds,
            [
                Kinds::REASONING,
                Kinds::REASONING,
                Kinds::CONTENT,
                Kinds::TOOL_CALL
            ]
        );
        let s = x.summary();
        assert_eq!((s.reasoning_tokens, s.cached_read), (Some(20), Some(4)));
        assert_eq!(s.output_tokens, Some(30));
    }

    #[test]
    fn deltas_and_completed_usage() {
        let (counts, s) = run(&[
            (
                "response.created",
                r#"{"type":"response.created","response":{"model":"gpt-4o","usage":null}}"#,
            ),
            (
                "",
                r#"{"type":"response.output_item.added","item":{"type":"reasoning"}}"#,
            ),
            (
                "",
                r#"{"type":"response.reasoning_summary_text.delta","delta":"Think"}"#,
            ),
            (
                "",
                r#"{"type":"response.output_text.delta","delta":"Hi","logprobs":[]}"#,
            ),
            ("", r#"{"type":"response.output_text.delta","delta":""}"#),
            (
                "",
                r#"{"type":"response.function_call_arguments.delta","delta":"{\"a\""}"#,
            ),
            ("", r#"{"type":"response.output_text.done","text":"Hi"}"#),
            (
                "",
                r#"{"type":"response.completed","response":{"model":"gpt-4o","usage":{"input_tokens":9,"output_tokens":30,"output_tokens_details":{"reasoning_tokens":20}}}}"#,
            ),
        ]);
        assert_eq!(counts, [0, 0, 1, 1, 0, 1, 0, 0]);
        assert_eq!(s.model.as_deref(), Some("gpt-4o"));
        assert_eq!((s.input_tokens, s.output_tokens), (Some(9), Some(30)));
    }

    #[test]
    fn the_terminal_state_ends_the_stream() {
        let created = r#"{"type":"response.created","response":{"status":"in_progress"}}"#;
        let delta = r#"{"type":"response.output_text.delta","delta":"Hi"}"#;
        let done = r#"{"type":"response.output_text.done","text":"Hi"}"#;
        for last in [
            r#"{"type":"response.completed","response":{"usage":{"output_tokens":1}}}"#,
            r#"{"type":"response.incomplete","response":{"incomplete_details":{"reason":"max_output_tokens"}}}"#,
            r#"{"type":"response.failed","response":{"status":"failed"}}"#,
        ] {
            let stream = [created, delta, done, last].map(|d| ("", d));
            assert_eq!(
                ended_at(&mut Responses::default(), stream),
                Some(3),
                "{last}"
            );
        }
        let cut = [created, delta, done].map(|d| ("", d));
        assert_eq!(ended_at(&mut Responses::default(), cut), None);
        // `response.done` is not a Responses event; `error` comes before `response.failed`.
        let others = [("", r#"{"type":"response.done"}"#), ("error", "{}")];
        assert_eq!(ended_at(&mut Responses::default(), others), None);
        // The event line alone, and OpenRouter's trailing sentinel.
        let named = [("response.completed", "{broken")];
        assert_eq!(ended_at(&mut Responses::default(), named), Some(0));
        let sentinel = [("", created), ("", "[DONE]")];
        assert_eq!(ended_at(&mut Responses::default(), sentinel), Some(1));
    }

    #[test]
    fn type_from_the_event_line_when_the_json_has_none() {
        let (counts, _) = run(&[("response.output_text.delta", r#"{"delta":"x"}"#)]);
        assert_eq!(counts, [1]);
    }

    #[test]
    fn failed_and_errors_carry_no_tokens() {
        let (counts, s) = run(&[
            (
                "error",
                r#"{"type":"error","error":{"code":"insufficient_quota"}}"#,
            ),
            (
                "",
                r#"{"type":"response.failed","response":{"status":"failed","usage":null}}"#,
            ),
        ]);
        assert_eq!(counts, [0, 0]);
        assert_eq!((s.output_tokens, s.malformed), (None, 0));
    }

    #[test]
    fn non_streaming_response() {
        let (counts, s) = run(&[(
            "",
            r#"{"object":"response","model":"m","output":[{"type":"message"}],"usage":{"input_tokens":3,"output_tokens":4}}"#,
        )]);
        assert_eq!(counts, [1]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(3), Some(4)));
    }
}
