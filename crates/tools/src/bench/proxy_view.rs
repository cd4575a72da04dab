//! The proxy's side of the story: with `--proxy-metrics URL`, tokenmeter's `/metrics` is scraped
//! before and after each level, and the difference is printed next to the client's figures, so
//! any disagreement between what the client saw and what the proxy measured is visible.
//!
//! This module reads metric names; it does not define them (that is `tokenmeter::metrics`'s job, and
//! the integration tests check these names against a live proxy's exposition). Every series of
//! a family is summed over its labels: the bench assumes it is the proxy's only client while it
//! runs. The proxy's TTFT median comes from its histogram buckets by linear interpolation, as
//! PromQL's `histogram_quantile` does, so it is only as fine as the buckets; the bucket holding it
//! is reported as its resolution. To compare like with like, the client's own TTFT samples are
//! put into the same buckets and read the same way: the two medians then differ only by what was
//! measured, not by how a median is estimated (a histogram's median is the ⌈n/2⌉-th value's
//! bucket, while the client's exact p50 of an even count averages the two middle values, which
//! can be far apart when some requests queued and others did not). The mean (`_sum / _count`)
//! is exact and is reported too.

use serde::Serialize;

use crate::scrape::{self, ScrapeError};
use tokenmeter::exposition::Scrape;
use tokenmeter::quantile::histogram_quantile;

// BUILD_INFO is in every tokenmeter exposition, even before the first request: what tells a
// tokenmeter from another server.
use tokenmeter::metrics::names::{
    BUILD_INFO, OUTPUT_TOKENS_TOTAL as OUTPUT_TOKENS, REQUESTS_TOTAL as REQUESTS,
    TIME_TO_FIRST_TOKEN_SECONDS as TTFT,
};

/// Why the proxy's metrics could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProxyViewError {
    #[error("--proxy-metrics {0:?} is not an http:// URL")]
    BadUrl(String),
    #[error(transparent)]
    Fetch(ScrapeError),
    #[error("{url} is not tokenmeter's /metrics (no {BUILD_INFO})")]
    NotTokenmeter { url: String },
}

/// The families the comparison needs, each summed over its label sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProxyTotals {
    /// Cumulative TTFT bucket counts by upper bound (`+Inf` last), ascending.
    pub ttft_buckets: Vec<(f64, f64)>,
    pub ttft_sum: f64,
    pub ttft_count: f64,
    pub output_tokens: f64,
    pub requests: f64,
}

impl ProxyTotals {
    /// Reads a Prometheus text exposition; `None` when it is not tokenmeter's.
    pub fn parse(text: &str) -> Option<ProxyTotals> {
        ProxyTotals::from_scrape(&Scrape::parse(text))
    }

    /// Reads a parsed exposition; `None` when it is not tokenmeter's.
    pub fn from_scrape(scrape: &Scrape) -> Option<ProxyTotals> {
        if !scrape.contains(BUILD_INFO) {
            return None;
        }
        Some(ProxyTotals {
            ttft_buckets: scrape.buckets(TTFT, &[]),
            ttft_sum: scrape.sum(&format!("{TTFT}_sum"), &[]),
            ttft_count: scrape.sum(&format!("{TTFT}_count"), &[]),
            output_tokens: scrape.sum(OUTPUT_TOKENS, &[]),
            requests: scrape.sum(REQUESTS, &[]),
        })
    }
}

/// What the proxy measured during one level.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProxyLevel {
    pub requests: u64,
    pub output_tokens: u64,
    pub ttft_mean: Option<f64>,
    /// Interpolated from the buckets.
    pub ttft_p50: Option<f64>,
    /// The bounds of the bucket that holds the median: the estimate's resolution.
    pub ttft_p50_bucket: Option<(f64, f64)>,
    /// The client's TTFT samples of the level put into the proxy's buckets, and their median
    /// read exactly as the proxy's is: the figure to compare `ttft_p50` with.
    pub client_ttft_p50_binned: Option<f64>,
}

/// What happened between two scrapes, next to the client's TTFT samples (seconds) of the level.
pub fn delta(before: &ProxyTotals, after: &ProxyTotals, client_ttft: &[f64]) -> ProxyLevel {
    let buckets: Vec<(f64, f64)> = after
        .ttft_buckets
        .iter()
        .map(|&(le, c)| {
            let prev = before
                .ttft_buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |p| p.1);
            (le, c - prev)
        })
        .collect();
    let count = after.ttft_count - before.ttft_count;
    let p50 = histogram_quantile(0.5, &buckets);
    ProxyLevel {
        requests: (after.requests - before.requests).max(0.0).round() as u64,
        output_tokens: (after.output_tokens - before.output_tokens)
            .max(0.0)
            .round() as u64,
        ttft_mean: (count > 0.0).then(|| (after.ttft_sum - before.ttft_sum) / count),
        ttft_p50: p50.map(|p| p.0),
        ttft_p50_bucket: p50.map(|p| p.1),
        client_ttft_p50_binned: histogram_quantile(0.5, &bin(client_ttft, &buckets)).map(|p| p.0),
    }
}

