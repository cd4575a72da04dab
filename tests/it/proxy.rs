//! The proxy core: byte-exact passthrough, no buffering, timing metrics, disconnects,
//! upstream failures, bounded parsing, and an exposition that promtool accepts.

use std::io::{Read, Write};
use std::time::Duration;

use bytes::Bytes;

use tokenmeter::metrics::names;

use crate::support::client::{self, chat_request};
use crate::support::metrics::metric;
use crate::support::upstream::{self, Reply, Step};
use crate::support::{corpus, promtool, spawn_proxy, stream_once, Rng, Streamed};

const MS: Duration = Duration::from_millis(1);

#[tokio::test]
async fn every_corpus_body_passes_through_byte_for_byte_in_random_pieces() {
    let _turn = crate::support::serial().await;
    let Some(entries) = corpus::load("corpus passthrough") else {
        return;
    };
    let bodies: std::collections::HashMap<String, (Vec<u8>, String)> = entries
        .iter()
        .map(|e| {
            let ct = if e.path.ends_with(".ndjson") {
                "application/x-ndjson"
            } else {
                "text/event-stream"
            };
            (e.path.clone(), (e.body.clone(), ct.to_string()))
        })
        .collect();
    let bodies = std::sync::Arc::new(bodies);
    let served = bodies.clone();
    let up = upstream::spawn(move |req| {
        // The request path carries the corpus file name and the piece-size seed.
        let q = req.path.split("file=").nth(1).unwrap_or("");
        let (name, max) = q.split_once("&max=").unwrap_or((q, "1"));
        let (body, ct) = served.get(name).cloned().unwrap_or_default();
        let max: usize = max.parse().unwrap_or(1);
        let mut rng = Rng::new(body.len() as u64 + max as u64);
        let steps = rng
            .pieces(&body, 1, max)
            .into_iter()
            .map(Step::Send)
            .collect();
        Reply {
            head_delay: Duration::ZERO,
            status: 200,
            headers: vec![("content-type".into(), ct)],
            steps,
        }
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let sizes = [1, 13, 512, 64 * 1024];
    for (i, e) in entries.iter().enumerate() {
        let max = sizes[i % sizes.len()];
        let path = e
            .endpoint
            .split_whitespace()
            .nth(1)
            .unwrap_or("/")
            .to_string();
        let path = path.split("://").nth(1).map_or(path.clone(), |p| {
            p.find('/').map_or("/".into(), |i| {
                p[i..].split('?').next().unwrap_or("/").into()
            })
        });
        let ok = |c: char| c.is_ascii_alphanumeric() || "/_.:-".contains(c);
        let path = if path.starts_with('/') && path.chars().all(ok) {
            path
        } else {
            "/".into()
        };
        let url = format!("{}{}?file={}&max={}", proxy.url(), path, e.path, max);
        let seen = client::post(&url, "{}").await;
        assert_eq!(seen.status, 200, "{}", e.path);
        assert!(
            seen.body == bodies[&e.path].0,
            "{} (pieces up to {max} bytes) changed in transit: {} bytes in, {} out",
            e.path,
            bodies[&e.path].0.len(),
            seen.body.len()
        );
    }
    let n = entries.len() as f64;
    let s = proxy
        .eventually(|s| {
            metric(names::REQUESTS_TOTAL)
                .label("outcome", "complete")
                .sum_or_zero_if_absent(s)
                == n
        })
        .await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "complete")
            .sum(&s),
        n
    );
}

