//! The demo's load: closed-loop streaming clients on loopback, as many at once as the ramp says.
//!
//! Worker `i` runs while the target concurrency is above `i`: it sends a streaming chat request,
//! reads the whole response, and sends the next one at once (closed loop), so the number of
//! requests in flight follows the target. When the target drops, workers above it finish the
//! request they are on and then wait, so no request is cut off by the ramp.
//!
//! The clients measure what a user sees: time to first token from the moment the request is sent,
//! and per-request decode speed, (tokens - 1) / (last token - first token), the same definition
//! tokenmeter uses. Tokens are counted with tokenmeter's own SSE decoder and OpenAI extractor.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::protocol::openai::OpenAi;
use crate::protocol::Extractor;
use crate::read::sse;
use crate::sim::text::{Lengths, Rng, VOCABULARY};

/// What the load sends.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// `http://host:port/v1/chat/completions` of the proxy.
    pub url: Uri,
    pub model: String,
    /// `max_tokens` of each request (the simulator honours it exactly).
    pub output_tokens: Lengths,
    /// Characters of prompt per request.
    pub prompt_chars: Lengths,
    pub seed: u64,
    /// Workers started: the highest concurrency the ramp can ask for.
    pub workers: usize,
}

/// Samples older than this are dropped, which bounds memory whatever the run length.
const KEEP: Duration = Duration::from_secs(30);

/// After a failed request a worker waits this long, so an unreachable proxy is not hammered.
const ERROR_BACKOFF: Duration = Duration::from_millis(200);

#[derive(Debug, Default)]
struct Shared {
    in_flight: AtomicUsize,
    started: AtomicU64,
    tokens: AtomicU64,
    completed: AtomicU64,
    errors: AtomicU64,
    samples: Mutex<Samples>,
}

#[derive(Debug, Default)]
struct Samples {
    /// (when the first token arrived, TTFT in seconds)
    ttft: VecDeque<(Instant, f64)>,
    /// (when the request ended, its decode tokens/s)
    tps: VecDeque<(Instant, f64)>,
}

