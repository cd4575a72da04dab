//! OpenAI chat.completions and completions, as OpenAI, vLLM, SGLang, TGI, llama.cpp and most
//! hosted APIs (Groq, Mistral, DeepSeek, Together, OpenRouter, ...) serve them.
//!
//! A chunk is token-bearing when one of its choices carries generated output: `delta.content`,
//! `reasoning_content`, `reasoning`, `refusal`, `tool_calls`, `function_call`, or legacy `text`
//! (`message` instead of `delta` in a non-streaming response). With `n > 1` each choice's output
//! counts once. How many tokens a chunk carries, best first:
//! - vLLM's `token_ids` (`return_token_ids`): their number, exactly;
//! - `usage` repeated in every chunk (vLLM's `continuous_usage_stats`): its growth
//!   ([`Cumulative`]);
//! - otherwise one per choice with output.
//!
//! `usage` is cumulative wherever it appears: the latest one wins (Groq puts it in `x_groq`).
//! Output tokens are `completion_tokens`, unless `total_tokens - prompt_tokens` is larger: xAI
//! leaves reasoning tokens out of `completion_tokens` but not out of the total, and output
//! counts every token the model generated.
//!
//! Kinds: `reasoning_content` and `reasoning` are reasoning, `tool_calls` and `function_call`
//! a tool call, the rest (`content`, `refusal`, `text`) content. A role-only first chunk
//! (`"content":""`) carries nothing. Usage's `completion_tokens_details.reasoning_tokens` is the
//! reasoning count and `prompt_tokens_details.cached_tokens` the cached prompt tokens read
//! (OpenAI, vLLM with `--enable-prompt-tokens-details`, SGLang).
//!
//! Engines that state where a request's time went put it on the final chunk: vLLM's `metrics`
//! object, llama.cpp's `timings` ([`super::timings`]).
//!
//! The stream ends with `data: [DONE]` ([`Summary::ended`]); a stream without it (some hosts
//! leave it out) never says it has ended.

use std::fmt;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::cumulative::Cumulative;
use super::json::{parse, Count, Len, Reason, Str, Text};
use super::timings::{LlamacppTimings, VllmMetrics};
use super::{is_done, Api, Extractor, Kinds, Message, OutputKind, Summary};

/// The OpenAI extractor.
#[derive(Debug, Default)]
pub struct OpenAi {
    summary: Summary,
    running: Cumulative,
    kinds: Kinds,
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    model: Str<'a>,
    #[serde(default)]
    choices: Option<Choices>,
    #[serde(default)]
    usage: Option<Usage>,
    /// Groq reports usage here instead.
    #[serde(default)]
    x_groq: Option<XGroq>,
    /// vLLM's per-request timings (`--enable-per-request-metrics`), on the usage chunk.
    #[serde(default)]
    metrics: Option<VllmMetrics>,
    /// llama.cpp's timings, on its final chunk.
    #[serde(default)]
    timings: Option<LlamacppTimings>,
}

/// A chunk's choices, folded as they are parsed: a `Vec` of them was one heap allocation per
/// chunk, on the path every token takes (tests/alloc.rs counts them).
#[derive(Default)]
struct Choices {
    len: usize,
    /// Choices that carry output.
    bearing: u32,
    /// Token ids over all choices.
    ids: u64,
    /// Every choice has `token_ids` (and there is at least one).
    all_have_ids: bool,
    /// The kinds of output over all choices.
    kinds: Kinds,
    /// The last finish reason a choice gave.
    stop: Reason,
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fold;
        impl<'de> Visitor<'de> for Fold {
            type Value = Choices;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of choices")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Choices, A::Error> {
                let mut c = Choices {
                    all_have_ids: true,
                    ..Choices::default()
                };
                while let Some(choice) = seq.next_element::<Choice>()? {
                    c.len += 1;
                    if choice.finish_reason.0.is_some() {
                        c.stop = choice.finish_reason;
                    }
                    let kinds = choice.kinds();
                    c.kinds = c.kinds.union(kinds);
                    c.bearing += u32::from(!kinds.is_empty());
                    match choice.token_ids {
                        Some(Len(n)) => c.ids += n,
                        None => c.all_have_ids = false,
                    }
                }
                c.all_have_ids &= c.len > 0;
                Ok(c)
            }
        }
        d.deserialize_seq(Fold)
    }
}

