//! A request's `messages` as the engine hands them to the chat template.
//!
//! vLLM does not pass the request's messages through: it parses each one
//! (`renderers/chat_utils.py`, `_parse_chat_message_content` and `_postprocess_messages`) into a
//! fresh dict of the fields it knows, with the content in the shape the template takes
//! ([`ContentFormat`]), and the template sees only that. So do we, field by field:
//!
//! - `role`; `content`: absent is no parts (null too, for an assistant message); a string is
//!   one text part; each part of a list is a typed dict (`text`, `input_text`, `output_text`: its `text`;
//!   `refusal`: its `refusal`; `thinking`: its `thinking`; a null text skipped). For a string
//!   template the texts are joined by `"\n"`; for a list template each is
//!   `{"type": "text", "text": ...}`.
//! - assistant: `tool_calls` (each function's `arguments` string parsed into a dict, `{}` when
//!   it is not a JSON object; an empty list dropped), `reasoning` (also as
//!   `reasoning_content`); tool: `tool_call_id`, list content joined as text; `name` and `task`
//!   when strings; developer: `tools`.
//! - A system message's text part that starts with Claude Code's `x-anthropic-billing-header`
//!   line loses that line.
//! - Developer messages, for a template that does not name the role, become system messages,
//!   and then all system messages are merged into one at the front.
//!
//! Media parts (images, audio, video) reach the engine's multimodal processor, which adds their
//! tokens by its own rules (or refuses them, for a text-only model); here they add nothing and
//! make the count inexact. What vLLM refuses with a 400 is `None` here.

use minijinja::value::ValueKind;
use minijinja::Value;

use super::source::ContentFormat;
use super::template::with_key;

/// The conversation the template renders, and whether its text is all of the prompt.
pub(crate) struct Conversation {
    pub messages: Vec<Value>,
    /// False if some part is media, whose tokens are not counted.
    pub exact: bool,
}

/// Part types whose content is text (vLLM's `TEXT_PART_TYPES`), and the field that holds it.
fn text_field(part_type: &str) -> Option<&'static str> {
    match part_type {
        "text" | "input_text" | "output_text" => Some("text"),
        "refusal" => Some("refusal"),
        "thinking" => Some("thinking"),
        _ => None,
    }
}

/// Claude Code's attribution line, which vLLM drops from system text.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// One part of a message's content, parsed.
enum Part {
    Text(String),
    /// Media, by the name a list template sees it as (`image`, `audio`, `video`, or the type).
    Media(String),
}

/// The conversation, or `None` if the engine would refuse these messages.
pub(crate) fn conversation(
    messages: &Value,
    format: ContentFormat,
    knows_developer_role: bool,
) -> Option<Conversation> {
    if messages.kind() != ValueKind::Seq {
        return None;
    }
    let mut exact = true;
    let mut out = Vec::new();
    for message in messages.try_iter().ok()? {
        out.push(parse_message(&message, format, &mut exact)?);
    }
    let has_developer = out.iter().any(|m| role_is(m, "developer"));
    if has_developer && !knows_developer_role {
        out = developer_as_system(out)?;
    }
    Some(Conversation {
        messages: out,
        exact,
    })
}

/// Whether a message's role is `name`.
fn role_is(message: &Value, name: &str) -> bool {
    message
        .get_attr("role")
        .is_ok_and(|role| role.as_str() == Some(name))
}

