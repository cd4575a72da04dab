//! SGLang native `/generate`.
//!
//! Each event holds the text so far (or, with `--incremental-streaming-output`, the new piece)
//! and `meta_info` with the running `completion_tokens` and `prompt_tokens`. Since the text may be
//! cumulative, an event is token-bearing when `completion_tokens` grew, and it carries exactly
//! that growth (speculative decoding puts several tokens in one event). A request with several
//! prompts or `n > 1` streams each sequence under its own `index`: the output is the sum of the
//! sequences' latest counts.
//!
//! Every sequence's last event has a `finish_reason`, but only `data: [DONE]`, sent after all of
//! them (and after an error), ends the stream ([`Summary::ended`]).
//!
//! `meta_info.cached_tokens` is the prompt tokens read from the radix cache (the latest report
//! wins, as for `prompt_tokens`).

use serde::Deserialize;

use super::json::{parse, Count, Reason, Text};
use super::{is_done, Api, Extractor, Message, Summary};

/// Sequences of one request tracked separately; more are folded into the last one. A bound,
/// because `index` comes from the stream.
const MAX_SEQUENCES: usize = 256;

/// The SGLang extractor.
#[derive(Debug, Default)]
pub struct Sglang {
    summary: Summary,
    /// `(index, latest completion_tokens)` per sequence.
    sequences: Vec<(u64, u64)>,
}

#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    text: Text,
    #[serde(default)]
    meta_info: Option<MetaInfo>,
    #[serde(default)]
    index: Count,
}

#[derive(Deserialize)]
struct MetaInfo {
    #[serde(default)]
    prompt_tokens: Count,
    #[serde(default)]
    completion_tokens: Count,
    #[serde(default)]
    finish_reason: Reason,
    #[serde(default)]
    cached_tokens: Count,
}

impl Sglang {
    /// Records the running count of one sequence; returns its growth.
    fn advance(&mut self, index: u64, total: u64) -> u64 {
        let slot = match self.sequences.iter().position(|(i, _)| *i == index) {
            Some(at) => at,
            None if self.sequences.len() < MAX_SEQUENCES => {
                self.sequences.push((index, 0));
                self.sequences.len() - 1
            }
            None => self.sequences.len() - 1,
        };
        let last = &mut self.sequences[slot].1;
        let grown = total.saturating_sub(*last);
        *last = (*last).max(total);
        grown
    }
}

impl Extractor for Sglang {
    fn api(&self) -> Api {
        Api::Sglang
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        if is_done(msg) {
            self.summary.ended = true;
        }
        let Some(ev) = parse::<Event>(msg.data, &mut self.summary.malformed) else {
            return 0;
        };
        let Some(meta) = ev.meta_info else {
            return u32::from(ev.text.0);
        };
        self.summary.stopped(meta.finish_reason);
        if meta.prompt_tokens.0.is_some() {
            self.summary.input_tokens = meta.prompt_tokens.0;
        }
        if meta.cached_tokens.0.is_some() {
            self.summary.cached_read = meta.cached_tokens.0;
        }
        let Some(total) = meta.completion_tokens.0 else {
            return u32::from(ev.text.0);
        };
        let grown = self.advance(ev.index.0.unwrap_or(0), total);
        self.summary.output_tokens = Some(self.sequences.iter().map(|(_, n)| n).sum());
        u32::try_from(grown).unwrap_or(u32::MAX)
    }

    fn summary(&self) -> &Summary {
        &self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[&str]) -> (Vec<u32>, Summary) {
        crate::protocol::testing::run(&mut Sglang::default(), events.iter().map(|e| ("", *e)))
    }

    #[test]
    fn cumulative_text_and_speculative_events() {
        let (counts, s) = run(&[
            r#"{"text":"The","output_ids":[791],"meta_info":{"id":"a","finish_reason":null,"prompt_tokens":6,"completion_tokens":1,"cached_tokens":0}}"#,
            r#"{"text":"The capital of","output_ids":[791,6864,315],"meta_info":{"id":"a","finish_reason":null,"prompt_tokens":6,"completion_tokens":3}}"#,
            r#"{"text":"The capital of","meta_info":{"id":"a","finish_reason":{"type":"stop"},"prompt_tokens":6,"completion_tokens":3}}"#,
            "[DONE]",
        ]);
        assert_eq!(counts, [1, 2, 0, 0]);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(6), Some(3)));
        assert_eq!(s.cached_read, Some(0));
        assert!(s.ended);
        let (_, s) = run(&[
            r#"{"text":"a","meta_info":{"prompt_tokens":600,"completion_tokens":1,"cached_tokens":512}}"#,
        ]);
        assert_eq!(s.cached_read, Some(512));
    }

    #[test]
    fn only_done_ends_the_stream() {
        // Sequence 0 finishes before sequence 1: its finish_reason is no end of the stream.
        let events = [
            r#"{"index":0,"text":"a","meta_info":{"completion_tokens":1,"finish_reason":null}}"#,
            r#"{"index":0,"text":"a","meta_info":{"completion_tokens":1,"finish_reason":{"type":"stop"}}}"#,
            r#"{"index":1,"text":"b","meta_info":{"completion_tokens":1,"finish_reason":{"type":"length"}}}"#,
            "[DONE]",
        ]
        .map(|d| ("", d));
        let ended_at = |n: usize| {
            crate::protocol::testing::ended_at(&mut Sglang::default(), events[..n].iter().copied())
        };
        assert_eq!(ended_at(4), Some(3));
        assert_eq!(ended_at(3), None);
    }

    #[test]
    fn parallel_sequences_add_up() {
        let (counts, s) = run(&[
            r#"{"index":0,"text":"a","meta_info":{"prompt_tokens":4,"completion_tokens":1}}"#,
            r#"{"index":1,"text":"b","meta_info":{"prompt_tokens":4,"completion_tokens":1}}"#,
            r#"{"index":0,"text":"ab","meta_info":{"prompt_tokens":4,"completion_tokens":2}}"#,
        ]);
        assert_eq!(counts, [1, 1, 1]);
        assert_eq!(s.output_tokens, Some(3));
    }

    #[test]
    fn sequence_count_is_bounded() {
        let mut x = Sglang::default();
        for i in 0..(MAX_SEQUENCES as u64 + 10) {
            let e = format!(r#"{{"index":{i},"text":"a","meta_info":{{"completion_tokens":1}}}}"#);
            x.on_message(&Message {
                event: "",
                data: e.as_bytes(),
            });
        }
        assert_eq!(x.sequences.len(), MAX_SEQUENCES);
    }
}