#[derive(Deserialize)]
struct XGroq {
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    /// Non-streaming chat responses carry `message` instead of `delta`.
    #[serde(default)]
    message: Option<Delta>,
    #[serde(default)]
    text: Text,
    /// vLLM's `return_token_ids`: the ids of the tokens this chunk carries.
    #[serde(default)]
    token_ids: Option<Len>,
    #[serde(default)]
    finish_reason: Reason,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Text,
    #[serde(default)]
    reasoning_content: Text,
    #[serde(default)]
    reasoning: Text,
    #[serde(default)]
    refusal: Text,
    #[serde(default)]
    tool_calls: Text,
    #[serde(default)]
    function_call: Text,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Count,
    #[serde(default)]
    completion_tokens: Count,
    #[serde(default)]
    total_tokens: Count,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Count,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Count,
}

impl Choice {
    /// The kinds of output this choice carries (legacy `text` is content).
    fn kinds(&self) -> Kinds {
        Kinds::NONE
            .with(OutputKind::Content, self.text.0)
            .union(self.delta.as_ref().map_or(Kinds::NONE, Delta::kinds))
            .union(self.message.as_ref().map_or(Kinds::NONE, Delta::kinds))
    }
}

impl Delta {
    fn kinds(&self) -> Kinds {
        Kinds::NONE
            .with(
                OutputKind::Reasoning,
                self.reasoning_content.0 || self.reasoning.0,
            )
            .with(OutputKind::Content, self.content.0 || self.refusal.0)
            .with(
                OutputKind::ToolCall,
                self.tool_calls.0 || self.function_call.0,
            )
    }
}

impl Usage {
    /// Every generated token, reasoning included (see the module doc).
    fn output(&self) -> Option<u64> {
        let completion = self.completion_tokens.0?;
        let beyond_prompt = match (self.total_tokens.0, self.prompt_tokens.0) {
            (Some(t), Some(p)) => t.saturating_sub(p),
            _ => 0,
        };
        Some(completion.max(beyond_prompt))
    }
}

