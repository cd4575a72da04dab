//! A request body's prompt tokens, as vLLM's OpenAI-compatible server counts them.
//!
//! - `/v1/chat/completions`: the messages become the conversation the template takes
//!   ([`super::messages`]), the template renders it with the request's `tools`,
//!   `add_generation_prompt` (default true), `continue_final_message` (default false),
//!   `documents`, `reasoning_effort` and `chat_template_kwargs` as vLLM passes them, and the text
//!   is encoded without adding special tokens: the template writes BOS itself, and HF's
//!   `apply_chat_template` encodes with `add_special_tokens=False`. The encoder does not know
//!   which text came from the user, so a special token written in a message (`<|im_end|>`) is
//!   matched as that special token, as in the engine.
//! - `/v1/completions`: `prompt` is a string (encoded with special tokens unless the request
//!   says `add_special_tokens: false`, vLLM's default for completions), a list of strings (each
//!   one a prompt; their counts add up, as in vLLM's usage), a list of token ids (its length)
//!   or a list of lists of ids.
//!
//! Both also honour `truncate_prompt_tokens` (a positive number keeps at most that many).
//! What the engine would refuse with a 400 (a malformed field, a template's
//! `raise_exception`) is `None`, as is a request with its own `chat_template` (vLLM refuses
//! it unless started with `--trust-request-chat-template`, and then runs a template this has
//! not compiled). A body over [`MAX_TOKENIZED_BYTES`] is not parsed into values: it is
//! estimated from its text ([`super::estimate`]).

use minijinja::value::ValueKind;
use minijinja::Value;

use super::count::{estimate, Count, MAX_TOKENIZED_BYTES};
use super::estimate as big;
use super::messages;
use super::template::{Chat, ChatTemplate};

/// The API a request path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    Chat,
    Completions,
}

/// `/v1/chat/completions`, `/v1/completions`, or either without `/v1`; a query is ignored.
pub(crate) fn api(path: &str) -> Option<Api> {
    let path = path.split('?').next().unwrap_or(path);
    let path = path.strip_prefix("/v1").unwrap_or(path);
    match path {
        "/chat/completions" => Some(Api::Chat),
        "/completions" => Some(Api::Completions),
        _ => None,
    }
}

/// The chat templates a tokenizer has: HF's `default`, and `tool_use` for requests with tools.
pub(crate) struct Templates<'a> {
    pub default: Option<&'a ChatTemplate>,
    pub tool_use: Option<&'a ChatTemplate>,
}

/// The prompt tokens of a body, or `None` if it is not one this can count. With `ids`, the
/// prompt's token ids are put there too, where the body is one prompt counted exactly and
/// uncapped (a chat, a completion of one string or of one list of ids); otherwise it is left
/// empty.
pub(crate) fn prompt_tokens(
    tokenizer: &tokenizers::Tokenizer,
    templates: &Templates<'_>,
    path: &str,
    body: &[u8],
    mut ids: Option<&mut Vec<u32>>,
) -> Option<Count> {
    let api = api(path)?;
    if api == Api::Chat && templates.default.is_none() && templates.tool_use.is_none() {
        return None;
    }
    if body.len() > MAX_TOKENIZED_BYTES {
        return big::prompt_tokens(api == Api::Chat, body);
    }
    let request: Value = serde_json::from_slice(body).ok()?;
    if request.kind() != ValueKind::Map {
        return None;
    }
    let cap = cap(&request)?;
    if cap.is_some() {
        // vLLM keeps the last tokens of a capped prompt: no blocks of those.
        ids = None;
    }
    match api {
        Api::Chat => chat(tokenizer, templates, &request, ids).map(|c| capped(c, cap)),
        Api::Completions => completions(tokenizer, &request, cap, ids),
    }
}

/// A field of the request: `None` when absent or null (pydantic's default applies).
fn field(request: &Value, name: &str) -> Option<Value> {
    request
        .get_attr(name)
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_none())
}

/// A boolean field with its default; `Err` when it is not a boolean.
fn flag(request: &Value, name: &str, default: bool) -> Result<bool, ()> {
    match field(request, name) {
        None => Ok(default),
        Some(v) if v.kind() == ValueKind::Bool => Ok(v.is_true()),
        Some(_) => Err(()),
    }
}

/// `truncate_prompt_tokens`: a positive number caps each prompt's count (vLLM keeps that many
/// tokens); -1 (the model's context, not known here) and absence leave it. `None`: not an
/// integer.
fn cap(request: &Value) -> Option<Option<u64>> {
    let Some(limit) = field(request, "truncate_prompt_tokens") else {
        return Some(None);
    };
    if !limit.is_integer() {
        return None;
    }
    let limit = i64::try_from(limit).ok()?;
    Some(u64::try_from(limit).ok().filter(|&l| l > 0))
}

