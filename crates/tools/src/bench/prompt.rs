//! Synthetic requests: prompts of exactly N words and the JSON bodies that carry them.
//!
//! A prompt is N words joined by single spaces, drawn from [`WORDS`]: three-letter common
//! English words, each a single token (with its leading space) in the common tokenizers (Llama,
//! Mistral, Qwen, GPT). N words are therefore `4N - 1` characters: exactly N tokens to
//! `tokenmeter sim`, which counts a prompt as `ceil(characters / 4)`, and about N to a real
//! tokenizer; the server's own `usage.prompt_tokens` is reported next to it so the real figure
//! is visible. (A chat request adds what the chat template adds: to the simulator, the role's
//! name, one token; to a real server, the template's tokens.)
//!
//! Every request gets different words (a seeded xorshift generator, so a run is repeatable),
//! because identical prompts would hit the server's prefix cache and make TTFT look better than
//! it is; with `--shared-prefix-tokens N` every prompt of the run starts with the same N words
//! (drawn from `--seed` too), as requests behind one system prompt do, and the prefix cache
//! may serve them.
//!
//! Each body asks for exactly `max_tokens` tokens (`ignore_eos: true`, which vLLM and SGLang
//! honour) and for the final usage chunk (`stream_options.include_usage`), whose
//! `completion_tokens` is the output count the bench trusts.

use serde_json::json;

/// Which OpenAI endpoint the bench drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `/v1/chat/completions` with one user message.
    Chat,
    /// `/v1/completions` with a plain prompt.
    Completions,
}

impl Endpoint {
    /// The path under the `/v1` base.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/chat/completions",
            Endpoint::Completions => "/completions",
        }
    }
}

/// Three-letter common English words, each a single token (with its leading space) in the
/// common tokenizers: a prompt of N of them joined by single spaces is `4N - 1` characters,
/// exactly N tokens to the simulator's four characters a token and about N to a real tokenizer.
pub const WORDS: &[&str] = &[
    "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was",
    "one", "our", "out", "day", "get", "has", "him", "his", "how", "man", "new", "now", "old",
    "see", "two", "way", "who", "boy", "did", "its", "let", "put", "say", "she", "too", "use",
    "may", "end", "far", "few", "got", "own", "set", "run", "big", "off", "men", "yet", "why",
    "ask", "try", "top", "low", "war", "law", "air", "car", "eye", "job", "age", "act", "add",
    "bad", "bed", "box", "buy", "cut", "dog", "key", "lot", "map", "oil", "pay", "red", "sea",
    "sun", "bit", "yes", "art",
];

/// Builds the request bodies of one run.
/// What a stream of words is for. Each has streams of its own, so that two kinds of text never
/// share words by accident (request 5's own words are not block 5's).
#[derive(Debug, Clone, Copy)]
enum Purpose {
    /// A request's own words, numbered by the request.
    Request = 0,
    /// The words every prompt of a run starts with (`--shared-prefix-tokens`).
    SharedPrefix = 1,
    /// A trace's block, numbered by its id in `hash_ids`.
    Block = 2,
    /// A trace request's own words, past its blocks, numbered by its line.
    Line = 3,
}

/// A seeded stream of words: splitmix64 of (seed, purpose, number) seeds a xorshift64*. Both are
/// tiny and good enough to make texts differ, which is all we need of them.
struct WordStream(u64);

impl WordStream {
    fn new(seed: u64, purpose: Purpose, n: u64) -> WordStream {
        let z = seed
            ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (purpose as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
        WordStream(tokenmeter::rng::mix(z) | 1)
    }

    fn next_word(&mut self) -> &'static str {
        let x = &mut self.0;
        *x ^= *x >> 12;
        *x ^= *x << 25;
        *x ^= *x >> 27;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        WORDS[(r >> 33) as usize % WORDS.len()]
    }

    /// Appends the stream's first `n` words to `out`, each after a space unless `out` is empty.
    fn push(mut self, out: &mut String, n: usize) {
        out.reserve(n * 4);
        for _ in 0..n {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(self.next_word());
        }
    }
}

/// Builds the request bodies of one run.
#[derive(Debug, Clone)]
pub struct RequestBuilder {
    pub endpoint: Endpoint,
    pub model: String,
    pub prompt_tokens: usize,
    /// The words every prompt starts with, the same for the whole run (at most the prompt).
    pub shared_prefix_tokens: usize,
    pub output_tokens: u64,
    pub seed: u64,
}

impl RequestBuilder {
    /// The prompt of request number `n`: `prompt_tokens` words, different for every `n` after
    /// the shared prefix.
    pub fn prompt(&self, n: u64) -> String {
        self.prompt_of(n, self.prompt_tokens)
    }

