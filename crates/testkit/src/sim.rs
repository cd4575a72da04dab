//! The simulator in the test process, as `tokenmeter sim` would run it, and a client of its
//! own endpoints (a raw HTTP/1.1 connection for the tests that hold many streams open).

use std::net::SocketAddr;

use bytes::Bytes;
use clap::Parser;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokenmeter_tools::sim::{Sim, SimConfig};

use crate::client::{self, Seen};

#[derive(Parser)]
struct SimCli {
    #[command(flatten)]
    sim: tokenmeter_tools::sim::SimArgs,
}

/// The simulator as `tokenmeter sim` would run with `flags`, on a free port, with 1 ms steps
/// and nothing else timed (for tests of counts, not of speed).
pub fn sim_flags(flags: &[&str]) -> SimConfig {
    let mut argv = vec![
        "sim",
        "--listen",
        "127.0.0.1:0",
        "--step-base",
        "1ms",
        "--step-per-seq",
        "0ms",
        "--prefill-per-token",
        "0ms",
    ];
    argv.extend_from_slice(flags);
    SimCli::try_parse_from(argv)
        .expect("the simulator's flags parse")
        .sim
        .validate()
        .expect("valid simulator flags")
}

/// Starts the simulator in this process (on the port `cfg` names; 0 by default).
pub async fn start_sim(cfg: SimConfig) -> SocketAddr {
    let sim = Sim::bind(&cfg).await.expect("bind the simulator");
    let addr = sim.local_addr();
    tokio::spawn(sim.serve(std::future::pending()));
    addr
}

/// An HTTP/1.1 connection to `addr`, without the pooled client's machinery: one per stream
/// when a test holds thousands open.
pub async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

/// A JSON request for [`connect`]'s connection.
pub fn request(
    method: &str,
    addr: SocketAddr,
    path: &str,
    body: &str,
) -> http::Request<Full<Bytes>> {
    http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request")
}

/// `GET` of `path` on the simulator at `addr`.
pub async fn get(addr: SocketAddr, path: &str) -> Seen {
    client::send(http::Method::GET, &format!("http://{addr}{path}"), "").await
}

/// The simulator's `/sim/stats`.
pub async fn stats(addr: SocketAddr) -> Value {
    serde_json::from_slice(&get(addr, "/sim/stats").await.body).expect("a JSON body")
}

/// A chat request's body, asking for usage, with at most `max_tokens` when given.
pub fn chat(max_tokens: Option<u32>, stream: bool) -> String {
    let mut v = serde_json::json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": "Tell me about continuous batching."}],
        "stream": stream,
        "stream_options": {"include_usage": true},
    });
    if let Some(n) = max_tokens {
        v["max_tokens"] = n.into();
    }
    v.to_string()
}
