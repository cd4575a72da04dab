//! `tokenmeter cost --metrics URL`: who used the GPUs, from a running tokenmeter, without
//! Grafana.
//!
//! It scrapes `/metrics` twice, `--window` apart (or once, with `--window 0`: everything since
//! the proxy started), and prints the GPU time charged by tenant and model, split into prefill
//! and decode, each row's share, its GPU-seconds per million output tokens, and with a GPU-hour
//! cost its dollars on both bases; then idle and what is still in flight. Every figure is a
//! difference of tokenmeter's own counters (docs/cost.md says how they are made).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use clap::Args;

use crate::scrape::{scrape, ScrapeError};
use tokenmeter::exposition::Scrape;
use tokenmeter::metrics::cost::names;
use tokenmeter::metrics::names::{GPUS, GPU_HOUR_COST, OUTPUT_TOKENS_TOTAL};
use tokenmeter::units::parse_duration;

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

/// One row: a tenant's use of one model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Row {
    pub prefill: f64,
    pub decode: f64,
    pub output_tokens: f64,
    pub usage_usd: f64,
    pub allocation_usd: f64,
}

/// The split over the window, from the counters' differences.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Split {
    /// By (tenant, model); the tenant is `all` without the label.
    pub rows: BTreeMap<(String, String), Row>,
    pub idle: f64,
    /// Busy time held by the requests in flight at the end.
    pub unassigned: f64,
    pub gpus: f64,
    pub gpu_hour_cost: Option<f64>,
}

impl Split {
    /// The difference of `after` and `before` (an empty scrape: since the start).
    pub fn between(before: &Scrape, after: &Scrape) -> Split {
        let mut rows: BTreeMap<(String, String), Row> = BTreeMap::new();
        let key = |s: &tokenmeter::exposition::Sample| {
            (
                s.label("tenant").unwrap_or("all").to_owned(),
                s.label("model").unwrap_or("").to_owned(),
            )
        };
        for (scrape, sign) in [(after, 1.0), (before, -1.0)] {
            for s in scrape.samples() {
                let field: Option<fn(&mut Row) -> &mut f64> =
                    match (s.name.as_str(), s.label("phase"), s.label("basis")) {
                        (names::GPU_SECONDS, Some("prefill"), _) => Some(|r| &mut r.prefill),
                        (names::GPU_SECONDS, Some("decode"), _) => Some(|r| &mut r.decode),
                        (names::GPU_COST_USD, _, Some("usage")) => Some(|r| &mut r.usage_usd),
                        (names::GPU_COST_USD, _, Some("allocation")) => {
                            Some(|r| &mut r.allocation_usd)
                        }
                        (OUTPUT_TOKENS_TOTAL, _, _) => Some(|r| &mut r.output_tokens),
                        _ => None,
                    };
                if let Some(f) = field {
                    *f(rows.entry(key(s)).or_default()) += sign * s.value;
                }
            }
        }
        rows.retain(|_, r| r.prefill + r.decode > 0.0);
        Split {
            rows,
            idle: after.sum(names::GPU_IDLE_SECONDS, &[])
                - before.sum(names::GPU_IDLE_SECONDS, &[]),
            unassigned: after.sum(names::GPU_UNASSIGNED_SECONDS, &[]),
            gpus: after.sum(GPUS, &[]),
            gpu_hour_cost: after.select(GPU_HOUR_COST, &[]).next().map(|s| s.value),
        }
    }

