//! Reliability: upstream faults, client faults, bad bodies, protocol variety, and the
//! security rules. tokenmeter must never be the reason a user loses a response.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use tokenmeter::metrics::names;

use crate::support::client::{self, chat_request};
use crate::support::metrics::metric;
use crate::support::upstream::{self, Reply, Step};
use crate::support::{spawn_proxy, Proxy, Rng};

const MS: Duration = Duration::from_millis(1);

fn chat_url(proxy: &Proxy) -> String {
    format!("{}/v1/chat/completions", proxy.url())
}

#[tokio::test]
async fn upstream_reset_mid_stream_ends_the_client_stream_the_same_way() {
    let up = upstream::spawn(|_| {
        let mut steps = upstream::openai_chat(MS, 5, MS, false);
        steps.truncate(6); // role chunk + 5 tokens... cut before [DONE]
        steps.push(Step::Abort);
        Reply::sse(steps)
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let seen = client::post(&chat_url(&proxy), &chat_request(true, false)).await;
    assert!(
        seen.error,
        "the client must see the stream break, not a clean end"
    );
    assert!(!seen.body.ends_with(b"[DONE]\n\n"));
    let s = proxy.settled(1.0).await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "upstream_error")
            .label("code", "200")
            .value(&s),
        1.0
    );
    assert!(metric(names::OUTPUT_TOKENS_TOTAL).value(&s) >= 2.0);
}

#[tokio::test]
async fn upstream_that_never_sends_headers_times_out_with_504() {
    let up = upstream::spawn(|_| {
        let mut r = Reply::sse(upstream::openai_chat(MS, 2, MS, false));
        r.head_delay = Duration::from_secs(5);
        r
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &["--upstream-timeout", "300ms"]).await;
    let start = Instant::now();
    let seen = client::post(&chat_url(&proxy), &chat_request(true, false)).await;
    assert_eq!(seen.status, 504);
    assert!(start.elapsed() < Duration::from_secs(3));
    let json: serde_json::Value = serde_json::from_slice(&seen.body).expect("JSON body");
    assert_eq!(json["error"]["type"], "upstream_timeout");
    let s = proxy.settled(1.0).await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "timeout")
            .label("code", "504")
            .value(&s),
        1.0
    );
}

