//! `--upstream https://...` through tokenmeter: streams byte-exact and metered as over plain
//! HTTP (HTTP/1.1 and HTTP/2 by ALPN), certificate failures as 502s naming their cause, mutual
//! TLS, the connect timeout on a black-holed upstream, and a request lost to the upstream's idle
//! close sent again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use tokenmeter::metrics::names;

use crate::support::client::{chat_request, post};
use crate::support::metrics::metric;
use crate::support::raw::read_request;
use crate::support::tls::{acceptor, Ca, Dir, Leaf, Validity};
use crate::support::upstream::{self, openai_chat, script_bytes, Reply, Step, Upstream};
use crate::support::{serial, spawn_proxy};

const H2_H1: &[&[u8]] = &[b"h2", b"http/1.1"];
const TOKENS: usize = 24;

fn script() -> Vec<Step> {
    openai_chat(
        Duration::from_millis(60),
        TOKENS,
        Duration::from_millis(4),
        true,
    )
}

async fn sse_upstream(tls: Option<tokio_rustls::TlsAcceptor>) -> Upstream {
    let reply = |_: &upstream::Received| Reply::sse(script());
    match tls {
        None => upstream::spawn(reply).await,
        Some(t) => upstream::spawn_tls(t, reply).await,
    }
}

/// The figures of one metered request that do not depend on the clock.
fn exact_figures(scrape: &str) -> Vec<(&'static str, f64)> {
    vec![
        (
            "complete",
            metric(names::REQUESTS_TOTAL)
                .label("outcome", "complete")
                .label("code", "200")
                .sum(scrape),
        ),
        ("output", metric(names::OUTPUT_TOKENS_TOTAL).sum(scrape)),
        ("input", metric(names::INPUT_TOKENS_TOTAL).sum(scrape)),
        (
            "usage",
            metric(names::TOKEN_COUNT_SOURCE_TOTAL)
                .label("source", "usage")
                .sum(scrape),
        ),
        (
            "ttft_count",
            metric("tokenmeter_time_to_first_token_seconds_count").sum(scrape),
        ),
        (
            "itl_count",
            metric("tokenmeter_inter_token_latency_seconds_count").sum(scrape),
        ),
        (
            "tps_count",
            metric("tokenmeter_request_tokens_per_second_count").sum(scrape),
        ),
    ]
}

#[tokio::test]
async fn streams_over_https_are_byte_exact_and_metered_as_over_http() {
    let _turn = serial().await;
    let dir = Dir::new("https-stream");
    let ca = Ca::new("upstream ca");
    let ca_file = dir.write("ca.pem", &ca.pem);
    let leaf = ca.leaf(&["127.0.0.1"], Validity::Now);
    let want = script_bytes(&script());
    let mut figures = Vec::new();
    let cases: [(Option<&[&[u8]]>, &str); 3] = [
        (None, "HTTP/1.1"),
        (Some(&[b"http/1.1"]), "HTTP/1.1"),
        (Some(H2_H1), "HTTP/2.0"),
    ];
    for (alpn, version) in cases {
        let up = sse_upstream(alpn.map(|a| acceptor(&leaf, a, None))).await;
        let (url, extra) = match alpn {
            None => (up.url(), vec![]),
            Some(_) => (up.https_url(), vec!["--upstream-ca", Dir::arg(&ca_file)]),
        };
        let proxy = spawn_proxy(&url, &extra).await;
        let seen = post(
            &format!("{}/v1/chat/completions", proxy.url()),
            &chat_request(true, true),
        )
        .await;
        assert_eq!(seen.status, 200);
        assert!(!seen.error);
        assert_eq!(seen.body, want, "{url}: the body differs");
        let rec = up.received.lock().expect("lock")[0].clone();
        assert_eq!(rec.version, version, "{url}");
        if version == "HTTP/1.1" {
            // Host from the upstream's URL, not the client's.
            let host = rec.headers.iter().find(|(k, _)| k == "host");
            assert_eq!(host.map(|h| h.1.as_str()), Some(&up.addr.to_string()[..]));
        }
        let scrape = proxy.settled(1.0).await;
        let ttft = metric("tokenmeter_time_to_first_token_seconds_sum").value(&scrape);
        assert!((0.06..0.5).contains(&ttft), "{url}: ttft {ttft}");
        figures.push((url, exact_figures(&scrape)));
    }
    let want_figures = vec![
        ("complete", 1.0),
        ("output", TOKENS as f64),
        ("input", 12.0),
        ("usage", 1.0),
        ("ttft_count", 1.0),
        ("itl_count", (TOKENS - 1) as f64),
        ("tps_count", 1.0),
    ];
    for (url, f) in figures {
        assert_eq!(f, want_figures, "{url}");
    }
}

