//! `tokenmeter cost --metrics URL`: who used the GPUs, from a running tokenmeter, without
//! Grafana.
//!
//! It scrapes `/metrics` twice, `--window` apart (or once, with `--window 0`: everything since
//! the proxy started), and prints the GPU time charged by tenant and model, split into prefill
//! and decode, each row's share, its GPU-seconds per million output tokens, and with a GPU-hour
//! cost its dollars on both bases; then idle and what is still in flight. Every figure is a
//! difference of tokenmeter's own counters (docs/cost.md says how they are made).
//!
//! `--format csv` or `json` prints the same figures for a finance team to load.
//!
//! - [`split`]: the figures, made from two scrapes;
//! - [`format`]: the table, csv or json they are printed as.

use std::time::{Duration, SystemTime};

use clap::Args;

use crate::scrape::{scrape, ScrapeError};
use tokenmeter::exposition::Scrape;
use tokenmeter::metrics::cost::names;
use tokenmeter::units::parse_duration;

pub mod format;
pub mod split;

use format::{Format, Period};
use split::Split;

/// The command's flags.
#[derive(Debug, Clone, Args)]
pub struct CostArgs {
    /// A tokenmeter's /metrics URL, e.g. http://127.0.0.1:9090/metrics.
    #[arg(long, env = "TOKENMETER_COST_METRICS", value_name = "URL")]
    pub metrics: String,

    /// The window the split is taken over: two scrapes this far apart. 0: since the proxy
    /// started (one scrape).
    #[arg(long, env = "TOKENMETER_COST_WINDOW", default_value = "60s", value_parser = parse_duration)]
    pub window: Duration,

    /// How the figures are printed: a table to read, csv (a header, one row per tenant and
    /// model) or json (the period, the rows and the totals) to load.
    #[arg(long, env = "TOKENMETER_COST_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    #[error("--metrics {0:?} is not an http:// URL")]
    BadUrl(String),
    #[error(transparent)]
    Fetch(ScrapeError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{0} has no tokenmeter GPU-time metrics (is it tokenmeter's /metrics, a version that charges GPU time?)")]
    NotCost(String),
}

impl CostError {
    /// True for errors the user fixes by changing the flags.
    pub fn is_usage(&self) -> bool {
        matches!(self, CostError::BadUrl(_))
    }
}

/// Runs the command.
pub fn run(args: &CostArgs) -> Result<(), CostError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CostError::Runtime)?;
    let fetch = |url: &str| {
        runtime.block_on(scrape(url)).map_err(|e| match e {
            ScrapeError::BadUrl(u) => CostError::BadUrl(u),
            other => CostError::Fetch(other),
        })
    };
    let first_at = SystemTime::now();
    let first = fetch(&args.metrics)?;
    if !first.contains(names::GPU_IDLE_SECONDS) {
        return Err(CostError::NotCost(args.metrics.clone()));
    }
    let (before, after, period) = if args.window.is_zero() {
        let period = Period {
            start: None,
            end: first_at,
            words: "since the proxy started".to_string(),
        };
        (Scrape::parse(""), first, period)
    } else {
        eprintln!(
            "reading {} again in {} s ...",
            args.metrics,
            args.window.as_secs_f64()
        );
        std::thread::sleep(args.window);
        let second_at = SystemTime::now();
        let second = fetch(&args.metrics)?;
        let period = Period {
            start: Some(first_at),
            end: second_at,
            words: format!("over the last {} s", args.window.as_secs_f64()),
        };
        (first, second, period)
    };
    let split = Split::between(&before, &after);
    print!("{}", format::render(args.format, &split, &period));
    Ok(())
}
