//! `tokenmeter bench`: a load generator for any OpenAI-compatible streaming endpoint, which
//! measures the per-request vs aggregate tokens/s trade-off at stated concurrency.
//!
//! For each concurrency level it keeps exactly N requests in flight ([`load`]); with
//! `--request-rate` it sends on a seeded Poisson schedule instead ([`arrivals`]), measuring
//! every latency from the time a request was due; with `--trace` it replays a workload trace
//! the same way, each request at its own time with its own lengths ([`replay`]). It measures every
//! request on the client side ([`client`]), and reports per-request speed, aggregate throughput,
//! TTFT, inter-token latency and TPOT as a table, JSON, CSV and two SVG charts ([`report`],
//! [`chart`]). With `--proxy-metrics` it puts tokenmeter's own figures next to the client's
//! ([`proxy_view`]). The definitions are in `docs/bench.md`.
//!
//! As for the proxy, flags are parsed in two layers: [`BenchArgs`] as clap reads them, then a
//! validated [`BenchConfig`], so validation is testable without a process.

pub mod arrivals;
pub mod chart;
pub mod client;
pub mod live;
pub mod load;
pub mod progress;
pub mod prompt;
pub mod proxy_view;
pub mod replay;
pub mod report;
pub mod stats;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use http::Uri;

use self::client::{Client, RequestError};
use self::live::Live;
use self::load::{Driver, LevelRun, Stop};
use self::progress::Progress;
use self::prompt::{Endpoint, RequestBuilder};
use self::proxy_view::{ProxyTotals, ProxyViewError, TotalsScraper};
use self::replay::{Replay, ReplaySettings, DEFAULT_BLOCK_TOKENS};
use self::report::{LevelReport, Report};
use crate::trace::TraceError;
use tokenmeter::units::parse_duration;

/// The bench's flags.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Base URL of the OpenAI-compatible server (http only), e.g. http://127.0.0.1:8000; the
    /// /v1 paths are added unless the URL already ends in /v1.
    #[arg(long, value_name = "URL")]
    pub target: String,

    /// Concurrency levels, comma-separated; each is held for --duration (or --requests)
    /// [default: 1,4,16,64,256].
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Option<Vec<usize>>,

    /// Open loop instead of --concurrency: request rates (requests/s), comma-separated; each
    /// level sends Poisson arrivals seeded by --seed for --duration (or --requests), and every
    /// latency counts from the time a request was due.
    #[arg(long, value_delimiter = ',', value_name = "R1,R2,...")]
    pub request_rate: Option<Vec<f64>>,

    /// How long each level keeps its requests in flight (e.g. 30s, 2m) [default: 30s]; with
    /// --trace, the longest the replay sends for [default: to the trace's end].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Requests per level instead of a duration (at least the highest concurrency).
    #[arg(long, value_name = "N")]
    pub requests: Option<u64>,

    /// Prompt length in tokens: that many three-letter words, one token each to the simulator
    /// and about one each to a real tokenizer.
    #[arg(long, default_value_t = 256)]
    pub prompt_tokens: usize,

    /// Every prompt of the run starts with the same N words (drawn from --seed), then words of
    /// its own up to --prompt-tokens: requests behind one system prompt, which a server's
    /// prefix cache may serve.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub shared_prefix_tokens: usize,

    /// Output tokens per request (max_tokens, with ignore_eos so every request yields them all).
    #[arg(long, default_value_t = 256)]
    pub output_tokens: u64,

    /// Model name to send; by default the first one the server lists at /v1/models.
    #[arg(long)]
    pub model: Option<String>,

    /// Which endpoint to drive.
    #[arg(long, value_enum, default_value_t = Endpoint::Chat)]
    pub endpoint: Endpoint,

    /// Directory for bench.json, bench.csv, bench-throughput.svg and bench-ttft.svg.
    #[arg(long, default_value = ".")]
    pub out: PathBuf,

    /// tokenmeter's /metrics URL (e.g. http://127.0.0.1:9090/metrics): print the proxy's figures
    /// next to the client's for every level.
    #[arg(long, value_name = "URL")]
    pub proxy_metrics: Option<String>,

    /// Before each level, run one round of N requests whose results are discarded (opens the
    /// connections and warms the server's caches).
    #[arg(long)]
    pub warmup: bool,

    /// Longest time one request may take, from send to the end of its stream.
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Seed of the synthetic prompts (a run is repeatable with the same seed).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Replay a workload trace (tokenmeter's --workload-log lines, or a Mooncake trace) as one
    /// open-loop level: each request at its own time, with its prompt and output lengths and
    /// its shared prefixes (hash_ids); latency counts from each request's due time.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = [
            "concurrency",
            "request_rate",
            "requests",
            "prompt_tokens",
            "output_tokens",
            "shared_prefix_tokens",
            "warmup",
        ]
    )]
    pub trace: Option<PathBuf>,

    /// With --trace: multiplies every gap between requests (0.5 replays twice as fast; above 0)
    /// [default: 1].
    #[arg(long, value_name = "X")]
    pub time_scale: Option<f64>,

    /// With --trace: replay only the first N requests.
    #[arg(long, value_name = "N")]
    pub max_requests: Option<u64>,

    /// With --trace: the prompt tokens one entry of a request's hash_ids stands for [default:
    /// 512].
    #[arg(long, value_name = "B")]
    pub trace_block_tokens: Option<usize>,

    /// Sent as "Authorization: Bearer KEY"; never printed.
    #[arg(long, env = "TOKENMETER_BENCH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// A bench run's validated settings.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The `/v1` base the endpoint paths are appended to.
    pub base: String,
    pub target: String,
    /// Ascending, without repeats; empty with `--request-rate`.
    pub concurrency: Vec<usize>,
    /// `--request-rate`, ascending, without repeats; empty in the closed loop.
    pub request_rate: Vec<f64>,
    /// `--trace`: the replay instead of levels (then `concurrency` and `request_rate` are
    /// empty, and `stop` is not used).
    pub trace: Option<ReplaySettings>,
    pub stop: Stop,
    pub prompt_tokens: usize,
    /// At most `prompt_tokens`.
    pub shared_prefix_tokens: usize,
    pub output_tokens: u64,
    pub model: Option<String>,
    pub endpoint: Endpoint,
    pub out: PathBuf,
    pub proxy_metrics: Option<String>,
    pub warmup: bool,
    pub timeout: Duration,
    pub seed: u64,
    pub api_key: Option<String>,
}

