//! The figures the command prints: GPU-seconds by tenant and model, split into prefill and
//! decode, with the output tokens and dollars beside them, and idle and in flight.
//!
//! Kept apart from where they come from (two scrapes of one tokenmeter here) and from how they
//! are printed ([`super::format`]), so every source fills the same [`Split`] and every format
//! reads it.

use std::collections::BTreeMap;

use tokenmeter::exposition::{Sample, Scrape};
use tokenmeter::metrics::names::cost as names;
use tokenmeter::metrics::names::{GPUS, GPU_HOUR_COST, OUTPUT_TOKENS_TOTAL};

/// One row: a tenant's use of one model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Row {
    pub prefill: f64,
    pub decode: f64,
    pub output_tokens: f64,
    pub usage_usd: f64,
    pub allocation_usd: f64,
}

/// The split over the window, from the counters' differences.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Split {
    /// By (tenant, model); the tenant is `all` without the label.
    pub rows: BTreeMap<(String, String), Row>,
    pub idle: f64,
    /// Busy time held by the requests in flight at the end.
    pub unassigned: f64,
    /// The GPUs at the end, where one source states them (a store's fleet changes over a range).
    pub gpus: Option<f64>,
    /// True when dollars were counted (`--gpu-hour-cost`); else the USD figures are not shown.
    pub usd: bool,
}

/// The row key of a sample: its tenant (`all` without the label) and model.
fn key(s: &Sample) -> (String, String) {
    (
        s.label("tenant").unwrap_or("all").to_owned(),
        s.label("model").unwrap_or("").to_owned(),
    )
}

impl Split {
    /// The difference of `after` and `before` (an empty scrape: since the start).
    pub fn between(before: &Scrape, after: &Scrape) -> Split {
        let mut rows: BTreeMap<(String, String), Row> = BTreeMap::new();
        for (scrape, sign) in [(after, 1.0), (before, -1.0)] {
            for s in scrape.samples() {
                let field: Option<fn(&mut Row) -> &mut f64> =
                    match (s.name.as_str(), s.label("phase"), s.label("basis")) {
                        (names::GPU_SECONDS, Some("prefill"), _) => Some(|r| &mut r.prefill),
                        (names::GPU_SECONDS, Some("decode"), _) => Some(|r| &mut r.decode),
                        (names::GPU_COST_USD, _, Some("usage")) => Some(|r| &mut r.usage_usd),
                        (names::GPU_COST_USD, _, Some("allocation")) => {
                            Some(|r| &mut r.allocation_usd)
                        }
                        (OUTPUT_TOKENS_TOTAL, _, _) => Some(|r| &mut r.output_tokens),
                        _ => None,
                    };
                if let Some(f) = field {
                    *f(rows.entry(key(s)).or_default()) += sign * s.value;
                }
            }
        }
        rows.retain(|_, r| r.prefill + r.decode > 0.0);
        Split {
            rows,
            idle: after.sum(names::GPU_IDLE_SECONDS, &[])
                - before.sum(names::GPU_IDLE_SECONDS, &[]),
            unassigned: after.sum(names::GPU_UNASSIGNED_SECONDS, &[]),
            gpus: Some(after.sum(GPUS, &[])),
            usd: after.contains(GPU_HOUR_COST),
        }
    }

    /// GPU-seconds charged to the rows.
    pub fn charged(&self) -> f64 {
        // A fold from 0, not `sum`, whose sum of nothing is -0.0.
        self.rows
            .values()
            .fold(0.0, |t, r| t + r.prefill + r.decode)
    }

    /// A row's (or the total's) share of all the GPU time: charged and idle.
    pub fn share(&self, gpu_seconds: f64) -> f64 {
        let total = self.charged() + self.idle;
        if total > 0.0 {
            gpu_seconds / total
        } else {
            0.0
        }
    }

    /// Every row added up.
    pub fn totals(&self) -> Row {
        self.rows.values().fold(Row::default(), |t, r| Row {
            prefill: t.prefill + r.prefill,
            decode: t.decode + r.decode,
            output_tokens: t.output_tokens + r.output_tokens,
            usage_usd: t.usage_usd + r.usage_usd,
            allocation_usd: t.allocation_usd + r.allocation_usd,
        })
    }
}

impl Row {
    /// Prefill and decode.
    pub fn gpu_seconds(&self) -> f64 {
        self.prefill + self.decode
    }

    /// GPU-seconds per million output tokens; none without output tokens.
    pub fn per_million(&self) -> Option<f64> {
        (self.output_tokens > 0.0).then(|| self.gpu_seconds() / self.output_tokens * 1e6)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const BEFORE: &str = "\
tokenmeter_gpus{source=\"flag\"} 2
tokenmeter_gpu_seconds_total{model=\"m\",phase=\"prefill\",tenant=\"a\"} 1
tokenmeter_gpu_seconds_total{model=\"m\",phase=\"decode\",tenant=\"a\"} 2
tokenmeter_gpu_idle_seconds_total 10
tokenmeter_output_tokens_total{model=\"m\",tenant=\"a\"} 1000
";
    pub(crate) const AFTER: &str = "\
tokenmeter_gpus{source=\"flag\"} 2
tokenmeter_gpu_seconds_total{model=\"m\",phase=\"prefill\",tenant=\"a\"} 4
tokenmeter_gpu_seconds_total{model=\"m\",phase=\"decode\",tenant=\"a\"} 8
tokenmeter_gpu_seconds_total{model=\"m\",phase=\"decode\",tenant=\"b\"} 3
tokenmeter_gpu_idle_seconds_total 15
tokenmeter_gpu_unassigned_seconds 0.5
tokenmeter_output_tokens_total{model=\"m\",tenant=\"a\"} 4000
tokenmeter_output_tokens_total{model=\"m\",tenant=\"b\"} 1000
";

    /// The split of the two pages above.
    pub(crate) fn sample() -> Split {
        Split::between(&Scrape::parse(BEFORE), &Scrape::parse(AFTER))
    }

    #[test]
    fn the_split_is_the_counters_difference() {
        let s = sample();
        let a = s.rows[&("a".to_string(), "m".to_string())];
        assert_eq!((a.prefill, a.decode, a.output_tokens), (3.0, 6.0, 3000.0));
        let b = s.rows[&("b".to_string(), "m".to_string())];
        assert_eq!((b.decode, b.output_tokens), (3.0, 1000.0));
        assert_eq!((s.idle, s.unassigned, s.gpus), (5.0, 0.5, Some(2.0)));
        assert!(!s.usd, "no tokenmeter_gpu_hour_cost, no dollars");
        // 9 + 3 charged, 5 idle.
        assert_eq!((s.charged(), s.share(5.0)), (12.0, 5.0 / 17.0));
        let t = s.totals();
        assert_eq!((t.gpu_seconds(), t.output_tokens), (12.0, 4000.0));
        assert_eq!(a.per_million(), Some(3000.0));
        assert_eq!(Row::default().per_million(), None);
    }
}
