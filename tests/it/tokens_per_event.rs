//! Several tokens in one streamed event, as speculative decoding and vLLM's `--stream-interval`
//! send them: the simulator with `--tokens-per-event 3` (and `--spec-acceptance`) is the truth,
//! tokenmeter in front of it is measured against it.
//!
//! A client that does not ask for usage gets no count from the stream but its events: without
//! `--inject-usage` tokenmeter counts one token per event (67 for 200 tokens three at a time), the
//! undercount the flag exists for; with it, the exact 200, while the client's bytes stay what the
//! simulator sends without it.

use serde_json::Value;

use tokenmeter::metrics::names;

use crate::support::client::{self, Seen};
use crate::support::metrics::metric;
use crate::support::{sim_flags, spawn_proxy, start_sim, Proxy};

const OUTPUT: u32 = 200;
const PER_EVENT: u32 = 3;
/// ceil(200 / 3): 66 events of 3 tokens and one of 2.
const EVENTS: u32 = 67;

/// A streaming chat and a streaming completions request for exactly [`OUTPUT`] tokens, neither
/// asking for usage.
fn requests() -> [(&'static str, String); 2] {
    [
        (
            "/v1/chat/completions",
            serde_json::json!({
                "model": "m",
                "messages": [{"role": "user", "content": "Tell me about speculative decoding."}],
                "max_tokens": OUTPUT,
                "stream": true,
            })
            .to_string(),
        ),
        (
            "/v1/completions",
            serde_json::json!({
                "model": "m",
                "prompt": "Once upon a time",
                "max_tokens": OUTPUT,
                "stream": true,
            })
            .to_string(),
        ),
    ]
}

/// The body with what differs between two runs of the same request made fixed: the arrival
/// number in the id (`chatcmpl-sim-N`, `cmpl-sim-N`) and `created`.
fn deterministic(body: &[u8]) -> String {
    let text = String::from_utf8(body.to_vec()).expect("utf-8 body");
    let zero_digits_after = |s: &str, key: &str, to: &str| {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(i) = rest.find(key) {
            let (head, tail) = rest.split_at(i + key.len());
            out.push_str(head);
            out.push_str(to);
            rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
        }
        out.push_str(rest);
        out
    };
    let text = zero_digits_after(&text, "-sim-", "N");
    zero_digits_after(&text, "\"created\":", "0")
}

/// The token-bearing chunks of an OpenAI stream: content or text not empty.
fn token_events(body: &[u8]) -> usize {
    let text = std::str::from_utf8(body).expect("utf-8 body");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON chunk"))
        .filter(|v| {
            let c = &v["choices"][0];
            let piece = c["delta"]["content"].as_str().or(c["text"].as_str());
            piece.is_some_and(|p| !p.is_empty())
        })
        .count()
}

async fn post(base: &str, path: &str, body: &str) -> Seen {
    let seen = client::post(&format!("{base}{path}"), body).await;
    assert_eq!(seen.status, 200, "{path}");
    assert!(!seen.error, "{path}: the stream was cut");
    seen
}

/// Sends both requests through `proxy` and waits until both are recorded; returns the scrape.
async fn through(proxy: &Proxy) -> String {
    for (path, body) in requests() {
        post(&proxy.url(), path, &body).await;
    }
    let s = proxy.settled(2.0).await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "complete")
            .sum(&s),
        2.0,
        "{s}"
    );
    s
}

/// The simulator's own count of the tokens it generated.
async fn sim_generated(sim: &str) -> f64 {
    let text = client::get_text(&format!("{sim}/metrics")).await;
    metric("vllm:generation_tokens_total").value(&text)
}

/// `tokenmeter_tokens_per_event`: (observations, their sum, observations of at most 1 token).
fn per_event(s: &str) -> (f64, f64, f64) {
    (
        metric("tokenmeter_tokens_per_event_count").sum(s),
        metric("tokenmeter_tokens_per_event_sum").sum(s),
        metric("tokenmeter_tokens_per_event_bucket")
            .label("le", "1")
            .sum(s),
    )
}

