//! Google Gemini `streamGenerateContent?alt=sse` (Google AI and Vertex AI).
//!
//! Each event is a `GenerateContentResponse`. A candidate is token-bearing when one of its parts
//! carries generated output: `text` (thought summaries included), `functionCall` or
//! `executableCode`. `usageMetadata` is cumulative and usually in every event, so its growth is
//! the exact number of tokens an event carries ([`Cumulative`]). Output counts every generated
//! token: `candidatesTokenCount + thoughtsTokenCount`. A part with `"thought": true` is
//! reasoning, a `functionCall` a tool call, other text and `executableCode` content;
//! `thoughtsTokenCount` is the reasoning count and `cachedContentTokenCount` the cached prompt
//! tokens read. Without `alt=sse` the same responses come
//! as one JSON array, which is read the same way.
//!
//! The stream has no end marker, so [`Summary::ended`] is never set: `finishReason` belongs to
//! one candidate (with `candidateCount` > 1 each finishes on its own), and the API does not say
//! that no chunk follows it. Such a request leaves the in-flight gauges at the body's end.

use serde::Deserialize;

use super::cumulative::Cumulative;
use super::json::{parse, Count, Flag, Reason, Str, Text};
use super::{Api, Extractor, Kinds, Message, OutputKind, Summary};

/// The Gemini extractor.
#[derive(Debug, Default)]
pub struct Gemini {
    summary: Summary,
    running: Cumulative,
    kinds: Kinds,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chunk<'a> {
    #[serde(default)]
    candidates: Option<Vec<Candidate>>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default, borrow)]
    model_version: Str<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    finish_reason: Reason,
}

#[derive(Deserialize)]
struct Content {
    #[serde(default)]
    parts: Option<Vec<Part>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part {
    #[serde(default)]
    text: Text,
    #[serde(default)]
    function_call: Text,
    #[serde(default)]
    executable_code: Text,
    #[serde(default)]
    thought: Flag,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: Count,
    #[serde(default)]
    candidates_token_count: Count,
    #[serde(default)]
    thoughts_token_count: Count,
    #[serde(default)]
    cached_content_token_count: Count,
}

impl Part {
    fn kinds(&self) -> Kinds {
        let text = self.text.0 || self.executable_code.0;
        Kinds::NONE
            .with(OutputKind::Reasoning, text && self.thought.0)
            .with(OutputKind::Content, text && !self.thought.0)
            .with(OutputKind::ToolCall, self.function_call.0)
    }
}

impl Gemini {
    fn on_chunk(&mut self, chunk: Chunk<'_>) -> u32 {
        self.summary.name_model(chunk.model_version.0);
        let mut reported = None;
        if let Some(u) = chunk.usage_metadata {
            if u.prompt_token_count.0.is_some() {
                self.summary.input_tokens = u.prompt_token_count.0;
            }
            reported = u.candidates_token_count.plus(u.thoughts_token_count);
            if reported.is_some() {
                self.summary.output_tokens = reported;
            }
            if u.thoughts_token_count.0.is_some() {
                self.summary.reasoning_tokens = u.thoughts_token_count.0;
            }
            if u.cached_content_token_count.0.is_some() {
                self.summary.cached_read = u.cached_content_token_count.0;
            }
        }
        let mut bearing = 0usize;
        for c in chunk.candidates.unwrap_or_default() {
            self.summary.stopped(c.finish_reason);
            let parts = c.content.and_then(|c| c.parts).unwrap_or_default();
            let kinds = parts.iter().fold(Kinds::NONE, |k, p| k.union(p.kinds()));
            self.kinds = self.kinds.union(kinds);
            bearing += usize::from(!kinds.is_empty());
        }
        self.running
            .tokens(reported, u32::try_from(bearing).unwrap_or(u32::MAX))
    }
}

impl Extractor for Gemini {
    fn api(&self) -> Api {
        Api::Gemini
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        self.kinds = Kinds::NONE;
        let array = msg.data.trim_ascii_start().starts_with(b"[");
        if array {
            let Some(chunks) = parse::<Vec<Chunk<'_>>>(msg.data, &mut self.summary.malformed)
            else {
                return 0;
            };
            return chunks
                .into_iter()
                .fold(0u32, |n, c| n.saturating_add(self.on_chunk(c)));
        }
        match parse::<Chunk<'_>>(msg.data, &mut self.summary.malformed) {
            Some(chunk) => self.on_chunk(chunk),
            None => 0,
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

    fn run(events: &[&str]) -> (Vec<u32>, Summary) {
        crate::protocol::testing::run(&mut Gemini::default(), events.iter().map(|e| ("", *e)))
    }

    #[test]
    fn thought_parts_are_reasoning_and_usage_details_are_kept() {
        let mut x = Gemini::default();
        let mut seen = Vec::new();
        for data in [
            r#"{"candidates":[{"content":{"parts":[{"text":"**Plan**","thought":true}]}}],"usageMetadata":{"promptTokenCount":8,"thoughtsTokenCount":12}}"#,
            r#"{"candidates":[{"content":{"parts":[{"text":"Hi"}]}}],"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":3,"thoughtsTokenCount":12,"cachedContentTokenCount":5}}"#,
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{}}}]}}],"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":4,"thoughtsTokenCount":12,"cachedContentTokenCount":5}}"#,
        ] {
            let n = x.on_message(&Message {
                event: "",
                data: data.as_bytes(),
            });
            seen.push((n, x.kinds()));
        }
        assert_eq!(
            seen,
            [
                (12, Kinds::REASONING),
                (3, Kinds::CONTENT),
                (1, Kinds::TOOL_CALL)
            ]
        );
        let s = x.summary();
        assert_eq!((s.reasoning_tokens, s.cached_read), (Some(12), Some(5)));
        assert_eq!(s.output_tokens, Some(16));
    }

    #[test]
    fn usage_in_every_chunk_gives_tokens_per_chunk() {
        let (counts, s) = run(&[
            r#"{"candidates":[{"content":{"parts":[{"text":"**Plan**","thought":true}]}}],"usageMetadata":{"promptTokenCount":34,"thoughtsTokenCount":68},"modelVersion":"gemini-2.5-pro"}"#,
            r#"{"candidates":[{"content":{"parts":[{"text":"Hi","thoughtSignature":"x"}]}}],"usageMetadata":{"promptTokenCount":34,"candidatesTokenCount":23,"thoughtsTokenCount":68}}"#,
            r#"{"candidates":[{"content":{"parts":[{"text":""}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":34,"candidatesTokenCount":24,"thoughtsTokenCount":68}}"#,
        ]);
        assert_eq!(counts, [68, 23, 0]);
        assert_eq!(s.model.as_deref(), Some("gemini-2.5-pro"));
        assert_eq!((s.input_tokens, s.output_tokens), (Some(34), Some(92)));
    }

    #[test]
    fn prompt_only_usage_is_not_an_output_report() {
        let (counts, s) = run(&[
            r#"{"candidates":[{"content":{"parts":[{"text":"The"}]}}],"usageMetadata":{"promptTokenCount":15}}"#,
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{}}}]}}],"usageMetadata":{"promptTokenCount":13,"candidatesTokenCount":8}}"#,
        ]);
        assert_eq!(counts, [1, 1]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(13), Some(8)));
    }

    #[test]
    fn json_array_without_alt_sse() {
        let (counts, s) = run(&[
            r#"[{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"candidatesTokenCount":2}},
               {"candidates":[{"content":{"parts":[{"executableCode":{"code":"1"}}]}}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":5}}]"#,
        ]);
        assert_eq!(counts, [5]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(3), Some(5)));
    }
}
