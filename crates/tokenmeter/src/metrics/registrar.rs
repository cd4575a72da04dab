//! The registry one `Metrics` registers every family in, and the few constructors the family
//! groups share. It names nothing of `metrics` but prometheus' types, so every group (the
//! request path's in `families.rs`, the parts' in their own files) registers through it
//! without reaching back into `mod.rs`.

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// The registry of one [`super::Metrics`]. In unit tests it also keeps every collector it
/// registered, so the golden test can list each family with its type and labels even before
/// it has a series (the exposition leaves out a family with none).
pub(crate) struct Registrar {
    registry: Registry,
    #[cfg(test)]
    registered: std::sync::Mutex<Vec<Box<dyn Collector>>>,
}

impl Registrar {
    pub(crate) fn new() -> Self {
        Registrar {
            registry: Registry::new(),
            #[cfg(test)]
            registered: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Registers `c` (a handle: the registry holds a clone). Fails on a name or label set
    /// already registered.
    pub(crate) fn register<C: Collector + Clone + 'static>(&self, c: &C) -> prometheus::Result<()> {
        self.registry.register(Box::new(c.clone()))?;
        #[cfg(test)]
        self.registered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Box::new(c.clone()));
        Ok(())
    }

    /// Every family with at least one series, sorted by name.
    pub(crate) fn gather(&self) -> Vec<MetricFamily> {
        self.registry.gather()
    }

    /// Every family registered, series or not: name, help and type from collecting it, label
    /// names from its descriptor, sorted by name.
    #[cfg(test)]
    pub(crate) fn catalog(&self) -> Vec<(MetricFamily, Vec<String>)> {
        let registered = self
            .registered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out: Vec<(MetricFamily, Vec<String>)> = registered
            .iter()
            .flat_map(|c| {
                let labels: Vec<Vec<String>> = c
                    .desc()
                    .iter()
                    .map(|d| {
                        let mut l: Vec<String> = d
                            .const_label_pairs
                            .iter()
                            .map(|p| p.name().to_string())
                            .collect();
                        l.extend(d.variable_labels.iter().cloned());
                        l
                    })
                    .collect();
                c.collect().into_iter().zip(labels)
            })
            .collect();
        out.sort_by(|a, b| a.0.name().cmp(b.0.name()));
        out
    }
}

pub(crate) fn histogram(
    r: &Registrar,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> prometheus::Result<HistogramVec> {
    register_histogram(
        r,
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
}

/// Builds and registers a histogram family from its options (a compat scheme adds constant
/// labels to them).
pub(crate) fn register_histogram(
    r: &Registrar,
    opts: HistogramOpts,
    labels: &[&str],
) -> prometheus::Result<HistogramVec> {
    let h = HistogramVec::new(opts, labels)?;
    r.register(&h)?;
    Ok(h)
}

pub(crate) fn counter(
    r: &Registrar,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(&c)?;
    Ok(c)
}

pub(crate) fn gauge(r: &Registrar, name: &str, help: &str) -> prometheus::Result<Gauge> {
    let g = Gauge::new(name, help)?;
    r.register(&g)?;
    Ok(g)
}

pub(crate) fn int_gauge(r: &Registrar, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    let g = IntGauge::new(name, help)?;
    r.register(&g)?;
    Ok(g)
}

/// A counter with no labels (also a log's or an exporter's, registered when it is on).
pub(crate) fn int_counter(r: &Registrar, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    let c = IntCounter::new(name, help)?;
    r.register(&c)?;
    Ok(c)
}
