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

/// Legend entries flow left to right under the title and wrap to a new row before the right
/// edge; each row below the first makes the chart that much taller, so the plot keeps its size.
const LEGEND_Y: f64 = 48.0;
const LEGEND_ROW: f64 = 18.0;
/// The swatch (a line with a marker) before an entry's text.
const LEGEND_SWATCH: f64 = 30.0;
/// Space between two entries of a row.
const LEGEND_GAP: f64 = 24.0;
/// Width allowed per character of a legend's text: sans-serif at 12 px averages about 6.5 px
/// for mixed text (capitals and digits up to 8), so 7 keeps ordinary labels inside their room.
const LEGEND_CHAR: f64 = 7.0;

/// Least space between two x-axis labels.
const X_LABEL_GAP: f64 = 4.0;

/// The title's lines (15 px) and the notes under it (12 px): their pitch, and the characters
/// one line holds (the chart's width at about 8.5 and 7 px a character).
const TITLE_ROW: f64 = 19.0;
const TITLE_CHARS: usize = 84;
const NOTE_ROW: f64 = 16.0;
const NOTE_CHARS: usize = 104;

/// Markers' labels sit in rows between the legend and the plot, each beside its line; a label
/// that would meet one already in a row goes to the next (limits a few pixels apart, 30 beside
/// 32, take a row each), so no label is drawn over another.
const MARKER_ROW: f64 = 18.0;
/// Space kept between two labels of a row.
const MARKER_GAP: f64 = 8.0;

/// How a line drawn from a model that is not to be trusted looks: grey and finely dashed, so
/// it reads as a guess whatever its colour was.
const FADED_COLOR: &str = "#9e9e9e";
const FADED_DASH: &str = "2 4";

/// The room one legend entry takes.
fn legend_width(name: &str) -> f64 {
    LEGEND_SWATCH + LEGEND_CHAR * name.chars().count() as f64
}

/// The (x, y) of each legend entry: left to right from the plot's left edge, wrapping when the
/// next entry would pass the chart's right edge. The first row is `below` pixels under its
/// usual place (the title's extra lines and the notes).
fn legend_layout(names: &[&str], below: f64) -> Vec<(f64, f64)> {
    let (start, end) = (LEFT + 10.0, WIDTH - 10.0);
    let (mut x, mut y) = (start, LEGEND_Y + below);
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let w = legend_width(name);
        if x > start && x + w > end {
            x = start;
            y += LEGEND_ROW;
        }
        out.push((x, y));
        x += w + LEGEND_GAP;
    }
    out
}

/// `text` broken at spaces into lines of at most `width` characters (a longer word keeps a
/// line of its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// Each marker's label: its row (0 nearest the legend), x and anchor. A label goes after its
/// line, or before it when it would pass the chart's right edge, in the first row where it
/// meets no other label.
fn marker_layout(labels: &[(f64, &str)]) -> Vec<(usize, f64, &'static str)> {
    let mut order: Vec<usize> = (0..labels.len()).collect();
    order.sort_by(|&a, &b| labels[a].0.total_cmp(&labels[b].0));
    let mut rows: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut out = vec![(0, 0.0, "start"); labels.len()];
    for i in order {
        let (x, label) = labels[i];
        let w = LEGEND_CHAR * label.chars().count() as f64;
        let after = x + 4.0 + w <= WIDTH - 10.0 || x - 4.0 - w < 10.0;
        let (lx, span) = if after {
            (x + 4.0, (x + 4.0, x + 4.0 + w))
        } else {
            (x - 4.0, (x - 4.0 - w, x - 4.0))
        };
        let free = |row: &Vec<(f64, f64)>| {
            row.iter()
                .all(|o| span.1 + MARKER_GAP <= o.0 || o.1 + MARKER_GAP <= span.0)
        };
        let r = match rows.iter().position(free) {
            Some(r) => r,
            None => {
                rows.push(Vec::new());
                rows.len() - 1
            }
        };
        rows[r].push(span);
        out[i] = (r, lx, if after { "start" } else { "end" });
    }
    out
}

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
    /// Drawn from a model that is not to be trusted: grey and dashed, whatever its colour.
    pub faded: bool,
}

