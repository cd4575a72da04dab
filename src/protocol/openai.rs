//! OpenAI chat.completions and completions, as OpenAI, vLLM, SGLang, TGI and llama.cpp serve them.
//!
//! A chunk is token-bearing when one of its choices carries generated text (`delta.content`,
//! `reasoning_content`, `reasoning`, `refusal`, `tool_calls`, or legacy `text`). vLLM's `token_ids`
//! extra gives the exact number of tokens a chunk carries. `usage` is cumulative wherever it
//! appears (vLLM's `continuous_usage_stats` repeats it in every chunk): the latest one wins.

use serde::Deserialize;

use super::{Api, Extractor, Message, Summary};

/// True for the request paths this format serves.
pub fn handles_path(path: &str) -> bool {
    path.ends_with("/chat/completions") || path.ends_with("/completions")
}

/// The OpenAI extractor.
#[derive(Debug, Default)]
pub struct OpenAi {
    summary: Summary,
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    choices: Vec<Choice>,
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
    text: Option<String>,
    #[serde(default)]
    token_ids: Option<Vec<serde::de::IgnoredAny>>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<serde::de::IgnoredAny>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

fn non_empty(s: &Option<String>) -> bool {
    s.as_deref().is_some_and(|s| !s.is_empty())
}

impl Delta {
    fn has_output(&self) -> bool {
        non_empty(&self.content)
            || non_empty(&self.reasoning_content)
            || non_empty(&self.reasoning)
            || non_empty(&self.refusal)
            || self.tool_calls.as_ref().is_some_and(|t| !t.is_empty())
    }
}

impl Extractor for OpenAi {
    fn api(&self) -> Api {
        Api::OpenAi
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        if msg.data == b"[DONE]" {
            self.summary.ended = true;
            return 0;
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk<'_>>(msg.data) else {
            self.summary.malformed += 1;
            return 0;
        };
        if self.summary.model.is_none() {
            if let Some(m) = chunk.model.filter(|m| !m.is_empty()) {
                self.summary.model = Some(m.into_owned());
            }
        }
        if let Some(u) = chunk.usage {
            if u.prompt_tokens.is_some() {
                self.summary.input_tokens = u.prompt_tokens;
            }
            if u.completion_tokens.is_some() {
                self.summary.output_tokens = u.completion_tokens;
            }
        }
        let mut tokens = 0u32;
        let mut ids = 0u64;
        let mut all_have_ids = true;
        for c in &chunk.choices {
            let bearing = non_empty(&c.text)
                || c.delta.as_ref().is_some_and(Delta::has_output)
                || c.message.as_ref().is_some_and(Delta::has_output);
            match &c.token_ids {
                Some(t) => {
                    ids += t.len() as u64;
                    tokens += t.len() as u32;
                }
                None => {
                    all_have_ids = false;
                    tokens += u32::from(bearing);
                }
            }
        }
        if all_have_ids && !chunk.choices.is_empty() {
            *self.summary.token_id_tokens.get_or_insert(0) += ids;
        }
        tokens
    }

    fn summary(&self) -> &Summary {
        &self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[&str]) -> (Vec<u32>, Summary) {
        let mut x = OpenAi::default();
        let counts = events
            .iter()
            .map(|e| {
                x.on_message(&Message {
                    event: "",
                    data: e.as_bytes(),
                })
            })
            .collect();
        (counts, x.summary().clone())
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
        assert_eq!(s.model.as_deref(), Some("m"));
        assert_eq!((s.input_tokens, s.output_tokens), (Some(5), Some(2)));
        assert_eq!(s.malformed, 0);
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
        ]);
        assert_eq!(counts, [2, 1]);
        assert_eq!(s.token_id_tokens, Some(3));
    }
}
