//! NVIDIA Triton Inference Server `generate_stream` (the generate extension), with the
//! TensorRT-LLM or vLLM backend.
//!
//! Each event is one response of a decoupled model: `text_output` holds the new text, one token
//! per event in streaming mode. Triton reports no usage, so tokens are counted events (a backend
//! configured to stream several tokens per response is undercounted; docs/formats.md says so).
//!
//! The stream has no end marker, so [`Summary::ended`] is never set: Triton flags a decoupled
//! model's final response outside its outputs, and the events carry no trace of that flag.
//! TensorRT-LLM's `sequence_end` is not one: it echoes the request's sequence-batching input
//! and is `false` on the last event too. Such a request leaves the in-flight gauges at the
//! body's end.

use serde::Deserialize;

use super::json::{parse, Str, Text};
use super::{Api, Extractor, Message, Summary};

/// The Triton extractor.
#[derive(Debug, Default)]
pub struct Triton {
    summary: Summary,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(default, borrow)]
    model_name: Str<'a>,
    #[serde(default)]
    text_output: Text,
}

impl Extractor for Triton {
    fn api(&self) -> Api {
        Api::Triton
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        let Some(ev) = parse::<Event<'_>>(msg.data, &mut self.summary.malformed) else {
            return 0;
        };
        self.summary.name_model(ev.model_name.0);
        u32::from(ev.text_output.0)
    }

    fn summary(&self) -> &Summary {
        &self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_per_event_with_text() {
        let mut x = Triton::default();
        let counts: Vec<u32> = [
            r#"{"model_name":"ensemble","model_version":"1","sequence_end":false,"text_output":"To"}"#,
            r#"{"model_name":"ensemble","model_version":"1","sequence_end":true,"text_output":""}"#,
            r#"{"error":"in ensemble 'ensemble', unexpected shape"}"#,
        ]
        .iter()
        .map(|d| {
            x.on_message(&Message {
                event: "",
                data: d.as_bytes(),
            })
        })
        .collect();
        assert_eq!(counts, [1, 0, 0]);
        assert_eq!(x.summary().model.as_deref(), Some("ensemble"));
        assert_eq!(x.summary().output_tokens, None);
    }
}