fn capped(count: Count, cap: Option<u64>) -> Count {
    Count {
        tokens: cap.map_or(count.tokens, |cap| count.tokens.min(cap)),
        exact: count.exact,
    }
}

/// The tokens of `text`, exact up to the limit and estimated past it; with `ids`, the ids of
/// an exact count are put there.
fn encode(
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
    add_special_tokens: bool,
    ids: Option<&mut Vec<u32>>,
) -> Option<Count> {
    if text.len() > MAX_TOKENIZED_BYTES {
        return Some(Count {
            tokens: estimate(text.len()),
            exact: false,
        });
    }
    let encoding = tokenizer.encode_fast(text, add_special_tokens).ok()?;
    if let Some(ids) = ids {
        ids.extend_from_slice(encoding.get_ids());
    }
    Some(Count {
        tokens: encoding.len() as u64,
        exact: true,
    })
}

fn completions(
    tokenizer: &tokenizers::Tokenizer,
    request: &Value,
    cap: Option<u64>,
    ids: Option<&mut Vec<u32>>,
) -> Option<Count> {
    let add_special_tokens = flag(request, "add_special_tokens", true).ok()?;
    let prompt = field(request, "prompt")?;
    if prompt.kind() == ValueKind::String {
        return encode(tokenizer, prompt.as_str()?, add_special_tokens, ids)
            .map(|c| capped(c, cap));
    }
    if prompt.kind() != ValueKind::Seq || prompt.len()? == 0 {
        return None;
    }
    let items: Vec<Value> = prompt.try_iter().ok()?.collect();
    let mut total = Count {
        tokens: 0,
        exact: true,
    };
    let mut add = |count: Count| {
        let count = capped(count, cap);
        total.tokens += count.tokens;
        total.exact &= count.exact;
    };
    match items[0].kind() {
        // A list of prompts.
        ValueKind::String => {
            for item in &items {
                add(encode(tokenizer, item.as_str()?, add_special_tokens, None)?);
            }
        }
        // One prompt of token ids.
        ValueKind::Number => {
            if !items.iter().all(Value::is_integer) {
                return None;
            }
            if let Some(ids) = ids {
                ids.extend(
                    items
                        .iter()
                        .map(|v| u32::try_from(v.clone()).unwrap_or(u32::MAX)),
                );
            }
            add(Count {
                tokens: items.len() as u64,
                exact: true,
            });
        }
        // A list of prompts of token ids.
        ValueKind::Seq => {
            for item in &items {
                if item.kind() != ValueKind::Seq {
                    return None;
                }
                let ids: Vec<Value> = item.try_iter().ok()?.collect();
                if ids.is_empty() || !ids.iter().all(Value::is_integer) {
                    return None;
                }
                add(Count {
                    tokens: ids.len() as u64,
                    exact: true,
                });
            }
        }
        _ => return None,
    }
    Some(total)
}

/// apply_chat_template's own parameters: a `chat_template_kwargs` key of that name never
/// reaches the template.
const HF_PARAMETERS: [&str; 10] = [
    "add_generation_prompt",
    "continue_final_message",
    "documents",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
];

/// `chat_template_kwargs` keys that make the engine fail the request: Python's "got multiple
/// values for argument" (the conversation is passed by name too).
const REFUSED_KWARGS: [&str; 2] = ["conversation", "messages"];

fn chat(
    tokenizer: &tokenizers::Tokenizer,
    templates: &Templates<'_>,
    request: &Value,
    ids: Option<&mut Vec<u32>>,
) -> Option<Count> {
    let (text, text_is_all) = chat_text(templates, request)?;
    let count = encode(tokenizer, &text, false, ids.filter(|_| text_is_all))?;
    Some(Count {
        tokens: count.tokens,
        exact: count.exact && text_is_all,
    })
}

