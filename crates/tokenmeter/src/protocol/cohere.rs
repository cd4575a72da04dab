//! Cohere v2 chat (`/v2/chat`).
//!
//! Events name themselves in `type` (hyphenated: `content-delta`, `tool-call-delta`, ...). A
//! token-bearing event is a non-empty `content-delta` (text or thinking), a `tool-plan-delta`, or
//! a `tool-call-start` / `tool-call-delta` (the model writing a tool call). `message-end` reports
//! usage twice: `billed_units` (what is charged) and `tokens` (what the model processed and
//! generated); output is the latter, falling back to the former. `message-end` is the last
//! event ([`Summary::ended`]); the `data: [DONE]` that follows it ends the stream too.
//!
//! Kinds: a `content-delta`'s `thinking` and a `tool-plan-delta` (the model's plan for its tool
//! calls, in its own words) are reasoning, its `text` content, `tool-call-*` a tool call.
//!
//! Cohere v1's stream (`event_type`: `text-generation` ... `stream-end`) is not read here.

use serde::Deserialize;

use super::json::{parse, Count, Reason, Str, Text};
use super::{is_done, Api, Extractor, Kinds, Message, OutputKind, Summary};

/// The Cohere extractor.
#[derive(Debug, Default)]
pub struct Cohere {
    summary: Summary,
    kinds: Kinds,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Str<'a>,
    #[serde(default)]
    delta: Option<Delta>,
    /// A non-streaming response carries `usage` at the top level.
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    message: Option<Content>,
    #[serde(default)]
    finish_reason: Reason,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    message: Option<DeltaMessage>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    finish_reason: Reason,
}

#[derive(Deserialize)]
struct DeltaMessage {
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    tool_plan: Text,
}

#[derive(Deserialize)]
struct Content {
    #[serde(default)]
    text: Text,
    #[serde(default)]
    thinking: Text,
    #[serde(default)]
    content: Text,
    #[serde(default)]
    tool_calls: Text,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    tokens: Option<Tokens>,
    #[serde(default)]
    billed_units: Option<Tokens>,
}

#[derive(Deserialize)]
struct Tokens {
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    output_tokens: Count,
}

impl Cohere {
    fn usage(&mut self, u: Usage) {
        let (tokens, billed) = (u.tokens.as_ref(), u.billed_units.as_ref());
        let output = tokens.and_then(|t| t.output_tokens.0);
        let input = tokens.and_then(|t| t.input_tokens.0);
        if let Some(n) = output.or(billed.and_then(|b| b.output_tokens.0)) {
            self.summary.output_tokens = Some(n);
        }
        if let Some(n) = input.or(billed.and_then(|b| b.input_tokens.0)) {
            self.summary.input_tokens = Some(n);
        }
    }
}

impl Extractor for Cohere {
    fn api(&self) -> Api {
        Api::Cohere
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        // The event line alone says the stream is over, whatever its data.
        if msg.event == "message-end" || is_done(msg) {
            self.summary.ended = true;
        }
        let Some(ev) = parse::<Event<'_>>(msg.data, &mut self.summary.malformed) else {
            return 0;
        };
        let kind = ev.kind.as_deref().unwrap_or(msg.event);
        let delta = ev.delta;
        self.kinds = Kinds::CONTENT;
        let bearing = match kind {
            "content-delta" => {
                let c = delta
                    .as_ref()
                    .and_then(|d| d.message.as_ref())
                    .and_then(|m| m.content.as_ref());
                self.kinds = c.map_or(Kinds::NONE, |c| {
                    Kinds::NONE
                        .with(OutputKind::Reasoning, c.thinking.0)
                        .with(OutputKind::Content, c.text.0)
                });
                !self.kinds.is_empty()
            }
            "tool-plan-delta" => {
                self.kinds = Kinds::REASONING;
                delta
                    .as_ref()
                    .and_then(|d| d.message.as_ref())
                    .is_some_and(|m| m.tool_plan.0)
            }
            "tool-call-start" | "tool-call-delta" => {
                self.kinds = Kinds::TOOL_CALL;
                true
            }
            "message-end" => {
                self.summary.ended = true;
                if let Some(d) = &delta {
                    self.summary.stopped(d.finish_reason);
                }
                if let Some(u) = delta.and_then(|d| d.usage) {
                    self.usage(u);
                }
                false
            }
            _ => {
                // A non-streaming response: `message` and `usage` at the top level.
                self.summary.stopped(ev.finish_reason);
                let Some(u) = ev.usage else { return 0 };
                self.usage(u);
                ev.message
                    .is_some_and(|m| m.content.0 || m.tool_calls.0 || m.text.0)
            }
        };
        u32::from(bearing)
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

