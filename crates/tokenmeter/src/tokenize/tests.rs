//! The module's tests, against a tiny tokenizer whose counts can be worked out by hand: a
//! word-level model behind a whitespace pre-tokenizer (`\w+|[^\w\s]+`: each word and each run
//! of punctuation is one token, unknown ones `[UNK]`), the special tokens `<s>`, `</s>`,
//! `<|im_start|>` and `<|im_end|>`, and `<s>` added in front when special tokens are asked
//! for.
//!
//! Expected rendered strings and counts come from transformers 5.19 and jinja2 3.1.6 (the e2e
//! venv's, `/opt/tokenmeter-e2e/vllm/bin/python`): the same tokenizer built with the Python
//! `tokenizers` package, saved with the same `tokenizer_config.json`, loaded with
//! `AutoTokenizer.from_pretrained`, and `apply_chat_template(messages, tokenize=False, ...)`
//! then `len(tok(text, add_special_tokens=False)["input_ids"])`, with the messages and tools as
//! vLLM 0.32 reshapes them. The chat and completion counts were also read back from vLLM 0.32's
//! own usage, serving this tokenizer (all but the tool-call turn's, which is transformers' with
//! vLLM's `parse_chat_messages` reshaping), and so were which requests it refuses.

#![allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job

use std::path::Path;

use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

use super::*;

const VOCAB: [&str; 15] = [
    "[UNK]",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "user",
    "assistant",
    "system",
    "hello",
    "world",
    "how",
    "are",
    "you",
    "hi",
    "there",
];

/// The e2e model's template (CHAT_TEMPLATE in tests/e2e/make_model.py).
const CHATML: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}{% if m['content'] is string %}{{ m['content'] }}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Qwen2.5's shape: the tools as JSON lines in the system message, tool calls and responses.
const QWEN: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

/// Writes the tiny tokenizer's `tokenizer.json` into `dir`.
fn write_tokenizer_json(dir: &Path) {
    let model = WordLevel::builder()
        .vocab(
            VOCAB
                .iter()
                .enumerate()
                .map(|(i, w)| ((*w).to_owned(), i as u32))
                .collect(),
        )
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(Whitespace {}));
    let special: Vec<AddedToken> = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    tok.add_special_tokens(&special);
    tok.with_post_processor(Some(
        TemplateProcessing::builder()
            .try_single("<s> $A")
            .unwrap()
            .try_pair("<s> $A <s> $B")
            .unwrap()
            .special_tokens(vec![("<s>", 1)])
            .build()
            .unwrap(),
    ));
    tok.save(dir.join("tokenizer.json"), false).unwrap();
}

/// The config beside it: the special tokens (one as HF writes an AddedToken), and a template.
fn config(template: Option<&str>) -> String {
    let mut config = serde_json::json!({
        "tokenizer_class": "TokenizersBackend",
        "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": false,
                      "rstrip": false, "normalized": false, "single_word": false, "special": true},
        "unk_token": "[UNK]",
        "pad_token": "</s>",
    });
    if let Some(template) = template {
        config["chat_template"] = template.into();
    }
    config.to_string()
}

/// A model directory with the tiny tokenizer and `template` in its config.
fn model_dir(template: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer_json(dir.path());
    std::fs::write(dir.path().join("tokenizer_config.json"), config(template)).unwrap();
    dir
}

fn load_dir(dir: &Path) -> Arc<Tokenizer> {
    let tokenizers = Tokenizers::load(&[dir.display().to_string()]).unwrap();
    tokenizers.for_model(None).unwrap().clone()
}

fn tokenizer(template: Option<&str>) -> Arc<Tokenizer> {
    let dir = model_dir(template);
    load_dir(dir.path())
}

fn exact(tokens: u64) -> Option<Count> {
    Some(Count {
        tokens,
        exact: true,
    })
}

fn chat(tok: &Tokenizer, body: serde_json::Value) -> Option<Count> {
    tok.prompt_tokens("/v1/chat/completions", body.to_string().as_bytes())
}

fn completion(tok: &Tokenizer, body: serde_json::Value) -> Option<Count> {
    tok.prompt_tokens("/v1/completions", body.to_string().as_bytes())
}

/// A request's tools as the template gets them.
fn prompt_tools(request: &minijinja::Value) -> minijinja::Value {
    prompt::normalize_tools(&request.get_attr("tools").unwrap()).unwrap()
}