#[tokio::test]
async fn malformed_bodies_pass_through_unchanged_and_long_lines_are_counted() {
    let mut rng = Rng::new(7);
    let garbage: Vec<u8> = (0..200_000).map(|_| rng.next_u64() as u8).collect();
    let mut long_line = b"data: {\"choices\":[{\"delta\":{\"content\":\"".to_vec();
    long_line.extend(std::iter::repeat(b'x').take(3 << 20));
    long_line
        .extend_from_slice(b"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\n");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", garbage),
        (
            "bad-utf8",
            b"data: \xff\xfe{\"choices\":[\n\n\xc3\x28 data: [DONE]\r\r\n".to_vec(),
        ),
        (
            "broken-json",
            b"data: {\"choices\":[{\"delta\":{\"content\n\ndata: {}}}\n\n".to_vec(),
        ),
        ("long-line", long_line),
    ];
    let bodies = std::sync::Arc::new(cases.clone());
    let up = upstream::spawn(move |req| {
        let i: usize = req
            .path
            .rsplit('/')
            .next()
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        let mut rng = Rng::new(i as u64 + 1);
        Reply {
            head_delay: Duration::ZERO,
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            steps: rng
                .pieces(&bodies[i].1, 1, 70_000)
                .into_iter()
                .map(Step::Send)
                .collect(),
        }
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    for (i, (name, body)) in cases.iter().enumerate() {
        let seen = client::post(&format!("{}/v1/chat/completions/{i}", proxy.url()), "{}").await;
        // The path ends in /{i}, so it is not routed to the OpenAI parser; repeat on the real path.
        assert!(seen.body == *body, "{name} changed in transit");
    }
    let up2 = upstream::spawn({
        let cases = cases.clone();
        move |req| {
            let i: usize = req
                .path
                .split("case=")
                .nth(1)
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            Reply {
                head_delay: Duration::ZERO,
                status: 200,
                headers: vec![("content-type".into(), "text/event-stream".into())],
                steps: vec![Step::Send(Bytes::from(cases[i].1.clone()))],
            }
        }
    })
    .await;
    let proxy = spawn_proxy(&up2.url(), &[]).await;
    for (i, (name, body)) in cases.iter().enumerate() {
        let seen = client::post(
            &format!("{}/v1/chat/completions?case={i}", proxy.url()),
            "{}",
        )
        .await;
        assert!(
            seen.body == *body,
            "{name} changed in transit (parsed path)"
        );
    }
    let s = proxy
        .eventually(|s| {
            metric(names::REQUESTS_TOTAL).sum_or_zero_if_absent(s) == cases.len() as f64
        })
        .await;
    assert_eq!(
        metric(names::PARSE_ERRORS_TOTAL)
            .label("reason", "line_too_long")
            .value(&s),
        1.0,
        "the 3 MiB line is over the 1 MiB default"
    );
    // The event after the long line is still read: exactly one token in that request, and the
    // broken-JSON events are counted.
    assert!(
        metric(names::PARSE_ERRORS_TOTAL)
            .label("reason", "invalid_json")
            .value(&s)
            >= 2.0
    );
}

#[tokio::test]
async fn an_event_reaches_the_client_before_the_upstream_pauses() {
    let _turn = crate::support::serial().await;
    let up = upstream::spawn(|_| {
        Reply::sse(vec![
            Step::Send(Bytes::from_static(
                b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            )),
            Step::Sleep(Duration::from_secs(1)),
            Step::Send(Bytes::from_static(b"data: [DONE]\n\n")),
        ])
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let seen = client::post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &chat_request(true, false),
    )
    .await;
    assert_eq!(seen.frames.len(), 2, "{:?}", seen.frames);
    let (first, second) = (seen.frames[0].0, seen.frames[1].0);
    // Sent at once by the upstream: a buffering proxy would deliver it with the second, 1 s later.
    assert!(first < 200 * MS, "first event arrived after {first:?}");
    assert!(
        second - first > 800 * MS,
        "events {first:?} and {second:?} were not a pause apart"
    );
}

fn timed_upstream_steps() -> Vec<Step> {
    upstream::openai_chat(250 * MS, 40, 25 * MS, true)
}

#[tokio::test]
async fn ttft_speed_and_exact_tokens_of_a_timed_stream() {
    let _turn = crate::support::serial().await;
    let Streamed {
        seen, scrape: s, ..
    } = stream_once(timed_upstream_steps(), &[]).await;
    assert_eq!(seen.status, 200);
    let m = |n: &str| metric(n).label("model", "test-model");
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("model", "test-model")
            .label("code", "200")
            .label("outcome", "complete")
            .label("api", "openai")
            .value(&s),
        1.0
    );
    assert_eq!(m(names::OUTPUT_TOKENS_TOTAL).value(&s), 40.0);
    assert_eq!(m(names::INPUT_TOKENS_TOTAL).value(&s), 12.0);
    assert_eq!(
        metric(names::TOKEN_COUNT_SOURCE_TOTAL)
            .label("source", "usage")
            .value(&s),
        1.0
    );
    // The upstream's sleeps set lower bounds (250 ms, 25 ms gaps); a loaded machine can only
    // stretch them. So the proxy's figures are checked against those bounds and against what
    // the client itself saw, which the proxy must match.
    let content: Vec<f64> = seen
        .frames
        .iter()
        .filter(|(_, b)| {
            let needle = b"\"content\":\"t";
            b.windows(needle.len()).any(|w| w == needle)
        })
        .map(|(t, _)| t.as_secs_f64())
        .collect();
    let (client_ttft, client_last) = (content[0], content[content.len() - 1]);
    let ttft = m("tokenmeter_time_to_first_token_seconds_sum").value(&s);
    assert!(
        ttft >= 0.25 && ttft <= client_ttft,
        "TTFT {ttft}: at least the upstream's 250 ms, at most the client's {client_ttft}"
    );
    // One ITL observation per token after the first.
    assert_eq!(
        m("tokenmeter_inter_token_latency_seconds_count").value(&s),
        39.0
    );
    let tps = metric("tokenmeter_request_tokens_per_second_sum")
        .label("model", "test-model")
        .label("concurrency", "1")
        .value(&s);
    assert!(
        tps <= 40.0 * 1.01,
        "{tps} tok/s is faster than the upstream sent"
    );
    if content.len() == 40 {
        // Frames arrived one per event: the client's own speed is comparable.
        let client_tps = 39.0 / (client_last - client_ttft);
        assert!(
            (tps / client_tps - 1.0).abs() < 0.05,
            "proxy {tps} tok/s vs client {client_tps} tok/s"
        );
    }
    assert!(
        tps > 20.0,
        "{tps} tok/s: not even half the upstream's speed"
    );
    let tpot = m("tokenmeter_time_per_output_token_seconds_sum").value(&s);
    assert!(
        (1.0 / tpot - tps).abs() < 1e-6 * tps,
        "TPOT {tpot} is not 1 / {tps}"
    );
    assert_eq!(metric(names::REQUESTS_IN_FLIGHT).sum(&s), 0.0);
}

#[tokio::test]
async fn eight_concurrent_streams_land_in_band_5_to_8() {
    let _turn = crate::support::serial().await;
    let up = upstream::spawn(|_| Reply::sse(timed_upstream_steps())).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let body = chat_request(true, true);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (url, body) = (url.clone(), body.clone());
            tokio::spawn(async move { client::post(&url, &body).await })
        })
        .collect();
    for t in tasks {
        assert!(t.await.expect("join").body.ends_with(b"data: [DONE]\n\n"));
    }
    let s = proxy.settled(8.0).await;
    assert_eq!(
        metric("tokenmeter_request_tokens_per_second_count")
            .label("concurrency", "5-8")
            .value(&s),
        8.0,
        "every request decoded with 8 in flight"
    );
    assert_eq!(metric(names::OUTPUT_TOKENS_TOTAL).value(&s), 320.0);
}

