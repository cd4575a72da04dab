//! Figures from the rounds: medians per target, ratios to nginx and differences to a direct
//! connection taken within each round (the machine is shared: a neighbour's build slows every
//! target of a round alike, so same-round comparisons are the ones to trust), then the median of
//! those over the rounds.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::client::Report;
use crate::Settings;

/// What one measurement of one target gave.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// `saturate`, `paced16`, `ttfb-burst`, `hold`, `release`, ...
    pub kind: String,
    pub figures: BTreeMap<&'static str, f64>,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Checks of the measurement itself that failed (missing events, streams not held).
    pub problems: Vec<String>,
    pub usage_removed: u64,
    pub responses: u64,
}

/// Percentile by linear interpolation between the closest ranks (numpy's default).
pub fn percentile(sorted: &[u64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0] as f64,
        n => {
            let rank = p / 100.0 * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            let w = rank - lo as f64;
            sorted[lo] as f64 * (1.0 - w) + sorted[hi] as f64 * w
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

impl Outcome {
    fn new(kind: impl Into<String>, r: &Report) -> Self {
        Outcome {
            kind: kind.into(),
            figures: BTreeMap::new(),
            errors: r.errors,
            first_error: r.first_error.clone(),
            problems: Vec::new(),
            usage_removed: r.usage_removed,
            responses: r.responses,
        }
    }

    pub fn saturate(r: &Report, cpu: Option<f64>, wall: f64) -> Self {
        let mut o = Outcome::new("saturate", r);
        o.figures.insert("chunks_per_s", r.events as f64 / r.secs);
        if let Some(cpu) = cpu {
            o.figures.insert("cpu_share", cpu / wall);
            if r.total_events > 0 {
                o.figures
                    .insert("cpu_s_per_m_chunks", cpu / r.total_events as f64 * 1e6);
            }
        }
        if r.events == 0 {
            o.problems.push("no chunk arrived".into());
        }
        o
    }

    /// `cpu`: the proxy's CPU seconds over the run, when it is a process of its own. Per chunk it
    /// is where a change to the work per lone chunk shows, which the latency rows, moving more
    /// between runs, cannot.
    pub fn latency(streams: usize, r: &Report, expected: u64, cpu: Option<f64>) -> Self {
        let mut o = Outcome::new(format!("paced{streams}"), r);
        if let Some(cpu) = cpu.filter(|_| r.events > 0) {
            o.figures
                .insert("cpu_us_per_chunk", cpu / r.events as f64 * 1e6);
        }
        let mut s = r.samples_ns.clone();
        s.sort_unstable();
        for (name, p) in [
            ("p50_us", 50.0),
            ("p90_us", 90.0),
            ("p99_us", 99.0),
            ("p999_us", 99.9),
        ] {
            o.figures.insert(name, percentile(&s, p) / 1e3);
        }
        o.figures
            .insert("max_us", s.last().map_or(f64::NAN, |&m| m as f64 / 1e3));
        let mut steady = r.steady_ns.clone();
        steady.sort_unstable();
        o.figures
            .insert("steady_p50_us", percentile(&steady, 50.0) / 1e3);
        o.figures
            .insert("steady_p99_us", percentile(&steady, 99.0) / 1e3);
        let mut f = r.first_ns.clone();
        f.sort_unstable();
        o.figures.insert("first_p50_us", percentile(&f, 50.0) / 1e3);
        o.figures.insert(
            "first_max_us",
            f.last().map_or(f64::NAN, |&m| m as f64 / 1e3),
        );
        if r.events != expected {
            o.problems
                .push(format!("{} of {expected} chunks arrived", r.events));
        }
        o
    }

    pub fn ttfb(kind: &str, r: &Report, expected: usize) -> Self {
        let mut o = Outcome::new(format!("ttfb-{kind}"), r);
        let mut s = r.samples_ns.clone();
        s.sort_unstable();
        for (name, p) in [("p50_us", 50.0), ("p90_us", 90.0)] {
            o.figures.insert(name, percentile(&s, p) / 1e3);
        }
        if s.len() != expected {
            o.problems
                .push(format!("{} of {expected} first bytes", s.len()));
        }
        o
    }

    /// The short scenario: the rate achieved, latency of each request from its due time (see
    /// `short.rs`), and the errors as a figure, so the table shows them per target.
    pub fn short(r: &Report, expected: u64) -> Self {
        let mut o = Outcome::new("short", r);
        o.figures.insert("rate_per_s", r.responses as f64 / r.secs);
        let mut s = r.samples_ns.clone();
        s.sort_unstable();
        for (name, p) in [("p50_us", 50.0), ("p99_us", 99.0), ("p999_us", 99.9)] {
            o.figures.insert(name, percentile(&s, p) / 1e3);
        }
        o.figures
            .insert("max_us", s.last().map_or(f64::NAN, |&m| m as f64 / 1e3));
        o.figures.insert("errors", r.errors as f64);
        if r.responses != expected {
            o.problems
                .push(format!("{} of {expected} requests answered", r.responses));
        }
        o
    }

    pub fn hold(n: usize, held: usize, before: u64, during: u64, r: &Report) -> Self {
        let mut o = Outcome::new("hold", r);
        o.figures.insert("streams", held as f64);
        o.figures
            .insert("rss_before_mib", before as f64 / 1048576.0);
        o.figures.insert("rss_held_mib", during as f64 / 1048576.0);
        if held > 0 {
            let per = during.saturating_sub(before) as f64 / held as f64;
            o.figures.insert("kib_per_stream", per / 1024.0);
        }
        if held != n || r.events != n as u64 {
            o.problems
                .push(format!("{} of {n} streams held", r.events.min(held as u64)));
        }
        o
    }

    pub fn release(
        n: usize,
        idle: u64,
        peak: u64,
        after: &[(f64, u64)],
        back_within_2x: Option<f64>,
        r: &Report,
    ) -> Self {
        let mut o = Outcome::new("release", r);
        let mib = |b: u64| b as f64 / 1048576.0;
        o.figures.insert("idle_mib", mib(idle));
        o.figures.insert("peak_mib", mib(peak));
        let at = |t: f64| {
            after
                .iter()
                .find(|(s, _)| *s >= t)
                .or(after.last())
                .map(|&(_, b)| mib(b))
        };
        if let Some(v) = at(1.0) {
            o.figures.insert("after_1s_mib", v);
        }
        if let Some(v) = at(10.0) {
            o.figures.insert("after_10s_mib", v);
        }
        if let Some(&(_, b)) = after.last() {
            o.figures.insert("after_watch_mib", mib(b));
        }
        o.figures
            .insert("secs_to_2x_idle", back_within_2x.unwrap_or(f64::INFINITY));
        if r.responses != n as u64 {
            o.problems
                .push(format!("{} of {n} burst streams completed", r.responses));
        }
        o
    }
}

/// One outcome, with where it came from.
#[derive(Debug, Serialize)]
pub struct RoundResult {
    pub round: usize,
    pub target: String,
    pub outcome: Outcome,
}

/// Everything one run produced.
pub struct Run<'a> {
    pub settings: &'a Settings,
    pub targets: Vec<String>,
    pub pinned: bool,
    pub load_before: f64,
    pub load_after: f64,
    pub secs: f64,
    pub results: Vec<RoundResult>,
}

impl Run<'_> {
    /// The figure per round for one target.
    fn per_round(&self, kind: &str, fig: &str, target: &str) -> BTreeMap<usize, f64> {
        self.results
            .iter()
            .filter(|r| r.target == target && r.outcome.kind == kind)
            .filter_map(|r| Some((r.round, *r.outcome.figures.get(fig)?)))
            .collect()
    }

    fn median_of(&self, kind: &str, fig: &str, target: &str) -> f64 {
        median(self.per_round(kind, fig, target).into_values().collect())
    }

    /// Median over rounds of `target`'s figure minus `direct`'s over `base`'s minus `direct`'s,
    /// taken within each round: how much more one proxy adds than another.
    fn median_added_ratio(&self, kind: &str, fig: &str, target: &str, base: &str) -> f64 {
        let d = self.per_round(kind, fig, "direct");
        let b = self.per_round(kind, fig, base);
        let v = self
            .per_round(kind, fig, target)
            .into_iter()
            .filter_map(|(round, x)| {
                let direct = d.get(&round)?;
                Some((x - direct) / (b.get(&round)? - direct))
            })
            .collect();
        median(v)
    }

    /// Median over rounds of `f(target's figure, base's figure)` taken within each round.
    fn median_vs(
        &self,
        kind: &str,
        fig: &str,
        target: &str,
        base: &str,
        f: fn(f64, f64) -> f64,
    ) -> f64 {
        let b = self.per_round(kind, fig, base);
        let v = self
            .per_round(kind, fig, target)
            .into_iter()
            .filter_map(|(round, x)| Some(f(x, *b.get(&round)?)))
            .collect();
        median(v)
    }
}