fn push(q: &mut VecDeque<(Instant, f64)>, at: Instant, v: f64) {
    while q
        .front()
        .is_some_and(|(t, _)| at.saturating_duration_since(*t) > KEEP)
    {
        q.pop_front();
    }
    q.push_back((at, v));
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Samples> {
        self.samples.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the clients measured, for one row of the table.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub in_flight: usize,
    /// Requests sent since the start (complete, failed, or cut off by an abort).
    pub started: u64,
    /// Output tokens received since the start.
    pub tokens: u64,
    pub completed: u64,
    pub errors: u64,
    /// Per-request tokens/s of the requests that ended within the window, unsorted.
    pub tps: Vec<f64>,
    /// TTFT in seconds of the first tokens that arrived within the window, unsorted.
    pub ttft: Vec<f64>,
}

/// A running load.
pub struct Load {
    target: watch::Sender<usize>,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Load {
    /// Starts the workers (idle until [`Load::set_target`]).
    pub fn start(cfg: LoadConfig) -> Load {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(connector);
        let (target, rx) = watch::channel(0usize);
        let shared = Arc::new(Shared::default());
        let cfg = Arc::new(cfg);
        let workers = (0..cfg.workers)
            .map(|i| {
                tokio::spawn(worker(
                    i,
                    Arc::clone(&cfg),
                    client.clone(),
                    rx.clone(),
                    Arc::clone(&shared),
                ))
            })
            .collect();
        Load {
            target,
            shared,
            workers,
        }
    }

    /// Sets how many requests should be in flight.
    pub fn set_target(&self, n: usize) {
        self.target.send_replace(n);
    }

    /// What the clients measured; `window` bounds the TTFT and TPS samples returned.
    pub fn sample(&self, window: Duration) -> Sample {
        let now = Instant::now();
        let recent = |q: &VecDeque<(Instant, f64)>| -> Vec<f64> {
            q.iter()
                .filter(|(t, _)| now.saturating_duration_since(*t) <= window)
                .map(|(_, v)| *v)
                .collect()
        };
        let s = self.shared.lock();
        Sample {
            in_flight: self.shared.in_flight.load(Ordering::Relaxed),
            started: self.shared.started.load(Ordering::Relaxed),
            tokens: self.shared.tokens.load(Ordering::Relaxed),
            completed: self.shared.completed.load(Ordering::Relaxed),
            errors: self.shared.errors.load(Ordering::Relaxed),
            tps: recent(&s.tps),
            ttft: recent(&s.ttft),
        }
    }

    /// Sends no new request and waits for those in flight to finish.
    pub async fn finish(&self) {
        self.set_target(0);
        while self.shared.in_flight.load(Ordering::Relaxed) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Cancels every request still in flight (the clients hang up) and stops the workers; returns
    /// the final totals.
    pub async fn abort(mut self) -> Sample {
        for w in &self.workers {
            w.abort();
        }
        for w in self.workers.iter_mut() {
            let _ = w.await;
        }
        self.sample(Duration::ZERO)
    }
}

/// Counts a request in flight for as long as it lives, however it ends (even when aborted).
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        InFlight(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn worker(
    i: usize,
    cfg: Arc<LoadConfig>,
    client: Client<HttpConnector, Full<Bytes>>,
    mut target: watch::Receiver<usize>,
    shared: Arc<Shared>,
) {
    let mut rng = Rng::new(cfg.seed ^ (i as u64).wrapping_mul(0xA076_1D64_78BD_642F));
    loop {
        if target.wait_for(|&t| t > i).await.is_err() {
            return;
        }
        let result = {
            let _guard = InFlight::new(&shared.in_flight);
            shared.started.fetch_add(1, Ordering::Relaxed);
            one_request(&cfg, &client, &mut rng, &shared).await
        };
        match result {
            Ok(()) => {
                shared.completed.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "demo request failed");
                tokio::time::sleep(ERROR_BACKOFF).await;
            }
        }
    }
}

/// Why a demo request failed.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("cannot build the request: {0}")]
    Build(#[from] http::Error),
    #[error("request failed: {0}")]
    Send(#[from] hyper_util::client::legacy::Error),
    #[error("response status {0}")]
    Status(u16),
    #[error("response body failed: {0}")]
    Body(#[from] hyper::Error),
}

fn prompt(chars: usize, rng: &mut Rng) -> String {
    let mut s = String::with_capacity(chars + 16);
    while s.len() < chars {
        s.push_str(VOCABULARY[(rng.next_u64() % VOCABULARY.len() as u64) as usize]);
    }
    s
}

async fn one_request(
    cfg: &LoadConfig,
    client: &Client<HttpConnector, Full<Bytes>>,
    rng: &mut Rng,
    shared: &Shared,
) -> Result<(), Failed> {
    let max_tokens = cfg.output_tokens.sample(rng);
    let chars = cfg.prompt_chars.sample(rng) as usize;
    let body = serde_json::json!({
        "model": cfg.model,
        "messages": [{"role": "user", "content": prompt(chars, rng)}],
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let req = Request::post(cfg.url.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))?;
    let sent = Instant::now();
    let resp = client.request(req).await?;
    if !resp.status().is_success() {
        return Err(Failed::Status(resp.status().as_u16()));
    }
    let mut body = resp.into_body();
    let mut decoder = sse::Decoder::new(1 << 20);
    let mut extractor = OpenAi::default();
    let (mut first, mut last, mut n) = (None, None, 0u64);
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let now = Instant::now();
        let mut got = 0u64;
        decoder.feed(data, &mut |m| got += u64::from(extractor.on_message(&m)));
        if got == 0 {
            continue;
        }
        if first.is_none() {
            first = Some(now);
            push(
                &mut shared.lock().ttft,
                now,
                now.duration_since(sent).as_secs_f64(),
            );
        }
        last = Some(now);
        n += got;
        shared.tokens.fetch_add(got, Ordering::Relaxed);
    }
    if let (Some(f), Some(l)) = (first, last) {
        let decode = l.duration_since(f).as_secs_f64();
        if n >= 2 && decode > 0.0 {
            push(&mut shared.lock().tps, l, (n - 1) as f64 / decode);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_have_the_asked_length_give_or_take_a_word() {
        let mut rng = Rng::new(3);
        for chars in [1, 100, 1000] {
            let p = prompt(chars, &mut rng);
            assert!(
                p.len() >= chars && p.len() < chars + 16,
                "{chars}: {}",
                p.len()
            );
        }
    }

    #[test]
    fn old_samples_are_forgotten() {
        let mut q = VecDeque::new();
        let t0 = Instant::now();
        push(&mut q, t0, 1.0);
        push(&mut q, t0 + Duration::from_secs(10), 2.0);
        push(&mut q, t0 + KEEP + Duration::from_secs(5), 3.0);
        assert_eq!(q.iter().map(|(_, v)| *v).collect::<Vec<_>>(), [2.0, 3.0]);
    }
}
