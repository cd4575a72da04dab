//! Listeners, connections and the drain: the server accepts, serves and drains what the
//! composition root ([`crate::app`]) built, and knows nothing of how it was built.
//!
//! [`Server::bind`] binds both listeners (so a test can bind port 0 and read the real ports);
//! [`Server::serve`] accepts connections until the shutdown future completes, then drains:
//! `/readyz` turns 503 at once, open connections finish their current response (keep-alive is
//! switched off), new connections are still served (without keep-alive) while the drain lasts,
//! and after `--drain-timeout` whatever is left is cut, the background tasks are aborted and
//! `serve` returns.
//!
//! With `--tls-cert` (`--metrics-tls-cert`) a listener completes a TLS handshake first; the
//! handshake, the first bytes that tell the HTTP version and the first request head share one
//! budget, `--header-read-timeout` from accept (`server/head.rs`), and the certificate's files are
//! watched for a rotation ([`crate::tls::listener`]). Connections are served with upgrades on;
//! an upgraded connection counts as open while it is joined ([`crate::drain`]).
//!
//! The files: `server/version.rs` tells a connection's HTTP version (hyper's HTTP/1 connection,
//! upgrades on, or its HTTP/2 one) without consuming a byte; `server/http2.rs` holds the HTTP/2
//! limits, each a named constant with its reason, and names the GOAWAY code that closed a
//! connection for its counter; `server/listen.rs` binds both listeners with `--listen-backlog`
//! (4,096, not tokio's 128); `server/admin_cap.rs` is the metrics listener's own cap: at
//! `--metrics-max-connections` the connection idle longest gives way to the new one, so a crowd
//! cannot lock a scraper out; `server/settings.rs` holds every default of `Settings`. The tasks
//! that live beside the listeners (the page's sampler, the engine's reader, the replica watch)
//! come in as `Background` futures, started when the server serves and aborted once it has
//! drained; what must run after the drain comes in `Parts::on_exit`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2 as hyper_http2};
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::util::Oneshot;
use tower::ServiceExt;

use crate::admin::{self, Readiness};
use crate::drain::{Connections, Drain, Held};
use crate::error::BoxError;
use crate::metrics::Metrics;
use crate::proxy::{Proxy, ProxyBody};
use crate::ratelog::{RateLimited, LOG_PERIOD};
use crate::tls::listener::{ServerTls, Stream};
use crate::ui::Ui;

mod admin_cap;
mod head;
pub mod http2;
pub mod listen;
pub mod settings;
mod version;
use admin_cap::{AdminCap, Admitted};
use head::HeadTimer;
pub use settings::Settings;
use version::ClientVersion;

/// Why a listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({flag}): {source}")]
pub struct BindError {
    flag: &'static str,
    addr: SocketAddr,
    source: std::io::Error,
}

/// A task that lives as long as the server: started when it serves, aborted once it has
/// drained (the page's sampler, the engine's reader, the replica count's watch).
pub type Background = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the server serves, built by the composition root ([`crate::app`]).
pub struct Parts {
    /// The request path, whole.
    pub proxy: Proxy,
    /// TLS on each listener, its files read.
    pub tls: Option<ServerTls>,
    pub metrics_tls: Option<ServerTls>,
    pub metrics: Arc<Metrics>,
    /// `/readyz`, which also turns 503 when the drain starts.
    pub ready: Arc<Readiness>,
    /// The proxy listener's open connections, counted against `--max-connections` (shared
    /// with `/readyz`, which reports their crowding).
    pub conns: Arc<Connections>,
    /// The page on the metrics listener; `None` with `--no-ui`.
    pub ui: Option<Arc<Ui>>,
    pub background: Vec<Background>,
    /// Run once the drain is over, before `serve` returns: what must be written before the
    /// process ends (the workload trace's held lines).
    pub on_exit: Vec<Box<dyn FnOnce() + Send>>,
}

/// A proxy with its listeners bound, ready to serve.
pub struct Server {
    proxy_listener: TcpListener,
    admin_listener: TcpListener,
    parts: Parts,
    drain_timeout: Duration,
    header_read_timeout: Duration,
    /// `--max-connections`.
    max_connections: usize,
    /// `--metrics-max-connections`.
    metrics_max_connections: usize,
}

fn bind(flag: &'static str, addr: SocketAddr, backlog: u32) -> Result<TcpListener, BindError> {
    listen::bind(addr, backlog).map_err(|source| BindError { flag, addr, source })
}

