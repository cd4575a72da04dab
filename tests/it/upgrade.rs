//! Upgrades through tokenmeter: a real WebSocket client and echo server over plain HTTP and TLS
//! on both hops, raw bytes after a 101 untouched both ways, the `upgraded` outcome, an answer
//! other than 101 passed on as it is, and the drain waiting for an open WebSocket.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use tokenmeter::metrics::names;

use crate::support::metrics::metric;
use crate::support::tls::{acceptor, client_config, connect, Ca, Dir, Validity};
use crate::support::upstream::{self, Reply};
use crate::support::ws::{self, echo_round_trips, test_messages};
use crate::support::{spawn_proxy, Rng};

fn upgraded(scrape: &str) -> f64 {
    metric(names::REQUESTS_TOTAL)
        .label("outcome", "upgraded")
        .label("code", "101")
        .sum(scrape)
}

#[tokio::test]
async fn a_websocket_echo_passes_through_over_http_and_tls() {
    let dir = Dir::new("ws");
    let ca = Ca::new("ws ca");
    let leaf = ca.leaf(&["127.0.0.1"], Validity::Now);
    let ca_file = dir.write("ca.pem", &ca.pem);
    let (cert, key) = (
        dir.write("tls.crt", &leaf.cert_pem),
        dir.write("tls.key", &leaf.key_pem),
    );
    let messages = test_messages();
    let want_bytes: usize = messages.iter().map(|m| m.len()).sum();
    // (upstream over TLS, listener over TLS)
    for (up_tls, listen_tls) in [(false, false), (true, false), (false, true), (true, true)] {
        // The upstream offers h2 too: an upgrade must still get an HTTP/1.1 connection.
        let echo =
            ws::spawn_echo(up_tls.then(|| acceptor(&leaf, &[b"h2", b"http/1.1"], None))).await;
        let scheme = if up_tls { "https" } else { "http" };
        let mut flags = vec![];
        if up_tls {
            flags.extend(["--upstream-ca", Dir::arg(&ca_file)]);
        }
        if listen_tls {
            flags.extend(["--tls-cert", Dir::arg(&cert), "--tls-key", Dir::arg(&key)]);
        }
        let proxy = spawn_proxy(&format!("{scheme}://{}", echo.addr), &flags).await;
        let case = format!("upstream {scheme}, listener tls={listen_tls}");
        let sent = if listen_tls {
            let (tls, _) = connect(proxy.addr, "127.0.0.1", client_config(&ca, &[b"http/1.1"]))
                .await
                .expect("tls");
            let (mut c, resp) = tokio_tungstenite::client_async(
                format!("wss://127.0.0.1:{}/v1/realtime", proxy.addr.port()),
                tls,
            )
            .await
            .expect("websocket handshake");
            assert_eq!(resp.status(), 101);
            let n = echo_round_trips(&mut c, &messages).await;
            c.close(None).await.expect("close");
            while c.next().await.is_some() {}
            n
        } else {
            let mut c = ws::connect_plain(proxy.addr, "/v1/realtime").await;
            let n = echo_round_trips(&mut c, &messages).await;
            c.close(None).await.expect("close");
            while c.next().await.is_some() {}
            n
        };
        assert_eq!(sent, want_bytes, "{case}");
        let scrape = proxy.eventually(|s| upgraded(s) >= 1.0).await;
        assert_eq!(upgraded(&scrape), 1.0, "{case}\n{scrape}");
        let durations = metric("tokenmeter_request_duration_seconds_count").sum(&scrape);
        assert_eq!(durations, 1.0, "{case}");
        assert_eq!(echo.closed_cleanly(), 1, "{case}");
        assert_eq!(
            metric(names::REQUESTS_IN_FLIGHT).sum(&scrape),
            0.0,
            "{case}"
        );
    }
}

#[tokio::test]
async fn bytes_after_the_101_pass_untouched_both_ways() {
    let up = ws::spawn_raw_upgrade().await;
    let proxy = spawn_proxy(&format!("http://{up}"), &[]).await;
    let mut tcp = TcpStream::connect(proxy.addr).await.expect("connect");
    tcp.write_all(
        b"GET /stream HTTP/1.1\r\nhost: x\r\nconnection: keep-alive, Upgrade\r\nupgrade: raw-echo\r\n\r\n",
    )
    .await
    .expect("write");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut b).await.expect("head");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: raw-echo"), "{head}");
    assert!(head.contains("connection: upgrade"), "{head}");
    // Not HTTP, not WebSocket: arbitrary bytes, in pieces of random sizes.
    let mut rng = Rng::new(13);
    let data: Vec<u8> = (0..300_000).map(|_| rng.next_u64() as u8).collect();
    let (mut rd, mut wr) = tcp.into_split();
    let pieces = rng.pieces(&data, 1, 20_000);
    let writer = tokio::spawn(async move {
        for p in pieces {
            wr.write_all(&p).await.expect("write");
        }
        wr
    });
    let mut back = vec![0u8; data.len()];
    rd.read_exact(&mut back).await.expect("echo");
    let want: Vec<u8> = data.iter().map(|b| b ^ 0xFF).collect();
    assert!(back == want, "the bytes changed on the way");
    drop(writer.await.expect("writer"));
    drop(rd);
    let scrape = proxy.eventually(|s| upgraded(s) >= 1.0).await;
    assert_eq!(upgraded(&scrape), 1.0, "{scrape}");
}

