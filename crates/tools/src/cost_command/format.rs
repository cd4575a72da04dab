//! How a [`Split`] is printed (`--format`): a table a person reads, or csv and json a finance
//! team loads.
//!
//! - `table`: the rows dearest first, each with its share of all the GPU time (idle included),
//!   then idle; rounded for reading.
//! - `csv`: a header row, then one row per tenant and model, sorted by tenant and model, every
//!   figure at full precision, the period's start and end on every row so files of several
//!   periods can be stacked. Only the rows: a total or an idle line would be counted twice by
//!   whoever sums the column. A tenant or model that begins like a formula (`=`, `+`, `-`, `@`)
//!   is written after a `'`, as spreadsheet guidance has it: the model name is whatever a client
//!   sent, and a spreadsheet must not run it.
//! - `json`: one object, the period's start and end, the rows (as in the csv) and the totals
//!   (with idle, and what requests still in flight held at the end).
//!
//! Without dollars (no `--gpu-hour-cost` anywhere) the USD figures are absent from the table
//! and empty (csv) or `null` (json); a row without output tokens has no per-million figure.

use std::fmt::Write as _;
use std::time::SystemTime;

use serde::Serialize;
use tokenmeter::reqlog::rfc3339;

use super::split::{Row, Split};

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Csv,
    Json,
}

/// The time a split covers.
#[derive(Debug, Clone, PartialEq)]
pub struct Period {
    /// None: since the proxy started.
    pub start: Option<SystemTime>,
    pub end: SystemTime,
    /// For the table's first line: "over the last 60 s", "from ... to ...".
    pub words: String,
}

/// The split in `format`.
pub fn render(format: Format, split: &Split, period: &Period) -> String {
    match format {
        Format::Table => table(split, &period.words),
        Format::Csv => csv(split, period),
        Format::Json => json(split, period),
    }
}