    /// The prompt of request number `n` with `words` words (as many tokens to the simulator):
    /// the run's shared prefix (cut to `words`), then words of its own.
    fn prompt_of(&self, n: u64, words: usize) -> String {
        let mut out = String::with_capacity(words * 4);
        let shared = self.shared_prefix_tokens.min(words);
        WordStream::new(self.seed, Purpose::SharedPrefix, 0).push(&mut out, shared);
        // The length is part of the request's words' seed: two runs of one seed with other
        // lengths share the prefix they were given, not request n's words besides.
        let own = n ^ ((words as u64) << 32);
        WordStream::new(self.seed, Purpose::Request, own).push(&mut out, words - shared);
        out
    }

    /// A trace request's prompt, exactly `words` words: block `i` is the text of the id
    /// `hash_ids[i]`, `block_words` words drawn for that id (so the same id always gives the
    /// same words, and two prompts whose first blocks have the same ids start alike); the last
    /// block, when the prompt ends inside it, is the start of its id's text. Words past the
    /// blocks `hash_ids` names are the request's own, drawn for `line`; ids past the prompt's
    /// end are not used.
    pub fn blocks_prompt(
        &self,
        words: usize,
        hash_ids: &[u64],
        block_words: usize,
        line: u64,
    ) -> String {
        let mut out = String::with_capacity(words * 4);
        let mut left = words;
        for &id in hash_ids {
            if left == 0 || block_words == 0 {
                break;
            }
            let n = left.min(block_words);
            WordStream::new(self.seed, Purpose::Block, id).push(&mut out, n);
            left -= n;
        }
        WordStream::new(self.seed, Purpose::Line, line).push(&mut out, left);
        out
    }

    /// The JSON body of request number `n`, asking for `max_tokens` output tokens.
    pub fn body(&self, n: u64, max_tokens: u64) -> Vec<u8> {
        self.body_sized(n, self.prompt_tokens, max_tokens)
    }

    /// As [`RequestBuilder::body`] with a prompt of `prompt_tokens` words instead of the
    /// builder's, for a load whose requests vary in length (the demo's).
    pub fn body_sized(&self, n: u64, prompt_tokens: usize, max_tokens: u64) -> Vec<u8> {
        self.body_of(&self.prompt_of(n, prompt_tokens), max_tokens)
    }