/// A vertical line at one x with its label, e.g. a class's limit.
#[derive(Debug, Clone)]
pub struct Marker {
    pub x: f64,
    pub label: String,
    /// CSS class of its group, e.g. `limit`.
    pub class: &'static str,
}

/// A line chart over concurrency levels.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Wrapped to the chart's width.
    pub title: String,
    /// Lines under the title in smaller type (each wrapped), e.g. why not to trust the chart.
    pub notes: Vec<String>,
    pub x_label: String,
    pub y_left: String,
    /// Label of the right axis; `None` draws none.
    pub y_right: Option<String>,
    pub xs: Vec<f64>,
    pub series: Vec<Series>,
    pub markers: Vec<Marker>,
}

/// The x axis of a run: its request rates when every level has one (the open loop; a trace's
/// replay, at its scheduled mean rate), else its concurrency levels. Returns the axis name (for
/// titles), its label and the values.
fn x_axis(levels: &[LevelReport]) -> (&'static str, &'static str, Vec<f64>) {
    let rates: Option<Vec<f64>> = levels.iter().map(|l| l.request_rate).collect();
    let arrivals = if levels.iter().any(|l| l.trace.is_some()) {
        "requests/s (a trace's, mean)"
    } else {
        "requests/s (Poisson arrivals)"
    };
    match rates {
        Some(r) if !r.is_empty() => ("request rate", arrivals, r),
        _ => (
            "concurrency",
            "concurrent requests",
            levels.iter().map(|l| l.concurrency as f64).collect(),
        ),
    }
}

/// Per-request and aggregate tokens/s against concurrency (or the request rate).
pub fn throughput(levels: &[LevelReport], subtitle: &str) -> String {
    let (against, x_label, xs) = x_axis(levels);
    render(&Chart {
        notes: Vec::new(),
        title: format!("Tokens/s against {against} ({subtitle})"),
        x_label: x_label.into(),
        y_left: "per-request tokens/s (p50)".into(),
        y_right: Some("aggregate tokens/s".into()),
        xs,
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
                faded: false,
            },
            Series {
                name: "aggregate tokens/s".into(),
                class: "aggregate-tps",
                color: "#d62728",
                axis: Axis::Right,
                values: levels.iter().map(|l| Some(l.aggregate_tps)).collect(),
                faded: false,
            },
        ],
        markers: Vec::new(),
    })
}

