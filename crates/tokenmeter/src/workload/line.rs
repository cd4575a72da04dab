//! One request of the workload trace: what the request's thread takes of its record
//! ([`Entry::of`]), and the line the writer makes of it ([`Entry::line`]).
//!
//! The keys and their order are a contract (docs/replay.md):
//! [`KEYS`]. The first four are the Mooncake trace's, which vLLM's `bench serve` (`timed_trace`)
//! and GuideLLM (`mooncake`) read; the rest are what replay tools take where present, and what
//! tokenmeter's own `bench --trace` and `capacity --trace` read. Nothing of the prompt, the
//! answer or a header's value is in it: lengths, block numbers and conversation numbers only.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::protocol::operation::Operation;
use crate::protocol::TokenSource;
use crate::record::{Finished, Outcome};

use super::ids::FirstSight;

/// The keys of a line, in their order; `hash_ids`, `conversation_id` and `class` only where
/// known.
pub const KEYS: [&str; 10] = [
    "timestamp",
    "input_length",
    "output_length",
    "hash_ids",
    "duration",
    "conversation_id",
    "model",
    "class",
    "outcome",
    "exact",
];

/// Bytes a token, for a prompt nobody counted: the estimate the tokenizer uses past its limit.
const BYTES_PER_TOKEN: u64 = 4;

/// What the trace keeps of a finished request until its line is written.
#[derive(Debug, Clone)]
pub struct Entry {
    pub arrived: Instant,
    pub duration: Duration,
    pub input: u64,
    pub output: u64,
    /// Both lengths are counts (usage, token ids, the tokenizer), not estimates.
    pub exact: bool,
    pub blocks: Option<Arc<[u64]>>,
    /// The conversation header's value, hashed.
    pub conversation: Option<u64>,
    pub model: String,
    pub class: Option<Arc<str>>,
    pub outcome: &'static str,
}

/// Whether a finished request goes in the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    Yes,
    /// A request for generation that was never sent upstream whole (shed, refused, upgraded):
    /// no prompt to replay. Counted.
    Skipped,
    /// Not a request for generation (a list of models, embeddings): not part of the workload.
    NotWorkload,
}

/// Whether `f` goes in the trace.
pub fn kept(f: &Finished) -> Kept {
    let generates = matches!(
        f.route.operation,
        Some(Operation::Chat | Operation::TextCompletion | Operation::GenerateContent)
    );
    if !generates {
        return Kept::NotWorkload;
    }
    match f.outcome {
        Outcome::Complete
        | Outcome::ClientDisconnect
        | Outcome::UpstreamError
        | Outcome::Timeout
            if f.body_bytes > 0 || f.input_tokens.is_some() =>
        {
            Kept::Yes
        }
        _ => Kept::Skipped,
    }
}

impl Entry {
    /// The entry of `f`, which ended at `at`.
    pub fn of(f: &Finished, at: Instant) -> Entry {
        let (input, input_exact) = match f.input_tokens {
            Some(n) => (n, !f.input_estimated),
            None => (f.body_bytes.div_ceil(BYTES_PER_TOKEN), false),
        };
        Entry {
            arrived: at.checked_sub(f.duration).unwrap_or(at),
            duration: f.duration,
            // A request always has a prompt: one token at least.
            input: input.max(1),
            output: f.output_tokens,
            exact: input_exact && f.token_source != TokenSource::Counted,
            blocks: f.prompt_blocks.clone(),
            conversation: f.ident.as_ref().and_then(|i| i.conversation),
            model: f.model.clone(),
            class: f.slo.as_ref().map(|s| Arc::clone(&s.class)),
            outcome: f.outcome.as_str(),
        }
    }

