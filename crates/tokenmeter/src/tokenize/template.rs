//! The chat template, rendered as HF's `apply_chat_template(..., tokenize=False)` renders it.
//!
//! HF compiles the template in a sandboxed Jinja2 environment with `trim_blocks` and
//! `lstrip_blocks`, the `loopcontrols` extension, its own `tojson` filter (Python's
//! `json.dumps`, not Jinja2's HTML-escaping one), and two globals, `raise_exception` and
//! `strftime_now`; it renders with `messages`, `tools`, `documents`, `add_generation_prompt`,
//! the tokenizer's named special tokens (`bos_token`, ...) and the caller's extra arguments. This
//! builds the same environment in MiniJinja: its syntax and filters are Jinja2's, Python's
//! string and dict methods come from `minijinja-contrib`'s `pycompat`, and what a template
//! prints is spelled as Python spells it ([`super::python`]). `continue_final_message` is HF's
//! too: the final message is rendered with a marker after it and the text is cut at the marker.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

use super::python::{self, Json};
use super::source::{self, ContentFormat};

/// The template's name in its environment.
const NAME: &str = "chat_template";

/// HF's marker for the end of the message to continue.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// A compiled chat template and what the engine reads from its source.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    format: ContentFormat,
    developer_role: bool,
    /// HF refuses `continue_final_message` for a template whose source never says `content`.
    names_content: bool,
    /// The tokenizer's named special tokens (`bos_token`: `"<s>"`, ...), given to every render.
    special_tokens: Vec<(String, String)>,
}

/// One conversation to render: the messages as the engine hands them to the template (see
/// `super::messages`) and the template's other arguments.
pub(crate) struct Chat {
    pub messages: Vec<Value>,
    /// `None` (the value) when the request has none: HF passes `tools=None`, so `tools is
    /// defined` holds and `tools is none` too.
    pub tools: Value,
    pub documents: Value,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// The rest of the template's variables (`chat_template_kwargs` and the engine's extras),
    /// which override the special tokens, as in HF.
    pub kwargs: Vec<(String, Value)>,
}

