//! `tokenmeter sim` and `tokenmeter demo`, end to end.
//!
//! The speed checks are benchmark-style: they measure the simulator from the client side over
//! hundreds or thousands of tokens and allow 10% off the model, because these machines are
//! shared and noisy. Everything else is exact: token counts, usage, determinism, formats.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::Value;
use tokenmeter::protocol::openai::OpenAi;
use tokenmeter::protocol::{Api, Extractor, Message, Summary};
use tokenmeter::read::{self, ndjson, sse, Framing};
use tokenmeter_tools::sim::{Dialect, Model, PrefixCache, PrefixCaching, SimConfig};

use crate::support::metrics::metric;
use crate::support::sim::{chat, connect, get, request, stats};
use crate::support::{client, client::Seen, corpus, sim_flags, start_sim};

// === helpers ===

fn json(seen: &Seen) -> Value {
    serde_json::from_slice(&seen.body).expect("a JSON body")
}

async fn post(addr: SocketAddr, path: &str, body: &str) -> Seen {
    client::post(&format!("http://{addr}{path}"), body).await
}

/// Token-bearing events (arrival time, tokens) and the summary, as tokenmeter reads an OpenAI
/// stream.
fn openai_tokens(reply: &Seen) -> (Vec<(Duration, u32)>, Summary) {
    let mut decoder = sse::Decoder::new(1 << 20);
    let mut x = OpenAi::default();
    let mut out = Vec::new();
    for (t, data) in &reply.frames {
        decoder.feed(data, &mut |m| {
            let n = x.on_message(&m);
            if n > 0 {
                out.push((*t, n));
            }
        });
    }
    decoder.finish(&mut |m| {
        x.on_message(&m);
    });
    (out, x.summary().clone())
}

fn total(tokens: &[(Duration, u32)]) -> u64 {
    tokens.iter().map(|(_, n)| u64::from(*n)).sum()
}

/// Per-request decode speed, tokenmeter's definition: (tokens - 1) / (last - first).
fn decode_tps(tokens: &[(Duration, u32)]) -> f64 {
    let (first, last) = (tokens[0].0, tokens[tokens.len() - 1].0);
    (total(tokens) - 1) as f64 / (last - first).as_secs_f64()
}

/// A simulator with 1 ms steps, for tests of content rather than timing.
fn fast(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        model: Model {
            step_base: Duration::from_millis(1),
            step_per_seq: Duration::ZERO,
            ..SimConfig::default().model
        },
        ..SimConfig::default()
    }
}

fn within(measured: f64, model: f64, tolerance: f64) -> bool {
    (measured / model - 1.0).abs() <= tolerance
}

/// The messages of a body: SSE events (event name, data) or NDJSON lines ("", line).
fn messages(body: &[u8], framing: Framing) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut on = |m: Message<'_>| out.push((m.event.to_string(), m.data.to_vec()));
    match framing {
        Framing::Ndjson => {
            let mut d = ndjson::Decoder::new(1 << 20);
            d.feed(body, &mut on);
            d.finish(&mut on);
        }
        _ => {
            let mut d = sse::Decoder::new(1 << 20);
            d.feed(body, &mut on);
            d.finish(&mut on);
        }
    }
    out
}

// === speed: the model, measured from the client side ===

