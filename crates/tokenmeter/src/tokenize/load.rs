//! Loading a tokenizer as HF transformers (5.x, what vLLM 0.32 runs on) loads it from a model
//! directory.
//!
//! A `--tokenizer` value is `PATH` or `MODEL=PATH` (split at the first `=`, so a default path
//! cannot contain one). `PATH` is a `tokenizer.json` or a directory with one; beside it, both
//! optional, are `tokenizer_config.json` and `chat_template.jinja`. From those files:
//!
//! - The chat template: `chat_template.jinja` (and `additional_chat_templates/tool_use.jinja`)
//!   if present, else the config's `chat_template`, a string or a list of `{name, template}`
//!   (HF uses `tool_use` for a request with tools when there is one, `default` otherwise).
//!   None: chat requests are not counted. (vLLM prefers a multimodal model's processor
//!   template, for requests without tools; it is not read here.)
//! - The named special tokens (`bos_token`, `eos_token`, `unk_token`, `sep_token`,
//!   `pad_token`, `cls_token`, `mask_token`; a string or `{"content": ...}`): given to the
//!   template, and added to the tokenizer as special tokens if it lacks them, as HF does (with
//!   `additional_special_tokens`/`extra_special_tokens` and `added_tokens_decoder`). Without
//!   `added_tokens_decoder` HF reads the legacy `special_tokens_map.json` over the config; so
//!   does this.
//! - `add_bos_token`/`add_eos_token`: when the config names either, or `tokenizer.json` has no
//!   post-processor, HF replaces the post-processor with one that adds exactly those (what a
//!   completion prompt gets with `add_special_tokens`).
//! - `split_special_tokens`: special tokens written in text are then not matched as such.
//!
//! Truncation and padding saved in `tokenizer.json` are switched off: HF's call sets both per
//! call, and vLLM asks for neither.
//!
//! Every template is compiled and rendered once with a probe conversation (one user message)
//! here, so a template this cannot render is refused at start, not on the first request.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use minijinja::Value;
use serde_json::Value as Json;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

use super::messages;
use super::template::{Chat, ChatTemplate};

/// Why a `--tokenizer` value cannot be used. Each message names the value or the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("--tokenizer {value:?}: expected PATH or MODEL=PATH, with neither part empty")]
    BadValue { value: String },
    #[error("--tokenizer {value:?}: a second tokenizer for {what}")]
    Duplicate { value: String, what: String },
    #[error("tokenizer {path}: no such file or directory")]
    Missing { path: PathBuf },
    #[error("tokenizer {path}: no tokenizer.json in this directory")]
    NoTokenizerJson { path: PathBuf },
    #[error("tokenizer {path}: cannot read it: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("tokenizer {path}: not a tokenizer.json: {reason}")]
    NotATokenizer { path: PathBuf, reason: String },
    #[error("tokenizer config {path}: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error("chat template {path}: does not compile: {reason}")]
    TemplateSyntax { path: PathBuf, reason: String },
    #[error("chat template {path}: fails to render a one-message conversation: {reason}")]
    TemplateRender { path: PathBuf, reason: String },
}

/// One `--tokenizer` value, parsed: the model it is for (`None`: the default) and the path.
pub(crate) struct Spec {
    pub model: Option<String>,
    pub path: PathBuf,
}

/// `PATH` or `MODEL=PATH`.
pub(crate) fn parse_value(value: &str) -> Result<Spec, LoadError> {
    let bad = || LoadError::BadValue {
        value: value.to_owned(),
    };
    match value.split_once('=') {
        None if value.is_empty() => Err(bad()),
        None => Ok(Spec {
            model: None,
            path: PathBuf::from(value),
        }),
        Some((model, path)) if model.is_empty() || path.is_empty() => Err(bad()),
        Some((model, path)) => Ok(Spec {
            model: Some(model.to_owned()),
            path: PathBuf::from(path),
        }),
    }
}

/// A loaded tokenizer and its chat templates.
pub(crate) struct Loaded {
    pub tokenizer: tokenizers::Tokenizer,
    /// The template for requests without tools (HF's `default`).
    pub template: Option<ChatTemplate>,
    /// HF's `tool_use` template, for requests with tools, when the config names one.
    pub tool_template: Option<ChatTemplate>,
}

