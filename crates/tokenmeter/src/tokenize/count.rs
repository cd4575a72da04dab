//! What a count is, and the estimate that stands in for one past the size limit.
//!
//! Tokenizing is linear in the text, but a proxy must not spend unbounded time and memory on
//! one request's body: past [`MAX_TOKENIZED_BYTES`] the text is never tokenized, and the count
//! is an estimate that says so (`exact: false`).

/// The most text, in bytes, that is tokenized: the rendered chat prompt, a completion prompt
/// (each of a list), or a response's streamed text. 2 MiB is well over the text of a
/// 128k-token context (about 4 bytes a token in English, so about 512 KiB) and four times a
/// 128k context even at one byte a token, so every request an engine can serve is counted
/// exactly; what is over it cannot fit a context the engine serves today (it rejects it, or
/// truncates it with `truncate_prompt_tokens`). Tokenizing 2 MiB takes tens of milliseconds and
/// a few times its size in memory: the worst one request can cost.
pub const MAX_TOKENIZED_BYTES: usize = 2 << 20;

/// Bytes a token, for the estimate: English text with the BPE vocabularies of today's models
/// averages about 4 (OpenAI's rule of thumb, and what the e2e model's tokenizer gives on its
/// training text); code and other languages average fewer, so the estimate is low for them.
pub(crate) const BYTES_PER_TOKEN: usize = 4;

/// A prompt's token count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// Tokens, as the engine counts them (or the estimate).
    pub tokens: u64,
    /// False when the count is an estimate: text past [`MAX_TOKENIZED_BYTES`] (bytes / 4), or a
    /// prompt with parts that are not text (images, audio), whose tokens the engine's
    /// multimodal processor adds and only it knows.
    pub exact: bool,
}

/// A response's output tokens, in all and by event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Tokens of the whole text.
    pub tokens: u64,
    /// Tokens by event, one entry per event end given: the tokens whose last byte arrived in
    /// that event. Adds up to `tokens`.
    pub per_event: Vec<u32>,
    /// False when `tokens` is an estimate (the text is over [`MAX_TOKENIZED_BYTES`]).
    pub exact: bool,
}

/// The estimated tokens of `bytes` bytes of text: a partial token counts as one.
pub(crate) fn estimate(bytes: usize) -> u64 {
    bytes.div_ceil(BYTES_PER_TOKEN) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_rounds_a_partial_token_up() {
        assert_eq!(estimate(0), 0);
        assert_eq!(estimate(1), 1);
        assert_eq!(estimate(4), 1);
        assert_eq!(estimate(5), 2);
        assert_eq!(estimate(10 << 20), 2_621_440);
    }
}