#[tokio::test]
async fn fifty_clients_hanging_up_mid_stream_leave_no_trace() {
    let up = upstream::spawn(|_| Reply::sse(upstream::openai_chat(MS, 200, 20 * MS, true))).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let addr = proxy.addr;
    let body = chat_request(true, true);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let body = body.clone();
            tokio::task::spawn_blocking(move || {
                let mut s = std::net::TcpStream::connect(addr).expect("connect");
                write!(
                    s,
                    "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .expect("write");
                // Read until a content chunk has arrived, then hang up.
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !String::from_utf8_lossy(&got).contains("\"t1 \"") {
                    let n = s.read(&mut buf).expect("read");
                    assert!(n > 0, "stream ended early");
                    got.extend_from_slice(&buf[..n]);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("client");
    }
    let s = proxy
        .eventually(|s| {
            metric(names::REQUESTS_TOTAL)
                .label("outcome", "client_disconnect")
                .sum_or_zero_if_absent(s)
                == 50.0
                && metric(names::REQUESTS_IN_FLIGHT).sum(s) == 0.0
        })
        .await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "client_disconnect")
            .value(&s),
        50.0
    );
    assert_eq!(
        metric(names::REQUESTS_IN_FLIGHT)
            .label("phase", "prefill")
            .value(&s),
        0.0
    );
    assert_eq!(
        metric(names::REQUESTS_IN_FLIGHT)
            .label("phase", "decode")
            .value(&s),
        0.0
    );
    // Tokens seen before the hang-up are still counted (at least 2 per request).
    assert!(metric(names::OUTPUT_TOKENS_TOTAL).value(&s) >= 100.0);
    // A stream cut mid-line is not malformed input.
    assert_eq!(
        metric(names::PARSE_ERRORS_TOTAL)
            .label("reason", "invalid_json")
            .value(&s),
        0.0
    );
    for _ in 0..100 {
        if up.closed() == up.opened() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(up.opened(), 50, "one upstream connection per stream");
    assert_eq!(up.closed(), 50, "every upstream connection was closed");
    assert_eq!(up.abandoned.load(std::sync::atomic::Ordering::SeqCst), 50);
}

/// An Anthropic stream of three tokens, up to `message_delta`.
const ANTHROPIC_UNTIL_DELTA: &[&str] = &[
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-test\",\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"b\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"c\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n",
];

const MESSAGE_STOP: &str = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// Reads `body` until what arrived ends with `tail`; returns it all.
async fn read_until(body: &mut hyper::body::Incoming, tail: &str) -> Vec<u8> {
    use http_body_util::BodyExt;
    let mut got = Vec::new();
    while !got.ends_with(tail.as_bytes()) {
        let frame = body.frame().await.expect("the body is still open");
        if let Ok(data) = frame.expect("no body error").into_data() {
            got.extend_from_slice(&data);
        }
    }
    got
}

// A client (GuideLLM, an SDK) opens its next request the moment it reads the stream's end
// marker, and may hang up before the HTTP body ends. For Anthropic that marker is
// `message_stop`: from then on the request is no longer in flight, and is complete.
#[tokio::test]
async fn an_anthropic_stream_leaves_the_gauges_at_message_stop_while_its_body_is_open() {
    let up = upstream::spawn(|req| {
        let mut steps: Vec<Step> = ANTHROPIC_UNTIL_DELTA
            .iter()
            .map(|e| Step::Send(Bytes::from_static(e.as_bytes())))
            .collect();
        if !req.path.contains("cut") {
            steps.push(Step::Send(Bytes::from_static(MESSAGE_STOP.as_bytes())));
        }
        // The body never ends: only the client can finish this request.
        steps.push(Step::Hang);
        Reply::sse(steps)
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let open = |path: &str| {
        let req = http::Request::post(format!("{}{path}", proxy.url()))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from_static(
                b"{\"stream\":true}",
            )))
            .expect("request");
        client::client().request(req)
    };
    let in_flight = |s: &str| metric(names::REQUESTS_IN_FLIGHT).sum(s);
    let requests = |s: &str, outcome| {
        metric(names::REQUESTS_TOTAL)
            .label("api", "anthropic")
            .label("model", "claude-test")
            .label("outcome", outcome)
            .value(s)
    };

    // Without `message_stop`, a stream whose every token has arrived is still in flight, and a
    // client that leaves then did not get the whole response.
    let mut body = open("/v1/messages?cut")
        .await
        .expect("response")
        .into_body();
    read_until(&mut body, ANTHROPIC_UNTIL_DELTA[6]).await;
    let s = proxy.scrape().await;
    assert_eq!(in_flight(&s), 1.0, "{s}");
    assert_eq!(
        metric(names::REQUESTS_IN_FLIGHT)
            .label("phase", "decode")
            .value(&s),
        1.0
    );
    drop(body);
    let s = proxy.settled(1.0).await;
    assert_eq!(requests(&s, "client_disconnect"), 1.0, "{s}");

    // With it, the request leaves the gauges as `message_stop` passes, the body still open...
    let mut body = open("/v1/messages").await.expect("response").into_body();
    let got = read_until(&mut body, MESSAGE_STOP).await;
    assert_eq!(
        got,
        [ANTHROPIC_UNTIL_DELTA.concat(), MESSAGE_STOP.into()]
            .concat()
            .as_bytes()
    );
    let s = proxy.scrape().await;
    assert_eq!(in_flight(&s), 0.0, "{s}");
    assert_eq!(
        metric(names::REQUESTS_TOTAL).sum(&s),
        1.0,
        "the second request is not finished yet:\n{s}"
    );
    // ... and a client that hangs up then received the whole response.
    drop(body);
    let s = proxy.settled(2.0).await;
    assert_eq!(requests(&s, "complete"), 1.0, "{s}");
    assert_eq!(requests(&s, "client_disconnect"), 1.0, "{s}");
    assert_eq!(in_flight(&s), 0.0);
    assert_eq!(
        metric(names::OUTPUT_TOKENS_TOTAL)
            .label("model", "claude-test")
            .value(&s),
        6.0,
        "3 tokens by usage in each request"
    );
    for _ in 0..100 {
        if up.abandoned.load(std::sync::atomic::Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(20 * MS).await;
    }
    assert_eq!(
        up.abandoned.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "both upstream bodies were still open when the clients left"
    );
}

#[tokio::test]
async fn unreachable_upstream_gives_502_json_and_is_counted() {
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let proxy = spawn_proxy(&format!("http://127.0.0.1:{port}"), &[]).await;
    let seen = client::post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &chat_request(true, false),
    )
    .await;
    assert_eq!(seen.status, 502);
    let json: serde_json::Value = serde_json::from_slice(&seen.body).expect("JSON error body");
    assert_eq!(json["error"]["type"], "upstream_unavailable");
    let s = proxy.scrape().await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("code", "502")
            .label("outcome", "upstream_error")
            .label("model", "req-model")
            .value(&s),
        1.0
    );
    assert_eq!(metric(names::REQUESTS_IN_FLIGHT).sum(&s), 0.0);
}

#[tokio::test]
async fn non_streaming_json_is_measured_from_usage() {
    let up = upstream::spawn(|_| {
        Reply::json(
            200,
            r#"{"id":"x","object":"chat.completion","model":"json-model","choices":[{"index":0,"message":{"role":"assistant","content":"hi there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#,
        )
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let seen = client::post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &chat_request(false, false),
    )
    .await;
    assert_eq!(seen.status, 200);
    let s = proxy.settled(1.0).await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "complete")
            .label("model", "json-model")
            .value(&s),
        1.0,
        "a Content-Length body read to its end is complete"
    );
    assert_eq!(
        metric(names::OUTPUT_TOKENS_TOTAL)
            .label("model", "json-model")
            .value(&s),
        3.0
    );
    assert_eq!(
        metric(names::INPUT_TOKENS_TOTAL)
            .label("model", "json-model")
            .value(&s),
        9.0
    );
    assert_eq!(
        metric("tokenmeter_request_duration_seconds_count")
            .label("model", "json-model")
            .value(&s),
        1.0
    );
    assert_eq!(
        metric("tokenmeter_time_to_first_token_seconds_count").sum_or_zero_if_absent(&s),
        0.0
    );
}