/// The seven named special tokens HF passes to every template.
const NAMED_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Loads the tokenizer at `path` (a file or a directory) and its template.
pub(crate) fn load(path: &Path) -> Result<Loaded, LoadError> {
    let meta = std::fs::metadata(path).map_err(|_| LoadError::Missing {
        path: path.to_owned(),
    })?;
    let (file, dir) = if meta.is_dir() {
        let file = path.join("tokenizer.json");
        if !file.is_file() {
            return Err(LoadError::NoTokenizerJson {
                path: path.to_owned(),
            });
        }
        (file, path.to_owned())
    } else {
        let dir = path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_owned);
        (path.to_owned(), dir)
    };

    let bytes = std::fs::read(&file).map_err(|e| LoadError::Unreadable {
        path: file.clone(),
        reason: e.to_string(),
    })?;
    let mut tokenizer =
        tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| LoadError::NotATokenizer {
            path: file.clone(),
            reason: e.to_string(),
        })?;
    let config = Config::read(&dir)?;
    config.adjust(&mut tokenizer);

    let special: Vec<(String, String)> = NAMED_TOKENS
        .iter()
        .filter_map(|name| {
            let token = config.tokens.get(*name)?;
            Some(((*name).to_owned(), token.clone()))
        })
        .collect();
    let compile = |(path, source): (PathBuf, String),
                   with_tool: bool|
     -> Result<ChatTemplate, LoadError> {
        let template =
            ChatTemplate::new(&source, special.clone()).map_err(|e| LoadError::TemplateSyntax {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        probe(&template, with_tool).map_err(|reason| LoadError::TemplateRender { path, reason })?;
        Ok(template)
    };
    let (template, tool_template) = config.templates(&dir)?;
    Ok(Loaded {
        tokenizer,
        template: template.map(|t| compile(t, false)).transpose()?,
        tool_template: tool_template.map(|t| compile(t, true)).transpose()?,
    })
}

/// Renders one user message with the generation prompt, as a request would be; with one tool
/// for HF's `tool_use` template, which only requests with tools get.
fn probe(template: &ChatTemplate, with_tool: bool) -> Result<(), String> {
    let messages: Value = Value::from(vec![Value::from_iter([
        ("role", "user"),
        ("content", "Hello"),
    ])]);
    let conversation = messages::conversation(
        &messages,
        template.content_format(),
        template.knows_developer_role(),
    )
    .ok_or("the probe conversation was refused")?;
    template
        .render(Chat {
            messages: conversation.messages,
            tools: if with_tool {
                Value::from(vec![Value::from_iter([
                    ("type", Value::from("function")),
                    (
                        "function",
                        Value::from_iter([
                            ("name", Value::from("probe")),
                            ("description", Value::from(())),
                            ("parameters", Value::from(())),
                        ]),
                    ),
                ])])
            } else {
                Value::from(())
            },
            documents: Value::from(()),
            add_generation_prompt: true,
            continue_final_message: false,
            kwargs: Vec::new(),
        })
        .map(drop)
        .map_err(|e| e.to_string())
}

/// What `tokenizer_config.json` (and the legacy `special_tokens_map.json`) say.
#[derive(Default)]
struct Config {
    path: PathBuf,
    json: serde_json::Map<String, Json>,
    /// Special tokens by attribute name (the named ones, with their string content).
    tokens: HashMap<String, String>,
    /// Tokens to add if the tokenizer lacks them.
    added: Vec<AddedToken>,
}

impl Config {
    fn read(dir: &Path) -> Result<Config, LoadError> {
        let path = dir.join("tokenizer_config.json");
        let mut config = Config {
            path: path.clone(),
            ..Config::default()
        };
        let Some(json) = read_json_object(&path)? else {
            return Ok(config);
        };
        config.json = json;
        let bad = |reason: String| LoadError::BadConfig {
            path: path.clone(),
            reason,
        };

        let mut named: serde_json::Map<String, Json> = NAMED_TOKENS
            .iter()
            .filter_map(|n| Some(((*n).to_owned(), config.json.get(*n)?.clone())))
            .collect();
        let mut extra = Vec::new();
        for key in ["additional_special_tokens", "extra_special_tokens"] {
            if let Some(Json::Array(tokens)) = config.json.get(key) {
                extra.extend(tokens.iter().cloned());
            }
        }
        match config.json.get("added_tokens_decoder") {
            Some(Json::Object(decoder)) => {
                for entry in decoder.values() {
                    config.added.push(
                        added_token(entry, false).ok_or_else(|| {
                            bad(format!("bad added_tokens_decoder entry {entry}"))
                        })?,
                    );
                }
            }
            Some(other) if !other.is_null() => {
                return Err(bad("added_tokens_decoder is not an object".into()))
            }
            _ => {
                // HF's legacy path: special_tokens_map.json's values win over the config's.
                if let Some(map) = read_json_object(&dir.join("special_tokens_map.json"))? {
                    for (key, value) in map {
                        if NAMED_TOKENS.contains(&key.as_str()) {
                            named.insert(key, value);
                        } else if key == "additional_special_tokens"
                            || key == "extra_special_tokens"
                        {
                            if let Json::Array(tokens) = value {
                                extra.extend(tokens);
                            }
                        }
                    }
                }
            }
        }
        for (name, value) in named {
            if value.is_null() {
                continue;
            }
            let token =
                added_token(&value, true).ok_or_else(|| bad(format!("bad {name} {value}")))?;
            config.tokens.insert(name, token.content.clone());
            config.added.push(token);
        }
        for value in extra {
            config
                .added
                .push(added_token(&value, true).ok_or_else(|| bad(format!("bad token {value}")))?);
        }
        for key in ["add_bos_token", "add_eos_token", "split_special_tokens"] {
            if let Some(v) = config.json.get(key) {
                if !v.is_boolean() && !v.is_null() {
                    return Err(bad(format!("{key} is not true or false")));
                }
            }
        }
        Ok(config)
    }

    fn flag(&self, key: &str) -> bool {
        self.json.get(key).and_then(Json::as_bool).unwrap_or(false)
    }

    /// HF's changes to the tokenizer it loads (see the module doc).
    fn adjust(&self, tokenizer: &mut tokenizers::Tokenizer) {
        let _ = tokenizer.with_truncation(None);
        tokenizer.with_padding(None);

        let missing: Vec<AddedToken> = {
            let have = tokenizer.get_added_vocabulary().get_vocab();
            let mut seen = Vec::new();
            for token in &self.added {
                if !have.contains_key(&token.content)
                    && !seen.iter().any(|t: &AddedToken| t.content == token.content)
                {
                    seen.push(token.clone());
                }
            }
            seen
        };
        let (special, plain): (Vec<_>, Vec<_>) = missing.into_iter().partition(|t| t.special);
        tokenizer.add_special_tokens(&special);
        tokenizer.add_tokens(&plain);

        let explicit =
            self.json.contains_key("add_bos_token") || self.json.contains_key("add_eos_token");
        if explicit || tokenizer.get_post_processor().is_none() {
            let with_id = |name: &str| {
                let token = self.tokens.get(name)?;
                Some((token.clone(), tokenizer.token_to_id(token)?))
            };
            let bos = with_id("bos_token").filter(|_| self.flag("add_bos_token"));
            let eos = with_id("eos_token").filter(|_| self.flag("add_eos_token"));
            if let Some(processor) = bos_eos_processor(bos, eos) {
                tokenizer.with_post_processor(Some(processor));
            }
        }
        tokenizer.set_encode_special_tokens(self.flag("split_special_tokens"));
    }

    /// The `default` and `tool_use` templates, each with the file it came from.
    #[allow(clippy::type_complexity)]
    fn templates(
        &self,
        dir: &Path,
    ) -> Result<(Option<(PathBuf, String)>, Option<(PathBuf, String)>), LoadError> {
        // Template files take the config's place, all of it, when there is one.
        let default_file = read_template(dir.join("chat_template.jinja"))?;
        let tool_use_file = read_template(dir.join("additional_chat_templates/tool_use.jinja"))?;
        if default_file.is_some() || tool_use_file.is_some() {
            return Ok((default_file, tool_use_file));
        }
        let bad = |reason: &str| LoadError::BadConfig {
            path: self.path.clone(),
            reason: reason.to_owned(),
        };
        let at = |source: &str| Some((self.path.clone(), source.to_owned()));
        match self.json.get("chat_template") {
            None | Some(Json::Null) => Ok((None, None)),
            Some(Json::String(source)) => Ok((at(source), None)),
            Some(Json::Array(named)) => {
                let mut default = None;
                let mut tool_use = None;
                for entry in named {
                    let name = entry.get("name").and_then(Json::as_str);
                    let source = entry.get("template").and_then(Json::as_str);
                    let (Some(name), Some(source)) = (name, source) else {
                        return Err(bad("a chat_template entry without a name and a template"));
                    };
                    match name {
                        "default" => default = at(source),
                        "tool_use" => tool_use = at(source),
                        _ => {}
                    }
                }
                Ok((default, tool_use))
            }
            Some(_) => Err(bad("chat_template is neither a string nor a list")),
        }
    }
}

/// A template file, if there is one.
fn read_template(path: PathBuf) -> Result<Option<(PathBuf, String)>, LoadError> {
    if !path.is_file() {
        return Ok(None);
    }
    match std::fs::read_to_string(&path) {
        Ok(source) => Ok(Some((path, source))),
        Err(e) => Err(LoadError::Unreadable {
            reason: e.to_string(),
            path,
        }),
    }
}

/// HF's `update_post_processor`: `[bos] $A [eos]` for a single sequence, and for a pair the
/// same again with type id 1.
fn bos_eos_processor(
    bos: Option<(String, u32)>,
    eos: Option<(String, u32)>,
) -> Option<TemplateProcessing> {
    let piece = |type_id: u8| {
        let mut parts = Vec::new();
        if let Some((token, _)) = &bos {
            parts.push(format!("{token}:{type_id}"));
        }
        parts.push(format!(
            "${}:{type_id}",
            if type_id == 0 { "A" } else { "B" }
        ));
        if let Some((token, _)) = &eos {
            parts.push(format!("{token}:{type_id}"));
        }
        parts.join(" ")
    };
    let single = piece(0);
    let pair = format!("{single} {}", piece(1));
    let special: Vec<(String, u32)> = bos.iter().chain(eos.iter()).cloned().collect();
    TemplateProcessing::builder()
        .try_single(single)
        .ok()?
        .try_pair(pair)
        .ok()?
        .special_tokens(special)
        .build()
        .ok()
}

/// A token as the config writes it: a string, or an object with `content` and the flags.
/// HF adds special tokens unnormalized unless told.
fn added_token(value: &Json, special: bool) -> Option<AddedToken> {
    match value {
        Json::String(content) => Some(AddedToken::from(content.clone(), special)),
        Json::Object(fields) => {
            let content = fields.get("content")?.as_str()?;
            let flag = |name: &str, default: bool| {
                fields.get(name).and_then(Json::as_bool).unwrap_or(default)
            };
            let special = flag("special", special);
            Some(
                AddedToken::from(content, special)
                    .single_word(flag("single_word", false))
                    .lstrip(flag("lstrip", false))
                    .rstrip(flag("rstrip", false))
                    .normalized(flag("normalized", !special)),
            )
        }
        _ => None,
    }
}

/// A JSON object file: `None` if there is no such file.
fn read_json_object(path: &Path) -> Result<Option<serde_json::Map<String, Json>>, LoadError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(LoadError::Unreadable {
                path: path.to_owned(),
                reason: e.to_string(),
            })
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(Json::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(LoadError::BadConfig {
            path: path.to_owned(),
            reason: "not a JSON object".into(),
        }),
        Err(e) => Err(LoadError::BadConfig {
            path: path.to_owned(),
            reason: format!("not JSON: {e}"),
        }),
    }
}
