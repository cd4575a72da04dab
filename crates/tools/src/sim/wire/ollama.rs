//! Ollama's native API (`/api/chat`, `/api/generate`): NDJSON, one line per step (with every
//! token the step made) with
//! `created_at`, and a final `done: true` line with `eval_count` and durations in nanoseconds.
//! Ollama streams unless the request says `"stream": false`.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::{flag, limit, object, BodyError, Handler, Options, Reply, Timings};
use crate::sim::text::Token;

pub(super) fn options(obj: &Map<String, Value>) -> Result<Options<'_>, BodyError> {
    let options = object(obj, "options");
    // A negative num_predict means "no limit".
    let max_tokens = match options.and_then(|o| o.get("num_predict")) {
        Some(v) if v.as_i64().is_some_and(|n| n < 0) => None,
        _ => match options {
            Some(o) => limit(o, "num_predict", "options.num_predict")?,
            None => None,
        },
    };
    Ok(Options {
        stream: flag(Some(obj), "stream").unwrap_or(true),
        include_usage: false,
        max_tokens,
        seed: options.and_then(|o| o.get("seed")),
        details: false,
    })
}

pub(super) fn error(message: &str) -> Value {
    serde_json::json!({ "error": message })
}

fn done_reason(r: &Reply) -> &'static str {
    if r.limited {
        "length"
    } else {
        "stop"
    }
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` for a time since the Unix epoch (UTC), as Ollama writes
/// `created_at`.
pub(super) fn rfc3339(t: Duration) -> String {
    let secs = t.as_secs();
    let rem = secs % 86_400;
    let (year, month, day) = tokenmeter::units::civil_from_days((secs / 86_400) as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        t.subsec_micros()
    )
}

fn line_start(r: &Reply, out: &mut String) {
    let _ = write!(
        out,
        "{{\"model\":{},\"created_at\":\"{}\",",
        r.model,
        rfc3339(unix_now())
    );
}

fn done(r: &Reply, t: &Timings, out: &mut String) {
    let _ = write!(
        out,
        "\"done_reason\":\"{}\",\"done\":true,\"total_duration\":{},\"load_duration\":0,\"prompt_eval_count\":{},\"prompt_eval_duration\":{},\"eval_count\":{},\"eval_duration\":{}",
        done_reason(r),
        (t.prefill + t.decode).as_nanos(),
        r.prompt_tokens,
        t.prefill.as_nanos(),
        r.output_tokens,
        t.decode.as_nanos()
    );
}

pub(super) fn event(r: &Reply, tokens: &[Token], out: &mut String) {
    line_start(r, out);
    if r.route == Handler::OllamaChat {
        out.push_str("\"message\":{\"role\":\"assistant\",\"content\":\"");
    } else {
        out.push_str("\"response\":\"");
    }
    tokens.iter().for_each(|t| out.push_str(t.text));
    if r.route == Handler::OllamaChat {
        out.push('"');
        out.push('}');
    } else {
        out.push('"');
    }
    out.push_str(",\"done\":false}\n");
}

pub(super) fn tail(r: &Reply, t: &Timings, out: &mut String) {
    line_start(r, out);
    if r.route == Handler::OllamaChat {
        out.push_str("\"message\":{\"role\":\"assistant\",\"content\":\"\"},");
    } else {
        out.push_str("\"response\":\"\",");
    }
    done(r, t, out);
    out.push_str("}\n");
}

/// `text` is already a JSON string literal.
pub(super) fn whole(r: &Reply, text: &str, t: &Timings, out: &mut String) {
    line_start(r, out);
    if r.route == Handler::OllamaChat {
        let _ = write!(
            out,
            "\"message\":{{\"role\":\"assistant\",\"content\":{text}}},"
        );
    } else {
        let _ = write!(out, "\"response\":{text},");
    }
    done(r, t, out);
    out.push('}');
}