#[tokio::test]
async fn requests_and_headers_are_forwarded_with_hop_by_hop_headers_removed() {
    let up = upstream::spawn(|req| {
        let mut r = Reply::json(201, &format!("{{\"echo\":{}}}", req.body.len()));
        r.headers.push(("x-upstream".into(), "yes".into()));
        r.headers.push(("connection".into(), "keep-alive".into()));
        r
    })
    .await;
    let proxy = spawn_proxy(&format!("{}/prefix", up.url()), &[]).await;
    let req = http::Request::builder()
        .method("PUT")
        .uri(format!("{}/any/path?q=1", proxy.url()))
        .header("authorization", "Bearer secret")
        .header("x-custom", "kept")
        .header("te", "trailers")
        .body(http_body_util::Full::new(Bytes::from_static(b"0123456789")))
        .expect("request");
    let resp = client::client().request(req).await.expect("response");
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers()["x-upstream"], "yes");
    let got = up.received.lock().expect("lock")[0].clone();
    assert_eq!(got.method, "PUT");
    assert_eq!(got.path, "/prefix/any/path?q=1");
    assert_eq!(&got.body[..], b"0123456789");
    let has = |k: &str| got.headers.iter().any(|(n, _)| n == k);
    assert!(has("authorization") && has("x-custom"));
    assert!(!has("te"), "hop-by-hop header forwarded: {:?}", got.headers);
}