/// The table, as the command prints it: `over` says what time it covers.
pub fn table(split: &Split, over: &str) -> String {
    let mut out = String::new();
    let pct = |v: f64| 100.0 * split.share(v);
    let on = split
        .gpus
        .map(|g| format!(" on {g:.0} GPU(s)"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "GPU time {over}{on}: {} GPU-s charged, {} idle ({}%); {} GPU-s held by requests in flight, charged when they end",
        fixed(split.charged(), 1),
        fixed(split.idle, 1),
        fixed(pct(split.idle), 1),
        fixed(split.unassigned, 1)
    );
    let _ = write!(
        out,
        "\n{:<20} {:<28} {:>11} {:>11} {:>7} {:>14}",
        "tenant", "model", "prefill s", "decode s", "share", "GPU-s per 1M"
    );
    if split.usd {
        let _ = write!(out, " {:>11} {:>11}", "USD usage", "USD alloc");
    }
    out.push('\n');
    let mut rows: Vec<_> = split.rows.iter().collect();
    rows.sort_by(|a, b| b.1.gpu_seconds().total_cmp(&a.1.gpu_seconds()));
    for ((tenant, model), r) in rows {
        let per_m = r
            .per_million()
            .map_or_else(|| "n/a".into(), |v| fixed(v, 1));
        let _ = write!(
            out,
            "{:<20} {:<28} {:>11} {:>11} {:>6}% {:>14}",
            tenant,
            model,
            fixed(r.prefill, 2),
            fixed(r.decode, 2),
            fixed(pct(r.gpu_seconds()), 1),
            per_m
        );
        if split.usd {
            let _ = write!(
                out,
                " {:>11} {:>11}",
                fixed(r.usage_usd, 4),
                fixed(r.allocation_usd, 4)
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "{:<20} {:<28} {:>11} {:>11} {:>6}%",
        "idle",
        "",
        "",
        "",
        fixed(pct(split.idle), 1)
    );
    out
}

/// `v` to `decimals` places, never as `-0.0`: a sum of nothing, or a difference of two equal
/// counters, is a float's negative zero (or a hair below zero), and a bill that reads
/// "-0.0 GPU-s" looks like a refund.
fn fixed(v: f64, decimals: usize) -> String {
    let text = format!("{v:.decimals$}");
    match text.strip_prefix('-') {
        Some(digits) if digits.chars().all(|c| c == '0' || c == '.') => digits.to_string(),
        _ => text,
    }
}

/// `v`, with a negative zero made positive, for the csv and json (full precision: a real
/// negative, however small, is kept).
fn unsigned_zero(v: f64) -> f64 {
    if v == 0.0 {
        0.0
    } else {
        v
    }
}

/// The csv columns, in order.
pub const CSV_HEADER: &str = "start,end,tenant,model,prefill_gpu_seconds,decode_gpu_seconds,gpu_seconds,share,output_tokens,gpu_seconds_per_million_output_tokens,usd_usage,usd_allocation";

/// The rows as csv, with the header.
pub fn csv(split: &Split, period: &Period) -> String {
    let (start, end) = instants(period);
    let start = start.unwrap_or_default();
    let mut out = format!("{CSV_HEADER}\n");
    for ((tenant, model), r) in &split.rows {
        let j = JsonRow::new(split, tenant, model, r);
        let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
        let _ = writeln!(
            out,
            "{start},{end},{},{},{},{},{},{},{},{},{},{}",
            csv_text(tenant),
            csv_text(model),
            j.prefill_gpu_seconds,
            j.decode_gpu_seconds,
            j.gpu_seconds,
            j.share,
            j.output_tokens,
            opt(j.gpu_seconds_per_million_output_tokens),
            opt(j.usd_usage),
            opt(j.usd_allocation),
        );
    }
    out
}

/// A text field for csv: quoted when it holds a separator, a quote or a line break (RFC 4180),
/// and after a `'` when it would start a spreadsheet formula.
fn csv_text(s: &str) -> String {
    let guarded = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if guarded.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", guarded.replace('"', "\"\""))
    } else {
        guarded
    }
}

/// One row of the json (and the csv's figures).
#[derive(Debug, Serialize)]
struct JsonRow<'a> {
    tenant: &'a str,
    model: &'a str,
    prefill_gpu_seconds: f64,
    decode_gpu_seconds: f64,
    gpu_seconds: f64,
    /// Of all the GPU time, idle included: 0 to 1.
    share: f64,
    output_tokens: f64,
    gpu_seconds_per_million_output_tokens: Option<f64>,
    usd_usage: Option<f64>,
    usd_allocation: Option<f64>,
}

impl<'a> JsonRow<'a> {
    fn new(split: &Split, tenant: &'a str, model: &'a str, r: &Row) -> JsonRow<'a> {
        let usd = |v: f64| split.usd.then_some(v);
        JsonRow {
            tenant,
            model,
            prefill_gpu_seconds: unsigned_zero(r.prefill),
            decode_gpu_seconds: unsigned_zero(r.decode),
            gpu_seconds: unsigned_zero(r.gpu_seconds()),
            share: unsigned_zero(split.share(r.gpu_seconds())),
            output_tokens: unsigned_zero(r.output_tokens),
            gpu_seconds_per_million_output_tokens: r.per_million().map(unsigned_zero),
            usd_usage: usd(unsigned_zero(r.usage_usd)),
            usd_allocation: usd(unsigned_zero(r.allocation_usd)),
        }
    }
}

/// The json's totals: the rows added up, and the time nobody was charged for.
#[derive(Debug, Serialize)]
struct Sums {
    prefill_gpu_seconds: f64,
    decode_gpu_seconds: f64,
    gpu_seconds: f64,
    /// GPU-seconds with nothing in flight.
    idle_gpu_seconds: f64,
    /// Busy GPU-seconds held by the requests still in flight at the end, charged when they end.
    in_flight_gpu_seconds: f64,
    idle_share: f64,
    output_tokens: f64,
    gpu_seconds_per_million_output_tokens: Option<f64>,
    usd_usage: Option<f64>,
    usd_allocation: Option<f64>,
    /// At the end, where the source states it.
    gpus: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Bill<'a> {
    /// RFC 3339; null: since the proxy started.
    start: Option<String>,
    end: String,
    rows: Vec<JsonRow<'a>>,
    totals: Sums,
}