/// One request through a proxy for `leaf`'s upstream: (status, JSON body, scrape).
async fn refused(leaf: &Leaf, extra: &[&str]) -> (u16, serde_json::Value, String) {
    let up = sse_upstream(Some(acceptor(leaf, H2_H1, None))).await;
    let proxy = spawn_proxy(&up.https_url(), extra).await;
    let seen = post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &chat_request(true, true),
    )
    .await;
    assert!(up.received.lock().expect("lock").is_empty());
    let v = serde_json::from_slice(&seen.body).expect("a JSON error body");
    (seen.status, v, proxy.settled(1.0).await)
}

#[tokio::test]
async fn certificate_failures_answer_502_naming_the_cause() {
    let dir = Dir::new("https-causes");
    let ca = Ca::new("upstream ca");
    let ca_file = dir.write("ca.pem", &ca.pem);
    let with_ca = ["--upstream-ca", Dir::arg(&ca_file)];
    let cases: [(Leaf, &[&str], &str); 4] = [
        // Trusted by nobody: the system bundle does not know the test CA.
        (
            ca.leaf(&["127.0.0.1"], Validity::Now),
            &[],
            "certificate_untrusted",
        ),
        (
            Ca::new("another ca").leaf(&["127.0.0.1"], Validity::Now),
            &with_ca,
            "certificate_untrusted",
        ),
        (
            ca.leaf(&["127.0.0.1"], Validity::Expired),
            &with_ca,
            "certificate_expired",
        ),
        (
            ca.leaf(&["inference.internal"], Validity::Now),
            &with_ca,
            "certificate_wrong_name",
        ),
    ];
    for (leaf, extra, cause) in cases {
        let (status, body, scrape) = refused(&leaf, extra).await;
        assert_eq!(status, 502, "{cause}");
        let e = &body["error"];
        assert_eq!(e["type"], "upstream_tls", "{body}");
        assert_eq!(e["cause"], cause, "{body}");
        assert_eq!(e["code"], 502, "{body}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
        let n = metric(names::REQUESTS_TOTAL)
            .label("outcome", "upstream_error")
            .label("code", "502")
            .value(&scrape);
        assert_eq!(n, 1.0, "{cause}");
    }
}

#[tokio::test]
async fn mutual_tls_works_with_the_client_certificate_and_fails_without() {
    let dir = Dir::new("https-mtls");
    let ca = Ca::new("upstream ca");
    let clients = Ca::new("client ca");
    let ca_file = dir.write("ca.pem", &ca.pem);
    let me = clients.leaf(&["tokenmeter.client"], Validity::Now);
    let (cert, key) = (
        dir.write("client.crt", &me.cert_pem),
        dir.write("client.key", &me.key_pem),
    );
    let leaf = ca.leaf(&["127.0.0.1"], Validity::Now);
    let up = sse_upstream(Some(acceptor(&leaf, H2_H1, Some(&clients)))).await;
    let with = spawn_proxy(
        &up.https_url(),
        &[
            "--upstream-ca",
            Dir::arg(&ca_file),
            "--upstream-client-cert",
            Dir::arg(&cert),
            "--upstream-client-key",
            Dir::arg(&key),
        ],
    )
    .await;
    let url = |p: &crate::support::Proxy| format!("{}/v1/chat/completions", p.url());
    let seen = post(&url(&with), &chat_request(true, true)).await;
    assert_eq!((seen.status, seen.body), (200, script_bytes(&script())));

    let without = spawn_proxy(&up.https_url(), &["--upstream-ca", Dir::arg(&ca_file)]).await;
    let seen = post(&url(&without), &chat_request(true, true)).await;
    assert_eq!(seen.status, 502);
    let v: serde_json::Value = serde_json::from_slice(&seen.body).expect("json");
    assert_eq!(v["error"]["cause"], "client_certificate_rejected", "{v}");
    assert_eq!(up.received.lock().expect("lock").len(), 1);
}

#[tokio::test]
async fn a_black_holed_upstream_answers_502_within_the_connect_timeout() {
    let hole = upstream::black_hole().await;
    for scheme in ["http", "https"] {
        let proxy = spawn_proxy(
            &format!("{scheme}://{}", hole.addr),
            &["--connect-timeout", "1s", "--upstream-timeout", "300s"],
        )
        .await;
        let start = Instant::now();
        let seen = post(
            &format!("{}/v1/chat/completions", proxy.url()),
            &chat_request(true, true),
        )
        .await;
        let took = start.elapsed();
        assert_eq!(seen.status, 502, "{scheme}");
        // Within the connect timeout + 1 s (a loaded machine), and never before it.
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(2),
            "{scheme}: {took:?}"
        );
        let v: serde_json::Value = serde_json::from_slice(&seen.body).expect("json");
        assert_eq!(v["error"]["cause"], "connect_timeout", "{v}");
        assert_eq!(v["error"]["type"], "upstream_connect_timeout", "{v}");
        let scrape = proxy.settled(1.0).await;
        let n = metric(names::REQUESTS_TOTAL)
            .label("outcome", "upstream_error")
            .label("code", "502")
            .value(&scrape);
        assert_eq!(n, 1.0);
    }
}

