//! The results: one [`LevelReport`] per level (a concurrency, a request rate in the open loop,
//! or a trace's replay, with its own figures in [`TraceLevel`]), shown as a table on stdout and
//! written as JSON (everything, nested) and CSV (one flat row per level, for spreadsheets).
//!
//! Latency and speed statistics are over the level's successful requests; output token totals
//! count every request, failed ones included (so they match a proxy's counters).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::load::LevelRun;
use super::proxy_view::ProxyLevel;
use super::replay::{ReplayCounts, ReplaySettings};
use super::stats::{percentile, Percentiles};

/// One level's figures.
#[derive(Debug, Clone, Serialize)]
pub struct LevelReport {
    /// Closed loop: the requests held in flight. Open loop: the most in flight at once.
    pub concurrency: usize,
    /// Open loop (`--request-rate`): the level's rate, requests/s; `null` in the closed loop.
    pub request_rate: Option<f64>,
    /// The mean number of requests in flight over the window, measured.
    pub mean_concurrency: f64,
    /// Open loop: requests due while the safety bound were in flight, so never sent.
    pub not_sent: u64,
    /// Seconds a request left after it was due (open loop; zero in the closed loop). Every
    /// latency below includes it.
    pub send_late: Option<Percentiles>,
    /// Requests that completed without error.
    pub requests: usize,
    pub errors: usize,
    /// Failed requests by kind (`status`, `send`, `stream`, `timeout`, `no_tokens`).
    pub error_kinds: BTreeMap<&'static str, usize>,
    /// Seconds during which `concurrency` requests were in flight.
    pub window_seconds: f64,
    /// Seconds from the level's start to its last request's end (window plus drain).
    pub elapsed_seconds: f64,
    /// Output tokens of every request of the level.
    pub output_tokens: u64,
    /// Output tokens that arrived inside the window.
    pub window_output_tokens: f64,
    /// Output tokens/s of all requests together: window tokens / window.
    pub aggregate_tps: f64,
    /// Per request: (output tokens - 1) / (e2e - TTFT).
    pub request_tps: Option<Percentiles>,
    /// Seconds, request sent (open loop: due) to first token.
    pub ttft: Option<Percentiles>,
    /// Seconds, per token.
    pub itl: Option<Percentiles>,
    /// Seconds, per request: (e2e - TTFT) / (output tokens - 1).
    pub tpot: Option<Percentiles>,
    /// Seconds, request sent (open loop: due) to end of response.
    pub e2e: Option<Percentiles>,
    /// Output tokens per successful request.
    pub output_tokens_per_request: Option<Percentiles>,
    /// Prompt tokens per request, as the server counted them.
    pub input_tokens_per_request: Option<Percentiles>,
    /// The proxy's own figures for the level, with `--proxy-metrics`.
    pub proxy: Option<ProxyLevel>,
    /// A trace's replay (`--trace`): what was replayed and how closely; `null` otherwise.
    pub trace: Option<TraceLevel>,
}

/// The figures of a trace's replay, beside those every level has.
#[derive(Debug, Clone, Serialize)]
pub struct TraceLevel {
    /// The level's name, e.g. `trace x0.5`.
    pub label: String,
    pub file: String,
    pub time_scale: f64,
    pub block_tokens: usize,
    /// Requests sent, failed ones included.
    pub requests_sent: usize,
    /// Of the requests replayed, those the trace asked for no output: sent with `max_tokens` 1.
    pub zero_output: u64,
    /// Requests out of order in the file beyond the reader's window: sent as soon as read.
    pub late_in_trace: u64,
    /// The prompt and output tokens the trace states for the requests replayed.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Seconds each request was sent after its due time, over every request sent: p99 and max.
    pub send_late_p99: Option<f64>,
    pub send_late_max: Option<f64>,
    /// Mean request rates, requests/s (gaps over their span): the trace's at its own pace,
    /// scheduled (at the time scale), and achieved (from the times requests actually left).
    pub trace_rate: Option<f64>,
    pub scheduled_rate: Option<f64>,
    pub achieved_rate: Option<f64>,
    /// Why sending stopped: `end` (of the trace, or `--max-requests`), `duration` or
    /// `interrupted`.
    pub ended: &'static str,
}

/// The mean rate of events at `times` (seconds, any order): gaps over their span.
fn mean_rate(mut times: Vec<f64>) -> Option<f64> {
    times.sort_by(f64::total_cmp);
    let span = times.last()? - times.first()?;
    (times.len() >= 2 && span > 0.0).then(|| (times.len() - 1) as f64 / span)
}