/// The text a template renders for a request, through the same steps as a count.
fn rendered(tok: &Tokenizer, body: &str) -> String {
    let request: minijinja::Value = serde_json::from_str(body).unwrap();
    let templates = prompt::Templates {
        default: tok.template.as_ref(),
        tool_use: tok.tool_template.as_ref(),
    };
    prompt::chat_text(&templates, &request).unwrap().0
}

#[test]
fn chatml_single_user_message() {
    let tok = tokenizer(Some(CHATML));
    let body =
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hello world"}]});
    assert_eq!(
        rendered(&tok, &body.to_string()),
        "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    );
    // <|im_start|> user hello world <|im_end|> <|im_start|> assistant
    assert_eq!(chat(&tok, body), exact(7));
    // Without the generation prompt, the last two are gone.
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello world"}],
                                  "add_generation_prompt": false});
    assert_eq!(chat(&tok, body), exact(5));
}

#[test]
fn chatml_multi_turn_with_a_system_message() {
    let tok = tokenizer(Some(CHATML));
    let body = serde_json::json!({"messages": [
        {"role": "system", "content": "You are a helpful bot."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there!"},
        {"role": "user", "content": "how are you?"},
    ]});
    assert_eq!(
        rendered(&tok, &body.to_string()),
        "<|im_start|>system\nYou are a helpful bot.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n\
         <|im_start|>assistant\nhi there!<|im_end|>\n<|im_start|>user\nhow are you?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // system 1+1+6+1, user 1+1+1+1, assistant 1+1+3+1, user 1+1+4+1, prompt 2.
    assert_eq!(chat(&tok, body), exact(28));
}

#[test]
fn a_list_of_text_parts_is_joined_by_newlines_for_a_string_template() {
    let tok = tokenizer(Some(CHATML));
    let body = serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]}]});
    assert_eq!(
        rendered(&tok, &body.to_string()),
        "<|im_start|>user\nhello\nworld<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(chat(&tok, body), exact(7));
    // Absent content is an empty string (the template tests `is string`); null is refused but
    // for an assistant message; a null text part is skipped; a bare string part is refused.
    let body = serde_json::json!({"messages": [{"role": "user"}]});
    assert_eq!(chat(&tok, body), exact(5));
    let body = serde_json::json!({"messages": [{"role": "user", "content": null}]});
    assert_eq!(chat(&tok, body), None);
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello"},
                                               {"role": "assistant", "content": null}]});
    assert_eq!(chat(&tok, body), exact(9));
    let body = serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": null}, {"type": "text", "text": "hello"}]}]});
    assert_eq!(chat(&tok, body), exact(6));
    let body = serde_json::json!({"messages": [{"role": "user", "content": ["hello"]}]});
    assert_eq!(chat(&tok, body), None);
}

#[test]
fn a_template_that_loops_over_content_gets_parts_even_for_a_string() {
    // vLLM detects the loop over `m['content']` and hands every message's content as a list of
    // parts, a string as one; a tool message's text parts are joined back into a string.
    let template = "{% for m in messages %}<{{ m['role'] }}>{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}{% endif %}{% endfor %}";
    let tok = tokenizer(Some(template));
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello world"},
                                               {"role": "tool", "content": "hi there"}]});
    assert_eq!(
        rendered(&tok, &body.to_string()),
        "<user>[hello world]<tool>hi there"
    );
    // < user >[ hello world ]< tool > hi there
    assert_eq!(chat(&tok, body), exact(10));
    let body = serde_json::json!({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]},
        {"role": "tool", "content": [{"type": "text", "text": "hi there"}]}]});
    assert_eq!(
        rendered(&tok, &body.to_string()),
        "<user>[hello][world]<tool>hi there"
    );
    assert_eq!(chat(&tok, body), exact(11));
}

#[test]
fn a_system_message_loses_claude_codes_billing_header_line() {
    let tok = tokenizer(Some(CHATML));
    let body = serde_json::json!({"messages": [
        {"role": "system", "content": "x-anthropic-billing-header: cch=1\nhow are you"},
        {"role": "user", "content": "hello"}]});
    // system: <|im_start|> system how are you <|im_end|>; user 4; prompt 2.
    assert_eq!(chat(&tok, body), exact(12));
}