    /// The line (ending in a newline), its time counted from `origin`; block and conversation
    /// numbers from `blocks` and `conversations`. `block_tokens` is what a `hash_ids` entry
    /// stands for: a line has `ceil(input_length / block_tokens)` of them, whatever the
    /// tokenizer's count was (a usage report that differs from it rules; the blocks past the
    /// tokenizer's are new numbers, those past the usage dropped).
    pub fn line(
        &self,
        origin: Instant,
        block_tokens: u64,
        blocks: &mut FirstSight,
        conversations: &mut FirstSight,
    ) -> String {
        let mut out = String::with_capacity(160);
        let at = self.arrived.saturating_duration_since(origin).as_millis();
        let _ = write!(
            out,
            "{{\"timestamp\":{at},\"input_length\":{},\"output_length\":{}",
            self.input, self.output
        );
        if let Some(hashes) = &self.blocks {
            let want = self.input.div_ceil(block_tokens.max(1)) as usize;
            out.push_str(",\"hash_ids\":[");
            for i in 0..want {
                if i > 0 {
                    out.push(',');
                }
                let n = match hashes.get(i) {
                    Some(&h) => blocks.number(h),
                    None => blocks.fresh(),
                };
                let _ = write!(out, "{n}");
            }
            out.push(']');
        }
        let _ = write!(out, ",\"duration\":{}", self.duration.as_millis());
        if let Some(c) = self.conversation {
            let _ = write!(out, ",\"conversation_id\":{}", conversations.number(c));
        }
        out.push_str(",\"model\":");
        string(&mut out, &self.model);
        if let Some(class) = &self.class {
            out.push_str(",\"class\":");
            string(&mut out, class);
        }
        let _ = writeln!(
            out,
            ",\"outcome\":\"{}\",\"exact\":{}}}",
            self.outcome, self.exact
        );
        out
    }
}

/// A JSON string (the model label and the class name are bounded, but may hold anything),
/// written by serde_json: this runs on the writer thread, once a line.
fn string(out: &mut String, v: &str) {
    match serde_json::to_string(v) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => out.push_str("\"\""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::finished;

    #[test]
    fn a_line_has_the_trace_keys_in_order() {
        let at = Instant::now() + Duration::from_secs(10);
        let f = Finished {
            input_tokens: Some(1030),
            token_source: TokenSource::Usage,
            output_tokens: 64,
            prompt_blocks: Some(Arc::from(vec![70u64, 71, 72])),
            model: "m\"x".into(),
            ..finished()
        };
        let e = Entry::of(&f, at);
        let origin = e.arrived - Duration::from_millis(1250);
        let (mut blocks, mut conversations) = (FirstSight::default(), FirstSight::default());
        let line = e.line(origin, 512, &mut blocks, &mut conversations);
        assert_eq!(
            line,
            "{\"timestamp\":1250,\"input_length\":1030,\"output_length\":64,\"hash_ids\":[0,1,2],\
             \"duration\":500,\"model\":\"m\\\"x\",\"outcome\":\"complete\",\"exact\":true}\n"
        );
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        let keys: Vec<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        let want: Vec<&str> = KEYS
            .iter()
            .copied()
            .filter(|k| !["conversation_id", "class"].contains(k))
            .collect();
        // serde_json's map is sorted; the order on the line is checked above.
        let mut sorted = want.clone();
        sorted.sort_unstable();
        assert_eq!(keys, sorted);
        // The same prefix again: the same numbers; usage longer than the tokenizer's blocks
        // gets new numbers past them.
        let longer = Entry {
            input: 1600,
            ..e.clone()
        };
        let line = longer.line(origin, 512, &mut blocks, &mut conversations);
        assert!(line.contains("\"hash_ids\":[0,1,2,3]"), "{line}");
    }

    #[test]
    fn an_uncounted_prompt_is_estimated_and_says_so() {
        let f = Finished {
            input_tokens: None,
            body_bytes: 4001,
            ..finished()
        };
        let e = Entry::of(&f, Instant::now());
        assert_eq!((e.input, e.exact), (1001, false));
        // Counted events are not exact either.
        let f = Finished {
            token_source: TokenSource::Counted,
            ..finished()
        };
        assert!(!Entry::of(&f, Instant::now()).exact);
    }

    #[test]
    fn only_requests_for_generation_sent_upstream_are_kept() {
        assert_eq!(kept(&finished()), Kept::Yes);
        let shed = Finished {
            outcome: Outcome::Shed,
            ..finished()
        };
        assert_eq!(kept(&shed), Kept::Skipped);
        let mut models = finished();
        models.route.operation = None;
        assert_eq!(kept(&models), Kept::NotWorkload);
    }
}