    /// The JSON body that sends `prompt`, asking for `max_tokens` output tokens.
    pub fn body_of(&self, prompt: &str, max_tokens: u64) -> Vec<u8> {
        let mut body = json!({
            "model": self.model,
            "max_tokens": max_tokens,
            "stream": true,
            "stream_options": { "include_usage": true },
            "ignore_eos": true,
            "temperature": 0,
        });
        match self.endpoint {
            Endpoint::Chat => {
                body["messages"] = json!([{ "role": "user", "content": prompt }]);
            }
            Endpoint::Completions => body["prompt"] = json!(prompt),
        }
        body.to_string().into_bytes()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;

    fn builder(endpoint: Endpoint) -> RequestBuilder {
        RequestBuilder {
            endpoint,
            model: "m".into(),
            prompt_tokens: 100,
            shared_prefix_tokens: 0,
            output_tokens: 7,
            seed: 1,
        }
    }

    #[test]
    fn prompts_have_n_words_differ_per_request_and_repeat_per_seed() {
        let b = builder(Endpoint::Chat);
        assert_eq!(b.prompt(0).split(' ').count(), 100);
        assert_ne!(b.prompt(0), b.prompt(1));
        assert_eq!(b.prompt(5), builder(Endpoint::Chat).prompt(5));
        assert!(b.prompt(3).split(' ').all(|w| WORDS.contains(&w)));
    }

    /// Four characters a word, the last without its space: the simulator's `ceil(chars / 4)`
    /// is the number of words, exactly.
    #[test]
    fn a_prompt_of_n_words_is_4n_minus_1_characters() {
        assert!(WORDS
            .iter()
            .all(|w| w.len() == 3 && w.chars().all(|c| c.is_ascii_lowercase())));
        let mut unique = WORDS.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), WORDS.len(), "no word twice");
        let b = builder(Endpoint::Completions);
        for n in [1, 2, 7, 100, 1000] {
            let p = b.prompt_of(9, n);
            assert_eq!(p.len(), 4 * n - 1, "{n} words");
            assert_eq!(p.len().div_ceil(4), n);
        }
    }

    #[test]
    fn bodies_ask_for_exact_length_and_usage() {
        for endpoint in [Endpoint::Chat, Endpoint::Completions] {
            let b = builder(endpoint);
            let v: serde_json::Value = serde_json::from_slice(&b.body(0, 7)).unwrap();
            assert_eq!(v["max_tokens"], 7);
            assert_eq!(v["ignore_eos"], true);
            assert_eq!(v["stream"], true);
            assert_eq!(v["stream_options"]["include_usage"], true);
            let prompt = match endpoint {
                Endpoint::Chat => &v["messages"][0]["content"],
                Endpoint::Completions => &v["prompt"],
            };
            assert_eq!(prompt.as_str().unwrap().split(' ').count(), 100);
        }
        let b = builder(Endpoint::Chat);
        let v: serde_json::Value = serde_json::from_slice(&b.body_sized(0, 12, 3)).unwrap();
        assert_eq!(v["max_tokens"], 3);
        let words = v["messages"][0]["content"].as_str().unwrap().split(' ');
        assert_eq!(words.count(), 12);
    }

    #[test]
    fn a_shared_prefix_starts_every_prompt_then_each_has_its_own_words() {
        let b = RequestBuilder {
            shared_prefix_tokens: 30,
            ..builder(Endpoint::Completions)
        };
        let (p0, p1) = (b.prompt(0), b.prompt(1));
        assert_eq!(p0.len(), 4 * 100 - 1);
        // 30 words of four characters (the 30th's space included): the same in both.
        assert_eq!(p0[..120], p1[..120]);
        assert_ne!(p0[120..], p1[120..]);
        // The seed draws the prefix.
        let other = RequestBuilder {
            seed: 2,
            ..b.clone()
        };
        assert_ne!(other.prompt(0)[..119], p0[..119]);
        // A prompt shorter than the prefix is its start.
        assert_eq!(b.prompt_of(0, 10), p0[..39]);
        // After the prefix, a request's own words are those it has without one.
        let none = builder(Endpoint::Completions);
        assert_eq!(b.prompt(1)[120..], none.prompt(1)[..4 * 70 - 1]);
    }

    fn words(p: &str) -> Vec<&str> {
        p.split(' ').collect()
    }

    #[test]
    fn a_block_id_gives_the_same_words_wherever_it_is() {
        let b = builder(Endpoint::Completions);
        // Id 7 first in one prompt, second in another: the same 16 words either way.
        let first = b.blocks_prompt(32, &[7, 1], 16, 1);
        let second = b.blocks_prompt(32, &[3, 7], 16, 2);
        assert_eq!(words(&first)[..16], words(&second)[16..]);
        assert_ne!(words(&first)[16..], words(&second)[..16]);
        // Another seed, other words.
        let other = RequestBuilder {
            seed: 9,
            ..b.clone()
        };
        assert_ne!(other.blocks_prompt(16, &[7], 16, 1), first[..63]);
    }

    #[test]
    fn requests_that_share_a_first_block_share_their_first_words() {
        let b = builder(Endpoint::Completions);
        // 900 and 300 tokens in blocks of 512: [0, 1] and [0]. The short one ends inside block
        // 0, so it is block 0's first 300 words: the start of the long one.
        let long = b.blocks_prompt(900, &[0, 1], 512, 10);
        let short = b.blocks_prompt(300, &[0], 512, 11);
        assert_eq!(long[..short.len()], short[..]);
        assert_eq!(long.as_bytes()[short.len()], b' ');
        // A third whose first block differs shares nothing by design.
        let apart = b.blocks_prompt(900, &[2, 1], 512, 12);
        assert_ne!(apart[..2047], long[..2047]);
        assert_eq!(apart[2048..], long[2048..], "the same second block");
    }

    #[test]
    fn a_trace_prompt_is_exactly_its_input_length_in_words() {
        let b = builder(Endpoint::Completions);
        let cases: [(usize, &[u64]); 7] = [
            (1, &[5]),
            (512, &[5]),
            (513, &[5, 6]),
            (1030, &[0, 1, 2]),
            // Fewer ids than blocks: the rest is the request's own.
            (1030, &[0]),
            (40, &[]),
            // More ids than blocks: the extra are not used.
            (100, &[4, 5, 6]),
        ];
        for (n, ids) in cases {
            let p = b.blocks_prompt(n, ids, 512, 3);
            assert_eq!(p.len(), 4 * n - 1, "{n} words from {ids:?}");
            assert!(words(&p).iter().all(|w| WORDS.contains(w)), "{n} {ids:?}");
        }
    }

    #[test]
    fn words_past_the_blocks_are_the_lines_own() {
        let b = builder(Endpoint::Completions);
        // No hash_ids: the line's words, and another line's differ.
        let a = b.blocks_prompt(40, &[], 16, 3);
        assert_ne!(a, b.blocks_prompt(40, &[], 16, 4));
        assert_eq!(a, b.blocks_prompt(40, &[], 16, 3));
        // One id for three blocks' worth: block 0, then 24 words of the line's own.
        let c = b.blocks_prompt(40, &[8], 16, 3);
        assert_eq!(
            words(&c)[..16],
            words(&b.blocks_prompt(16, &[8], 16, 99))[..]
        );
        assert_eq!(words(&c)[16..], words(&a)[..24]);
        // Extra ids change nothing.
        assert_eq!(
            b.blocks_prompt(16, &[8, 9, 10], 16, 3),
            b.blocks_prompt(16, &[8], 16, 3)
        );
    }
}
