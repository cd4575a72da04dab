//! Admission under overload: the in-flight cap sheds at once with a 503 the upstream never
//! sees, `/readyz` follows it with hysteresis, the connection cap closes what is past it, and
//! bad caps are configuration errors.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use tokenmeter::metrics::names;

use crate::support::client::{self, chat_request};
use crate::support::metrics::metric;
use crate::support::upstream::{self, openai_chat, script_bytes, Reply, Step};
use crate::support::{serial, spawn_proxy, Proxy};

const MS: Duration = Duration::from_millis(1);

fn chat_url(proxy: &Proxy) -> String {
    format!("{}/v1/chat/completions", proxy.url())
}

async fn readyz(proxy: &Proxy) -> (u16, String) {
    let seen = client::send(
        http::Method::GET,
        &format!("http://{}/readyz", proxy.metrics_addr),
        "",
    )
    .await;
    (
        seen.status,
        String::from_utf8(seen.body).expect("utf-8 readyz"),
    )
}

#[tokio::test]
async fn at_max_in_flight_the_rest_are_shed_at_once_and_never_reach_the_upstream() {
    let _turn = serial().await;
    // Each stream takes about 2 s: all 30 requests arrive while the first 10 stream.
    let steps = openai_chat(50 * MS, 20, 100 * MS, true);
    let expected = script_bytes(&steps);
    let upstream = upstream::spawn({
        let steps = steps.clone();
        move |_| Reply::sse(steps.clone())
    })
    .await;
    let proxy = spawn_proxy(
        &upstream.url(),
        &["--max-in-flight", "10", "--retry-after", "2"],
    )
    .await;
    let url = chat_url(&proxy);
    let tasks: Vec<_> = (0..30)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let seen = client::post(&url, &chat_request(true, true)).await;
                (seen, start.elapsed())
            })
        })
        .collect();
    // While the admitted ten stream, the pod is not ready.
    let during = async {
        for _ in 0..40 {
            if readyz(&proxy).await == (503, "overloaded\n".to_string()) {
                return true;
            }
            tokio::time::sleep(25 * MS).await;
        }
        false
    };
    assert!(
        during.await,
        "/readyz never said overloaded during the burst"
    );
    let mut admitted = 0;
    let mut shed = 0;
    for t in tasks {
        let (seen, took) = t.await.expect("client task");
        match seen.status {
            200 => {
                admitted += 1;
                assert!(!seen.error);
                assert_eq!(seen.body, expected, "an admitted stream is byte-exact");
            }
            503 => {
                shed += 1;
                assert!(took < 500 * MS, "shed after {took:?}");
                assert_eq!(seen.headers["retry-after"], "2");
                assert_eq!(seen.headers["content-type"], "application/json");
                let v: serde_json::Value = serde_json::from_slice(&seen.body).expect("json");
                assert_eq!(v["error"]["type"], "overloaded", "{v}");
                assert_eq!(v["error"]["code"], 503, "{v}");
                assert!(v["error"]["message"].as_str().is_some(), "{v}");
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((admitted, shed), (10, 20));
    let s = proxy.settled(30.0).await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "shed")
            .label("code", "503")
            .value(&s),
        20.0,
        "{s}"
    );
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "complete")
            .value(&s),
        10.0
    );
    assert_eq!(metric(names::IN_FLIGHT_LIMIT).value(&s), 10.0);
    assert_eq!(
        upstream.received.lock().expect("lock").len(),
        10,
        "a shed request never reaches the upstream"
    );
    // The burst is over: ready, and new requests stream again.
    assert_eq!(readyz(&proxy).await, (200, "ready\n".to_string()));
    let again: Vec<_> = (0..10)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { client::post(&url, &chat_request(true, true)).await })
        })
        .collect();
    for t in again {
        let seen = t.await.expect("client task");
        assert_eq!(seen.status, 200);
        assert_eq!(seen.body, expected);
    }
    assert_eq!(upstream.received.lock().expect("lock").len(), 20);
}

/// Opens a stream and returns once its response head has come, holding the body open.
async fn open_stream(url: &str) -> (u16, hyper::body::Incoming) {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_request(true, false))))
        .expect("request");
    let resp = client::client().request(req).await.expect("response");
    (resp.status().as_u16(), resp.into_body())
}

