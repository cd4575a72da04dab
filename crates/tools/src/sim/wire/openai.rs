//! OpenAI chat and completions (`/v1/chat/completions`, `/v1/completions`), as vLLM streams
//! them: a role chunk first (written with the first token, after prefill), `finish_reason` on
//! the last token's chunk, a `choices: []` usage chunk when `stream_options.include_usage` is
//! set (with vLLM's per-request `metrics` object under `--enable-per-request-metrics`), then
//! `data: [DONE]`. The other chunks carry no `"usage": null` whether usage is asked for or not,
//! as vLLM's chat stream writes them (OpenAI's own API adds it to every chunk when asked), so
//! asking for usage adds the usage chunk and changes nothing else. With the prefix cache on, the
//! usage states its share as `prompt_tokens_details.cached_tokens`, as vLLM does. A chunk carries
//! the text of every token its step made (several under `--tokens-per-event` or speculative
//! decoding, as vLLM sends them).

use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::{flag, limit, object, BodyError, Handler, Options, Reply, Timings};
use crate::sim::text::Token;

pub(super) fn options(route: Handler, obj: &Map<String, Value>) -> Result<Options<'_>, BodyError> {
    let max_tokens = match route {
        // The newer name wins over the deprecated one.
        Handler::Chat => match limit(obj, "max_completion_tokens", "max_completion_tokens")? {
            Some(n) => Some(n),
            None => limit(obj, "max_tokens", "max_tokens")?,
        },
        _ => limit(obj, "max_tokens", "max_tokens")?,
    };
    Ok(Options {
        stream: flag(Some(obj), "stream").unwrap_or(false),
        include_usage: flag(object(obj, "stream_options"), "include_usage").unwrap_or(false),
        max_tokens,
        seed: obj.get("seed"),
        details: false,
    })
}

pub(super) fn error(status: u16, message: &str) -> Value {
    serde_json::json!({
        "error": {"message": message, "type": "invalid_request_error", "code": status},
    })
}

fn finish_reason(r: &Reply) -> &'static str {
    if r.limited {
        "length"
    } else {
        "stop"
    }
}

fn prefix(r: &Reply, out: &mut String) {
    let (prefix, object) = match r.route {
        Handler::Completions => ("cmpl", "text_completion"),
        _ => ("chatcmpl", "chat.completion.chunk"),
    };
    let _ = write!(
        out,
        "data: {{\"id\":\"{prefix}-sim-{}\",\"object\":\"{object}\",\"created\":{},\"model\":{},",
        r.id, r.created, r.model
    );
}

fn usage_json(r: &Reply) -> String {
    let details = r.cached_tokens.map_or(String::new(), |c| {
        format!(",\"prompt_tokens_details\":{{\"cached_tokens\":{c}}}")
    });
    format!(
        "{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}{details}}}",
        r.prompt_tokens,
        r.output_tokens,
        u64::from(r.prompt_tokens) + u64::from(r.output_tokens)
    )
}

pub(super) fn head(r: &Reply, out: &mut String) {
    if r.route != Handler::Chat {
        return;
    }
    prefix(r, out);
    out.push_str("\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]");
    out.push_str("}\n\n");
}

pub(super) fn event(r: &Reply, index: u32, tokens: &[Token], out: &mut String) {
    prefix(r, out);
    let last = index + tokens.len() as u32 - 1;
    if r.route == Handler::Chat {
        out.push_str("\"choices\":[{\"index\":0,\"delta\":{\"content\":\"");
    } else {
        out.push_str("\"choices\":[{\"index\":0,\"text\":\"");
    }
    tokens.iter().for_each(|t| out.push_str(t.text));
    out.push('"');
    if r.route == Handler::Chat {
        out.push('}');
    }
    out.push_str(",\"logprobs\":null,\"finish_reason\":");
    if r.is_last(last) {
        let _ = write!(out, "\"{}\"}}]", finish_reason(r));
    } else {
        out.push_str("null}]");
    }
    out.push_str("}\n\n");
}

/// vLLM's per-request `metrics` object: milliseconds, as vLLM 0.32 writes them, and under
/// speculative decoding (once a draft was made) its `speculative_decoding` object.
fn metrics_json(t: &Timings) -> String {
    let ms = |d: Option<std::time::Duration>| d.unwrap_or_default().as_secs_f64() * 1e3;
    let spec = t.spec.and_then(|s| {
        Some(format!(
            ",\"speculative_decoding\":{{\"draft_acceptance_rate\":{},\"mean_acceptance_length\":{},\"num_drafts\":{}}}",
            s.acceptance_rate()?,
            s.mean_acceptance_length()?,
            s.drafts
        ))
    });
    format!(
        ",\"metrics\":{{\"time_to_first_token_ms\":{},\"generation_time_ms\":{},\"queue_time_ms\":{}{}}}",
        ms(t.engine_prefill),
        ms(Some(t.decode)),
        ms(t.engine_queue),
        spec.unwrap_or_default()
    )
}

pub(super) fn tail(r: &Reply, t: &Timings, out: &mut String) {
    if r.include_usage {
        prefix(r, out);
        let _ = write!(out, "\"choices\":[],\"usage\":{}", usage_json(r));
        if r.per_request_metrics {
            out.push_str(&metrics_json(t));
        }
        out.push_str("}\n\n");
    }
    out.push_str("data: [DONE]\n\n");
}

/// `text` is already a JSON string literal.
pub(super) fn whole(r: &Reply, text: &str, out: &mut String) {
    if r.route == Handler::Chat {
        let _ = write!(out, "{{\"id\":\"chatcmpl-sim-{}\",\"object\":\"chat.completion\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":{text}}},\"logprobs\":null,\"finish_reason\":\"{}\"}}],\"usage\":{}}}", r.id, r.created, r.model, finish_reason(r), usage_json(r));
    } else {
        let _ = write!(out, "{{\"id\":\"cmpl-sim-{}\",\"object\":\"text_completion\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,\"text\":{text},\"logprobs\":null,\"finish_reason\":\"{}\"}}],\"usage\":{}}}", r.id, r.created, r.model, finish_reason(r), usage_json(r));
    }
}