/// A cumulative histogram of `samples` over the upper bounds of `like`.
pub fn bin(samples: &[f64], like: &[(f64, f64)]) -> Vec<(f64, f64)> {
    like.iter()
        .map(|&(le, _)| (le, samples.iter().filter(|&&x| x <= le).count() as f64))
        .collect()
}

/// Scrapes the proxy's `/metrics` (through [`crate::scrape`]) into [`ProxyTotals`].
pub struct TotalsScraper(scrape::Scraper);

impl TotalsScraper {
    pub fn new(url: &str) -> Result<TotalsScraper, ProxyViewError> {
        scrape::Scraper::new(url)
            .map(TotalsScraper)
            .map_err(|e| match e {
                ScrapeError::BadUrl(u) => ProxyViewError::BadUrl(u),
                other => ProxyViewError::Fetch(other),
            })
    }

    pub async fn totals(&self) -> Result<ProxyTotals, ProxyViewError> {
        let page = self.0.get().await.map_err(ProxyViewError::Fetch)?;
        ProxyTotals::from_scrape(&page).ok_or_else(|| ProxyViewError::NotTokenmeter {
            url: self.0.url().to_string(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;

    const BEFORE: &str = r#"# HELP tokenmeter_build_info x
tokenmeter_build_info{version="0.1.0"} 1
tokenmeter_output_tokens_total{model="a"} 100
tokenmeter_requests_total{code="200",model="a",outcome="complete"} 2
tokenmeter_time_to_first_token_seconds_bucket{model="a",le="0.1"} 1
tokenmeter_time_to_first_token_seconds_bucket{model="a",le="0.2"} 2
tokenmeter_time_to_first_token_seconds_bucket{model="a",le="+Inf"} 2
tokenmeter_time_to_first_token_seconds_sum{model="a"} 0.25
tokenmeter_time_to_first_token_seconds_count{model="a"} 2
"#;

    #[test]
    fn labels_with_escapes_and_sums_over_series() {
        let after = format!(
            "{BEFORE}{}",
            r#"tokenmeter_output_tokens_total{model="b \"q\" {x=1}, y"} 50
tokenmeter_requests_total{code="200",model="b \"q\" {x=1}, y",outcome="complete"} 4
tokenmeter_time_to_first_token_seconds_bucket{model="b \"q\" {x=1}, y",le="0.1"} 0
tokenmeter_time_to_first_token_seconds_bucket{model="b \"q\" {x=1}, y",le="0.2"} 4
tokenmeter_time_to_first_token_seconds_bucket{model="b \"q\" {x=1}, y",le="+Inf"} 4
tokenmeter_time_to_first_token_seconds_sum{model="b \"q\" {x=1}, y"} 0.6
tokenmeter_time_to_first_token_seconds_count{model="b \"q\" {x=1}, y"} 4
"#
        );
        let a = ProxyTotals::parse(BEFORE).unwrap();
        let b = ProxyTotals::parse(&after).unwrap();
        assert_eq!(
            b.ttft_buckets,
            [(0.1, 1.0), (0.2, 6.0), (f64::INFINITY, 6.0)]
        );
        let d = delta(&a, &b, &[0.15, 0.19, 0.3, 0.12]);
        assert_eq!((d.requests, d.output_tokens), (4, 50));
        // Client: 3 of 4 in (0.1, 0.2], none below: rank 2 is two thirds into that bucket.
        let binned = d.client_ttft_p50_binned.unwrap();
        assert!((binned - (0.1 + 0.1 * 2.0 / 3.0)).abs() < 1e-12, "{binned}");
        assert!((d.ttft_mean.unwrap() - 0.15).abs() < 1e-12);
        // All four new observations lie in (0.1, 0.2]: rank 2 of 4 is half way.
        assert!((d.ttft_p50.unwrap() - 0.15).abs() < 1e-12);
        assert_eq!(d.ttft_p50_bucket, Some((0.1, 0.2)));
    }

    #[test]
    fn not_tokenmeter_is_refused() {
        assert_eq!(ProxyTotals::parse("up 1\n"), None);
    }

    #[test]
    fn binning_matches_the_proxy_reading() {
        let like = [(0.1, 0.0), (0.2, 0.0), (f64::INFINITY, 0.0)];
        let h = bin(&[0.05, 0.1, 0.15, 0.5], &like);
        assert_eq!(h, [(0.1, 2.0), (0.2, 3.0), (f64::INFINITY, 4.0)]);
        // A bimodal level: a histogram median is the 2nd value's bucket, not the mean of the
        // middle two (which would be ~0.3).
        let h = bin(
            &[0.01, 0.02, 0.6, 0.6],
            &[(0.05, 0.0), (1.0, 0.0), (f64::INFINITY, 0.0)],
        );
        assert_eq!(histogram_quantile(0.5, &h).map(|p| p.0), Some(0.05));
    }
}
