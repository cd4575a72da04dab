//! `--tokenizer` against the simulator: a tokenizer whose tokens are the simulator's own (a word
//! with its leading space, or a punctuation mark), so its counts are the truth to the token.
//!
//! What it must give: a request that ends without usage counted from its text
//! (`source="tokenizer"`), its prompt counted at admission; the tokens each event carried when
//! the simulator sends three at a time; a client that leaves counted between what it received
//! and what the simulator made; and, where usage comes, each count checked against it.

use std::path::PathBuf;

use serde_json::json;

use tokenmeter::metrics::names;

use crate::support::metrics::metric;
use crate::support::{client, tokenizer};
use crate::support::{sim_flags, spawn_proxy, start_sim, Proxy};

const OUTPUT: u64 = 200;
/// ceil(200 / 3): 66 events of 3 tokens and one of 2.
const EVENTS: u64 = 67;
/// The prompt, 6 tokens to this tokenizer: " the", " model", " of", " the", " token", ".".
const PROMPT: &str = "the model of the token.";
const PROMPT_TOKENS: u64 = 6;

/// A model directory whose tokenizer cuts text where the simulator's tokens begin (an optional
/// space and a word, or one other character) and maps every piece to one id, with a chat
/// template that writes the messages' contents one after another.
fn model_dir(tag: &str) -> PathBuf {
    let dir = tokenizer::word_level(&format!("tokenizer-{tag}"), &[]);
    let config = json!({
        "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("write");
    dir
}

/// The simulator with 1 ms steps, three tokens an event (a test of counts, not of speed).
async fn sim() -> String {
    let cfg = sim_flags(&["--tokens-per-event", "3"]);
    format!("http://{}", start_sim(cfg).await)
}

fn completion(max_tokens: u64) -> String {
    json!({"model": "m", "prompt": PROMPT, "max_tokens": max_tokens, "stream": true}).to_string()
}

fn chat() -> String {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": OUTPUT,
        "stream": true,
    })
    .to_string()
}

/// The simulator's tokens in `text`, counted as its vocabulary spells them: an optional space
/// and a word, or an optional space and one other character.
fn sim_tokens(text: &str) -> u64 {
    let mut n = 0;
    let mut chars = text.chars().peekable();
    while let Some(mut c) = chars.next() {
        n += 1;
        if c == ' ' {
            match chars.peek() {
                Some(&next) if !next.is_whitespace() => {
                    c = next;
                    chars.next();
                }
                _ => continue,
            }
        }
        if c.is_alphanumeric() {
            while chars.peek().is_some_and(|c| c.is_alphanumeric()) {
                chars.next();
            }
        }
    }
    n
}

/// The text of the token-bearing chunks in a (possibly cut) OpenAI stream.
fn streamed_text(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out = String::new();
    for line in text.lines() {
        let Some(v) = line
            .strip_prefix("data: ")
            .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        else {
            continue;
        };
        let c = &v["choices"][0];
        if let Some(t) = c["delta"]["content"].as_str().or(c["text"].as_str()) {
            out.push_str(t);
        }
    }
    out
}

