//! Tokens counted the way the inference engine counts them (`--tokenizer`).
//!
//! The proxy sees the request and the streamed text, not the engine's token ids. When the
//! response reports no usage, or streams events that carry several tokens or none, the counts
//! and the per-token timing are only as good as a guess; with the model's own tokenizer the
//! proxy counts what the engine counts. That means doing what vLLM (0.32, on HF transformers
//! 5) does before its tokenizer runs, not just running the tokenizer: a chat request's messages
//! are reshaped as vLLM reshapes them (`messages`), rendered through the model's chat
//! template as HF renders it (`template`, with Python's spelling of values from `python`
//! and what vLLM reads from the template's source from `source`), and the text encoded
//! without added special tokens; a completion prompt is encoded with them (`prompt`). A
//! response's text is encoded once and each token attributed to the event its last byte arrived
//! in (`output`).
//!
//! The files are the model directory's, as HF loads them (`load`): `tokenizer.json`,
//! `tokenizer_config.json` and `chat_template.jinja`. Everything is checked at start (the
//! template is compiled and renders a probe conversation), so a bad `--tokenizer` fails the
//! start, not a request.
//!
//! Cost is bounded: no text over [`MAX_TOKENIZED_BYTES`] is tokenized, and a body over it is
//! not parsed into values (`estimate`); such counts are estimates and say so
//! ([`Count::exact`]). Nothing here logs, and no text leaves it but as a count.
//!
//! What differs from the engine, known:
//!
//! - The output count re-encodes the streamed text: a non-canonical split the model sampled is
//!   counted as the canonical one, and special tokens the engine drops from the text are not
//!   counted.
//! - Media parts (images, audio, video) add the tokens only the engine's multimodal processor
//!   knows: such a prompt's count is its text's, with `exact: false`.
//! - HF transformers 5 rebuilds some model-specific tokenizer classes (those with their own
//!   `__init__`, named by the config's `tokenizer_class`) from the vocabulary and merges with
//!   their own normalizer and pre-tokenizer, and patches the pre-tokenizer regex of some
//!   Mistral tokenizers; this runs `tokenizer.json` as written.
//! - The template runs in MiniJinja, not Jinja2: the syntax, filters and tests are the same,
//!   Python's string and dict methods are the common ones (`minijinja-contrib`'s `pycompat`),
//!   values print as Python prints them, and the type tests answer as Python does. What
//!   remains: `~` spells values MiniJinja's way (`true` for `True`), and a `for` over None
//!   loops zero times where Jinja2 fails the render. `strftime_now` is UTC, not the engine's
//!   local time.
//! - vLLM's server-side options are not known here: `--chat-template` (a template other than
//!   the model's), `--default-chat-template-kwargs`, `--chat-template-content-format` (the
//!   detected format is used) and a request's own `chat_template` (`None`).
//! - Key order in messages' nested objects is the request's; vLLM's validation of the message
//!   types may reorder a `tool_calls` entry's keys, and it keeps a text part's unknown fields
//!   (`cache_control`) for a template that takes parts: that matters only to a template that
//!   prints a whole entry or part.

mod blocks;
mod count;
mod estimate;
mod load;
mod messages;
mod output;
mod prompt;
mod python;
mod source;
mod template;

use std::collections::HashMap;
use std::sync::Arc;

pub use count::{Count, Output, MAX_TOKENIZED_BYTES};
pub use load::LoadError;

use template::ChatTemplate;

/// The tokenizers of `--tokenizer`: a default, and one per model named. Built once at start and
/// shared; every method takes `&self`.
pub struct Tokenizers {
    default: Option<Arc<Tokenizer>>,
    by_model: HashMap<String, Arc<Tokenizer>>,
    /// Prompts are also cut into blocks of this many tokens (the workload trace's `hash_ids`).
    blocks: Option<usize>,
}

