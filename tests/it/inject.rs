//! `--inject-usage` against a test upstream that behaves like vLLM: it adds the usage-only chunk
//! when, and only when, the request asks for it. The client must see the same bytes as without
//! the flag, and the metrics must get the exact counts.

use std::time::Duration;

use bytes::Bytes;

use tokenmeter::metrics::names;

use crate::support::client::{self, chat_request};
use crate::support::metrics::metric;
use crate::support::upstream::{self, Received, Reply, Step};
use crate::support::{spawn_proxy, Rng};

/// Tokens per content chunk: several tokens per event, as with speculative decoding, so counting
/// events (13) and the usage report (40) disagree.
const CHUNK_TOKENS: [usize; 13] = [1, 3, 4, 2, 5, 3, 3, 4, 2, 5, 3, 3, 2];
const OUTPUT: usize = 40;
const PROMPT: usize = 9;

/// Whether a request asked for usage, as vLLM reads it.
fn asks_for_usage(req: &Received) -> bool {
    serde_json::from_slice::<serde_json::Value>(&req.body)
        .ok()
        .and_then(|v| v["stream_options"]["include_usage"].as_bool())
        .unwrap_or(false)
}

/// The body a vLLM-like server streams, with `eol` line endings.
fn body(usage: bool, eol: &str) -> Vec<u8> {
    let chunk = |choice: &str| {
        format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{choice}]}}{eol}{eol}"
        )
    };
    let mut s =
        chunk(r#"{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}"#);
    for (i, n) in CHUNK_TOKENS.iter().enumerate() {
        let text = format!("w{i}").repeat(*n);
        s += &chunk(&format!(
            r#"{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}"#
        ));
    }
    s += &chunk(r#"{"index":0,"delta":{},"finish_reason":"stop"}"#);
    if usage {
        s += &format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{PROMPT},\"total_tokens\":{},\"completion_tokens\":{OUTPUT}}}}}{eol}{eol}",
            PROMPT + OUTPUT
        );
    }
    s += &format!("data: [DONE]{eol}{eol}");
    s.into_bytes()
}

/// An upstream that streams [`body`] in random pieces of up to `max` bytes.
async fn vllm_like(max: usize, eol: &'static str) -> upstream::Upstream {
    vllm_like_as(max, eol, "text/event-stream").await
}

/// [`vllm_like`], with the response's content type spelt `content_type`.
async fn vllm_like_as(
    max: usize,
    eol: &'static str,
    content_type: &'static str,
) -> upstream::Upstream {
    upstream::spawn(move |req| {
        let bytes = body(asks_for_usage(req), eol);
        let mut rng = Rng::new(max as u64 * 31 + bytes.len() as u64);
        Reply {
            head_delay: Duration::ZERO,
            status: 200,
            headers: vec![("content-type".into(), content_type.into())],
            steps: rng
                .pieces(&bytes, 1, max)
                .into_iter()
                .map(Step::Send)
                .collect(),
        }
    })
    .await
}

