//! TLS on tokenmeter's own listeners: HTTP/1.1 and HTTP/2 by ALPN, a certificate replaced on
//! disk (as Kubernetes rotates a Secret) served to new connections while an open stream
//! finishes on the old one, and the metrics listener.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::support::client::chat_request;
use crate::support::metrics::metric;
use crate::support::spawn_proxy;
use crate::support::tls::{client_config, connect, https_client, Ca, Dir, Validity};
use crate::support::upstream::{self, openai_chat, Reply, Step};

fn sse_body(steps: &[Step]) -> Vec<u8> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Send(b) => Some(b.to_vec()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[tokio::test]
async fn the_listener_speaks_http1_and_http2_by_alpn() {
    let dir = Dir::new("listen-alpn");
    let ca = Ca::new("listener ca");
    let leaf = ca.leaf(&["127.0.0.1", "localhost"], Validity::Now);
    let (cert, key) = (
        dir.write("tls.crt", &leaf.cert_pem),
        dir.write("tls.key", &leaf.key_pem),
    );
    let steps = openai_chat(Duration::from_millis(5), 8, Duration::from_millis(2), true);
    let want = sse_body(&steps);
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let proxy = spawn_proxy(
        &up.url(),
        &["--tls-cert", Dir::arg(&cert), "--tls-key", Dir::arg(&key)],
    )
    .await;
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
    let want = sse_body(&steps);
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
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let req = http::Request::post("/v1/chat/completions")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_request(true, true))))
        .expect("request");
    let opened = Instant::now();
    let mut body = send.send_request(req).await.expect("response").into_body();
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
    let n = metric("tokenmeter_requests_total")
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
