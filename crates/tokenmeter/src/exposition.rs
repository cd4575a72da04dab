//! Reading a Prometheus text exposition (what `/metrics` serves) back into samples.
//!
//! The product writes its own exposition with the `prometheus` crate; it reads one to learn
//! what the engine behind it says of itself (`--engine-metrics`: [`crate::engine`]). The tools
//! read tokenmeter's own (`bench --proxy-metrics`, `tokenmeter capacity`, the integration
//! tests). All go through this module, so there is one reading of the format (label escapes,
//! `+Inf`, comments, timestamps) and not one per caller.
//!
//! The API is three things: [`Scrape::parse`] turns the text into [`Sample`]s (name, labels,
//! value), [`Scrape::select`] / [`Scrape::sum`] / [`Scrape::buckets`] pick series by name and a
//! subset of labels, and [`crate::quantile::histogram_quantile`] (the product's, which the page uses too) reads a quantile out of cumulative buckets the way PromQL's `histogram_quantile` does. Bad input is never an error: a line that is not a
//! sample is counted in [`Scrape::skipped`] and the rest is read.
//!
//! It knows no metric name: callers bring the names (the product's live in `crate::metrics`).

/// One sample line: `name{label="value",...} value [timestamp]` (the timestamp is dropped).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name as written, with any `_bucket` / `_sum` / `_count` suffix.
    pub name: String,
    /// Label pairs in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// True when the sample is named `name` and has every pair of `labels` (it may have more).
    pub fn matches(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.name == name && labels.iter().all(|(k, v)| self.label(k) == Some(*v))
    }
}

/// A parsed exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    samples: Vec<Sample>,
    skipped: usize,
}

