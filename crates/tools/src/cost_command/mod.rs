//! `tokenmeter cost`: who used the GPUs, without Grafana, from one of two sources.
//!
//! - `--metrics URL`: one running tokenmeter. It scrapes `/metrics` twice, `--window` apart (or
//!   once, with `--window 0`: everything since the proxy started).
//! - `--prometheus URL`: a Prometheus-compatible query API the tokenmeters are scraped into
//!   (Prometheus, VictoriaMetrics). The bill for a range, `--range 30d` or `--start` and
//!   `--end`, summed over every pod and instance the store holds, restarts included.
//!
//! Either prints the GPU time charged by tenant and model, split into prefill and decode, each
//! row's share, its GPU-seconds per million output tokens, and with a GPU-hour cost its dollars
//! on both bases; then idle and what is still in flight. Every figure is a difference (or a
//! store's `increase`) of tokenmeter's own counters (docs/cost.md says how they are made).
//! `--format csv` or `json` prints the same figures for a finance team to load.
//!
//! - [`split`]: the figures, made from two scrapes;
//! - [`query`]: the same figures from a store's query API;
//! - [`range`]: the range a store's bill covers, from the flags;
//! - [`format`](mod@format): the table, csv or json they are printed as.

use std::io::Write as _;
use std::time::{Duration, SystemTime};

use clap::Args;

use crate::scrape::{is_prometheus, metrics_url, scrape, ScrapeError};
use tokenmeter::exposition::Scrape;
use tokenmeter::metrics::names::cost as names;
use tokenmeter::units::parse_duration;

pub mod format;
pub mod query;
pub mod range;
pub mod split;

use format::{Format, Period};
use query::{QueryError, Store};
use range::Range;
use split::Split;

/// `--window` without the flag.
const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

/// The command's flags.
#[derive(Debug, Clone, Args)]
pub struct CostArgs {
    /// One tokenmeter's /metrics URL, e.g. http://127.0.0.1:9090/metrics: the split over
    /// --window. Give this or --prometheus.
    #[arg(long, env = "TOKENMETER_COST_METRICS", value_name = "URL")]
    pub metrics: Option<String>,

    /// A Prometheus-compatible query API the tokenmeters are scraped into (Prometheus,
    /// VictoriaMetrics), its base URL, plain http, e.g. http://prometheus:9090: the bill for
    /// --range (or --start and --end), summed over every tokenmeter it holds. Give this or
    /// --metrics.
    #[arg(long, env = "TOKENMETER_COST_PROMETHEUS", value_name = "URL")]
    pub prometheus: Option<String>,

    /// With --metrics: the window the split is taken over, two scrapes this far apart [default:
    /// 60s]. 0: since the proxy started (one scrape).
    #[arg(long, env = "TOKENMETER_COST_WINDOW", value_parser = parse_duration)]
    pub window: Option<Duration>,

    /// With --prometheus: the range's length, ending at --end or now, e.g. 30d, 2w, 12h (d and
    /// w on top of ms, s, m, h).
    #[arg(long, env = "TOKENMETER_COST_RANGE", value_name = "LENGTH", value_parser = range::parse_length)]
    pub range: Option<Duration>,

    /// With --prometheus: where the range starts, RFC 3339 (2025-06-01T00:00:00Z, or with an
    /// offset, 2025-06-01T02:00:00+02:00) or unix seconds (1748736000). Ends at --end or now.
    #[arg(long, env = "TOKENMETER_COST_START", value_name = "TIME", value_parser = range::parse_instant)]
    pub start: Option<SystemTime>,

    /// With --prometheus: where the range ends, RFC 3339 or unix seconds as --start [default:
    /// now].
    #[arg(long, env = "TOKENMETER_COST_END", value_name = "TIME", value_parser = range::parse_instant)]
    pub end: Option<SystemTime>,

    /// How the figures are printed: a table to read, csv (a header, one row per tenant and
    /// model) or json (the period, the rows and the totals) to load.
    #[arg(long, env = "TOKENMETER_COST_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Where the figures come from, from the flags.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// One tokenmeter's /metrics, over a window (zero: since it started).
    Metrics { url: String, window: Duration },
    /// A query API's base URL (checked), over a range.
    Prometheus { url: String, range: Range },
}

