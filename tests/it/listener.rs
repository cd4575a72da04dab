//! TLS on tokenmeter's own listeners: HTTP/1.1 and HTTP/2 by ALPN, a certificate replaced on
//! disk (as Kubernetes rotates a Secret) served to new connections while an open stream
//! finishes on the old one, and the metrics listener.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use tokenmeter::metrics::names;

use crate::support::client::chat_request;
use crate::support::metrics::metric;
use crate::support::tls::{client_config, connect, https_client, Ca, Dir, Validity};
use crate::support::upstream::{self, openai_chat, script_bytes, Reply, Step};
use crate::support::{spawn_proxy, Proxy};

/// A proxy whose listener serves TLS with a certificate of a CA of its own, in front of an
/// upstream that streams `steps`.
struct TlsProxy {
    proxy: Proxy,
    ca: Ca,
    /// The body the upstream sends, which every client must get whole.
    want: Vec<u8>,
    up: upstream::Upstream,
    _dir: Dir,
}

async fn tls_proxy(name: &str, steps: Vec<Step>) -> TlsProxy {
    let dir = Dir::new(name);
    let ca = Ca::new("listener ca");
    let leaf = ca.leaf(&["127.0.0.1", "localhost"], Validity::Now);
    let (cert, key) = (
        dir.write("tls.crt", &leaf.cert_pem),
        dir.write("tls.key", &leaf.key_pem),
    );
    let want = script_bytes(&steps);
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let proxy = spawn_proxy(
        &up.url(),
        &["--tls-cert", Dir::arg(&cert), "--tls-key", Dir::arg(&key)],
    )
    .await;
    TlsProxy {
        proxy,
        ca,
        want,
        up,
        _dir: dir,
    }
}

/// Sends a streamed chat request over `io` by HTTP/1.1 (the connection driven in a task of
/// its own) and returns the response as it begins.
async fn chat_over_http1<I>(io: I, host: &str) -> http::Response<hyper::body::Incoming>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    let req = http::Request::post("/v1/chat/completions")
        .header("host", host)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_request(true, true))))
        .expect("request");
    send.send_request(req).await.expect("response")
}

#[tokio::test]
async fn the_listener_speaks_http1_and_http2_by_alpn() {
    let steps = openai_chat(Duration::from_millis(5), 8, Duration::from_millis(2), true);
    let TlsProxy {
        proxy,
        ca,
        want,
        up,
        _dir,
    } = tls_proxy("listen-alpn", steps).await;
    for http2 in [false, true] {
        let req = http::Request::get(format!("https://127.0.0.1:{}/v1/models", proxy.addr.port()))
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
        let resp = https_client(&ca, http2)
            .request(req)
            .await
            .expect("response");
        let want_version = if http2 {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        assert_eq!(resp.version(), want_version);
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(body.as_ref(), &want[..], "http2={http2}");
    }
    // Plain HTTP on a TLS listener is refused, not served in the clear.
    let plain = crate::support::client::client()
        .request(
            http::Request::get(format!("http://{}/v1/models", proxy.addr))
                .body(Full::new(Bytes::new()))
                .expect("request"),
        )
        .await;
    assert!(plain.is_err() || plain.is_ok_and(|r| r.status() != 200));
    assert_eq!(up.received.lock().expect("lock").len(), 2);
}

/// Lays out a Secret volume: `tls.crt -> ..data/tls.crt`, `..data -> VERSION/`.
fn secret_volume(dir: &Path, version: &str, cert: &str, key: &str) {
    let v = dir.join(version);
    std::fs::create_dir_all(&v).expect("mkdir");
    std::fs::write(v.join("tls.crt"), cert).expect("write");
    std::fs::write(v.join("tls.key"), key).expect("write");
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(version, &tmp).expect("symlink");
    // rename(2) swaps the link atomically, as the kubelet does.
    std::fs::rename(&tmp, dir.join("..data")).expect("swap");
    for f in ["tls.crt", "tls.key"] {
        let link = dir.join(f);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{f}"), &link).expect("symlink");
        }
    }
}