/// The prompt text of a chat request, and whether it is all of the prompt (false when media
/// parts add tokens the engine's multimodal processor counts).
pub(crate) fn chat_text(templates: &Templates<'_>, request: &Value) -> Option<(String, bool)> {
    if field(request, "chat_template").is_some() {
        return None;
    }
    let mut kwargs: Vec<(String, Value)> = Vec::new();
    if let Some(extra) = field(request, "chat_template_kwargs") {
        if extra.kind() != ValueKind::Map {
            return None;
        }
        for key in extra.try_iter().ok()? {
            let name = key.as_str()?.to_owned();
            if REFUSED_KWARGS.contains(&name.as_str()) {
                return None;
            }
            let value = extra.get_item(&key).ok()?;
            kwargs.push((name, value));
        }
    }
    let take = |kwargs: &mut Vec<(String, Value)>, name: &str| {
        let at = kwargs.iter().position(|(k, _)| k == name)?;
        Some(kwargs.remove(at).1).filter(|v| !v.is_none())
    };
    // The engine's own arguments of the render, which a kwarg of the same name overrides
    // (vLLM merges the kwargs over them): `tools` (as given, not validated), and `tokenize`
    // and `chat_template`, which change nothing that is counted here.
    let tools = match take(&mut kwargs, "tools") {
        Some(tools) => tools,
        None => match field(request, "tools") {
            None => Value::from(()),
            Some(tools) => normalize_tools(&tools)?,
        },
    };
    kwargs.retain(|(k, _)| k != "tokenize" && k != "chat_template");

    // HF's choice: the `tool_use` template when there are tools and one, else `default`.
    let template = match templates.tool_use {
        Some(tool_use) if !tools.is_none() => tool_use,
        _ => templates.default?,
    };
    let conversation = messages::conversation(
        &request.get_attr("messages").ok()?,
        template.content_format(),
        template.knows_developer_role(),
    )?;
    let set = |kwargs: &mut Vec<(String, Value)>, name: &str, value: Value| match kwargs
        .iter_mut()
        .find(|(k, _)| k == name)
    {
        Some(slot) => slot.1 = value,
        None => kwargs.push((name.to_owned(), value)),
    };

    // vLLM's `build_chat_params`: the request's fields override the kwargs, those that are
    // null (or "auto") do not.
    let documents = field(request, "documents")
        .or_else(|| take(&mut kwargs, "documents"))
        .unwrap_or(Value::from(()));
    if !documents.is_none() && documents.kind() != ValueKind::Seq {
        return None;
    }
    if let Some(effort) = field(request, "reasoning_effort") {
        let name = effort.as_str()?.to_owned();
        if name != "auto" {
            set(&mut kwargs, "reasoning_effort", effort);
        }
        if !kwargs.iter().any(|(k, _)| k == "enable_thinking") {
            set(&mut kwargs, "enable_thinking", Value::from(name != "none"));
        }
    }
    kwargs.retain(|(k, _)| !HF_PARAMETERS.contains(&k.as_str()));

    let rendered = template
        .render(Chat {
            messages: conversation.messages,
            tools,
            documents,
            add_generation_prompt: flag(request, "add_generation_prompt", true).ok()?,
            continue_final_message: flag(request, "continue_final_message", false).ok()?,
            kwargs,
        })
        .ok()?;
    Some((rendered, conversation.exact))
}

/// The tools as vLLM hands them to the template: each validated as OpenAI's function tool and
/// dumped again (`ChatCompletionToolsParam.model_dump()`), so every function has `name`,
/// `description` and `parameters` (null when not given) in that order, then `strict` and
/// `defer_loading` when set, and unknown fields are gone.
pub(crate) fn normalize_tools(tools: &Value) -> Option<Value> {
    if tools.kind() != ValueKind::Seq {
        return None;
    }
    let mut out = Vec::new();
    for tool in tools.try_iter().ok()? {
        if tool.kind() != ValueKind::Map {
            return None;
        }
        let get = |map: &Value, key: &str| {
            map.get_attr(key)
                .ok()
                .filter(|v| !v.is_undefined() && !v.is_none())
        };
        if let Some(kind) = get(&tool, "type") {
            if kind.as_str() != Some("function") {
                return None;
            }
        }
        let function = get(&tool, "function")?;
        if function.kind() != ValueKind::Map {
            return None;
        }
        let name = get(&function, "name")?;
        name.as_str()?;
        let description = get(&function, "description");
        if description.as_ref().is_some_and(|d| d.as_str().is_none()) {
            return None;
        }
        let parameters = get(&function, "parameters");
        if parameters
            .as_ref()
            .is_some_and(|p| p.kind() != ValueKind::Map)
        {
            return None;
        }
        let defer_loading = get(&tool, "defer_loading");
        let mut entries: Vec<(&str, Value)> = vec![
            ("name", name),
            ("description", description.unwrap_or(Value::from(()))),
            ("parameters", parameters.unwrap_or(Value::from(()))),
        ];
        for key in ["strict", "defer_loading"] {
            let value = get(&function, key).or_else(|| {
                (key == "defer_loading")
                    .then(|| defer_loading.clone())
                    .flatten()
            });
            if let Some(value) = value {
                if value.kind() != ValueKind::Bool {
                    return None;
                }
                entries.push((key, value));
            }
        }
        let mut tool_entries: Vec<(&str, Value)> = vec![
            ("type", Value::from("function")),
            ("function", Value::from_iter(entries)),
        ];
        if let Some(defer) = defer_loading {
            tool_entries.push(("defer_loading", defer));
        }
        out.push(Value::from_iter(tool_entries));
    }
    Some(Value::from(out))
}
