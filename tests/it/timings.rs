//! The engine's own timings: what vLLM, Ollama and llama.cpp state in their streams is read
//! exactly however the body is cut, and a request's TTFT is split into those parts and `other`.

use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokenmeter::protocol::timings::{EngineTimings, TimingSource};
use tokenmeter::read::Reader;
use tokenmeter_tools::sim::{Model, SimConfig};

use tokenmeter::metrics::names;

use crate::support::corpus::{self, Entry};
use crate::support::metrics::metric;
use crate::support::upstream::{self, Reply, Step};
use crate::support::{client, spawn_proxy, start_sim};

const MAX_LINE: usize = 1 << 20;

/// The request path and content type a body came from.
fn route(e: &Entry) -> (&'static str, &'static str) {
    match e.family.as_str() {
        "ollama" if e.endpoint.contains("/api/generate") => {
            ("/api/generate", "application/x-ndjson")
        }
        "ollama" => ("/api/chat", "application/x-ndjson"),
        "llamacpp" => ("/completion", "text/event-stream"),
        _ if e.endpoint.contains("/v1/completions") => ("/v1/completions", "text/event-stream"),
        _ => ("/v1/chat/completions", "text/event-stream"),
    }
}

/// The body's messages as JSON with the byte range of each line, by a plain split on lines (an
/// oracle apart from the decoders): NDJSON lines, or SSE `data:` lines.
fn json_lines(body: &[u8]) -> Vec<(std::ops::Range<usize>, Value)> {
    let mut at = 0;
    let mut out = Vec::new();
    for line in body.split_inclusive(|b| *b == b'\n') {
        let range = at..at + line.len();
        at = range.end;
        let text = String::from_utf8_lossy(line);
        let text = text.trim();
        let text = text.strip_prefix("data:").map_or(text, str::trim_start);
        if let Ok(v) = serde_json::from_str(text) {
            out.push((range, v));
        }
    }
    out
}

fn ms(v: &Value) -> Option<Duration> {
    v.as_f64().map(|ms| Duration::from_secs_f64(ms / 1e3))
}

fn ns(v: &Value) -> Option<Duration> {
    v.as_u64().map(Duration::from_nanos)
}

/// What the body states, read with serde_json's `Value`, and the bytes of the line that states
/// it: the last line that states anything.
fn stated(e: &Entry) -> Option<(EngineTimings, std::ops::Range<usize>)> {
    let mut found = None;
    for (range, v) in json_lines(&e.body) {
        let t = match e.family.as_str() {
            "ollama" => EngineTimings {
                source: TimingSource::Ollama,
                queue: None,
                model_load: ns(&v["load_duration"]),
                prefill: ns(&v["prompt_eval_duration"]),
                generation: ns(&v["eval_duration"]),
                spec_acceptance: None,
            },
            "llamacpp" => EngineTimings {
                source: TimingSource::Llamacpp,
                queue: None,
                model_load: None,
                prefill: ms(&v["timings"]["prompt_ms"]),
                generation: ms(&v["timings"]["predicted_ms"]),
                spec_acceptance: None,
            },
            _ => {
                let m = &v["metrics"];
                EngineTimings {
                    source: TimingSource::Vllm,
                    queue: ms(&m["queue_time_ms"]),
                    model_load: None,
                    prefill: ms(&m["time_to_first_token_ms"]),
                    generation: ms(&m["generation_time_ms"]),
                    spec_acceptance: m["speculative_decoding"]["draft_acceptance_rate"].as_f64(),
                }
            }
        };
        if t.queue.is_some()
            || t.model_load.is_some()
            || t.prefill.is_some()
            || t.generation.is_some()
        {
            found = Some((t, range));
        }
    }
    found
}

/// What the reader states after the body in two pieces, cut at `at`.
fn read_split(e: &Entry, at: usize) -> Option<EngineTimings> {
    let (path, content_type) = route(e);
    let mut r = Reader::new(path, content_type, None, MAX_LINE);
    let (a, b) = e.body.split_at(at);
    r.feed(a);
    r.feed(b);
    r.finish(true);
    r.summary().engine
}

/// Every stream of the three engines in the corpus and the captured vLLM streams.
fn bodies(test: &str) -> Option<Vec<Entry>> {
    let mut all: Vec<Entry> = corpus::load(test)?
        .into_iter()
        .filter(|e| matches!(e.family.as_str(), "ollama" | "llamacpp" | "vllm"))
        .collect();
    all.extend(corpus::load_captured(test)?);
    Some(all)
}