/// (a) With `--inject-usage on`, and with its default, `auto`, once tokenmeter has read the
/// simulator's vLLM-dialect page: the exact 200 tokens a request from the usage report the proxy
/// asked for, and the client's bytes those the simulator sends a client that did not ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_usage_counts_every_token_of_a_multi_token_event() {
    let sim = format!(
        "http://{}",
        start_sim(sim_flags(&["--tokens-per-event", "3"])).await
    );
    let page = format!("{sim}/metrics");
    for (round, flags) in [
        vec!["--inject-usage"],
        vec!["--engine-metrics", page.as_str()],
    ]
    .into_iter()
    .enumerate()
    {
        let proxy = spawn_proxy(&sim, &flags).await;
        if flags.contains(&"--engine-metrics") {
            // `auto` rewrites once it knows the upstream is an engine that adds nothing else.
            proxy
                .eventually(|s| {
                    metric(names::engine_view::SCRAPES)
                        .label("result", "ok")
                        .sum_or_zero_if_absent(s)
                        >= 1.0
                })
                .await;
        }
        for (path, body) in requests() {
            let direct = post(&sim, path, &body).await;
            assert_eq!(
                token_events(&direct.body),
                EVENTS as usize,
                "{path}: {PER_EVENT} tokens an event"
            );
            let via = post(&proxy.url(), path, &body).await;
            assert_eq!(
                deterministic(&via.body),
                deterministic(&direct.body),
                "{flags:?} {path}: the client sees what the simulator sends without injection"
            );
        }
        let s = proxy.settled(2.0).await;
        assert_eq!(
            metric(names::OUTPUT_TOKENS_TOTAL).sum(&s),
            f64::from(2 * OUTPUT),
            "{flags:?} {s}"
        );
        assert_eq!(
            metric(names::TOKEN_COUNT_SOURCE_TOTAL)
                .label("source", "usage")
                .sum(&s),
            2.0,
            "{flags:?}"
        );
        // The simulator made 200 tokens for each of the four requests of a round (two direct,
        // two through).
        let rounds = round as u32 + 1;
        assert_eq!(sim_generated(&sim).await, f64::from(4 * OUTPUT * rounds));
        // (c) The histogram sees each event as one token: the usage comes only at the end, so
        // it corrects the total but not the events already observed.
        let events = f64::from(2 * EVENTS);
        assert_eq!(per_event(&s), (events, events, events), "{s}");
    }
}

/// (b) Without `--inject-usage` a client that does not ask for usage leaves tokenmeter only the
/// events to count: 67 for 200 tokens, `source="counted"`. This pins the undercount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_injection_multi_token_events_are_counted_one_each() {
    let sim = format!(
        "http://{}",
        start_sim(sim_flags(&["--tokens-per-event", "3"])).await
    );
    let proxy = spawn_proxy(&sim, &["--inject-usage", "off"]).await;
    let s = through(&proxy).await;
    assert_eq!(
        metric(names::OUTPUT_TOKENS_TOTAL).sum(&s),
        f64::from(2 * EVENTS),
        "{s}"
    );
    assert_eq!(
        metric(names::TOKEN_COUNT_SOURCE_TOTAL)
            .label("source", "counted")
            .sum(&s),
        2.0
    );
    let events = f64::from(2 * EVENTS);
    assert_eq!(per_event(&s), (events, events, events), "{s}");
    // The truth: 200 tokens a request.
    assert_eq!(sim_generated(&sim).await, f64::from(2 * OUTPUT));
}

/// Speculative decoding (`--spec-acceptance 0.7`, 4 draft tokens): events of 1 to 5 tokens, and
/// with `--inject-usage` the exact total; the simulator's vLLM counters add up (every step makes
/// its target token plus the accepted drafts), and its per-request acceptance reaches
/// tokenmeter's histogram, one observation a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_events_are_counted_exactly_with_injected_usage() {
    let sim = format!(
        "http://{}",
        start_sim(sim_flags(&[
            "--spec-acceptance",
            "0.7",
            "--enable-per-request-metrics",
        ]))
        .await
    );
    let proxy = spawn_proxy(&sim, &["--inject-usage"]).await;
    let s = through(&proxy).await;
    assert_eq!(
        metric(names::OUTPUT_TOKENS_TOTAL).sum(&s),
        f64::from(2 * OUTPUT),
        "{s}"
    );
    let events = metric("tokenmeter_tokens_per_event_count").sum(&s);
    assert!(
        events < f64::from(2 * OUTPUT),
        "fewer events than tokens: {events}"
    );
    assert_eq!(
        metric("tokenmeter_spec_decode_acceptance_rate_count").sum(&s),
        2.0,
        "{s}"
    );
    let engine = client::get_text(&format!("{sim}/metrics")).await;
    let v = |name: &str| metric(name).value(&engine);
    assert_eq!(v("vllm:generation_tokens_total"), f64::from(2 * OUTPUT));
    let stats = client::send(http::Method::GET, &format!("{sim}/sim/stats"), "").await;
    let stats: Value = serde_json::from_slice(&stats.body).expect("stats");
    let steps = stats["steps"].as_f64().expect("steps");
    // Each request's events are its steps (the two ran one after the other).
    assert_eq!(steps, events, "{stats}");
    assert_eq!(
        v("vllm:spec_decode_num_accepted_tokens_total") + steps,
        f64::from(2 * OUTPUT)
    );
    let (drafts, drafted) = (
        v("vllm:spec_decode_num_drafts_total"),
        v("vllm:spec_decode_num_draft_tokens_total"),
    );
    assert_eq!(stats["spec"]["drafts"].as_f64(), Some(drafts));
    assert_eq!(stats["spec"]["draft_tokens"].as_f64(), Some(drafted));
    // Every step drafts but one with a single token to go (at most one a request), and no
    // draft proposes more than 4.
    assert!(drafts <= steps && drafts >= steps - 2.0, "{stats}");
    assert!(drafted <= 4.0 * drafts, "{stats}");
}