/// The split as one json object, with a line break after it.
pub fn json(split: &Split, period: &Period) -> String {
    let (start, end) = instants(period);
    let t = split.totals();
    let usd = |v: f64| split.usd.then_some(v);
    let bill = Bill {
        start,
        end,
        rows: split
            .rows
            .iter()
            .map(|((tenant, model), r)| JsonRow::new(split, tenant, model, r))
            .collect(),
        totals: Sums {
            prefill_gpu_seconds: unsigned_zero(t.prefill),
            decode_gpu_seconds: unsigned_zero(t.decode),
            gpu_seconds: unsigned_zero(t.gpu_seconds()),
            idle_gpu_seconds: unsigned_zero(split.idle),
            in_flight_gpu_seconds: unsigned_zero(split.unassigned),
            idle_share: unsigned_zero(split.share(split.idle)),
            output_tokens: unsigned_zero(t.output_tokens),
            gpu_seconds_per_million_output_tokens: t.per_million().map(unsigned_zero),
            usd_usage: usd(unsigned_zero(t.usage_usd)),
            usd_allocation: usd(unsigned_zero(t.allocation_usd)),
            gpus: split.gpus.map(unsigned_zero),
        },
    };
    // Serializing plain structs of strings and numbers cannot fail; the fallback is for form.
    let mut out = serde_json::to_string_pretty(&bill).unwrap_or_else(|e| format!("{e}"));
    out.push('\n');
    out
}

/// The period's start and end in RFC 3339.
fn instants(period: &Period) -> (Option<String>, String) {
    (period.start.map(rfc3339), rfc3339(period.end))
}

#[cfg(test)]
mod tests {
    use super::super::split::tests::sample;
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn period() -> Period {
        Period {
            start: Some(UNIX_EPOCH + Duration::from_secs(1_751_328_000)),
            end: UNIX_EPOCH + Duration::from_secs(1_751_328_010),
            words: "over the last 10 s".into(),
        }
    }

    #[test]
    fn the_table_gives_shares_of_all_the_time_and_the_dearest_first() {
        let text = render(Format::Table, &sample(), &period());
        // 9 + 3 charged, 5 idle: a is 9 / 17 of the time, 3,000 GPU-seconds per million.
        assert!(
            text.starts_with(
                "GPU time over the last 10 s on 2 GPU(s): 12.0 GPU-s charged, 5.0 idle (29.4%)"
            ),
            "{text}"
        );
        assert!(text.contains("52.9%"), "{text}");
        assert!(text.contains("3000.0"), "{text}");
        assert!(
            !text.contains("USD"),
            "no dollars without a GPU-hour cost: {text}"
        );
        // The dearest first.
        assert!(
            text.find("\na ").unwrap_or(0) < text.find("\nb ").unwrap_or(0),
            "{text}"
        );
        // A store's split states no GPU count.
        let fleet = Split {
            gpus: None,
            ..sample()
        };
        let text = table(&fleet, "from s to e");
        assert!(
            text.starts_with("GPU time from s to e: 12.0 GPU-s"),
            "{text}"
        );
    }

    #[test]
    fn no_figure_is_printed_as_negative_zero() {
        assert_eq!(fixed(-0.0, 1), "0.0");
        assert_eq!(fixed(-0.00001, 2), "0.00");
        assert_eq!(fixed(-0.5, 1), "-0.5");
        assert_eq!(fixed(1.25, 1), "1.2");
        assert_eq!(unsigned_zero(-0.0).to_string(), "0");
        // No requests in the window: nothing charged, a sum of nothing.
        let empty = Split {
            idle: 60.0,
            gpus: Some(1.0),
            ..Split::default()
        };
        let table = table(&empty, "over the last 60 s");
        assert!(
            table.contains(": 0.0 GPU-s charged, 60.0 idle (100.0%)"),
            "{table}"
        );
        assert!(!table.contains("-0"), "{table}");
        let json = json(&empty, &period());
        assert!(!json.contains(": -0"), "{json}");
        // A counter's difference of nothing, a hair below zero or negative zero.
        let negative = Split {
            idle: -0.0,
            unassigned: -1e-12,
            ..Split::default()
        };
        let table = self::table(&negative, "x");
        assert!(!table.contains("-0"), "{table}");
        let json = self::json(&negative, &period());
        assert!(!json.contains(": -0.0"), "{json}");
    }