#[tokio::test]
async fn a_certificate_replaced_on_disk_reaches_new_connections_while_a_stream_finishes() {
    let dir = Dir::new("listen-reload");
    let ca = Ca::new("listener ca");
    let (old, new) = (
        ca.leaf(&["127.0.0.1"], Validity::Now),
        ca.leaf(&["127.0.0.1"], Validity::Now),
    );
    secret_volume(&dir.0, "v1", &old.cert_pem, &old.key_pem);
    // A stream long enough to outlive the rotation: 40 tokens 100 ms apart.
    let steps = openai_chat(Duration::ZERO, 40, Duration::from_millis(100), true);
    let want = script_bytes(&steps);
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let (cert, key) = (dir.0.join("tls.crt"), dir.0.join("tls.key"));
    let proxy = spawn_proxy(
        &up.url(),
        &["--tls-cert", Dir::arg(&cert), "--tls-key", Dir::arg(&key)],
    )
    .await;
    let cfg = client_config(&ca, &[b"http/1.1"]);

    // The open stream, on a connection made with the old certificate.
    let (tls, seen) = connect(proxy.addr, "127.0.0.1", cfg.clone())
        .await
        .expect("tls");
    assert_eq!(seen, old.der);
    let opened = Instant::now();
    let mut body = chat_over_http1(TokioIo::new(tls), "127.0.0.1")
        .await
        .into_body();
    let mut got = Vec::new();
    // Read a little of the stream before rotating.
    while got.len() < want.len() / 8 {
        let frame = body.frame().await.expect("frame").expect("data");
        got.extend_from_slice(frame.data_ref().expect("data"));
    }

    secret_volume(&dir.0, "v2", &new.cert_pem, &new.key_pem);
    let start = Instant::now();
    loop {
        let (_, now) = connect(proxy.addr, "127.0.0.1", cfg.clone())
            .await
            .expect("tls");
        if now == new.der {
            // The stream takes 3.9 s: it is still open.
            assert!(
                opened.elapsed() < Duration::from_millis(3500),
                "the new certificate came only after {:?}",
                opened.elapsed()
            );
            break;
        }
        assert_eq!(now, old.der);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the new certificate was not served within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The old stream is still under way (it has most of its 4 s to go) and finishes intact.
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the open stream was not cut");
        if let Some(d) = frame.data_ref() {
            got.extend_from_slice(d);
        }
    }
    assert_eq!(got, want);
    let scrape = proxy.settled(1.0).await;
    let n = metric(names::REQUESTS_TOTAL)
        .label("outcome", "complete")
        .value(&scrape);
    assert_eq!(n, 1.0);
}

#[tokio::test]
async fn the_metrics_listener_takes_tls_too() {
    let dir = Dir::new("listen-metrics");
    let ca = Ca::new("metrics ca");
    let leaf = ca.leaf(&["127.0.0.1"], Validity::Now);
    let (cert, key) = (
        dir.write("m.crt", &leaf.cert_pem),
        dir.write("m.key", &leaf.key_pem),
    );
    let up = upstream::spawn(|_| Reply::json(200, "{}")).await;
    let proxy = spawn_proxy(
        &up.url(),
        &[
            "--metrics-tls-cert",
            Dir::arg(&cert),
            "--metrics-tls-key",
            Dir::arg(&key),
        ],
    )
    .await;
    let (status, body) =
        crate::support::tls::get_over_tls(proxy.metrics_addr, "127.0.0.1", &ca, "/metrics").await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("tokenmeter_build_info"));
    let (status, _) =
        crate::support::tls::get_over_tls(proxy.metrics_addr, "127.0.0.1", &ca, "/readyz").await;
    assert_eq!(status, 200);
}

