//! The KV cache as the wire shows it: what the requests in flight hold by tokenmeter's own
//! count, beside what the engine states (`--engine-metrics`). The meter adds each streamed
//! token while its request is in flight and takes them back when it leaves (one atomic add per
//! token-bearing event); a request's own prompt is known only when its usage comes, at its end,
//! so the prompts are the mix's mean.

use std::sync::atomic::Ordering;

use super::{Capacity, Report};

impl Capacity {
    /// `delta` output tokens joined (or, negative, left) the KV cache the requests in flight
    /// hold by the wire's count. One atomic add.
    pub fn wire_streamed(&self, delta: i64) {
        self.wire_streamed.fetch_add(delta, Ordering::Relaxed);
    }

    /// The KV-cache tokens the `in_flight` requests hold per engine by the wire's count: their
    /// streamed output tokens, plus `in_flight` times the mix's mean uncached prompt, over the
    /// replicas of `report`. `None` until the report has a mix.
    pub fn wire_tokens(&self, report: &Report, in_flight: f64) -> Option<f64> {
        let streamed = self.wire_streamed.load(Ordering::Relaxed) as f64;
        let mix = report.mix?;
        let prompt = (mix.prompt - mix.cached).max(0.0);
        Some((streamed.max(0.0) + in_flight.max(0.0) * prompt) / f64::from(report.replicas.max(1)))
    }
}
