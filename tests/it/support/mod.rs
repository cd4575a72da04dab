//! Shared test machinery: a proxy on port 0, scripted upstreams, a client that timestamps
//! frames, metric matchers and the corpus loader.

#![allow(dead_code)]

pub mod client;
pub mod corpus;
pub mod levels;
pub mod metrics;
pub mod process;
pub mod promtool;
pub mod raw;
pub mod tls;
pub mod tokenizer;
pub mod upstream;
pub mod ws;

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;
use tokenmeter::app::{self, App};
use tokenmeter::capacity::Capacity;
use tokenmeter::config::Config;
use tokenmeter::metrics::Metrics;
use tokenmeter::server::Settings;
use tokenmeter_flags::{parse_upstream, ProxyArgs};
use tokenmeter_tools::sim::{Sim, SimConfig};
use tokio::sync::oneshot;

use self::client::Seen;
use self::upstream::{Reply, Step, Upstream};

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    proxy: ProxyArgs,
}

/// A proxy running inside the test process.
pub struct Proxy {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub metrics: Arc<Metrics>,
    pub capacity: Arc<Capacity>,
    shutdown: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// `http://127.0.0.1:PORT` of the proxy listener.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `/metrics` text, as Prometheus would scrape it.
    pub async fn scrape(&self) -> String {
        client::get_text(&format!("http://{}/metrics", self.metrics_addr)).await
    }

    /// Polls the scrape until `f` holds (the meter records when the body ends, which can be a
    /// moment after the client read the last byte); returns the last scrape either way.
    pub async fn eventually(&self, f: impl Fn(&str) -> bool) -> String {
        for _ in 0..100 {
            let s = self.scrape().await;
            if f(&s) {
                return s;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        self.scrape().await
    }

    /// The scrape once `requests` requests are recorded and none is in flight.
    pub async fn settled(&self, requests: f64) -> String {
        use metrics::metric;
        self.eventually(|s| {
            metric("tokenmeter_requests_total").sum(s) >= requests
                && metric("tokenmeter_requests_in_flight").sum(s) == 0.0
        })
        .await
    }

    /// Starts the drain (as SIGTERM does in the binary).
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Every default, in front of `upstream`, listening on loopback ports the system picks, but
/// not reading the upstream's `/metrics` (see [`ENGINE_METRICS_OFF`]).
pub fn config(upstream: &str) -> Config {
    Config {
        server: Settings::loopback(),
        engine_metrics: tokenmeter::engine::Setting::Off,
        ..Config::for_upstream(parse_upstream(upstream).expect("an upstream URL"))
    }
}

/// The scripted upstreams answer every request and count them, and many tests hold a proxy to
/// exactly the requests they sent: the proxies the tests start do not read the upstream's
/// `/metrics` (`--engine-metrics auto`, the default) unless a test asks for it by naming the
/// flag. `tests/it/engine_view.rs` tests the reading.
pub const ENGINE_METRICS_OFF: [&str; 2] = ["--engine-metrics", "off"];

/// `extra`, with [`ENGINE_METRICS_OFF`] first unless `extra` sets `--engine-metrics` itself.
pub fn with_engine_metrics_off<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut argv = Vec::with_capacity(extra.len() + 2);
    if !extra.contains(&"--engine-metrics") {
        argv.extend_from_slice(&ENGINE_METRICS_OFF);
    }
    argv.extend_from_slice(extra);
    argv
}

/// Starts a proxy in front of `upstream` on loopback port 0, with extra flags, parsed as the
/// binary parses them: what a flag does, end to end. Without flags it is [`config`]'s proxy.
pub async fn spawn_proxy(upstream: &str, extra: &[&str]) -> Proxy {
    if extra.is_empty() {
        return spawn(config(upstream)).await;
    }
    spawn(config_of(upstream, extra)).await
}

/// The configuration `tokenmeter` with `extra` flags would run with in front of `upstream`, on
/// loopback ports the system picks (the engine's metrics not read unless `extra` says so).
pub fn config_of(upstream: &str, extra: &[&str]) -> Config {
    let extra = with_engine_metrics_off(extra);
    let argv = std::iter::once("tokenmeter").chain(extra.iter().copied());
    let mut flags = Args::try_parse_from(argv).expect("flags parse").proxy;
    flags.upstream = Some(upstream.to_string());
    flags.listeners.listen = "127.0.0.1:0".to_string();
    flags.listeners.metrics_listen = "127.0.0.1:0".to_string();
    flags.validate().expect("valid config")
}

/// Starts a proxy with `cfg`, built directly (`Config { .., ..config(upstream) }`).
pub async fn spawn(cfg: Config) -> Proxy {
    let App {
        server,
        metrics,
        capacity,
    } = app::build(&cfg).await.expect("bind");
    let (tx, rx) = oneshot::channel();
    let (addr, metrics_addr) = (server.proxy_addr(), server.metrics_addr());
    let task = tokio::spawn(server.serve(async {
        let _ = rx.await;
    }));
    Proxy {
        addr,
        metrics_addr,
        metrics,
        capacity,
        shutdown: Some(tx),
        task,
    }
}

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

/// One test at a time among those that take it. The resource they share is the CPU's
/// promptness: a test takes the turn when it keeps the CPU busy (a flood, megabytes through the
/// proxy, every split of the corpus) or when an assertion of its could fail on a busy machine
/// (a time, a rate, or a fit from timed steps held to a tolerance; an ordering that needs a
/// sleep to be long enough). On a 2-core machine a busy test starves a timing test's timers,
/// and the timing test then measures the machine instead of the code. A test that asserts only
/// counts, bytes, labels or exit codes, and waits for conditions rather than for time, does not
/// take it: a slow machine makes it slower, never wrong.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Takes the serial turn in an async test.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// Takes the serial turn in a plain (non-async) test.
pub fn serial_blocking() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.blocking_lock()
}

/// True when the suite runs in CI, where missing prerequisites are failures, not skips.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
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

/// Watches, from a plain thread of its own, how long this process waits for a CPU: the thread
/// sleeps a millisecond at a time, and any longer gap is the machine's (the suite shares two
/// cores with builds), not a runtime's, since the thread runs no task.
pub struct StallWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<std::time::Duration>,
}

impl StallWatch {
    pub fn start() -> StallWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let tick = std::time::Duration::from_millis(1);
            let (mut worst, mut last) = (std::time::Duration::ZERO, std::time::Instant::now());
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(tick);
                let now = std::time::Instant::now();
                worst = worst.max((now - last).saturating_sub(tick));
                last = now;
            }
            worst
        });
        StallWatch { stop, thread }
    }

    /// The longest wait beyond its tick the thread saw.
    pub fn worst(self) -> std::time::Duration {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the watching thread")
    }
}