impl ChatTemplate {
    /// Compiles a template; the error is MiniJinja's syntax error.
    pub(crate) fn new(
        source: &str,
        special_tokens: Vec<(String, String)>,
    ) -> Result<ChatTemplate, Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            let mut text = String::new();
            python::str(value, &mut text);
            out.write_str(&text).map_err(Error::from)
        });
        env.add_filter("tojson", tojson);
        env.add_filter("string", |value: Value| {
            let mut text = String::new();
            python::str(&value, &mut text);
            text
        });
        // Jinja2's tests as Python answers them, where MiniJinja's differ: None is not
        // iterable (MiniJinja iterates it as empty: `tools is iterable and tools | length`
        // then fails on None), strings and dicts are sequences, and a bool is a number.
        env.add_test("iterable", |value: &Value| {
            matches!(
                value.kind(),
                ValueKind::Undefined
                    | ValueKind::String
                    | ValueKind::Bytes
                    | ValueKind::Seq
                    | ValueKind::Map
                    | ValueKind::Iterable
            )
        });
        env.add_test("sequence", |value: &Value| {
            matches!(
                value.kind(),
                ValueKind::String | ValueKind::Bytes | ValueKind::Seq | ValueKind::Map
            )
        });
        env.add_test("number", |value: &Value| {
            matches!(value.kind(), ValueKind::Number | ValueKind::Bool)
        });
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| {
            // Python's `datetime.now()` is the engine's local time; here it is UTC, which is
            // what a container's local time is unless TZ says otherwise.
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            python::strftime(&format, now)
        });
        env.add_template_owned(NAME, source::without_generation_tags(source))?;
        Ok(ChatTemplate {
            env,
            format: source::content_format(source),
            developer_role: source::knows_developer_role(source),
            names_content: source.contains("content"),
            special_tokens,
        })
    }

    pub(crate) fn content_format(&self) -> ContentFormat {
        self.format
    }

    pub(crate) fn knows_developer_role(&self) -> bool {
        self.developer_role
    }

    /// The prompt text, or the error that makes the engine refuse the request (a template's
    /// `raise_exception`, a variable that cannot be used as the template uses it, HF's own
    /// checks).
    pub(crate) fn render(&self, chat: Chat) -> Result<String, Error> {
        let Chat {
            mut messages,
            tools,
            documents,
            add_generation_prompt,
            continue_final_message,
            kwargs,
        } = chat;
        if messages.is_empty() {
            return Err(refused(
                "Cannot apply chat template to an empty conversation.",
            ));
        }
        if !documents.is_none() && documents.try_iter()?.any(|d| d.kind() != ValueKind::Map) {
            return Err(refused("Documents should be a list of dicts"));
        }
        let final_text = if continue_final_message {
            if add_generation_prompt {
                return Err(refused(
                    "continue_final_message and add_generation_prompt are not compatible",
                ));
            }
            let last = messages.pop().unwrap_or_default();
            let (marked, text) = self.mark_final(&last)?;
            messages.push(marked);
            Some(text)
        } else {
            None
        };

        let mut context: Vec<(String, Value)> = self
            .special_tokens
            .iter()
            .map(|(name, token)| (name.clone(), Value::from(token.as_str())))
            .collect();
        for (key, value) in kwargs {
            context.retain(|(k, _)| *k != key);
            context.push((key, value));
        }
        context.push(("messages".into(), Value::from(messages)));
        context.push(("tools".into(), tools));
        context.push(("documents".into(), documents));
        context.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        let rendered = self
            .env
            .get_template(NAME)?
            .render(Value::from_iter(context))?;

        match final_text {
            None => Ok(rendered),
            Some(text) => cut_at_tag(rendered, &text),
        }
    }

    /// HF's first half of `continue_final_message`: the last message with the marker after its
    /// text (after the last text part of a list), and that text.
    fn mark_final(&self, message: &Value) -> Result<(Value, String), Error> {
        let content = message.get_attr("content")?;
        if content.is_undefined() || content.is_none() {
            return Err(refused(
                "continue_final_message is set but the final message has no content",
            ));
        }
        if !self.names_content {
            return Err(refused(
                "continue_final_message is set but the template has no content field",
            ));
        }
        let (marked, text) = match content.kind() {
            ValueKind::String => {
                let text = content.as_str().unwrap_or_default().to_owned();
                (Value::from(format!("{text}{CONTINUE_TAG}")), text)
            }
            ValueKind::Seq => {
                let mut parts: Vec<Value> = content.try_iter()?.collect();
                let Some(i) = parts.iter().rposition(|p| has_key(p, "text")) else {
                    return Err(refused(
                        "continue_final_message is set but the final message has no text",
                    ));
                };
                let text = parts[i].get_attr("text")?;
                let Some(text) = text.as_str().map(str::to_owned) else {
                    return Err(refused("the final message's text is not a string"));
                };
                let marked_text = Value::from(format!("{text}{CONTINUE_TAG}"));
                parts[i] = with_key(&parts[i], "text", marked_text)?;
                (Value::from(parts), text)
            }
            _ => return Err(refused("the final message's content cannot be continued")),
        };
        Ok((with_key(message, "content", marked)?, text))
    }
}

/// HF's second half of `continue_final_message`: the rendered text up to the marker (and
/// without the whitespace before it, if the template trimmed what followed the message).
fn cut_at_tag(rendered: String, final_text: &str) -> Result<String, Error> {
    let tag = CONTINUE_TAG.trim();
    if !rendered.contains(final_text.trim()) || !rendered.contains(tag) {
        return Err(refused(
            "continue_final_message is set but the final message does not appear in the chat",
        ));
    }
    let at = rendered.rfind(tag).unwrap_or(rendered.len());
    if rendered[at..].starts_with(CONTINUE_TAG) {
        Ok(rendered[..at].to_owned())
    } else {
        Ok(rendered[..at].trim_end().to_owned())
    }
}

/// Python's `key in d` for a dict (a string part has no keys here: its `in` is a substring
/// test, and parts reach the template as dicts).
fn has_key(value: &Value, key: &str) -> bool {
    value.kind() == ValueKind::Map
        && value
            .try_iter()
            .is_ok_and(|mut keys| keys.any(|k| k.as_str() == Some(key)))
}