impl Extractor for OpenAi {
    fn api(&self) -> Api {
        Api::OpenAi
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        if is_done(msg) {
            self.summary.ended = true;
            return 0;
        }
        let Some(chunk) = parse::<Chunk<'_>>(msg.data, &mut self.summary.malformed) else {
            return 0;
        };
        self.summary.name_model(chunk.model.0);
        let engine = chunk.metrics.as_ref().and_then(VllmMetrics::timings);
        if let Some(t) = engine.or(chunk.timings.as_ref().and_then(LlamacppTimings::timings)) {
            self.summary.engine = Some(t);
        }
        let usage = chunk.usage.or(chunk.x_groq.and_then(|x| x.usage));
        let mut reported = None;
        if let Some(u) = usage {
            if u.prompt_tokens.0.is_some() {
                self.summary.input_tokens = u.prompt_tokens.0;
            }
            reported = u.output();
            if reported.is_some() {
                self.summary.output_tokens = reported;
            }
            if let Some(r) = u
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens.0)
            {
                self.summary.reasoning_tokens = Some(r);
            }
            if let Some(c) = u.prompt_tokens_details.and_then(|d| d.cached_tokens.0) {
                self.summary.cached_read = Some(c);
            }
        }
        // llama.cpp states its cache hits in `timings` where its usage has no details.
        if let Some(c) = chunk.timings.as_ref().and_then(|t| t.cached(None)) {
            self.summary.cached_read.get_or_insert(c);
        }
        let Choices {
            bearing,
            ids,
            all_have_ids,
            kinds,
            stop,
            ..
        } = chunk.choices.unwrap_or_default();
        self.kinds = kinds;
        self.summary.stopped(stop);
        if all_have_ids {
            *self.summary.token_id_tokens.get_or_insert(0) += ids;
            // The ids are exact; keep the running total in step for the chunks that follow.
            self.running.tokens(reported, u32::from(ids > 0));
            return u32::try_from(ids).unwrap_or(u32::MAX);
        }
        self.running.tokens(reported, bearing)
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
        crate::protocol::testing::run(&mut OpenAi::default(), events.iter().map(|e| ("", *e)))
    }

    #[test]
    fn chat_chunks_usage_and_done() {
        let (counts, s) = run(&[
            r#"{"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"model":"m","choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
            r#"{"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}"#,
            r#"{"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#,
            "[DONE]",
        ]);
        assert_eq!(counts, [0, 1, 1, 0, 0, 0]);
        assert!(s.ended);
        assert_eq!(s.stop, Some(super::super::Stop::Stop));
        let (_, cut) =
            run(&[r#"{"choices":[{"delta":{"content":"a"},"finish_reason":"length"}]}"#]);
        assert_eq!(cut.stop, Some(super::super::Stop::Length));
        assert_eq!(s.model.as_deref(), Some("m"));
        assert_eq!((s.input_tokens, s.output_tokens), (Some(5), Some(2)));
        assert_eq!(s.malformed, 0);
    }

    /// Feeds data-only messages; returns the kinds of each token-bearing one, and the summary.
    fn kinds(events: &[&str]) -> (Vec<Kinds>, Summary) {
        let events = events.iter().map(|d| ("", *d));
        crate::protocol::testing::kinds(&mut OpenAi::default(), events)
    }

    #[test]
    fn kinds_reasoning_and_cached_usage() {
        let (k, s) = kinds(&[
            // Role-only first chunk: no token, no kind.
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"so"}}]}"#,
            r#"{"choices":[{"delta":{"content":"Hi"}}]}"#,
            r#"{"choices":[{"delta":{"refusal":"no"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
            r#"{"choices":[{"text":"legacy"}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"a","content":"b"}}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":1920},"completion_tokens_details":{"reasoning_tokens":192}}}"#,
        ]);
        let both = Kinds::REASONING.union(Kinds::CONTENT);
        assert_eq!(
            k,
            [
                Kinds::REASONING,
                Kinds::REASONING,
                Kinds::CONTENT,
                Kinds::CONTENT,
                Kinds::TOOL_CALL,
                Kinds::CONTENT,
                both
            ]
        );
        assert_eq!(s.reasoning_tokens, Some(192));
        assert_eq!((s.cached_read, s.cached_write), (Some(1920), None));
        assert_eq!(s.input_tokens, Some(2006));
    }

    #[test]
    fn broken_json_is_counted_not_fatal() {
        let (counts, s) = run(&["{not json", r#"{"choices":[{"text":"a"}]}"#]);
        assert_eq!(counts, [0, 1]);
        assert_eq!(s.malformed, 1);
    }

    #[test]
    fn vllm_token_ids_give_exact_counts() {
        let (counts, s) = run(&[
            r#"{"choices":[{"delta":{"content":"ab"},"token_ids":[1,2]}]}"#,
            r#"{"choices":[{"delta":{"content":""},"token_ids":[3]}]}"#,
            r#"{"choices":[{"delta":{"content":"x"},"token_ids":null}]}"#,
        ]);
        assert_eq!(counts, [2, 1, 1]);
        assert_eq!(s.token_id_tokens, Some(3));
    }

    #[test]
    fn continuous_usage_gives_tokens_per_chunk() {
        let (counts, s) = run(&[
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":4,"completion_tokens":0}}"#,
            r#"{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":4,"completion_tokens":1}}"#,
            r#"{"choices":[{"delta":{"content":"bcd"}}],"usage":{"prompt_tokens":4,"completion_tokens":4}}"#,
            r#"{"choices":[{"delta":{"content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":5}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":5}}"#,
        ]);
        assert_eq!(counts, [0, 1, 3, 0, 0]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(4), Some(5)));
    }

    #[test]
    fn n_choices_tool_calls_and_odd_shapes() {
        let (counts, s) = run(&[
            r#"{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
            // Mistral's thinking arrives as an array of parts.
            r#"{"choices":[{"delta":{"content":[{"type":"thinking","thinking":[{"text":"x"}]}]}}]}"#,
            r#"{"choices":[{"delta":{"content":null,"tool_calls":null}}],"usage":null}"#,
            r#"{"choices":null,"x_groq":{"usage":{"prompt_tokens":3,"completion_tokens":4.0}}}"#,
        ]);
        assert_eq!(counts, [2, 1, 1, 0, 0]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(3), Some(4)));
        assert_eq!(s.malformed, 0);
    }

    #[test]
    fn reasoning_left_out_of_completion_tokens_is_counted() {
        // xAI: completion_tokens excludes the 290 reasoning tokens; the total does not.
        let (_, s) = run(&[
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":303,"completion_tokens_details":{"reasoning_tokens":290}}}"#,
        ]);
        assert_eq!(s.output_tokens, Some(291));
    }

    #[test]
    fn non_streaming_message() {
        let (counts, s) = run(&[
            r#"{"model":"m","choices":[{"message":{"role":"assistant","content":"Hi there"}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#,
        ]);
        // The only token-bearing message, with the whole usage: it carries every token.
        assert_eq!(counts, [2]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(3), Some(2)));
    }
}
