//! The upstream connection pool: reuse, a server's idle close, and requests timed to meet it.
//!
//! An inference server closes a keep-alive connection that stays idle for a while (uvicorn, and
//! so vLLM and SGLang: 5 s). A pool that keeps connections longer than that must never fail a
//! request on a connection the server is closing: it drops one it finds closed when it takes it,
//! and sends a request again on a new connection when the reused one closed before the request
//! was written, or after it was written but before any byte of the answer came back. These
//! tests use a raw upstream whose idle close is scaled down to 300 ms.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::support::client::{post, Seen};
use crate::support::raw::read_request;
use crate::support::spawn_proxy;
use crate::support::upstream::{self, Reply};

const CHAT: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const SSE: &str = "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n";

/// A keep-alive upstream that closes a connection idle for `idle_close`, as uvicorn does.
struct ClosingUpstream {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
}

async fn closing_upstream(idle_close: Duration) -> ClosingUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (accepted, served) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, s) = (Arc::clone(&accepted), Arc::clone(&served));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream, idle_close, Arc::clone(&s)));
        }
    });
    ClosingUpstream {
        addr,
        accepted,
        served,
    }
}

async fn serve(mut s: TcpStream, idle_close: Duration, served: Arc<AtomicUsize>) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    // Wait for the next request head at most `idle_close`, then close, as a server does.
    while read_request(&mut s, &mut buf, Some(idle_close))
        .await
        .is_some()
    {
        if !answer(&mut s, &served).await {
            return;
        }
    }
}

/// Writes the SSE answer and counts it served; false once the peer is gone.
async fn answer(s: &mut TcpStream, served: &AtomicUsize) -> bool {
    let resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{SSE}",
        SSE.len()
    );
    let ok = s.write_all(resp.as_bytes()).await.is_ok();
    if ok {
        served.fetch_add(1, Ordering::SeqCst);
    }
    ok
}

/// The upstream's whole answer reached the client, with a 200.
fn assert_answered(seen: &Seen) {
    assert_eq!(
        seen.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&seen.body)
    );
    assert_eq!(seen.body, SSE.as_bytes());
}

#[tokio::test]
async fn requests_one_after_another_reuse_one_upstream_connection() {
    let up =
        upstream::spawn(|_| Reply::sse(vec![upstream::Step::Send(bytes::Bytes::from(SSE))])).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    for _ in 0..5 {
        let seen = post(&format!("{}/v1/chat/completions", proxy.url()), CHAT).await;
        assert_eq!(seen.status, 200);
        assert_eq!(seen.body, SSE.as_bytes());
    }
    assert_eq!(
        up.opened(),
        1,
        "one upstream connection for five requests in turn"
    );
    let received = up.received.lock().expect("lock").clone();
    assert_eq!(received.len(), 5);
    for r in &received {
        // Origin form on the wire, the upstream's authority in Host.
        assert_eq!(r.path, "/v1/chat/completions");
        let host = r
            .headers
            .iter()
            .find(|(k, _)| k == "host")
            .map(|(_, v)| v.as_str());
        assert_eq!(host, Some(up.addr.to_string().as_str()));
    }
}

// A pool that keeps connections longer than the server's keep-alive: the server closes the idle
// connection, and the next request must not be sent on it.
#[tokio::test]
async fn a_connection_the_server_closed_while_idle_is_not_used() {
    let up = closing_upstream(Duration::from_millis(300)).await;
    let proxy = spawn_proxy(
        &format!("http://{}", up.addr),
        &["--pool-idle-timeout", "60s"],
    )
    .await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    assert_eq!(post(&url, CHAT).await.status, 200);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let seen = post(&url, CHAT).await;
    assert_answered(&seen);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    assert_eq!(up.served.load(Ordering::SeqCst), 2);
}