impl CostArgs {
    /// The source the flags name, or which flag to fix; `now` ends a range without `--end`.
    pub fn source(&self, now: SystemTime) -> Result<Input, CostError> {
        let usage = |s: &str| Err(CostError::Usage(s.to_string()));
        let ranged = self.range.is_some() || self.start.is_some() || self.end.is_some();
        match (&self.metrics, &self.prometheus) {
            (Some(_), Some(_)) => usage(
                "--metrics and --prometheus are two sources: give one (TOKENMETER_COST_METRICS and TOKENMETER_COST_PROMETHEUS set them too)",
            ),
            (None, None) => usage(
                "give --metrics URL (one tokenmeter's /metrics) or --prometheus URL (a query API over the fleet)",
            ),
            (Some(_), None) if ranged => usage(
                "--range, --start and --end go with --prometheus; --metrics reads --window",
            ),
            (Some(url), None) => Ok(Input::Metrics {
                url: url.clone(),
                window: self.window.unwrap_or(DEFAULT_WINDOW),
            }),
            (None, Some(_)) if self.window.is_some() => usage(
                "--window goes with --metrics; --prometheus reads --range, or --start and --end",
            ),
            (None, Some(url)) => Ok(Input::Prometheus {
                url: query::base_url(url).map_err(CostError::Query)?,
                range: Range::from_flags(self.range, self.start, self.end, now)
                    .map_err(CostError::Usage)?,
            }),
        }
    }
}

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    #[error("{0}")]
    Usage(String),
    #[error("--metrics {0:?} is not an http:// URL")]
    BadUrl(String),
    #[error(transparent)]
    Fetch(ScrapeError),
    #[error(transparent)]
    Query(QueryError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot print the figures: {0}")]
    Print(std::io::Error),
    #[error("{0} has no tokenmeter GPU-time metrics (is it tokenmeter's /metrics, a version that charges GPU time?)")]
    NotCost(String),
    #[error("{0} is a Prometheus server's own metrics: --metrics reads one tokenmeter's /metrics; for the tokenmeters a Prometheus server holds, give its base URL to --prometheus")]
    Prometheus(String),
    #[error("{url} holds no {} from {range} (is it the store the tokenmeters are scraped into? did they run then?)", names::GPU_IDLE_SECONDS)]
    NoneInStore { url: String, range: String },
}

impl CostError {
    /// True for errors the user fixes by changing the flags.
    pub fn is_usage(&self) -> bool {
        match self {
            CostError::Usage(_) | CostError::BadUrl(_) => true,
            CostError::Query(e) => e.is_usage(),
            _ => false,
        }
    }
}

/// Runs the command.
pub fn run(args: &CostArgs) -> Result<(), CostError> {
    let source = args.source(SystemTime::now())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CostError::Runtime)?;
    let (split, period) = match source {
        Input::Metrics { url, window } => from_metrics(&runtime, &url, window)?,
        Input::Prometheus { url, range } => from_store(&runtime, &url, &range)?,
    };
    // Not print!, which panics when the reader has gone (`| head`, a closed pipe): a failed
    // write is one line and exit 1, as every other failure.
    let mut out = std::io::stdout().lock();
    out.write_all(format::render(args.format, &split, &period).as_bytes())
        .and_then(|()| out.flush())
        .map_err(CostError::Print)
}

/// Two scrapes of one tokenmeter, `window` apart (one with a zero window).
fn from_metrics(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    window: Duration,
) -> Result<(Split, Period), CostError> {
    let given = url;
    let (url, added) = metrics_url(given);
    let url = url.as_str();
    if added {
        eprintln!("tokenmeter: reading {url}: --metrics had no path, and /metrics is where tokenmeter serves them");
    }
    let fetch = |url: &str| {
        runtime.block_on(scrape(url)).map_err(|e| match e {
            ScrapeError::BadUrl(_) => CostError::BadUrl(given.to_string()),
            other => CostError::Fetch(other),
        })
    };
    let first_at = SystemTime::now();
    let first = fetch(url)?;
    if !first.contains(names::GPU_IDLE_SECONDS) {
        // Both listen on 9090 by default: a Prometheus server's is the likeliest wrong address.
        if is_prometheus(&first) {
            return Err(CostError::Prometheus(url.to_string()));
        }
        return Err(CostError::NotCost(url.to_string()));
    }
    if window.is_zero() {
        let period = Period {
            start: None,
            end: first_at,
            words: "since the proxy started".to_string(),
        };
        return Ok((Split::between(&Scrape::parse(""), &first), period));
    }
    eprintln!("reading {url} again in {} s ...", window.as_secs_f64());
    std::thread::sleep(window);
    let second_at = SystemTime::now();
    let second = fetch(url)?;
    let period = Period {
        start: Some(first_at),
        end: second_at,
        words: format!("over the last {} s", window.as_secs_f64()),
    };
    Ok((Split::between(&first, &second), period))
}

