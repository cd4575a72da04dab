//! The two charts of a run, as SVG written by hand (a plotting crate would be most of the
//! binary for two line charts).
//!
//! - Throughput: per-request tokens/s (p50, left axis) and aggregate tokens/s (right axis)
//!   against concurrency: the trade-off in one picture, one line falling while the other climbs.
//! - TTFT: p50 and p99 against concurrency, where queueing shows.
//!
//! Concurrency is drawn on a log scale (levels are usually powers of two or four), each level a
//! marked point (`<circle class="point SERIES">`), so a reader (or a test) finds one point per
//! level per series. Y axes start at zero: a trade-off drawn from a cut axis exaggerates.

use std::fmt::Write as _;

use super::report::LevelReport;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 80.0;
const TOP: f64 = 70.0;
const BOTTOM: f64 = 60.0;

/// Which y axis a series is read against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Left,
    Right,
}

/// One line of a chart: a value (or a gap) per x.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    /// CSS class of its points and line, e.g. `request-tps`.
    pub class: &'static str,
    pub color: &'static str,
    pub axis: Axis,
    pub values: Vec<Option<f64>>,
}

/// A line chart over concurrency levels.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_left: String,
    /// Label of the right axis; `None` draws none.
    pub y_right: Option<String>,
    pub xs: Vec<f64>,
    pub series: Vec<Series>,
}

/// Per-request and aggregate tokens/s against concurrency.
pub fn throughput(levels: &[LevelReport], subtitle: &str) -> String {
    render(&Chart {
        title: format!("Tokens/s against concurrency ({subtitle})"),
        x_label: "concurrent requests".into(),
        y_left: "per-request tokens/s (p50)".into(),
        y_right: Some("aggregate tokens/s".into()),
        xs: levels.iter().map(|l| l.concurrency as f64).collect(),
        series: vec![
            Series {
                name: "per-request tokens/s, p50".into(),
                class: "request-tps",
                color: "#1f77b4",
                axis: Axis::Left,
                values: levels
                    .iter()
                    .map(|l| l.request_tps.map(|s| s.p50))
                    .collect(),
            },
            Series {
                name: "aggregate tokens/s".into(),
                class: "aggregate-tps",
                color: "#d62728",
                axis: Axis::Right,
                values: levels.iter().map(|l| Some(l.aggregate_tps)).collect(),
            },
        ],
    })
}

/// TTFT p50 and p99 (milliseconds) against concurrency.
pub fn ttft(levels: &[LevelReport], subtitle: &str) -> String {
    let ms = |f: fn(&super::stats::Summary) -> f64| -> Vec<Option<f64>> {
        levels
            .iter()
            .map(|l| l.ttft.as_ref().map(|s| f(s) * 1e3))
            .collect()
    };
    render(&Chart {
        title: format!("Time to first token against concurrency ({subtitle})"),
        x_label: "concurrent requests".into(),
        y_left: "TTFT (ms)".into(),
        y_right: None,
        xs: levels.iter().map(|l| l.concurrency as f64).collect(),
        series: vec![
            Series {
                name: "TTFT p50".into(),
                class: "ttft-p50",
                color: "#2ca02c",
                axis: Axis::Left,
                values: ms(|s| s.p50),
            },
            Series {
                name: "TTFT p99".into(),
                class: "ttft-p99",
                color: "#9467bd",
                axis: Axis::Left,
                values: ms(|s| s.p99),
            },
        ],
    })
}

/// A "nice" axis top and step (1, 2 or 5 times a power of ten) covering `max` in about 5 steps.
pub fn nice_axis(max: f64) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 0.2);
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