#[test]
fn a_media_part_makes_the_count_inexact() {
    let tok = tokenizer(Some(CHATML));
    let body = serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hello"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]});
    assert_eq!(
        chat(&tok, body),
        Some(Count {
            tokens: 6,
            exact: false
        })
    );
}

#[test]
fn tools_render_through_tojson_as_python_json_dumps() {
    let tok = tokenizer(Some(QWEN));
    // The function's keys in another order, no description: vLLM dumps its model of the tool,
    // name, description (null), parameters; the parameters keep the request's order. (Raw
    // JSON: serde_json's `json!` would sort the keys.)
    let body = r#"{"messages": [{"role": "user", "content": "hello"}], "tools": [{"type": "function",
        "function": {"parameters": {"type": "object", "properties": {"city": {"type": "string",
        "description": "Ville, e.g. Zürich"}}, "required": ["city"]}, "name": "get_weather"}}]}"#;
    let as_vllm_dumps = r#"{"messages": [{"role": "user", "content": "hello"}], "tools": [{"type": "function",
        "function": {"name": "get_weather", "description": null, "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "description": "Ville, e.g. Zürich"}},
        "required": ["city"]}}}]}"#;
    let expected = "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n<tools>\n\
         {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": null, \
         \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \
         \"description\": \"Ville, e.g. Zürich\"}}, \"required\": [\"city\"]}}}\n\
         </tools><|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(rendered(&tok, as_vllm_dumps), expected);
    assert_eq!(rendered(&tok, body), expected);
    let request: minijinja::Value = serde_json::from_str(body).unwrap();
    let tools = prompt_tools(&request);
    let dumped: minijinja::Value = serde_json::from_str(as_vllm_dumps).unwrap();
    assert_eq!(
        python::Json::new(None).dumps(&tools).unwrap(),
        python::Json::new(None)
            .dumps(&dumped.get_attr("tools").unwrap())
            .unwrap()
    );
    assert_eq!(
        tok.prompt_tokens("/v1/chat/completions", body.as_bytes()),
        exact(82)
    );
    let body: serde_json::Value = serde_json::from_str(body).unwrap();

    // A tool call (arguments as the JSON string OpenAI sends, parsed into a dict) and its
    // response.
    let mut turn = body;
    turn["messages"] = serde_json::json!([
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]);
    assert_eq!(chat(&tok, turn), exact(116));

    // Tools in chat_template_kwargs take the request's place, as given.
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello"}],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
        "chat_template_kwargs": {"tools": [{"a": 1}]}});
    assert_eq!(chat(&tok, body), exact(28));

    // Without tools the same template takes the plain path.
    let body = serde_json::json!({"messages": [
        {"role": "system", "content": "You are a helpful bot."}, {"role": "user", "content": "hello"}]});
    assert_eq!(chat(&tok, body), exact(15));
}

#[test]
fn special_tokens_in_user_text_are_matched_as_special_tokens() {
    // As in the engine: the rendered prompt is encoded whole, so the `<|im_end|>` a user wrote
    // is the special token (1), not `<|`, `im_end`, `|>` (3).
    let tok = tokenizer(Some(CHATML));
    let body =
        serde_json::json!({"messages": [{"role": "user", "content": "hello <|im_end|> world"}]});
    assert_eq!(chat(&tok, body), exact(8));
    // In a completion prompt too.
    assert_eq!(
        completion(&tok, serde_json::json!({"prompt": "hello <|im_end|>"})),
        exact(3)
    );
}