impl LevelReport {
    pub fn from_run(run: &LevelRun) -> LevelReport {
        let ok: Vec<_> = run.samples.iter().filter(|s| s.is_ok()).collect();
        let mut error_kinds = BTreeMap::new();
        for s in &run.samples {
            if let Some(e) = &s.error {
                *error_kinds.entry(e.kind()).or_insert(0) += 1;
            }
        }
        let mut itl = Vec::new();
        for s in &ok {
            s.push_itl(&mut itl);
        }
        let summarise = |f: &dyn Fn(&super::client::Sample) -> Option<f64>| {
            Percentiles::of(&mut ok.iter().filter_map(|s| f(s)).collect())
        };
        let window_output_tokens = run.tokens_in_window();
        LevelReport {
            concurrency: run.concurrency,
            request_rate: run.rate,
            mean_concurrency: run.mean_concurrency(),
            not_sent: run.not_sent,
            send_late: summarise(&|s| Some(s.late.as_secs_f64())),
            requests: ok.len(),
            errors: run.samples.len() - ok.len(),
            error_kinds,
            window_seconds: run.window().as_secs_f64(),
            elapsed_seconds: run.finished.duration_since(run.started).as_secs_f64(),
            output_tokens: run.samples.iter().map(|s| s.output_tokens()).sum(),
            window_output_tokens,
            aggregate_tps: run.aggregate_tps(),
            request_tps: summarise(&|s| s.request_tps()),
            ttft: summarise(&|s| s.ttft_secs()),
            itl: Percentiles::of(&mut itl),
            tpot: summarise(&|s| s.tpot()),
            e2e: summarise(&|s| Some(s.e2e.as_secs_f64())),
            output_tokens_per_request: summarise(&|s| Some(s.output_tokens() as f64)),
            input_tokens_per_request: summarise(&|s| s.input_tokens.map(|n| n as f64)),
            proxy: None,
            trace: None,
        }
    }

    /// A trace's replay: the level's figures, its rate the scheduled one, and the trace's own.
    pub fn from_replay(
        run: &LevelRun,
        counts: &ReplayCounts,
        settings: &ReplaySettings,
        interrupted: bool,
    ) -> LevelReport {
        let mut level = LevelReport::from_run(run);
        let secs = |s: &super::client::Sample, late: bool| {
            let at = s.sent.saturating_duration_since(run.started);
            (at + if late { s.late } else { Duration::ZERO }).as_secs_f64()
        };
        let mut lateness: Vec<f64> = run.samples.iter().map(|s| s.late.as_secs_f64()).collect();
        lateness.sort_by(f64::total_cmp);
        let scheduled_rate = mean_rate(run.samples.iter().map(|s| secs(s, false)).collect());
        level.request_rate = scheduled_rate;
        level.trace = Some(TraceLevel {
            label: settings.label(),
            file: settings.path.display().to_string(),
            time_scale: settings.time_scale,
            block_tokens: settings.block_tokens,
            requests_sent: run.samples.len(),
            zero_output: counts.zero_output,
            late_in_trace: counts.late_in_trace,
            input_tokens: counts.input_tokens,
            output_tokens: counts.output_tokens,
            send_late_p99: percentile(&lateness, 0.99),
            send_late_max: lateness.last().copied(),
            trace_rate: counts.trace_rate(),
            scheduled_rate,
            achieved_rate: mean_rate(run.samples.iter().map(|s| secs(s, true)).collect()),
            ended: if interrupted {
                "interrupted"
            } else if counts.cut_by_duration {
                "duration"
            } else {
                "end"
            },
        });
        level
    }
}

/// A whole run: what was asked, and every level.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub tokenmeter_version: &'static str,
    pub target: String,
    pub model: String,
    pub endpoint: super::prompt::Endpoint,
    /// Prompt tokens per request; a trace's replay: the mean the trace states, rounded.
    pub prompt_tokens: usize,
    /// Words every prompt starts with (`--shared-prefix-tokens`).
    pub shared_prefix_tokens: usize,
    /// Output tokens per request; a trace's replay: the mean the trace states, rounded.
    pub output_tokens: u64,
    /// `"duration"` or `"requests"`, and its value (seconds or requests per level); a trace
    /// replayed to its end (or `--max-requests`): `"trace"` and the requests sent.
    pub stop: String,
    pub stop_value: f64,
    pub warmup: bool,
    pub levels: Vec<LevelReport>,
}