fn parse_message(message: &Value, format: ContentFormat, exact: &mut bool) -> Option<Value> {
    if message.kind() != ValueKind::Map {
        return None;
    }
    let field = |name: &str| message.get_attr(name).ok().filter(|v| !v.is_undefined());
    let role = field("role")?;
    let role_name = role.as_str()?.to_owned();

    // Absent content is no parts for every role; null only for the assistant's (a message that
    // is all tool calls): vLLM's validation refuses it for the others.
    let content = message.get_attr("content").unwrap_or_default();
    let mut parts = match content.kind() {
        ValueKind::Undefined => Vec::new(),
        ValueKind::None if role_name == "assistant" => Vec::new(),
        ValueKind::String => vec![Part::Text(content.as_str()?.to_owned())],
        ValueKind::Seq => {
            let mut parts = Vec::new();
            for part in content.try_iter().ok()? {
                if let Some(part) = parse_part(&part)? {
                    parts.push(part);
                }
            }
            parts
        }
        _ => return None,
    };
    if role_name == "system" {
        strip_billing_header(&mut parts);
    }
    if parts.iter().any(|p| matches!(p, Part::Media(_))) {
        *exact = false;
    }

    let texts = || {
        parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                Part::Media(_) => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut content = match format {
        ContentFormat::String => Value::from(texts()),
        ContentFormat::OpenAi => Value::from(
            parts
                .iter()
                .map(|p| match p {
                    Part::Text(t) => Value::from_iter([("type", "text"), ("text", t.as_str())]),
                    Part::Media(kind) => Value::from_iter([("type", kind.as_str())]),
                })
                .collect::<Vec<_>>(),
        ),
    };
    // A tool message's text parts reach the template as one string whatever the format.
    if role_name == "tool"
        && format == ContentFormat::OpenAi
        && parts.iter().all(|p| matches!(p, Part::Text(_)))
    {
        content = Value::from(texts());
    }

    let mut entries: Vec<(&str, Value)> = vec![("role", role), ("content", content)];
    match role_name.as_str() {
        "assistant" => {
            if let Some(calls) = field("tool_calls").filter(|c| !c.is_none()) {
                if let Some(calls) = tool_calls(&calls)? {
                    entries.push(("tool_calls", calls));
                }
            }
            if let Some(reasoning) = field("reasoning").filter(|r| !r.is_none()) {
                entries.push(("reasoning", reasoning.clone()));
                entries.push(("reasoning_content", reasoning));
            }
        }
        "tool" => {
            if let Some(id) = field("tool_call_id") {
                entries.push(("tool_call_id", id));
            }
        }
        _ => {}
    }
    for key in ["name", "task"] {
        if let Some(v) = field(key).filter(|v| v.kind() == ValueKind::String) {
            entries.push((key, v));
        }
    }
    if role_name == "developer" {
        entries.push(("tools", field("tools").unwrap_or(Value::from(()))));
    }
    Some(Value::from_iter(entries))
}

/// One content part; `Ok(None)` for a text part whose text is null (vLLM skips it), `None` for
/// one the engine refuses.
fn parse_part(part: &Value) -> Option<Option<Part>> {
    match part.kind() {
        // The request's validation takes only typed parts (a bare string is vLLM's own input).
        ValueKind::Map => {
            let part_type = part.get_attr("type").ok()?;
            let part_type = part_type.as_str()?;
            if let Some(field) = text_field(part_type) {
                let text = part.get_attr(field).ok()?;
                return match text.kind() {
                    ValueKind::Undefined | ValueKind::None => Some(None),
                    ValueKind::String => Some(Some(Part::Text(text.as_str()?.to_owned()))),
                    _ => None,
                };
            }
            let kind = match part_type {
                "image_url" | "input_image" | "image_embeds" | "image_pil" => "image",
                "audio_url" | "input_audio" | "audio_embeds" => "audio",
                "video_url" | "video_embeds" => "video",
                other => other,
            };
            Some(Some(Part::Media(kind.to_owned())))
        }
        _ => None,
    }
}

/// vLLM's `_strip_claude_code_billing_header`: a text part starting with the header keeps what
/// follows its first line, or goes if nothing does.
fn strip_billing_header(parts: &mut Vec<Part>) {
    parts.retain_mut(|part| match part {
        Part::Text(text) if text.starts_with(BILLING_HEADER) => {
            match text.split_once('\n').map(|(_, rest)| rest.to_owned()) {
                Some(rest) if !rest.is_empty() => {
                    *text = rest;
                    true
                }
                _ => false,
            }
        }
        _ => true,
    });
}

/// vLLM's `_postprocess_messages` for one assistant message's `tool_calls`: `Ok(None)` drops an
/// empty list; each call must be a function call, its `arguments` become a dict.
fn tool_calls(calls: &Value) -> Option<Option<Value>> {
    if calls.kind() != ValueKind::Seq {
        return None;
    }
    let mut out = Vec::new();
    for call in calls.try_iter().ok()? {
        if call.kind() != ValueKind::Map {
            return None;
        }
        let call_type = call.get_attr("type").ok()?;
        let function = call.get_attr("function").ok()?;
        let is_function = call_type.is_undefined() || call_type.as_str() == Some("function");
        if !is_function || function.kind() != ValueKind::Map {
            return None;
        }
        let arguments = function.get_attr("arguments").ok()?;
        let parsed = match arguments.kind() {
            ValueKind::Map => arguments,
            ValueKind::String => serde_json::from_str::<Value>(arguments.as_str()?)
                .ok()
                .filter(|v| v.kind() == ValueKind::Map)
                .unwrap_or_else(empty_map),
            _ => empty_map(),
        };
        let function = with_key(&function, "arguments", parsed).ok()?;
        out.push(with_key(&call, "function", function).ok()?);
    }
    Some((!out.is_empty()).then(|| Value::from(out)))
}

fn empty_map() -> Value {
    Value::from_iter(std::iter::empty::<(Value, Value)>())
}

/// vLLM's `_convert_developer_to_system` and `_consolidate_system_messages`: developer
/// messages become system ones (without `tools`); if then a system message is not first, or
/// there are two with text, they are merged into one at the front, their texts joined by a
/// blank line.
fn developer_as_system(messages: Vec<Value>) -> Option<Vec<Value>> {
    let mut converted = Vec::with_capacity(messages.len());
    for m in messages {
        if role_is(&m, "developer") {
            let entries: Vec<(Value, Value)> = m
                .try_iter()
                .ok()?
                .filter(|k| k.as_str() != Some("tools"))
                .map(|k| {
                    let v = if k.as_str() == Some("role") {
                        Value::from("system")
                    } else {
                        m.get_item(&k).unwrap_or_default()
                    };
                    (k, v)
                })
                .collect();
            converted.push(Value::from_iter(entries));
        } else {
            converted.push(m);
        }
    }

    let mut texts: Vec<String> = Vec::new();
    let mut others = Vec::new();
    let mut needs_merge = false;
    for (i, m) in converted.iter().enumerate() {
        if !role_is(m, "system") {
            others.push(m.clone());
            continue;
        }
        if i > 0 || !texts.is_empty() {
            needs_merge = true;
        }
        let content = m.get_attr("content").unwrap_or_default();
        let text = match content.kind() {
            ValueKind::Seq => content
                .try_iter()
                .ok()?
                .filter_map(|p| match p.kind() {
                    ValueKind::String => p.as_str().map(str::to_owned),
                    ValueKind::Map => p.get_attr("text").ok()?.as_str().map(str::to_owned),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
            _ => content.as_str().unwrap_or_default().to_owned(),
        };
        if !text.is_empty() {
            texts.push(text);
        }
    }
    if !needs_merge {
        return Some(converted);
    }
    let merged = Value::from_iter([
        ("role", Value::from("system")),
        ("content", Value::from(texts.join("\n\n"))),
    ]);
    Some(std::iter::once(merged).chain(others).collect())
}