impl Scrape {
    /// Reads an exposition. Comments (`# HELP`, `# TYPE`, `# EOF`) and blank lines are ignored;
    /// any other line that is not a sample is skipped and counted.
    pub fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match parse_line(line) {
                Some(s) => scrape.samples.push(s),
                None => scrape.skipped += 1,
            }
        }
        scrape
    }

    /// Every sample, in the order of the text.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// Lines that were neither a comment nor a well-formed sample.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// True when any sample is named `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// The samples named `name` that carry every pair of `labels`.
    pub fn select<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.matches(name, labels))
    }

    /// The sum of the selected samples' values (0 when none is selected).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.select(name, labels).map(|s| s.value).sum()
    }

    /// The sum of the samples an instant-vector selector picks: `name` or
    /// `name{label="value",...}` (equality matchers only; the samples may carry more labels).
    /// A selector that does not parse selects nothing. Tests and small tools name a series this
    /// way, as they would in PromQL.
    pub fn sum_of(&self, selector: &str) -> f64 {
        let Some(want) = parse_line(&format!("{} 0", selector.trim())) else {
            return 0.0;
        };
        let labels: Vec<(&str, &str)> = want
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.sum(&want.name, &labels)
    }

    /// The cumulative buckets of histogram `histogram` (its name without `_bucket`) over the
    /// series that carry `labels`, summed per upper bound: `(le, count)`, ascending, `+Inf` last.
    pub fn buckets(&self, histogram: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let name = format!("{histogram}_bucket");
        let mut out: Vec<(f64, f64)> = Vec::new();
        for s in self.select(&name, labels) {
            let Some(le) = s.label("le").and_then(parse_value) else {
                continue;
            };
            match out.iter_mut().find(|(b, _)| *b == le) {
                Some((_, c)) => *c += s.value,
                None => out.push((le, s.value)),
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// Parses one trimmed, non-comment line; `None` when it is malformed.
fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (pairs, after) = split_labels(inner)?;
        labels = pairs;
        rest = after;
    }
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Splits `k="v",k2="v2"}` into unescaped pairs and the text after the closing brace.
fn split_labels(s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut pairs = Vec::new();
    let mut rest = s.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Some((pairs, after));
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim();
        if key.is_empty() {
            return None;
        }
        let quoted = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        pairs.push((key.to_string(), value));
        rest = quoted[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
}

/// A sample value or an `le` bound: a float, `+Inf`, `-Inf` or `NaN`.
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP tokenmeter_requests_total Requests.
# TYPE tokenmeter_requests_total counter
tokenmeter_requests_total{code="200",model="a",outcome="complete"} 2
tokenmeter_requests_total{code="200",model="b \"q\" {x=1}, y\\z\nw",outcome="complete"} 4
tokenmeter_requests_total{code="502",model="a",outcome="upstream_error"} 1 1700000000000
tokenmeter_build_info{version="0.1.0"} 1
up 1
ttft_bucket{model="a",le="0.1"} 1
ttft_bucket{model="a",le="+Inf"} 2
ttft_bucket{model="b",le="0.1"} 3
ttft_bucket{model="b",le="+Inf"} 3
"#;

    #[test]
    fn samples_have_names_unescaped_labels_and_values() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.samples().len(), 9);
        assert_eq!(s.skipped(), 0);
        let b = &s.samples()[1];
        assert_eq!(b.name, "tokenmeter_requests_total");
        assert_eq!(b.label("model"), Some("b \"q\" {x=1}, y\\z\nw"));
        assert_eq!(b.label("outcome"), Some("complete"));
        assert_eq!(b.value, 4.0);
        // A timestamp after the value is not the value.
        assert_eq!(s.samples()[2].value, 1.0);
        assert_eq!(s.samples()[4].labels, []);
    }

    #[test]
    fn select_and_sum_by_name_and_a_subset_of_labels() {
        let s = Scrape::parse(TEXT);
        let total = "tokenmeter_requests_total";
        assert_eq!(s.sum(total, &[]), 7.0);
        assert_eq!(s.sum(total, &[("outcome", "complete")]), 6.0);
        assert_eq!(s.sum(total, &[("model", "a"), ("code", "502")]), 1.0);
        assert_eq!(s.sum(total, &[("model", "c")]), 0.0);
        assert_eq!(s.select(total, &[("code", "200")]).count(), 2);
        // A name is matched whole, never as a prefix.
        assert_eq!(s.sum("tokenmeter_requests", &[]), 0.0);
        assert!(s.contains("tokenmeter_build_info"));
        assert!(!s.contains("tokenmeter_build"));
    }

    #[test]
    fn a_selector_sums_what_promql_would_select() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.sum_of("tokenmeter_requests_total"), 7.0);
        assert_eq!(
            s.sum_of("tokenmeter_requests_total{outcome=\"complete\"}"),
            6.0
        );
        assert_eq!(
            s.sum_of("tokenmeter_requests_total{model=\"a\",code=\"502\"}"),
            1.0
        );
        assert_eq!(s.sum_of("tokenmeter_requests"), 0.0);
        assert_eq!(s.sum_of("tokenmeter_requests_total{model=}"), 0.0);
    }

    #[test]
    fn buckets_are_summed_per_bound_and_sorted() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.buckets("ttft", &[]), [(0.1, 4.0), (f64::INFINITY, 5.0)]);
        assert_eq!(
            s.buckets("ttft", &[("model", "a")]),
            [(0.1, 1.0), (f64::INFINITY, 2.0)]
        );
        assert_eq!(s.buckets("nothing", &[]), []);
    }

    #[test]
    fn malformed_lines_are_counted_not_fatal() {
        let s = Scrape::parse(
            "a 1\nb{x=\"1\" 2\nc{x=1} 3\nd\n{x=\"1\"} 4\ne not-a-number\nf{=\"v\"} 5\ng{k=\"v\"} 6\n",
        );
        let names: Vec<&str> = s.samples().iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["a", "g"]);
        assert_eq!(s.skipped(), 6);
        assert_eq!(Scrape::parse(""), Scrape::default());
    }

    #[test]
    fn special_values() {
        let s = Scrape::parse("a +Inf\nb -Inf\nc NaN\nd 1e-3\n");
        let v: Vec<f64> = s.samples().iter().map(|x| x.value).collect();
        assert_eq!(v[..2], [f64::INFINITY, f64::NEG_INFINITY]);
        assert!(v[2].is_nan());
        assert_eq!(v[3], 0.001);
    }
}