/// TTFT p50 and p99 (milliseconds) against concurrency.
pub fn ttft(levels: &[LevelReport], subtitle: &str) -> String {
    let ms = |f: fn(&super::stats::Percentiles) -> f64| -> Vec<Option<f64>> {
        levels
            .iter()
            .map(|l| l.ttft.as_ref().map(|s| f(s) * 1e3))
            .collect()
    };
    let (against, x_label, xs) = x_axis(levels);
    render(&Chart {
        notes: Vec::new(),
        title: format!("Time to first token against {against} ({subtitle})"),
        x_label: x_label.into(),
        y_left: "TTFT (ms)".into(),
        y_right: None,
        xs,
        series: vec![
            Series {
                name: "TTFT p50".into(),
                class: "ttft-p50",
                color: "#2ca02c",
                axis: Axis::Left,
                values: ms(|s| s.p50),
                faded: false,
            },
            Series {
                name: "TTFT p99".into(),
                class: "ttft-p99",
                color: "#9467bd",
                axis: Axis::Left,
                values: ms(|s| s.p99),
                faded: false,
            },
        ],
        markers: Vec::new(),
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
    // From the top: the title's lines, the notes, the legend's rows, the markers' rows, the
    // plot. Each block pushes the ones below it down and makes the chart that much taller, so
    // the plot keeps its size.
    let title = wrap(&c.title, TITLE_CHARS);
    let notes: Vec<String> = c.notes.iter().flat_map(|n| wrap(n, NOTE_CHARS)).collect();
    let head = TITLE_ROW * (title.len() - 1) as f64 + NOTE_ROW * notes.len() as f64;
    let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
    let legend = legend_layout(&names, head);
    let legend_bottom = legend.last().map_or(LEGEND_Y + head, |(_, y)| *y);
    let (xmin, xmax) =
        c.xs.iter()
            .chain(c.markers.iter().map(|m| &m.x))
            .filter(|x| **x > 0.0)
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
    let plot_w = WIDTH - LEFT - RIGHT;
    let x_of = |x: f64| -> f64 {
        if xmax > xmin && x > 0.0 {
            LEFT + plot_w * (x.ln() - xmin.ln()) / (xmax.ln() - xmin.ln())
        } else {
            LEFT + plot_w / 2.0
        }
    };
    // A marker off the log scale (at or below zero) has no place on it: the caller says so in
    // a note instead.
    let markers: Vec<&Marker> = c.markers.iter().filter(|m| m.x > 0.0).collect();
    let labels: Vec<(f64, &str)> = markers
        .iter()
        .map(|m| (x_of(m.x), m.label.as_str()))
        .collect();
    let placed = marker_layout(&labels);
    let marker_rows = placed.iter().map(|p| p.0 + 1).max().unwrap_or(0);
    let extra = legend_bottom - LEGEND_Y + MARKER_ROW * marker_rows as f64;
    let (top, height) = (TOP + extra, HEIGHT + extra);
    let plot_h = height - top - BOTTOM;
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
        let max = if axis == Axis::Left {
            left_top
        } else {
            right_top
        };
        top + plot_h * (1.0 - v / max)
    };

    let mut s = String::new();
    let _ = write!(
        s,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
"##
    );
    for (i, line) in title.iter().enumerate() {
        let _ = writeln!(
            s,
            r##"<text class="title" x="{:.1}" y="{:.1}" text-anchor="middle" font-size="15">{}</text>"##,
            WIDTH / 2.0,
            22.0 + TITLE_ROW * i as f64,
            escape(line)
        );
    }
    let notes_from = 22.0 + TITLE_ROW * (title.len() - 1) as f64;
    for (i, line) in notes.iter().enumerate() {
        let _ = writeln!(
            s,
            r##"<text class="note" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            WIDTH / 2.0,
            notes_from + NOTE_ROW * (i + 1) as f64,
            escape(line)
        );
    }

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
        r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>"##
    );
    // Every level gets its tick; a label that would run into the one before it (the capacity
    // chart's class limits fall beside the curve's edges, 30 beside 32) is left out.
    let mut labelled_to = f64::NEG_INFINITY;
    for &x in &c.xs {
        let px = x_of(x);
        let text = number(x);
        let half = LEGEND_CHAR * text.chars().count() as f64 / 2.0;
        let label = if px - half >= labelled_to + X_LABEL_GAP {
            labelled_to = px + half;
            format!(
                r##"<text class="x-label" x="{px:.1}" y="{:.1}" text-anchor="middle">{text}</text>"##,
                top + plot_h + 18.0
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#333"/>{label}"##,
            top + plot_h,
            top + plot_h + 5.0,
        );
    }
    // Axis labels.
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
        LEFT + plot_w / 2.0,
        height - 15.0,
        escape(&c.x_label)
    );
    let mid = top + plot_h / 2.0;
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
    // Markers: a dashed line across the plot, its label in its row above the plot.
    for (m, (row, lx, anchor)) in markers.iter().zip(&placed) {
        let px = x_of(m.x);
        let ly = legend_bottom + 4.0 + MARKER_ROW * (*row + 1) as f64;
        let _ = writeln!(
            s,
            r##"<g class="marker {}"><line x1="{px:.1}" y1="{top:.1}" x2="{px:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="4 3"/><text x="{lx:.1}" y="{ly:.1}" text-anchor="{anchor}">{}</text></g>"##,
            m.class,
            top + plot_h,
            escape(&m.label)
        );
    }

    for (i, series) in c.series.iter().enumerate() {
        let dash = if series.faded {
            format!(r#" stroke-dasharray="{FADED_DASH}""#)
        } else if series.axis == Axis::Right {
            r#" stroke-dasharray="6 3""#.to_string()
        } else {
            String::new()
        };
        let color = if series.faded {
            FADED_COLOR
        } else {
            series.color
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
            color
        );
        for (x, y) in &points {
            let _ = writeln!(
                s,
                r##"<circle class="point {}" cx="{x:.1}" cy="{y:.1}" r="4" fill="{}"/>"##,
                series.class, color
            );
        }
        // Legend entry, in its place of the flow under the title.
        let (lx, ly) = legend[i];
        let _ = writeln!(
            s,
            r##"<g class="legend"><line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/><circle cx="{:.1}" cy="{ly:.1}" r="4" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text></g>"##,
            lx + 24.0,
            color,
            lx + 12.0,
            color,
            lx + LEGEND_SWATCH,
            ly + 4.0,
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

    /// The number after `key="` in `tag`.
    fn attr(tag: &str, key: &str) -> f64 {
        let from = tag.find(&format!(" {key}=\"")).unwrap() + key.len() + 3;
        tag[from..].split('"').next().unwrap().parse().unwrap()
    }

    #[test]
    fn every_legend_entry_lies_inside_the_view_box_without_overlapping_another() {
        let names = [
            "per-request tokens/s",
            "aggregate tokens/s",
            "interactive floor",
            "agent floor",
            "a-class-with-a-long-name floor",
            "now",
        ];
        let chart = Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_left: "y".into(),
            y_right: Some("z".into()),
            xs: vec![1.0, 2.0, 4.0],
            series: names
                .iter()
                .enumerate()
                .map(|(i, n)| Series {
                    name: n.to_string(),
                    class: "s",
                    color: "#000",
                    axis: if i % 2 == 0 { Axis::Left } else { Axis::Right },
                    values: if i % 2 == 0 {
                        vec![Some(1.0), Some(2.0), None]
                    } else {
                        vec![Some(900.0), None, Some(1800.0)]
                    },
                    faded: false,
                })
                .collect(),
            notes: Vec::new(),
            markers: Vec::new(),
        };
        let svg = render(&chart);
        let root = &svg[svg.find("<svg ").unwrap()..];
        let root = &root[..root.find('>').unwrap()];
        let view: Vec<f64> = {
            let from = root.find("viewBox=\"").unwrap() + 9;
            root[from..]
                .split('"')
                .next()
                .unwrap()
                .split(' ')
                .map(|v| v.parse().unwrap())
                .collect()
        };
        let (w, h) = (view[2], view[3]);
        assert_eq!((attr(root, "width"), attr(root, "height")), (w, h));
        let entries: Vec<&str> = svg.split("<g class=\"legend\">").skip(1).collect();
        assert_eq!(entries.len(), names.len(), "{svg}");
        let mut boxes = Vec::new();
        for (entry, name) in entries.iter().zip(names) {
            let line = &entry[entry.find("<line").unwrap()..];
            let text = &entry[entry.find("<text").unwrap()..];
            assert!(text.contains(&format!(">{name}</text>")), "{entry}");
            let (x0, y) = (attr(line, "x1"), attr(text, "y"));
            let x1 = attr(text, "x") + LEGEND_CHAR * name.len() as f64;
            assert!(x0 >= 0.0 && x1 <= w, "{name}: {x0}..{x1} outside 0..{w}");
            // Above the plot's frame, below the title.
            assert!(y > 30.0 && y + 4.0 < attr(root, "height"), "{name}: y {y}");
            boxes.push((x0, x1, y));
        }
        // More than one row was needed, and no two entries of a row overlap.
        let rows: std::collections::BTreeSet<i64> = boxes.iter().map(|b| b.2 as i64).collect();
        assert!(rows.len() >= 2, "{boxes:?}");
        for (i, a) in boxes.iter().enumerate() {
            for b in &boxes[i + 1..] {
                assert!(a.2 != b.2 || a.1 <= b.0 || b.1 <= a.0, "{a:?} {b:?}");
            }
        }
        // The plot keeps its height: its frame starts below the last legend row.
        let frame = &svg[svg.find("<rect x=").unwrap()..];
        let last = boxes.iter().map(|b| b.2).fold(0.0, f64::max);
        let (fy, fh) = (attr(frame, "y"), attr(frame, "height"));
        assert!(fy >= last + 10.0, "{frame}");
        assert_eq!(fh, HEIGHT - TOP - BOTTOM);
        // And every point of either axis lies inside it, the largest on the axis' top or below.
        let mut n = 0;
        for point in svg.split("<circle class=\"point").skip(1) {
            let cy = attr(point, "cy");
            assert!(
                fy <= cy && cy <= fy + fh,
                "cy {cy} outside {fy}..{}",
                fy + fh
            );
            n += 1;
        }
        assert_eq!(n, names.len() * 2);
    }

    #[test]
    fn x_labels_never_run_into_each_other_and_every_level_keeps_its_tick() {
        let xs = vec![
            1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 32.0, 64.0, 80.0, 128.0, 256.0,
        ];
        let chart = Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_left: "y".into(),
            y_right: None,
            series: vec![Series {
                name: "s".into(),
                class: "s",
                color: "#000",
                axis: Axis::Left,
                values: xs.iter().map(|x| Some(*x)).collect(),
                faded: false,
            }],
            xs: xs.clone(),
            notes: Vec::new(),
            markers: Vec::new(),
        };
        let svg = render(&chart);
        let labels: Vec<(f64, String)> = svg
            .split("<text class=\"x-label\"")
            .skip(1)
            .map(|t| {
                let text = t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()].to_string();
                (attr(t, "x"), text)
            })
            .collect();
        for pair in labels.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let room = LEGEND_CHAR * (a.1.len() + b.1.len()) as f64 / 2.0;
            assert!(b.0 - a.0 >= room + X_LABEL_GAP, "{a:?} runs into {b:?}");
        }
        // 30 and 32 are 2 px apart here: one of them is labelled; the ends always are.
        let texts: Vec<&str> = labels.iter().map(|l| l.1.as_str()).collect();
        assert!(texts.contains(&"1") && texts.contains(&"30"), "{texts:?}");
        assert!(!texts.contains(&"32"), "{texts:?}");
        // Every level keeps its tick.
        let ticks = svg
            .lines()
            .filter(|l| l.starts_with("<line") && l.contains("stroke=\"#333\""))
            .count();
        assert_eq!(ticks, xs.len(), "{svg}");
    }

    #[test]
    fn markers_labels_take_rows_of_their_own_and_never_meet() {
        let xs = vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
        let labels = [
            (28.0, "agent: max 28 (tokens_per_second binds)"),
            (30.0, "interactive: max 30 (ttft binds)"),
            (32.0, "batch: max 32 (kv_cache binds)"),
            (2.0, "tiny: max 2 (max_num_seqs binds)"),
            (250.0, "wide: max 250 (ttft binds)"),
        ];
        let chart = Chart {
            title: "A title long enough to be wrapped onto a second line, because it states why the chart is not to be trusted".into(),
            notes: vec!["a note".into()],
            x_label: "x".into(),
            y_left: "y".into(),
            y_right: None,
            series: vec![Series {
                name: "s".into(),
                class: "s",
                color: "#000",
                axis: Axis::Left,
                values: xs.iter().map(|x| Some(*x)).collect(),
                faded: true,
            }],
            xs,
            markers: labels
                .iter()
                .map(|(x, l)| Marker {
                    x: *x,
                    label: l.to_string(),
                    class: "limit",
                })
                .collect(),
        };
        let svg = render(&chart);
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let num = |n: roxmltree::Node, k: &str| -> f64 { n.attribute(k).unwrap().parse().unwrap() };
        let frame = doc
            .descendants()
            .find(|n| n.has_tag_name("rect") && n.attribute("stroke") == Some("#333"))
            .unwrap();
        let top = num(frame, "y");
        assert_eq!(
            num(frame, "height"),
            HEIGHT - TOP - BOTTOM,
            "the plot keeps its size"
        );
        let legend_y = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("legend"))
            .flat_map(|g| g.descendants().filter(|t| t.has_tag_name("text")))
            .map(|t| num(t, "y"))
            .fold(0.0, f64::max);
        let mut boxes = Vec::new();
        for g in doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("marker limit"))
        {
            let line = g.descendants().find(|n| n.has_tag_name("line")).unwrap();
            let text = g.descendants().find(|n| n.has_tag_name("text")).unwrap();
            let (x, y) = (num(text, "x"), num(text, "y"));
            let w = LEGEND_CHAR * text.text().unwrap().chars().count() as f64;
            let x0 = if text.attribute("text-anchor") == Some("end") {
                x - w
            } else {
                x
            };
            assert!(
                x0 >= 0.0 && x0 + w <= WIDTH,
                "{x0}..{} outside the chart",
                x0 + w
            );
            // Under the legend, above the plot; the line spans the plot.
            assert!(
                y - 12.0 >= legend_y + 4.0 && y + 4.0 <= top,
                "y {y}: legend {legend_y}, plot {top}"
            );
            assert_eq!(num(line, "y1"), top);
            // Beside its own line.
            let lx = num(line, "x1");
            assert!((x - lx).abs() <= 4.01, "{x} is not beside {lx}");
            boxes.push((x0, x0 + w, y));
        }
        assert_eq!(boxes.len(), labels.len());
        for (i, a) in boxes.iter().enumerate() {
            for b in &boxes[i + 1..] {
                assert!(a.2 != b.2 || a.1 <= b.0 || b.1 <= a.0, "{a:?} meets {b:?}");
            }
        }
        // 28, 30 and 32 lie a few pixels apart: a row each (250's label, before its line,
        // spans them all and takes a fourth); 2's fits beside 28's.
        let rows: std::collections::BTreeSet<i64> = boxes.iter().map(|b| b.2 as i64).collect();
        assert_eq!(rows.len(), 4, "{boxes:?}");
        // The title took two lines, and the note its own under them, above the legend.
        let title: Vec<f64> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("title"))
            .map(|t| num(t, "y"))
            .collect();
        assert_eq!(title.len(), 2);
        let note = doc
            .descendants()
            .find(|n| n.attribute("class") == Some("note"))
            .unwrap();
        assert!(title[1] < num(note, "y") && num(note, "y") + 4.0 < legend_y - 12.0);
        // A faded series is grey and dashed.
        assert!(
            svg.contains(&format!(
                r#"stroke="{FADED_COLOR}" stroke-width="2" stroke-dasharray="{FADED_DASH}""#
            )),
            "{svg}"
        );
    }

    #[test]
    fn wrapping_breaks_at_spaces_within_the_width() {
        assert_eq!(wrap("one two three", 7), ["one two", "three"]);
        assert_eq!(wrap("", 7), [""]);
        assert_eq!(wrap("unbreakable-word x", 4), ["unbreakable-word", "x"]);
    }

    #[test]
    fn a_legend_that_fits_in_one_row_keeps_the_chart_as_it_was() {
        let layout = legend_layout(&["p50", "p99"], 0.0);
        assert_eq!(layout.len(), 2);
        assert!(layout.iter().all(|(_, y)| *y == LEGEND_Y));
    }

    #[test]
    fn labels_are_escaped_and_numbers_short() {
        assert_eq!(escape(r#"a<b & "c""#), "a&lt;b &amp; &quot;c&quot;");
        assert_eq!(number(256.0), "256");
        assert_eq!(number(0.25), "0.25");
    }
}