// Requests timed to arrive around the moment the server closes the pooled connection (300 ms
// after the last response, from 30 ms before to 30 ms after, 2 ms apart): every one succeeds,
// on the pooled connection or a new one. Those in the last few milliseconds before the close
// are written and then lost as the close crosses them: before the pool sent those again, the
// ones at -3 ms failed (502) in 1 run in 3 here.
#[tokio::test]
async fn requests_timed_to_meet_the_servers_idle_close_never_fail() {
    let idle_close = Duration::from_millis(300);
    let up = closing_upstream(idle_close).await;
    let proxy = spawn_proxy(
        &format!("http://{}", up.addr),
        &["--pool-idle-timeout", "60s"],
    )
    .await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    assert_eq!(post(&url, CHAT).await.status, 200);
    let mut failed = Vec::new();
    let offsets: Vec<i64> = (-15..=15).map(|k| k * 2).collect();
    for &ms in &offsets {
        let wait = (idle_close.as_millis() as i64 + ms).max(0) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let seen = post(&url, CHAT).await;
        if seen.status != 200 || seen.body != SSE.as_bytes() {
            failed.push((ms, seen.status));
        }
    }
    assert!(
        failed.is_empty(),
        "failed at (offset ms, status): {failed:?}"
    );
    assert_eq!(up.served.load(Ordering::SeqCst), offsets.len() + 1);
    // Some requests came after the close and needed a new connection.
    assert!(up.accepted.load(Ordering::SeqCst) > 1);
}

/// An upstream that answers the first request of each connection, then reads the next one
/// whole and closes without a word: a server's idle close crossing a request on the wire, made
/// certain. Counts the requests it read, and those it answered.
struct LosingUpstream {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    read: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
}

async fn losing_upstream() -> LosingUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let counts: [Arc<AtomicUsize>; 3] = Default::default();
    let [accepted, read, served] = counts.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            let (read, served) = (Arc::clone(&read), Arc::clone(&served));
            tokio::spawn(async move {
                let mut buf = Vec::new();
                for nth in 0.. {
                    if read_request(&mut s, &mut buf, None).await.is_none() {
                        return;
                    }
                    read.fetch_add(1, Ordering::SeqCst);
                    if nth > 0 {
                        return; // dropped unanswered: the request is lost
                    }
                    if !answer(&mut s, &served).await {
                        return;
                    }
                }
            });
        }
    });
    let [accepted, read, served] = counts;
    LosingUpstream {
        addr,
        accepted,
        read,
        served,
    }
}

// The second request goes out on the pooled connection, which the server then closes without an
// answer: the pool sends it again on a new connection, and the client sees one clean response.
#[tokio::test]
async fn a_request_lost_on_a_reused_connection_is_sent_again() {
    let up = losing_upstream().await;
    let proxy = spawn_proxy(&format!("http://{}", up.addr), &[]).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    for _ in 0..2 {
        let seen = post(&url, CHAT).await;
        assert_answered(&seen);
    }
    // Request 1 on connection 1; request 2 lost on it, then sent on connection 2.
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    assert_eq!(up.read.load(Ordering::SeqCst), 3);
    assert_eq!(up.served.load(Ordering::SeqCst), 2);
}

// A body the proxy streamed through (not JSON, so not read whole) cannot be sent again: the lost
// request is a 502, and it went out once.
#[tokio::test]
async fn a_lost_request_whose_body_streamed_through_is_not_sent_again() {
    let up = losing_upstream().await;
    let proxy = spawn_proxy(&format!("http://{}", up.addr), &[]).await;
    let url = format!("{}/upload", proxy.url());
    let first = crate::support::client::send(http::Method::POST, &url, "a").await;
    assert_eq!(first.status, 200);
    let req = http::Request::post(&url)
        .header("content-type", "application/octet-stream")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"raw bytes",
        )))
        .expect("request");
    let resp = crate::support::client::client()
        .request(req)
        .await
        .expect("a response");
    assert_eq!(resp.status(), 502);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(up.read.load(Ordering::SeqCst), 2);
}
