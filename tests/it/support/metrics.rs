//! Assertions on a live proxy's `/metrics`, with failures that print the scrape. The text is
//! read by the library's own exposition reader ([`tokenmeter_tools::exposition`]), the one the bench
//! uses, so the tests and the tools agree on what a scrape says.

use tokenmeter::quantile::histogram_quantile;
use tokenmeter_tools::exposition::Scrape;

/// Selects samples by name and labels: `metric("name").label("k", "v").value(&scrape)`.
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

    fn pairs(&self) -> Vec<(&str, &str)> {
        self.labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// The sum of all samples of this name whose labels include the given ones (0 if none).
    pub fn sum(&self, scrape: &str) -> f64 {
        Scrape::parse(scrape).sum(&self.name, &self.pairs())
    }

    /// The sum of the selected samples, panicking with the scrape when there is none.
    pub fn value(&self, scrape: &str) -> f64 {
        let parsed = Scrape::parse(scrape);
        let pairs = self.pairs();
        assert!(
            parsed.select(&self.name, &pairs).next().is_some(),
            "no sample {}{:?} in scrape:\n{scrape}",
            self.name,
            self.labels
        );
        parsed.sum(&self.name, &pairs)
    }

    /// The `q`-quantile of this histogram (name without `_bucket`) over the selected series, as
    /// PromQL's `histogram_quantile` reads it; panics with the scrape when it has no observation.
    pub fn quantile(&self, q: f64, scrape: &str) -> f64 {
        let buckets = Scrape::parse(scrape).buckets(&self.name, &self.pairs());
        match histogram_quantile(q, &buckets) {
            Some((v, _)) => v,
            None => panic!(
                "no observations in {}{:?}:\n{scrape}",
                self.name, self.labels
            ),
        }
    }
}