/// A plain connection whose first write carries only `first` bytes; the rest follows after a
/// pause, so the proxy's first look at it sees no more than that.
struct SlowStart {
    tcp: tokio::net::TcpStream,
    first: usize,
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl SlowStart {
    async fn connect(addr: std::net::SocketAddr, first: usize) -> TokioIo<Self> {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        TokioIo::new(SlowStart {
            tcp,
            first,
            pause: None,
        })
    }
}

impl tokio::io::AsyncRead for SlowStart {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for SlowStart {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.first > 0 {
            let n = buf.len().min(this.first);
            let n = std::task::ready!(std::pin::Pin::new(&mut this.tcp).poll_write(cx, &buf[..n]))?;
            this.first -= n;
            if this.first == 0 {
                this.pause = Some(Box::pin(tokio::time::sleep(Duration::from_millis(150))));
            }
            return Poll::Ready(Ok(n));
        }
        if let Some(p) = this.pause.as_mut() {
            std::task::ready!(std::future::Future::poll(p.as_mut(), cx));
            this.pause = None;
        }
        std::pin::Pin::new(&mut this.tcp).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// The proxy tells HTTP/1 from HTTP/2 (prior knowledge) by a plain connection's first bytes,
/// without reading them, and waits for more when too few have come to tell (a request line's
/// `P`, part of the preface). Every way gets the whole stream.
#[tokio::test]
async fn plain_connections_are_told_apart_by_their_first_bytes_however_they_arrive() {
    let steps = openai_chat(Duration::from_millis(2), 6, Duration::from_millis(1), true);
    let want = script_bytes(&steps);
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    // (HTTP/2?, bytes in the first write): whole, one byte, part of the preface.
    for (http2, first) in [(false, 1 << 20), (false, 1), (true, 1 << 20), (true, 5)] {
        let io = SlowStart::connect(proxy.addr, first).await;
        let resp = if http2 {
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .expect("h2 handshake");
            tokio::spawn(conn);
            let req = http::Request::post(format!("http://{}/v1/chat/completions", proxy.addr))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(chat_request(true, true))))
                .expect("request");
            send.send_request(req).await.expect("h2 response")
        } else {
            chat_over_http1(io, "tokenmeter").await
        };
        let version = if http2 {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        assert_eq!(resp.version(), version, "first write {first} bytes");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(body.as_ref(), &want[..], "http2={http2} first={first}");
    }
    let s = proxy.settled(1.0).await;
    assert_eq!(metric(names::OUTPUT_TOKENS_TOTAL).value(&s), 24.0);
    assert_eq!(up.received.lock().expect("lock").len(), 4);
}

/// A plain connection that never sends a byte is closed after the header read timeout, as one
/// that sends its head too slowly is (hyper's `auto` connection used to wait for it forever).
#[tokio::test]
async fn a_plain_connection_that_sends_nothing_is_closed_after_the_header_read_timeout() {
    use tokio::io::AsyncReadExt;
    let up = upstream::spawn(|_| Reply::json(200, "{}")).await;
    let proxy = spawn_proxy(&up.url(), &["--header-read-timeout", "300ms"]).await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    let start = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
        .await
        .expect("the proxy must close a silent connection")
        .unwrap_or(0);
    let held = start.elapsed();
    assert_eq!(n, 0, "closed without a response");
    assert!(
        held >= Duration::from_millis(250) && held < Duration::from_secs(5),
        "held {held:?} for a 300 ms header read timeout"
    );
    assert_eq!(up.opened(), 0);
}

/// A TLS client that offers no ALPN is told apart by what it sends, as a plain one is.
#[tokio::test]
async fn a_tls_client_that_offers_no_alpn_is_served_by_what_it_sends() {
    let steps = openai_chat(Duration::from_millis(2), 5, Duration::from_millis(1), true);
    let TlsProxy {
        proxy,
        ca,
        want,
        up: _up,
        _dir,
    } = tls_proxy("listen-no-alpn", steps).await;
    let (tls, _) = connect(proxy.addr, "localhost", client_config(&ca, &[]))
        .await
        .expect("tls");
    assert_eq!(tls.get_ref().1.alpn_protocol(), None);
    let resp = chat_over_http1(TokioIo::new(tls), "localhost").await;
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body.as_ref(), &want[..]);
}
