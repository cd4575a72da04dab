//! Output tokens from the text a response streamed, and which event each token arrived in.
//!
//! The engine streams text, not tokens: a streamed event may carry several tokens, or part of
//! one (a multi-byte character split across tokens is held back until it is whole; a stop
//! string is held back until it is ruled out), or nothing. Encoding the whole text once, without
//! special tokens (the engine drops them from the text it streams), gives the tokens; each
//! token's byte offsets say where it ends, and it belongs to the event in which its last byte
//! arrived. A token of no width (some tokenizers' prefix markers) belongs to the event its
//! position falls in. Re-encoding decoded text gives the canonical tokenization, which is the
//! generated one nearly always; a model may sample a non-canonical split, which this cannot see.

use super::count::{estimate, Output, BYTES_PER_TOKEN, MAX_TOKENIZED_BYTES};

/// The output tokens of `text`, in all and by event (see [`super::Tokenizer::output_tokens`]).
pub(crate) fn output_tokens(
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
    event_ends: &[u32],
) -> Output {
    if text.len() > MAX_TOKENIZED_BYTES {
        return estimated(text.len(), event_ends);
    }
    let Ok(encoding) = tokenizer.encode(text, false) else {
        return estimated(text.len(), event_ends);
    };
    let mut per_event = vec![0u32; event_ends.len()];
    for &(start, end) in encoding.get_offsets() {
        // The byte that completes the token; for a token of no width, where it stands.
        let last = if end > start { end - 1 } else { start };
        add(&mut per_event, event_of(event_ends, last));
    }
    Output {
        tokens: encoding.len() as u64,
        per_event,
        exact: true,
    }
}

/// The event a byte arrived in: the first whose end is past it. A byte past the last end (text
/// the ends do not cover) is the last event's.
fn event_of(event_ends: &[u32], byte: usize) -> Option<usize> {
    let i = event_ends.partition_point(|&end| end as usize <= byte);
    if event_ends.is_empty() {
        None
    } else {
        Some(i.min(event_ends.len() - 1))
    }
}

fn add(per_event: &mut [u32], event: Option<usize>) {
    if let Some(slot) = event.and_then(|i| per_event.get_mut(i)) {
        *slot = slot.saturating_add(1);
    }
}

/// The estimate past the limit: a token every [`BYTES_PER_TOKEN`] bytes, the last one partial,
/// each in the event its last byte arrived in, as above.
fn estimated(len: usize, event_ends: &[u32]) -> Output {
    let tokens = estimate(len);
    let mut per_event = vec![0u32; event_ends.len()];
    if !event_ends.is_empty() {
        // Tokens end at bytes 3, 7, 11, ... and the last at len - 1: count those before each
        // event's end, rather than walk millions of tokens.
        let ended_by = |end: usize| -> u64 {
            if end >= len {
                tokens
            } else {
                (end / BYTES_PER_TOKEN) as u64
            }
        };
        let mut before = 0u64;
        for (slot, &end) in per_event.iter_mut().zip(event_ends) {
            let upto = ended_by(end as usize).max(before);
            *slot = u32::try_from(upto - before).unwrap_or(u32::MAX);
            before = upto;
        }
        if let Some(last) = per_event.last_mut() {
            *last = last.saturating_add(u32::try_from(tokens - before).unwrap_or(u32::MAX));
        }
    }
    Output {
        tokens,
        per_event,
        exact: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_attributes_by_position_and_adds_up() {
        let out = estimated(10, &[3, 4, 8, 10]);
        // Tokens end at bytes 3, 7 and 9.
        assert_eq!(out.tokens, 3);
        assert_eq!(out.per_event, [0, 1, 1, 1]);
        assert!(!out.exact);
        // Ends that stop short of the text: the rest is the last event's.
        let out = estimated(12, &[4]);
        assert_eq!(out.per_event, [3]);
        assert_eq!(estimated(12, &[]).per_event, Vec::<u32>::new());
    }

    #[test]
    fn a_byte_belongs_to_the_first_event_ending_past_it() {
        let ends = [2, 2, 5];
        assert_eq!(event_of(&ends, 0), Some(0));
        assert_eq!(event_of(&ends, 1), Some(0));
        assert_eq!(event_of(&ends, 2), Some(2));
        assert_eq!(event_of(&ends, 9), Some(2));
        assert_eq!(event_of(&[], 0), None);
    }
}