/// The bill for `range` from the query API at `url`; the store's warnings go to stderr.
fn from_store(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    range: &Range,
) -> Result<(Split, Period), CostError> {
    let store = Store::new(url).map_err(CostError::Query)?;
    let (split, warnings) = runtime
        .block_on(query::bill(&store, range))
        .map_err(CostError::Query)?;
    for w in warnings {
        eprintln!("tokenmeter: warning: {url} says: {w}");
    }
    let split = split.ok_or_else(|| CostError::NoneInStore {
        url: url.to_string(),
        range: range.words(),
    })?;
    let period = Period {
        start: Some(range.start),
        end: range.end,
        words: format!("from {} over every tokenmeter in {url}", range.words()),
    };
    Ok((split, period))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::time::UNIX_EPOCH;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cost: CostArgs,
    }

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_751_328_000)
    }

    /// The source `flags` name; the environment is not read (clap reads it only for a flag
    /// given `env`, and these tests run where none of TOKENMETER_COST_* is set).
    fn source(flags: &[&str]) -> Result<Input, CostError> {
        let cli = Cli::try_parse_from(std::iter::once("cost").chain(flags.iter().copied()))
            .map_err(|e| CostError::Usage(e.to_string()))?;
        cli.cost.source(now())
    }

    fn usage(flags: &[&str], says: &str) {
        match source(flags) {
            Err(e) => {
                assert!(e.is_usage(), "{flags:?}: {e} is not a usage error");
                let line = e.to_string();
                assert!(line.contains(says), "{flags:?}: {line}");
            }
            Ok(s) => panic!("{flags:?} gave {s:?}"),
        }
    }

    #[test]
    fn one_source_and_the_flags_that_go_with_it() {
        assert_eq!(
            source(&["--metrics", "http://h:9090/metrics"]).expect("metrics"),
            Input::Metrics {
                url: "http://h:9090/metrics".into(),
                window: DEFAULT_WINDOW
            }
        );
        assert_eq!(
            source(&["--metrics", "http://h:9090/metrics", "--window", "0"]).expect("metrics"),
            Input::Metrics {
                url: "http://h:9090/metrics".into(),
                window: Duration::ZERO
            }
        );
        let Input::Prometheus { url, range } =
            source(&["--prometheus", "http://p:9090/", "--range", "30d"]).expect("prometheus")
        else {
            panic!("not the store");
        };
        assert_eq!(url, "http://p:9090");
        assert_eq!(range.end, now());
        assert_eq!(range.window(), "2592000s");
        let Input::Prometheus { range, .. } = source(&[
            "--prometheus",
            "http://p:9090",
            "--start",
            "2025-06-01T00:00:00Z",
            "--end",
            "1751328000",
        ])
        .expect("prometheus") else {
            panic!("not the store");
        };
        assert_eq!(range.window(), "2592000s");

        usage(
            &["--metrics", "http://h/metrics", "--prometheus", "http://p"],
            "two sources: give one",
        );
        usage(&[], "give --metrics URL");
        usage(&["--window", "10s"], "give --metrics URL");
        usage(
            &["--metrics", "http://h/metrics", "--range", "1d"],
            "go with --prometheus",
        );
        usage(
            &["--metrics", "http://h/metrics", "--end", "1751328000"],
            "go with --prometheus",
        );
        usage(
            &[
                "--prometheus",
                "http://p",
                "--range",
                "1d",
                "--window",
                "5s",
            ],
            "--window goes with --metrics",
        );
        usage(&["--prometheus", "http://p"], "needs a range");
        usage(
            &[
                "--prometheus",
                "http://p",
                "--start",
                "2025-07-02T00:00:00Z",
                "--end",
                "2025-07-01T00:00:00Z",
            ],
            "is not before --end",
        );
        usage(
            &["--prometheus", "https://p", "--range", "1d"],
            "is not an http:// URL",
        );
        usage(
            &["--prometheus", "http://u:pw@p", "--range", "1d"],
            "credentials",
        );
        usage(
            &["--prometheus", "http://p", "--start", "last tuesday"],
            "not an instant",
        );
        usage(
            &["--prometheus", "http://p", "--range", "3y"],
            "unknown unit",
        );
        usage(&["--metrics", "http://h/metrics", "--format", "xml"], "xml");
    }

    #[test]
    fn a_bad_metrics_url_is_a_usage_error() {
        let args = CostArgs {
            metrics: Some("https://h/metrics".into()),
            prometheus: None,
            window: Some(Duration::ZERO),
            range: None,
            start: None,
            end: None,
            format: Format::Table,
        };
        let e = run(&args).expect_err("https is not taken");
        assert!(e.is_usage(), "{e}");
    }
}
