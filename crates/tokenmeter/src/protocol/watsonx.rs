//! IBM watsonx.ai `generation/text_stream`.
//!
//! Each event's `results` hold the new `generated_text` and the running
//! `generated_token_count`, whose growth is the exact number of tokens an event carries
//! ([`Cumulative`]). `input_token_count` is reported once, in the first event, and as 0 after it,
//! so the largest report is the prompt's size.
//!
//! Every result says why it stopped: `stop_reason` is `not_finished` ("possibly more tokens to be
//! streamed") until the last event, which names the real reason (`eos_token`, `max_tokens`, ...)
//! and ends the stream ([`Summary::ended`]).

use serde::Deserialize;

use super::cumulative::Cumulative;
use super::json::{parse, Count, Reason, Str, Text};
use super::{Api, Extractor, Message, Stop, Summary};

/// The watsonx extractor.
#[derive(Debug, Default)]
pub struct Watsonx {
    summary: Summary,
    running: Cumulative,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(default, borrow)]
    model_id: Str<'a>,
    #[serde(default, borrow)]
    results: Option<Vec<Result<'a>>>,
}

#[derive(Deserialize)]
struct Result<'a> {
    #[serde(default)]
    generated_text: Text,
    #[serde(default)]
    generated_token_count: Count,
    #[serde(default)]
    input_token_count: Count,
    #[serde(default, borrow)]
    stop_reason: Str<'a>,
}

impl Result<'_> {
    /// This result is its sequence's last (IBM documents the values in lower case, but asks
    /// clients to compare them case-insensitively).
    fn is_final(&self) -> bool {
        self.stop_reason
            .as_deref()
            .is_some_and(|r| !r.eq_ignore_ascii_case("not_finished"))
    }
}

impl Extractor for Watsonx {
    fn api(&self) -> Api {
        Api::Watsonx
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        let Some(ev) = parse::<Event<'_>>(msg.data, &mut self.summary.malformed) else {
            return 0;
        };
        self.summary.name_model(ev.model_id.0);
        let results = ev.results.unwrap_or_default();
        if !results.is_empty() && results.iter().all(Result::is_final) {
            self.summary.ended = true;
        }
        for r in &results {
            if let Some(reason) = r.stop_reason.as_deref() {
                self.summary.stopped(Reason(Stop::from_reason(reason)));
            }
        }
        let total = results.iter().fold(Count(None), |sum, r| {
            Count(sum.plus(r.generated_token_count))
        });
        let input = results
            .iter()
            .fold(Count(None), |sum, r| Count(sum.plus(r.input_token_count)));
        if total.0.is_some() {
            self.summary.output_tokens = total.0;
        }
        if let Some(n) = input.0 {
            self.summary.input_tokens = Some(self.summary.input_tokens.unwrap_or(0).max(n));
        }
        let bearing = results.iter().filter(|r| r.generated_text.0).count();
        self.running
            .tokens(total.0, u32::try_from(bearing).unwrap_or(u32::MAX))
    }

    fn summary(&self) -> &Summary {
        &self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_counts_and_first_input() {
        let mut x = Watsonx::default();
        let counts: Vec<u32> = [
            r#"{"model_id":"google/flan-ul2","results":[{"generated_text":"","generated_token_count":0,"input_token_count":8,"stop_reason":"not_finished"}]}"#,
            r#"{"model_id":"google/flan-ul2","results":[{"generated_text":"the","generated_token_count":1,"input_token_count":0}]}"#,
            r#"{"model_id":"google/flan-ul2","results":[{"generated_text":" sun is","generated_token_count":3,"input_token_count":0}]}"#,
            r#"{"model_id":"google/flan-ul2","results":[{"generated_text":"","generated_token_count":4,"input_token_count":0,"stop_reason":"eos_token"}]}"#,
        ]
        .iter()
        .map(|d| {
            x.on_message(&Message {
                event: "message",
                data: d.as_bytes(),
            })
        })
        .collect();
        assert_eq!(counts, [0, 1, 2, 0]);
        let s = x.summary();
        assert_eq!(s.model.as_deref(), Some("google/flan-ul2"));
        assert_eq!((s.input_tokens, s.output_tokens), (Some(8), Some(4)));
        assert!(s.ended);
    }

    #[test]
    fn a_stop_reason_other_than_not_finished_ends_the_stream() {
        let events = [
            r#"{"model_id":"m","results":[{"generated_text":"a","generated_token_count":1,"stop_reason":"not_finished"}]}"#,
            r#"{"model_id":"m","results":[{"generated_text":"b","generated_token_count":2}]}"#,
            r#"{"model_id":"m","results":[{"generated_text":"c","generated_token_count":3,"stop_reason":"NOT_FINISHED"}]}"#,
            r#"{"model_id":"m","results":[]}"#,
            r#"{"model_id":"m","results":[{"generated_text":"","generated_token_count":4,"stop_reason":"max_tokens"}]}"#,
        ]
        .map(|d| ("message", d));
        let ended_at = |n: usize| {
            crate::protocol::testing::ended_at(&mut Watsonx::default(), events[..n].iter().copied())
        };
        assert_eq!(ended_at(5), Some(4));
        assert_eq!(ended_at(4), None);
    }
}
