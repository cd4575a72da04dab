//! How a [`Split`] is printed: the table a person reads.

use std::fmt::Write as _;

use super::split::Split;

/// The table, as the command prints it: `over` says what time it covers.
pub fn table(split: &Split, over: &str) -> String {
    let mut out = String::new();
    let charged: f64 = split.rows.values().map(|r| r.prefill + r.decode).sum();
    let total = charged + split.idle;
    let pct = |v: f64| if total > 0.0 { 100.0 * v / total } else { 0.0 };
    let _ = writeln!(
        out,
        "GPU time {over} on {:.0} GPU(s): {charged:.1} GPU-s charged, {:.1} idle ({:.1}%); {:.1} GPU-s held by requests in flight, charged when they end",
        split.gpus,
        split.idle,
        pct(split.idle),
        split.unassigned
    );
    let usd = split.gpu_hour_cost.is_some();
    let _ = write!(
        out,
        "\n{:<20} {:<28} {:>11} {:>11} {:>7} {:>14}",
        "tenant", "model", "prefill s", "decode s", "share", "GPU-s per 1M"
    );
    if usd {
        let _ = write!(out, " {:>11} {:>11}", "USD usage", "USD alloc");
    }
    out.push('\n');
    let mut rows: Vec<_> = split.rows.iter().collect();
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
        pct(split.idle)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::super::split::tests::sample;
    use super::*;

    #[test]
    fn the_table_gives_shares_of_all_the_time_and_the_dearest_first() {
        let text = table(&sample(), "over the last 10 s");
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
