//! The text exposition read back into samples, so the page's figures come from exactly what
//! `/metrics` says.
//!
//! Only what tokenmeter's own encoder writes needs reading: `name{k="v",...} value` lines,
//! `# HELP`/`# TYPE` comments (skipped), escaped label values. A line that does not parse is
//! skipped, never an error: the exposition is ours, and a page must not fail for one odd line.

/// One sample line: the series name (with `_bucket`, `_sum`, `_count` kept), its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
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
}

/// Every sample of a text exposition, in order.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
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
        let key = rest[..eq].trim().to_string();
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
        pairs.push((key, value));
        rest = quoted[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_labels_escapes_and_infinities() {
        let text = "# HELP x y\n# TYPE x counter\nx 3\n\
                    h_bucket{model=\"a \\\"b\\\", {c}\",le=\"+Inf\"} 7\n\
                    garbage{\n";
        let s = parse(text);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].name.as_str(), s[0].value), ("x", 3.0));
        assert_eq!(s[1].label("model"), Some("a \"b\", {c}"));
        assert_eq!(s[1].label("le").map(parse_value), Some(Some(f64::INFINITY)));
        assert_eq!(s[1].value, 7.0);
    }
}