/// Renders a chart as a standalone SVG document.
pub fn render(c: &Chart) -> String {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let (xmin, xmax) =
        c.xs.iter()
            .filter(|x| **x > 0.0)
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
    let x_of = |x: f64| -> f64 {
        if xmax > xmin && x > 0.0 {
            LEFT + plot_w * (x.ln() - xmin.ln()) / (xmax.ln() - xmin.ln())
        } else {
            LEFT + plot_w / 2.0
        }
    };
    let axis_top = |axis: Axis| {
        let max = c
            .series
            .iter()
            .filter(|s| s.axis == axis)
            .flat_map(|s| s.values.iter().flatten())
            .fold(0.0f64, |m, v| m.max(*v));
        nice_axis(max)
    };
    let (left_top, left_step) = axis_top(Axis::Left);
    let (right_top, right_step) = axis_top(Axis::Right);
    let y_of = |v: f64, axis: Axis| {
        let top = if axis == Axis::Left {
            left_top
        } else {
            right_top
        };
        TOP + plot_h * (1.0 - v / top)
    };

    let mut s = String::new();
    let _ = write!(
        s,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
"##,
        WIDTH / 2.0,
        escape(&c.title)
    );

    // Grid and left axis.
    let mut v = 0.0;
    while v <= left_top + left_step / 2.0 {
        let y = y_of(v, Axis::Left);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            number(v)
        );
        v += left_step;
    }
    if c.y_right.is_some() {
        let mut v = 0.0;
        while v <= right_top + right_step / 2.0 {
            let y = y_of(v, Axis::Right);
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="start">{}</text>"##,
                LEFT + plot_w + 6.0,
                y + 4.0,
                number(v)
            );
            v += right_step;
        }
    }
    // Frame, x ticks at every level.
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>"##
    );
    for &x in &c.xs {
        let px = x_of(x);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#333"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 5.0,
            TOP + plot_h + 18.0,
            number(x)
        );
    }
    // Axis labels.
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
        LEFT + plot_w / 2.0,
        HEIGHT - 15.0,
        escape(&c.x_label)
    );
    let mid = TOP + plot_h / 2.0;
    let _ = writeln!(
        s,
        r##"<text x="20" y="{mid:.1}" text-anchor="middle" transform="rotate(-90 20 {mid:.1})">{}</text>"##,
        escape(&c.y_left)
    );
    if let Some(right) = &c.y_right {
        let x = WIDTH - 15.0;
        let _ = writeln!(
            s,
            r##"<text x="{x:.1}" y="{mid:.1}" text-anchor="middle" transform="rotate(90 {x:.1} {mid:.1})">{}</text>"##,
            escape(right)
        );
    }

    // Series: a line through the points that exist, and a marker per point.
    for (i, series) in c.series.iter().enumerate() {
        let dash = if series.axis == Axis::Right {
            r#" stroke-dasharray="6 3""#
        } else {
            ""
        };
        let points: Vec<(f64, f64)> =
            c.xs.iter()
                .zip(&series.values)
                .filter_map(|(&x, v)| v.filter(|v| v.is_finite()).map(|v| (x, v)))
                .map(|(x, v)| (x_of(x), y_of(v, series.axis)))
                .collect();
        let line: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            s,
            r##"<polyline class="line {}" points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"##,
            series.class,
            line.join(" "),
            series.color
        );
        for (x, y) in &points {
            let _ = writeln!(
                s,
                r##"<circle class="point {}" cx="{x:.1}" cy="{y:.1}" r="4" fill="{}"/>"##,
                series.class, series.color
            );
        }
        // Legend entry, left to right under the title.
        let lx = LEFT + 10.0 + 260.0 * i as f64;
        let _ = writeln!(
            s,
            r##"<line x1="{lx:.1}" y1="48" x2="{:.1}" y2="48" stroke="{}" stroke-width="2"{dash}/><circle cx="{:.1}" cy="48" r="4" fill="{}"/><text x="{:.1}" y="52">{}</text>"##,
            lx + 24.0,
            series.color,
            lx + 12.0,
            series.color,
            lx + 30.0,
            escape(&series.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A tick label: no decimals for whole numbers, otherwise up to three significant decimals.
fn number(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Escapes text for XML content and attribute values.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;

    #[test]
    fn nice_axes_cover_the_maximum_in_round_steps() {
        assert_eq!(nice_axis(2345.0), (2500.0, 500.0));
        assert_eq!(nice_axis(60.0), (60.0, 20.0));
        assert_eq!(nice_axis(0.7), (0.8, 0.2));
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
    }

    #[test]
    fn labels_are_escaped_and_numbers_short() {
        assert_eq!(escape(r#"a<b & "c""#), "a&lt;b &amp; &quot;c&quot;");
        assert_eq!(number(256.0), "256");
        assert_eq!(number(0.25), "0.25");
    }
}
