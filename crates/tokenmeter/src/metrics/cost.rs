//! Who pays for the GPU (`crate::cost`): GPU-seconds by model, phase and tenant, idle, what is
//! not assigned yet, and with `--gpu-hour-cost` the same in USD. The families' names
//! are in [`super::names::cost`].
//!
//! The charges are counted when a request is recorded; idle and unassigned are read from the
//! ledger when `/metrics` is rendered, so the three always add up to `--gpus` x the proxy's
//! uptime at the instant of the scrape.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::{Counter, CounterVec, Gauge, Opts};

use super::registrar::Registrar;

use super::labels::{child, tenanted};
use crate::cost::{GpuSeconds, Ledger};

use super::names::cost as names;

/// The families, and what the idle counter last showed (a counter only goes up by the
/// difference).
pub struct CostMetrics {
    seconds: CounterVec,
    cost: Option<Usd>,
    idle: Counter,
    unassigned: Gauge,
    idle_shown: Mutex<f64>,
}

/// `tokenmeter_gpu_cost_usd_total` and what its `allocation` basis has yet to spread.
struct Usd {
    family: CounterVec,
    per_second: f64,
    spread: Mutex<Spread>,
}

/// Since the last scrape: GPU-seconds charged by (model, tenant), and idle GPU-seconds no use
/// has taken yet. Bounded by the labels' own caps (`--max-models`, `--max-tenants`).
#[derive(Default)]
struct Spread {
    used: HashMap<(String, Option<String>), f64>,
    idle: f64,
}

impl CostMetrics {
    /// Registers the families; the USD one only with a GPU-hour cost.
    pub(super) fn register(
        r: &Registrar,
        tenant: bool,
        gpu_hour_cost: Option<f64>,
    ) -> prometheus::Result<Self> {
        use names::*;
        let seconds = CounterVec::new(
            Opts::new(
                GPU_SECONDS,
                "GPU-seconds charged to finished requests by model and phase (prefill, decode): each request's share of the GPUs by the rule in docs/cost.md. With idle and unassigned it adds up to --gpus x uptime.",
            ),
            &tenanted(&["model", "phase"], tenant),
        )?;
        r.register(&seconds)?;
        let cost = match gpu_hour_cost {
            Some(per_hour) => {
                let c = CounterVec::new(
                    Opts::new(
                        GPU_COST_USD,
                        "tokenmeter_gpu_seconds_total in USD at --gpu-hour-cost, by model; basis usage: what the requests used; allocation: that plus idle spread over the users by their use, so it adds up to the bill.",
                    ),
                    &tenanted(&["model", "basis"], tenant),
                )?;
                r.register(&c)?;
                Some(Usd {
                    family: c,
                    per_second: per_hour / 3600.0,
                    spread: Mutex::new(Spread::default()),
                })
            }
            None => None,
        };
        let idle = Counter::new(
            GPU_IDLE_SECONDS,
            "GPU-seconds with no request in flight (--gpus x the time nothing was in flight).",
        )?;
        r.register(&idle)?;
        let unassigned = Gauge::new(
            GPU_UNASSIGNED_SECONDS,
            "GPU-seconds of busy time not charged yet: held by the requests in flight, charged when they end.",
        )?;
        r.register(&unassigned)?;
        Ok(CostMetrics {
            seconds,
            cost,
            idle,
            unassigned,
            idle_shown: Mutex::new(0.0),
        })
    }

    /// Counts one request's charge.
    pub fn charged(&self, model: &str, tenant: Option<&str>, g: &GpuSeconds) {
        for (phase, v) in [("prefill", g.prefill), ("decode", g.decode)] {
            if v > 0.0 {
                child(&self.seconds, &[model, phase], tenant).inc_by(v);
            }
        }
        if let Some(usd) = &self.cost {
            let v = g.total() * usd.per_second;
            if v > 0.0 {
                child(&usd.family, &[model, "usage"], tenant).inc_by(v);
                let mut s = usd.spread.lock().unwrap_or_else(|e| e.into_inner());
                *s.used
                    .entry((model.to_owned(), tenant.map(str::to_owned)))
                    .or_default() += g.total();
            }
        }
    }

    /// Refreshes idle and unassigned from the books, at the scrape.
    pub fn update(&self, ledger: &Ledger, now: std::time::Instant) {
        let t = ledger.totals(now);
        let mut shown = self.idle_shown.lock().unwrap_or_else(|e| e.into_inner());
        let idle = (t.idle - *shown).max(0.0);
        if idle > 0.0 {
            self.idle.inc_by(idle);
            *shown = t.idle;
        }
        drop(shown);
        self.unassigned.set(t.unassigned);
        if let Some(usd) = &self.cost {
            usd.allocate(idle);
        }
    }
}

impl Usd {
    /// Adds the use since the last scrape to the `allocation` basis, with the idle time since
    /// (and any no use took before) spread over it in proportion. Idle with no use since waits
    /// for the next use: allocation then reconciles to the bill.
    fn allocate(&self, idle: f64) {
        let mut s = self.spread.lock().unwrap_or_else(|e| e.into_inner());
        s.idle += idle;
        let used: f64 = s.used.values().sum();
        if used <= 0.0 {
            return;
        }
        let scale = 1.0 + s.idle / used;
        for ((model, tenant), u) in s.used.drain() {
            child(&self.family, &[&model, "allocation"], tenant.as_deref())
                .inc_by(u * scale * self.per_second);
        }
        s.idle = 0.0;
    }
}

/// The ledger, as the metrics hold it to read its books at each scrape.
pub type Books = Arc<Ledger>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Idle is spread over the users by their use: allocation adds up to the GPUs' time.
    #[test]
    fn allocation_spreads_idle_by_use() {
        let r = Registrar::new();
        let m = CostMetrics::register(&r, true, Some(3600.0)).expect("register");
        let g = |s: f64| GpuSeconds {
            prefill: 0.0,
            decode: s,
        };
        m.charged("m", Some("a"), &g(3.0));
        m.charged("m", Some("b"), &g(1.0));
        let usd = m.cost.as_ref().expect("cost");
        // 2 s idle since: a takes 3/4 of it, b 1/4; at $1 a GPU-second.
        usd.allocate(2.0);
        let get = |t: &str, basis: &str| usd.family.with_label_values(&["m", basis, t]).get();
        assert_eq!(get("a", "usage"), 3.0);
        assert_eq!(get("a", "allocation"), 4.5);
        assert_eq!(get("b", "allocation"), 1.5);
        // Idle with no use waits for the next use.
        usd.allocate(1.0);
        assert_eq!(get("a", "allocation"), 4.5);
        m.charged("m", Some("b"), &g(1.0));
        usd.allocate(0.0);
        assert_eq!(get("b", "allocation"), 3.5);
    }
}