/// A benchmark on a shared machine can come out slow (a neighbour took the CPU) but not fast (the
/// simulator never emits a token early), so a speed check gets three attempts and passes on the
/// first one within `tolerance` of the model. A real error of the model fails all three.
async fn attempts<F, Fut>(what: &str, model: f64, tolerance: f64, mut measure: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    // Speed checks take turns with the suite's other timing and CPU-heavy tests.
    let _turn = crate::support::serial().await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let measured = measure().await;
        eprintln!("{what}: {measured:.1} tok/s measured, {model:.1} modelled");
        seen.push(measured);
        if within(measured, model, tolerance) {
            return;
        }
    }
    panic!("{what}: measured {seen:.1?} tok/s, model {model:.1}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_single_user_tps_matches_the_model() {
    let cfg = SimConfig::default();
    let model = cfg.model;
    let addr = start_sim(cfg).await;
    attempts("concurrency 1", model.request_tps(1), 0.10, || async {
        let r = post(addr, "/v1/chat/completions", &chat(Some(300), true)).await;
        let id = r.headers["x-sim-request-id"]
            .to_str()
            .expect("id")
            .parse::<u64>()
            .expect("a number");
        let (tokens, summary) = openai_tokens(&r);
        assert_eq!(total(&tokens), 300);
        assert_eq!(summary.output_tokens, Some(300));
        let measured = decode_tps(&tokens);
        // The simulator's own record of the request agrees with what the client saw.
        let s = stats(addr).await;
        let rec = s["requests"]
            .as_array()
            .expect("records")
            .iter()
            .find(|r| r["id"] == id)
            .expect("the request's record")
            .clone();
        let own = 299.0
            / (rec["last_token_s"].as_f64().expect("last")
                - rec["first_token_s"].as_f64().expect("first"));
        assert!(
            within(own, measured, 0.10),
            "sim says {own:.1}, client {measured:.1}"
        );
        measured
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_aggregate_tps_at_128_matches_the_model() {
    const USERS: usize = 128;
    const TOKENS: u32 = 150;
    let cfg = SimConfig::default();
    let model = cfg.model;
    let addr = start_sim(cfg).await;
    attempts(
        "concurrency 128, aggregate",
        model.aggregate_tps(USERS),
        0.10,
        || async {
            let clients: Vec<_> = (0..USERS)
                .map(|_| {
                    tokio::spawn(async move {
                        // Frame times are relative to each request's start: note when that was.
                        let sent = Instant::now();
                        let body = chat(Some(TOKENS), true);
                        (sent, post(addr, "/v1/chat/completions", &body).await)
                    })
                })
                .collect();
            let mut first = None::<Instant>;
            let mut last = None::<Instant>;
            let mut all = 0u64;
            for c in clients {
                let (sent, r) = c.await.expect("client");
                let (tokens, _) = openai_tokens(&r);
                assert_eq!(total(&tokens), u64::from(TOKENS));
                all += total(&tokens);
                let (f, l) = (sent + tokens[0].0, sent + tokens[tokens.len() - 1].0);
                first = Some(first.map_or(f, |x| x.min(f)));
                last = Some(last.map_or(l, |x| x.max(l)));
            }
            let span = last.expect("last").duration_since(first.expect("first"));
            all as f64 / span.as_secs_f64()
        },
    )
    .await;
    // Every attempt ran its 128 requests as one batch.
    let s = stats(addr).await;
    assert_eq!(s["max_running"], USERS);
    assert_eq!(
        s["output_tokens"].as_u64().expect("tokens") % (USERS as u64 * u64::from(TOKENS)),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_queue_beyond_max_batch_shows_in_ttft() {
    let cfg = SimConfig {
        model: Model {
            step_base: Duration::from_millis(5),
            step_per_seq: Duration::ZERO,
            prefill_per_token: Duration::ZERO,
            step_per_1k_kv_tokens: Duration::ZERO,
            max_batch: 2,
        },
        ..SimConfig::default()
    };
    let addr = start_sim(cfg).await;
    let clients: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(
                async move { post(addr, "/v1/chat/completions", &chat(Some(50), true)).await },
            )
        })
        .collect();
    let mut ttfts = Vec::new();
    for c in clients {
        let r = c.await.expect("client");
        let (tokens, _) = openai_tokens(&r);
        ttfts.push(tokens[0].0);
    }
    ttfts.sort();
    // Two had to wait for a whole 50-step decode (250 ms) before their prefill.
    let decode = Duration::from_millis(250);
    assert!(ttfts[2] >= decode && ttfts[3] >= decode, "{ttfts:?}");
    let s = stats(addr).await;
    let waits: Vec<f64> = s["requests"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            r["admitted_s"].as_f64().expect("admitted") - r["arrived_s"].as_f64().expect("arrived")
        })
        .collect();
    assert_eq!(
        waits.iter().filter(|&&w| w >= 0.125).count(),
        2,
        "{waits:?}"
    );
    assert_eq!(s["max_running"], 2);
}

// === exactness ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_token_counts_equal_max_tokens_exactly() {
    let addr = start_sim(fast(0)).await;
    for path in ["/v1/chat/completions", "/v1/completions"] {
        for n in [1u32, 2, 17, 100] {
            let body = chat(Some(n), true).replace("\"messages\"", "\"prompt\":\"x\",\"m\"");
            // Streaming: every token is one event, and the usage chunk says the same.
            let r = post(addr, path, &body).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.headers["content-type"], "text/event-stream");
            let (tokens, summary) = openai_tokens(&r);
            assert_eq!(total(&tokens), u64::from(n), "{path} {n}");
            assert_eq!(tokens.len(), n as usize, "one token per event");
            assert_eq!(summary.output_tokens, Some(u64::from(n)));
            assert_eq!(summary.model.as_deref(), Some("test-model"));
            assert_eq!(summary.malformed, 0);
            // Non-streaming: one document with the usage.
            let r = post(
                addr,
                path,
                &body.replace("\"stream\":true", "\"stream\":false"),
            )
            .await;
            assert_eq!(r.headers["content-type"], "application/json");
            let v = json(&r);
            assert_eq!(v["usage"]["completion_tokens"], n);
            // tokenmeter reads the same count from the document.
            let mut x = OpenAi::default();
            x.on_message(&Message {
                event: "",
                data: &r.body,
            });
            assert_eq!(x.summary().output_tokens, Some(u64::from(n)));
            // The simulator's own record names the same request and count.
            let id: u64 = r.headers["x-sim-request-id"]
                .to_str()
                .expect("id")
                .parse()
                .expect("number");
            let s = stats(addr).await;
            let rec = s["requests"]
                .as_array()
                .expect("records")
                .iter()
                .find(|r| r["id"] == id)
                .expect("a record for the request")
                .clone();
            assert_eq!(
                (rec["output_tokens"].as_u64(), rec["outcome"].as_str()),
                (Some(u64::from(n)), Some("complete"))
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_prompt_tokens_are_estimated_from_the_text() {
    let addr = start_sim(SimConfig::default()).await;
    let content = "x".repeat(396); // + "user" = 400 characters = 100 tokens
    let body =
        serde_json::json!({"messages": [{"role": "user", "content": content}], "max_tokens": 3})
            .to_string();
    let v = json(&post(addr, "/v1/chat/completions", &body).await);
    assert_eq!(v["usage"]["prompt_tokens"], 100);
    assert_eq!(v["usage"]["total_tokens"], 103);
}

/// `--prefix-cache-hit-rate 0.9`: a 2000-token prompt has floor(2000 x 0.9) = 1800 tokens
/// served from the cache. The usage says so exactly in each format (OpenAI's
/// `prompt_tokens_details.cached_tokens`, read by tokenmeter's own extractor; Anthropic's
/// `cache_read_input_tokens` beside the uncached `input_tokens`), `/sim/stats` states the rate and
/// each request's cached count, and only the 200 uncached tokens are charged prefill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_usage_states_the_prefix_cached_tokens_exactly() {
    let cfg = |api| SimConfig {
        api,
        model: Model {
            step_base: Duration::from_millis(1),
            step_per_seq: Duration::ZERO,
            prefill_per_token: Duration::from_micros(100),
            ..SimConfig::default().model
        },
        prefix_cache: PrefixCaching::Rate(PrefixCache::new(0.9).expect("valid")),
        per_request_metrics: true,
        ..SimConfig::default()
    };
    let addr = start_sim(cfg(Dialect::Openai)).await;
    let content = "x".repeat(7996); // + "user" = 8000 characters = 2000 tokens
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    let reply = post(addr, "/v1/chat/completions", &body).await;
    let (tokens, summary) = openai_tokens(&reply);
    assert_eq!(total(&tokens), 3);
    assert_eq!(
        (summary.input_tokens, summary.cached_read),
        (Some(2000), Some(1800))
    );
    // The engine's own prefill (vLLM's per-request metrics): 1 ms + 200 x 0.1 ms = 21 ms, far
    // from the 201 ms the whole prompt would cost.
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let usage_chunk = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| d.contains("\"metrics\""))
        .map(|d| serde_json::from_str::<Value>(d).expect("json"))
        .next()
        .expect("a usage chunk with metrics");
    let prefill_ms = usage_chunk["metrics"]["time_to_first_token_ms"]
        .as_f64()
        .expect("a number");
    assert!((21.0..201.0).contains(&prefill_ms), "{prefill_ms}");

    let whole = serde_json::json!({"prompt": "x".repeat(400), "max_tokens": 2}).to_string();
    let v = json(&post(addr, "/v1/completions", &whole).await);
    assert_eq!(v["usage"]["prompt_tokens"], 100);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 90);

    let s = stats(addr).await;
    assert_eq!(s["prefix_cache_hit_rate"], 0.9);
    let cached: Vec<(u64, u64)> = s["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().expect("count");
            (n("prompt_tokens"), n("cached_tokens"))
        })
        .collect();
    assert_eq!(cached, [(2000, 1800), (100, 90)]);

    let addr = start_sim(cfg(Dialect::Anthropic)).await;
    let body = serde_json::json!({
        "model": "m",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string();
    let v = json(&post(addr, "/v1/messages", &body).await);
    let u = &v["usage"];
    let (input, read) = (
        u["input_tokens"].as_u64().expect("input"),
        u["cache_read_input_tokens"].as_u64().expect("read"),
    );
    assert_eq!(read, (input + read) * 9 / 10, "{u}");
    let s = stats(addr).await;
    assert_eq!(s["requests"][0]["prompt_tokens"], input + read);
    assert_eq!(s["requests"][0]["cached_tokens"], read);
}

/// `--prefix-cache-tokens`: the cached tokens come from the prefixes prompts share. Two
/// completions whose prompts share their first 1,000 characters share 15 whole blocks of 64
/// characters (960; the 16th holds 40 shared and 24 different): the first finds the cache
/// empty, the second is served 15 x 16 = 240 of its 325 prompt tokens. The usage says so, and
/// `/metrics` counts exactly that with vLLM's names, as `/sim/stats` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_prefix_cache_is_learnt_from_shared_prompt_prefixes() {
    /// Prompt tokens looked up and served, as `/metrics` counts them.
    async fn counters(addr: SocketAddr) -> (f64, f64) {
        let text = String::from_utf8(get(addr, "/metrics").await.body).expect("text");
        let v = |name: &str| {
            metric(name)
                .label("model_name", "tokenmeter-sim")
                .value(&text)
        };
        (
            v("vllm:prefix_cache_queries_total"),
            v("vllm:prefix_cache_hits_total"),
        )
    }
    /// Prompt tokens and cached tokens, as the usage states them.
    async fn complete(addr: SocketAddr, prompt: String) -> (u64, u64) {
        let body = serde_json::json!({"prompt": prompt, "max_tokens": 2}).to_string();
        let v = json(&post(addr, "/v1/completions", &body).await);
        let n = |u: &Value| u.as_u64().expect("a count");
        (
            n(&v["usage"]["prompt_tokens"]),
            n(&v["usage"]["prompt_tokens_details"]["cached_tokens"]),
        )
    }
    let addr = start_sim(sim_flags(&["--prefix-cache-tokens", "4096"])).await;
    let shared: String = "The quick brown fox jumps over the lazy dog. "
        .chars()
        .cycle()
        .take(1000)
        .collect();
    assert_eq!(counters(addr).await, (0.0, 0.0));
    let first = complete(addr, format!("{shared}{}", "x".repeat(200))).await;
    assert_eq!(first, (300, 0), "an empty cache");
    let after_first = counters(addr).await;
    assert_eq!(after_first, (300.0, 0.0));
    let second = complete(addr, format!("{shared}{}", "y".repeat(300))).await;
    assert_eq!(second, (325, 240));
    let after_second = counters(addr).await;
    assert_eq!(
        (
            after_second.0 - after_first.0,
            after_second.1 - after_first.1
        ),
        (325.0, 240.0),
        "the second request's queried and hit tokens"
    );
    let s = stats(addr).await;
    assert_eq!(s["prefix_cache_tokens"], 4096);
    assert_eq!(s["prefix_cache"]["queries"], 625);
    assert_eq!(s["prefix_cache"]["hits"], 240);
    let cached: Vec<u64> = s["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .map(|r| r["cached_tokens"].as_u64().expect("count"))
        .collect();
    assert_eq!(cached, [0, 240]);
}

/// A chat stream's role chunk goes out with the first token, after prefill, as vLLM sends it
/// (its OpenAI server writes the role chunk in the first turn of its loop over the engine's
/// outputs), not with the headers: a client that times the first chunk, as LiteLLM's TTFT does,
/// reads the prefill. The prompt of 2,000 tokens at 0.1 ms each costs at least 200 ms of
/// prefill, so no byte of the body may arrive sooner; an Anthropic stream's `message_start`
/// still goes out at once, as the Messages API sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_sends_the_chat_role_chunk_with_the_first_token() {
    const PREFILL: Duration = Duration::from_millis(200);
    let cfg = |api| SimConfig {
        api,
        model: Model {
            step_base: Duration::from_millis(1),
            step_per_seq: Duration::ZERO,
            prefill_per_token: Duration::from_micros(100),
            ..SimConfig::default().model
        },
        ..SimConfig::default()
    };
    let addr = start_sim(cfg(Dialect::Openai)).await;
    let content = "x".repeat(7996); // + "user" = 8000 characters = 2000 tokens
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3,
        "stream": true,
    })
    .to_string();
    let reply = post(addr, "/v1/chat/completions", &body).await;
    let (at, first) = reply.frames.first().expect("a first frame");
    let events: Vec<&str> = std::str::from_utf8(first)
        .expect("utf-8")
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .collect();
    assert!(
        events[0].contains("\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"),
        "the role chunk opens the stream: {events:?}"
    );
    assert!(
        events.len() >= 2 && events[1].contains("\"delta\":{\"content\":"),
        "the first token comes with it: {events:?}"
    );
    assert!(
        *at >= PREFILL,
        "the role chunk arrived after {at:?}, before the prefill"
    );
    let (tokens, _) = openai_tokens(&reply);
    assert_eq!(total(&tokens), 3);

    let addr = start_sim(cfg(Dialect::Anthropic)).await;
    let body = serde_json::json!({
        "model": "m",
        "max_tokens": 3,
        "stream": true,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string();
    let reply = post(addr, "/v1/messages", &body).await;
    let (at, first) = reply.frames.first().expect("a first frame");
    let first = String::from_utf8_lossy(first);
    assert!(
        first.starts_with("event: message_start") && !first.contains("content_block_delta"),
        "message_start alone, at once: {first}"
    );
    let second = reply.frames.get(1).expect("a token frame").0;
    assert!(second >= PREFILL, "the first token after {second:?}");
    assert!(*at < second, "message_start before the first token");
}

/// With `--kv-cache-tokens 256 --block-size 16` (16 blocks), eight streams of a ~40-token
/// prompt and 60 tokens need about 100 tokens of cache each: the cache fills, sequences are
/// preempted and recomputed, and yet every stream carries exactly its 60 tokens, once each;
/// the simulator's `/metrics` states it with vLLM's names. With a cache eight times as large
/// the same load preempts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_with_a_small_kv_cache_preempts_and_recomputes_without_repeating_a_token() {
    async fn run(kv_tokens: u32) -> (Value, String) {
        let cfg = SimConfig {
            kv: Some(tokenmeter_tools::sim::kv::KvConfig {
                tokens: kv_tokens,
                block_size: 16,
            }),
            ..fast(3)
        };
        let addr = start_sim(cfg).await;
        let prompt = serde_json::json!({
            "messages": [{"role": "user", "content": "y".repeat(156)}],
            "max_tokens": 60,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string();
        let streams: Vec<_> = (0..8)
            .map(|_| {
                let body = prompt.clone();
                tokio::spawn(async move { post(addr, "/v1/chat/completions", &body).await })
            })
            .collect();
        for s in streams {
            let reply = s.await.expect("stream task");
            let (tokens, summary) = openai_tokens(&reply);
            assert_eq!(total(&tokens), 60, "each token once");
            assert_eq!(summary.output_tokens, Some(60));
        }
        let metrics = String::from_utf8(get(addr, "/metrics").await.body).expect("text");
        (stats(addr).await, metrics)
    }
    let (small, text) = run(256).await;
    let preempted = small["preemptions"].as_u64().expect("a count");
    assert!(preempted > 0, "{small}");
    assert_eq!(small["kv_blocks"]["total"], 16);
    assert_eq!(small["kv_blocks"]["max_used"], 16, "the cache filled");
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .to_string()
    };
    assert!(line("vllm:num_preemptions_total").ends_with(&format!(" {preempted}")));
    assert!(
        line("vllm:kv_cache_usage_perc").ends_with(" 0"),
        "all done: empty"
    );
    assert!(line("vllm:cache_config_info")
        .contains("block_size=\"16\",num_gpu_blocks=\"16\",kv_cache_size_tokens=\"256\""));
    assert!(line("vllm:num_requests_running").ends_with(" 0"));
    let recomputed: u64 = small["requests"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["preemptions"].as_u64().expect("count"))
        .sum();
    assert_eq!(recomputed, preempted);

    let (big, _) = run(2048).await;
    assert_eq!(big["preemptions"], 0, "{big}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_is_deterministic_under_seed() {
    let a = start_sim(fast(7)).await;
    let b = start_sim(fast(7)).await;
    let c = start_sim(fast(8)).await;
    let text = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
            .to_string()
    };
    let used = |v: &Value| v["usage"]["completion_tokens"].as_u64().expect("usage");
    let mut lengths = BTreeSet::new();
    for prompt in ["one", "two", "three"] {
        let body = chat(None, false).replace("Tell me about continuous batching.", prompt);
        let va = json(&post(a, "/v1/chat/completions", &body).await);
        let vb = json(&post(b, "/v1/chat/completions", &body).await);
        let vc = json(&post(c, "/v1/chat/completions", &body).await);
        assert_eq!(text(&va), text(&vb), "same seed, same request: same output");
        assert_eq!(used(&va), used(&vb));
        assert_ne!(text(&va), text(&vc), "another seed: another output");
        let ta = text(&va);
        // Streaming does not change what is generated.
        let streamed = post(
            a,
            "/v1/chat/completions",
            &body.replace("\"stream\":false", "\"stream\":true"),
        )
        .await;
        let mut s = String::new();
        for (_, data) in messages(&streamed.body, Framing::Sse) {
            if let Ok(v) = serde_json::from_slice::<Value>(&data) {
                if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
                    s.push_str(t);
                }
            }
        }
        assert_eq!(s, ta);
        // A limit cuts the same text short.
        let limited = chat(Some(5), false).replace("Tell me about continuous batching.", prompt);
        let limited = text(&json(&post(a, "/v1/chat/completions", &limited).await));
        assert!(
            ta.starts_with(&limited),
            "{limited:?} is not a prefix of {ta:?}"
        );
        lengths.insert(used(&va));
    }
    assert!(
        lengths.len() > 1,
        "lengths are drawn, not fixed: {lengths:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_client_disconnect_frees_the_batch_slot() {
    let cfg = SimConfig {
        model: Model {
            max_batch: 1,
            ..SimConfig::default().model
        },
        ..SimConfig::default()
    };
    let addr = start_sim(cfg).await;
    {
        let mut sender = connect(addr).await;
        let resp = sender
            .send_request(request(
                "POST",
                addr,
                "/v1/chat/completions",
                &chat(Some(100_000), true),
            ))
            .await
            .expect("response");
        let mut body = resp.into_body();
        for _ in 0..3 {
            body.frame().await.expect("a frame").expect("ok");
        }
        // Dropping the body and the connection hangs up.
    }
    // With one slot, this completes only if the abandoned stream left the batch.
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        post(addr, "/v1/chat/completions", &chat(Some(5), true)),
    )
    .await
    .expect("the slot was freed");
    assert_eq!(total(&openai_tokens(&r).0), 5);
    let s = stats(addr).await;
    assert_eq!(
        (s["cancelled"].as_u64(), s["completed"].as_u64()),
        (Some(1), Some(1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_refuses_bad_requests_in_the_api_s_own_shape() {
    let addr = start_sim(SimConfig {
        api: Dialect::Anthropic,
        ..SimConfig::default()
    })
    .await;
    let r = post(addr, "/v1/chat/completions", "{not json").await;
    assert_eq!(r.status, 400);
    assert!(json(&r)["error"]["message"].is_string());
    let r = post(addr, "/v1/messages", r#"{"max_tokens":0,"messages":[]}"#).await;
    assert_eq!(r.status, 400);
    assert_eq!(json(&r)["type"], "error");
    assert_eq!(post(addr, "/api/chat", "{}").await.status, 404);
    assert_eq!(get(addr, "/health").await.status, 200);
    assert_eq!(
        json(&get(addr, "/v1/models").await)["data"][0]["id"],
        "tokenmeter-sim"
    );
}

// === other wire formats ===

/// One endpoint of one simulator API, and where the corpus keeps real bodies of it.
struct Format {
    api: Dialect,
    path: &'static str,
    /// A streaming request for 7 tokens.
    body: String,
    framing: Framing,
    /// Corpus files whose path starts with one of these come from the same endpoint.
    corpus: &'static [&'static str],
    /// Key paths a meter reads: our stream must carry every one of them.
    required: &'static [&'static str],
}

fn formats() -> Vec<Format> {
    let n = 7;
    vec![
        Format {
            api: Dialect::Anthropic,
            path: "/v1/messages",
            body: serde_json::json!({"model": "claude-sim", "max_tokens": n, "stream": true, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            framing: Framing::Sse,
            corpus: &["anthropic/"],
            required: &["message.usage.input_tokens", "delta.text", "usage.output_tokens", "delta.stop_reason"],
        },
        Format {
            api: Dialect::Ollama,
            path: "/api/chat",
            body: serde_json::json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": n}}).to_string(),
            framing: Framing::Ndjson,
            corpus: &["ollama/langchaingo-chat", "ollama/openllmetry-chat"],
            required: &["message.content", "done", "eval_count", "prompt_eval_count", "eval_duration"],
        },
        Format {
            api: Dialect::Ollama,
            path: "/api/generate",
            body: serde_json::json!({"model": "llama3", "prompt": "hi", "options": {"num_predict": n}}).to_string(),
            framing: Framing::Ndjson,
            corpus: &["ollama/langchaingo-generate", "ollama/openllmetry-generate", "ollama/attogram"],
            required: &["response", "done", "eval_count", "prompt_eval_count", "eval_duration"],
        },
        Format {
            api: Dialect::Tgi,
            path: "/generate_stream",
            body: serde_json::json!({"inputs": "hi", "parameters": {"max_new_tokens": n}}).to_string(),
            framing: Framing::Sse,
            corpus: &["tgi/hfapi-generate-stream"],
            required: &["token.text", "token.id", "details.generated_tokens", "details.input_length", "generated_text"],
        },
        Format {
            api: Dialect::Openai,
            path: "/v1/chat/completions",
            body: chat(Some(n), true),
            framing: Framing::Sse,
            corpus: &["openai_chat/", "vllm/"],
            required: &["choices[].delta.content", "choices[].finish_reason", "usage.completion_tokens", "usage.prompt_tokens", "model"],
        },
        Format {
            api: Dialect::Openai,
            path: "/v1/completions",
            body: chat(Some(n), true).replace("\"messages\"", "\"prompt\":\"x\",\"m\""),
            framing: Framing::Sse,
            corpus: &["openai_completions/"],
            required: &["choices[].text", "usage.completion_tokens", "usage.prompt_tokens", "model"],
        },
    ]
}

/// Every key path of a JSON value ("choices[].delta.content").
fn key_paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                key_paths(x, &p, out);
            }
        }
        Value::Array(a) => a
            .iter()
            .for_each(|x| key_paths(x, &format!("{prefix}[]"), out)),
        _ => {}
    }
}

/// What kind of message this is, so it is compared with messages of the same kind.
fn kind(event: &str, v: &Value) -> String {
    let t = v["type"].as_str().unwrap_or("");
    let done = v["done"]
        .as_bool()
        .map(|d| format!("done={d}"))
        .unwrap_or_default();
    let details = if v.get("token").is_some() {
        format!("details={}", !v["details"].is_null())
    } else {
        String::new()
    };
    format!("{event}|{t}|{done}|{details}")
}

/// Our messages use only keys that real servers send in messages of the same kind (and every
/// kind we send exists in the corpus), checked against the corpus files of each endpoint, and
/// carry every key a meter reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_formats_match_the_corpus() {
    let Some(entries) = corpus::load("sim_formats_match_the_corpus") else {
        return;
    };
    for Format {
        api,
        path,
        body,
        framing,
        corpus: prefixes,
        required,
    } in formats()
    {
        let mut real: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut files = 0;
        for e in &entries {
            if !prefixes.iter().any(|p| e.path.starts_with(p)) {
                continue;
            }
            files += 1;
            for (event, data) in messages(&e.body, framing) {
                if let Ok(v) = serde_json::from_slice::<Value>(&data) {
                    key_paths(&v, "", real.entry(kind(&event, &v)).or_default());
                }
            }
        }
        assert!(files > 0, "no corpus files for {prefixes:?}");
        let addr = start_sim(SimConfig {
            api,
            ..SimConfig::default()
        })
        .await;
        let r = post(addr, path, &body).await;
        assert_eq!(r.status, 200, "{path}");
        let ours = messages(&r.body, framing);
        assert!(ours.len() >= 7, "{path}: {} messages", ours.len());
        let mut seen = BTreeSet::new();
        for (event, data) in ours {
            if data == b"[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_slice(&data).unwrap_or_else(|e| panic!("{path}: {e}"));
            let k = kind(&event, &v);
            let known = real
                .get(&k)
                .unwrap_or_else(|| panic!("{path}: no message of kind {k:?} in the corpus"));
            let mut mine = BTreeSet::new();
            key_paths(&v, "", &mut mine);
            let extra: Vec<_> = mine.difference(known).collect();
            assert!(
                extra.is_empty(),
                "{path}: {k}: keys no real server sends: {extra:?}"
            );
            seen.extend(mine);
        }
        for key in required {
            assert!(seen.contains(*key), "{path}: never sends {key}");
        }
    }
}

/// Each API's stream is read by tokenmeter's own extractor for it: the token count equals the
/// limit and the stream's usage report says the same.
///
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_formats_are_read_by_tokenmeter_extractors() {
    for Format {
        api, path, body, ..
    } in formats()
    {
        let addr = start_sim(SimConfig {
            api,
            ..SimConfig::default()
        })
        .await;
        let r = post(addr, path, &body).await;
        let ct = r.headers["content-type"].to_str().expect("content-type");
        let (framing, mut x) = read::select(path, ct, None);
        assert_ne!(x.api(), Api::Unknown, "{path}: no extractor");
        let mut tokens = 0u64;
        for (event, data) in messages(&r.body, framing) {
            tokens += u64::from(x.on_message(&Message {
                event: &event,
                data: &data,
            }));
        }
        assert_eq!(tokens, 7, "{path}");
        assert_eq!(x.summary().output_tokens, Some(7), "{path}");
        assert_eq!(x.summary().malformed, 0, "{path}");
    }
}
