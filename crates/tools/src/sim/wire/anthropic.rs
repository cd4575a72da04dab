//! Anthropic's Messages API (`/v1/messages`): `message_start`, `content_block_start`, `ping`,
//! one `content_block_delta` per step (with every token the step made), `content_block_stop`, `message_delta` with the output
//! count, `message_stop`. With the prefix cache on, the usage splits the prompt as Anthropic's
//! does: `input_tokens` the uncached part, `cache_read_input_tokens` the cached one.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::{flag, limit, BodyError, Options, Reply};
use crate::sim::text::Token;

pub(super) fn options(obj: &Map<String, Value>) -> Result<Options<'_>, BodyError> {
    Ok(Options {
        stream: flag(Some(obj), "stream").unwrap_or(false),
        include_usage: false,
        max_tokens: limit(obj, "max_tokens", "max_tokens")?,
        seed: obj.get("seed"),
        details: false,
    })
}

pub(super) fn error(message: &str) -> Value {
    serde_json::json!({
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    })
}

fn stop_reason(r: &Reply) -> &'static str {
    if r.limited {
        "max_tokens"
    } else {
        "end_turn"
    }
}

/// The usage's prompt fields (without braces).
fn input_usage(r: &Reply) -> String {
    match r.cached_tokens {
        None => format!("\"input_tokens\":{}", r.prompt_tokens),
        Some(c) => format!(
            "\"input_tokens\":{},\"cache_read_input_tokens\":{c}",
            r.prompt_tokens.saturating_sub(c)
        ),
    }
}

pub(super) fn head(r: &Reply, out: &mut String) {
    let _ = write!(
        out,
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_sim_{:016}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{},\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{{},\"output_tokens\":1}}}}}}\n\n",
        r.id, r.model, input_usage(r)
    );
    out.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    out.push_str("event: ping\ndata: {\"type\": \"ping\"}\n\n");
}

pub(super) fn event(tokens: &[Token], out: &mut String) {
    out.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"");
    tokens.iter().for_each(|t| out.push_str(t.text));
    out.push_str("\"}}\n\n");
}

pub(super) fn tail(r: &Reply, out: &mut String) {
    out.push_str(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    );
    let _ = write!(out, "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{}}}}}\n\n", stop_reason(r), r.output_tokens);
    out.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
}

/// `text` is already a JSON string literal.
pub(super) fn whole(r: &Reply, text: &str, out: &mut String) {
    let _ = write!(out, "{{\"id\":\"msg_sim_{:016}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{},\"content\":[{{\"type\":\"text\",\"text\":{text}}}],\"stop_reason\":\"{}\",\"stop_sequence\":null,\"usage\":{{{},\"output_tokens\":{}}}}}", r.id, r.model, stop_reason(r), input_usage(r), r.output_tokens);
}
