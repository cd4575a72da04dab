//! Crowds at the listeners: a burst of new connections is taken without a listen overflow;
//! thousands of idle or trickling clients on the metrics listener neither keep Prometheus, the
//! probes and the page from an answer nor stay open; `/readyz` turns not-ready near
//! `--max-connections` and ready again below it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use tokenmeter::metrics::names;

use crate::support::client::{get_text, send};
use crate::support::metrics::metric;
use crate::support::upstream::{self, Reply};
use crate::support::{in_ci, serial, spawn_proxy};

/// The kernel's count of connections dropped because a listener's accept queue was full
/// (`TcpExt: ListenOverflows` in /proc/net/netstat). It counts every listener of the network
/// namespace, so the test below reads it around its own burst and tries again when another
/// test's listener may have overflowed meanwhile.
fn listen_overflows() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    let i = names
        .split_whitespace()
        .position(|n| n == "ListenOverflows")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// 1,000 connections opened at once are all accepted, each answers a request, and the kernel
/// dropped none of them for a full accept queue. With tokio's backlog of 128
/// (`--listen-backlog 128`) the same burst overflowed the queue on every try here, and the
/// clients whose SYN was dropped waited for their 1 s retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_a_thousand_connections_is_accepted_without_a_listen_overflow() {
    const CONNECTIONS: usize = 1_000;
    let Some(_) = listen_overflows() else {
        assert!(!in_ci(), "/proc/net/netstat has no ListenOverflows");
        crate::support::skip(
            &crate::support::current_test(),
            "no /proc/net/netstat to read listen overflows from (Linux only)",
        );
        return;
    };
    let up = upstream::spawn(|_| Reply::json(200, "{\"data\":[]}")).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let url = format!("http://{}/v1/models", proxy.addr);
    // Another test's listener (the suite's mock upstreams keep tokio's 128) may overflow in the
    // same moment and count in the same kernel counter: a burst of ours is tried up to three
    // times, and one clean try shows that ours overflowed nothing.
    let mut overflowed = Vec::new();
    for _ in 0..3 {
        let before = listen_overflows().expect("read before");
        let opened: Vec<_> = (0..CONNECTIONS)
            .map(|_| tokio::spawn(TcpStream::connect(proxy.addr)))
            .collect();
        let mut conns = Vec::with_capacity(CONNECTIONS);
        for c in opened {
            conns.push(c.await.expect("task").expect("connect"));
        }
        let after = listen_overflows().expect("read after");
        // Each connection is served: one request on each.
        let answered = Arc::new(AtomicUsize::new(0));
        let requests: Vec<_> = conns
            .into_iter()
            .map(|tcp| {
                let answered = Arc::clone(&answered);
                tokio::spawn(async move {
                    let (mut tx, conn) =
                        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                            .await
                            .expect("handshake");
                    tokio::spawn(conn);
                    let req = http::Request::get("/v1/models")
                        .header("host", "x")
                        .body(http_body_util::Empty::<bytes::Bytes>::new())
                        .expect("request");
                    let resp = tx.send_request(req).await.expect("an answer");
                    assert_eq!(resp.status(), 200);
                    answered.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        for r in requests {
            r.await.expect("request task");
        }
        assert_eq!(answered.load(Ordering::Relaxed), CONNECTIONS, "{url}");
        if after == before {
            return;
        }
        overflowed.push(after - before);
    }
    panic!("every burst of {CONNECTIONS} overflowed a listen queue: {overflowed:?} drops");
}

/// How one hostile client on the metrics listener ended: how long the server kept it open,
/// or `None` if it was still open at `give_up`.
async fn hostile(
    addr: std::net::SocketAddr,
    trickle: bool,
    connected: Arc<AtomicUsize>,
    give_up: Duration,
) -> Option<Duration> {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    connected.fetch_add(1, Ordering::SeqCst);
    let start = Instant::now();
    // A request line that never ends, a byte at a time; or nothing at all.
    let head = b"GET /metrics HTTP/1.1\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut sent = 0;
    let mut buf = [0u8; 512];
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            r = tcp.read(&mut buf) => match r {
                // hyper may answer 408 before it closes: read on to the end.
                Ok(n) if n > 0 => continue,
                _ => return Some(start.elapsed()),
            },
            _ = tick.tick() => {
                if start.elapsed() > give_up {
                    return None;
                }
                if trickle && sent < head.len() {
                    let _ = tcp.write_all(&head[sent..=sent]).await;
                    sent += 1;
                }
            }
        }
    }
}

/// 2,000 clients that connect to the metrics listener and then send nothing, or trickle a head
/// that never ends, do not keep `/metrics`, `/readyz` or the page from answering, each within a
/// second; past `--metrics-max-connections` (256) the idlest connection gives way, counted in
/// `tokenmeter_metrics_connections_shed_total`; and every one of them is closed by
/// `--header-read-timeout` (before this listener had the proxy's head timeout, a trickled head
/// held its connection for as long as the client liked).
///
/// The second is the bound for a scrape beside such a crowd. Answering one takes the
/// proxy a few milliseconds of CPU, so it holds on a loaded two-core machine by a wide margin;
/// what it proves is that no crowd stands in the scrape's way (without the cap's eviction, a
/// new connection at the cap would wait for a crowd's timeout, 5 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_or_trickling_clients_leave_the_metrics_listener_answering() {
    const CROWD: usize = 2_000;
    const CAP: usize = 256;
    const TIMEOUT: Duration = Duration::from_secs(5);
    // Holds 2,000 sockets a side: not beside another test that opens a thousand.
    let _turn = serial().await;
    let up = upstream::spawn(|_| Reply::json(200, "{}")).await;
    let proxy = spawn_proxy(&up.url(), &["--header-read-timeout", "5s"]).await;
    let connected = Arc::new(AtomicUsize::new(0));
    let crowd: Vec<_> = (0..CROWD)
        .map(|i| {
            tokio::spawn(hostile(
                proxy.metrics_addr,
                i % 2 == 1,
                Arc::clone(&connected),
                TIMEOUT * 4,
            ))
        })
        .collect();
    while connected.load(Ordering::SeqCst) < CROWD {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let shed = |s: &str| metric(names::METRICS_CONNECTIONS_SHED_TOTAL).value(s);
    // The server has taken the whole crowd once all but the cap's worth were shed (each scrape
    // here is a new connection too, and sheds one more).
    let mut scrape = String::new();
    for _ in 0..100 {
        scrape = proxy.scrape().await;
        if shed(&scrape) >= (CROWD - CAP) as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        shed(&scrape) >= (CROWD - CAP) as f64,
        "shed {} of a crowd of {CROWD} at a cap of {CAP}",
        shed(&scrape)
    );
    assert_eq!(
        metric(names::METRICS_CONNECTIONS_LIMIT).value(&scrape),
        CAP as f64
    );
    for path in ["/metrics", "/readyz", "/"] {
        let started = Instant::now();
        let seen = tokio::time::timeout(
            Duration::from_secs(1),
            send(
                http::Method::GET,
                &format!("http://{}{path}", proxy.metrics_addr),
                "",
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("{path}: no answer within 1 s beside the crowd"));
        eprintln!("{path}: {} in {:?}", seen.status, started.elapsed());
        assert_eq!(seen.status, 200, "{path}");
        let body = String::from_utf8_lossy(&seen.body);
        let want = match path {
            "/metrics" => "tokenmeter_metrics_connections_shed_total",
            "/readyz" => "ready",
            _ => "<html",
        };
        assert!(body.contains(want), "{path}: {body:.200}");
    }
    // Every hostile connection ends: shed, or closed at the head timeout.
    let mut held = Vec::new();
    for (i, c) in crowd.into_iter().enumerate() {
        match c.await.expect("client task") {
            Some(d) => held.push(d),
            None => panic!("client {i} (trickling: {}) still open", i % 2 == 1),
        }
    }
    let longest = held.iter().max().copied().unwrap_or_default();
    eprintln!("the crowd's longest connection: {longest:?}");
    // The clients' own clocks start after their connect: none can outlast the head timeout
    // by more than the time the server took to accept the crowd and close each one.
    assert!(longest >= TIMEOUT.mul_f64(0.9), "none reached the timeout?");
}

/// `/readyz` answers 503 once open connections reach 95% of `--max-connections`, and 200 again
/// once they are back to 90%: the cap of 20 turns not-ready at 19 and ready at 18.
#[tokio::test]
async fn readyz_turns_not_ready_near_max_connections_and_back_below_it() {
    let up = upstream::spawn(|_| Reply::json(200, "{}")).await;
    let proxy = spawn_proxy(&up.url(), &["--max-connections", "20"]).await;
    let readyz = format!("http://{}/readyz", proxy.metrics_addr);
    // Each connection sends a request and keeps its connection: the server has certainly
    // accepted it once it answered.
    let mut open = Vec::new();
    async fn kept(addr: std::net::SocketAddr) -> hyper::client::conn::http1::SendRequest<String> {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (mut tx, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        let req = http::Request::get("/v1/models")
            .header("host", "x")
            .body(String::new())
            .expect("request");
        assert_eq!(tx.send_request(req).await.expect("answer").status(), 200);
        tx
    }
    for _ in 0..18 {
        open.push(kept(proxy.addr).await);
    }
    assert_eq!(get_text(&readyz).await, "ready\n", "18 of 20 open");
    open.push(kept(proxy.addr).await);
    assert_eq!(
        get_text(&readyz).await,
        "near --max-connections\n",
        "19 of 20"
    );
    // One closes: 18, the mark where it eases. The server sees the close a moment later.
    open.pop();
    let mut last = String::new();
    for _ in 0..100 {
        last = get_text(&readyz).await;
        if last == "ready\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last, "ready\n", "back to 18 of 20");
}