/// Every cut of the body: at each byte of the line that states the timings (cuts elsewhere
/// leave that line whole, and the decoders' own tests show every message before it comes out
/// the same wherever the body is cut), and none.
#[test]
fn stated_timings_are_read_exactly_at_every_split() {
    let Some(entries) = bodies("stated timings at every split") else {
        return;
    };
    let mut stating = [0usize; 3];
    for e in &entries {
        let want = stated(e);
        let cuts = match &want {
            Some((t, line)) => {
                stating[TimingSource::ALL
                    .iter()
                    .position(|s| *s == t.source)
                    .unwrap_or(0)] += 1;
                line.start..line.end + 1
            }
            None => 0..1,
        };
        let want = want.map(|(t, _)| t);
        for at in cuts.chain([e.body.len()]) {
            assert_eq!(
                read_split(e, at.min(e.body.len())),
                want,
                "{}: cut at {at}",
                e.path
            );
        }
    }
    // Coverage: the files that state timings, per engine, so a field that stops parsing fails.
    // vLLM: the three captured streams (the corpus's public vLLM streams predate the metrics
    // object); Ollama: every local-server stream (the two cloud ones state none); llama.cpp:
    // its one native stream.
    assert_eq!(
        stating,
        [3, 13, 1],
        "(vllm, ollama, llamacpp) streams stating timings"
    );
}

/// The values the manifests state in words, through the reader.
#[test]
fn stated_timings_match_the_manifests() {
    let Some(entries) = bodies("stated timings, spot checks") else {
        return;
    };
    let find = |name: &str| {
        let e = entries
            .iter()
            .find(|e| e.path.ends_with(name))
            .unwrap_or_else(|| panic!("{name} missing"));
        read_split(e, e.body.len()).unwrap_or_else(|| panic!("{name}: no timings"))
    };
    let close = |d: Option<Duration>, ms: f64| {
        d.is_some_and(|d| (d.as_secs_f64() * 1e3 - ms).abs() < 0.001)
    };
    let q = find("captured-vllm032-chat-queued-per-request-metrics.sse");
    assert!(close(q.queue, 495.002), "{q:?}");
    assert!(close(q.prefill, 46.974), "{q:?}");
    assert!(close(q.generation, 654.534), "{q:?}");
    let c = find("captured-vllm032-completions-per-request-metrics.sse");
    assert!(close(c.queue, 0.042) && close(c.prefill, 10.924), "{c:?}");
    let o = find("ollama/langchaingo-chat-gemma3.ndjson");
    assert_eq!(o.model_load, Some(Duration::from_nanos(38_473_250)));
    assert_eq!(o.prefill, Some(Duration::from_nanos(27_608_250)));
    assert_eq!(o.generation, Some(Duration::from_nanos(105_611_917)));
    assert_eq!(o.queue, None);
    let l = find("llamacpp/native-completion-ollama-embedded-server-2024.sse");
    assert!(
        close(l.prefill, 1468.578) && close(l.generation, 336.452),
        "{l:?}"
    );
    assert_eq!((l.queue, l.model_load), (None, None));
}

/// An upstream that sends its first token `ttft` after the request, then its final line.
async fn split_through_proxy(
    path: &str,
    content_type: &str,
    first: &str,
    last: &str,
) -> (String, f64) {
    let (first, last) = (first.to_string(), last.to_string());
    let ct = content_type.to_string();
    let upstream = upstream::spawn(move |_| Reply {
        head_delay: Duration::ZERO,
        status: 200,
        headers: vec![("content-type".into(), ct.clone())],
        steps: vec![
            Step::Sleep(Duration::from_millis(300)),
            Step::Send(Bytes::from(first.clone())),
            Step::Sleep(Duration::from_millis(20)),
            Step::Send(Bytes::from(last.clone())),
        ],
    })
    .await;
    let proxy = spawn_proxy(&upstream.url(), &["--compat", "vllm"]).await;
    client::post(
        &format!("{}{path}", proxy.url()),
        r#"{"model":"m","stream":true}"#,
    )
    .await;
    let scrape = proxy.settled(1.0).await;
    let ttft = metric("tokenmeter_time_to_first_token_seconds_sum").value(&scrape);
    (scrape, ttft)
}

fn part(scrape: &str, part: &str) -> (f64, f64) {
    let m = |suffix: &str| {
        metric(&format!(
            "tokenmeter_time_to_first_token_part_seconds_{suffix}"
        ))
        .label("part", part)
        .sum(scrape)
    };
    (m("count"), m("sum"))
}