async fn post(proxy: &Proxy, path: &str, body: &str) -> client::Seen {
    let seen = client::post(&format!("{}{path}", proxy.url()), body).await;
    assert_eq!(seen.status, 200, "{path}");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_usage_the_tokenizer_counts_prompt_answer_and_each_event() {
    let sim = sim().await;
    let dir = model_dir("counts");
    let tok = dir.to_string_lossy().to_string();
    let proxy = spawn_proxy(&sim, &["--inject-usage", "off", "--tokenizer", &tok]).await;
    for (path, body) in [
        ("/v1/completions", completion(OUTPUT)),
        ("/v1/chat/completions", chat()),
    ] {
        let seen = post(&proxy, path, &body).await;
        assert_eq!(
            sim_tokens(&streamed_text(&seen.body)),
            OUTPUT,
            "{path}: the truth"
        );
    }
    let s = proxy.settled(2.0).await;
    assert_eq!(
        metric(names::TOKEN_COUNT_SOURCE_TOTAL)
            .label("source", "tokenizer")
            .sum(&s),
        2.0,
        "{s}"
    );
    assert_eq!(
        metric(names::OUTPUT_TOKENS_TOTAL).sum(&s),
        2.0 * OUTPUT as f64
    );
    assert_eq!(
        metric(names::INPUT_TOKENS_TOTAL).sum(&s),
        2.0 * PROMPT_TOKENS as f64,
        "the prompt, counted at admission"
    );
    // Each event's tokens, by where their text ended: 66 of 3 and one of 2, per request.
    assert_eq!(
        metric("tokenmeter_tokens_per_event_count").sum(&s),
        2.0 * EVENTS as f64
    );
    assert_eq!(
        metric("tokenmeter_tokens_per_event_sum").sum(&s),
        2.0 * OUTPUT as f64
    );
    assert_eq!(
        metric("tokenmeter_tokens_per_event_bucket")
            .label("le", "2")
            .sum(&s),
        2.0,
        "one event of 2 per request, none smaller"
    );
    // The TTFT went into the prompt's band at its first token: both observed, none in the
    // `unknown` band.
    assert_eq!(
        metric("tokenmeter_time_to_first_token_seconds_count").sum(&s),
        2.0,
        "{s}"
    );
    assert_eq!(
        metric("tokenmeter_time_to_first_token_seconds_count")
            .label("prompt", "unknown")
            .sum(&s),
        0.0,
        "{s}"
    );
    // No usage came: nothing to check, so no check's series exists (the name is held to the
    // scrape where checks happen, in the next test).
    assert!(!s.contains("tokenmeter_tokenizer_checks_total{"), "{s}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_is_counted_between_what_it_read_and_what_was_made() {
    let sim = sim().await;
    let dir = model_dir("leave");
    let tok = dir.to_string_lossy().to_string();
    // Usage is asked for: a request that completes is exact by its report, one that is cut
    // never gets it.
    let proxy = spawn_proxy(&sim, &["--inject-usage", "on", "--tokenizer", &tok]).await;
    let url = format!("{}/v1/completions", proxy.url());
    let body = completion(20_000);
    let cut = client::post_read_then_drop(&url, &body, 1500).await;
    let s = proxy
        .eventually(|s| metric(names::REQUESTS_TOTAL).sum_or_zero_if_absent(s) >= 1.0)
        .await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "client_disconnect")
            .sum(&s),
        1.0,
        "{s}"
    );
    assert_eq!(
        metric(names::TOKEN_COUNT_SOURCE_TOTAL)
            .label("source", "tokenizer")
            .sum(&s),
        1.0,
        "{s}"
    );
    assert_eq!(
        metric(names::INPUT_TOKENS_TOTAL).sum(&s),
        PROMPT_TOKENS as f64,
        "its prompt is counted though no usage came"
    );
    let counted = metric(names::OUTPUT_TOKENS_TOTAL).sum(&s) as u64;
    let read = sim_tokens(&streamed_text(&cut));
    let stats = client::get_text(&format!("{sim}/sim/stats")).await;
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("stats");
    let made = stats["output_tokens"].as_u64().expect("output_tokens");
    assert!(
        read <= counted && counted <= made,
        "the client read {read} tokens, the simulator made {made}, tokenmeter counted {counted}"
    );

    // A request that completes is checked against its usage: its answer's count is the
    // simulator's; its prompt the simulator estimates by characters, so the two differ.
    post(&proxy, "/v1/completions", &completion(OUTPUT)).await;
    let s = proxy.settled(2.0).await;
    let check = |direction: &str, result: &str| {
        metric(names::TOKENIZER_CHECKS_TOTAL)
            .label("direction", direction)
            .label("result", result)
            .sum(&s)
    };
    assert_eq!(check("output", "equal"), 1.0, "{s}");
    assert_eq!(check("output", "differs"), 0.0);
    assert_eq!(check("input", "equal") + check("input", "differs"), 1.0);
    assert_eq!(
        metric(names::TOKEN_COUNT_SOURCE_TOTAL)
            .label("source", "usage")
            .sum(&s),
        1.0
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_bad_tokenizer_fails_the_start_naming_its_path() {
    let missing = std::env::temp_dir().join("tokenmeter-it-no-such-tokenizer");
    let cfg = crate::support::config_of(
        "http://127.0.0.1:9",
        &["--tokenizer", missing.to_str().expect("utf-8 path")],
    );
    let err = match tokenmeter::app::build(&cfg).await {
        Ok(_) => panic!("a missing tokenizer must fail the start"),
        Err(e) => e,
    };
    assert!(err.is_usage(), "{err}");
    assert!(
        err.to_string().contains("tokenmeter-it-no-such-tokenizer"),
        "the message names the path: {err}"
    );
}
