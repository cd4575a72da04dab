//! `tokenmeter demo`: tokenmeter doing its job with one command and no GPU.
//!
//! One process runs the simulator ([`crate::sim`]) on a free loopback port, the proxy in front of
//! it (`--listen`, default 127.0.0.1:8080) with its metrics endpoint (`--metrics-listen`, default
//! 127.0.0.1:9090; the same flags and `TOKENMETER_*` variables as the proxy), and a load that
//! ramps concurrency 1, 2, 4 ... `--max-concurrency` and back down, through the proxy. Once a
//! second it prints a row: concurrency, per-request TPS (p50/p90), aggregate TPS, per-GPU TPS,
//! TTFT (p50/p99), and tokenmeter's own aggregate gauge beside them.
//!
//! The load is the bench's: its client measures every request ([`crate::bench::client`]), its
//! closed loop follows the ramp ([`crate::bench::load::Ramp`]), and its statistics give the
//! percentiles ([`crate::bench::stats`]), so the demo and `tokenmeter bench` define TTFT,
//! per-request tokens/s and a percentile the same way. The table's figures are measured by the
//! clients (exact values, not histogram buckets); the last column is what tokenmeter exports, and
//! the closing summary sets the two token totals side by side. Ctrl-C stops everything cleanly;
//! `--duration` stops on its own and exits 0.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Parser};
use tokio::sync::oneshot;

use crate::bench::client::{Client, Sample};
use crate::bench::load::{Driver, Ramp, RampCounts};
use crate::bench::prompt::{Endpoint, RequestBuilder};
use crate::bench::stats::Percentiles;
use crate::sim::text::{Lengths, Rng};
use crate::sim::{Model, Sim, SimConfig, SimError};
use tokenmeter::app::{self, App, StartError};
use tokenmeter::capacity::Report;
use tokenmeter::exposition::Scrape;
use tokenmeter::metrics::{names, Metrics};
use tokenmeter::record::Outcome;
use tokenmeter::units::parse_duration;
use tokenmeter_flags::{ConfigError, ListenArgs, PageArgs, ProxyArgs};

/// The demo's flags. Those it shares with the proxy are the proxy's definitions (the same
/// names and variables); the demo listens on loopback by default and says what its addresses
/// serve in its own words.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("listen", |a| a
    .default_value("127.0.0.1:8080")
    .help("Where the proxy listens (the demo's clients connect here too)")))]
#[command(mut_arg("metrics_listen", |a| a
    .default_value("127.0.0.1:9090")
    .help("Where the page (/), /metrics, /healthz and /readyz are served")))]
#[command(mut_arg("no_ui", |a| a
    .help("Do not serve the live page on the metrics listener (only /metrics, /healthz, /readyz)")))]
pub struct DemoArgs {
    #[command(flatten)]
    pub listeners: ListenArgs,

    #[command(flatten)]
    pub page: PageArgs,

    /// GPUs the simulated server stands for, for the per-GPU figures.
    #[arg(long, env = "TOKENMETER_GPUS", default_value_t = 1.0)]
    pub gpus: f64,

    /// Stop after this long and exit 0 (e.g. 15s); without it, run until Ctrl-C. When the ramp
    /// at --step per level would not fit, its levels are shortened so the whole ramp is shown.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// The top of the ramp: concurrency goes 1, 2, 4, ... up to this and back down to 1.
    #[arg(long, default_value_t = 128)]
    pub max_concurrency: usize,

    /// How long each concurrency level lasts.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub step: Duration,

    /// max_tokens of each request: N, or MIN-MAX drawn uniformly.
    #[arg(long, default_value = "64-256")]
    pub output_tokens: Lengths,

    /// Prompt length of each request in characters (about 4 per token): N or MIN-MAX.
    #[arg(long, default_value = "200-1000")]
    pub prompt_chars: Lengths,

