//! The page on the metrics listener: `GET /` (one HTML page, its script and style) and
//! `GET /api/summary` (the JSON it and scripts read).
//!
//! Everything is served by the binary (the assets are compiled in with `include_str!`), with no
//! build step, no library and no address outside the page's own origin: every URL is relative,
//! so the page works behind `kubectl port-forward` or a path-prefixing proxy. The charts are SVG
//! that `ui.js` draws. Nothing on the page is secret: it shows what `/metrics` already shows.
//!
//! Cost: nothing per request or per chunk. A sampler task reads the registry on a timer
//! ([`History`]), and `/api/summary` reads it once more when asked; `--no-ui` turns both off.

mod history;
mod reading;
mod summary;

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Response};
use http_body_util::Full;

pub use history::{History, Point, HISTORY_SPAN, NOW_WINDOW};
pub use reading::{Hist, Reading};
pub use summary::PageSummary;

use crate::metrics::Metrics;
use crate::units::HumanDuration;

const INDEX_HTML: &str = include_str!("assets/index.html");
const UI_JS: &str = include_str!("assets/ui.js");
const UI_CSS: &str = include_str!("assets/ui.css");

/// The page may load only its own script, style and data: no inline code, no other origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `--ui-sample-period`'s default: the time between two readings of the registry, the time
/// series' resolution (a Prometheus scrape interval's).
pub const DEFAULT_SAMPLE_PERIOD: HumanDuration = HumanDuration::secs(5);

/// Reads the registry `/metrics` serves, reduced to what the page shows.
type Read = dyn Fn() -> Reading + Send + Sync;

/// The page's state: how to read the registry, and the sampler's ring.
pub struct Ui {
    read: Box<Read>,
    history: Mutex<History>,
}

impl std::fmt::Debug for Ui {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ui").finish_non_exhaustive()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Ui {
    /// A page over the proxy's metrics, sampled every `period`; `rate_window` is the aggregate
    /// gauge's `--rate-window`.
    pub fn new(metrics: Arc<Metrics>, period: Duration, rate_window: Duration) -> Ui {
        let read = move || Reading::from_families(&metrics.gather());
        Ui::from_reader(read, period, rate_window)
    }

    /// A page over any registry with tokenmeter's family names (tests and benchmarks).
    #[cfg(any(test, feature = "testing"))]
    pub fn from_registry(
        registry: prometheus::Registry,
        period: Duration,
        rate_window: Duration,
    ) -> Ui {
        Ui::from_reader(
            move || Reading::from_families(&registry.gather()),
            period,
            rate_window,
        )
    }

    fn from_reader(
        read: impl Fn() -> Reading + Send + Sync + 'static,
        period: Duration,
        rate_window: Duration,
    ) -> Ui {
        Ui {
            read: Box::new(read),
            history: Mutex::new(History::new(period, rate_window)),
        }
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one reading into the ring (the sampler calls this every period).
    pub fn sample(&self) {
        let r = (self.read)();
        self.history().record(&r, Instant::now(), unix_ms());
    }

    /// The summary as of now.
    pub fn summary(&self) -> PageSummary {
        let r = (self.read)();
        PageSummary::compute(&r, &self.history(), Instant::now(), unix_ms())
    }

    /// The sampler, to run as a task: a reading now and then every period, until the `Ui` is
    /// dropped.
    pub fn sampler(self: &Arc<Self>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let ui: Weak<Ui> = Arc::downgrade(self);
        let period = self.history().period();
        async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(ui) = ui.upgrade() else { return };
                ui.sample();
            }
        }
    }

    /// Answers `path` when it is one of the page's; `None` for any other path.
    pub fn respond(&self, path: &str) -> Option<Response<Full<Bytes>>> {
        let (body, content_type) = match path {
            "/" | "/index.html" => (
                Bytes::from_static(INDEX_HTML.as_bytes()),
                "text/html; charset=utf-8",
            ),
            "/ui.js" => (
                Bytes::from_static(UI_JS.as_bytes()),
                "text/javascript; charset=utf-8",
            ),
            "/ui.css" => (
                Bytes::from_static(UI_CSS.as_bytes()),
                "text/css; charset=utf-8",
            ),
            "/api/summary" => {
                // Serialising plain structs of numbers and strings cannot fail.
                let json = serde_json::to_vec(&self.summary()).unwrap_or_default();
                (Bytes::from(json), "application/json")
            }
            _ => return None,
        };
        let mut r = Response::new(Full::new(body));
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
        Some(r)
    }
}

#[cfg(test)]
mod tests;
