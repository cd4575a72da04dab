//! Google Gemini `streamGenerateContent?alt=sse` (Google AI and Vertex AI).
//!
//! Each event is a `GenerateContentResponse`. A candidate is token-bearing when one of its parts
//! carries generated output: `text` (thought summaries included), `functionCall` or
//! `executableCode`. `usageMetadata` is cumulative and usually in every event, so its growth is
//! the exact number of tokens an event carries ([`Cumulative`]). Output counts every generated
//! token: `candidatesTokenCount + thoughtsTokenCount`. Without `alt=sse` the same responses come
//! as one JSON array, which is read the same way.
//!
//! The stream has no end marker, so [`Summary::ended`] is never set: `finishReason` belongs to
//! one candidate (with `candidateCount` > 1 each finishes on its own), and the API does not say
//! that no chunk follows it. Such a request leaves the in-flight gauges at the body's end.

use serde::Deserialize;

use super::cumulative::Cumulative;
use super::json::{parse, Count, Reason, Str, Text};
use super::{Api, Extractor, Message, Summary};

/// The Gemini extractor.
#[derive(Debug, Default)]
pub struct Gemini {
    summary: Summary,
    running: Cumulative,
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
}

impl Part {
    fn has_output(&self) -> bool {
        self.text.0 || self.function_call.0 || self.executable_code.0
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
        }
        let candidates = chunk.candidates.unwrap_or_default();
        for c in &candidates {
            self.summary.stopped(c.finish_reason);
        }
        let bearing = candidates
            .iter()
            .filter(|c| {
                c.content
                    .as_ref()
                    .and_then(|c| c.parts.as_ref())
                    .is_some_and(|parts| parts.iter().any(Part::has_output))
            })
            .count();
        self.running
            .tokens(reported, u32::try_from(bearing).unwrap_or(u32::MAX))
    }
}

impl Extractor for Gemini {
    fn api(&self) -> Api {
        Api::Gemini
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[&str]) -> (Vec<u32>, Summary) {
        crate::protocol::testing::run(&mut Gemini::default(), events.iter().map(|e| ("", *e)))
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
