//! A test client that records when each body frame arrived.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A response as the client saw it.
#[derive(Debug)]
pub struct Seen {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
    /// (time since the request was sent, bytes) for each frame.
    pub frames: Vec<(Duration, Bytes)>,
    /// The body ended with an error (the connection was cut).
    pub error: bool,
}

pub type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// POSTs a JSON body and reads the whole response, timestamping frames.
pub async fn post(url: &str, json: &str) -> Seen {
    send(http::Method::POST, url, json).await
}

pub async fn send(method: http::Method, url: &str, body: &str) -> Seen {
    send_with(method, url, body, &[("content-type", "application/json")]).await
}

/// POSTs `body` with these headers (and no others).
pub async fn post_with(url: &str, body: &str, headers: &[(&str, &str)]) -> Seen {
    send_with(http::Method::POST, url, body, headers).await
}

async fn send_with(method: http::Method, url: &str, body: &str, headers: &[(&str, &str)]) -> Seen {
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let start = Instant::now();
    let resp = client().request(req).await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = resp.into_body();
    let mut seen = Seen {
        status,
        headers,
        body: Vec::new(),
        frames: Vec::new(),
        error: false,
    };
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(data) = f.into_data() {
                    seen.body.extend_from_slice(&data);
                    seen.frames.push((start.elapsed(), data));
                }
            }
            Err(_) => {
                seen.error = true;
                break;
            }
        }
    }
    seen
}

/// POSTs a JSON body, reads at least `bytes` bytes of the response (or all of it, if shorter)
/// and goes away, closing the connection; returns what it read.
pub async fn post_read_then_drop(url: &str, json: &str, bytes: usize) -> Vec<u8> {
    let req = http::Request::builder()
        .method(http::Method::POST)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json.to_string())))
        .expect("request");
    let resp = client().request(req).await.expect("response");
    let mut body = resp.into_body();
    let mut read = Vec::new();
    while read.len() < bytes {
        match body.frame().await {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    read.extend_from_slice(&data);
                }
            }
            _ => break,
        }
    }
    read
}

/// GETs a URL and returns its body as text.
pub async fn get_text(url: &str) -> String {
    let seen = send(http::Method::GET, url, "").await;
    String::from_utf8(seen.body).expect("utf-8 body")
}

/// A chat completion request body.
pub fn chat_request(stream: bool, usage: bool) -> String {
    serde_json::json!({
        "model": "req-model",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": stream,
        "stream_options": {"include_usage": usage},
    })
    .to_string()
}