/// Checks the split of one request: each `(part, seconds)` observed once with exactly that
/// value, `other` the rest of tokenmeter's own TTFT, and the parts not given never observed.
fn check_split(scrape: &str, ttft: f64, source: &str, stated: &[(&str, f64)]) {
    for p in ["queue", "model_load", "prefill"] {
        match stated.iter().find(|(name, _)| *name == p) {
            Some((_, secs)) => {
                let (n, sum) = part(scrape, p);
                assert_eq!(n, 1.0, "{source} {p}:\n{scrape}");
                assert!((sum - secs).abs() < 1e-9, "{source} {p} {sum} != {secs}");
            }
            None => assert_eq!(
                part(scrape, p).0,
                0.0,
                "{source}: {p} not stated:\n{scrape}"
            ),
        }
    }
    let stated_sum: f64 = stated.iter().map(|(_, s)| s).sum();
    let (n, other) = part(scrape, "other");
    assert_eq!(n, 1.0, "{source} other");
    // The parts add up to the TTFT (to a microsecond: the sum is of f64 seconds).
    assert!(
        (other + stated_sum - ttft).abs() < 1e-6,
        "{source}: {other} + {stated_sum} != {ttft}"
    );
    // The first token left the upstream 300 ms after the request; the rest is loopback.
    assert!((0.3..0.4).contains(&ttft), "{source}: ttft {ttft}");
    assert!(other >= 0.3 - stated_sum - 1e-6, "{source}: other {other}");
    let covered = metric(names::ENGINE_TIMINGS_REQUESTS_TOTAL).label("source", source);
    assert_eq!(covered.value(scrape), 1.0, "{source} coverage");
    assert_eq!(
        metric(names::ENGINE_TIMING_MISMATCH_TOTAL).sum_or_zero_if_absent(scrape),
        0.0
    );
}

#[tokio::test]
async fn a_vllm_stream_splits_its_ttft_into_queue_prefill_and_other() {
    let _turn = crate::support::serial().await;
    let first =
        "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    let last = concat!(
        "data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10},",
        "\"metrics\":{\"queue_time_ms\":100.0,\"time_to_first_token_ms\":150.0,\"generation_time_ms\":0.5,",
        "\"speculative_decoding\":{\"draft_acceptance_rate\":0.75}}}\n\n",
        "data: [DONE]\n\n"
    );
    let (s, ttft) =
        split_through_proxy("/v1/chat/completions", "text/event-stream", first, last).await;
    check_split(&s, ttft, "vllm", &[("queue", 0.100), ("prefill", 0.150)]);
    // vLLM's own names, from the stated values.
    let v = |name: &str| metric(name).label("model_name", "m").sum(&s);
    assert_eq!(v("vllm:request_queue_time_seconds_count"), 1.0);
    assert!((v("vllm:request_queue_time_seconds_sum") - 0.1).abs() < 1e-9);
    assert!((v("vllm:request_prefill_time_seconds_sum") - 0.15).abs() < 1e-9);
    let rate = metric("tokenmeter_spec_decode_acceptance_rate_sum").label("model", "m");
    assert_eq!(rate.value(&s), 0.75);
}

#[tokio::test]
async fn an_ollama_stream_splits_its_ttft_into_model_load_prefill_and_other() {
    let _turn = crate::support::serial().await;
    let first = "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n";
    let last = "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done_reason\":\"stop\",\"done\":true,\"total_duration\":290000000,\"load_duration\":50000000,\"prompt_eval_count\":9,\"prompt_eval_duration\":200000000,\"eval_count\":1,\"eval_duration\":1000000}\n";
    let (s, ttft) = split_through_proxy("/api/chat", "application/x-ndjson", first, last).await;
    check_split(
        &s,
        ttft,
        "ollama",
        &[("model_load", 0.050), ("prefill", 0.200)],
    );
    // Ollama states no queue: vLLM's queue series stays absent, its prefill one is observed.
    assert!(
        metric("vllm:request_queue_time_seconds_count").is_absent(&s),
        "{s}"
    );
    let prefill = metric("vllm:request_prefill_time_seconds_count").label("model_name", "m");
    assert_eq!(prefill.value(&s), 1.0);
}

