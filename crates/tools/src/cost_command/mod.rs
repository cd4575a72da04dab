//! `tokenmeter cost --metrics URL`: who used the GPUs, from a running tokenmeter, without
//! Grafana.
//!
//! It scrapes `/metrics` twice, `--window` apart (or once, with `--window 0`: everything since
//! the proxy started), and prints the GPU time charged by tenant and model, split into prefill
//! and decode, each row's share, its GPU-seconds per million output tokens, and with a GPU-hour
//! cost its dollars on both bases; then idle and what is still in flight. Every figure is a
//! difference of tokenmeter's own counters (docs/cost.md says how they are made).
//!
//! - [`split`]: the figures, made from two scrapes;
//! - [`format`]: the table they are printed as.

use std::time::Duration;

use clap::Args;

use crate::scrape::{scrape, ScrapeError};
use tokenmeter::exposition::Scrape;
use tokenmeter::metrics::cost::names;
use tokenmeter::units::parse_duration;

pub mod format;
pub mod split;

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
    let first = fetch(&args.metrics)?;
    if !first.contains(names::GPU_IDLE_SECONDS) {
        return Err(CostError::NotCost(args.metrics.clone()));
    }
    let (before, after, over) = if args.window.is_zero() {
        (
            Scrape::parse(""),
            first,
            "since the proxy started".to_string(),
        )
    } else {
        eprintln!(
            "reading {} again in {} s ...",
            args.metrics,
            args.window.as_secs_f64()
        );
        std::thread::sleep(args.window);
        let second = fetch(&args.metrics)?;
        (
            first,
            second,
            format!("over the last {} s", args.window.as_secs_f64()),
        )
    };
    print!("{}", format::table(&Split::between(&before, &after), &over));
    Ok(())
}