/// Why a bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("--target {0:?}: {1}")]
    Target(String, String),
    #[error("--concurrency: {0}")]
    Concurrency(String),
    #[error("--request-rate: {0}")]
    RequestRate(String),
    #[error("--concurrency and --request-rate are exclusive: give a closed loop (a number of users) or an open one (arrivals per second), not both")]
    ClosedAndOpen,
    #[error("--requests {requests} is below the highest --concurrency {max}: that level could never hold {max} requests in flight")]
    TooFewRequests { requests: u64, max: usize },
    #[error("--requests must be at least 1")]
    NoRequests,
    #[error("--output-tokens must be at least 1")]
    NoOutput,
    #[error("--shared-prefix-tokens {shared} is more than --prompt-tokens {prompt}: the prefix is part of the prompt")]
    PrefixTooLong { shared: usize, prompt: usize },
    #[error("--duration must be more than 0")]
    NoDuration,
    #[error("--time-scale {0}: give a factor above 0 (0.5 replays twice as fast)")]
    TimeScale(f64),
    #[error("--max-requests must be at least 1")]
    NoMaxRequests,
    #[error("--trace-block-tokens must be at least 1")]
    NoBlockTokens,
    #[error("{0} is for --trace: give the trace to replay")]
    NeedsTrace(&'static str),
    #[error("--trace {0}")]
    Trace(#[from] TraceError),
    #[error("cannot start reading the trace: {0}")]
    TraceThread(std::io::Error),
    #[error("{}", model_error(url, source))]
    Model { url: String, source: RequestError },
    #[error("a first request to {url} failed: {source}")]
    Probe { url: String, source: RequestError },
    #[error(transparent)]
    ProxyView(#[from] ProxyViewError),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Why no model was found. A server that failed (5xx) would fail the bench's requests too, so
/// `--model` is offered only where it helps: no model list, or none that could be read.
fn model_error(url: &str, source: &RequestError) -> String {
    match source {
        RequestError::Answered { status, .. } if *status >= 500 => {
            format!("cannot find a model: {url}/models answered {source}")
        }
        RequestError::Answered { .. } => {
            format!("cannot find a model: {url}/models answered {source}; pass --model")
        }
        other => format!("cannot find a model at {url}/models ({other}); pass --model"),
    }
}

impl BenchError {
    /// True when the user must fix the command line (exit code 64), not the environment.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            BenchError::Target(..)
                | BenchError::Concurrency(_)
                | BenchError::RequestRate(_)
                | BenchError::ClosedAndOpen
                | BenchError::TooFewRequests { .. }
                | BenchError::NoRequests
                | BenchError::NoOutput
                | BenchError::PrefixTooLong { .. }
                | BenchError::NoDuration
                | BenchError::TimeScale(_)
                | BenchError::NoMaxRequests
                | BenchError::NoBlockTokens
                | BenchError::NeedsTrace(_)
                | BenchError::ProxyView(ProxyViewError::BadUrl(_))
        )
    }

    /// True when the trace cannot be read (exit code 2): a file to fix, named with its line.
    pub fn is_trace(&self) -> bool {
        matches!(self, BenchError::Trace(_))
    }
}

impl BenchArgs {
    pub fn validate(&self) -> Result<BenchConfig, BenchError> {
        let base = base_url(&self.target)
            .map_err(|reason| BenchError::Target(self.target.clone(), reason))?;
        if self.duration.is_some_and(|d| d.is_zero()) {
            return Err(BenchError::NoDuration);
        }
        let trace = match &self.trace {
            Some(path) => Some(self.replay(path)?),
            None => {
                let given = [
                    ("--time-scale", self.time_scale.is_some()),
                    ("--max-requests", self.max_requests.is_some()),
                    ("--trace-block-tokens", self.trace_block_tokens.is_some()),
                ];
                if let Some((flag, _)) = given.into_iter().find(|(_, given)| *given) {
                    return Err(BenchError::NeedsTrace(flag));
                }
                None
            }
        };
        let (mut concurrency, request_rate) = match (&self.concurrency, &self.request_rate, &trace)
        {
            (_, _, Some(_)) => (Vec::new(), Vec::new()),
            (Some(_), Some(_), None) => return Err(BenchError::ClosedAndOpen),
            (_, Some(rates), None) => (Vec::new(), rates_of(rates)?),
            (Some(c), None, None) => (c.clone(), Vec::new()),
            (None, None, None) => (DEFAULT_CONCURRENCY.to_vec(), Vec::new()),
        };
        if trace.is_none() && concurrency.is_empty() && request_rate.is_empty() {
            return Err(BenchError::Concurrency("give at least one level".into()));
        }
        if concurrency.contains(&0) {
            return Err(BenchError::Concurrency("levels must be 1 or more".into()));
        }
        concurrency.sort_unstable();
        concurrency.dedup();
        // Open-loop levels hold no fixed number in flight: any budget of requests will do.
        let max = concurrency.last().copied().unwrap_or(1);
        let stop = match self.requests {
            Some(0) => return Err(BenchError::NoRequests),
            Some(requests) if requests < max as u64 => {
                return Err(BenchError::TooFewRequests { requests, max })
            }
            Some(n) => Stop::Requests(n),
            None => Stop::After(self.duration.unwrap_or(DEFAULT_DURATION)),
        };
        if self.output_tokens == 0 {
            return Err(BenchError::NoOutput);
        }
        if self.shared_prefix_tokens > self.prompt_tokens {
            return Err(BenchError::PrefixTooLong {
                shared: self.shared_prefix_tokens,
                prompt: self.prompt_tokens,
            });
        }
        Ok(BenchConfig {
            base,
            target: self.target.clone(),
            concurrency,
            request_rate,
            trace,
            stop,
            prompt_tokens: self.prompt_tokens,
            shared_prefix_tokens: self.shared_prefix_tokens,
            output_tokens: self.output_tokens,
            model: self.model.clone(),
            endpoint: self.endpoint,
            out: self.out.clone(),
            proxy_metrics: self.proxy_metrics.clone(),
            warmup: self.warmup,
            timeout: self.timeout,
            seed: self.seed,
            api_key: self.api_key.clone(),
        })
    }

    /// The `--trace` flags, validated.
    fn replay(&self, path: &Path) -> Result<ReplaySettings, BenchError> {
        let time_scale = self.time_scale.unwrap_or(1.0);
        if !(time_scale.is_finite() && time_scale > 0.0) {
            return Err(BenchError::TimeScale(time_scale));
        }
        if self.max_requests == Some(0) {
            return Err(BenchError::NoMaxRequests);
        }
        let block_tokens = self.trace_block_tokens.unwrap_or(DEFAULT_BLOCK_TOKENS);
        if block_tokens == 0 {
            return Err(BenchError::NoBlockTokens);
        }
        Ok(ReplaySettings {
            path: path.to_path_buf(),
            time_scale,
            max_requests: self.max_requests,
            block_tokens,
            duration: self.duration,
        })
    }
}

/// The closed-loop levels when no flag names any.
const DEFAULT_CONCURRENCY: [usize; 5] = [1, 4, 16, 64, 256];

/// How long a level runs when no flag says.
const DEFAULT_DURATION: Duration = Duration::from_secs(30);

/// `--request-rate`: finite rates above 0, ascending, without repeats.
fn rates_of(rates: &[f64]) -> Result<Vec<f64>, BenchError> {
    if rates.is_empty() {
        return Err(BenchError::RequestRate("give at least one rate".into()));
    }
    if let Some(bad) = rates.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
        return Err(BenchError::RequestRate(format!(
            "{bad} is not a rate: give requests/s above 0 (and finite)"
        )));
    }
    let mut r = rates.to_vec();
    r.sort_by(f64::total_cmp);
    r.dedup();
    Ok(r)
}

