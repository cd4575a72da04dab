//! What a response streamed, kept for a tokenizer (`--tokenizer`): the text of each
//! token-bearing event and where it ends.
//!
//! Only a request a tokenizer counts keeps one, and only until it is counted at its end. It is
//! bounded by [`MAX_TEXT_BYTES`]: past that the text stops growing, the transcript says it
//! overflowed, and the request keeps the counts the stream gave.

use crate::protocol::{text, Api};

/// The most text kept for one response: 1 MiB, some 250,000 tokens of English, beyond the
/// longest answer any served model writes today (32k-128k tokens); a request is never held to
/// more than this, whatever the upstream streams.
pub const MAX_TEXT_BYTES: usize = 1 << 20;

/// The most events whose sizes are kept: as many as [`MAX_TEXT_BYTES`] of text has bytes at
/// four a token, 1 MiB of sizes.
pub const MAX_EVENTS: usize = MAX_TEXT_BYTES / 4;

/// The text of a response's token-bearing events.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Transcript {
    /// The events' text, one after another.
    pub text: String,
    /// Where each token-bearing event's text ends in `text` (bytes).
    pub ends: Vec<u32>,
    /// The tokens the stream itself said each event carried (its token ids, the growth of
    /// usage in every chunk, else 1), for the first [`MAX_EVENTS`] events, kept when the text
    /// is not.
    pub sizes: Vec<u32>,
    /// Some event's text could not be read or kept: the text is not the whole answer.
    pub incomplete: bool,
}

impl Transcript {
    /// A token-bearing event of `api` whose data is `data` carried `tokens` by the stream's
    /// own count.
    pub fn on_event(&mut self, api: Api, data: &[u8], tokens: u32) {
        if self.sizes.len() < MAX_EVENTS {
            self.sizes.push(tokens);
        }
        if self.incomplete {
            return;
        }
        let before = self.text.len();
        let read = api == Api::OpenAi && text::openai(data, &mut self.text);
        if !read || self.text.len() > MAX_TEXT_BYTES {
            self.text.truncate(before);
            self.incomplete = true;
            return;
        }
        // At most MAX_TEXT_BYTES (1 MiB): fits a u32.
        self.ends.push(self.text.len() as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_kept_with_their_ends_until_the_limit() {
        let mut t = Transcript::default();
        t.on_event(
            Api::OpenAi,
            br#"{"choices":[{"delta":{"content":"ab"}}]}"#,
            1,
        );
        t.on_event(Api::OpenAi, br#"{"choices":[{"delta":{"content":""}}]}"#, 1);
        t.on_event(Api::OpenAi, br#"{"choices":[{"text":"cde"}]}"#, 2);
        assert_eq!((t.text.as_str(), &t.ends[..]), ("abcde", &[2, 2, 5][..]));
        assert_eq!(t.sizes, vec![1, 1, 2]);
        assert!(!t.incomplete);
        let long = format!(
            r#"{{"choices":[{{"delta":{{"content":"{}"}}}}]}}"#,
            "x".repeat(MAX_TEXT_BYTES)
        );
        t.on_event(Api::OpenAi, long.as_bytes(), 1);
        assert!(t.incomplete);
        assert_eq!(t.text, "abcde", "nothing past the limit is kept");
        t.on_event(
            Api::OpenAi,
            br#"{"choices":[{"delta":{"content":"f"}}]}"#,
            1,
        );
        assert_eq!(t.ends.len(), 3, "nor anything after it");
        assert_eq!(
            t.sizes,
            vec![1, 1, 2, 1, 1],
            "the stream's own sizes are kept"
        );
    }

    #[test]
    fn another_format_is_not_transcribed() {
        let mut t = Transcript::default();
        t.on_event(Api::Anthropic, br#"{"type":"content_block_delta"}"#, 1);
        assert!(t.incomplete && t.text.is_empty());
    }
}
