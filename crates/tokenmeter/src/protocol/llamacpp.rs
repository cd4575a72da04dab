//! llama.cpp server native `/completion` (also served on `/completions`).
//!
//! Each event carries a piece of text in `content`; a token-bearing event is one whose `content`
//! is not empty (a token that completes no character, or a stop token, comes with an empty one).
//! Recent servers put the running `tokens_predicted` in every event, the exact number of tokens
//! each carries ([`Cumulative`]); the final event (`"stop": true`) always has it, with
//! `tokens_evaluated` (the whole prompt, cached part included) and `timings`
//! (`predicted_n`, `prompt_n`) as fallbacks. `timings` also states the prefill and generation
//! times and, with `tokens_evaluated`, the prompt tokens the server's cache served
//! ([`super::timings`]).
//!
//! `"stop": true` marks the final event, which ends the stream ([`Summary::ended`]): the
//! native API sends no `[DONE]`. One case breaks this: a `prompt` given as an array streams
//! one completion per prompt, each with its own `"stop": true`, and nothing in the events says
//! how many there are. The first one is then taken for the end: the request leaves the
//! in-flight gauges early, though the tokens that follow are still counted.

use serde::Deserialize;

use super::cumulative::Cumulative;
use super::json::{parse, Count, Flag, Reason, Str, Text};
use super::timings::LlamacppTimings;
use super::{Api, Extractor, Message, Stop, Summary};

/// The llama.cpp extractor.
#[derive(Debug, Default)]
pub struct LlamaCpp {
    summary: Summary,
    running: Cumulative,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(default)]
    content: Text,
    #[serde(default)]
    tokens_predicted: Count,
    #[serde(default)]
    tokens_evaluated: Count,
    #[serde(default)]
    timings: Option<LlamacppTimings>,
    #[serde(default, borrow)]
    model: Str<'a>,
    #[serde(default)]
    stop: Flag,
    /// `eos`, `word` or `limit` on the last event (newer servers).
    #[serde(default)]
    stop_type: Reason,
    /// Older servers: which of these is true says why it stopped.
    #[serde(default)]
    stopped_limit: Flag,
}

impl Extractor for LlamaCpp {
    fn api(&self) -> Api {
        Api::LlamaCpp
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        let Some(ev) = parse::<Event<'_>>(msg.data, &mut self.summary.malformed) else {
            return 0;
        };
        if ev.stop.0 {
            self.summary.ended = true;
            let reason = match (ev.stop_type.0, ev.stopped_limit.0) {
                (Some(r), _) => r,
                (None, true) => Stop::Length,
                (None, false) => Stop::Stop,
            };
            self.summary.stop = Some(reason);
        }
        // The model is a file path unless the server was given an alias: keep the file name,
        // which is what an operator recognises (and not the directory layout of the host).
        let model = ev.model.non_empty();
        let name = model
            .as_deref()
            .and_then(|m| m.rsplit(['/', '\\']).next())
            .map(|m| std::borrow::Cow::Owned(m.to_owned()));
        self.summary.name_model(name);
        let timings = ev.timings.as_ref();
        let output = ev
            .tokens_predicted
            .0
            .or(timings.and_then(|t| t.predicted_n.0));
        let input = ev.tokens_evaluated.0.or(timings.and_then(|t| t.prompt_n.0));
        if output.is_some() {
            self.summary.output_tokens = output;
        }
        if input.is_some() {
            self.summary.input_tokens = input;
        }
        if let Some(t) = timings {
            if let Some(stated) = t.timings() {
                self.summary.engine = Some(stated);
            }
            if let Some(cached) = t.cached(ev.tokens_evaluated.0) {
                self.summary.cached_read = Some(cached);
            }
        }
        self.running.tokens(output, u32::from(ev.content.0))
    }

    fn summary(&self) -> &Summary {
        &self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[&str]) -> (Vec<u32>, Summary) {
        crate::protocol::testing::run(&mut LlamaCpp::default(), events.iter().map(|e| ("", *e)))
    }

    #[test]
    fn old_server_counts_from_the_final_event() {
        let (counts, s) = run(&[
            r#"{"content":" Hello","stop":false,"id_slot":0,"multimodal":false}"#,
            r#"{"content":"","stop":false,"id_slot":0,"multimodal":false}"#,
            r#"{"content":"","id_slot":0,"stop":true,"model":"/models/blobs/sha256-43f7","tokens_predicted":3,"tokens_evaluated":47,"timings":{"prompt_n":40,"predicted_n":3}}"#,
        ]);
        assert_eq!(counts, [1, 0, 0]);
        assert_eq!(s.model.as_deref(), Some("sha256-43f7"));
        assert_eq!((s.input_tokens, s.output_tokens), (Some(47), Some(3)));
        assert!(s.ended);
        assert_eq!(s.stop, Some(Stop::Stop));
        let (_, s) = run(&[r#"{"content":"","stop":true,"stop_type":"limit"}"#]);
        assert_eq!(s.stop, Some(Stop::Length));
        let (_, s) = run(&[r#"{"content":"","stop":true,"stopped_limit":true}"#]);
        assert_eq!(s.stop, Some(Stop::Length));
    }

    #[test]
    fn stop_true_ends_the_stream() {
        let events = [
            r#"{"index":0,"content":"Hi","stop":false,"tokens_predicted":1}"#,
            r#"{"index":0,"content":"","stop":null}"#,
            r#"{"index":0,"content":" there"}"#,
            r#"{"index":0,"content":"","stop":true,"stop_type":"eos","tokens_predicted":2}"#,
        ]
        .map(|d| ("", d));
        let ended_at = |n: usize| {
            crate::protocol::testing::ended_at(
                &mut LlamaCpp::default(),
                events[..n].iter().copied(),
            )
        };
        assert_eq!(ended_at(4), Some(3));
        assert_eq!(ended_at(3), None);
        // An error event is not the end marker.
        let (_, s) = run(&[r#"{"error":{"code":500,"message":"x","type":"server_error"}}"#]);
        assert!(!s.ended);
    }

    #[test]
    fn running_tokens_predicted_gives_tokens_per_event() {
        let (counts, s) = run(&[
            r#"{"index":0,"content":"Hi","tokens":[],"stop":false,"tokens_predicted":1,"tokens_evaluated":5}"#,
            r#"{"index":0,"content":" there","tokens":[],"stop":false,"tokens_predicted":3,"tokens_evaluated":5}"#,
            r#"{"content":"","stop":true,"model":"qwen","tokens_evaluated":5,"timings":{"prompt_n":2,"predicted_n":4}}"#,
        ]);
        assert_eq!(counts, [1, 2, 0]);
        assert_eq!(s.model.as_deref(), Some("qwen"));
        assert_eq!((s.input_tokens, s.output_tokens), (Some(5), Some(4)));
    }
}