#[tokio::test]
async fn readyz_is_503_at_the_cap_and_200_again_at_the_low_water_mark() {
    // Streams that never end until their client goes away.
    let upstream = upstream::spawn(|_| {
        Reply::sse(vec![
            Step::Send(Bytes::from_static(b": open\n\n")),
            Step::Hang,
        ])
    })
    .await;
    let proxy = spawn_proxy(&upstream.url(), &["--max-in-flight", "20"]).await;
    let url = chat_url(&proxy);
    assert_eq!(readyz(&proxy).await, (200, "ready\n".to_string()));
    let mut open = Vec::new();
    for _ in 0..20 {
        let (status, body) = open_stream(&url).await;
        assert_eq!(status, 200);
        open.push(body);
    }
    assert_eq!(readyz(&proxy).await.0, 503, "at the cap");
    let seen = client::post(&url, &chat_request(true, false)).await;
    assert_eq!(seen.status, 503, "the 21st is shed");
    assert_eq!(readyz(&proxy).await, (503, "overloaded\n".to_string()));
    // 19 in flight is above the mark (18): still not ready.
    open.pop();
    let s = proxy
        .eventually(|s| {
            metric(names::REQUESTS_TOTAL)
                .label("outcome", "client_disconnect")
                .sum_or_zero_if_absent(s)
                >= 1.0
        })
        .await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL)
            .label("outcome", "client_disconnect")
            .value(&s),
        1.0
    );
    assert_eq!(readyz(&proxy).await, (503, "overloaded\n".to_string()));
    // 18: ready again.
    open.pop();
    let mut ready = false;
    for _ in 0..100 {
        if readyz(&proxy).await == (200, "ready\n".to_string()) {
            ready = true;
            break;
        }
        tokio::time::sleep(20 * MS).await;
    }
    assert!(ready, "/readyz stayed 503 at the low-water mark");
    let (status, _body) = open_stream(&url).await;
    assert_eq!(status, 200, "admitted again below the cap");
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    send
}

async fn get(send: &mut SendRequest<Full<Bytes>>) -> Result<u16, hyper::Error> {
    send.ready().await?;
    let req = http::Request::get("/v1/models")
        .header("host", "tokenmeter")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = send.send_request(req).await?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await?;
    Ok(status)
}

#[tokio::test]
async fn past_max_connections_a_new_connection_is_closed_at_once() {
    let upstream = upstream::spawn(|_| Reply::json(200, r#"{"data":[]}"#)).await;
    let proxy = spawn_proxy(&upstream.url(), &["--max-connections", "3"]).await;
    let mut conns = Vec::new();
    for _ in 0..3 {
        let mut c = connect(proxy.addr).await;
        // Answered: the proxy has accepted it.
        assert_eq!(get(&mut c).await.expect("served"), 200);
        conns.push(c);
    }
    let start = Instant::now();
    let mut fourth = TcpStream::connect(proxy.addr)
        .await
        .expect("the kernel accepts");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(2), fourth.read(&mut buf))
        .await
        .expect("closed, not left waiting");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(
        start.elapsed() < 500 * MS,
        "closed after {:?}",
        start.elapsed()
    );
    // The earlier ones keep working.
    for c in &mut conns {
        assert_eq!(get(c).await.expect("still served"), 200);
    }
    let s = proxy.scrape().await;
    assert_eq!(metric(names::CONNECTIONS_REFUSED_TOTAL).value(&s), 1.0);
    assert_eq!(metric(names::CONNECTIONS_LIMIT).value(&s), 3.0);
    // One closes: a new connection is served again.
    drop(conns.pop());
    let mut served = false;
    for _ in 0..100 {
        let mut c = connect(proxy.addr).await;
        if get(&mut c).await.is_ok_and(|s| s == 200) {
            served = true;
            break;
        }
        tokio::time::sleep(20 * MS).await;
    }
    assert!(served, "no connection served after one closed");
}

#[test]
fn bad_admission_flags_exit_64_naming_the_flag() {
    for flag in ["--max-in-flight", "--max-connections", "--retry-after"] {
        for bad in ["0", "-1", "many"] {
            let arg = format!("{flag}={bad}");
            let (code, err) = crate::cli::run_err(&["--upstream", "http://127.0.0.1:1", &arg]);
            assert_eq!(code, 64, "{arg}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{arg}: {err}");
            assert!(err.contains(flag), "{arg}: {err}");
        }
    }
    for (var, flag) in [
        ("TOKENMETER_MAX_IN_FLIGHT", "--max-in-flight"),
        ("TOKENMETER_MAX_CONNECTIONS", "--max-connections"),
    ] {
        let (code, err) =
            crate::cli::run_err_env(&["--upstream", "http://127.0.0.1:1"], &[(var, "0")]);
        assert_eq!(code, 64, "{var}: {err}");
        assert!(err.contains(flag), "{var}: {err}");
    }
}