    /// Seed of the simulator and of the load.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Where the simulator listens (default: a free loopback port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub sim_listen: String,
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("--max-concurrency must be at least 1")]
    NoConcurrency,
    #[error("--step must be at least 1s (the table has one row a second)")]
    StepTooShort,
    #[error("--sim-listen {0:?} is not a valid address")]
    BadSimAddress(String),
    #[error(transparent)]
    Proxy(#[from] ConfigError),
    #[error("proxy flags: {0}")]
    ProxyFlags(String),
    #[error("simulator: {0}")]
    Sim(#[from] SimError),
    #[error(transparent)]
    Server(#[from] StartError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

impl DemoError {
    /// True for errors the user fixes by changing the flags.
    pub fn is_usage(&self) -> bool {
        match self {
            DemoError::NoConcurrency
            | DemoError::StepTooShort
            | DemoError::BadSimAddress(_)
            | DemoError::Proxy(_)
            | DemoError::ProxyFlags(_) => true,
            DemoError::Sim(e) => e.is_usage(),
            DemoError::Server(_) | DemoError::Runtime(_) => false,
        }
    }
}

/// The proxy's own flags as the environment sets them, so every `TOKENMETER_*` variable and
/// default applies as it does to the proxy (none is given on a command line: the demo's
/// command line is its own).
#[derive(Parser)]
struct ProxyFlags {
    #[command(flatten)]
    proxy: ProxyArgs,
}

/// The proxy's settings: the environment's, with the upstream, the addresses and the GPUs set
/// by the demo.
fn proxy_args(args: &DemoArgs, upstream: SocketAddr) -> Result<ProxyArgs, DemoError> {
    let mut proxy = ProxyFlags::try_parse_from(["tokenmeter"])
        .map(|f| f.proxy)
        .map_err(|e| {
            DemoError::ProxyFlags(e.to_string().lines().next().unwrap_or("").to_string())
        })?;
    proxy.upstream = Some(format!("http://{upstream}"));
    proxy.listeners = args.listeners.clone();
    proxy.page = args.page.clone();
    proxy.gpus = args.gpus.to_string();
    Ok(proxy)
}

/// The concurrency levels of one ramp: 1, 2, 4, ... max, ... 4, 2, 1.
pub fn ramp(max: usize) -> Vec<usize> {
    let mut up: Vec<usize> = std::iter::successors(Some(1usize), |n| n.checked_mul(2))
        .take_while(|&n| n < max)
        .collect();
    let down: Vec<usize> = up.iter().rev().copied().collect();
    up.push(max.max(1));
    up.extend(down);
    up
}

/// A URL for an address: an unspecified IP (0.0.0.0, ::) is shown as loopback.
fn url(addr: SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        addr.ip()
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// The percentiles and rates of a row are taken over this window of the most recent requests.
const WINDOW: Duration = Duration::from_secs(5);

/// After --duration, requests in flight get this long to finish before they are cut off.
const FINISH_GRACE: Duration = Duration::from_secs(10);

/// Finished requests older than this are forgotten, which bounds memory whatever the run length.
const KEEP: Duration = Duration::from_secs(30);

/// Longest time one demo request may take: the bench's default. The longest default request
/// (256 tokens at the simulator's ~24 tok/s at concurrency 128) takes about 11 s.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// New clients of a level join within this long of its start, each at its own moment.
const JOIN_SPREAD: Duration = Duration::from_secs(1);

/// Characters per prompt token, as `--prompt-chars` states and the simulator estimates.
const CHARS_PER_TOKEN: u32 = 4;

/// The model name the demo's clients send.
const DEMO_MODEL: &str = "sim-llama-8b";

/// What one finished request adds to the table: when it ended, its TTFT and its decode speed.
type Done = (Instant, Option<f64>, Option<f64>);

/// The requests that finished within the last [`KEEP`], oldest first.
#[derive(Default)]
struct Recent(Mutex<VecDeque<Done>>);

impl Recent {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Done>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, s: &Sample) {
        if !s.is_ok() {
            return;
        }
        let now = Instant::now();
        let mut q = self.lock();
        forget_before(&mut q, now);
        q.push_back((now, s.ttft_secs(), s.request_tps()));
    }

    /// The TTFT and per-request tokens/s of the requests that ended within `window` of `now`.
    fn window(&self, now: Instant, window: Duration) -> Window {
        let q = self.lock();
        let recent = q
            .iter()
            .filter(|(t, _, _)| now.saturating_duration_since(*t) <= window);
        let (mut ttft, mut tps) = (Vec::new(), Vec::new());
        for &(_, f, r) in recent {
            ttft.extend(f);
            tps.extend(r);
        }
        Window {
            ttft: Percentiles::of(&mut ttft),
            tps: Percentiles::of(&mut tps),
        }
    }
}

fn forget_before(q: &mut VecDeque<Done>, now: Instant) {
    while q
        .front()
        .is_some_and(|(t, _, _)| now.saturating_duration_since(*t) > KEEP)
    {
        q.pop_front();
    }
}

/// The percentiles of one row.
struct Window {
    ttft: Option<Percentiles>,
    tps: Option<Percentiles>,
}

const HEADER: &str = "  time   conc target  tps p50  tps p90  agg tok/s  per GPU  ttft p50  ttft p99  tokenmeter tok/s";

fn fmt_opt(v: Option<f64>, scale: f64, width: usize, prec: usize) -> String {
    match v {
        Some(x) => format!("{:>width$.prec$}", x * scale),
        None => format!("{:>width$}", "-"),
    }
}

fn row(
    elapsed: Duration,
    in_flight: usize,
    target: usize,
    w: &Window,
    agg: f64,
    gpus: f64,
    proxy: f64,
) -> String {
    format!(
        "{:>5}s {:>6} {:>6} {} {} {:>10.0} {:>8.0} {}ms {}ms {:>17.0}",
        elapsed.as_secs(),
        in_flight,
        target,
        fmt_opt(w.tps.map(|s| s.p50), 1.0, 8, 1),
        fmt_opt(w.tps.map(|s| s.p90), 1.0, 8, 1),
        agg,
        agg / gpus,
        fmt_opt(w.ttft.map(|s| s.p50), 1000.0, 7, 0),
        fmt_opt(w.ttft.map(|s| s.p99), 1000.0, 7, 0),
        proxy,
    )
}

/// Sums a counter family over the label sets that pass `keep`.
/// `tokenmeter demo`.
pub fn run(args: &DemoArgs) -> Result<(), DemoError> {
    if args.max_concurrency == 0 {
        return Err(DemoError::NoConcurrency);
    }
    if args.step < Duration::from_secs(1) {
        return Err(DemoError::StepTooShort);
    }
    let sim_listen = args
        .sim_listen
        .parse::<SocketAddr>()
        .map_err(|_| DemoError::BadSimAddress(args.sim_listen.clone()))?;
    // Validate the proxy flags before anything binds (the upstream port is filled in later).
    proxy_args(args, sim_listen)?.validate()?;
    let runtime = tokio::runtime::Runtime::new().map_err(DemoError::Runtime)?;
    runtime.block_on(demo(args, sim_listen))
}

async fn demo(args: &DemoArgs, sim_listen: SocketAddr) -> Result<(), DemoError> {
    let sim_cfg = SimConfig {
        listen: sim_listen,
        seed: args.seed,
        // As vLLM with `--enable-per-request-metrics`: the page shows where TTFT went.
        per_request_metrics: true,
        ..SimConfig::default()
    };
    let sim = Sim::bind(&sim_cfg).await?;
    let sim_addr = sim.local_addr();
    let cfg = proxy_args(args, sim_addr)?.validate()?;
    let App {
        server,
        metrics,
        capacity,
    } = app::build(&cfg).await?;
    let (proxy_addr, metrics_addr) = (server.proxy_addr(), server.metrics_addr());

    let (sim_stop, sim_stopped) = oneshot::channel::<()>();
    let sim_task = tokio::spawn(sim.serve(async {
        let _ = sim_stopped.await;
    }));
    let (proxy_stop, proxy_stopped) = oneshot::channel::<()>();
    let proxy_task = tokio::spawn(server.serve(async {
        let _ = proxy_stopped.await;
    }));

    let levels = ramp(args.max_concurrency);
    let mut step = args.step;
    if let Some(d) = args.duration {
        let whole = step * levels.len() as u32;
        if d < whole {
            step = (d / levels.len() as u32).max(Duration::from_millis(100));
        }
    }
    let m = sim_cfg.model;
    let top = args.max_concurrency;
    // The page first: it is what a person opens.
    if cfg.ui.is_some() {
        println!(
            "Open {}/ in a browser: tokenmeter's live page.",
            url(metrics_addr)
        );
    }
    println!(
        "tokenmeter demo: a simulated GPU server (~{:.0} tok/s for one user, ~{:.0} tok/s aggregate at {top}) behind tokenmeter,",
        m.request_tps(1),
        m.aggregate_tps(top)
    );
    println!(
        "with a load ramping concurrency 1 -> {top} -> 1 ({:.1}s per level).",
        step.as_secs_f64()
    );
    println!("  proxy:     {}/v1/chat/completions", url(proxy_addr));
    println!("  metrics:   {}/metrics", url(metrics_addr));
    println!(
        "  simulator: {}  (its own record: /sim/stats)",
        url(sim_addr)
    );
    match args.duration {
        Some(d) => println!("Running for {:.0}s (Ctrl-C stops early).", d.as_secs_f64()),
        None => println!("Press Ctrl-C to stop."),
    }
    println!(
        "Measured by the demo's clients: TPS and TTFT percentiles over the last {}s, aggregate over the last second.\nThe last column is tokenmeter's own tokenmeter_output_tokens_per_second, averaged over --rate-window (default 10s):\nit lags the clients' agg tok/s by that window, so the two differ while the load changes and agree once it holds.",
        WINDOW.as_secs()
    );

    let requests = RequestBuilder {
        endpoint: Endpoint::Chat,
        model: DEMO_MODEL.to_string(),
        prompt_tokens: 0,
        shared_prefix_tokens: 0,
        output_tokens: 0,
        seed: args.seed,
    };
    let driver = Driver {
        client: Arc::new(Client::new(
            format!("{}/v1", url(proxy_addr)),
            None,
            REQUEST_TIMEOUT,
        )),
        requests: Arc::new(requests),
        next_id: Arc::new(AtomicU64::new(0)),
        interrupted: Default::default(),
    };
    let (output_tokens, prompt_chars, seed) = (args.output_tokens, args.prompt_chars, args.seed);
    let recent = Arc::new(Recent::default());
    let on_done = Arc::clone(&recent);
    // Clients join as users do, each at its own moment within a second of the level's start,
    // not all in one instant: clients that start together stay in step, a load test's traffic
    // rather than a service's, and the capacity model would answer for that.
    let load = driver.ramp_joining(
        top,
        Arc::new(move |n| sizes(seed, n, output_tokens, prompt_chars)),
        Arc::new(move |s| on_done.push(s)),
        JOIN_SPREAD,
    );
    let interrupted = drive(&load, &recent, &levels, step, args, &metrics).await;

    if !interrupted {
        println!("Waiting for the requests in flight to finish...");
        tokio::select! {
            _ = tokio::time::timeout(FINISH_GRACE, load.finish()) => {}
            _ = tokenmeter::signal::shutdown() => {}
        }
    }
    let totals = load.abort().await;
    // Let the proxy record the requests that just ended before reading its counters.
    tokio::time::sleep(Duration::from_millis(100)).await;
    summary(&totals, &metrics);
    println!(
        "{}",
        capacity_line(&*capacity.next_report().await, &sim_cfg.model)
    );
    let _ = proxy_stop.send(());
    let _ = proxy_task.await;
    let _ = sim_stop.send(());
    let _ = sim_task.await;
    Ok(())
}

/// Runs the ramp and prints a row a second (the target shown is the one of the second just
/// past); returns true when stopped by a signal.
async fn drive(
    load: &Ramp,
    recent: &Recent,
    levels: &[usize],
    step: Duration,
    args: &DemoArgs,
    metrics: &Arc<Metrics>,
) -> bool {
    let start = Instant::now();
    let level_at = |t: Duration| {
        let i = (t.as_secs_f64() / step.as_secs_f64()) as usize;
        levels[i % levels.len()]
    };
    let mut target = levels[0];
    load.set_target(target);
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let stop = tokenmeter::signal::shutdown();
    tokio::pin!(stop);
    let end = tokio::time::sleep(args.duration.unwrap_or(Duration::MAX / 4));
    tokio::pin!(end);
    let mut last_tokens = 0;
    let mut last_at = start;
    let mut rows = 0usize;
    loop {
        tokio::select! {
            _ = &mut stop => return true,
            _ = &mut end => return false,
            _ = ticker.tick() => {}
        }
        let now = Instant::now();
        let elapsed = now - start;
        let counts = load.counts();
        let tokens = counts.tokens.load(Ordering::Relaxed);
        let agg = (tokens - last_tokens) as f64 / now.duration_since(last_at).as_secs_f64();
        (last_tokens, last_at) = (tokens, now);
        if rows % 20 == 0 {
            println!("{HEADER}");
        }
        rows += 1;
        println!(
            "{}",
            row(
                elapsed,
                counts.in_flight.load(Ordering::Relaxed),
                target,
                &recent.window(now, WINDOW),
                agg,
                args.gpus,
                metrics.output_rate(now)
            )
        );
        target = level_at(elapsed);
        load.set_target(target);
    }
}

/// The `(prompt tokens, output tokens)` of request `n`: drawn from the flags' ranges by a
/// generator seeded with `--seed` and `n`, so a run is repeatable.
fn sizes(seed: u64, n: u64, output_tokens: Lengths, prompt_chars: Lengths) -> (usize, u64) {
    let mut rng = Rng::new(seed ^ n.wrapping_mul(0xA076_1D64_78BD_642F));
    let max_tokens = output_tokens.sample(&mut rng);
    let chars = prompt_chars.sample(&mut rng);
    (
        chars.div_ceil(CHARS_PER_TOKEN) as usize,
        u64::from(max_tokens),
    )
}

fn summary(client: &RampCounts, metrics: &Metrics) {
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let (started, completed, errors) =
        (n(&client.started), n(&client.completed), n(&client.errors));
    let cut = started.saturating_sub(completed + errors);
    println!(
        "The clients sent {started} requests ({completed} complete, {errors} failed, {cut} cut off) and received {} output tokens.",
        n(&client.tokens)
    );
    // Read back from the exposition, as Prometheus would: the demo shows what a scrape says.
    let scrape = Scrape::parse(&String::from_utf8_lossy(&metrics.render()));
    let count = |name: &str, labels: &[(&str, &str)]| scrape.sum(name, labels) as u64;
    let tokens = count(names::OUTPUT_TOKENS_TOTAL, &[]);
    let all = count(names::REQUESTS_TOTAL, &[]);
    let complete = count(
        names::REQUESTS_TOTAL,
        &[("outcome", Outcome::Complete.as_str())],
    );
    println!(
        "tokenmeter counted {all} requests ({complete} complete) and {tokens} output tokens (tokenmeter_output_tokens_total)."
    );
}

/// The live capacity fit beside the simulator's own step costs: what tokenmeter learned from the
/// traffic, next to the truth.
fn capacity_line(r: &Report, truth: &Model) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let sim = format!(
        "the simulator's own: {:.2} ms + {:.3} ms x b",
        ms(truth.step_base),
        ms(truth.step_per_seq)
    );
    match &r.fit {
        Some(f) => format!(
            "tokenmeter's capacity fit: t(b) = {:.2} ms + {:.3} ms x b (r² {:.2}, {} token samples, concurrency {}-{}); {sim}.\n\
             (Its prompts cost prefill time in the steps that admit them, which the fit sees as slower steps: docs/capacity.md.)",
            f.base * 1e3,
            f.per_seq * 1e3,
            f.r2,
            f.samples,
            f.min_concurrency,
            f.max_concurrency,
        ),
        None => format!(
            "tokenmeter's capacity fit: none yet ({} token samples at usable concurrencies); {sim}.",
            r.samples
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_flags_keep_the_demos_loopback_defaults() {
        #[derive(Parser)]
        struct Demo {
            #[command(flatten)]
            demo: DemoArgs,
        }
        let d = Demo::try_parse_from(["demo"]).expect("parse").demo;
        let addrs = (d.listeners.listen, d.listeners.metrics_listen);
        assert_eq!(addrs, ("127.0.0.1:8080".into(), "127.0.0.1:9090".into()));
        let p = ProxyFlags::try_parse_from(["tokenmeter"])
            .expect("parse")
            .proxy;
        let addrs = (p.listeners.listen, p.listeners.metrics_listen);
        assert_eq!(addrs, ("0.0.0.0:8080".into(), "0.0.0.0:9090".into()));
        let d = Demo::try_parse_from(["demo", "--no-ui", "--listen", "127.0.0.1:1"]);
        let d = d.expect("parse").demo;
        assert!(d.page.no_ui);
        let p = proxy_args(&d, SocketAddr::from(([127, 0, 0, 1], 2))).expect("valid");
        assert_eq!(p.listeners.listen, "127.0.0.1:1");
        assert!(p.page.no_ui);
    }

    #[test]
    fn ramps_go_up_and_down() {
        assert_eq!(ramp(1), [1]);
        assert_eq!(ramp(4), [1, 2, 4, 2, 1]);
        assert_eq!(ramp(6), [1, 2, 4, 6, 4, 2, 1]);
        assert_eq!(ramp(128).len(), 15);
    }

    #[test]
    fn sizes_follow_the_flags_and_the_seed() {
        let out = Lengths { min: 64, max: 256 };
        let chars = Lengths {
            min: 200,
            max: 1000,
        };
        for n in 0..100 {
            let (p, o) = sizes(7, n, out, chars);
            assert!((50..=250).contains(&p), "{p}");
            assert!((64..=256).contains(&o), "{o}");
            assert_eq!((p, o), sizes(7, n, out, chars));
        }
        let fixed = Lengths { min: 9, max: 9 };
        assert_eq!(sizes(0, 1, fixed, fixed), (3, 9));
    }

    #[test]
    fn old_requests_are_forgotten() {
        let mut q = VecDeque::new();
        let t0 = Instant::now();
        q.push_back((t0, Some(1.0), None));
        q.push_back((t0 + Duration::from_secs(10), Some(2.0), None));
        forget_before(&mut q, t0 + KEEP + Duration::from_secs(5));
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].1, Some(2.0));
    }

    #[test]
    fn unspecified_addresses_are_shown_as_loopback() {
        assert_eq!(
            url("0.0.0.0:9090".parse().expect("addr")),
            "http://127.0.0.1:9090"
        );
        assert_eq!(
            url("10.0.0.1:80".parse().expect("addr")),
            "http://10.0.0.1:80"
        );
    }
}
