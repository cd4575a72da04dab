//! The wire formats' unit tests: every event parses as JSON, each stream has the shape the
//! real server sends, requests are read per dialect.

use super::ollama::rfc3339;
use super::*;
use crate::sim::text::{Rng, Words};
use serde_json::Value;
use std::time::Duration;

fn response(route: Handler, stream: bool, n: u32) -> Reply {
    Reply {
        route,
        stream,
        include_usage: true,
        model: json_string("m"),
        id: 7,
        created: 1_700_000_000,
        prompt_tokens: 5,
        cached_tokens: None,
        output_tokens: n,
        limited: true,
        details: true,
        per_request_metrics: false,
    }
}

/// Renders a whole stream of `n` tokens.
fn stream(route: Handler, n: u32) -> String {
    let r = response(route, true, n);
    let mut out = String::new();
    let mut text = String::new();
    let mut w = Words::new(Rng::new(1));
    r.head(&mut out);
    for i in 0..n {
        let t = w.next_token();
        text.push_str(t.text);
        r.event(i, &[t], &text, &mut out);
    }
    r.tail(&Timings::default(), &mut out);
    out
}

#[test]
fn every_event_is_valid_json() {
    for ep in [
        Handler::Chat,
        Handler::Completions,
        Handler::Messages,
        Handler::TgiGenerateStream,
    ] {
        let body = stream(ep, 3);
        for line in body.lines().filter_map(|l| l.strip_prefix("data:")) {
            let l = line.trim_start();
            if l != "[DONE]" {
                serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{ep:?}: {e}: {l}"));
            }
        }
    }
    for ep in [Handler::OllamaChat, Handler::OllamaGenerate] {
        let body = stream(ep, 3);
        assert_eq!(body.lines().count(), 4);
        for l in body.lines() {
            serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{ep:?}: {e}: {l}"));
        }
    }
    for ep in [
        Handler::Chat,
        Handler::Completions,
        Handler::Messages,
        Handler::OllamaChat,
        Handler::OllamaGenerate,
        Handler::TgiGenerate,
    ] {
        let r = response(ep, false, 2);
        let body = r.whole(" a \"quoted\"\n text", &Timings::default());
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{ep:?}: {e}"));
        assert!(v.is_object());
    }
}

#[test]
fn openai_chat_stream_shape() {
    let body = stream(Handler::Chat, 2);
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 5, "{body}");
    assert!(events[0].contains("\"role\":\"assistant\",\"content\":\"\""));
    assert!(events[1].contains("\"finish_reason\":null"));
    assert!(events[2].contains("\"finish_reason\":\"length\""));
    assert!(events[3].contains(
        "\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}"
    ));
    assert_eq!(events[4], "data: [DONE]");
}

#[test]
fn anthropic_stream_shape() {
    let body = stream(Handler::Messages, 2);
    let names: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(body.contains("\"usage\":{\"input_tokens\":5,\"output_tokens\":1}"));
    assert!(body.contains(
        "\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}"
    ));
}

#[test]
fn tgi_last_token_carries_details() {
    let body = stream(Handler::TgiGenerateStream, 3);
    let events: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(events.len(), 3);
    assert_eq!(events[0]["index"], 1);
    assert!(events[1]["details"].is_null());
    assert_eq!(events[2]["details"]["generated_tokens"], 3);
    let text: String = events
        .iter()
        .map(|e| e["token"]["text"].as_str().expect("text"))
        .collect();
    assert_eq!(events[2]["generated_text"], text.as_str());
}

#[test]
fn ollama_final_line_counts() {
    let body = stream(Handler::OllamaChat, 4);
    let last: Value = serde_json::from_str(body.lines().last().expect("line")).expect("json");
    assert_eq!(last["done"], true);
    assert_eq!(last["eval_count"], 4);
    assert_eq!(last["prompt_eval_count"], 5);
    assert_eq!(last["done_reason"], "length");
}