    fn run(events: &[&str]) -> (Vec<u32>, Summary) {
        crate::protocol::testing::run(&mut Cohere::default(), events.iter().map(|e| ("", *e)))
    }

    #[test]
    fn text_tools_and_usage() {
        let (counts, s) = run(&[
            r#"{"id":"x","type":"message-start","delta":{"message":{"role":"assistant","content":[],"tool_plan":"","tool_calls":[],"citations":[]}}}"#,
            r#"{"type":"content-start","index":0,"delta":{"message":{"content":{"type":"text","text":""}}}}"#,
            r#"{"type":"content-delta","index":0,"delta":{"message":{"content":{"text":"Ar"}}}}"#,
            r#"{"type":"tool-plan-delta","delta":{"message":{"tool_plan":"I will"}}}"#,
            r#"{"type":"tool-call-start","index":0,"delta":{"message":{"tool_calls":{"id":"c","type":"function","function":{"name":"f","arguments":""}}}}}"#,
            r#"{"type":"tool-call-delta","index":0,"delta":{"message":{"tool_calls":{"function":{"arguments":"{\""}}}}}"#,
            r#"{"type":"tool-call-end","index":0}"#,
            r#"{"type":"message-end","delta":{"finish_reason":"COMPLETE","usage":{"billed_units":{"input_tokens":7,"output_tokens":109},"tokens":{"input_tokens":69,"output_tokens":110}}}}"#,
        ]);
        assert_eq!(counts, [0, 0, 1, 1, 1, 1, 0, 0]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(69), Some(110)));
        assert!(s.ended);
    }

    #[test]
    fn thinking_plans_text_and_tool_calls_have_their_kinds() {
        let mut x = Cohere::default();
        let (kinds, _) = crate::protocol::testing::kinds(
            &mut x,
            [
                r#"{"type":"content-delta","index":0,"delta":{"message":{"content":{"thinking":"Hm"}}}}"#,
                r#"{"type":"tool-plan-delta","delta":{"message":{"tool_plan":"I will"}}}"#,
                r#"{"type":"content-delta","index":0,"delta":{"message":{"content":{"text":"Ar"}}}}"#,
                r#"{"type":"tool-call-delta","index":0,"delta":{"message":{"tool_calls":{"function":{"arguments":"{"}}}}}"#,
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
    }

    #[test]
    fn message_end_ends_the_stream() {
        let stream = [
            r#"{"type":"message-start","delta":{"message":{"role":"assistant"}}}"#,
            r#"{"type":"content-delta","index":0,"delta":{"message":{"content":{"text":"Ar"}}}}"#,
            r#"{"type":"content-end","index":0}"#,
            r#"{"type":"message-end","delta":{"finish_reason":"COMPLETE"}}"#,
            "[DONE]",
        ];
        let events = stream.map(|d| ("", d));
        assert_eq!(ended_at(&mut Cohere::default(), events), Some(3));
        assert_eq!(
            ended_at(&mut Cohere::default(), events[..3].iter().copied()),
            None
        );
        // The event line alone; and the sentinel alone, should `message-end` be missing.
        let named = [("message-end", "{broken")];
        assert_eq!(ended_at(&mut Cohere::default(), named), Some(0));
        let sentinel = [events[0], events[1], ("", "[DONE]")];
        assert_eq!(ended_at(&mut Cohere::default(), sentinel), Some(2));
    }

    #[test]
    fn billed_units_when_tokens_are_missing_and_non_streaming() {
        let (_, s) = run(&[
            r#"{"type":"message-end","delta":{"usage":{"billed_units":{"input_tokens":7,"output_tokens":9}}}}"#,
        ]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(7), Some(9)));
        let (counts, s) = run(&[
            r#"{"id":"x","finish_reason":"COMPLETE","message":{"role":"assistant","content":[{"type":"text","text":"Hi"}]},"usage":{"tokens":{"input_tokens":3,"output_tokens":2}}}"#,
        ]);
        assert_eq!(counts, [1]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(3), Some(2)));
    }
}
