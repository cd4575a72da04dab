//! What the layers' unit tests share: a recorder over a registry of their own, a request with
//! its meter as the metering layer sends it down, and a look at what was recorded.

use std::sync::Arc;
use std::time::Instant;

use http::Request;

use super::metering::Metered;
use crate::meter::Recorder;
use crate::metrics::{Metrics, MetricsConfig};

/// A recorder over fresh metrics.
pub fn recorder() -> (Arc<Metrics>, Arc<Recorder>) {
    let m = Arc::new(Metrics::new(&MetricsConfig::default()).expect("metrics"));
    (
        Arc::clone(&m),
        Arc::new(Recorder::new(m, Default::default())),
    )
}

/// `req` with the meter its head was received with, as below the metering layer.
pub fn metered<B>(recorder: &Arc<Recorder>, req: Request<B>) -> Metered<Request<B>> {
    let meter = recorder.receive(&req, Instant::now());
    Metered { meter, inner: req }
}

/// The exposition, as text.
pub fn scrape(metrics: &Metrics) -> String {
    String::from_utf8(metrics.render()).expect("utf8")
}

/// Fails with the whole exposition unless it holds `line`.
pub fn assert_has(text: &str, line: &str) {
    assert!(text.contains(line), "missing {line} in\n{text}");
}
