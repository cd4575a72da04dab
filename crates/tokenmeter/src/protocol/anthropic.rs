//! Anthropic Messages (`/v1/messages`).
//!
//! `message_start` names the model and the prompt tokens; `content_block_delta` events carry the
//! output: a token-bearing one is a non-empty `text_delta` (content), `thinking_delta`
//! (reasoning) or `input_json_delta` (a tool call's input) (a `signature_delta` or
//! `citations_delta` is not generated text). Thinking tokens are not reported apart in usage, so
//! they are counted from thinking deltas. `cache_read_input_tokens` and
//! `cache_creation_input_tokens` (in `message_start`, repeated in `message_delta`) are the
//! cached prompt tokens read and written. `message_delta` carries the
//! cumulative `output_tokens` (the latest wins) and, on newer API versions, the final
//! `input_tokens`. The `output_tokens` in `message_start` is a placeholder (usually 1), so it is
//! not taken for a usage report. `ping` and `error` events carry nothing. `message_stop` is the
//! last event of every stream ([`Summary::ended`]). A non-streaming response is one `message`
//! object with its `usage`.

use serde::Deserialize;

use super::json::{parse, Count, Reason, Str, Text};
use super::{Api, Extractor, Kinds, Message, OutputKind, Summary};

/// The Anthropic extractor.
#[derive(Debug, Default)]
pub struct Anthropic {
    summary: Summary,
    kinds: Kinds,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Str<'a>,
    #[serde(default, borrow)]
    message: Option<Start<'a>>,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    /// A non-streaming response is the message itself.
    #[serde(default, borrow)]
    model: Str<'a>,
    #[serde(default)]
    content: Text,
    #[serde(default)]
    stop_reason: Reason,
}

#[derive(Deserialize)]
struct Start<'a> {
    #[serde(default, borrow)]
    model: Str<'a>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Str<'a>,
    #[serde(default)]
    text: Text,
    #[serde(default)]
    thinking: Text,
    #[serde(default)]
    partial_json: Text,
    /// `message_delta` carries the stop reason here.
    #[serde(default)]
    stop_reason: Reason,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    output_tokens: Count,
    #[serde(default)]
    cache_read_input_tokens: Count,
    #[serde(default)]
    cache_creation_input_tokens: Count,
}

impl Anthropic {
    fn input(&mut self, usage: &Usage) {
        if usage.input_tokens.0.is_some() {
            self.summary.input_tokens = usage.input_tokens.0;
        }
        if usage.cache_read_input_tokens.0.is_some() {
            self.summary.cached_read = usage.cache_read_input_tokens.0;
        }
        if usage.cache_creation_input_tokens.0.is_some() {
            self.summary.cached_write = usage.cache_creation_input_tokens.0;
        }
    }

    fn output(&mut self, usage: &Usage) {
        if usage.output_tokens.0.is_some() {
            self.summary.output_tokens = usage.output_tokens.0;
        }
    }
}