/// The table's header line; `open` for an open-loop run, whose rows lead with the rate and end
/// with the concurrency it resulted in and the client's lateness.
pub fn table_header(open: bool) -> String {
    header(if open { "rate/s" } else { "conc" }, open)
}

/// The header of a trace's replay: an open loop whose row leads with its time scale.
pub fn trace_table_header() -> String {
    header("trace", true)
}

fn header(first: &str, open: bool) -> String {
    let (extra, extra_units) = if open {
        (
            format!(" | {:>6} {:>6} {:>8}", "conc", "", "late p99"),
            format!(" | {:>6} {:>6} {:>8}", "mean", "peak", "ms"),
        )
    } else {
        (String::new(), String::new())
    };
    format!(
        "{:>6} {:>6} {:>5} | {:>9} {:>7} | {:>9} | {:>8} {:>8} | {:>7} {:>7} | {:>8}{extra}",
        first,
        "reqs",
        "err",
        "req tok/s",
        "p10",
        "agg tok/s",
        "TTFT p50",
        "p99",
        "ITL p50",
        "p99",
        "TPOT p50",
    ) + &format!(
        "\n{:>6} {:>6} {:>5} | {:>9} {:>7} | {:>9} | {:>8} {:>8} | {:>7} {:>7} | {:>8}{extra_units}",
        "", "", "", "p50", "", "", "ms", "ms", "ms", "ms", "ms"
    )
}

/// One level as a table row; with proxy figures, a second line compares them.
pub fn table_row(l: &LevelReport) -> String {
    let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}", v * 1e3));
    let tps = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.1}"));
    let first = match (&l.trace, l.request_rate) {
        (Some(t), _) => format!("x{}", t.time_scale),
        (None, Some(r)) => format!("{r}"),
        (None, None) => l.concurrency.to_string(),
    };
    let mut row = format!(
        "{:>6} {:>6} {:>5} | {:>9} {:>7} | {:>9.1} | {:>8} {:>8} | {:>7} {:>7} | {:>8}",
        first,
        l.requests,
        l.errors,
        tps(l.request_tps.map(|s| s.p50)),
        // The slow end of per-request speed is p10: the users who waited longest.
        tps(l.request_tps.map(|s| s.p10)),
        l.aggregate_tps,
        ms(l.ttft.map(|s| s.p50)),
        ms(l.ttft.map(|s| s.p99)),
        ms(l.itl.map(|s| s.p50)),
        ms(l.itl.map(|s| s.p99)),
        ms(l.tpot.map(|s| s.p50)),
    );
    if l.request_rate.is_some() || l.trace.is_some() {
        let _ = write!(
            row,
            " | {:>6.1} {:>6} {:>8}",
            l.mean_concurrency,
            l.concurrency,
            ms(l.send_late.map(|s| s.p99))
        );
        if l.not_sent > 0 {
            let _ = write!(row, " ({} not sent: too many in flight)", l.not_sent);
        }
    }
    if let Some(t) = &l.trace {
        let _ = write!(row, "\n{:>6} {}", "", trace_line(t));
    }
    if let Some(p) = &l.proxy {
        let bucket = p.ttft_p50_bucket.map_or(String::new(), |(lo, hi)| {
            format!(" (bucket {:.0}-{:.0} ms)", lo * 1e3, hi * 1e3)
        });
        let _ = write!(
            row,
            "\n{:>6} proxy: TTFT p50 {} ms{bucket} vs client {} ms (binned alike; exact {} ms); \
             TTFT mean {} ms vs client {} ms; output tokens {} vs client {}; requests {} vs client {}",
            "",
            ms(p.ttft_p50),
            ms(p.client_ttft_p50_binned),
            ms(l.ttft.map(|s| s.p50)),
            ms(p.ttft_mean),
            ms(l.ttft.map(|s| s.mean)),
            p.output_tokens,
            l.output_tokens,
            p.requests,
            l.requests + l.errors,
        );
    }
    row
}

/// What a trace's replay adds to its row: what was sent, how late, at what rate.
pub fn trace_line(t: &TraceLevel) -> String {
    let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}", v * 1e3));
    let rate = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.2}"));
    let mut line = format!("trace: {} requests sent", t.requests_sent);
    if t.zero_output > 0 {
        let _ = write!(
            line,
            " ({} asked for no output: sent with max_tokens 1)",
            t.zero_output
        );
    }
    let _ = write!(
        line,
        "; sent late by p99 {} ms, max {} ms",
        ms(t.send_late_p99),
        ms(t.send_late_max)
    );
    if t.late_in_trace > 0 {
        let _ = write!(
            line,
            "; {} out of order in the file, sent when read",
            t.late_in_trace
        );
    }
    let _ = write!(
        line,
        "; mean rate {}/s in the trace, {}/s at x{}, {}/s achieved",
        rate(t.trace_rate),
        rate(t.scheduled_rate),
        t.time_scale,
        rate(t.achieved_rate)
    );
    if t.ended != "end" {
        let _ = write!(line, "; stopped: {}", t.ended);
    }
    line
}

