//! Reading the engine's metrics on a schedule of its own, off the request path.
//!
//! One task, one request at a time: every `--engine-metrics-interval` ([`super::DEFAULT_INTERVAL`]) it GETs the
//! page with the upstream's own TLS settings, gives the whole exchange [`TIMEOUT`] and the body
//! [`MAX_BYTES`], reads it ([`super::view`]), exports what it says and hands the cache's size to
//! the capacity model. TGI and llama.cpp state their limits in a JSON document beside the page
//! (`/info`, `/props`: [`super::stated`]), read in the same exchange. However the engine
//! misbehaves (silent, slow, garbage, gigabytes) the cost is one bounded exchange per interval,
//! and no request through the proxy waits for it.
//!
//! A read that fails keeps the last good figures for [`STALE_AFTER`] intervals (a restart or a
//! slow scrape is not news), then drops them: the gauges go and the capacity model falls back to
//! the flags, or to no memory bound. Failures are counted by cause and logged at most once a
//! minute per cause. With `auto`, an upstream without a page (a 404) or in no dialect known here
//! is asked again only every [`AUTO_RETRY`], and quietly: most upstreams are not vLLM.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::ACCEPT;
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::observed::{Observed, ScrapeResult};
use super::stated;
use super::view::{self, Dialect, EngineView};
use crate::capacity::memory::Stated;
use crate::capacity::Capacity;
use crate::ratelog::{RateLimited, LOG_PERIOD};
use crate::tls::client::{Alpn, ClientTls, Connector};

/// The whole exchange, connect to the body's end: an engine's page is served from memory in
/// milliseconds; one that takes seconds is in trouble, and its figures would be old.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The most of a page read: vLLM's with a few models, LoRA adapters and data-parallel engines
/// is some hundreds of KB (mostly histograms); 4 MiB is ten times that, and bounds what one read
/// holds whatever the engine sends.
pub const MAX_BYTES: usize = 4 << 20;

/// Intervals of failed reads after which the last good figures are dropped.
pub const STALE_AFTER: u32 = 3;

/// With `auto`, how long an upstream with no page in a known dialect waits for the next try.
pub const AUTO_RETRY: Duration = Duration::from_secs(60);

/// The task's state.
pub struct EngineReader {
    url: Uri,
    auto: bool,
    client: Client<Connector, Empty<Bytes>>,
    observed: Arc<Observed>,
    capacity: Arc<Capacity>,
    interval: Duration,
    log: RateLimited<ScrapeResult>,
    /// Told the dialect of every good read: which engine the upstream is.
    recognised: Option<Box<dyn Fn(Dialect) + Send + Sync>>,
}

