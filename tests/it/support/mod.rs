//! Shared test machinery: what the tools' tests use too is in the `tokenmeter-testkit` crate
//! (a proxy on port 0, scripted upstreams, a client that timestamps frames, metric matchers, the
//! corpus loader, the serial turn, skips), re-exported here under the paths the tests name; the
//! rest is this binary's own.

#![allow(dead_code)]

pub mod levels;
pub mod process;
pub mod promtool;
pub mod raw;
pub mod tls;
pub mod tokenizer;
pub mod ws;

pub use tokenmeter_testkit::{
    client, config_of, corpus, current_test, in_ci, metrics, serial, serial_blocking, sim_flags,
    skip, spawn, spawn_proxy, start_sim, upstream, with_engine_metrics_off, Proxy, StallWatch,
};

use self::client::Seen;
use self::upstream::{Reply, Step, Upstream};

/// What one request through a fresh proxy left: the parts, what the client saw, and the
/// scrape once the request was recorded.
pub struct Streamed {
    pub proxy: Proxy,
    pub upstream: Upstream,
    pub seen: Seen,
    pub scrape: String,
}

/// A proxy with `flags` in front of an upstream that answers every request with the SSE
/// `steps`, and one streaming chat request through it (`chat_request(true, true)`): the set-up
/// most metric tests share.
pub async fn stream_once(steps: Vec<Step>, flags: &[&str]) -> Streamed {
    let upstream = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let proxy = spawn_proxy(&upstream.url(), flags).await;
    let seen = client::post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &client::chat_request(true, true),
    )
    .await;
    let scrape = proxy.settled(1.0).await;
    Streamed {
        proxy,
        upstream,
        seen,
        scrape,
    }
}

/// A small deterministic PRNG (xorshift64*), so failures replay.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// Cuts `data` into pieces of random sizes in `lo..=hi`.
    pub fn pieces(&mut self, data: &[u8], lo: usize, hi: usize) -> Vec<bytes::Bytes> {
        let mut out = Vec::new();
        let mut rest = data;
        while !rest.is_empty() {
            let n = self.range(lo, hi).min(rest.len());
            out.push(bytes::Bytes::copy_from_slice(&rest[..n]));
            rest = &rest[n..];
        }
        out
    }
}
