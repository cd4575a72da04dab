//! HuggingFace text-generation-inference native `/generate_stream` (and `/generate`).
//!
//! Every stream event carries exactly one generated token (`token.id`, special tokens included),
//! so counting token ids is exact even without usage. The last event adds `generated_text` and
//! `details`, whose `generated_tokens` is the usage report, and, on newer servers, the prompt's
//! `input_length`; earlier events have both `null`. Either one given marks that last event, which
//! ends the stream ([`Summary::ended`]): `generated_text` may be empty, and `details` is `null`
//! unless the request asked for it. A non-streaming `/generate` answer is one object (or a
//! one-element array, as the HuggingFace Inference API sends it) with the same `details`.

use serde::Deserialize;

use super::json::{parse, Count, Reason, Text};
use super::{Api, Extractor, Message, Summary};

/// The TGI extractor.
#[derive(Debug, Default)]
pub struct Tgi {
    summary: Summary,
}

#[derive(Deserialize)]
struct Event {
    /// The token this event carries: an object with its `id`.
    #[serde(default)]
    token: Option<Token>,
    /// `None` while it is `null`: until the last event.
    #[serde(default)]
    generated_text: Option<Text>,
    #[serde(default)]
    details: Option<Details>,
}

#[derive(Deserialize)]
struct Token {
    #[serde(default)]
    id: Count,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    generated_tokens: Count,
    #[serde(default)]
    input_length: Count,
    #[serde(default)]
    finish_reason: Reason,
}

impl Tgi {
    fn on_event(&mut self, ev: Event) -> u32 {
        if ev.generated_text.is_some() || ev.details.is_some() {
            self.summary.ended = true;
        }
        if let Some(d) = ev.details {
            self.summary.stopped(d.finish_reason);
            if d.generated_tokens.0.is_some() {
                self.summary.output_tokens = d.generated_tokens.0;
            }
            if d.input_length.0.is_some() {
                self.summary.input_tokens = d.input_length.0;
            }
        }
        match ev.token {
            Some(Token { id: Count(Some(_)) }) => {
                *self.summary.token_id_tokens.get_or_insert(0) += 1;
                1
            }
            // A non-streaming answer: the whole text at once.
            _ => u32::from(ev.generated_text.is_some_and(|t| t.0)),
        }
    }
}

impl Extractor for Tgi {
    fn api(&self) -> Api {
        Api::Tgi
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        if msg.data.trim_ascii_start().starts_with(b"[") {
            let Some(events) = parse::<Vec<Event>>(msg.data, &mut self.summary.malformed) else {
                return 0;
            };
            return events
                .into_iter()
                .fold(0u32, |n, e| n.saturating_add(self.on_event(e)));
        }
        match parse::<Event>(msg.data, &mut self.summary.malformed) {
            Some(ev) => self.on_event(ev),
            None => 0,
        }
    }

    fn summary(&self) -> &Summary {
        &self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[&str]) -> (Vec<u32>, Summary) {
        crate::protocol::testing::run(&mut Tgi::default(), events.iter().map(|e| ("", *e)))
    }

    #[test]
    fn one_token_per_event_and_details_at_the_end() {
        let (counts, s) = run(&[
            r#"{"index":1,"token":{"id":415,"text":" The","logprob":-0.1,"special":false},"generated_text":null,"details":null}"#,
            r#"{"index":2,"token":{"id":2,"text":"</s>","logprob":-0.2,"special":true},"generated_text":" The","details":{"finish_reason":"eos_token","generated_tokens":2,"seed":null,"input_length":7}}"#,
        ]);
        assert_eq!(counts, [1, 1]);
        assert_eq!(s.token_id_tokens, Some(2));
        assert_eq!((s.input_tokens, s.output_tokens), (Some(7), Some(2)));
        assert!(s.ended);
        assert_eq!(s.stop, Some(crate::protocol::Stop::Stop));
    }

    #[test]
    fn the_last_event_ends_the_stream() {
        let token =
            r#"{"index":1,"token":{"id":415,"text":" The"},"generated_text":null,"details":null}"#;
        let no_fields = r#"{"index":2,"token":{"id":416,"text":" end"}}"#;
        for last in [
            // Without `details`, with an empty text, and with `details` alone.
            r#"{"index":3,"token":{"id":2,"text":"</s>"},"generated_text":" The end","details":null}"#,
            r#"{"index":3,"token":{"id":3,"text":" "},"generated_text":"","details":{"finish_reason":"length","generated_tokens":3}}"#,
            r#"{"index":3,"token":{"id":2,"text":"</s>"},"details":{"generated_tokens":3}}"#,
        ] {
            let events = [("", token), ("", no_fields), ("", last)];
            let x = &mut Tgi::default();
            assert_eq!(
                crate::protocol::testing::ended_at(x, events),
                Some(2),
                "{last}"
            );
        }
        let cut = [("", token), ("", no_fields)];
        assert_eq!(
            crate::protocol::testing::ended_at(&mut Tgi::default(), cut),
            None
        );
        let (_, s) =
            run(&[r#"{"error":"Request failed during generation","error_type":"generation"}"#]);
        assert!(!s.ended, "an error is not the end marker");
    }

    #[test]
    fn without_details_token_ids_count() {
        let (counts, s) = run(&[
            r#"{"index":1,"token":{"id":13,"text":".","logprob":-2.8,"special":false},"generated_text":".","details":null}"#,
        ]);
        assert_eq!(counts, [1]);
        assert_eq!((s.token_id_tokens, s.output_tokens), (Some(1), None));
    }

    #[test]
    fn non_streaming_generate() {
        let (counts, s) =
            run(&[r#"[{"generated_text":"Paris","details":{"generated_tokens":3}}]"#]);
        assert_eq!(counts, [1]);
        assert_eq!((s.token_id_tokens, s.output_tokens), (None, Some(3)));
        let (_, s) = run(&[r#"{"error":"Model is overloaded","error_type":"overloaded"}"#]);
        assert_eq!((s.output_tokens, s.malformed), (None, 0));
    }
}
