//! Closed-loop load: N workers, each sending its next request as soon as the last one ends, so
//! exactly N requests are in flight for the whole measurement window.
//!
//! A level stops topping up when its budget runs out: at the deadline (`--duration`) or when the
//! last of its requests has been handed out (`--requests`). That moment ends the **window**, the
//! span during which N requests were in flight. The requests still running then are waited for
//! (their latencies count; no request is cut, which would skew both the per-request figures and
//! a proxy's counters), but the aggregate throughput counts only the output tokens that arrived
//! inside the window, divided by the window: the server's throughput at N, not a blend of N and
//! the drain.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::client::{Client, Sample};
use super::progress::Live;
use super::prompt::RequestBuilder;

/// When a level stops sending new requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Keep N in flight for this long.
    After(Duration),
    /// Send this many requests in all (at least N).
    Requests(u64),
}

/// Everything one level measured.
#[derive(Debug)]
pub struct LevelRun {
    pub concurrency: usize,
    pub started: Instant,
    /// The end of the window: the first moment fewer than N requests were in flight.
    pub window_end: Instant,
    /// When the last request ended.
    pub finished: Instant,
    pub samples: Vec<Sample>,
}

impl LevelRun {
    pub fn window(&self) -> Duration {
        self.window_end.saturating_duration_since(self.started)
    }

    /// Output tokens that arrived inside the window.
    pub fn tokens_in_window(&self) -> f64 {
        self.samples
            .iter()
            .map(|s| s.tokens_until(self.window_end))
            .sum()
    }

    /// Output tokens per second over the window, all requests together.
    pub fn aggregate_tps(&self) -> f64 {
        let w = self.window().as_secs_f64();
        if w > 0.0 {
            self.tokens_in_window() / w
        } else {
            0.0
        }
    }
}

/// What every level of a run shares.
#[derive(Clone)]
pub struct Driver {
    pub client: Arc<Client>,
    pub requests: Arc<RequestBuilder>,
    /// Numbers requests across the whole run, so every prompt differs.
    pub next_id: Arc<AtomicU64>,
    /// Set on Ctrl-C: no new request is sent; the ones in flight finish.
    pub interrupted: Arc<AtomicBool>,
}

/// What the workers of one level share.
struct Level {
    driver: Driver,
    handed_out: AtomicU64,
    stop: Stop,
    deadline: Instant,
    window_end: Mutex<Option<Instant>>,
    samples: Mutex<Vec<Sample>>,
    live: Arc<Live>,
}

impl Level {
    /// May a worker send another request? The first `false` ends the window.
    fn take(&self) -> bool {
        let more = !self.driver.interrupted.load(Ordering::Relaxed)
            && match self.stop {
                Stop::After(_) => Instant::now() < self.deadline,
                Stop::Requests(n) => self.handed_out.fetch_add(1, Ordering::Relaxed) < n,
            };
        if !more {
            let now = Instant::now();
            let mut end = self.window_end.lock().unwrap_or_else(|e| e.into_inner());
            let first = end.map_or(now, |e| e.min(now));
            *end = Some(match self.stop {
                Stop::After(_) => first.min(self.deadline),
                Stop::Requests(_) => first,
            });
        }
        more
    }

    async fn work(self: Arc<Self>) {
        let d = &self.driver;
        while self.take() {
            let id = d.next_id.fetch_add(1, Ordering::Relaxed);
            let body = d.requests.body(id, d.requests.output_tokens);
            self.live.sent.fetch_add(1, Ordering::Relaxed);
            let sample = d.client.send(d.requests.endpoint.path(), body).await;
            self.live.record(&sample);
            self.samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(sample);
        }
    }
}

impl Driver {
    /// Runs one level: `concurrency` workers until `stop` (or an interrupt), then waits for the
    /// requests still in flight.
    pub async fn run_level(&self, concurrency: usize, stop: Stop, live: Arc<Live>) -> LevelRun {
        let started = Instant::now();
        let deadline = match stop {
            Stop::After(d) => started + d,
            Stop::Requests(_) => started,
        };
        let level = Arc::new(Level {
            driver: self.clone(),
            handed_out: AtomicU64::new(0),
            stop,
            deadline,
            window_end: Mutex::new(None),
            samples: Mutex::new(Vec::new()),
            live,
        });
        let mut workers = JoinSet::new();
        for _ in 0..concurrency {
            workers.spawn(level.clone().work());
        }
        while let Some(joined) = workers.join_next().await {
            if let Err(e) = joined {
                tracing::error!(error = %e, "bench worker failed");
            }
        }
        let finished = Instant::now();
        let window_end = level
            .window_end
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(finished);
        let samples = std::mem::take(&mut *level.samples.lock().unwrap_or_else(|e| e.into_inner()));
        LevelRun {
            concurrency,
            started,
            window_end,
            finished,
            samples,
        }
    }
}
