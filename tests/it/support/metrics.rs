//! Reading values out of a Prometheus text exposition, with failures that print the scrape.

/// Selects one sample: `metric("name").label("k", "v").value(&scrape)`.
pub struct MetricMatch {
    name: String,
    labels: Vec<(String, String)>,
}

pub fn metric(name: &str) -> MetricMatch {
    MetricMatch {
        name: name.to_string(),
        labels: Vec::new(),
    }
}

impl MetricMatch {
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.push((k.to_string(), v.to_string()));
        self
    }

    /// The sum of all samples of this name whose labels include the given ones.
    pub fn sum(&self, scrape: &str) -> f64 {
        self.samples(scrape).iter().sum()
    }

    /// The one value, panicking with the scrape when it is missing.
    pub fn value(&self, scrape: &str) -> f64 {
        let s = self.samples(scrape);
        assert!(
            !s.is_empty(),
            "no sample {}{:?} in scrape:\n{scrape}",
            self.name,
            self.labels
        );
        s.iter().sum()
    }

    fn samples(&self, scrape: &str) -> Vec<f64> {
        scrape
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (head, value) = l.rsplit_once(' ')?;
                let (name, labels) = match head.split_once('{') {
                    Some((n, rest)) => (n, rest.trim_end_matches('}')),
                    None => (head, ""),
                };
                if name != self.name {
                    return None;
                }
                let ok = self
                    .labels
                    .iter()
                    .all(|(k, v)| labels.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
                ok.then(|| value.parse::<f64>().ok()).flatten()
            })
            .collect()
    }
}

/// Estimates a quantile from a histogram's cumulative buckets (as PromQL's histogram_quantile).
pub fn histogram_quantile(q: f64, name: &str, labels: &[(&str, &str)], scrape: &str) -> f64 {
    let mut buckets: Vec<(f64, f64)> = scrape
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let v: f64 = l.rsplit_once(' ')?.1.parse().ok()?;
            Some((le, v))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    assert!(
        total > 0.0,
        "no observations in {name}{labels:?}:\n{scrape}"
    );
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in &buckets {
        if c >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            return prev.0 + (le - prev.0) * (rank - prev.1) / (c - prev.1).max(f64::MIN_POSITIVE);
        }
        prev = (le, c);
    }
    prev.0
}
