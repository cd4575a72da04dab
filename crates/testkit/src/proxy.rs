//! A proxy inside the test process: built from the flags the binary parses, on ports the
//! system picks, with the scrape and the waits the tests read it by.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;
use tokenmeter::app::{self, App};
use tokenmeter::capacity::Capacity;
use tokenmeter::config::Config;
use tokenmeter::metrics::{names, Metrics};
use tokenmeter::server::Settings;
use tokenmeter_flags::{parse_upstream, ProxyArgs};
use tokio::sync::oneshot;

use crate::client;
use crate::metrics::metric;

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
        // No request counted yet is a count of 0; the in-flight gauge is there from the start,
        // so its absence fails the wait rather than passing it.
        self.eventually(|s| {
            metric(names::REQUESTS_TOTAL).sum_or_zero_if_absent(s) >= requests
                && metric(names::REQUESTS_IN_FLIGHT).sum(s) == 0.0
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