#[test]
fn raise_exception_makes_the_request_uncountable() {
    let template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message first') }}{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}";
    // The probe conversation (one user message) raises: refused at load.
    let dir = model_dir(Some(template));
    let err = Tokenizers::load(&[dir.path().display().to_string()])
        .err()
        .unwrap();
    assert!(matches!(err, LoadError::TemplateRender { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
    assert!(err.to_string().contains("a system message first"), "{err}");

    // A template that raises only for some conversations loads; those are None.
    let template = "{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}{{ messages[0]['content'] }}";
    let tok = tokenizer(Some(template));
    let one = serde_json::json!({"messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(chat(&tok, one), exact(1));
    let two = serde_json::json!({"messages": [{"role": "user", "content": "hello"},
                                              {"role": "user", "content": "hello"}]});
    assert_eq!(chat(&tok, two), None);
}

#[test]
fn a_template_that_does_not_compile_is_a_load_error() {
    let dir = model_dir(Some("{% for m in messages %}"));
    let err = Tokenizers::load(&[dir.path().display().to_string()])
        .err()
        .unwrap();
    assert!(matches!(err, LoadError::TemplateSyntax { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
}

#[test]
fn chat_template_jinja_wins_and_a_tokenizer_json_path_finds_its_neighbours() {
    let dir = model_dir(Some("{{ 'from the config' }}"));
    std::fs::write(dir.path().join("chat_template.jinja"), CHATML).unwrap();
    // Given the file, not the directory.
    let tok = load_dir(&dir.path().join("tokenizer.json"));
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello world"}]});
    assert_eq!(chat(&tok, body), exact(7));
}

#[test]
fn template_files_replace_the_configs_templates() {
    let dir = model_dir(Some("{{ 'from the config' }}"));
    let extra = dir.path().join("additional_chat_templates");
    std::fs::create_dir(&extra).unwrap();
    std::fs::write(extra.join("tool_use.jinja"), "{{ tools | length }} tools").unwrap();
    let tok = load_dir(dir.path());
    // Only a tool_use file: requests without tools have no template.
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(chat(&tok, body.clone()), None);
    let mut with_tools = body;
    with_tools["tools"] = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
    assert_eq!(chat(&tok, with_tools), exact(2));
}

#[test]
fn a_named_template_list_takes_default_and_tool_use_for_tools() {
    let list = serde_json::json!([
        {"name": "default", "template": "{{ messages[0]['content'] }}"},
        {"name": "tool_use", "template": "{{ messages[0]['content'] }} {{ tools | length }} tools"},
    ]);
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer_json(dir.path());
    let mut config: serde_json::Value = serde_json::from_str(&config(None)).unwrap();
    config["chat_template"] = list;
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let tok = load_dir(dir.path());
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(chat(&tok, body.clone()), exact(1));
    let mut with_tools = body;
    with_tools["tools"] = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
    // hello 1 tools
    assert_eq!(chat(&tok, with_tools), exact(3));
}

#[test]
fn chat_template_kwargs_and_the_engine_extras_reach_the_template() {
    let template = "{{ messages[0]['content'] }}{% if enable_thinking %} think{% endif %}{% if extra is defined %} {{ extra }}{% endif %}{{ ' ' + bos_token }}";
    let tok = tokenizer(Some(template));
    let base = serde_json::json!({"messages": [{"role": "user", "content": "hello"}]});
    // hello <s>
    assert_eq!(chat(&tok, base.clone()), exact(2));
    let mut body = base.clone();
    body["chat_template_kwargs"] = serde_json::json!({"enable_thinking": true, "extra": "world"});
    // hello think world <s>
    assert_eq!(chat(&tok, body), exact(4));
    // vLLM sets enable_thinking from reasoning_effort, unless the kwargs say.
    let mut body = base.clone();
    body["reasoning_effort"] = "low".into();
    assert_eq!(chat(&tok, body), exact(3));
    let mut body = base.clone();
    body["reasoning_effort"] = "none".into();
    assert_eq!(chat(&tok, body), exact(2));
    // A kwarg that overrides a special token.
    let mut body = base.clone();
    body["chat_template_kwargs"] = serde_json::json!({"bos_token": "hi there"});
    assert_eq!(chat(&tok, body), exact(3));
    // Kwargs that change nothing counted.
    let mut body = base.clone();
    body["chat_template_kwargs"] = serde_json::json!({"tokenize": false, "chat_template": "x"});
    assert_eq!(chat(&tok, body), exact(2));
    // Kwargs the engine refuses, and a request's own template.
    for refused in [
        serde_json::json!({"chat_template_kwargs": {"messages": []}}),
        serde_json::json!({"chat_template_kwargs": "yes"}),
        serde_json::json!({"chat_template": "{{ 'x' }}"}),
        serde_json::json!({"add_generation_prompt": "yes"}),
        serde_json::json!({"continue_final_message": true}),
    ] {
        let mut body = base.clone();
        for (k, v) in refused.as_object().unwrap() {
            body[k] = v.clone();
        }
        assert_eq!(chat(&tok, body.clone()), None, "{body}");
    }
}

#[test]
fn continue_final_message_leaves_the_last_message_open() {
    let tok = tokenizer(Some(CHATML));
    let body = serde_json::json!({"messages": [
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}],
        "add_generation_prompt": false, "continue_final_message": true});
    // <|im_start|> user hello <|im_end|> <|im_start|> assistant hi there
    assert_eq!(chat(&tok, body), exact(8));
}

#[test]
fn developer_messages_become_system_for_a_template_without_the_role() {
    let tok = tokenizer(Some(CHATML));
    let body = serde_json::json!({"messages": [
        {"role": "user", "content": "hello"}, {"role": "developer", "content": "how are you"}]});
    // One merged system message first: <|im_start|> system how are you <|im_end|>, then the
    // user's 4 and the prompt's 2.
    assert_eq!(chat(&tok, body), exact(12));
}

#[test]
fn completions_prompt_shapes() {
    let tok = tokenizer(Some(CHATML));
    // <s> hello world
    assert_eq!(
        completion(&tok, serde_json::json!({"prompt": "hello world"})),
        exact(3)
    );
    assert_eq!(
        completion(
            &tok,
            serde_json::json!({"prompt": "hello world", "add_special_tokens": false})
        ),
        exact(2)
    );
    // Each prompt of a list gets its own <s>: 2 + 3.
    assert_eq!(
        completion(
            &tok,
            serde_json::json!({"prompt": ["hello", "hello world"]})
        ),
        exact(5)
    );
    assert_eq!(
        completion(&tok, serde_json::json!({"prompt": [8, 9, 10]})),
        exact(3)
    );
    assert_eq!(
        completion(&tok, serde_json::json!({"prompt": [[8, 9], [10]]})),
        exact(3)
    );
    // Truncation keeps at most that many of each prompt.
    assert_eq!(
        completion(
            &tok,
            serde_json::json!({"prompt": ["hello", "hello world"], "truncate_prompt_tokens": 2})
        ),
        exact(4)
    );
    // The path without /v1 is the same API.
    assert_eq!(
        tok.prompt_tokens("/completions", br#"{"prompt": "hello"}"#),
        exact(2)
    );
    for bad in [
        serde_json::json!({}),
        serde_json::json!({"prompt": []}),
        serde_json::json!({"prompt": [1, "a"]}),
        serde_json::json!({"prompt": [[]]}),
        serde_json::json!({"prompt": {"text": "x"}}),
        serde_json::json!({"prompt": "x", "add_special_tokens": 1}),
    ] {
        assert_eq!(completion(&tok, bad.clone()), None, "{bad}");
    }
}

#[test]
fn hostile_bodies_are_none_or_estimated() {
    let tok = tokenizer(Some(CHATML));
    // Not JSON, invalid UTF-8 (raw, and inside a string), the wrong shape.
    for body in [
        &b"not json"[..],
        b"\xff\xfe{}",
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}",
        br#"{"messages": "hello"}"#,
        br#"{"messages": {"role": "user"}}"#,
        br#"{"messages": [{"content": "no role"}]}"#,
        br#"{"messages": [{"role": "user", "content": 7}]}"#,
        br#"{"messages": []}"#,
        br#"[1, 2]"#,
        b"",
    ] {
        assert_eq!(tok.prompt_tokens("/v1/chat/completions", body), None);
    }
    assert_eq!(
        tok.prompt_tokens("/v1/completions", b"{\"prompt\": \"\xc3\x28\"}"),
        None
    );
    // Another API.
    let body = br#"{"messages": [{"role": "user", "content": "hello"}]}"#;
    assert_eq!(tok.prompt_tokens("/v1/embeddings", body), None);
    assert_eq!(tok.prompt_tokens("/v1/chat/completions", body), exact(6));

    // 10 MB of prompt: estimated at 4 bytes a token, never tokenized.
    let big = "hello ".repeat((10 << 20) / 6);
    let started = std::time::Instant::now();
    let chat_count = chat(
        &tok,
        serde_json::json!({"messages": [{"role": "user", "content": big}]}),
    )
    .unwrap();
    let completion_count = completion(&tok, serde_json::json!({"prompt": big})).unwrap();
    assert!(!chat_count.exact && !completion_count.exact);
    assert_eq!(chat_count.tokens, (big.len() as u64).div_ceil(4));
    assert_eq!(completion_count.tokens, (big.len() as u64).div_ceil(4));
    // One pass over the body; generous for a debug build on a loaded machine.
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // A big body of token ids is still counted exactly.
    let ids: Vec<u32> = vec![8; 1 << 20];
    assert_eq!(
        completion(&tok, serde_json::json!({"prompt": ids})),
        exact(1 << 20)
    );
}

#[test]
fn no_body_panics_whatever_its_bytes() {
    let tok = tokenizer(Some(QWEN));
    let bodies = [
        r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": [1, 2.5e300, null]}"}}]}, {"role": "tool", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "chat_template_kwargs": {"x": {"y": [true]}}, "truncate_prompt_tokens": 3}"#,
        r#"{"prompt": [[1, 2], [3]], "add_special_tokens": false, "truncate_prompt_tokens": -1}"#,
    ];
    for body in bodies {
        let bytes = body.as_bytes();
        for path in ["/v1/chat/completions", "/v1/completions"] {
            // Every prefix, and every byte replaced by a few that matter to JSON and UTF-8.
            for end in 0..=bytes.len() {
                tok.prompt_tokens(path, &bytes[..end]);
            }
            for at in 0..bytes.len() {
                for b in [b'"', b'[', b'{', b'}', b'0', b'\\', 0xc3, 0xff] {
                    let mut mutated = bytes.to_vec();
                    mutated[at] = b;
                    tok.prompt_tokens(path, &mutated);
                }
            }
        }
    }
    // Ends that are not ascending, or past the text.
    let out = tok.output_tokens("hello world", &[9, 3, 100, 0]);
    assert_eq!(out.per_event.iter().sum::<u32>(), 2);
}

#[test]
fn chat_without_a_template_is_none_and_completions_still_count() {
    let tok = tokenizer(None);
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(chat(&tok, body), None);
    assert!(!tok.has_chat_template());
    assert_eq!(
        completion(&tok, serde_json::json!({"prompt": "hello"})),
        exact(2)
    );
}

#[test]
fn output_tokens_are_attributed_to_the_event_of_their_last_byte() {
    let tok = tokenizer(None);
    // hello (bytes 0..5) world (6..11) !? (11..13)
    let text = "hello world!?";
    // Events: "hel" | "lo wor" | "" | "ld!" | "?"
    let out = tok.output_tokens(text, &[3, 9, 9, 12, 13]);
    assert_eq!(out.tokens, 3);
    // hello ends in event 1, world in event 3 (split across 1 and 3), "!?" in event 4; the
    // empty event 2 carries nothing.
    assert_eq!(out.per_event, [0, 1, 0, 1, 1]);
    assert!(out.exact);
    // Special tokens in the text are counted as tokens, none added.
    assert_eq!(tok.output_tokens("hi</s>", &[6]).per_event, [2]);
    // No events: the total still counts.
    let out = tok.output_tokens(text, &[]);
    assert_eq!((out.tokens, out.per_event.len()), (3, 0));
    // Text past the last event end is the last event's.
    assert_eq!(tok.output_tokens(text, &[5]).per_event, [3]);
    // Empty text.
    assert_eq!(tok.output_tokens("", &[0, 0]).per_event, [0, 0]);
}

#[test]
fn output_offsets_are_bytes_not_characters() {
    let tok = tokenizer(None);
    // "éé" is 4 bytes and 2 characters: with character offsets its last byte would look like
    // byte 1, in event 0.
    let out = tok.output_tokens("éé x", &[2, 4, 6]);
    assert_eq!(out.per_event, [0, 1, 1]);
}

#[test]
fn output_over_the_limit_is_estimated() {
    let tok = tokenizer(None);
    let text = "a".repeat(MAX_TOKENIZED_BYTES + 2);
    let half = (text.len() / 2) as u32;
    let out = tok.output_tokens(&text, &[half, text.len() as u32]);
    assert!(!out.exact);
    assert_eq!(out.tokens, (text.len() as u64).div_ceil(4));
    assert_eq!(
        out.per_event.iter().map(|&n| u64::from(n)).sum::<u64>(),
        out.tokens
    );
}

#[test]
fn load_errors_name_the_path_and_the_problem() {
    let err = |values: &[&str]| {
        let values: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        Tokenizers::load(&values).err().unwrap().to_string()
    };
    let missing = err(&["/nonexistent/tok"]);
    assert!(
        missing.contains("/nonexistent/tok") && missing.contains("no such file"),
        "{missing}"
    );

    let dir = tempfile::tempdir().unwrap();
    let not_a_tokenizer = dir.path().join("tokenizer.json");
    std::fs::write(&not_a_tokenizer, r#"{"hello": "world"}"#).unwrap();
    let msg = err(&[&not_a_tokenizer.display().to_string()]);
    assert!(
        msg.contains(&not_a_tokenizer.display().to_string())
            && msg.contains("not a tokenizer.json"),
        "{msg}"
    );

    let empty = tempfile::tempdir().unwrap();
    let msg = err(&[&empty.path().display().to_string()]);
    assert!(msg.contains("no tokenizer.json"), "{msg}");

    let bad_config = model_dir(None);
    std::fs::write(bad_config.path().join("tokenizer_config.json"), "{not json").unwrap();
    let msg = err(&[&bad_config.path().display().to_string()]);
    assert!(
        msg.contains("tokenizer_config.json") && msg.contains("not JSON"),
        "{msg}"
    );

    for value in ["=x", "m=", ""] {
        let msg = err(&[value]);
        assert!(
            msg.contains(&format!("{value:?}")) && msg.contains("MODEL=PATH"),
            "{msg}"
        );
    }
    let good = model_dir(None);
    let path = good.path().display().to_string();
    let msg = err(&[&path, &path]);
    assert!(msg.contains("second tokenizer"), "{msg}");
}

#[test]
fn a_model_named_tokenizer_is_chosen_for_its_model_and_the_default_for_the_rest() {
    let plain = model_dir(None);
    let chatml = model_dir(Some(CHATML));
    let tokenizers = Tokenizers::load(&[
        plain.path().display().to_string(),
        format!("tiny-chat={}", chatml.path().display()),
    ])
    .unwrap();
    assert!(!tokenizers.is_empty());
    assert!(tokenizers
        .for_model(Some("tiny-chat"))
        .unwrap()
        .has_chat_template());
    assert!(!tokenizers
        .for_model(Some("other"))
        .unwrap()
        .has_chat_template());
    assert!(!tokenizers.for_model(None).unwrap().has_chat_template());

    let only_model = Tokenizers::load(&[format!("tiny-chat={}", chatml.path().display())]).unwrap();
    assert!(only_model.for_model(Some("other")).is_none());
    assert!(only_model.for_model(None).is_none());
    assert!(Tokenizers::load(&[]).unwrap().is_empty());
}

#[test]
fn tokenizers_are_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Tokenizers>();
    shared::<Tokenizer>();
}

/// The directory of the e2e model (tests/e2e/make_model.py: a byte-level BPE of 2048 tokens and
/// the ChatML template), for the tests that need a real tokenizer.
fn e2e_model() -> Option<Arc<Tokenizer>> {
    let dir = std::env::var_os("TOKENMETER_TOKENIZER_DIR")?;
    Some(load_dir(Path::new(&dir)))
}

// The counts are vLLM 0.32's own `usage.prompt_tokens`, serving the e2e model
// (/opt/tokenmeter-e2e/models/tiny-833bf3e6542f5a87) on CPU, and transformers 5.19's
// `apply_chat_template(..., tokenize=True)` and `len(tok(prompt)["input_ids"])` agree.
#[test]
#[ignore = "needs TOKENMETER_TOKENIZER_DIR, the e2e model's directory"]
fn the_e2e_models_prompt_counts_are_vllms() {
    let tok = e2e_model().unwrap();
    let chats = [
        (
            r#"{"messages": [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}]}"#,
            19,
        ),
        (
            r#"{"messages": [{"role": "system", "content": "You are a proxy that measures latency."},
                {"role": "user", "content": "What is the time to first token of this request?"},
                {"role": "assistant", "content": "About one hundred milliseconds, 42 ms of it in the queue."},
                {"role": "user", "content": "And the rate: tokens per second <|im_end|> per stream?"}]}"#,
            97,
        ),
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "Count the trees"},
                {"type": "text", "text": "by the river, then the mountain city road."}]}],
                "add_generation_prompt": false}"#,
            22,
        ),
    ];
    for (body, tokens) in chats {
        assert_eq!(
            tok.prompt_tokens("/v1/chat/completions", body.as_bytes()),
            exact(tokens),
            "{body}"
        );
    }
    let completions = [
        (
            r#"{"prompt": "Seven cats at the river count the light of the fire: 9081!"}"#,
            17,
        ),
        (r#"{"prompt": ["one two three", "Four five six? 77"]}"#, 12),
    ];
    for (body, tokens) in completions {
        assert_eq!(
            tok.prompt_tokens("/v1/completions", body.as_bytes()),
            exact(tokens),
            "{body}"
        );
    }
}