impl Tokenizers {
    /// The values of `--tokenizer`, each `PATH` (the default for every model) or `MODEL=PATH`
    /// (for requests naming that model). PATH is a tokenizer.json file or a directory holding
    /// one. A second default, or a second path for a model, is an error.
    pub fn load(values: &[String]) -> Result<Tokenizers, LoadError> {
        let mut out = Tokenizers {
            default: None,
            by_model: HashMap::new(),
            blocks: None,
        };
        for value in values {
            let spec = load::parse_value(value)?;
            let duplicate = match &spec.model {
                None => out.default.is_some(),
                Some(model) => out.by_model.contains_key(model),
            };
            if duplicate {
                return Err(LoadError::Duplicate {
                    value: value.clone(),
                    what: spec
                        .model
                        .as_ref()
                        .map_or("every model".to_owned(), |m| format!("model {m:?}")),
                });
            }
            let tokenizer = Arc::new(Tokenizer::from(load::load(&spec.path)?));
            match spec.model {
                None => out.default = Some(tokenizer),
                Some(model) => {
                    out.by_model.insert(model, tokenizer);
                }
            }
        }
        Ok(out)
    }

    /// The tokenizer for a request's model: that model's, else the default, else None.
    pub fn for_model(&self, model: Option<&str>) -> Option<&Arc<Tokenizer>> {
        model
            .and_then(|m| self.by_model.get(m))
            .or(self.default.as_ref())
    }

    /// Cuts every prompt counted into blocks of `tokens` tokens too (`--workload-log`'s
    /// `--workload-block-tokens`).
    pub fn with_blocks(mut self, tokens: Option<usize>) -> Self {
        self.blocks = tokens.filter(|&t| t > 0);
        self
    }

    /// The block size prompts are cut into, when asked for.
    pub fn blocks(&self) -> Option<usize> {
        self.blocks
    }

    /// True when `--tokenizer` was not given: nothing is counted.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.by_model.is_empty()
    }
}

/// One model's tokenizer and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    tool_template: Option<ChatTemplate>,
}

impl From<load::Loaded> for Tokenizer {
    fn from(loaded: load::Loaded) -> Tokenizer {
        Tokenizer {
            inner: loaded.tokenizer,
            template: loaded.template,
            tool_template: loaded.tool_template,
        }
    }
}

impl Tokenizer {
    /// Prompt tokens of an OpenAI-compatible request body as the engine counts them; `path` is
    /// the request path (`/v1/chat/completions`, `/v1/completions`, also without `/v1`).
    /// None: not a body this can count (not JSON, other API, chat without a template, a request
    /// the engine would refuse, ...).
    pub fn prompt_tokens(&self, path: &str, body: &[u8]) -> Option<Count> {
        let templates = prompt::Templates {
            default: self.template.as_ref(),
            tool_use: self.tool_template.as_ref(),
        };
        prompt::prompt_tokens(&self.inner, &templates, path, body, None)
    }

    /// The same count, and the prompt's blocks of `block` tokens named by their prefixes
    /// (`blocks::chained`), where the prompt's ids are known (one prompt, counted exactly,
    /// uncapped); empty where they are not.
    pub fn prompt_blocks(
        &self,
        path: &str,
        body: &[u8],
        block: usize,
    ) -> Option<(Count, Vec<u64>)> {
        let templates = prompt::Templates {
            default: self.template.as_ref(),
            tool_use: self.tool_template.as_ref(),
        };
        let mut ids = Vec::new();
        let count = prompt::prompt_tokens(&self.inner, &templates, path, body, Some(&mut ids))?;
        let blocks = if count.exact && ids.len() as u64 == count.tokens {
            blocks::chained(&ids, block)
        } else {
            Vec::new()
        };
        Some((count, blocks))
    }

    /// Output tokens of the text a response streamed, and how many tokens each event carried.
    /// `event_ends[i]` is the byte offset in `text` where event i's text ends (ascending; an
    /// event with no text ends where the one before it did). A token belongs to the event in
    /// which its last byte arrived; text past the last end is the last event's.
    pub fn output_tokens(&self, text: &str, event_ends: &[u32]) -> Output {
        output::output_tokens(&self.inner, text, event_ends)
    }

    /// Whether chat requests can be counted: the tokenizer has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some() || self.tool_template.is_some()
    }
}

#[cfg(test)]
mod tests;
