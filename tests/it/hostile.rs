//! Hostile clients: heads trickled a byte at a time are closed when `--header-read-timeout`
//! has passed since accept, whatever HTTP they start to speak.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::upstream::{self, Reply};
use crate::support::{serial, spawn_proxy};

/// How long one trickling client held its connection, from connect to the proxy's close;
/// `None` if it was still open at `give_up`.
async fn trickle(
    addr: std::net::SocketAddr,
    head: &'static [u8],
    give_up: Duration,
) -> Option<Duration> {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    let start = Instant::now();
    let mut sent = 0;
    let mut buf = [0u8; 512];
    let mut tick = tokio::time::interval(Duration::from_secs(1));
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
                if sent < head.len() {
                    // Fails once the proxy has reset the connection; the read then says so.
                    let _ = tcp.write_all(&head[sent..=sent]).await;
                    sent += 1;
                }
            }
        }
    }
}

/// 1,000 connections that send one byte of their head a second (a request line, a request
/// line starting with `P`, which does not tell HTTP/1 from the HTTP/2 preface at once, and the
/// preface itself) are all closed at `--header-read-timeout` after they connected, within 10%:
/// the version check, a TLS handshake and hyper's own timer share one budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_trickled_heads_are_closed_at_the_header_read_timeout_within_ten_percent() {
    const TIMEOUT: Duration = Duration::from_secs(3);
    const CONNECTIONS: usize = 1_000;
    let _turn = serial().await;
    let up = upstream::spawn(|_| Reply::json(200, "{}")).await;
    let proxy = spawn_proxy(
        &up.url(),
        &["--header-read-timeout", "3s", "--max-connections", "2000"],
    )
    .await;
    let heads: [&'static [u8]; 3] = [
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ];
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|i| {
            let head = heads[i % heads.len()];
            tokio::spawn(trickle(proxy.addr, head, TIMEOUT * 3))
        })
        .collect();
    let mut held: [Vec<Duration>; 3] = Default::default();
    for (i, t) in tasks.into_iter().enumerate() {
        let h = t
            .await
            .expect("client task")
            .unwrap_or_else(|| panic!("connection {i} ({:?}) still open", heads[i % 3][0] as char));
        held[i % 3].push(h);
    }
    let (lo, hi) = (TIMEOUT.mul_f64(0.9), TIMEOUT.mul_f64(1.1));
    for (kind, h) in ["GET", "POST", "preface"].iter().zip(&held) {
        let (min, max) = (h.iter().min().copied(), h.iter().max().copied());
        eprintln!("{kind}: {} connections held {min:?} to {max:?}", h.len());
        assert!(
            h.iter().all(|d| *d >= lo && *d <= hi),
            "{kind}: held {min:?} to {max:?}, want {lo:?} to {hi:?}"
        );
    }
    assert_eq!(up.opened(), 0, "no trickled head reached the upstream");
}