impl EngineReader {
    /// Reads `url` (`auto`: the upstream's own page, found by `--engine-metrics auto`).
    pub fn new(
        url: Uri,
        auto: bool,
        tls: &ClientTls,
        observed: Arc<Observed>,
        capacity: Arc<Capacity>,
        interval: Duration,
    ) -> Self {
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1)
            .build(tls.connector(Alpn::Http1, Some(TIMEOUT)));
        EngineReader {
            url,
            auto,
            client,
            observed,
            capacity,
            interval: interval.max(Duration::from_millis(100)),
            log: RateLimited::new(LOG_PERIOD),
            recognised: None,
        }
    }

    /// Tells `f` the dialect of every good read (`--inject-usage auto` learns the engine so).
    pub fn on_recognised(mut self, f: impl Fn(Dialect) + Send + Sync + 'static) -> Self {
        self.recognised = Some(Box::new(f));
        self
    }

    /// One GET of `url`, its body cut at [`MAX_BYTES`]; no time limit of its own.
    async fn fetch(&self, url: Uri, accept: &'static str) -> Result<Bytes, ScrapeResult> {
        let req = Request::get(url)
            .header(ACCEPT, accept)
            .body(Empty::<Bytes>::new())
            .map_err(|_| ScrapeResult::ConnectError)?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|_| ScrapeResult::ConnectError)?;
        if resp.status() != StatusCode::OK {
            return Err(ScrapeResult::HttpError);
        }
        Limited::new(resp.into_body(), MAX_BYTES)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    ScrapeResult::TooLarge
                } else {
                    ScrapeResult::ConnectError
                }
            })
    }

    /// `path` at the page's origin: where TGI and llama.cpp state their limits.
    fn beside(&self, path: &str) -> Option<Uri> {
        let mut parts = self.url.clone().into_parts();
        parts.path_and_query = Some(path.parse().ok()?);
        Uri::from_parts(parts).ok()
    }

    /// Reads the engine's limits from the document its dialect keeps them in, into `view`. A
    /// document that cannot be read leaves `view` as the page left it: its queue is still news.
    async fn read_stated(&self, dialect: Dialect, view: &mut EngineView) {
        let Some(url) = dialect.stated_path().and_then(|p| self.beside(p)) else {
            return;
        };
        if let Ok(doc) = self.fetch(url, "application/json").await {
            match dialect {
                Dialect::Tgi => stated::tgi_info(&doc, view),
                Dialect::LlamaCpp => stated::llamacpp_props(&doc, view),
                Dialect::Vllm | Dialect::Sglang => {}
            }
        }
    }

    /// One read of the page, and of the document beside it where the dialect has one.
    pub async fn read_once(&self) -> Result<(Dialect, EngineView), ScrapeResult> {
        let exchange = async {
            match self.fetch(self.url.clone(), "text/plain").await {
                Ok(body) => {
                    let text = String::from_utf8_lossy(&body);
                    let (dialect, mut view) = view::read(&crate::exposition::Scrape::parse(&text))
                        .ok_or(ScrapeResult::UnknownDialect)?;
                    self.read_stated(dialect, &mut view).await;
                    Ok((dialect, view.with_reserved_usage()))
                }
                // llama.cpp serves `/metrics` only with `--metrics`, but always `/props`: with
                // `auto`, its slots are still worth knowing.
                Err(ScrapeResult::HttpError) if self.auto => {
                    let mut view = EngineView::default();
                    self.read_stated(Dialect::LlamaCpp, &mut view).await;
                    if view.max_num_seqs.is_some() {
                        Ok((Dialect::LlamaCpp, view))
                    } else {
                        Err(ScrapeResult::HttpError)
                    }
                }
                Err(e) => Err(e),
            }
        };
        tokio::time::timeout(TIMEOUT, exchange)
            .await
            .unwrap_or(Err(ScrapeResult::Timeout))
    }

    /// Reads until the task is aborted.
    pub async fn run(self) {
        let mut last_ok: Option<Instant> = None;
        loop {
            let wait = match self.read_once().await {
                Ok((dialect, view)) => {
                    if let Some(tell) = &self.recognised {
                        tell(dialect);
                    }
                    self.observed.scraped(ScrapeResult::Ok);
                    self.observed.saw(view);
                    self.capacity.set_engine_memory(Stated {
                        kv_cache_tokens: view.kv_cache_tokens,
                        block_size: view.block_size,
                        max_num_seqs: view.max_num_seqs,
                    });
                    last_ok = Some(Instant::now());
                    self.interval
                }
                Err(result) => {
                    self.observed.scraped(result);
                    let absent = matches!(
                        result,
                        ScrapeResult::HttpError | ScrapeResult::UnknownDialect
                    );
                    let stale =
                        last_ok.map_or(true, |at| at.elapsed() >= self.interval * STALE_AFTER);
                    if stale {
                        self.observed.stale();
                        self.capacity.set_engine_memory(Stated::default());
                    }
                    if !(self.auto && absent) {
                        if let Some(held_back) = self.log.check(result, Instant::now()) {
                            tracing::warn!(
                                result = result.as_str(),
                                held_back,
                                "reading the engine's metrics failed (--engine-metrics); the capacity model keeps the last figures for {} reads, then falls back to the flags",
                                STALE_AFTER
                            );
                        }
                    }
                    if self.auto && absent {
                        AUTO_RETRY.max(self.interval)
                    } else {
                        self.interval
                    }
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
}
