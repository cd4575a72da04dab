//! The text an OpenAI-compatible event streamed, for a tokenizer to count (`--tokenizer`).
//!
//! The extractor ([`super::openai`]) reads only whether a choice carries output, never its text,
//! so that the path every token takes allocates nothing. A tokenizer needs the text itself: this
//! reads it in a second pass over the same event, only for requests a tokenizer counts. What is
//! read is what the model wrote: `content`, `reasoning_content` (and `reasoning`), `refusal`,
//! a completion's `text`, and a tool call's `arguments`, of every choice, in order. A tool call's
//! name and the markup the server parsed it from are not on the wire, so tool calls are counted
//! short; the usage report, where it comes, is the count that stands.

use std::borrow::Cow;

use serde::Deserialize;

#[derive(Deserialize)]
struct Chunk<'a> {
    // `Option`: a `null` (some servers send `"tool_calls": null` in every delta) is none.
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(default, borrow)]
    function: Option<Function<'a>>,
}

#[derive(Deserialize)]
struct Function<'a> {
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

/// Appends the text the chunk `data` carries to `out`; returns false when `data` is no chunk
/// of this shape (nothing is appended then).
pub fn openai(data: &[u8], out: &mut String) -> bool {
    let Ok(chunk) = serde_json::from_slice::<Chunk<'_>>(data) else {
        return false;
    };
    for choice in chunk.choices.into_iter().flatten() {
        if let Some(t) = choice.text {
            out.push_str(&t);
        }
        let Some(d) = choice.delta else { continue };
        // vLLM sends reasoning as `reasoning_content` or `reasoning`, never both with text.
        for t in [d.reasoning_content.or(d.reasoning), d.content, d.refusal]
            .into_iter()
            .flatten()
        {
            out.push_str(&t);
        }
        for call in d.tool_calls.into_iter().flatten() {
            if let Some(a) = call.function.and_then(|f| f.arguments) {
                out.push_str(&a);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(data: &str) -> (bool, String) {
        let mut out = String::new();
        let ok = openai(data.as_bytes(), &mut out);
        (ok, out)
    }

    #[test]
    fn reads_what_the_model_wrote_in_every_shape() {
        assert_eq!(
            text(r#"{"choices":[{"index":0,"delta":{"content":"Hi \"you\"\n"}}]}"#),
            (true, "Hi \"you\"\n".into())
        );
        assert_eq!(
            text(r#"{"choices":[{"index":0,"text":" 175","logprobs":null}]}"#),
            (true, " 175".into())
        );
        assert_eq!(
            text(r#"{"choices":[{"delta":{"reasoning_content":"think","content":null}}]}"#),
            (true, "think".into())
        );
        assert_eq!(
            text(
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]}}]}"#
            ),
            (true, "{\"a\":".into())
        );
        assert_eq!(
            text(r#"{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}"#),
            (true, "ab".into())
        );
        // SGLang's deltas name every field, the absent ones `null`.
        assert_eq!(
            text(
                r#"{"choices":[{"delta":{"role":null,"content":"c","reasoning_content":null,"tool_calls":null}}]}"#
            ),
            (true, "c".into())
        );
        // Escapes decode, including a lone replacement character a byte tokenizer streams.
        assert_eq!(
            text(r#"{"choices":[{"delta":{"content":"\u00e9\ufffd"}}]}"#),
            (true, "é\u{fffd}".into())
        );
    }

    #[test]
    fn anything_else_appends_nothing() {
        for data in ["[DONE]", "{", r#"{"choices":"x"}"#, "\u{0}"] {
            assert_eq!(text(data), (false, String::new()), "{data:?}");
        }
        assert_eq!(text(r#"{"choices":[]}"#), (true, String::new()));
    }
}
