//! Listeners, connections and the drain.
//!
//! [`Server::bind`] binds both listeners (so a test can bind port 0 and read the real ports);
//! [`Server::serve`] accepts connections until the shutdown future completes, then drains:
//! `/readyz` turns 503 at once, open connections finish their current response (keep-alive is
//! switched off), new connections are still served (without keep-alive) while the drain lasts,
//! and after `--drain-timeout` whatever is left is cut and `serve` returns.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

use crate::admin::{self, Readiness};
use crate::config::Config;
use crate::meter::Recorder;
use crate::metrics::Metrics;
use crate::proxy::{self, Proxy};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr} ({flag}): {source}")]
    Bind {
        flag: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid metric configuration: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// A proxy with its listeners bound, ready to serve.
pub struct Server {
    proxy_listener: TcpListener,
    admin_listener: TcpListener,
    proxy: Proxy,
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
    drain_timeout: Duration,
    header_read_timeout: Duration,
}

async fn bind(flag: &'static str, addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { flag, addr, source })
}

impl Server {
    /// Builds the metrics and binds both listeners.
    pub async fn bind(cfg: &Config) -> Result<Self, ServerError> {
        let metrics = Arc::new(Metrics::new(&cfg.metrics)?);
        let recorder =
            Arc::new(Recorder::new(Arc::clone(&metrics), cfg.max_line_bytes).with_api(cfg.api));
        Ok(Server {
            proxy_listener: bind("--listen", cfg.listen).await?,
            admin_listener: bind("--metrics-listen", cfg.metrics_listen).await?,
            proxy: proxy::stack(cfg, recorder),
            metrics,
            ready: Arc::new(Readiness::default()),
            drain_timeout: cfg.drain_timeout,
            header_read_timeout: cfg.header_read_timeout,
        })
    }

    /// The address the proxy listens on.
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_listener
            .local_addr()
            .unwrap_or(([0, 0, 0, 0], 0).into())
    }

    /// The address `/metrics` is served on.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.admin_listener
            .local_addr()
            .unwrap_or(([0, 0, 0, 0], 0).into())
    }

    /// The metrics this server records into.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// Serves until `shutdown` completes, then drains (see the module docs).
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let admin = tokio::spawn(serve_admin(
            self.admin_listener,
            Arc::clone(&self.metrics),
            Arc::clone(&self.ready),
        ));
        let conns = Arc::new(Connections::default());
        let (drain_tx, drain_rx) = watch::channel(false);
        let accept = accept_loop(
            self.proxy_listener,
            self.proxy,
            Arc::clone(&conns),
            drain_rx,
            self.header_read_timeout,
        );
        tokio::pin!(accept);
        tokio::select! {
            _ = &mut accept => {}
            _ = shutdown => {}
        }
        tracing::info!(open_connections = conns.open(), "draining");
        self.ready.start_draining();
        let _ = drain_tx.send(true);
        let drained = async {
            tokio::select! {
                _ = conns.all_closed() => {}
                _ = &mut accept => {}
            }
        };
        if tokio::time::timeout(self.drain_timeout, drained)
            .await
            .is_err()
        {
            tracing::warn!(
                open_connections = conns.open(),
                "drain timeout: closing what is left"
            );
        }
        admin.abort();
    }
}

/// Counts open proxy connections, and wakes the drain when the last one closes.
#[derive(Default)]
struct Connections {
    open: AtomicUsize,
    closed: Notify,
}

impl Connections {
    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    async fn all_closed(&self) {
        loop {
            let notified = self.closed.notified();
            if self.open() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Decrements the open count when a connection task ends, however it ends.
struct ConnGuard(Arc<Connections>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.closed.notify_waiters();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    proxy: Proxy,
    conns: Arc<Connections>,
    drain: watch::Receiver<bool>,
    header_read_timeout: Duration,
) {
    loop {
        let (stream, _peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        conns.open.fetch_add(1, Ordering::SeqCst);
        let guard = ConnGuard(Arc::clone(&conns));
        tokio::spawn(serve_proxy_conn(
            stream,
            proxy.clone(),
            drain.clone(),
            header_read_timeout,
            guard,
        ));
    }
}

async fn serve_proxy_conn(
    stream: TcpStream,
    proxy: Proxy,
    mut drain: watch::Receiver<bool>,
    header_read_timeout: Duration,
    _guard: ConnGuard,
) {
    // Small SSE writes must leave at once.
    let _ = stream.set_nodelay(true);
    let draining = *drain.borrow();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(!draining);
    builder.http2().timer(TokioTimer::new());
    // Each request gets its own clone of the stack (tower's one-shot call).
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(proxy));
    tokio::pin!(conn);
    if !draining {
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "client connection ended with an error");
                }
                return;
            }
            _ = drain.wait_for(|d| *d) => conn.as_mut().graceful_shutdown(),
        }
    }
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "client connection ended with an error");
    }
}

async fn serve_admin(listener: TcpListener, metrics: Arc<Metrics>, ready: Arc<Readiness>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (metrics, ready) = (Arc::clone(&metrics), Arc::clone(&ready));
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let resp = admin::handle(&req, &metrics, &ready);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