/// How a row compares targets.
#[derive(Clone, Copy)]
enum Vs {
    /// Value and its ratio to nginx.
    RatioToNginx,
    /// Value and what it adds over the direct connection.
    AddedOverDirect,
    /// The value alone.
    Plain,
}

fn fmt_value(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        return if v == f64::INFINITY {
            "never".into()
        } else {
            "–".into()
        };
    }
    match unit {
        "/s" if v >= 1e4 => format!("{:.0}k/s", v / 1e3),
        "/s" => format!("{v:.0}/s"),
        "us" if v >= 1e4 => format!("{:.1} ms", v / 1e3),
        "us" => format!("{v:.0} us"),
        "%" => format!("{:.0}%", v * 100.0),
        "s" => format!("{v:.2} s"),
        "count" => format!("{v:.0}"),
        "" => format!("{v:.1}"),
        u => format!("{v:.1} {u}"),
    }
}

/// The table for docs/bench.md.
pub fn markdown(run: &Run<'_>) -> String {
    let s = run.settings;
    let l = |n: usize| format!("{n}");
    let paced = |n: usize| format!("paced{n}");
    let mut rows: Vec<(String, String, &str, &str, Vs)> = vec![(
        format!(
            "chunks/s at saturation, {} streams (ratio to nginx)",
            s.sat_streams
        ),
        "saturate".into(),
        "chunks_per_s",
        "/s",
        Vs::RatioToNginx,
    )];
    rows.push((
        "proxy CPU during saturation (share of its one core)".into(),
        "saturate".into(),
        "cpu_share",
        "%",
        Vs::Plain,
    ));
    rows.push((
        "proxy CPU seconds per million chunks (ratio to nginx)".into(),
        "saturate".into(),
        "cpu_s_per_m_chunks",
        "s",
        Vs::RatioToNginx,
    ));
    for &n in &s.paced_loads {
        for (p, fig) in [
            ("p50", "p50_us"),
            ("p99", "p99_us"),
            ("max", "max_us"),
            ("after each stream's first second, p50", "steady_p50_us"),
            ("after each stream's first second, p99", "steady_p99_us"),
            ("of each response's first chunk, p50", "first_p50_us"),
            ("of each response's first chunk, max", "first_max_us"),
        ] {
            rows.push((
                format!(
                    "latency per chunk {p}, {} streams x {} chunks/s (added over direct)",
                    l(n),
                    s.paced_rate
                ),
                paced(n),
                fig,
                "us",
                Vs::AddedOverDirect,
            ));
        }
        rows.push((
            format!(
                "proxy CPU per chunk, {} streams x {} chunks/s (ratio to nginx)",
                l(n),
                s.paced_rate
            ),
            paced(n),
            "cpu_us_per_chunk",
            "us/chunk",
            Vs::RatioToNginx,
        ));
    }
    rows.push((
        format!(
            "time to first byte p50, {} new connections after {:.1} s idle (added over direct)",
            s.ttfb_streams,
            s.ttfb_idle.as_secs_f64()
        ),
        "ttfb-burst".into(),
        "p50_us",
        "us",
        Vs::AddedOverDirect,
    ));
    rows.push((
        format!(
            "time to first byte p50, one request at a time, {} ms apart (added over direct)",
            s.seq_gap.as_millis()
        ),
        "ttfb-seq".into(),
        "p50_us",
        "us",
        Vs::AddedOverDirect,
    ));
    rows.push((
        format!(
            "short requests answered per second, {:.0}/s due over {} connections",
            s.short_rate, s.short_conns
        ),
        "short".into(),
        "rate_per_s",
        "/s",
        Vs::Plain,
    ));
    for (p, fig) in [("p50", "p50_us"), ("p99", "p99_us"), ("p99.9", "p999_us")] {
        rows.push((
            format!("short request latency {p}, from its due time (added over direct)"),
            "short".into(),
            fig,
            "us",
            Vs::AddedOverDirect,
        ));
    }
    rows.push((
        "short requests failed".into(),
        "short".into(),
        "errors",
        "count",
        Vs::Plain,
    ));
    let held = run
        .results
        .iter()
        .find(|r| r.outcome.kind == "hold")
        .and_then(|r| r.outcome.figures.get("streams").copied())
        .unwrap_or(s.hold_streams as f64);
    rows.push((
        format!("memory per open idle stream, {held:.0} streams held (ratio to nginx)"),
        "hold".into(),
        "kib_per_stream",
        "KiB",
        Vs::RatioToNginx,
    ));
    for (what, fig) in [
        ("RSS idle, fresh process", "idle_mib"),
        ("RSS peak during the burst", "peak_mib"),
        ("RSS 1 s after the burst", "after_1s_mib"),
        ("RSS 10 s after the burst", "after_10s_mib"),
    ] {
        rows.push((
            format!("{what} of {} streams", s.burst_streams),
            "release".into(),
            fig,
            "MiB",
            Vs::Plain,
        ));
    }
    rows.push((
        format!(
            "RSS {:.0} s after the burst of {} streams",
            s.release_watch.as_secs_f64(),
            s.burst_streams
        ),
        "release".into(),
        "after_watch_mib",
        "MiB",
        Vs::Plain,
    ));
    rows.push((
        "seconds until RSS is within 2x idle after the burst".into(),
        "release".into(),
        "secs_to_2x_idle",
        "s",
        Vs::Plain,
    ));

    let mut out = String::new();
    out.push_str(&format!("| figure | {} |\n", run.targets.join(" | ")));
    out.push_str(&format!("|---|{}\n", "---|".repeat(run.targets.len())));
    for (title, kind, fig, unit, vs) in rows {
        if !run.results.iter().any(|r| r.outcome.kind == kind) {
            continue;
        }
        let cells: Vec<String> = run
            .targets
            .iter()
            .map(|t| {
                let v = run.median_of(&kind, fig, t);
                if v.is_nan() {
                    return "".into();
                }
                let value = fmt_value(v, unit);
                match vs {
                    Vs::RatioToNginx if t != "nginx" => {
                        let r = run.median_vs(&kind, fig, t, "nginx", |a, b| a / b);
                        if r.is_finite() {
                            format!("{value} ({r:.2}x)")
                        } else {
                            value
                        }
                    }
                    Vs::AddedOverDirect if t != "direct" => {
                        let d = run.median_vs(&kind, fig, t, "direct", |a, b| a - b);
                        if d.is_finite() {
                            format!("{value} ({d:+.0} us)")
                        } else {
                            value
                        }
                    }
                    _ => value,
                }
            })
            .collect();
        out.push_str(&format!("| {title} | {} |\n", cells.join(" | ")));
    }
    let has = |t: &str| run.targets.iter().any(|n| n == t);
    let ran = |kind: &str| run.results.iter().any(|r| r.outcome.kind == kind);
    if has("inject") && has("tokenmeter") && ran("saturate") {
        let r = run.median_vs(
            "saturate",
            "chunks_per_s",
            "inject",
            "tokenmeter",
            |a, b| a / b,
        );
        out.push_str(&format!(
            "\n`--inject-usage` throughput over plain tokenmeter's, same rounds: {r:.2}x\n"
        ));
    }
    if has("direct") && has("nginx") && ran("short") {
        let ratios: Vec<String> = run
            .targets
            .iter()
            .filter(|t| *t != "direct" && *t != "nginx")
            .map(|t| {
                let r = run.median_added_ratio("short", "p99_us", t, "nginx");
                format!("{t} {r:.2}x")
            })
            .collect();
        out.push_str(&format!(
            "\nShort requests, p99 added over direct relative to nginx's, same rounds: {}\n",
            ratios.join(", ")
        ));
    }
    let errors: u64 = run.results.iter().map(|r| r.outcome.errors).sum();
    out.push_str(&format!(
        "\n{} rounds in {:.0} s, {}; load average {:.2} before, {:.2} after; {} client errors.\n",
        s.rounds,
        run.secs,
        if run.pinned {
            "proxy pinned to core 0, upstream and client to core 1"
        } else {
            "NOT pinned (one core or no taskset)"
        },
        run.load_before,
        run.load_after,
        errors
    ));
    for r in run
        .results
        .iter()
        .filter(|r| r.outcome.errors > 0 || !r.outcome.problems.is_empty())
    {
        out.push_str(&format!(
            "- round {} {} {}: {} errors (first: {}) {}\n",
            r.round + 1,
            r.target,
            r.outcome.kind,
            r.outcome.errors,
            r.outcome.first_error.as_deref().unwrap_or("-"),
            r.outcome.problems.join("; ")
        ));
    }
    out
}