#[tokio::test]
async fn same_bytes_for_the_client_exact_counts_for_the_metrics() {
    for (max, eol) in [(4096, "\n"), (7, "\n"), (1, "\r\n"), (64, "\r")] {
        let up = vllm_like(max, eol).await;
        let plain = spawn_proxy(&up.url(), &[]).await;
        let injecting = spawn_proxy(&up.url(), &["--inject-usage"]).await;
        let request = chat_request(true, false);
        let url = |p: &crate::support::Proxy| format!("{}/v1/chat/completions", p.url());

        let without = client::post(&url(&plain), &request).await;
        let with = client::post(&url(&injecting), &request).await;
        assert_eq!(with.status, 200);
        assert!(!without.error && !with.error);
        assert_eq!(
            without.body,
            body(false, eol),
            "no usage chunk without the flag"
        );
        assert!(
            with.body == without.body,
            "pieces of {max}, {eol:?}: the client sees the same bytes\nwith:    {:?}\nwithout: {:?}",
            String::from_utf8_lossy(&with.body),
            String::from_utf8_lossy(&without.body),
        );

        // The upstream was asked for usage only through the injecting proxy, and the rest of
        // the request is what the client sent.
        let received = up.received.lock().expect("lock").clone();
        assert_eq!(received.len(), 2);
        assert_eq!(received[0].body, request.as_bytes());
        assert!(asks_for_usage(&received[1]));
        let mut sent: serde_json::Value = serde_json::from_str(&request).expect("json");
        sent["stream_options"]["include_usage"] = true.into();
        let got: serde_json::Value = serde_json::from_slice(&received[1].body).expect("json");
        assert_eq!(got, sent);
        let length = received[1]
            .headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .map(|(_, v)| v.clone());
        assert_eq!(length, Some(received[1].body.len().to_string()));

        let s = plain.settled(1.0).await;
        assert_eq!(metric(names::OUTPUT_TOKENS_TOTAL).sum(&s), 13.0);
        assert_eq!(
            metric(names::INPUT_TOKENS_TOTAL).sum_or_zero_if_absent(&s),
            0.0
        );
        assert_eq!(
            metric(names::TOKEN_COUNT_SOURCE_TOTAL)
                .label("source", "counted")
                .sum(&s),
            1.0
        );
        let s = injecting.settled(1.0).await;
        assert_eq!(metric(names::OUTPUT_TOKENS_TOTAL).sum(&s), OUTPUT as f64);
        assert_eq!(metric(names::INPUT_TOKENS_TOTAL).sum(&s), PROMPT as f64);
        assert_eq!(
            metric(names::TOKEN_COUNT_SOURCE_TOTAL)
                .label("source", "usage")
                .sum(&s),
            1.0
        );
        assert_eq!(
            metric(names::REQUESTS_TOTAL)
                .label("api", "openai")
                .label("outcome", "complete")
                .sum(&s),
            1.0
        );
    }
}

#[tokio::test]
async fn a_client_that_asked_for_usage_gets_it_untouched() {
    let up = vllm_like(13, "\n").await;
    let proxy = spawn_proxy(&up.url(), &["--inject-usage"]).await;
    let request = chat_request(true, true);
    let seen = client::post(&format!("{}/v1/chat/completions", proxy.url()), &request).await;
    assert_eq!(
        seen.body,
        body(true, "\n"),
        "the usage chunk the client asked for stays"
    );
    let received = up.received.lock().expect("lock").clone();
    assert_eq!(
        received[0].body,
        request.as_bytes(),
        "request forwarded unchanged"
    );
    let s = proxy.settled(1.0).await;
    assert_eq!(metric(names::OUTPUT_TOKENS_TOTAL).sum(&s), OUTPUT as f64);
}