// The events of a completion vLLM 0.32 streamed from the e2e model (temperature 1, seed 7,
// "The quick brown fox", 40 tokens: usage.completion_tokens 40). Encoded again the text is 41
// tokens, as transformers encodes it too: the model sampled "237" as one token where the
// canonical split is two, which a count from the text cannot see. The expected attribution is
// transformers' offsets put through the same rule.
#[test]
#[ignore = "needs TOKENMETER_TOKENIZER_DIR, the e2e model's directory"]
fn the_e2e_models_output_attribution() {
    let tok = e2e_model().unwrap();
    let events = [
        " 901", "43", "468", " 83", " 459", "th", " 431", " 610", " 306", "520", " 270", "801",
        " 831", " 253", " 881", "160", "am", " 585", " 126", "quick", "Earth", "Time", "530",
        " 347", "783", " 91362", "524", "979", "31", " 371", "237", " 649", "Five", " 41170",
        "umps", "q", " 667", "B", "925", "734",
    ];
    let mut text = String::new();
    let mut ends = Vec::new();
    for event in events {
        text.push_str(event);
        ends.push(text.len() as u32);
    }
    let out = tok.output_tokens(&text, &ends);
    let mut expected = vec![1u32; events.len()];
    expected[30] = 2;
    assert_eq!((out.tokens, out.exact), (41, true));
    assert_eq!(out.per_event, expected);
}