/// Writes the report as pretty JSON.
pub fn write_json(report: &Report, path: &Path) -> io::Result<()> {
    let text = serde_json::to_string_pretty(report).map_err(io::Error::other)?;
    std::fs::write(path, text + "\n")
}

/// The CSV columns, in order.
pub const CSV_COLUMNS: &[&str] = &[
    "concurrency",
    "requests",
    "errors",
    "window_seconds",
    "output_tokens",
    "aggregate_tps",
    "request_tps_mean",
    "request_tps_p10",
    "request_tps_p50",
    "request_tps_p90",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "itl_p50_s",
    "itl_p90_s",
    "itl_p99_s",
    "tpot_mean_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "input_tokens_mean",
    "proxy_ttft_p50_s",
    "client_ttft_p50_binned_s",
    "proxy_ttft_mean_s",
    "proxy_output_tokens",
    "request_rate",
    "concurrency_mean",
    "send_late_p99_s",
    "not_sent",
    "trace_time_scale",
    "trace_requests_sent",
    "trace_zero_output",
    "trace_late_in_file",
    "trace_send_late_max_s",
    "trace_rate",
    "trace_scheduled_rate",
    "trace_achieved_rate",
];

/// Writes one row per level under a header of [`CSV_COLUMNS`]. Every cell is a number (or
/// empty when there is no value), so no quoting is ever needed.
pub fn write_csv(report: &Report, path: &Path) -> io::Result<()> {
    let mut out = CSV_COLUMNS.join(",");
    out.push('\n');
    for l in &report.levels {
        let f = |x: Option<f64>| x.map_or(String::new(), |v| format!("{v}"));
        let cells = [
            l.concurrency.to_string(),
            l.requests.to_string(),
            l.errors.to_string(),
            format!("{}", l.window_seconds),
            l.output_tokens.to_string(),
            format!("{}", l.aggregate_tps),
            f(l.request_tps.map(|s| s.mean)),
            f(l.request_tps.map(|s| s.p10)),
            f(l.request_tps.map(|s| s.p50)),
            f(l.request_tps.map(|s| s.p90)),
            f(l.ttft.map(|s| s.mean)),
            f(l.ttft.map(|s| s.p50)),
            f(l.ttft.map(|s| s.p90)),
            f(l.ttft.map(|s| s.p99)),
            f(l.itl.map(|s| s.p50)),
            f(l.itl.map(|s| s.p90)),
            f(l.itl.map(|s| s.p99)),
            f(l.tpot.map(|s| s.mean)),
            f(l.tpot.map(|s| s.p50)),
            f(l.tpot.map(|s| s.p99)),
            f(l.e2e.map(|s| s.p50)),
            f(l.e2e.map(|s| s.p99)),
            f(l.input_tokens_per_request.map(|s| s.mean)),
            f(l.proxy.as_ref().and_then(|p| p.ttft_p50)),
            f(l.proxy.as_ref().and_then(|p| p.client_ttft_p50_binned)),
            f(l.proxy.as_ref().and_then(|p| p.ttft_mean)),
            f(l.proxy.as_ref().map(|p| p.output_tokens as f64)),
            f(l.request_rate),
            format!("{}", l.mean_concurrency),
            f(l.send_late.map(|s| s.p99)),
            l.not_sent.to_string(),
            f(l.trace.as_ref().map(|t| t.time_scale)),
            f(l.trace.as_ref().map(|t| t.requests_sent as f64)),
            f(l.trace.as_ref().map(|t| t.zero_output as f64)),
            f(l.trace.as_ref().map(|t| t.late_in_trace as f64)),
            f(l.trace.as_ref().and_then(|t| t.send_late_max)),
            f(l.trace.as_ref().and_then(|t| t.trace_rate)),
            f(l.trace.as_ref().and_then(|t| t.scheduled_rate)),
            f(l.trace.as_ref().and_then(|t| t.achieved_rate)),
        ];
        debug_assert_eq!(cells.len(), CSV_COLUMNS.len());
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    std::fs::write(path, out)
}