#[tokio::test]
async fn promtool_accepts_the_exposition() {
    let s = stream_once(upstream::openai_chat(MS, 5, MS, true), &[]).await;
    if let Some(lint) = promtool::lint(&s.scrape) {
        assert!(
            lint.is_empty(),
            "promtool check metrics:\n{}",
            lint.join("\n")
        );
    }
}

#[tokio::test]
async fn aggregate_rate_gauges_and_bucket_overrides() {
    let up = upstream::spawn(|_| Reply::sse(upstream::openai_chat(MS, 40, MS, true))).await;
    let proxy = spawn_proxy(
        &up.url(),
        &[
            "--gpus",
            "2",
            "--rate-window",
            "30s",
            "--buckets-ttft",
            "0.1,0.2",
        ],
    )
    .await;
    for _ in 0..3 {
        client::post(
            &format!("{}/v1/chat/completions", proxy.url()),
            &chat_request(true, true),
        )
        .await;
    }
    let s = proxy.settled(3.0).await;
    // 120 tokens inside a 30 s window.
    assert_eq!(metric(names::OUTPUT_TOKENS_PER_SECOND).value(&s), 4.0);
    assert_eq!(
        metric(names::OUTPUT_TOKENS_PER_SECOND_PER_GPU).value(&s),
        2.0
    );
    assert_eq!(metric(names::GPUS).value(&s), 2.0);
    let les: Vec<&str> = s
        .lines()
        .filter(|l| l.starts_with("tokenmeter_time_to_first_token_seconds_bucket"))
        .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(les, ["0.1", "0.2", "+Inf"]);
    assert_eq!(
        metric(names::BUILD_INFO)
            .label("version", env!("CARGO_PKG_VERSION"))
            .value(&s),
        1.0
    );
}