/// What counting costs with a byte-level BPE: a chat prompt of about 2,000 tokens, and an
/// output of about 500 tokens attributed to its events (one a token, as the engine streams).
/// Prints the mean time of each; for the numbers, run it optimized:
/// `TOKENMETER_TOKENIZER_DIR=... cargo test --release -p tokenmeter --lib tokenize::tests::cost -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement; needs TOKENMETER_TOKENIZER_DIR, the e2e model's directory"]
fn cost_of_counting() {
    let tok = e2e_model().unwrap();
    let words = [
        "the", "token", "model", "proxy", "stream", "latency", "request", "response", "server",
        "first", "second", "rate", "user", "answer", "value", "number", "count", "window", "speed",
        "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "river", "city",
    ];
    let sentence = |n: usize, seed: usize| -> String {
        let mut s: Vec<&str> = (0..n)
            .map(|i| words[(i * 7 + seed * 13) % words.len()])
            .collect();
        s.push("42.");
        s.join(" ")
    };
    let mut messages = vec![serde_json::json!({"role": "system", "content": sentence(60, 0)})];
    for turn in 0..18 {
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        messages.push(serde_json::json!({"role": role, "content": sentence(100, turn + 1)}));
    }
    let body = serde_json::json!({"model": "tiny", "messages": messages}).to_string();
    let prompt = tok
        .prompt_tokens("/v1/chat/completions", body.as_bytes())
        .unwrap();

    let output = sentence(480, 99);
    let mut ends = Vec::new();
    for (i, c) in output.char_indices() {
        if c == ' ' {
            ends.push(i as u32);
        }
    }
    ends.push(output.len() as u32);
    let out = tok.output_tokens(&output, &ends);

    let time = |f: &dyn Fn()| {
        f();
        let runs = 200;
        let started = std::time::Instant::now();
        for _ in 0..runs {
            f();
        }
        started.elapsed() / runs
    };
    let chat_time = time(&|| {
        tok.prompt_tokens("/v1/chat/completions", body.as_bytes());
    });
    let output_time = time(&|| {
        tok.output_tokens(&output, &ends);
    });
    // The parts of the chat count: the rendered text's encoding alone.
    let text = rendered(&tok, &body);
    let encode_time = time(&|| {
        tok.inner.encode_fast(text.as_str(), false).unwrap();
    });
    println!(
        "chat prompt: {} tokens ({} bytes of body) in {chat_time:?}, of which encoding {encode_time:?}; \
         output: {} tokens in {} events in {output_time:?}",
        prompt.tokens,
        body.len(),
        out.tokens,
        ends.len()
    );
}