/// A copy of a dict with `key` set (in place if it was there, at the end if not: Python's
/// dict order).
pub(crate) fn with_key(map: &Value, key: &str, value: Value) -> Result<Value, Error> {
    let mut entries = Vec::new();
    let mut value = Some(value);
    for k in map.try_iter()? {
        if k.as_str() == Some(key) {
            entries.push((k, value.take().unwrap_or_default()));
        } else {
            let v = map.get_item(&k)?;
            entries.push((k, v));
        }
    }
    if let Some(value) = value {
        entries.push((Value::from(key), value));
    }
    Ok(Value::from_iter(entries))
}

fn refused(message: &'static str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message)
}

/// HF's filter: `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// `json.dumps` with those arguments, by position or by name.
fn tojson(value: &Value, args: Rest<Value>) -> Result<Value, Error> {
    let mut positional = args.0;
    let kwargs = match positional.last() {
        Some(last) if last.is_kwargs() => Kwargs::try_from(positional.pop().unwrap_or_default())?,
        _ => Kwargs::from_iter(std::iter::empty::<(String, Value)>()),
    };
    if positional.len() > 4 {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let mut positional = positional.into_iter();
    let (ensure_ascii, indent, separators, sort_keys) = (
        positional.next(),
        positional.next(),
        positional.next(),
        positional.next(),
    );
    let named = |name: &str, positional: Option<Value>| -> Result<Value, Error> {
        Ok(match kwargs.get::<Option<Value>>(name)? {
            Some(v) => v,
            None => positional.unwrap_or_default(),
        })
    };
    let ensure_ascii = named("ensure_ascii", ensure_ascii)?;
    let indent = named("indent", indent)?;
    let separators = named("separators", separators)?;
    let sort_keys = named("sort_keys", sort_keys)?;
    kwargs.assert_all_used()?;

    // `json.dumps` takes an int (that many spaces; none for 0 or less) or a string.
    let indent = match indent.kind() {
        ValueKind::Undefined | ValueKind::None => None,
        ValueKind::String => Some(indent.as_str().unwrap_or_default().to_owned()),
        ValueKind::Number | ValueKind::Bool => {
            let n = i64::try_from(indent.clone()).unwrap_or(0);
            Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
        }
        _ => return Err(Error::new(ErrorKind::InvalidOperation, "bad indent")),
    };
    let mut json = Json::new(indent);
    json.ensure_ascii = ensure_ascii.is_true();
    json.sort_keys = sort_keys.is_true();
    if !separators.is_none() && !separators.is_undefined() {
        let parts: Vec<Value> = separators.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] => {
                json.item_separator = item.as_str().unwrap_or_default().to_owned();
                json.key_separator = key.as_str().unwrap_or_default().to_owned();
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "separators must be an (item, key) pair",
                ))
            }
        }
    }
    json.dumps(value).map(Value::from)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate::new(
            source,
            vec![
                ("bos_token".into(), "<s>".into()),
                ("eos_token".into(), "</s>".into()),
            ],
        )
        .unwrap()
    }

    fn chat(messages: &str) -> Chat {
        Chat {
            messages: serde_json::from_str(messages).unwrap(),
            tools: Value::from(()),
            documents: Value::from(()),
            add_generation_prompt: true,
            continue_final_message: false,
            kwargs: Vec::new(),
        }
    }

    fn render(source: &str, chat: Chat) -> Result<String, Error> {
        template(source).render(chat)
    }

    // Each expected string is what jinja2 3.1.6 renders with transformers 5.19's environment
    // (`transformers.utils.chat_template_utils._compile_jinja_template(src).render(...)`).
    #[test]
    fn it_renders_as_hf_environment_does() {
        let user = r#"[{"role": "user", "content": "hi"}]"#;
        // trim_blocks and lstrip_blocks.
        assert_eq!(
            render(
                "{{ bos_token }}\n  {% for m in messages %}\n[{{ m.role }}] {{ m.content }}\n  {% endfor %}\n",
                chat(user)
            )
            .unwrap(),
            "<s>\n[user] hi\n"
        );
        // Python's spelling of values.
        assert_eq!(
            render(
                "{{ none }} {{ true }} {{ 1.0 }} {{ {'a': [1, none]} }} {{ x }}|{{ 7 | string }}",
                chat(user)
            )
            .unwrap(),
            "None True 1.0 {'a': [1, None]} |7"
        );
        // HF's tojson: spaces after separators, no HTML escaping, its options.
        assert_eq!(
            render(
                "{{ {'a': '<&>', 'b': [1, 2]} | tojson }} {{ {'b': 1, 'a': 2} | tojson(indent=2, sort_keys=true) }} {{ [1, 2] | tojson(separators=(',', ':')) }}",
                chat(user)
            )
            .unwrap(),
            "{\"a\": \"<&>\", \"b\": [1, 2]} {\n  \"a\": 2,\n  \"b\": 1\n} [1,2]"
        );
        // Python's string and dict methods, loop controls, namespaces.
        assert_eq!(
            render(
                "{% set ns = namespace(n=0) %}{% for k, v in {'a': ' x '}.items() %}{{ k.upper() }}{{ v.strip() }}{% set ns.n = ns.n + 1 %}{% endfor %}{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}{{ ns.n }}{{ 'abc'.startswith('a') }}",
                chat(user)
            )
            .unwrap(),
            "Ax11True"
        );
        // Jinja2's tests: None is not iterable (so the `length` is never reached), a string
        // and a dict are sequences, a bool is a number.
        assert_eq!(
            render(
                "{% if tools is iterable and tools | length > 0 %}t{% endif %}{{ none is iterable }} {{ x is iterable }} {{ 'ab' is sequence }} {{ {} is sequence }} {{ 1 is sequence }} {{ true is number }} {{ true is integer }}",
                chat(user)
            )
            .unwrap(),
            "False True True True False True False"
        );
        // HF's {% generation %} tag prints its body.
        assert_eq!(
            render("{% generation %}g{% endgeneration %}", chat(user)).unwrap(),
            "g"
        );
    }

    #[test]
    fn raise_exception_refuses_the_conversation() {
        let err = render(
            "{% if messages[0].role != 'system' %}{{ raise_exception('System first') }}{% endif %}",
            chat(r#"[{"role": "user", "content": "hi"}]"#),
        )
        .unwrap_err();
        assert!(err.to_string().contains("System first"), "{err}");
    }

    #[test]
    fn kwargs_override_the_special_tokens() {
        let mut c = chat(r#"[{"role": "user", "content": "hi"}]"#);
        c.kwargs = vec![
            ("bos_token".into(), Value::from("B")),
            ("enable_thinking".into(), Value::from(false)),
        ];
        assert_eq!(
            render("{{ bos_token }}{{ eos_token }}{{ enable_thinking }}", c).unwrap(),
            "B</s>False"
        );
    }

    #[test]
    fn an_empty_conversation_is_refused() {
        assert!(render("x", chat("[]")).is_err());
    }

    // transformers 5.19: render_jinja_template(..., continue_final_message=True) gives
    // "<|user|>hi<|assistant|>The answer is" for both (trim_blocks eats the "\n").
    #[test]
    fn continue_final_message_cuts_after_the_final_text() {
        let src = "{% for m in messages %}<|{{ m.role }}|>{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
        let mut c = chat(
            r#"[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}]"#,
        );
        c.add_generation_prompt = false;
        c.continue_final_message = true;
        assert_eq!(
            render(src, c).unwrap(),
            "<|user|>hi<|assistant|>The answer is"
        );
        let mut c = chat(
            r#"[{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "The answer is"}]}]"#,
        );
        c.add_generation_prompt = false;
        c.continue_final_message = true;
        assert_eq!(
            render(src, c).unwrap(),
            "<|user|>hi<|assistant|>The answer is"
        );
        // With add_generation_prompt too, HF refuses.
        let mut c = chat(r#"[{"role": "assistant", "content": "x"}]"#);
        c.continue_final_message = true;
        assert!(render(src, c).is_err());
    }
}