    /// The table, as the command prints it.
    pub fn render(&self, over: &str) -> String {
        let mut out = String::new();
        let charged: f64 = self.rows.values().map(|r| r.prefill + r.decode).sum();
        let total = charged + self.idle;
        let pct = |v: f64| if total > 0.0 { 100.0 * v / total } else { 0.0 };
        let _ = writeln!(
            out,
            "GPU time {over} on {:.0} GPU(s): {charged:.1} GPU-s charged, {:.1} idle ({:.1}%); {:.1} GPU-s held by requests in flight, charged when they end",
            self.gpus,
            self.idle,
            pct(self.idle),
            self.unassigned
        );
        let usd = self.gpu_hour_cost.is_some();
        let _ = write!(
            out,
            "\n{:<20} {:<28} {:>11} {:>11} {:>7} {:>14}",
            "tenant", "model", "prefill s", "decode s", "share", "GPU-s per 1M"
        );
        if usd {
            let _ = write!(out, " {:>11} {:>11}", "USD usage", "USD alloc");
        }
        out.push('\n');
        let mut rows: Vec<_> = self.rows.iter().collect();
        rows.sort_by(|a, b| (b.1.prefill + b.1.decode).total_cmp(&(a.1.prefill + a.1.decode)));
        for ((tenant, model), r) in rows {
            let per_m = if r.output_tokens > 0.0 {
                format!("{:.1}", (r.prefill + r.decode) / r.output_tokens * 1e6)
            } else {
                "n/a".into()
            };
            let _ = write!(
                out,
                "{:<20} {:<28} {:>11.2} {:>11.2} {:>6.1}% {:>14}",
                tenant,
                model,
                r.prefill,
                r.decode,
                pct(r.prefill + r.decode),
                per_m
            );
            if usd {
                let _ = write!(out, " {:>11.4} {:>11.4}", r.usage_usd, r.allocation_usd);
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "{:<20} {:<28} {:>11} {:>11} {:>6.1}%",
            "idle",
            "",
            "",
            "",
            pct(self.idle)
        );
        out
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
    print!("{}", Split::between(&before, &after).render(&over));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
tokenmeter_gpus{source=\"flag\"} 2
tokenmeter_gpu_seconds_total{model=\"m\",phase=\"prefill\",tenant=\"a\"} 1
tokenmeter_gpu_seconds_total{model=\"m\",phase=\"decode\",tenant=\"a\"} 2
tokenmeter_gpu_idle_seconds_total 10
tokenmeter_output_tokens_total{model=\"m\",tenant=\"a\"} 1000
";
    const AFTER: &str = "\
tokenmeter_gpus{source=\"flag\"} 2
tokenmeter_gpu_seconds_total{model=\"m\",phase=\"prefill\",tenant=\"a\"} 4
tokenmeter_gpu_seconds_total{model=\"m\",phase=\"decode\",tenant=\"a\"} 8
tokenmeter_gpu_seconds_total{model=\"m\",phase=\"decode\",tenant=\"b\"} 3
tokenmeter_gpu_idle_seconds_total 15
tokenmeter_gpu_unassigned_seconds 0.5
tokenmeter_output_tokens_total{model=\"m\",tenant=\"a\"} 4000
tokenmeter_output_tokens_total{model=\"m\",tenant=\"b\"} 1000
";

    #[test]
    fn the_split_is_the_counters_difference() {
        let s = Split::between(&Scrape::parse(BEFORE), &Scrape::parse(AFTER));
        let a = s.rows[&("a".to_string(), "m".to_string())];
        assert_eq!((a.prefill, a.decode, a.output_tokens), (3.0, 6.0, 3000.0));
        let b = s.rows[&("b".to_string(), "m".to_string())];
        assert_eq!((b.decode, b.output_tokens), (3.0, 1000.0));
        assert_eq!((s.idle, s.unassigned, s.gpus), (5.0, 0.5, 2.0));
        let text = s.render("over the last 10 s");
        // 9 + 3 charged, 5 idle: a is 9 / 17 of the time, 3,000 GPU-seconds per million.
        assert!(
            text.contains("12.0 GPU-s charged, 5.0 idle (29.4%)"),
            "{text}"
        );
        assert!(text.contains("52.9%"), "{text}");
        assert!(text.contains("3000.0"), "{text}");
        // The dearest first.
        assert!(
            text.find("\na ").unwrap_or(0) < text.find("\nb ").unwrap_or(0),
            "{text}"
        );
    }
}