#[tokio::test]
async fn upstream_that_stalls_mid_stream_is_cut_after_the_idle_timeout() {
    let up = upstream::spawn(|_| {
        let mut steps = upstream::openai_chat(MS, 3, MS, false);
        steps.insert(4, Step::Hang);
        Reply::sse(steps)
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &["--idle-timeout", "300ms"]).await;
    let start = Instant::now();
    let seen = client::post(&chat_url(&proxy), &chat_request(true, false)).await;
    assert!(
        seen.error,
        "a stalled stream ends with an error, not as if complete"
    );
    assert!(start.elapsed() < Duration::from_secs(3));
    let s = proxy.settled(1.0).await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "timeout")
            .value(&s),
        1.0
    );
    for _ in 0..50 {
        if up.closed() == up.opened() {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    assert_eq!(
        up.closed(),
        up.opened(),
        "the stalled upstream connection was released"
    );
}

#[tokio::test]
async fn upstream_errors_pass_through_unchanged_and_are_counted_by_code() {
    let up = upstream::spawn(|req| {
        let code = if req.path.contains("bad") { 400 } else { 503 };
        let mut r = Reply::json(
            code,
            &format!("{{\"error\":{{\"message\":\"nope {code}\"}}}}"),
        );
        r.headers.push(("retry-after".into(), "7".into()));
        r
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let seen = client::post(
        &format!("{}/v1/chat/completions?bad", proxy.url()),
        &chat_request(true, false),
    )
    .await;
    assert_eq!(
        (seen.status, &seen.body[..]),
        (400, &br#"{"error":{"message":"nope 400"}}"#[..])
    );
    let seen = client::post(&chat_url(&proxy), &chat_request(true, false)).await;
    assert_eq!(seen.status, 503);
    assert_eq!(seen.headers["retry-after"], "7");
    let s = proxy.settled(2.0).await;
    for code in ["400", "503"] {
        assert_eq!(
            metric(names::REQUESTS_TOTAL)
                .label("code", code)
                .label("outcome", "complete")
                .value(&s),
            1.0,
            "{code}"
        );
    }
}

#[tokio::test]
async fn client_hanging_up_during_prefill_cancels_the_upstream_request() {
    let up = upstream::spawn(|_| {
        let mut r = Reply::sse(upstream::openai_chat(MS, 2, MS, false));
        r.head_delay = Duration::from_secs(3);
        r
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let addr = proxy.addr;
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        let body = chat_request(true, false);
        write!(s, "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()).expect("write");
        std::thread::sleep(Duration::from_millis(300));
    })
    .await
    .expect("client");
    let s = proxy.settled(1.0).await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "client_disconnect")
            .value(&s),
        1.0
    );
    assert_eq!(
        metric(names::REQUESTS_IN_FLIGHT)
            .label("phase", "prefill")
            .value(&s),
        0.0
    );
    for _ in 0..40 {
        if up.closed() == 1 {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    assert_eq!(up.closed(), 1, "the upstream request was not cancelled");
}

#[tokio::test]
async fn a_slow_reader_holds_the_upstream_back_instead_of_growing_a_buffer() {
    let _turn = crate::support::serial().await;
    const PIECE: usize = 64 * 1024;
    const PIECES: usize = 2048; // 128 MiB
    let up = upstream::spawn(|_| {
        let piece = Bytes::from(vec![b'x'; PIECE]);
        let mut r = Reply::sse((0..PIECES).map(|_| Step::Send(piece.clone())).collect());
        r.headers = vec![("content-type".into(), "application/octet-stream".into())];
        r
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let req = http::Request::get(format!("{}/big", proxy.url()))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = client::client().request(req).await.expect("response");
    // Read nothing for a second: only socket and fixed-size buffers may fill.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let in_flight = up.sent_bytes.load(Ordering::SeqCst);
    assert!(
        in_flight < 48 << 20,
        "{} MiB left the upstream while the client read nothing",
        in_flight >> 20
    );
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body.len(), PIECE * PIECES);
    assert!(body.iter().all(|&b| b == b'x'));
}

#[tokio::test]
async fn slowloris_headers_are_cut_off_after_the_header_read_timeout() {
    let up = upstream::spawn(|_| Reply::json(200, "{}")).await;
    let proxy = spawn_proxy(&up.url(), &["--header-read-timeout", "500ms"]).await;
    let addr = proxy.addr;
    let closed_after = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            .expect("write");
        let start = Instant::now();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        (start.elapsed(), buf)
    })
    .await
    .expect("client");
    assert!(
        closed_after.0 < Duration::from_secs(3),
        "connection held for {:?}",
        closed_after.0
    );
    assert_eq!(
        up.opened(),
        0,
        "an incomplete request must not reach the upstream"
    );
}

#[tokio::test]
async fn oversized_headers_are_refused_and_the_proxy_keeps_serving() {
    let up = upstream::spawn(|_| Reply::json(200, "{\"ok\":true}")).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let addr = proxy.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let huge = "a".repeat(2 << 20);
        let _ = write!(s, "GET / HTTP/1.1\r\nhost: x\r\nx-huge: {huge}\r\n\r\n");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
    .await
    .expect("client");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    assert_eq!(up.opened(), 0);
    let seen = client::post(&chat_url(&proxy), "{}").await;
    assert_eq!(seen.body, b"{\"ok\":true}");
}

#[tokio::test]
async fn pipelined_requests_on_one_connection_are_answered_in_order() {
    let up =
        upstream::spawn(|req| Reply::json(200, &format!("{{\"path\":\"{}\"}}", req.path))).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let addr = proxy.addr;
    let text = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /one HTTP/1.1\r\nhost: x\r\n\r\nGET /two HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .expect("write");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).expect("read");
        String::from_utf8_lossy(&buf).into_owned()
    })
    .await
    .expect("client");
    let one = text.find("{\"path\":\"/one\"}").expect("first answer");
    let two = text.find("{\"path\":\"/two\"}").expect("second answer");
    assert!(one < two, "{text}");
    assert_eq!(text.matches("HTTP/1.1 200").count(), 2);
}

#[tokio::test]
async fn http2_clients_and_h2c_upstreams_work_and_are_metered() {
    let up = upstream::spawn(|_| Reply::sse(upstream::openai_chat(MS, 10, MS, true))).await;
    for extra in [&[][..], &["--upstream-http2"][..]] {
        let proxy = spawn_proxy(&up.url(), extra).await;
        let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http();
        let req = http::Request::post(chat_url(&proxy))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(chat_request(true, true))))
            .expect("request");
        let resp = h2.request(req).await.expect("h2 response");
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(body.ends_with(b"data: [DONE]\n\n"), "{extra:?}");
        let s = proxy.settled(1.0).await;
        assert_eq!(
            metric(names::OUTPUT_TOKENS_TOTAL).value(&s),
            10.0,
            "{extra:?}"
        );
    }
}

