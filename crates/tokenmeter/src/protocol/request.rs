//! What a request body says about the response to expect: model, streaming, usage requested.
//!
//! The proxy reads request bodies up to `--max-request-body` before forwarding (an inference
//! server cannot start before it has the whole body anyway), so this runs on complete JSON. The
//! body is parsed once: [`read`] also notes where `stream_options` is ([`Layout`]), which is all
//! `--inject-usage`'s rewrite needs to write into it without parsing it again.

use std::ops::Range;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// The fields of an inference request that matter to the meter.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// The `model` the client asked for.
    pub model: Option<String>,
    /// `"stream": true`.
    pub stream: bool,
    /// `"stream_options": {"include_usage": true}`.
    pub include_usage: bool,
    /// `--inject-usage` asked for usage on the client's behalf: the usage-only chunk of the
    /// response is ours to remove.
    pub usage_injected: bool,
    /// The body's length as sent, when it was read whole (0 otherwise): the GPU-time split's
    /// first measure of the prompt (`crate::cost::estimate`).
    pub body_bytes: u64,
}

/// Where a streaming request's members are, for a rewrite that changes no other byte.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Where the opening brace of the body's object is, when the body is a JSON object with
    /// `"stream": true`; `None` for any other body (nothing to rewrite).
    pub open: Option<usize>,
    /// Where the value of `stream_options` is (`null` too), when the body has one.
    pub stream_options: Option<Range<usize>>,
}

/// The members read, `stream_options` as its raw bytes.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    /// Raw, so that where it is is known; `Some` for `null` too (see [`present`]).
    #[serde(default, borrow, deserialize_with = "present")]
    stream_options: Option<&'a RawValue>,
}

/// [`Body`] with `stream_options` read in place, for a body that is not all UTF-8: serde_json
/// checks UTF-8 in a value it holds raw, not in one it skips, and such a body is never written.
#[derive(Deserialize)]
struct Plain {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

/// A member that is there, whatever its value: `null` is `Some`, only a missing one is `None`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Reads a request body; anything that is not a JSON object gives the default.
pub fn inspect(body: &[u8]) -> RequestInfo {
    read(body).0
}

/// Reads a request body once: what the meter needs, and where its members are. Anything that
/// is not a JSON object gives the defaults.
pub fn read(body: &[u8]) -> (RequestInfo, Layout) {
    let Ok(text) = std::str::from_utf8(body) else {
        return match serde_json::from_slice::<Plain>(body) {
            Ok(p) => (info(p.model, p.stream, p.stream_options), Layout::default()),
            Err(_) => Default::default(),
        };
    };
    // Checked once above: reading from the text skips serde_json's own UTF-8 checks.
    let Ok(b) = serde_json::from_str::<Body<'_>>(text) else {
        return Default::default();
    };
    let options = match b.stream_options {
        Some(raw) => match serde_json::from_str::<Option<StreamOptions>>(raw.get()) {
            Ok(options) => options,
            Err(_) => return Default::default(),
        },
        None => None,
    };
    let info = info(b.model, b.stream, options);
    // A struct also reads from an array: only an object's members can be written to.
    let open = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .filter(|&i| info.stream && body[i] == b'{');
    let stream_options = match b.stream_options {
        Some(raw) => match span(body, raw.get()) {
            Some(span) => Some(span),
            // Not where it should be: a body whose member cannot be found is not written.
            None => return (info, Layout::default()),
        },
        None => None,
    };
    (
        info,
        Layout {
            open,
            stream_options,
        },
    )
}

/// What the meter takes from the members read.
fn info(
    model: Option<String>,
    stream: Option<bool>,
    options: Option<StreamOptions>,
) -> RequestInfo {
    RequestInfo {
        model: model.filter(|m| !m.is_empty()),
        stream: stream.unwrap_or(false),
        include_usage: options.and_then(|o| o.include_usage).unwrap_or(false),
        usage_injected: false,
        body_bytes: 0,
    }
}

/// Where `part`, a slice of `body`, is in it.
fn span(body: &[u8], part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let range = start..start + part.len();
    (body.get(range.clone())? == part.as_bytes()).then_some(range)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_model_stream_and_usage() {
        let info = inspect(
            br#"{"model":"llama","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
        );
        assert_eq!(
            info,
            RequestInfo {
                model: Some("llama".into()),
                stream: true,
                include_usage: true,
                usage_injected: false,
                body_bytes: 0,
            }
        );
        assert_eq!(inspect(b"\xff\x00"), RequestInfo::default());
    }

    #[test]
    fn notes_where_stream_options_goes_in_a_streaming_object() {
        let layout = |body: &str| read(body.as_bytes()).1;
        assert_eq!(
            layout(r#" {"stream":true,"stream_options": null}"#),
            Layout {
                open: Some(1),
                stream_options: Some(34..38),
            }
        );
        assert_eq!(
            layout(r#"{"stream":true}"#),
            Layout {
                open: Some(0),
                stream_options: None,
            }
        );
        for body in [
            r#"{"stream":false}"#,
            r#"[null,true,{}]"#,
            r#"{"stream":true,"stream":true}"#,
        ] {
            assert_eq!(layout(body).open, None, "{body}");
        }
        // Not all UTF-8: read as ever, never written.
        let (info, layout) = read(b"{\"stream\":true,\"x\":\"\xff\"}");
        assert!(info.stream);
        assert_eq!(layout, Layout::default());
    }
}