#[tokio::test]
async fn what_is_not_an_openai_stream_is_left_alone() {
    let up = upstream::spawn(|req| Reply {
        head_delay: Duration::ZERO,
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        steps: vec![Step::Send(Bytes::from(req.body.to_vec()))],
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &["--inject-usage"]).await;
    // An echo upstream: what comes back is what reached it.
    for (path, request) in [
        ("/v1/chat/completions", chat_request(false, false)),
        ("/v1/messages", r#"{"model":"m","stream":true}"#.to_string()),
        (
            "/v1/chat/completions",
            r#"{"stream":true,"stream_options":{"continuous_usage_stats":true}}"#.to_string(),
        ),
    ] {
        let seen = client::post(&format!("{}{path}", proxy.url()), &request).await;
        assert_eq!(seen.body, request.as_bytes(), "{path} {request}");
    }
    // Over --max-request-body the body is not read, so not rewritten either.
    let proxy = spawn_proxy(&up.url(), &["--inject-usage", "--max-request-body", "16"]).await;
    let request = chat_request(true, false);
    let seen = client::post(&format!("{}/v1/chat/completions", proxy.url()), &request).await;
    assert_eq!(seen.body, request.as_bytes());
}

// Regression: the filter's SSE test was case-sensitive (`starts_with("text/event-stream")`)
// while the meter's framing test is not, so a server spelling its media type in capitals had
// the injected usage chunk metered and also passed on to a client that never asked for it.
#[tokio::test]
async fn the_usage_chunk_is_removed_whatever_the_media_type_case() {
    let up = vllm_like_as(29, "\n", "Text/Event-Stream; charset=utf-8").await;
    let proxy = spawn_proxy(&up.url(), &["--inject-usage"]).await;
    let seen = client::post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &chat_request(true, false),
    )
    .await;
    assert_eq!(seen.status, 200);
    assert!(
        seen.body == body(false, "\n"),
        "the client sees the stream without the usage chunk:\n{}",
        String::from_utf8_lossy(&seen.body)
    );
    let s = proxy.settled(1.0).await;
    assert_eq!(metric(names::OUTPUT_TOKENS_TOTAL).sum(&s), OUTPUT as f64);
}

/// [`vllm_like`], also serving a `/metrics` page in vLLM's dialect, as vLLM does.
async fn vllm_with_metrics() -> upstream::Upstream {
    upstream::spawn(|req| {
        if req.path == "/metrics" {
            return Reply {
                head_delay: Duration::ZERO,
                status: 200,
                headers: vec![("content-type".into(), "text/plain".into())],
                steps: vec![Step::Send(Bytes::from_static(
                    b"vllm:num_requests_running{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 0\n",
                ))],
            };
        }
        Reply {
            head_delay: Duration::ZERO,
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            steps: vec![Step::Send(Bytes::from(body(asks_for_usage(req), "\n")))],
        }
    })
    .await
}

/// The proxy's scrape once it has read the engine's page at least once.
async fn engine_read(proxy: &crate::support::Proxy) -> String {
    proxy
        .eventually(|s| {
            metric(names::engine_view::SCRAPES)
                .label("result", "ok")
                .sum_or_zero_if_absent(s)
                >= 1.0
        })
        .await
}

#[tokio::test]
async fn by_default_usage_is_asked_for_once_the_upstream_is_known_to_be_vllm() {
    let up = vllm_with_metrics().await;
    let page = format!("{}/metrics", up.url());
    let request = chat_request(true, false);
    for (flags, injects) in [
        (vec!["--engine-metrics", page.as_str()], true),
        (
            vec!["--engine-metrics", page.as_str(), "--inject-usage", "off"],
            false,
        ),
    ] {
        let proxy = spawn_proxy(&up.url(), &flags).await;
        let s = engine_read(&proxy).await;
        assert_eq!(
            metric(names::engine_view::SCRAPES)
                .label("result", "ok")
                .sum_or_zero_if_absent(&s)
                .min(1.0),
            1.0,
            "{flags:?}: the engine's page was read"
        );
        let seen = client::post(&format!("{}/v1/chat/completions", proxy.url()), &request).await;
        assert_eq!(
            seen.body,
            body(false, "\n"),
            "{flags:?}: the client's bytes"
        );
        let last = up
            .received
            .lock()
            .expect("lock")
            .iter()
            .rfind(|r| r.path == "/v1/chat/completions")
            .cloned()
            .expect("the request reached the upstream");
        assert_eq!(asks_for_usage(&last), injects, "{flags:?}");
        let s = proxy.settled(1.0).await;
        let (source, output) = if injects {
            ("usage", OUTPUT)
        } else {
            ("counted", CHUNK_TOKENS.len())
        };
        assert_eq!(
            metric(names::TOKEN_COUNT_SOURCE_TOTAL)
                .label("source", source)
                .sum(&s),
            1.0,
            "{flags:?}"
        );
        assert_eq!(
            metric(names::OUTPUT_TOKENS_TOTAL).sum(&s),
            output as f64,
            "{flags:?}"
        );
    }
}

#[tokio::test]
async fn openais_own_headers_stop_auto_for_good() {
    // An upstream that answers in OpenAI's API's manner: its headers, and no page of metrics.
    let up = upstream::spawn(|req| Reply {
        head_delay: Duration::ZERO,
        status: 200,
        headers: vec![
            ("content-type".into(), "text/event-stream".into()),
            ("openai-version".into(), "2020-10-01".into()),
            ("openai-processing-ms".into(), "12".into()),
        ],
        steps: vec![Step::Send(Bytes::from(body(asks_for_usage(req), "\n")))],
    })
    .await;
    let request = chat_request(true, false);
    for flags in [vec![], vec!["--inject-usage", "on"]] {
        let proxy = spawn_proxy(&up.url(), &flags).await;
        for _ in 0..2 {
            client::post(&format!("{}/v1/chat/completions", proxy.url()), &request).await;
        }
        let received = up.received.lock().expect("lock").clone();
        let asked: Vec<bool> = received.iter().rev().take(2).map(asks_for_usage).collect();
        // `auto` knows nothing of this upstream and never learns it is an engine; `on` asks
        // whatever the headers say.
        assert_eq!(asked, vec![!flags.is_empty(); 2], "{flags:?}");
    }
}