#[test]
fn requests_are_read_per_api() {
    let p = parse(
        Handler::Chat,
        br#"{"model":"x","messages":[{"role":"user","content":"abcdefgh"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":9,"max_completion_tokens":12}"#,
    )
    .expect("valid");
    assert_eq!(
        (p.stream, p.include_usage, p.max_tokens, p.model.as_deref()),
        (true, true, Some(12), Some("x"))
    );
    assert_eq!(p.prompt_chars, "user".len() + "abcdefgh".len());
    let p = parse(
        Handler::OllamaChat,
        br#"{"messages":[],"options":{"num_predict":5}}"#,
    )
    .expect("valid");
    assert_eq!((p.stream, p.max_tokens), (true, Some(5)));
    let p = parse(
        Handler::OllamaGenerate,
        br#"{"prompt":"hi","stream":false,"options":{"num_predict":-1}}"#,
    )
    .expect("valid");
    assert_eq!((p.stream, p.max_tokens), (false, None));
    let p = parse(
        Handler::TgiGenerateStream,
        br#"{"inputs":"hi","parameters":{"max_new_tokens":20}}"#,
    )
    .expect("valid");
    assert_eq!((p.stream, p.max_tokens), (true, Some(20)));
    assert_eq!(parse(Handler::Chat, b"[1]"), Err(BodyError::NotJson));
    assert_eq!(
        parse(Handler::Messages, br#"{"max_tokens":0}"#),
        Err(BodyError::BadLimit("max_tokens"))
    );
    assert_eq!(
        parse(Handler::Completions, br#"{"max_tokens":"9"}"#),
        Err(BodyError::BadLimit("max_tokens"))
    );
}

#[test]
fn the_seed_field_changes_the_hash_and_the_rest_does_not() {
    let h = |b: &[u8]| parse(Handler::Chat, b).expect("valid").prompt_hash;
    let base = h(br#"{"messages":[{"role":"user","content":"hi"}]}"#);
    assert_eq!(
        base,
        h(br#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#)
    );
    assert_ne!(
        base,
        h(br#"{"messages":[{"role":"user","content":"hi"}],"seed":1}"#)
    );
    assert_ne!(base, h(br#"{"messages":[{"role":"user","content":"ho"}]}"#));
}

/// The prefix cache's blocks are cut from the text `prompt_chars` counts, in every format: as
/// many full blocks as its characters make, and none unless asked for.
#[test]
fn the_prefix_keys_cover_the_counted_text_in_every_format() {
    let text = "p".repeat(150);
    let bodies = [
        (
            Handler::Chat,
            serde_json::json!({"messages": [{"role": "user", "content": text}]}),
        ),
        (Handler::Completions, serde_json::json!({"prompt": text})),
        (
            Handler::Messages,
            serde_json::json!({"system": text, "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}], "max_tokens": 5}),
        ),
        (
            Handler::OllamaChat,
            serde_json::json!({"messages": [{"role": "user", "content": text}]}),
        ),
        (
            Handler::OllamaGenerate,
            serde_json::json!({"prompt": text, "system": text}),
        ),
        (Handler::TgiGenerate, serde_json::json!({"inputs": text})),
    ];
    for (route, body) in bodies {
        let body = body.to_string();
        let p = parse_with_keys(route, body.as_bytes()).expect("valid");
        assert_eq!(p.prefix_keys.len(), p.prompt_chars / 64, "{route:?}");
        assert!(!p.prefix_keys.is_empty(), "{route:?}");
        let plain = parse(route, body.as_bytes()).expect("valid");
        assert!(plain.prefix_keys.is_empty(), "{route:?}");
        assert_eq!(
            (plain.prompt_chars, plain.prompt_hash),
            (p.prompt_chars, p.prompt_hash)
        );
    }
    // A completion's keys are its prompt's.
    let p = parse_with_keys(Handler::Completions, br#"{"prompt":["abc","def"]}"#).expect("valid");
    assert!(p.prefix_keys.is_empty());
    let long = "q".repeat(130);
    let body = serde_json::json!({"prompt": long}).to_string();
    let p = parse_with_keys(Handler::Completions, body.as_bytes()).expect("valid");
    let mut k = crate::sim::prefix::BlockKeys::default();
    k.write(&long);
    assert_eq!(p.prefix_keys, k.finish());
}

/// A top-level `system` is the start of the prompt, as a chat template puts it: two Messages
/// requests with one long system prompt share its blocks whatever their messages.
#[test]
fn a_shared_system_prompt_is_a_shared_prefix() {
    let system = "s".repeat(640);
    let keys = |message: &str| {
        let body = serde_json::json!({"system": system, "max_tokens": 5, "messages": [{"role": "user", "content": message}]})
            .to_string();
        parse_with_keys(Handler::Messages, body.as_bytes())
            .expect("valid")
            .prefix_keys
    };
    let (a, b) = (keys(&"a".repeat(200)), keys(&"b".repeat(200)));
    assert_eq!(a[..10], b[..10]);
    assert_ne!(a[10], b[10]);
}

#[test]
fn routes_depend_on_the_dialect() {
    assert_eq!(Handler::find(Dialect::Openai, "/v1/messages"), None);
    assert_eq!(
        Handler::find(Dialect::Anthropic, "/v1/messages"),
        Some(Handler::Messages)
    );
    assert_eq!(
        Handler::find(Dialect::Tgi, "/v1/chat/completions"),
        Some(Handler::Chat)
    );
    assert_eq!(Handler::find(Dialect::Openai, "/generate"), None);
}

#[test]
fn rfc3339_dates() {
    assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00.000000Z");
    assert_eq!(
        rfc3339(Duration::new(1_755_697_704, 316_155_000)),
        "2025-08-20T13:48:24.316155Z"
    );
    assert_eq!(
        rfc3339(Duration::from_secs(951_782_400)),
        "2000-02-29T00:00:00.000000Z"
    );
}

/// With `--enable-per-request-metrics` the usage chunk states the engine's queue, prefill and
/// generation as vLLM does, and tokenmeter's own reader gets the very values back.
#[test]
fn per_request_metrics_ride_on_the_usage_chunk_as_vllm_writes_them() {
    use tokenmeter::protocol::{extractor, Api, Message};
    let mut r = response(Handler::Chat, true, 3);
    r.per_request_metrics = true;
    let t = Timings {
        prefill: Duration::from_millis(30),
        decode: Duration::from_millis(40),
        engine_queue: Some(Duration::from_millis(12)),
        engine_prefill: Some(Duration::from_millis(18)),
        spec: None,
    };
    let mut out = String::new();
    r.tail(&t, &mut out);
    let mut x = extractor(Api::OpenAi);
    for line in out.lines().filter_map(|l| l.strip_prefix("data: ")) {
        x.on_message(&Message {
            event: "",
            data: line.as_bytes(),
        });
    }
    let stated = x.summary().engine.expect("metrics stated");
    let ms = |d: Option<Duration>| d.map(|d| (d.as_secs_f64() * 1e3 * 1e6).round() / 1e6);
    assert_eq!(ms(stated.queue), Some(12.0));
    assert_eq!(ms(stated.prefill), Some(18.0));
    assert_eq!(ms(stated.generation), Some(40.0));
    // Without the flag there is no `metrics` object.
    r.per_request_metrics = false;
    let mut plain = String::new();
    r.tail(&t, &mut plain);
    assert!(!plain.contains("metrics"), "{plain}");
}

/// With the prefix cache on, OpenAI states the cached share in `prompt_tokens_details` (the
/// prompt count unchanged), and Anthropic splits the prompt into uncached and cache-read tokens.
#[test]
fn the_cached_share_is_stated_in_each_formats_usage() {
    let cached = |route: Handler, stream: bool| Reply {
        prompt_tokens: 2000,
        cached_tokens: Some(1800),
        ..response(route, stream, 2)
    };
    for route in [Handler::Chat, Handler::Completions] {
        let mut tail = String::new();
        cached(route, true).tail(&Timings::default(), &mut tail);
        let usage = "\"usage\":{\"prompt_tokens\":2000,\"completion_tokens\":2,\"total_tokens\":2002,\"prompt_tokens_details\":{\"cached_tokens\":1800}}";
        assert!(tail.contains(usage), "{tail}");
        let whole: Value =
            serde_json::from_str(&cached(route, false).whole("x", &Timings::default()))
                .expect("json");
        assert_eq!(
            whole["usage"]["prompt_tokens_details"]["cached_tokens"],
            1800
        );
        assert_eq!(whole["usage"]["prompt_tokens"], 2000);
    }
    let mut head = String::new();
    cached(Handler::Messages, true).head(&mut head);
    assert!(
        head.contains(
            "\"usage\":{\"input_tokens\":200,\"cache_read_input_tokens\":1800,\"output_tokens\":1}"
        ),
        "{head}"
    );
    let whole: Value =
        serde_json::from_str(&cached(Handler::Messages, false).whole("x", &Timings::default()))
            .expect("json");
    assert_eq!(
        (
            &whole["usage"]["input_tokens"],
            &whole["usage"]["cache_read_input_tokens"]
        ),
        (&Value::from(200), &Value::from(1800))
    );
    // Off: nothing stated, the bytes as before.
    let mut tail = String::new();
    response(Handler::Chat, true, 2).tail(&Timings::default(), &mut tail);
    assert!(!tail.contains("prompt_tokens_details"));
}

/// Renders a whole stream of `n` tokens, `per_event` to an event (the last the rest); returns it
/// with the text of all the tokens.
fn stream_by(route: Handler, n: u32, per_event: u32) -> (String, String) {
    let r = response(route, true, n);
    let mut out = String::new();
    let mut text = String::new();
    let mut w = Words::new(Rng::new(1));
    r.head(&mut out);
    let mut i = 0;
    while i < n {
        let k = per_event.min(n - i);
        let toks: Vec<_> = (0..k).map(|_| w.next_token()).collect();
        toks.iter().for_each(|t| text.push_str(t.text));
        r.event(i, &toks, &text, &mut out);
        i += k;
    }
    r.tail(&Timings::default(), &mut out);
    (out, text)
}

/// The JSON of every `data:` line but `[DONE]`.
fn data_lines(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim_start)
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Seven tokens three to an event: OpenAI, Anthropic and Ollama send three events (3, 3, 1
/// tokens) whose texts are the tokens' texts concatenated, the last with the finish reason, and
/// every usage report states 7; TGI, whose event holds one token, sends seven.
#[test]
fn several_tokens_ride_in_one_event_and_the_usage_states_them_all() {
    use tokenmeter::protocol::{extractor, Api, Message};
    for route in [Handler::Chat, Handler::Completions] {
        let (body, text) = stream_by(route, 7, 3);
        let v = data_lines(&body);
        let tokens: Vec<&Value> = v
            .iter()
            .filter(|e| e["choices"].as_array().is_some_and(|c| !c.is_empty()))
            .filter(|e| e["choices"][0]["delta"].get("role").is_none())
            .collect();
        assert_eq!(tokens.len(), 3, "{route:?}: {body}");
        let piece = |e: &Value| {
            let c = &e["choices"][0];
            c["delta"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .expect("text")
                .to_string()
        };
        let got: String = tokens.iter().map(|e| piece(e)).collect();
        assert_eq!(got, text);
        assert!(tokens[..2]
            .iter()
            .all(|e| e["choices"][0]["finish_reason"].is_null()));
        assert_eq!(tokens[2]["choices"][0]["finish_reason"], "length");
        let usage = v.last().expect("usage chunk");
        assert_eq!(usage["usage"]["completion_tokens"], 7);
        // tokenmeter counts one per event, then takes the usage's 7.
        let mut x = extractor(Api::OpenAi);
        let counted: u32 = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|l| {
                x.on_message(&Message {
                    event: "",
                    data: l.as_bytes(),
                })
            })
            .sum();
        assert_eq!(counted, 3, "{route:?}");
        assert_eq!(x.summary().output_tokens, Some(7));
    }

    let (body, text) = stream_by(Handler::Messages, 7, 3);
    let v = data_lines(&body);
    let deltas: Vec<&str> = v
        .iter()
        .filter(|e| e["type"] == "content_block_delta")
        .map(|e| e["delta"]["text"].as_str().expect("text"))
        .collect();
    assert_eq!(deltas.len(), 3);
    assert_eq!(deltas.concat(), text);
    let end = v
        .iter()
        .find(|e| e["type"] == "message_delta")
        .expect("message_delta");
    assert_eq!(end["usage"]["output_tokens"], 7);

    for route in [Handler::OllamaChat, Handler::OllamaGenerate] {
        let (body, text) = stream_by(route, 7, 3);
        let lines: Vec<Value> = body
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 4, "{body}");
        let got: String = lines[..3]
            .iter()
            .map(|l| {
                l["message"]["content"]
                    .as_str()
                    .or(l["response"].as_str())
                    .expect("text")
            })
            .collect();
        assert_eq!(got, text);
        assert_eq!(lines[3]["eval_count"], 7);
    }

    let (body, text) = stream_by(Handler::TgiGenerateStream, 7, 3);
    let v = data_lines(&body);
    assert_eq!(v.len(), 7, "one event per token");
    let idx: Vec<u64> = v.iter().filter_map(|e| e["index"].as_u64()).collect();
    assert_eq!(idx, [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(v[6]["generated_text"], text.as_str());
    assert_eq!(v[6]["details"]["generated_tokens"], 7);
    assert!(v[5]["details"].is_null());
}

/// Under speculative decoding the per-request `metrics` carries vLLM's `speculative_decoding`
/// object, and tokenmeter reads its acceptance rate back; before any draft it is left out.
#[test]
fn the_request_s_drafts_ride_on_the_usage_chunk() {
    use crate::sim::decoding::SpecCounts;
    use tokenmeter::protocol::{extractor, Api, Message};
    let mut r = response(Handler::Chat, true, 3);
    r.per_request_metrics = true;
    let t = Timings {
        spec: Some(SpecCounts {
            drafts: 4,
            draft_tokens: 16,
            accepted_tokens: 10,
        }),
        ..Timings::default()
    };
    let mut out = String::new();
    r.tail(&t, &mut out);
    assert!(
        out.contains("\"speculative_decoding\":{\"draft_acceptance_rate\":0.625,\"mean_acceptance_length\":3.5,\"num_drafts\":4}"),
        "{out}"
    );
    let mut x = extractor(Api::OpenAi);
    for line in out.lines().filter_map(|l| l.strip_prefix("data: ")) {
        x.on_message(&Message {
            event: "",
            data: line.as_bytes(),
        });
    }
    let stated = x.summary().engine.expect("metrics stated");
    assert_eq!(stated.spec_acceptance, Some(0.625));
    let none = Timings {
        spec: Some(SpecCounts::default()),
        ..Timings::default()
    };
    let mut out = String::new();
    r.tail(&none, &mut out);
    assert!(out.contains("\"metrics\""), "{out}");
    assert!(!out.contains("speculative_decoding"), "{out}");
}

/// Asking for usage adds the usage chunk and nothing else, as vLLM's chat stream does: what a
/// proxy that asks on a client's behalf (`--inject-usage`) removes again leaves the bytes the
/// client would have had.
#[test]
fn asking_for_usage_adds_the_usage_chunk_only() {
    for route in [Handler::Chat, Handler::Completions] {
        let with = stream(route, 3);
        let without = {
            let r = Reply {
                include_usage: false,
                ..response(route, true, 3)
            };
            let mut out = String::new();
            let mut text = String::new();
            let mut w = Words::new(Rng::new(1));
            r.head(&mut out);
            for i in 0..3 {
                let t = w.next_token();
                text.push_str(t.text);
                r.event(i, &[t], &text, &mut out);
            }
            r.tail(&Timings::default(), &mut out);
            out
        };
        let usage_chunk = with
            .split_inclusive("\n\n")
            .find(|e| e.contains("\"choices\":[],\"usage\":{"))
            .expect("a usage chunk");
        assert_eq!(with.replacen(usage_chunk, "", 1), without, "{route:?}");
    }
}
