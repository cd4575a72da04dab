//! Ollama native `/api/generate` and `/api/chat`: newline-delimited JSON, not SSE.
//!
//! Each line is one token (Ollama streams token by token). A token-bearing line has generated
//! output: `response` or `thinking` (generate), `message.content`, `message.thinking` or
//! `message.tool_calls` (chat). The last line (`"done": true`) reports `eval_count` (output
//! tokens), `prompt_eval_count` (prompt tokens evaluated) and the nanoseconds it spent loading
//! the model, on the prompt and generating ([`super::timings`]), and ends the stream
//! ([`Summary::ended`]). A non-streaming answer is that last line with the whole text.
//! `thinking` is reasoning (Ollama reports no reasoning count, so it is counted from these
//! lines), `tool_calls` a tool call, `response` and `content` content.

use serde::Deserialize;

use super::json::{parse, Count, Flag, Reason, Str, Text};
use super::timings;
use super::{Api, Extractor, Kinds, Message, OutputKind, Stop, Summary};

/// The Ollama extractor.
#[derive(Debug, Default)]
pub struct Ollama {
    summary: Summary,
    kinds: Kinds,
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(default, borrow)]
    model: Str<'a>,
    #[serde(default)]
    response: Text,
    #[serde(default)]
    thinking: Text,
    #[serde(default)]
    message: Option<ChatMessage>,
    #[serde(default)]
    eval_count: Count,
    #[serde(default)]
    prompt_eval_count: Count,
    /// Nanoseconds spent loading the model, computing the prompt, and generating.
    #[serde(default)]
    load_duration: Count,
    #[serde(default)]
    prompt_eval_duration: Count,
    #[serde(default)]
    eval_duration: Count,
    #[serde(default)]
    done: Flag,
    #[serde(default)]
    done_reason: Reason,
}

#[derive(Deserialize, Default)]
struct ChatMessage {
    #[serde(default)]
    content: Text,
    #[serde(default)]
    thinking: Text,
    #[serde(default)]
    tool_calls: Text,
}

impl Extractor for Ollama {
    fn api(&self) -> Api {
        Api::Ollama
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        let Some(line) = parse::<Line<'_>>(msg.data, &mut self.summary.malformed) else {
            return 0;
        };
        self.summary.name_model(line.model.0);
        if line.done.0 {
            self.summary.ended = true;
            // A final line without `done_reason` (Ollama before 0.1.40) still finished.
            let reason = line.done_reason.0.unwrap_or(Stop::Stop);
            self.summary.stop = Some(reason);
        }
        if line.eval_count.0.is_some() {
            self.summary.output_tokens = line.eval_count.0;
        }
        if line.prompt_eval_count.0.is_some() {
            self.summary.input_tokens = line.prompt_eval_count.0;
        }
        let stated = timings::ollama(
            line.load_duration,
            line.prompt_eval_duration,
            line.eval_duration,
        );
        if stated.is_some() {
            self.summary.engine = stated;
        }
        let chat = line.message.unwrap_or_default();
        self.kinds = Kinds::NONE
            .with(OutputKind::Reasoning, line.thinking.0 || chat.thinking.0)
            .with(OutputKind::Content, line.response.0 || chat.content.0)
            .with(OutputKind::ToolCall, chat.tool_calls.0);
        u32::from(!self.kinds.is_empty())
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

    #[test]
    fn thinking_content_and_tool_lines_have_their_kinds() {
        let mut x = Ollama::default();
        let (kinds, _) = crate::protocol::testing::kinds(
            &mut x,
            [
                r#"{"model":"m","message":{"role":"assistant","content":"","thinking":"We"},"done":false}"#,
                r#"{"model":"m","response":"","thinking":"need","done":false}"#,
                r#"{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}"#,
                r#"{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f"}}]},"done":false}"#,
                r#"{"model":"m","message":{"role":"assistant","content":""},"done":true,"eval_count":4}"#,
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

    fn run(lines: &[&str]) -> (Vec<u32>, Summary) {
        let mut x = Ollama::default();
        let counts = lines
            .iter()
            .map(|l| {
                x.on_message(&Message {
                    event: "",
                    data: l.as_bytes(),
                })
            })
            .collect();
        (counts, x.summary().clone())
    }

    #[test]
    fn generate_with_thinking() {
        let (counts, s) = run(&[
            r#"{"model":"gpt-oss:120b","created_at":"t","response":"","done":false}"#,
            r#"{"model":"gpt-oss:120b","created_at":"t","response":"","thinking":"We","done":false}"#,
            r#"{"model":"gpt-oss:120b","created_at":"t","response":"Hi","done":false}"#,
            r#"{"model":"gpt-oss:120b","created_at":"t","response":"","done":true,"done_reason":"stop","prompt_eval_count":81,"eval_count":34,"eval_duration":1}"#,
        ]);
        assert_eq!(counts, [0, 1, 1, 0]);
        assert_eq!(s.model.as_deref(), Some("gpt-oss:120b"));
        assert_eq!((s.input_tokens, s.output_tokens), (Some(81), Some(34)));
        assert!(s.ended);
    }

    #[test]
    fn done_true_ends_the_stream() {
        let lines = [
            r#"{"model":"m","created_at":"t","response":"Hi","done":false}"#,
            r#"{"model":"m","created_at":"t","response":"","done":"true"}"#,
            r#"{"model":"m","created_at":"t","response":"!"}"#,
            r#"{"model":"m","created_at":"t","response":"","done":true,"done_reason":"stop","eval_count":2}"#,
        ];
        let events = lines.map(|l| ("", l));
        let ended_at = |n: usize| {
            crate::protocol::testing::ended_at(&mut Ollama::default(), events[..n].iter().copied())
        };
        assert_eq!(ended_at(4), Some(3));
        assert_eq!(ended_at(3), None);
    }

    #[test]
    fn chat_with_tool_calls_and_errors() {
        let (counts, s) = run(&[
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":"Ok"},"done":false}"#,
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f"}}]},"done":false}"#,
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done":true,"eval_count":2}"#,
            r#"{"error":"model runner has unexpectedly stopped"}"#,
        ]);
        assert_eq!(counts, [1, 1, 0, 0]);
        assert_eq!((s.output_tokens, s.malformed), (Some(2), 0));
    }
}