#[tokio::test]
async fn a_50_mb_line_is_forwarded_whole_and_counted_not_parsed() {
    let _turn = crate::support::serial().await;
    let mut body = b"data: ".to_vec();
    body.extend(std::iter::repeat(b'y').take(50 << 20));
    body.extend_from_slice(b"\n\ndata: [DONE]\n\n");
    let expected = Bytes::from(body);
    let served = expected.clone();
    let up = upstream::spawn(move |_| {
        let mut rng = Rng::new(3);
        Reply::sse(
            rng.pieces(&served, 1 << 10, 1 << 16)
                .into_iter()
                .map(Step::Send)
                .collect(),
        )
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let seen = client::post(&chat_url(&proxy), &chat_request(true, false)).await;
    assert!(seen.body == expected, "50 MB line changed in transit");
    let s = proxy.settled(1.0).await;
    assert_eq!(
        metric(names::PARSE_ERRORS_TOTAL)
            .label("reason", "line_too_long")
            .value(&s),
        1.0
    );
}

#[tokio::test]
async fn a_gzip_encoded_event_stream_is_forwarded_untouched_and_counted() {
    // Not valid gzip on purpose: tokenmeter must not try to decode it either way.
    let payload = Bytes::from_static(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage-gzip-bytes");
    let served = payload.clone();
    let up = upstream::spawn(move |_| {
        let mut r = Reply::sse(vec![Step::Send(served.clone())]);
        r.headers.push(("content-encoding".into(), "gzip".into()));
        r
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let seen = client::post(&chat_url(&proxy), &chat_request(true, false)).await;
    assert_eq!(seen.headers["content-encoding"], "gzip");
    assert_eq!(seen.body, payload);
    let s = proxy.settled(1.0).await;
    assert_eq!(
        metric(names::PARSE_ERRORS_TOTAL)
            .label("reason", "content_encoding")
            .value(&s),
        1.0
    );
}

#[tokio::test]
async fn a_stream_that_never_ends_flows_until_the_client_leaves() {
    let up = upstream::spawn(|_| {
        let mut steps = vec![];
        for _ in 0..100_000 {
            steps.push(Step::Send(Bytes::from_static(b": keep-alive\n\n")));
            steps.push(Step::Sleep(10 * MS));
        }
        Reply::sse(steps)
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let req = http::Request::post(chat_url(&proxy))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = client::client().request(req).await.expect("response");
    let mut body = resp.into_body();
    let start = Instant::now();
    let mut frames = 0;
    while start.elapsed() < Duration::from_millis(500) {
        if body.frame().await.is_some() {
            frames += 1;
        }
    }
    drop(body);
    assert!(frames >= 10, "only {frames} frames in 500 ms");
    let s = proxy.settled(1.0).await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "client_disconnect")
            .value(&s),
        1.0
    );
}

#[tokio::test]
async fn metrics_and_health_are_only_on_the_metrics_listener() {
    let up =
        upstream::spawn(|req| Reply::json(200, &format!("{{\"upstream_saw\":\"{}\"}}", req.path)))
            .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    for path in ["/metrics", "/healthz", "/readyz"] {
        let seen = client::send(http::Method::GET, &format!("{}{path}", proxy.url()), "").await;
        assert_eq!(
            String::from_utf8_lossy(&seen.body),
            format!("{{\"upstream_saw\":\"{path}\"}}"),
            "{path} on the proxy port must be forwarded, not answered"
        );
    }
}

#[tokio::test]
async fn model_labels_from_clients_are_bounded() {
    let up = upstream::spawn(|_| Reply::json(200, "{\"choices\":[]}")).await;
    let proxy = spawn_proxy(&up.url(), &["--max-models", "3"]).await;
    for i in 0..20 {
        let body = format!("{{\"model\":\"client-model-{i}\\n\\u0000\",\"messages\":[]}}");
        client::post(&chat_url(&proxy), &body).await;
    }
    let s = proxy.settled(20.0).await;
    let models: std::collections::BTreeSet<String> = s
        .lines()
        .filter(|l| l.starts_with("tokenmeter_requests_total{"))
        .filter_map(|l| {
            l.split("model=\"")
                .nth(1)?
                .split('"')
                .next()
                .map(String::from)
        })
        .collect();
    assert_eq!(
        models.into_iter().collect::<Vec<_>>(),
        [
            "client-model-0",
            "client-model-1",
            "client-model-2",
            "other"
        ]
    );
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("model", "other")
            .value(&s),
        17.0
    );
}

#[tokio::test]
async fn request_bodies_over_the_limit_stream_through_unchanged() {
    let up =
        upstream::spawn(|req| Reply::json(200, &format!("{{\"len\":{}}}", req.body.len()))).await;
    let proxy = spawn_proxy(&up.url(), &["--max-request-body", "1000"]).await;
    let big = format!("{{\"model\":\"m\",\"prompt\":\"{}\"}}", "p".repeat(5000));
    let seen = client::post(&format!("{}/v1/completions", proxy.url()), &big).await;
    assert_eq!(
        String::from_utf8_lossy(&seen.body),
        format!("{{\"len\":{}}}", big.len())
    );
    assert_eq!(up.received.lock().expect("lock")[0].body, big.as_bytes());
    let s = proxy.settled(1.0).await;
    // The body was not read, so the model is not known from it.
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("model", "unknown")
            .value(&s),
        1.0
    );
}

// Regression: a request the proxy refused itself (the 400 for a request body it could not read)
// was never metered, so `tokenmeter_requests_total` undercounted what clients sent.
#[tokio::test]
async fn a_request_body_the_proxy_cannot_read_is_a_metered_400() {
    let up = upstream::spawn(|_| Reply::json(200, "{}")).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let addr = proxy.addr;
    let reply = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        // A chunked JSON body whose first chunk size is not hexadecimal: hyper's body fails.
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
            .expect("write");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
    .await
    .expect("client");
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(reply.contains(r#""type":"request_body""#), "{reply}");
    let s = proxy.settled(1.0).await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "bad_request")
            .label("code", "400")
            .value(&s),
        1.0
    );
    assert_eq!(metric(names::REQUESTS_TOTAL).sum(&s), 1.0, "{s}");
    assert_eq!(metric(names::REQUESTS_IN_FLIGHT).sum(&s), 0.0);
    assert_eq!(up.opened(), 0, "a refused request reached the upstream");
}

#[tokio::test]
async fn a_client_gone_in_the_middle_of_its_request_body_is_recorded_once() {
    let up = upstream::spawn(|_| Reply::json(200, "{}")).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let addr = proxy.addr;
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":")
            .expect("write");
        std::thread::sleep(Duration::from_millis(100));
    })
    .await
    .expect("client");
    let s = proxy.settled(1.0).await;
    // hyper either reports the short body (a refusal) or drops the request with its connection.
    let gone = metric(names::REQUESTS_TOTAL)
        .label("outcome", "client_disconnect")
        .sum(&s);
    let refused = metric(names::REQUESTS_TOTAL)
        .label("outcome", "bad_request")
        .sum(&s);
    assert_eq!(gone + refused, 1.0, "{s}");
    assert_eq!(metric(names::REQUESTS_TOTAL).sum(&s), 1.0, "{s}");
    assert_eq!(metric(names::REQUESTS_IN_FLIGHT).sum(&s), 0.0);
    assert_eq!(
        up.opened(),
        0,
        "a request without its body reached the upstream"
    );
}