impl Server {
    /// Binds both listeners of `settings` to serve `parts`.
    pub fn bind(settings: &Settings, parts: Parts) -> Result<Self, BindError> {
        Ok(Server {
            proxy_listener: bind("--listen", settings.listen, settings.listen_backlog)?,
            admin_listener: bind(
                "--metrics-listen",
                settings.metrics_listen,
                settings.listen_backlog,
            )?,
            parts,
            drain_timeout: settings.drain_timeout,
            header_read_timeout: settings.header_read_timeout,
            max_connections: settings.max_connections,
            metrics_max_connections: settings.metrics_max_connections,
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

    /// Serves until `shutdown` completes, then drains (see the module docs).
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let parts = self.parts;
        let watchers: Vec<_> = [("proxy", &parts.tls), ("metrics", &parts.metrics_tls)]
            .into_iter()
            .filter_map(|(name, t)| t.as_ref().map(|t| t.cert.watch(name)))
            .collect();
        let background: Vec<_> = parts.background.into_iter().map(tokio::spawn).collect();
        let admin = tokio::spawn(serve_admin(
            self.admin_listener,
            Arc::new(Admin {
                metrics: Arc::clone(&parts.metrics),
                ready: Arc::clone(&parts.ready),
                ui: parts.ui.clone(),
                tls: parts.metrics_tls,
                header_read_timeout: self.header_read_timeout,
            }),
            AdminCap::new(self.metrics_max_connections),
        ));
        let conns = parts.conns;
        let (drain_tx, drain_rx) = watch::channel(false);
        let (cut_tx, cut_rx) = watch::channel(false);
        // A task of its own, on the runtime's workers: polled from here, it ran on the thread
        // that called `serve` (the binary's main thread, inside `block_on`), and every new
        // connection cost two wake-ups across threads, a worker's to that thread to accept and
        // that thread's back to a worker to serve it (strace; the time to first byte it cost
        // was within the loopback benchmark's noise: docs/bench.md).
        let mut accept = Aborting(tokio::spawn(accept_loop(
            self.proxy_listener,
            Serving {
                proxy: parts.proxy,
                tls: parts.tls,
                drain: drain_rx,
                lent: Drain::new(Arc::clone(&conns), cut_rx),
                header_read_timeout: self.header_read_timeout,
                metrics: Arc::clone(&parts.metrics),
            },
            Arc::clone(&conns),
            Limits {
                max_connections: self.max_connections,
                metrics: Arc::clone(&parts.metrics),
                refusing: RateLimited::new(LOG_PERIOD),
            },
        )));
        // The loop ends only if its task panicked; a finished JoinHandle is not polled again.
        let accepting = tokio::select! {
            _ = &mut accept.0 => false,
            _ = shutdown => true,
        };
        tracing::info!(open_connections = conns.open(), "draining");
        parts.ready.start_draining();
        let _ = drain_tx.send(true);
        let drained = async {
            if !accepting {
                return conns.all_closed().await;
            }
            tokio::select! {
                _ = conns.all_closed() => {}
                _ = &mut accept.0 => {}
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
        // Joined upgrades end here; the connection tasks end with the process.
        let _ = cut_tx.send(true);
        drop(accept);
        admin.abort();
        for task in background {
            task.abort();
        }
        for w in watchers {
            w.abort();
        }
        for f in parts.on_exit {
            let _ = tokio::task::spawn_blocking(f).await;
        }
    }
}

/// A task aborted when this is dropped: the accept loop must not outlive `serve`, however
/// `serve` ends (returned, or dropped by its caller).
struct Aborting(tokio::task::JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What every proxy connection is served with, shared by all of them.
struct Serving {
    proxy: Proxy,
    tls: Option<ServerTls>,
    drain: watch::Receiver<bool>,
    /// Lent to each request, for an upgrade to stay counted while it is joined.
    lent: Drain,
    header_read_timeout: Duration,
    /// Where an HTTP/2 connection closed by a limit is counted.
    metrics: Arc<Metrics>,
}

/// What the accept loop holds new connections to.
struct Limits {
    /// `--max-connections`.
    max_connections: usize,
    /// Where a refused connection is counted.
    metrics: Arc<Metrics>,
    /// One warning a minute while connections are closed, not one per connection.
    refusing: RateLimited<()>,
}

async fn accept_loop(
    listener: TcpListener,
    conn: Serving,
    conns: Arc<Connections>,
    limits: Limits,
) {
    let conn = Arc::new(conn);
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
        // Accepted and closed at once: left in the backlog, it would wait there unanswered
        // (a joined upgrade is an open connection too, see `drain`).
        if conns.open() >= limits.max_connections {
            limits.metrics.connection_refused();
            drop(stream);
            if let Some(held_back) = limits.refusing.check((), Instant::now()) {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    refused_since_last_line = held_back,
                    "at --max-connections: new connections are closed"
                );
            }
            continue;
        }
        let guard = conns.hold();
        let accepted = Instant::now();
        tokio::spawn(serve_proxy_conn(stream, accepted, Arc::clone(&conn), guard));
    }
}

/// Completes the TLS handshake when the listener has TLS, and tells the HTTP version; both
/// before `deadline` (the request head's: accept plus `--header-read-timeout`).
async fn handshake(
    tcp: TcpStream,
    tls: Option<&ServerTls>,
    deadline: Instant,
) -> Option<(TokioIo<Stream>, ClientVersion)> {
    // Small SSE writes must leave at once.
    let _ = tcp.set_nodelay(true);
    let (stream, version) = match tls {
        None => {
            let version = version::sniff(&tcp, deadline).await?;
            (Stream::Plain(tcp), version)
        }
        Some(tls) => match tls.accept(tcp, head::remaining(deadline)).await {
            Ok(s) => {
                let version = version::from_alpn(s.alpn_protocol());
                (s, version)
            }
            Err(e) => {
                // A scanner, a client that does not trust us, plain HTTP on a TLS port.
                tracing::debug!(error = %e, "TLS handshake with a client failed");
                return None;
            }
        },
    };
    Some((TokioIo::new(stream), version))
}

/// One client connection, from its TLS handshake to its end.
///
/// Its future is the task tokio allocates for every open connection, so what it holds across
/// an await is memory per open stream: the shared [`Serving`] by reference count, the handshake
/// boxed (a TLS handshake's state is large and over by the first request), and the connection
/// built outside it ([`connection`]), so no copy of the request path is left behind in it.
async fn serve_proxy_conn(stream: TcpStream, accepted: Instant, c: Arc<Serving>, _guard: Held) {
    // The handshake, the first bytes and the first head share one budget from accept.
    let deadline = accepted + c.header_read_timeout;
    let Some((io, version)) = Box::pin(handshake(stream, c.tls.as_ref(), deadline)).await else {
        return;
    };
    let mut drain = c.drain.clone();
    let draining = *drain.borrow();
    // Its own handle, for the end: the shared `Serving` goes into the connection.
    let metrics = Arc::clone(&c.metrics);
    let conn = connection(io, version, c, draining, accepted);
    tokio::pin!(conn);
    if !draining {
        tokio::select! {
            res = conn.as_mut() => return ended(res, &metrics),
            _ = drain.wait_for(|d| *d) => conn.as_mut().graceful_shutdown(),
        }
    }
    ended(conn.await, &metrics);
}

/// How a client connection ended: an error is logged at debug (a client's business), and an
/// HTTP/2 connection that one of the limits closed is counted.
fn ended(res: Result<(), BoxError>, metrics: &Metrics) {
    if let Err(e) = res {
        if let Some(reason) = http2::closed_by_limit(e.as_ref()) {
            metrics.http2_closed(reason);
        }
        tracing::debug!(error = %e, "client connection ended with an error");
    }
}

/// hyper's connection for `io`: HTTP/1.1 (upgrades on) or HTTP/2 by `version`, hyper-util's
/// `auto` connection when that is not known yet ([`version`] says why it is decided first).
/// Keep-alive is off when the server is draining. Each request gets its own clone of the
/// request path (tower's one-shot call) and the drain's handle for an upgrade to hold.
fn connection(
    io: TokioIo<Stream>,
    version: ClientVersion,
    c: Arc<Serving>,
    draining: bool,
    accepted: Instant,
) -> Served {
    let http1 = || {
        let mut b = http1::Builder::new();
        b.timer(HeadTimer::new(accepted))
            .header_read_timeout(c.header_read_timeout)
            .keep_alive(!draining);
        b
    };
    match version {
        ClientVersion::Http1 => Served::Http1(
            http1()
                .serve_connection(io, Requests(Arc::clone(&c)))
                .with_upgrades(),
        ),
        ClientVersion::Http2 => Served::Http2(Box::pin(
            http2::builder().serve_connection(io, Requests(Arc::clone(&c))),
        )),
        ClientVersion::Unknown => {
            // The same settings as above, on `auto`'s own builders (hyper-util takes no hyper
            // builder in).
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(HeadTimer::new(accepted))
                .header_read_timeout(c.header_read_timeout)
                .keep_alive(!draining);
            http2::configure(&mut builder);
            Served::Auto(Box::pin(
                builder
                    .serve_connection_with_upgrades(io, Requests(Arc::clone(&c)))
                    .into_owned(),
            ))
        }
    }
}

type Io = TokioIo<Stream>;

/// A client connection being served, by the protocol [`version`] chose. HTTP/1 is held inline
/// (it is what nearly every open stream is, and the task holding it is memory per stream);
/// the other two are boxed, so they do not size every connection's task.
// The size difference is the point: see above.
#[allow(clippy::large_enum_variant)]
#[pin_project::pin_project(project = ServedProj)]
enum Served {
    Http1(#[pin] http1::UpgradeableConnection<Io, Requests>),
    Http2(Pin<Box<hyper_http2::Connection<Io, Requests, TokioExecutor>>>),
    Auto(Pin<Box<auto::UpgradeableConnection<'static, Io, Requests, TokioExecutor>>>),
}

impl Served {
    /// Finishes what is in flight and closes: the drain's way out.
    fn graceful_shutdown(self: Pin<&mut Self>) {
        match self.project() {
            ServedProj::Http1(c) => c.graceful_shutdown(),
            ServedProj::Http2(c) => c.as_mut().graceful_shutdown(),
            ServedProj::Auto(c) => c.as_mut().graceful_shutdown(),
        }
    }
}

impl Future for Served {
    type Output = Result<(), BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ServedProj::Http1(c) => c.poll(cx).map_err(Into::into),
            ServedProj::Http2(c) => c.as_mut().poll(cx).map_err(Into::into),
            ServedProj::Auto(c) => c.as_mut().poll(cx),
        }
    }
}

/// The proxy's hyper service: each request through a clone of the request path, with the
/// drain's handle in its extensions.
#[derive(Clone)]
struct Requests(Arc<Serving>);

impl hyper::service::Service<Request<Incoming>> for Requests {
    type Response = hyper::Response<ProxyBody>;
    type Error = Infallible;
    type Future = Oneshot<Proxy, Request<Incoming>>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(self.0.lent.clone());
        self.0.proxy.clone().oneshot(req)
    }
}

/// What every metrics-listener connection is served with.
struct Admin {
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
    ui: Option<Arc<Ui>>,
    tls: Option<ServerTls>,
    header_read_timeout: Duration,
}

/// The metrics listener's accept loop: each connection under `--metrics-max-connections`
/// ([`admin_cap`]: at the cap the idlest gives way), with the proxy listener's budget for the
/// handshake and every head (`--header-read-timeout`).
async fn serve_admin(listener: TcpListener, admin: Arc<Admin>, cap: Arc<AdminCap>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let place = match cap.admit() {
            Admitted::Room(place) => place,
            Admitted::Displaced(place) => {
                admin.metrics.metrics_connection_shed();
                place
            }
            Admitted::Refused => {
                admin.metrics.metrics_connection_shed();
                continue;
            }
        };
        tokio::spawn(serve_admin_conn(
            stream,
            Instant::now(),
            Arc::clone(&admin),
            place,
        ));
    }
}

/// One metrics-listener connection, until it ends, its head times out or it is shed.
async fn serve_admin_conn(
    stream: TcpStream,
    accepted: Instant,
    admin: Arc<Admin>,
    place: admin_cap::Place,
) {
    let deadline = accepted + admin.header_read_timeout;
    let close = Arc::clone(&place.close);
    let place = Arc::new(place);
    let serve = async {
        let Some((io, _)) = handshake(stream, admin.tls.as_ref(), deadline).await else {
            return;
        };
        let service = {
            let admin = Arc::clone(&admin);
            service_fn(move |req: Request<Incoming>| {
                // Not shed while it answers.
                let _busy = place.busy();
                let resp =
                    admin::handle_with_ui(&req, &admin.metrics, &admin.ready, admin.ui.as_deref());
                async move { Ok::<_, Infallible>(resp) }
            })
        };
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(HeadTimer::new(accepted))
            .header_read_timeout(admin.header_read_timeout);
        http2::configure(&mut builder);
        ended(builder.serve_connection(io, service).await, &admin.metrics);
    };
    tokio::select! {
        _ = serve => {}
        // Shed to make room for a newer connection: dropping hyper's connection closes it.
        _ = close.notified() => {}
    }
}