    #[test]
    fn the_csv_has_a_header_and_one_row_per_tenant_and_model() {
        let text = render(Format::Csv, &sample(), &period());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        let width = CSV_HEADER.split(',').count();
        assert_eq!(lines.len(), 3, "{text}");
        for line in &lines {
            assert_eq!(line.split(',').count(), width, "{line}");
        }
        assert_eq!(
            lines[1],
            format!(
                "2025-07-01T00:00:00.000Z,2025-07-01T00:00:10.000Z,a,m,3,6,9,{},3000,3000,,",
                9.0 / 17.0
            )
        );
        assert!(lines[2].contains(",b,m,0,3,3,"), "{text}");

        // Dollars where they were counted; since the start, an empty start.
        let mut s = sample();
        s.usd = true;
        s.rows.values_mut().for_each(|r| {
            r.usage_usd = 0.25;
            r.allocation_usd = 0.5;
        });
        let since = Period {
            start: None,
            ..period()
        };
        let text = csv(&s, &since);
        assert!(
            text.lines().nth(1).is_some_and(
                |l| l.starts_with(",2025-07-01T00:00:10.000Z,a,") && l.ends_with(",0.25,0.5")
            ),
            "{text}"
        );
    }

    #[test]
    fn csv_text_is_quoted_and_never_a_formula() {
        assert_eq!(csv_text("team-a"), "team-a");
        assert_eq!(csv_text("org/model,v2"), "\"org/model,v2\"");
        assert_eq!(csv_text("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_text("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(csv_text("-x"), "'-x");
        assert_eq!(csv_text("@sum"), "'@sum");
    }

    #[test]
    fn the_json_holds_the_period_the_rows_and_the_totals() {
        let text = render(Format::Json, &sample(), &period());
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["start"], "2025-07-01T00:00:00.000Z");
        assert_eq!(v["end"], "2025-07-01T00:00:10.000Z");
        let rows = v["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["tenant"], "a");
        assert_eq!(rows[0]["model"], "m");
        assert_eq!(rows[0]["prefill_gpu_seconds"], 3.0);
        assert_eq!(rows[0]["decode_gpu_seconds"], 6.0);
        assert_eq!(rows[0]["gpu_seconds"], 9.0);
        assert_eq!(rows[0]["gpu_seconds_per_million_output_tokens"], 3000.0);
        assert!(rows[0]["usd_usage"].is_null() && rows[0]["usd_allocation"].is_null());
        let t = &v["totals"];
        assert_eq!(t["gpu_seconds"], 12.0);
        assert_eq!(t["idle_gpu_seconds"], 5.0);
        assert_eq!(t["in_flight_gpu_seconds"], 0.5);
        assert_eq!(t["output_tokens"], 4000.0);
        assert_eq!(t["gpu_seconds_per_million_output_tokens"], 3000.0);
        assert_eq!(t["gpus"], 2.0);

        let since = Period {
            start: None,
            ..period()
        };
        let v: serde_json::Value = serde_json::from_str(&json(&sample(), &since)).expect("json");
        assert!(v["start"].is_null());
        // Nothing charged and nothing idle: shares are 0, not NaN (which json cannot hold).
        let v: serde_json::Value =
            serde_json::from_str(&json(&Split::default(), &period())).expect("json");
        assert_eq!(v["totals"]["idle_share"], 0.0);
        assert_eq!(v["rows"].as_array().map(Vec::len), Some(0));
    }
}
