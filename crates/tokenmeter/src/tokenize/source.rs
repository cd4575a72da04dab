//! What the engine reads from a chat template's source before it renders it: whether message
//! content goes in as a string or as a list of parts, and whether the template knows the
//! `developer` role. Also the one rewrite MiniJinja needs to compile HF's templates.
//!
//! vLLM (`renderers/hf.py`, `_detect_content_format`) walks the Jinja2 syntax tree: a template
//! with a `for` loop over a message's `content` (`for part in message['content']`, or over a
//! name `content` outside a macro, or over a macro parameter a message's content is passed to)
//! takes content as OpenAI's list of parts (`"openai"`); any other takes one string per message
//! (`"string"`: text parts joined by newlines). MiniJinja has no public syntax tree, so the
//! same rules are applied here to the text of the template's `{% %}` tags, which is where every
//! one of those constructs is. It reads expressions loosely (no operator precedence beyond
//! filters, tests and slices), as vLLM's rules do.

/// How message content is handed to the template (vLLM's `ChatTemplateContentFormat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContentFormat {
    /// One string per message; a list of text parts is joined by `"\n"`.
    String,
    /// A list of parts per message, `{"type": "text", "text": ...}`; a string becomes one part.
    OpenAi,
}

/// A `{% ... %}` tag: its statement, without the delimiters and whitespace control.
struct Tag<'a> {
    statement: &'a str,
}

/// The tags of a template, in order. Comments (`{# #}`) are skipped; a `{% raw %}` block's
/// contents are read as tags too, which no template has.
fn tags(source: &str) -> Vec<Tag<'_>> {
    let mut out = Vec::new();
    let mut rest = source;
    loop {
        let comment = rest.find("{#");
        let Some(open) = rest.find("{%") else { break };
        if let Some(c) = comment.filter(|&c| c < open) {
            match rest[c..].find("#}") {
                Some(end) => {
                    rest = &rest[c + end + 2..];
                    continue;
                }
                None => break,
            }
        }
        let inner = &rest[open + 2..];
        let Some(close) = inner.find("%}") else { break };
        let statement = inner[..close]
            .trim_start_matches(['-', '+'])
            .trim_end_matches(['-', '+'])
            .trim();
        out.push(Tag { statement });
        rest = &inner[close + 2..];
    }
    out
}

/// The source with HF's `{% generation %}` and `{% endgeneration %}` tags (its
/// `AssistantTracker` extension, which marks the assistant's tokens for training and prints its
/// body unchanged) replaced by `{% if true %}` and `{% endif %}`, which print the same and keep
/// the tags' whitespace control; MiniJinja has no such tag and would refuse the template.
pub(crate) fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        let inner = &rest[open + 2..];
        let Some(close) = inner.find("%}") else { break };
        let tag = &inner[..close];
        let word = tag.trim_matches(['-', '+']).trim();
        out.push_str(&rest[..open + 2]);
        match word {
            "generation" => out.push_str(&tag.replacen("generation", "if true", 1)),
            "endgeneration" => out.push_str(&tag.replacen("endgeneration", "endif", 1)),
            _ => out.push_str(tag),
        }
        out.push_str("%}");
        rest = &inner[close + 2..];
    }
    out.push_str(rest);
    out
}

/// Whether the template names the `developer` role; if not, the engine turns developer
/// messages into system ones (vLLM's `_detect_developer_role_support`, the same test).
pub(crate) fn knows_developer_role(source: &str) -> bool {
    source.contains("\"developer\"") || source.contains("'developer'")
}