#[tokio::test]
async fn an_upgrade_the_upstream_declines_is_an_ordinary_response() {
    let up = upstream::spawn(|r| {
        let asked = r
            .headers
            .iter()
            .any(|(k, v)| k == "upgrade" && v == "websocket");
        Reply::json(
            if asked { 426 } else { 500 },
            r#"{"error":"no websockets here"}"#,
        )
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let mut tcp = TcpStream::connect(proxy.addr).await.expect("connect");
    tcp.write_all(
        b"GET /ws HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tcp.read(&mut buf).await.expect("read");
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(text.starts_with("HTTP/1.1 426"), "{text}");
    assert!(
        text.ends_with(r#"{"error":"no websockets here"}"#),
        "{text}"
    );
    let scrape = proxy.settled(1.0).await;
    let n = metric(names::REQUESTS_TOTAL)
        .label("code", "426")
        .label("outcome", "complete")
        .value(&scrape);
    assert_eq!(n, 1.0);
}

#[tokio::test]
async fn the_drain_waits_for_an_open_websocket_and_cuts_it_at_the_timeout() {
    let echo = ws::spawn_echo(None).await;
    // A WebSocket that finishes within the drain timeout: served to its end.
    let mut proxy = spawn_proxy(&format!("http://{}", echo.addr), &["--drain-timeout", "5s"]).await;
    let mut c = ws::connect_plain(proxy.addr, "/ws").await;
    echo_round_trips(&mut c, &[Message::text("before")]).await;
    proxy.shutdown();
    // The drain is on; the conversation goes on for a while.
    for i in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        echo_round_trips(&mut c, &[Message::text(format!("during {i}"))]).await;
        assert!(!proxy.task.is_finished(), "the drain did not wait");
    }
    c.close(None).await.expect("close");
    while c.next().await.is_some() {}
    // A client closes its connection after the close handshake.
    drop(c);
    let closed = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), &mut proxy.task)
        .await
        .expect("serve returns once the WebSocket closed")
        .expect("serve");
    assert!(closed.elapsed() < Duration::from_secs(2));
    assert_eq!(echo.closed_cleanly(), 1);

    // One that does not finish is cut at the drain timeout.
    let mut proxy = spawn_proxy(&format!("http://{}", echo.addr), &["--drain-timeout", "1s"]).await;
    let mut c = ws::connect_plain(proxy.addr, "/ws").await;
    echo_round_trips(&mut c, &[Message::text("hello")]).await;
    let start = Instant::now();
    proxy.shutdown();
    tokio::time::timeout(Duration::from_secs(3), &mut proxy.task)
        .await
        .expect("serve returns at the drain timeout")
        .expect("serve");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    // The joined connection is gone: the client's next read ends.
    let next = tokio::time::timeout(Duration::from_secs(2), c.next()).await;
    assert!(
        matches!(next, Ok(None) | Ok(Some(Err(_)))),
        "the connection was not cut: {next:?}"
    );
}

/// The Python interpreter with `websockets` that tests/run prepares, or `None` (a loud skip;
/// a failure in CI).
fn python_websockets() -> Option<String> {
    match std::env::var("TOKENMETER_WS_PYTHON") {
        Ok(p) if std::path::Path::new(&p).exists() => Some(p),
        _ => {
            assert!(
                !crate::support::in_ci(),
                "TOKENMETER_WS_PYTHON is not set: tests/run prepares it"
            );
            crate::support::skip(
                &crate::support::current_test(),
                "no TOKENMETER_WS_PYTHON (run tests/run, which prepares it, or set it)",
            );
            None
        }
    }
}

#[tokio::test]
async fn python_websockets_on_both_sides_over_http_and_tls() {
    let Some(python) = python_websockets() else {
        return;
    };
    let peer = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ws/peer.py");
    let mut server = tokio::process::Command::new(&python)
        .args([peer, "server"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python websockets server");
    let mut line = String::new();
    let mut out = tokio::io::BufReader::new(server.stdout.take().expect("stdout"));
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line),
    )
    .await
    .expect("the server printed its port")
    .expect("read");
    let port: u16 = line.trim().parse().expect("a port");

    let dir = Dir::new("ws-python");
    let ca = Ca::new("ws ca");
    let leaf = ca.leaf(&["127.0.0.1"], Validity::Now);
    let ca_file = dir.write("ca.pem", &ca.pem);
    let (cert, key) = (
        dir.write("tls.crt", &leaf.cert_pem),
        dir.write("tls.key", &leaf.key_pem),
    );
    for tls in [false, true] {
        let flags: Vec<&str> = if tls {
            vec!["--tls-cert", Dir::arg(&cert), "--tls-key", Dir::arg(&key)]
        } else {
            vec![]
        };
        let proxy = spawn_proxy(&format!("http://127.0.0.1:{port}"), &flags).await;
        let scheme = if tls { "wss" } else { "ws" };
        let url = format!("{scheme}://127.0.0.1:{}/v1/realtime", proxy.addr.port());
        let done = tokio::process::Command::new(&python)
            .args([peer, "client", &url, Dir::arg(&ca_file)])
            .output()
            .await
            .expect("python websockets client");
        let said = String::from_utf8_lossy(&done.stdout);
        assert!(
            done.status.success() && said.starts_with("ok 10 "),
            "tls={tls}: {said}{}",
            String::from_utf8_lossy(&done.stderr)
        );
        let scrape = proxy.eventually(|s| upgraded(s) >= 1.0).await;
        assert_eq!(upgraded(&scrape), 1.0, "tls={tls}");
    }
}