impl Extractor for Anthropic {
    fn api(&self) -> Api {
        Api::Anthropic
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        // The event line alone says the stream is over, whatever its data.
        if msg.event == "message_stop" {
            self.summary.ended = true;
        }
        let Some(ev) = parse::<Event<'_>>(msg.data, &mut self.summary.malformed) else {
            return 0;
        };
        let kind = ev.kind.as_deref().unwrap_or(msg.event);
        match kind {
            "message_stop" => {
                self.summary.ended = true;
                0
            }
            "message_start" => {
                if let Some(m) = ev.message {
                    self.summary.name_model(m.model.0);
                    if let Some(u) = &m.usage {
                        self.input(u);
                    }
                }
                0
            }
            "content_block_delta" => {
                let Some(d) = ev.delta else { return 0 };
                let (output, kind) = match d.kind.as_deref() {
                    Some("text_delta") => (d.text.0, OutputKind::Content),
                    Some("thinking_delta") => (d.thinking.0, OutputKind::Reasoning),
                    Some("input_json_delta") => (d.partial_json.0, OutputKind::ToolCall),
                    _ => (false, OutputKind::Content),
                };
                self.kinds = Kinds::of(kind);
                u32::from(output)
            }
            "message_delta" => {
                if let Some(d) = &ev.delta {
                    self.summary.stopped(d.stop_reason);
                }
                if let Some(u) = &ev.usage {
                    self.input(u);
                    self.output(u);
                }
                0
            }
            "message" => {
                self.summary.name_model(ev.model.0);
                self.summary.stopped(ev.stop_reason);
                if let Some(u) = &ev.usage {
                    self.input(u);
                    self.output(u);
                }
                self.kinds = Kinds::CONTENT;
                u32::from(ev.content.0)
            }
            _ => 0,
        }
    }

    fn summary(&self) -> &Summary {
        &self.summary
    }

    fn kinds(&self) -> Kinds {
        self.kinds
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::ended_at;

    fn run(events: &[(&str, &str)]) -> (Vec<u32>, Summary) {
        crate::protocol::testing::run(&mut Anthropic::default(), events.iter().copied())
    }

    #[test]
    fn a_stream_with_thinking_tools_and_ping() {
        let (counts, s) = run(&[
            (
                "message_start",
                r#"{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":11,"output_tokens":1}}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            ),
            ("ping", r#"{"type": "ping"}"#),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let"}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"a"}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"citations_delta","citation":{}}}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":6}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ]);
        assert_eq!(counts, [0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0]);
        assert_eq!(s.model.as_deref(), Some("claude"));
        assert_eq!((s.input_tokens, s.output_tokens), (Some(11), Some(6)));
        assert!(s.ended);
        assert_eq!(s.stop, Some(crate::protocol::Stop::Stop));
    }

    #[test]
    fn deltas_are_marked_by_kind_and_cache_usage_is_kept() {
        let mut x = Anthropic::default();
        let (kinds, _) = crate::protocol::testing::kinds(
            &mut x,
            [
                (
                    "message_start",
                    r#"{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":4,"cache_creation_input_tokens":0,"cache_read_input_tokens":1165,"output_tokens":1}}}"#,
                ),
                (
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let"}}"#,
                ),
                (
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
                ),
                (
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{"}}"#,
                ),
            ],
        );
        assert_eq!(kinds, [Kinds::REASONING, Kinds::CONTENT, Kinds::TOOL_CALL]);
        let s = x.summary();
        assert_eq!((s.cached_read, s.cached_write), (Some(1165), Some(0)));
        assert_eq!(s.input_tokens, Some(4));
    }

    #[test]
    fn message_stop_ends_the_stream_and_nothing_before_it_does() {
        let stream = [
            (
                "message_start",
                r#"{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":3}}}"#,
            ),
            ("ping", r#"{"type": "ping"}"#),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
            ),
            (
                "content_block_stop",
                r#"{"type":"content_block_stop","index":0}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ];
        assert_eq!(ended_at(&mut Anthropic::default(), stream), Some(5));
        assert_eq!(
            ended_at(&mut Anthropic::default(), stream[..5].iter().copied()),
            None
        );
        // Data-only (the type names the event), and an event line whose data is broken.
        let data_only = stream.map(|(_, data)| ("", data));
        assert_eq!(ended_at(&mut Anthropic::default(), data_only), Some(5));
        let (_, s) = run(&[("message_stop", "{broken")]);
        assert!(s.ended);
        assert_eq!(s.malformed, 1);
        // An error event is not the end marker.
        let (_, s) = run(&[(
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
        )]);
        assert!(!s.ended);
    }

    #[test]
    fn message_start_output_is_a_placeholder_and_final_input_wins() {
        let (_, s) = run(&[(
            "message_start",
            r#"{"type":"message_start","message":{"usage":{"input_tokens":2050,"output_tokens":1}}}"#,
        )]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(2050), None));
        let (_, s) = run(&[
            (
                "message_start",
                r#"{"type":"message_start","message":{"usage":{"input_tokens":2050,"output_tokens":1}}}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","usage":{"input_tokens":31772,"output_tokens":644}}"#,
            ),
        ]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(31772), Some(644)));
    }

    #[test]
    fn errors_and_non_streaming() {
        let (counts, s) = run(&[(
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
        )]);
        assert_eq!((counts, s.malformed), (vec![0], 0));
        let (counts, s) = run(&[(
            "",
            r#"{"type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":5,"output_tokens":3}}"#,
        )]);
        assert_eq!(counts, [1]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(5), Some(3)));
        assert_eq!(s.model.as_deref(), Some("claude"));
    }
}
