//! What a request body says about the response to expect: model, streaming, usage requested.
//!
//! The proxy reads request bodies up to `--max-request-body` before forwarding (an inference
//! server cannot start before it has the whole body anyway), so this runs on complete JSON.

use serde::Deserialize;

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
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Reads a request body; anything that is not a JSON object gives the default.
pub fn inspect(body: &[u8]) -> RequestInfo {
    match serde_json::from_slice::<Body>(body) {
        Ok(b) => RequestInfo {
            model: b.model.filter(|m| !m.is_empty()),
            stream: b.stream.unwrap_or(false),
            include_usage: b
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            usage_injected: false,
        },
        Err(_) => RequestInfo::default(),
    }
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
            }
        );
        assert_eq!(inspect(b"\xff\x00"), RequestInfo::default());
    }
}
