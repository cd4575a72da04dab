//! Assertions on a live proxy's `/metrics`, with failures that print the scrape. The text is
//! read by the library's own exposition reader ([`tokenmeter::exposition`]), the one the tools
//! use, so the tests and the tools agree on what a scrape says.
//!
//! A read requires its family to be in the scrape: a check that a gauge went back to 0 must
//! fail when the gauge is renamed or never registered, not read the missing series as 0. Where
//! a test means "absent or zero" (a counter whose first series has not been made yet), it says
//! so with [`MetricMatch::sum_or_zero_if_absent`].

use tokenmeter::exposition::Scrape;
use tokenmeter::quantile::histogram_quantile;

/// Selects samples by name and labels (a failed read points at the test's line, not here:
/// the reads are `#[track_caller]`): `metric(names::X).label("k", "v").value(&scrape)`.
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

/// The suffixes of a histogram's or summary's samples, after the family name.
const SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

/// The family names a scrape declares (its `# TYPE` lines), in order.
pub fn families(scrape: &str) -> Vec<&str> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect()
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

    /// True when the scrape has this name's family: its `# TYPE` line (the name itself, or the
    /// histogram whose `_bucket`, `_sum` or `_count` it is) or at least one sample so named.
    pub fn is_present(&self, scrape: &str) -> bool {
        let declared = families(scrape);
        let family = SUFFIXES
            .iter()
            .find_map(|s| self.name.strip_suffix(s))
            .filter(|f| declared.contains(f));
        declared.contains(&self.name.as_str())
            || family.is_some()
            || Scrape::parse(scrape).contains(&self.name)
    }

    /// True when the scrape has no such family: for a test that means "never made".
    pub fn is_absent(&self, scrape: &str) -> bool {
        !self.is_present(scrape)
    }

    /// Panics, naming the family and listing those the scrape has, unless it is present.
    #[track_caller]
    fn require(&self, scrape: &str) {
        assert!(
            self.is_present(scrape),
            "no family {} in the scrape; it has: {:?}",
            self.name,
            families(scrape)
        );
    }

    /// The sum of all samples of this name whose labels include the given ones: 0 if the family
    /// has none of them; a panic if the scrape has no such family at all.
    #[track_caller]
    pub fn sum(&self, scrape: &str) -> f64 {
        self.require(scrape);
        Scrape::parse(scrape).sum(&self.name, &self.pairs())
    }

    /// As [`MetricMatch::sum`], but 0 when the family is absent too: for a counter or histogram
    /// whose first series is made by the first event it counts, where "none yet" is the meaning.
    pub fn sum_or_zero_if_absent(&self, scrape: &str) -> f64 {
        Scrape::parse(scrape).sum(&self.name, &self.pairs())
    }

    /// The sum of the selected samples, panicking with the scrape when there is none.
    #[track_caller]
    pub fn value(&self, scrape: &str) -> f64 {
        self.require(scrape);
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
    #[track_caller]
    pub fn quantile(&self, q: f64, scrape: &str) -> f64 {
        self.require(scrape);
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
