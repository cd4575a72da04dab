//! WebSocket peers for the upgrade tests: an echo server (plain or TLS) and a client, both
//! tokio-tungstenite, a complete RFC 6455 implementation (handshake, masking, fragmentation,
//! close handshake), so the proxy is exercised by a real WebSocket stack on each side.
//! And a raw upgrade upstream that answers 101 and then echoes bytes, for byte-level checks.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::Message;

/// A running echo server.
pub struct Echo {
    pub addr: SocketAddr,
    /// WebSocket sessions that completed their close handshake.
    pub closed_cleanly: Arc<AtomicUsize>,
}

impl Echo {
    pub fn closed_cleanly(&self) -> usize {
        self.closed_cleanly.load(Ordering::SeqCst)
    }
}

/// Echoes every text and binary message back, over TLS when `tls` is given.
pub async fn spawn_echo(tls: Option<TlsAcceptor>) -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let closed = Arc::new(AtomicUsize::new(0));
    let closed2 = Arc::clone(&closed);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (tls, closed) = (tls.clone(), Arc::clone(&closed2));
            tokio::spawn(async move {
                match tls {
                    None => echo(tcp, closed).await,
                    Some(tls) => {
                        if let Ok(s) = tls.accept(tcp).await {
                            echo(s, closed).await;
                        }
                    }
                }
            });
        }
    });
    Echo {
        addr,
        closed_cleanly: closed,
    }
}

async fn echo<S: AsyncRead + AsyncWrite + Unpin>(s: S, closed: Arc<AtomicUsize>) {
    let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
        return;
    };
    while let Some(msg) = ws.next().await {
        match msg {
            Ok(m @ (Message::Text(_) | Message::Binary(_))) => {
                if ws.send(m).await.is_err() {
                    return;
                }
            }
            Ok(Message::Close(_)) => {
                // tungstenite answers the close frame itself; drain until it is flushed.
                while ws.next().await.is_some() {}
                closed.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

/// An upstream that answers any request with `101 Switching Protocols` (`Upgrade: raw-echo`)
/// and then writes back every byte it reads, each byte XOR 0xFF, so an echo cannot be confused
/// with the client's own bytes.
pub async fn spawn_raw_upgrade() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                // Read the request head.
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if tcp.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                let resp = b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: raw-echo\r\n\r\n";
                if tcp.write_all(resp).await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            let out: Vec<u8> = buf[..n].iter().map(|b| b ^ 0xFF).collect();
                            if tcp.write_all(&out).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Opens a plain TCP connection and completes the WebSocket handshake for `ws://HOST/path`.
pub async fn connect_plain(
    addr: SocketAddr,
    path: &str,
) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let (ws, resp) = tokio_tungstenite::client_async(format!("ws://{addr}{path}"), tcp)
        .await
        .expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    ws
}

/// Sends each message and checks that the same message comes back; returns the byte count.
pub async fn echo_round_trips<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut tokio_tungstenite::WebSocketStream<S>,
    messages: &[Message],
) -> usize {
    let mut total = 0;
    for m in messages {
        ws.send(m.clone()).await.expect("send");
        let back = loop {
            match ws.next().await.expect("echo").expect("frame") {
                Message::Ping(_) | Message::Pong(_) => continue,
                other => break other,
            }
        };
        assert_eq!(&back, m, "the echo differs");
        total += m.len();
    }
    total
}

/// Messages of the sizes where the frame header changes (7-bit, 16-bit, 64-bit lengths),
/// text and binary, with every byte value.
pub fn test_messages() -> Vec<Message> {
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let mut v = vec![
        Message::text("hello through tokenmeter"),
        Message::text("ünïcödé ✓ 🚀"),
        Message::binary(all_bytes),
    ];
    for n in [0usize, 1, 125, 126, 65_535, 65_536, 1 << 20] {
        let mut rng = super::Rng::new(n as u64 + 7);
        let data: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
        v.push(Message::binary(data));
    }
    v
}
