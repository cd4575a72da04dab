//! The engine's own view, as its metrics state it (`--engine-metrics`); the families' names
//! are in [`super::names::engine_view`].
//!
//! Refreshed from [`crate::engine::observed::Observed`] when `/metrics` is rendered, never on
//! the request path. Gauges are absent until the engine states them and again once its figures
//! are stale, so a dashboard shows "no data" rather than an old number. The preemption counter
//! is the sum of the increases of the engine's own; reads are counted by result (a closed set),
//! each result from its first occurrence.

use prometheus::{GaugeVec, IntCounterVec, Opts};

use super::registrar::Registrar;

use crate::engine::observed::Observed;

use super::names::engine_view as names;

/// The families.
pub struct EngineViewMetrics {
    gauges: [GaugeVec; 4],
    preemptions: IntCounterVec,
    scrapes: IntCounterVec,
}

impl EngineViewMetrics {
    pub(super) fn register(r: &Registrar) -> prometheus::Result<Self> {
        use names::*;
        let gauge = |name: &str, help: &str| -> prometheus::Result<GaugeVec> {
            let g = GaugeVec::new(Opts::new(name, help), &[])?;
            r.register(&g)?;
            Ok(g)
        };
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntCounterVec> {
                let c = IntCounterVec::new(Opts::new(name, help), labels)?;
                r.register(&c)?;
                Ok(c)
            };
        Ok(EngineViewMetrics {
            gauges: [
                gauge(KV_CACHE_TOKENS, "The engine's KV cache in tokens, as its metrics state it.")?,
                gauge(KV_CACHE_USAGE, "The share of the engine's KV cache in use (0 to 1), as its metrics state it.")?,
                gauge(REQUESTS_RUNNING, "Requests the engine is running, as its metrics state it.")?,
                gauge(REQUESTS_WAITING, "Requests waiting inside the engine (for a batch slot or KV-cache memory), as its metrics state it.")?,
            ],
            preemptions: counter(
                PREEMPTIONS,
                "Sequences the engine preempted for want of KV-cache memory, as its metrics count them (their increase since tokenmeter first read them).",
                &[],
            )?,
            scrapes: counter(
                SCRAPES,
                "Reads of the engine's metrics (--engine-metrics) by result: ok, timeout, connect_error, http_error, too_large, unknown_dialect.",
                &["result"],
            )?,
        })
    }

    /// Sets every series from what the reader observed.
    pub fn update(&self, o: &Observed) {
        let v = o.view();
        let values = [
            v.and_then(|v| v.kv_cache_tokens.map(|t| t as f64)),
            v.and_then(|v| v.kv_usage),
            v.and_then(|v| v.requests_running),
            v.and_then(|v| v.requests_waiting),
        ];
        for (g, value) in self.gauges.iter().zip(values) {
            match value {
                Some(x) => g.with_label_values::<&str>(&[]).set(x),
                None => {
                    let _ = g.remove_label_values::<&str>(&[]);
                }
            }
        }
        // Counters follow the reader's totals: add what they gained since the last render.
        if let Some(n) = o.preemptions() {
            let c = self.preemptions.with_label_values::<&str>(&[]);
            c.inc_by(n.saturating_sub(c.get()));
        }
        for (result, n) in o.scrapes() {
            if n > 0 {
                let c = self.scrapes.with_label_values(&[result.as_str()]);
                c.inc_by(n.saturating_sub(c.get()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::observed::ScrapeResult;
    use crate::engine::view::EngineView;
    use crate::exposition::Scrape;

    fn page(r: &Registrar) -> Scrape {
        let mut buf = Vec::new();
        let enc = prometheus::TextEncoder::new();
        prometheus::Encoder::encode(&enc, &r.gather(), &mut buf).expect("encode");
        Scrape::parse(&String::from_utf8(buf).expect("utf-8"))
    }

    #[test]
    fn series_follow_what_was_observed() {
        let r = Registrar::new();
        let m = EngineViewMetrics::register(&r).expect("register");
        let o = Observed::default();
        m.update(&o);
        assert_eq!(page(&r).samples().len(), 0);
        o.saw(EngineView {
            kv_cache_tokens: Some(2048),
            kv_usage: Some(0.5),
            requests_running: Some(3.0),
            preemptions_total: Some(10.0),
            ..EngineView::default()
        });
        o.scraped(ScrapeResult::Ok);
        o.saw(EngineView {
            preemptions_total: Some(13.0),
            kv_cache_tokens: Some(2048),
            ..EngineView::default()
        });
        o.scraped(ScrapeResult::Ok);
        m.update(&o);
        m.update(&o);
        let p = page(&r);
        assert_eq!(p.sum(names::KV_CACHE_TOKENS, &[]), 2048.0);
        assert_eq!(p.select(names::KV_CACHE_USAGE, &[]).count(), 0);
        assert_eq!(p.sum(names::PREEMPTIONS, &[]), 3.0);
        assert_eq!(p.sum(names::SCRAPES, &[("result", "ok")]), 2.0);
        assert_eq!(
            p.select(names::SCRAPES, &[("result", "timeout")]).count(),
            0
        );
        // Stale: the gauges go, the counters stay.
        o.stale();
        m.update(&o);
        let p = page(&r);
        assert_eq!(p.select(names::KV_CACHE_TOKENS, &[]).count(), 0);
        assert_eq!(p.sum(names::PREEMPTIONS, &[]), 3.0);
    }
}
