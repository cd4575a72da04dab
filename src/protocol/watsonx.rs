//! IBM watsonx.ai `generation/text_stream`.
//!
//! Each event's `results` hold the new `generated_text` and the running
//! `generated_token_count`, whose growth is the exact number of tokens an event carries
//! ([`Cumulative`]). `input_token_count` is reported once, in the first event, and as 0 after it,
//! so the largest report is the prompt's size.

use serde::Deserialize;

use super::cumulative::Cumulative;
use super::json::{parse, Count, Str, Text};
use super::{Api, Extractor, Message, Summary};

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
    #[serde(default)]
    results: Option<Vec<Result>>,
}

#[derive(Deserialize)]
struct Result {
    #[serde(default)]
    generated_text: Text,
    #[serde(default)]
    generated_token_count: Count,
    #[serde(default)]
    input_token_count: Count,
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
    }
}