/// One level of a run: a closed loop of N, or an open loop at a rate.
#[derive(Debug, Clone, Copy)]
enum LevelKind {
    Closed(usize),
    Open(f64),
}

/// The `/v1` base of a target URL: `http://h:8000` and `http://h:8000/v1/` both give
/// `http://h:8000/v1`; another path is kept as a prefix (`http://h/llm` gives `http://h/llm/v1`).
pub fn base_url(target: &str) -> Result<String, String> {
    let uri: Uri = target.parse().map_err(|e| format!("not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => return Err(format!("scheme {other} is not supported (use http)")),
        None => return Err("give a scheme and host, e.g. http://127.0.0.1:8000".into()),
    }
    let authority = uri.authority().ok_or("no host")?;
    if uri.query().is_some() {
        return Err("a query string is not supported".into());
    }
    let path = uri.path().trim_end_matches('/');
    let path = path.strip_suffix("/v1").unwrap_or(path);
    Ok(format!("http://{authority}{path}/v1"))
}

/// Exit code for flags the user must fix (BSD's EX_USAGE), as the proxy uses.
const EXIT_USAGE: u8 = 64;

/// Exit code of a run stopped with Ctrl-C (128 + SIGINT, as a shell reports it); its files are
/// still written.
const EXIT_INTERRUPTED: u8 = 130;

/// Exit code of a trace that cannot be read (a missing file, a bad line): as the parser's for
/// flags it refuses, since it is the command's input that must be fixed.
const EXIT_BAD_TRACE: u8 = 2;

/// `tokenmeter bench` as a command: validates the flags, runs on its own runtime, and says where
/// the files went. Exits 0, 64 for bad flags, 2 for a trace that cannot be read (the message
/// names the line), 1 when the bench could not run, 130 on Ctrl-C.
pub fn main(args: &BenchArgs) -> ExitCode {
    let fail = |e: &dyn std::fmt::Display, code: u8| {
        eprintln!("tokenmeter bench: error: {e}");
        ExitCode::from(code)
    };
    let cfg = match args.validate() {
        Ok(c) => c,
        Err(e) => return fail(&e, EXIT_USAGE),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => return fail(&format!("cannot start the runtime: {e}"), 1),
    };
    let (result, interrupted) = runtime.block_on(async {
        let interrupted = interrupt_on_ctrl_c();
        let r = run(&cfg, Progress::new(), interrupted.clone()).await;
        (r, interrupted.load(Ordering::Relaxed))
    });
    match result {
        Ok(_) => {
            for f in [JSON_FILE, CSV_FILE, THROUGHPUT_SVG, TTFT_SVG] {
                println!("wrote {}", cfg.out.join(f).display());
            }
            ExitCode::from(if interrupted { EXIT_INTERRUPTED } else { 0 })
        }
        Err(e) if e.is_usage() => fail(&e, EXIT_USAGE),
        Err(e) if e.is_trace() => fail(&e, EXIT_BAD_TRACE),
        Err(e) => fail(&e, 1),
    }
}

/// The files a run writes, under `--out`.
pub const JSON_FILE: &str = "bench.json";
pub const CSV_FILE: &str = "bench.csv";
pub const THROUGHPUT_SVG: &str = "bench-throughput.svg";
pub const TTFT_SVG: &str = "bench-ttft.svg";

/// Runs the whole bench: every level in turn (or the trace's replay), printing a table row as
/// each ends, then writes the files. Returns the report (also when some requests failed: their
/// count is in it).
///
/// Setting `interrupted` (the binary does on Ctrl-C) stops sending: the requests in flight
/// finish, the level under way ends its window there, and the files are written with the levels
/// run so far. A trace that cannot be read fails before any request; a bad line met during the
/// replay stops it there, and no file is written.
pub async fn run(
    cfg: &BenchConfig,
    progress: Progress,
    interrupted: Arc<AtomicBool>,
) -> Result<Report, BenchError> {
    // A trace that cannot be read fails before any request is sent.
    let trace = cfg.trace.as_ref().map(replay::open).transpose()?;
    std::fs::create_dir_all(&cfg.out).map_err(|source| BenchError::Write {
        path: cfg.out.clone(),
        source,
    })?;
    let client = Arc::new(Client::new(
        cfg.base.clone(),
        cfg.api_key.as_deref(),
        cfg.timeout,
    ));
    let model = match &cfg.model {
        Some(m) => m.clone(),
        None => client
            .first_model()
            .await
            .map_err(|source| BenchError::Model {
                url: cfg.base.clone(),
                source,
            })?,
    };
    let requests = Arc::new(RequestBuilder {
        endpoint: cfg.endpoint,
        model: model.clone(),
        prompt_tokens: cfg.prompt_tokens,
        shared_prefix_tokens: cfg.shared_prefix_tokens,
        output_tokens: cfg.output_tokens,
        seed: cfg.seed,
    });
    let scraper = cfg
        .proxy_metrics
        .as_deref()
        .map(TotalsScraper::new)
        .transpose()?;
    // The proxy's counters as of the last request the bench sent; every stretch of traffic
    // (probe, warmup, level) is settled against it, so none leaks into the next level's figures.
    let mut proxy_last = match &scraper {
        Some(s) => Some(s.totals().await?),
        None => None,
    };
    // One short request first, so a wrong model or path fails in a second with the server's
    // status, not after a whole level of errors.
    let probe = client
        .send(cfg.endpoint.path(), requests.body(u64::MAX, 1))
        .await;
    if let Some(source) = probe.error {
        return Err(BenchError::Probe {
            url: format!("{}{}", cfg.base, cfg.endpoint.path()),
            source,
        });
    }
    if let (Some(s), Some(last)) = (&scraper, &proxy_last) {
        proxy_last = Some(settled_totals(s, last, 1.0).await?);
    }

    let driver = Driver {
        client,
        requests,
        next_id: Arc::new(AtomicU64::new(0)),
        interrupted: interrupted.clone(),
    };
    if let (Some(t), Some(trace)) = (&cfg.trace, trace) {
        return replay_trace(
            cfg, t, trace, &driver, progress, &scraper, proxy_last, model,
        )
        .await;
    }
    let (stop_name, stop_value) = match cfg.stop {
        Stop::After(d) => ("duration", d.as_secs_f64()),
        Stop::Requests(n) => ("requests", n as f64),
    };
    println!(
        "tokenmeter bench: {} model {model}, prompt ~{} tokens{}, output {} tokens, {} per level{}",
        cfg.base,
        cfg.prompt_tokens,
        match cfg.shared_prefix_tokens {
            0 => String::new(),
            n => format!(" (the first {n} the same in every prompt)"),
        },
        cfg.output_tokens,
        match cfg.stop {
            Stop::After(d) => format!("{d:?}"),
            Stop::Requests(n) => format!("{n} requests"),
        },
        if cfg.request_rate.is_empty() {
            String::new()
        } else {
            format!(
                ", open loop (Poisson arrivals, seed {}; latency from each request's due time)",
                cfg.seed
            )
        }
    );
    let kinds: Vec<LevelKind> = if cfg.request_rate.is_empty() {
        cfg.concurrency
            .iter()
            .map(|&n| LevelKind::Closed(n))
            .collect()
    } else {
        cfg.request_rate
            .iter()
            .map(|&r| LevelKind::Open(r))
            .collect()
    };
    println!("{}", report::table_header(!cfg.request_rate.is_empty()));
    let mut levels = Vec::new();
    for (i, &kind) in kinds.iter().enumerate() {
        if interrupted.load(Ordering::Relaxed) {
            break;
        }
        let (label, n) = match kind {
            LevelKind::Closed(n) => (format!("level {}/{} c={n}", i + 1, kinds.len()), n),
            // The warmup of an open level: one round as many wide as a second of its arrivals.
            LevelKind::Open(r) => (
                format!("level {}/{} rate={r}/s", i + 1, kinds.len()),
                (r.ceil() as usize).clamp(1, load::MAX_OUTSTANDING),
            ),
        };
        if cfg.warmup {
            let live = Arc::new(Live::default());
            let _bar = progress.level(
                format!("{label} warmup"),
                Some(Stop::Requests(n as u64)),
                live.clone(),
            );
            let warm = driver.run_level(n, Stop::Requests(n as u64), live).await;
            if let (Some(s), Some(last)) = (&scraper, &proxy_last) {
                proxy_last = Some(settled_totals(s, last, warm.samples.len() as f64).await?);
            }
        }
        let before = proxy_last.take();
        let live = Arc::new(Live::default());
        let run: LevelRun = {
            let _bar = progress.level(label, Some(cfg.stop), live.clone());
            match kind {
                LevelKind::Closed(n) => driver.run_level(n, cfg.stop, live).await,
                LevelKind::Open(r) => driver.run_open(r, cfg.seed, cfg.stop, live).await,
            }
        };
        let mut level = LevelReport::from_run(&run);
        proxy_last = proxy_figures(&mut level, &run, &scraper, before).await?;
        println!("{}", report::table_row(&level));
        levels.push(level);
    }

    let report = Report {
        tokenmeter_version: env!("CARGO_PKG_VERSION"),
        target: cfg.target.clone(),
        model,
        endpoint: cfg.endpoint,
        prompt_tokens: cfg.prompt_tokens,
        shared_prefix_tokens: cfg.shared_prefix_tokens,
        output_tokens: cfg.output_tokens,
        stop: stop_name.into(),
        stop_value,
        warmup: cfg.warmup,
        levels,
    };
    write_files(&report, &cfg.out)?;
    Ok(report)
}

/// With `--proxy-metrics`, puts the proxy's figures for `run` (counted since `before`) into
/// its level; returns the proxy's counters as of its end.
async fn proxy_figures(
    level: &mut LevelReport,
    run: &LevelRun,
    scraper: &Option<TotalsScraper>,
    before: Option<ProxyTotals>,
) -> Result<Option<ProxyTotals>, BenchError> {
    let (Some(s), Some(before)) = (scraper, before) else {
        return Ok(None);
    };
    let after = settled_totals(s, &before, run.samples.len() as f64).await?;
    let ttft: Vec<f64> = run.samples.iter().filter_map(|s| s.ttft_secs()).collect();
    level.proxy = Some(proxy_view::delta(&before, &after, &ttft));
    Ok(Some(after))
}

/// The run of `--trace`: one open-loop level that replays the trace, then the files.
#[allow(clippy::too_many_arguments)] // the run's parts, each once; a struct would only rename them
async fn replay_trace(
    cfg: &BenchConfig,
    t: &ReplaySettings,
    trace: replay::Opened,
    driver: &Driver,
    progress: Progress,
    scraper: &Option<TotalsScraper>,
    before: Option<ProxyTotals>,
    model: String,
) -> Result<Report, BenchError> {
    println!(
        "tokenmeter bench: {} model {model}, replaying {} at x{} (blocks of {} tokens{}{}), \
         open loop (latency from each request's due time)",
        cfg.base,
        t.path.display(),
        t.time_scale,
        t.block_tokens,
        t.max_requests
            .map_or(String::new(), |n| format!(", at most {n} requests")),
        t.duration
            .map_or(String::new(), |d| format!(", for at most {d:?}")),
    );
    println!("{}", report::trace_table_header());
    let live = Arc::new(Live::default());
    let budget = match (t.duration, t.max_requests) {
        (Some(d), _) => Some(Stop::After(d)),
        (None, Some(n)) => Some(Stop::Requests(n)),
        (None, None) => None,
    };
    let mut replay =
        Replay::start(trace, driver.requests.clone(), t).map_err(BenchError::TraceThread)?;
    let run = {
        let _bar = progress.level(t.label(), budget, live.clone());
        driver.run_schedule(&mut replay, None, live).await?
    };
    let counts = replay.counts();
    let interrupted = driver.interrupted.load(Ordering::Relaxed);
    let mut level = LevelReport::from_replay(&run, &counts, t, interrupted);
    proxy_figures(&mut level, &run, scraper, before).await?;
    println!("{}", report::table_row(&level));
    let mean = |total: u64| (total as f64 / counts.requests.max(1) as f64).round();
    let (stop, stop_value) = match t.duration {
        Some(d) => ("duration", d.as_secs_f64()),
        None => ("trace", run.samples.len() as f64),
    };
    let report = Report {
        tokenmeter_version: env!("CARGO_PKG_VERSION"),
        target: cfg.target.clone(),
        model,
        endpoint: cfg.endpoint,
        prompt_tokens: mean(counts.input_tokens) as usize,
        shared_prefix_tokens: 0,
        output_tokens: mean(counts.output_tokens) as u64,
        stop: stop.into(),
        stop_value,
        warmup: false,
        levels: vec![level],
    };
    write_files(&report, &cfg.out)?;
    Ok(report)
}

/// Writes the JSON, CSV and both charts into `dir`; returns their paths.
pub fn write_files(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let subtitle = match report.levels.first().and_then(|l| l.trace.as_ref()) {
        Some(t) => format!(
            "{}, mean prompt {} / output {} tokens",
            t.label, report.prompt_tokens, report.output_tokens
        ),
        None => format!(
            "prompt {} / output {} tokens",
            report.prompt_tokens, report.output_tokens
        ),
    };
    let write = |name: &str, f: &dyn Fn(&Path) -> std::io::Result<()>| {
        let path = dir.join(name);
        f(&path).map_err(|source| BenchError::Write {
            path: path.clone(),
            source,
        })?;
        Ok::<_, BenchError>(path)
    };
    Ok(vec![
        write(JSON_FILE, &|p| report::write_json(report, p))?,
        write(CSV_FILE, &|p| report::write_csv(report, p))?,
        write(THROUGHPUT_SVG, &|p| {
            std::fs::write(p, chart::throughput(&report.levels, &subtitle))
        })?,
        write(TTFT_SVG, &|p| {
            std::fs::write(p, chart::ttft(&report.levels, &subtitle))
        })?,
    ])
}

/// A flag set by the first Ctrl-C (stop sending, finish, write the files); a second Ctrl-C
/// exits at once. Must be called inside the runtime.
pub fn interrupt_on_ctrl_c() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        set.store(true, Ordering::Relaxed);
        eprintln!(
            "\ntokenmeter bench: stopping: waiting for the requests in flight, then writing \
             the results (Ctrl-C again to quit now)"
        );
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(130);
        }
    });
    flag
}