/// An HTTPS upstream that answers the first request of each connection, then reads the next
/// one whole and closes without a word (its idle close crossing the request on the wire, made
/// certain): (connections accepted, requests read, requests answered).
async fn losing_tls_upstream(
    tls: tokio_rustls::TlsAcceptor,
) -> (std::net::SocketAddr, [Arc<AtomicUsize>; 3]) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let counts: [Arc<AtomicUsize>; 3] = Default::default();
    let [accepted, read, served] = counts.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            let (tls, read, served) = (tls.clone(), Arc::clone(&read), Arc::clone(&served));
            tokio::spawn(async move {
                let Ok(mut s) = tls.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                for nth in 0.. {
                    if read_request(&mut s, &mut buf, None).await.is_none() {
                        return;
                    }
                    read.fetch_add(1, Ordering::SeqCst);
                    if nth > 0 {
                        return; // dropped unanswered: the request is lost
                    }
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{LOST_SSE}",
                        LOST_SSE.len()
                    );
                    if s.write_all(resp.as_bytes()).await.is_err() || s.flush().await.is_err() {
                        return;
                    }
                    served.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (addr, counts)
}

const LOST_SSE: &str = "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n";

/// The second request goes out on the reused TLS connection, which the upstream then closes
/// unanswered: it is sent again on a new connection, as over plain HTTP, and the client sees
/// one clean response (with ALPN settling `http/1.1`, and with no ALPN at all).
#[tokio::test]
async fn a_request_an_https_upstream_lost_on_a_reused_connection_is_sent_again() {
    let dir = Dir::new("https-lost");
    let ca = Ca::new("upstream ca");
    let ca_file = dir.write("ca.pem", &ca.pem);
    let leaf = ca.leaf(&["127.0.0.1"], Validity::Now);
    for alpn in [&[b"http/1.1".as_slice()][..], &[]] {
        let (addr, [accepted, read, served]) =
            losing_tls_upstream(acceptor(&leaf, alpn, None)).await;
        let proxy = spawn_proxy(
            &format!("https://{addr}"),
            &["--upstream-ca", Dir::arg(&ca_file)],
        )
        .await;
        let url = format!("{}/v1/chat/completions", proxy.url());
        for nth in 0..2 {
            let seen = post(&url, &chat_request(true, true)).await;
            assert_eq!(
                (seen.status, seen.body.as_slice()),
                (200, LOST_SSE.as_bytes()),
                "request {nth}, ALPN {alpn:?}"
            );
        }
        // Request 1 on connection 1; request 2 lost on it, then sent on connection 2.
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "ALPN {alpn:?}");
        assert_eq!(read.load(Ordering::SeqCst), 3, "ALPN {alpn:?}");
        assert_eq!(served.load(Ordering::SeqCst), 2, "ALPN {alpn:?}");
        let scrape = proxy.settled(2.0).await;
        let complete = metric(names::REQUESTS_TOTAL)
            .label("outcome", "complete")
            .value(&scrape);
        assert_eq!(complete, 2.0, "ALPN {alpn:?}");
    }
}
