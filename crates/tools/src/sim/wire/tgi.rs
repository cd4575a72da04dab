//! Hugging Face TGI's native API: `/generate_stream` sends `data:` (without a space) events, one
//! per token, the last carrying `generated_text` and `details`; `/generate` answers with one
//! JSON document. An event's `token` is one token, so a step that made several sends as many
//! events at once, as TGI streams speculative tokens.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::{flag, json_string, limit, object, BodyError, Handler, Options, Reply};
use crate::sim::text::Token;

pub(super) fn options(route: Handler, obj: &Map<String, Value>) -> Result<Options<'_>, BodyError> {
    let parameters = object(obj, "parameters");
    Ok(Options {
        stream: route == Handler::TgiGenerateStream,
        include_usage: false,
        max_tokens: match parameters {
            Some(p) => limit(p, "max_new_tokens", "parameters.max_new_tokens")?,
            None => None,
        },
        seed: parameters.and_then(|p| p.get("seed")),
        details: flag(parameters, "details").unwrap_or(false),
    })
}

pub(super) fn error(message: &str) -> Value {
    serde_json::json!({"error": message, "error_type": "validation"})
}

fn finish_reason(r: &Reply) -> &'static str {
    if r.limited {
        "length"
    } else {
        "eos_token"
    }
}

pub(super) fn token(r: &Reply, index: u32, tok: Token, text: &str, out: &mut String) {
    let _ = write!(
        out,
        "data:{{\"index\":{},\"token\":{{\"id\":{},\"text\":\"{}\",\"logprob\":-0.25,\"special\":false}},",
        index + 1,
        tok.id,
        tok.text
    );
    if r.is_last(index) {
        let _ = write!(
            out,
            "\"generated_text\":{},\"details\":{{\"finish_reason\":\"{}\",\"generated_tokens\":{},\"seed\":null,\"input_length\":{}}}}}\n\n",
            json_string(text),
            finish_reason(r),
            r.output_tokens,
            r.prompt_tokens
        );
    } else {
        out.push_str("\"generated_text\":null,\"details\":null}\n\n");
    }
}

/// `text` is already a JSON string literal.
pub(super) fn whole(r: &Reply, text: &str, out: &mut String) {
    let _ = write!(out, "{{\"generated_text\":{text}");
    if r.details {
        let _ = write!(out, ",\"details\":{{\"finish_reason\":\"{}\",\"generated_tokens\":{},\"seed\":null,\"prefill\":[],\"tokens\":[]}}", finish_reason(r), r.output_tokens);
    }
    out.push('}');
}