/// The content format vLLM detects for this template (see the module doc).
pub(crate) fn content_format(source: &str) -> ContentFormat {
    let tags = tags(source);

    // The names that hold the messages: `messages`, and what is set from it (`set loop_messages
    // = messages[1:]`), transitively.
    let mut message_lists = vec!["messages".to_owned()];
    let mut i = 0;
    while i < message_lists.len() {
        let list = message_lists[i].clone();
        for tag in &tags {
            if let Some((name, value)) = assignment(tag.statement) {
                if access(value, &list, None) && !message_lists.iter().any(|n| n == name) {
                    message_lists.push(name.to_owned());
                }
            }
        }
        i += 1;
    }

    // The loop variables that hold one message: `for message in messages`.
    let mut messages = Vec::new();
    for tag in &tags {
        if let Some((target, iter)) = for_loop(tag.statement) {
            if message_lists.iter().any(|list| access(iter, list, None)) {
                messages.push(target.to_owned());
            }
        }
    }
    let content_of_a_message = |expr: &str| {
        messages
            .iter()
            .any(|message| access(expr, message, Some("content")))
    };

    // Each loop, with the parameters of the macro it is in that a message's content is passed
    // to; `None` outside a macro.
    let mut macro_stack: Vec<Vec<String>> = Vec::new();
    for tag in &tags {
        let (keyword, rest) = split_keyword(tag.statement);
        match keyword {
            "macro" => {
                let (name, params) = macro_signature(rest);
                macro_stack.push(content_params(source, name, &params, &content_of_a_message));
            }
            "endmacro" => {
                macro_stack.pop();
            }
            "for" => {
                let Some((_, iter)) = for_loop(tag.statement) else {
                    continue;
                };
                if content_of_a_message(iter) {
                    return ContentFormat::OpenAi;
                }
                match macro_stack.last() {
                    Some(params) => {
                        if is_identifier(iter) && params.iter().any(|p| p == iter) {
                            return ContentFormat::OpenAi;
                        }
                    }
                    None => {
                        if iter == "content" {
                            return ContentFormat::OpenAi;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    ContentFormat::String
}

/// The first word of a statement and the rest.
fn split_keyword(statement: &str) -> (&str, &str) {
    match statement.find(|c: char| c.is_whitespace() || c == '(') {
        Some(i) => (&statement[..i], statement[i..].trim()),
        None => (statement, ""),
    }
}

/// `set NAME = VALUE`: the name and the value (not `set ns.x = ...`, not a block `set`).
fn assignment(statement: &str) -> Option<(&str, &str)> {
    let (keyword, rest) = split_keyword(statement);
    if keyword != "set" {
        return None;
    }
    let eq = top_level_find(rest, "=")?;
    let name = rest[..eq].trim();
    let value = rest[eq + 1..].trim();
    (is_identifier(name) && !value.starts_with('=')).then_some((name, value))
}

/// `for TARGET in ITER [if COND] [recursive]`: a single-name target and the iterated expression.
fn for_loop(statement: &str) -> Option<(&str, &str)> {
    let (keyword, rest) = split_keyword(statement);
    if keyword != "for" {
        return None;
    }
    let at = top_level_find(rest, " in ")?;
    let target = rest[..at].trim();
    let mut iter = rest[at + 4..].trim();
    if let Some(cond) = top_level_find(iter, " if ") {
        iter = iter[..cond].trim();
    }
    if let Some(stripped) = iter.strip_suffix("recursive") {
        iter = stripped.trim_end();
    }
    is_identifier(target).then_some((target, iter))
}

/// `macro NAME(a, b=1)`: the name and the parameter names.
fn macro_signature(rest: &str) -> (&str, Vec<String>) {
    let Some(open) = rest.find('(') else {
        return (rest.trim(), Vec::new());
    };
    let name = rest[..open].trim();
    let close = rest.rfind(')').unwrap_or(rest.len());
    let params = split_top_level(&rest[open + 1..close.max(open + 1)], ',')
        .into_iter()
        .filter_map(|param| {
            let name = param.split('=').next().unwrap_or("").trim();
            is_identifier(name).then(|| name.to_owned())
        })
        .collect();
    (name, params)
}

/// The parameters of macro `name` that some call passes a message's content to, by position
/// (`render(message.content)`) or by keyword (`render(content=message['content'])`).
fn content_params(
    source: &str,
    name: &str,
    params: &[String],
    content_of_a_message: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    if name.is_empty() {
        return out;
    }
    let mut from = 0;
    while let Some(found) = source[from..].find(name) {
        let start = from + found;
        from = start + name.len();
        let before = source[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            continue;
        }
        let after = source[from..].trim_start();
        if !after.starts_with('(') {
            continue;
        }
        let args_start = source.len() - after.len() + 1;
        let Some(args_len) = group_len(&source[args_start..]) else {
            continue;
        };
        for (i, arg) in split_top_level(&source[args_start..args_start + args_len], ',')
            .into_iter()
            .enumerate()
        {
            let (param, value) = match keyword_argument(arg) {
                Some((key, value)) => (params.iter().find(|p| *p == key), value),
                None => (params.get(i), arg),
            };
            if let Some(param) = param {
                if content_of_a_message(value) && !out.contains(param) {
                    out.push(param.clone());
                }
            }
        }
    }
    out
}

/// `key=value` (not `a == b`).
fn keyword_argument(arg: &str) -> Option<(&str, &str)> {
    let eq = top_level_find(arg, "=")?;
    let key = arg[..eq].trim();
    let value = &arg[eq + 1..];
    (is_identifier(key) && !value.starts_with('=')).then(|| (key, value.trim()))
}

/// vLLM's `_is_var_or_elems_access`: `expr` is `var` (or, with a key, `var['key']`,
/// `var["key"]`, `var.key`), possibly filtered (`| reverse`), tested (`is defined`) or sliced
/// (`[1:]`).
fn access(expr: &str, var: &str, key: Option<&str>) -> bool {
    let mut expr = expr.trim();
    if let Some(pipe) = top_level_find(expr, "|") {
        expr = expr[..pipe].trim();
    }
    if let Some(test) = top_level_find(expr, " is ") {
        expr = expr[..test].trim();
    }
    if let Some(head) = without_slice(expr) {
        return access(head, var, key);
    }
    match key {
        None => expr == var,
        Some(key) => {
            let Some(rest) = expr.strip_prefix(var) else {
                return false;
            };
            let rest = rest.trim_start();
            if let Some(attr) = rest.strip_prefix('.') {
                return attr.trim() == key;
            }
            let Some(inner) = rest.strip_prefix('[').and_then(|r| r.strip_suffix(']')) else {
                return false;
            };
            let inner = inner.trim();
            inner.len() == key.len() + 2
                && (inner.starts_with('\'') && inner.ends_with('\'')
                    || inner.starts_with('"') && inner.ends_with('"'))
                && &inner[1..inner.len() - 1] == key
        }
    }
}

/// `x[a:b]` -> `x`: a trailing subscript with a top-level colon.
fn without_slice(expr: &str) -> Option<&str> {
    let body = expr.strip_suffix(']')?;
    let open = matching_open(body)?;
    let inside = &body[open + 1..];
    top_level_find(inside, ":")?;
    Some(body[..open].trim_end())
}

/// Where the `[` that the stripped `]` closes is.
fn matching_open(body: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in body.char_indices().rev() {
        match c {
            ']' | ')' | '}' => depth += 1,
            '[' | '(' | '{' => {
                if depth == 0 {
                    return (c == '[').then_some(i);
                }
                depth -= 1;
            }
            _ => {}
        }
    }
    None
}

/// The length of the argument list after an opening bracket, up to its closing one.
fn group_len(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => {
                if depth == 0 {
                    return Some(i);
                }
                depth -= 1;
            }
            _ => {}
        }
    }
    None
}

/// The first occurrence of `needle` outside brackets and string literals.
fn top_level_find(s: &str, needle: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            (None, _) if depth == 0 && s[i..].starts_with(needle) => return Some(i),
            _ => {}
        }
    }
    None
}

/// `s` split at top-level `sep`, each piece trimmed; nothing for a blank `s`.
fn split_top_level(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    let sep = sep.to_string();
    while let Some(i) = top_level_find(rest, &sep) {
        out.push(rest[..i].trim());
        rest = &rest[i + 1..];
    }
    if !rest.trim().is_empty() || !out.is_empty() {
        out.push(rest.trim());
    }
    out
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each template's format here is what vLLM 0.32's `_detect_content_format` returns for it.

    #[test]
    fn a_template_that_prints_content_takes_strings() {
        // The e2e model's template.
        let chatml = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}{% if m['content'] is string %}{{ m['content'] }}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}";
        assert_eq!(content_format(chatml), ContentFormat::String);
        assert_eq!(
            content_format("{{ messages[0].content }}"),
            ContentFormat::String
        );
    }

    #[test]
    fn a_template_that_loops_over_content_takes_parts() {
        for source in [
            // Llama 3.2 Vision's shape.
            "{% for message in messages %}{% for item in message['content'] %}{{ item.text }}{% endfor %}{% endfor %}",
            "{%- for message in messages -%}{%- for c in message.content | selectattr('type') if c -%}x{%- endfor -%}{%- endfor -%}",
            // Through a list set from `messages`, sliced.
            "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for p in m[\"content\"] %}{% endfor %}{% endfor %}",
            // A name `content` outside a macro.
            "{% for message in messages %}{% set content = message.content %}{% for p in content %}{% endfor %}{% endfor %}",
            // Qwen3-VL's shape: a macro given the content.
            "{% macro render_content(content, do_vision_count) %}{% for item in content %}{% endfor %}{% endmacro %}{% for message in messages %}{{ render_content(message.content, True) }}{% endfor %}",
            "{% macro r(x) %}{% for item in x %}{% endfor %}{% endmacro %}{% for message in messages %}{{ r(x=message['content']) }}{% endfor %}",
        ] {
            assert_eq!(content_format(source), ContentFormat::OpenAi, "{source}");
        }
    }

    #[test]
    fn loops_over_other_things_do_not_count() {
        for source in [
            "{% for tool in tools %}{{ tool | tojson }}{% endfor %}",
            // A macro looping over a parameter no message's content is passed to.
            "{% macro r(content) %}{% for x in content %}{% endfor %}{% endmacro %}{% for message in messages %}{{ r(tools) }}{% endfor %}",
            "{# {% for p in message.content %} #}{% for message in messages %}{% endfor %}",
            "{% for message in messages %}{% for call in message.tool_calls %}{% endfor %}{% endfor %}",
        ] {
            assert_eq!(content_format(source), ContentFormat::String, "{source}");
        }
    }

    #[test]
    fn generation_tags_become_ifs_with_their_whitespace_control() {
        assert_eq!(
            without_generation_tags("a{% generation %}b{%- endgeneration -%}c{{ x }}"),
            "a{% if true %}b{%- endif -%}c{{ x }}"
        );
        assert_eq!(
            without_generation_tags("{% if generation %}"),
            "{% if generation %}"
        );
    }

    #[test]
    fn the_developer_role_is_known_by_its_quoted_name() {
        assert!(knows_developer_role("{% if m.role == 'developer' %}"));
        assert!(!knows_developer_role("{{ developer }}"));
    }
}