/// How long the after-level scrape waits for the proxy to have recorded every request.
const SETTLE: Duration = Duration::from_secs(2);

/// Scrapes until the proxy has counted all `requests` of the level (it records a request when
/// the stream ends, which can be a moment after the client saw the end), or [`SETTLE`] passes.
async fn settled_totals(
    s: &TotalsScraper,
    before: &ProxyTotals,
    requests: f64,
) -> Result<ProxyTotals, BenchError> {
    let give_up = tokio::time::Instant::now() + SETTLE;
    loop {
        let after = s.totals().await?;
        if after.requests - before.requests >= requests || tokio::time::Instant::now() >= give_up {
            return Ok(after);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchConfig, BenchError> {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap().bench.validate()
    }

    #[test]
    fn base_urls() {
        assert_eq!(base_url("http://h:8000").unwrap(), "http://h:8000/v1");
        assert_eq!(base_url("http://h:8000/").unwrap(), "http://h:8000/v1");
        assert_eq!(base_url("http://h:8000/v1/").unwrap(), "http://h:8000/v1");
        assert_eq!(base_url("http://h/llm").unwrap(), "http://h/llm/v1");
        assert!(base_url("https://h").is_err());
        assert!(base_url("h:8000").is_err());
    }

    #[test]
    fn levels_are_sorted_and_budgets_checked() {
        let c = parse(&["--target", "http://h", "--concurrency", "16,1,4,4"]).unwrap();
        assert_eq!(c.concurrency, [1, 4, 16]);
        assert_eq!(c.stop, Stop::After(Duration::from_secs(30)));
        let c = parse(&[
            "--target",
            "http://h",
            "--concurrency",
            "1,8",
            "--requests",
            "8",
        ])
        .unwrap();
        assert_eq!(c.stop, Stop::Requests(8));
        let e = parse(&[
            "--target",
            "http://h",
            "--concurrency",
            "1,8",
            "--requests",
            "7",
        ]);
        assert!(matches!(
            e,
            Err(BenchError::TooFewRequests {
                requests: 7,
                max: 8
            })
        ));
        assert!(parse(&["--target", "http://h", "--concurrency", "0"])
            .unwrap_err()
            .is_usage());
        assert!(parse(&["--target", "http://h", "--output-tokens", "0"]).is_err());
        assert!(parse(&["--target", "ftp://h"]).unwrap_err().is_usage());
    }

    #[test]
    fn a_trace_replaces_the_levels_and_its_flags_are_checked() {
        let c = parse(&["--target", "http://h", "--trace", "t.jsonl"]).unwrap();
        let t = c.trace.unwrap();
        assert_eq!(
            (t.time_scale, t.max_requests, t.block_tokens, t.duration),
            (1.0, None, 512, None)
        );
        assert_eq!(t.label(), "trace x1");
        assert!(c.concurrency.is_empty() && c.request_rate.is_empty());
        let c = parse(&[
            "--target",
            "http://h",
            "--trace",
            "t.jsonl",
            "--time-scale",
            "0.5",
            "--max-requests",
            "30",
            "--trace-block-tokens",
            "16",
            "--duration",
            "2s",
        ])
        .unwrap();
        let t = c.trace.unwrap();
        assert_eq!(
            (t.time_scale, t.max_requests, t.block_tokens, t.duration),
            (0.5, Some(30), 16, Some(Duration::from_secs(2)))
        );
        assert_eq!(t.label(), "trace x0.5");
        for (flag, want) in [
            ("--time-scale=0", "--time-scale 0"),
            ("--time-scale=-1", "--time-scale -1"),
            ("--time-scale=inf", "--time-scale inf"),
            ("--max-requests=0", "--max-requests must be at least 1"),
            (
                "--trace-block-tokens=0",
                "--trace-block-tokens must be at least 1",
            ),
            ("--duration=0s", "--duration must be more than 0"),
        ] {
            let e = parse(&["--target", "http://h", "--trace", "t.jsonl", flag]).unwrap_err();
            assert!(
                e.is_usage() && e.to_string().starts_with(want),
                "{flag}: {e}"
            );
        }
    }

    #[test]
    fn flags_that_shape_levels_conflict_with_a_trace_and_its_own_need_it() {
        for flag in [
            "--concurrency=4",
            "--request-rate=2",
            "--requests=10",
            "--prompt-tokens=100",
            "--output-tokens=10",
            "--shared-prefix-tokens=10",
            "--warmup",
        ] {
            let e = Cli::try_parse_from(["bench", "--target", "http://h", "--trace", "t", flag])
                .err()
                .unwrap_or_else(|| panic!("{flag} was taken with --trace"));
            assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{flag}");
        }
        for flag in [
            "--time-scale=2",
            "--max-requests=3",
            "--trace-block-tokens=16",
        ] {
            let e = parse(&["--target", "http://h", flag]).unwrap_err();
            let name = flag.split('=').next().unwrap();
            assert!(
                matches!(e, BenchError::NeedsTrace(f) if f == name) && e.is_usage(),
                "{flag}: {e}"
            );
        }
        // Without a trace --duration keeps its default.
        let c = parse(&["--target", "http://h"]).unwrap();
        assert_eq!(c.stop, Stop::After(Duration::from_secs(30)));
    }

    #[test]
    fn a_shared_prefix_fits_in_the_prompt() {
        let c = parse(&["--target", "http://h", "--shared-prefix-tokens", "100"]).unwrap();
        assert_eq!((c.shared_prefix_tokens, c.prompt_tokens), (100, 256));
        let c = parse(&[
            "--target",
            "http://h",
            "--prompt-tokens",
            "64",
            "--shared-prefix-tokens",
            "64",
        ])
        .unwrap();
        assert_eq!(c.shared_prefix_tokens, 64);
        let e = parse(&[
            "--target",
            "http://h",
            "--prompt-tokens",
            "64",
            "--shared-prefix-tokens",
            "65",
        ])
        .unwrap_err();
        assert!(
            matches!(
                e,
                BenchError::PrefixTooLong {
                    shared: 65,
                    prompt: 64
                }
            ) && e.is_usage()
        );
    }

    #[test]
    fn request_rates_are_an_open_loop_exclusive_of_concurrency() {
        let c = parse(&["--target", "http://h"]).unwrap();
        assert_eq!(
            (c.concurrency, c.request_rate),
            (vec![1, 4, 16, 64, 256], vec![])
        );
        let c = parse(&["--target", "http://h", "--request-rate", "8,0.5,2,2"]).unwrap();
        assert_eq!(c.request_rate, [0.5, 2.0, 8.0]);
        assert!(c.concurrency.is_empty());
        // Any budget of requests will do: no level holds a number in flight.
        let c = parse(&[
            "--target",
            "http://h",
            "--request-rate",
            "100",
            "--requests",
            "3",
        ])
        .unwrap();
        assert_eq!(c.stop, Stop::Requests(3));
        let none = parse(&[
            "--target",
            "http://h",
            "--request-rate",
            "1",
            "--requests",
            "0",
        ]);
        assert!(matches!(none, Err(BenchError::NoRequests)));
        let both = parse(&[
            "--target",
            "http://h",
            "--concurrency",
            "4",
            "--request-rate",
            "2",
        ])
        .unwrap_err();
        assert!(matches!(both, BenchError::ClosedAndOpen) && both.is_usage());
        for bad in ["0", "-1", "inf", "NaN"] {
            let flag = format!("--request-rate={bad}");
            let e = parse(&["--target", "http://h", &flag]).unwrap_err();
            assert!(
                matches!(e, BenchError::RequestRate(_)) && e.is_usage(),
                "{bad}"
            );
        }
    }
}