#[tokio::test]
async fn a_llamacpp_stream_splits_its_ttft_into_prefill_and_other() {
    let _turn = crate::support::serial().await;
    let first = "data: {\"content\":\"Hi\",\"stop\":false}\n\n";
    let last = "data: {\"content\":\"\",\"stop\":true,\"model\":\"m\",\"tokens_predicted\":1,\"tokens_evaluated\":40,\"timings\":{\"prompt_n\":8,\"prompt_ms\":200.0,\"predicted_n\":1,\"predicted_ms\":1.0}}\n\n";
    let (s, ttft) = split_through_proxy("/completion", "text/event-stream", first, last).await;
    check_split(&s, ttft, "llamacpp", &[("prefill", 0.200)]);
    // 40 prompt tokens, 8 computed: the cache served 32.
    let cached = metric(names::CACHED_INPUT_TOKENS_TOTAL).label("kind", "read");
    assert_eq!(cached.value(&s), 32.0);
}

/// A server that counts from an earlier instant states more than tokenmeter's TTFT: `other`
/// is 0, never below, and the request is counted as a mismatch.
#[tokio::test]
async fn stated_parts_beyond_the_ttft_leave_other_at_zero_and_count_a_mismatch() {
    let _turn = crate::support::serial().await;
    let first =
        "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    let last = "data: {\"model\":\"m\",\"choices\":[],\"metrics\":{\"queue_time_ms\":400.0,\"time_to_first_token_ms\":300.0}}\n\ndata: [DONE]\n\n";
    let (s, _) =
        split_through_proxy("/v1/chat/completions", "text/event-stream", first, last).await;
    assert_eq!(part(&s, "other"), (1.0, 0.0), "{s}");
    assert_eq!(metric(names::ENGINE_TIMING_MISMATCH_TOTAL).value(&s), 1.0);
    assert_eq!(part(&s, "queue").1, 0.4);
}

/// A stream that states nothing observes no part: the split covers only what engines state.
#[tokio::test]
async fn a_stream_without_timings_observes_no_part() {
    let first =
        "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    let last = "data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
    let (s, _) =
        split_through_proxy("/v1/chat/completions", "text/event-stream", first, last).await;
    assert_eq!(
        metric("tokenmeter_time_to_first_token_part_seconds_count").sum_or_zero_if_absent(&s),
        0.0
    );
    assert_eq!(
        metric(names::ENGINE_TIMINGS_REQUESTS_TOTAL).sum_or_zero_if_absent(&s),
        0.0
    );
    assert_eq!(
        metric("vllm:request_queue_time_seconds_count").sum_or_zero_if_absent(&s),
        0.0
    );
}

/// The simulator, under `--enable-per-request-metrics`, states its own queue as vLLM does: with
/// one sequence at a time and two requests at once, the second waits out the first's 20 steps of
/// 5 ms in the queue, and the split shows that wait as `queue`, not as `prefill` or `other`.
#[tokio::test]
async fn the_simulators_stated_queue_is_the_wait_it_imposed() {
    let _turn = crate::support::serial().await;
    let sim = start_sim(SimConfig {
        model: Model {
            step_base: Duration::from_millis(5),
            step_per_seq: Duration::ZERO,
            prefill_per_token: Duration::ZERO,
            step_per_1k_kv_tokens: Duration::ZERO,
            max_batch: 1,
        },
        per_request_metrics: true,
        ..SimConfig::default()
    })
    .await;
    let proxy = spawn_proxy(&format!("http://{sim}"), &[]).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":20}"#;
    let (a, b) = tokio::join!(client::post(&url, body), client::post(&url, body));
    assert_eq!((a.status, b.status), (200, 200));
    let s = proxy.settled(2.0).await;
    let (n, queue) = part(&s, "queue");
    assert_eq!(n, 2.0, "{s}");
    // 20 steps of 5 ms for the first; timers on a loaded machine only add.
    assert!((0.095..0.3).contains(&queue), "queue {queue}");
    let (n, prefill) = part(&s, "prefill");
    // Admission to the first token: one step each.
    assert!(
        n == 2.0 && (0.009..0.1).contains(&prefill),
        "prefill {prefill}"
    );
    let (n, other) = part(&s, "other");
    let ttft = metric("tokenmeter_time_to_first_token_seconds_sum").value(&s);
    assert_eq!(n, 2.0);
    assert!((queue + prefill + other - ttft).abs() < 1e-6);
    assert!(
        other < queue,
        "the wait is in the queue, not outside: other {other}"
    );
    assert_eq!(
        metric(names::ENGINE_TIMING_MISMATCH_TOTAL).sum_or_zero_if_absent(&s),
        0.0
    );
    let source = metric(names::ENGINE_TIMINGS_REQUESTS_TOTAL).label("source", "vllm");
    assert_eq!(source.value(&s), 2.0);
}