/// Everything, for plotting or a closer look.
pub fn json(run: &Run<'_>) -> String {
    let v = serde_json::json!({
        "targets": run.targets,
        "rounds": run.settings.rounds,
        "pinned": run.pinned,
        "load_before": run.load_before,
        "load_after": run.load_after,
        "secs": run.secs,
        "results": run.results,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

/// The smoke run's checks: every measurement complete, no client error, and `--inject-usage`
/// removed exactly the usage events its upstream sent (and nothing else did).
pub fn check_smoke(run: &Run<'_>) -> Result<(), String> {
    let mut failed = Vec::new();
    for t in &run.targets {
        for kind in ["saturate", "ttfb-burst", "ttfb-seq", "short"] {
            if !run
                .results
                .iter()
                .any(|r| &r.target == t && r.outcome.kind == kind)
            {
                failed.push(format!("{t}: no {kind} result"));
            }
        }
    }
    for r in &run.results {
        let o = &r.outcome;
        if o.errors > 0 {
            failed.push(format!(
                "{} {}: {} errors, first: {}",
                r.target,
                o.kind,
                o.errors,
                o.first_error.as_deref().unwrap_or("-")
            ));
        }
        for p in &o.problems {
            failed.push(format!("{} {}: {p}", r.target, o.kind));
        }
        let removed_all = o.usage_removed == o.responses && o.responses > 0;
        match r.target.as_str() {
            // A held stream never ends, and a short request is not streamed: no usage to remove.
            "inject" if o.kind != "hold" && o.kind != "short" && !removed_all => {
                failed.push(format!(
                    "inject {}: usage removed from {} of {} responses",
                    o.kind, o.usage_removed, o.responses
                ))
            }
            "direct" | "nginx" | "tokenmeter" if o.usage_removed > 0 => failed.push(format!(
                "{} {}: a usage chunk was asked for",
                r.target, o.kind
            )),
            _ => {}
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("smoke run failed:\n  {}", failed.join("\n  ")))
    }
}
