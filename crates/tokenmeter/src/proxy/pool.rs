//! Upstream HTTP/1.1 connections, each driven by the request that uses it.
//!
//! hyper-util's pooled client runs every connection in a task of its own, and the response body
//! crosses to the client connection's task through a channel that holds one chunk. Each chunk
//! then costs a wake-up of both tasks and, because the client side finds nothing more ready when
//! it asks for the next chunk, one write system call to the client: at saturation two thirds of
//! the proxy's CPU time went to those writes (docs/bench.md, "Where the time goes"). Here the
//! connection's future belongs to the response body ([`PooledBody`]) and is polled by the client
//! connection's task whenever hyper polls the body, so every chunk the upstream socket already
//! holds is handed over within one poll and written to the client in one go, as nginx does. No
//! chunk waits for another: a poll that finds nothing more returns at once, and hyper flushes.
//! The connection is polled with a waker of its own, so that handing a chunk over does not wake
//! the task that is doing it (`pool/wake.rs`).
//!
//! Connections are kept for reuse, most recently used first, for `--pool-idle-timeout`, at most
//! [`MAX_IDLE`] of them. Nothing reads an idle connection; taking one from the pool first polls
//! it once, so one the server has closed meanwhile (its FIN is waiting in the socket) is dropped
//! instead of used. A request that a reused connection could not send (hyper found the
//! connection closed before it wrote the request) is sent once more on a new connection, as
//! hyper-util's client does. So is one that was written but lost: the reused connection closed
//! before any byte of the response came back, which is what a server's idle close crossing the
//! request on the wire looks like (uvicorn drops a connection idle for 5 s without reading
//! what arrived in the same instant). That needs the body again, so it is done for a body the
//! proxy read whole ([`super::resend`]: JSON up to `--max-request-body`, or none), once per
//! request, and never on a fresh connection, where the server saw the request and failed. A
//! sweep every [`SWEEP_EVERY`] closes connections idle past the timeout and those the server
//! has closed, so a burst's connections do not outlive it.
//!
//! An `https://` upstream that speaks HTTP/1.1 goes through the pool too, so a request it loses
//! to its idle close is sent again as over plain HTTP (hyper-util's client would answer it with
//! a 502). Which version an upstream speaks is settled before a request reaches a client
//! ([`super::version`]); the pool is only ever given HTTP/1.1, and its connections offer only
//! `http/1.1` by ALPN. The connection that settled it is handed to [`Pool::send`] with the
//! first request.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use tower::Service;

use self::wake::Signal;
use super::{resend, ProxyBody};
use crate::error::BoxError;
use crate::tls::client::{Conn as Io, Connector};

mod wake;

/// Idle connections kept at most. A pool serves the next wave of requests as large as the last;
/// 1,024 covers the concurrency an inference server runs at, and bounds what a burst can leave.
pub const MAX_IDLE: usize = 1024;

/// How often idle connections past the timeout are closed (at most; the timeout when shorter).
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Times one poll of a response body polls its connection again because it was woken meanwhile,
/// before it leaves the rest to the task's next turn. One round is the common case (a chunk
/// read, or nothing); a connection that keeps waking itself is hyper yielding after many reads,
/// and other tasks get their turn first.
const ROUNDS: usize = 4;

/// The upstream connections to one origin.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    /// The upstream's origin, and how to connect to it (TCP_NODELAY, `--connect-timeout`).
    origin: http::Uri,
    connector: Connector,
    idle_timeout: Duration,
    /// Oldest first: connections are taken from the end and put back at the end.
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    conn: Pooled,
    since: Instant,
}

/// One connection: the handle that sends requests, and the future that does its I/O.
struct Pooled {
    send: SendRequest<ProxyBody>,
    /// `None` once the connection has ended. The mutex is only there to make the body `Sync`
    /// (hyper's connection future is not): it is reached through `&mut` and never locked.
    driver: Option<Mutex<Driver>>,
    /// What the driver is polled with while a response body drives it ([`wake`]).
    signal: Arc<Signal>,
    waker: Waker,
}

/// The future that reads and writes one connection.
type Driver = Pin<Box<Connection<Io, ProxyBody>>>;

/// Why a request could not be sent.
enum SendError {
    /// The connection closed before the request was written: it may be sent elsewhere.
    Unsent(Box<Request<ProxyBody>>, hyper::Error),
    Failed(hyper::Error),
}

/// A waker for the checks that poll a connection outside any task: what they learn is read at
/// once, and the next real poll registers the real waker.
struct NoWake;

impl Wake for NoWake {
    fn wake(self: Arc<Self>) {}
}

/// One for the process: a waker is an `Arc`, and a request's checkout and checkin each check.
static NO_WAKER: LazyLock<Waker> = LazyLock::new(|| Waker::from(Arc::new(NoWake)));

// === impl Pool ===

impl Pool {
    /// A pool for `origin`. Starts the idle sweep when a runtime is running.
    pub fn new(origin: http::Uri, connector: Connector, idle_timeout: Duration) -> Self {
        let inner = Arc::new(Inner {
            origin,
            connector,
            idle_timeout,
            idle: Mutex::new(Vec::new()),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweep(Arc::downgrade(&inner)));
        }
        Pool { inner }
    }

    /// Connections idle in the pool now.
    pub fn idle(&self) -> usize {
        self.inner.lock().len()
    }

    /// Sends `req` (its URI absolute, as the client's would be; it goes on the wire in origin
    /// form) and returns the response head; its body drives the connection. `first` is a
    /// connection made to learn the upstream's version, sent on instead of a new one.
    pub async fn send(
        &self,
        mut req: Request<ProxyBody>,
        mut first: Option<Box<Io>>,
    ) -> Result<Response<PooledBody>, BoxError> {
        let mut reuse = true;
        loop {
            let (mut conn, reused) = match first.take() {
                Some(io) => (Inner::handshake(*io).await?, false),
                None => match reuse.then(|| self.inner.checkout()).flatten() {
                    Some(c) => (c, true),
                    None => (self.inner.connect().await?, false),
                },
            };
            // The copy to send again is made only where it can be needed: on a reused connection.
            let again = if reused { resend::again(&req) } else { None };
            match (conn.send(req).await, again) {
                (Ok(resp), _) => {
                    // The driver was polled with the task's own waker until now.
                    conn.signal.set();
                    let pool = Arc::downgrade(&self.inner);
                    return Ok(resp.map(|inner| PooledBody {
                        inner,
                        conn: Some(conn),
                        ended: false,
                        pool,
                    }));
                }
                (Err(SendError::Unsent(r, e)), _) if reused => {
                    tracing::debug!(error = %e, "pooled connection closed before the request was sent; sending it on a new one");
                    req = *r;
                    reuse = false;
                }
                (Err(SendError::Failed(e)), Some(again)) if lost_unanswered(&e) => {
                    tracing::debug!(error = %e, "pooled connection closed before the response began; sending the request again on a new one");
                    req = again;
                    reuse = false;
                }
                (Err(SendError::Unsent(_, e) | SendError::Failed(e)), _) => return Err(e.into()),
            }
        }
    }
}

/// Closes idle connections past the timeout, and those the server closed, until the pool goes.
async fn sweep(pool: Weak<Inner>) {
    let every = pool
        .upgrade()
        .map_or(SWEEP_EVERY, |p| p.idle_timeout.min(SWEEP_EVERY))
        .max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        let Some(pool) = pool.upgrade() else { return };
        let expired: Vec<Idle> = {
            let mut idle = pool.lock();
            let now = Instant::now();
            let keep = idle
                .iter()
                .position(|i| now.duration_since(i.since) < pool.idle_timeout)
                .unwrap_or(idle.len());
            let mut gone: Vec<Idle> = idle.drain(..keep).collect();
            // And those the server closed meanwhile (its FIN is waiting in the socket): vLLM's
            // after 5 s, long before ours, and each still holds its buffers.
            let mut i = 0;
            while i < idle.len() {
                if idle[i].conn.usable() {
                    i += 1;
                } else {
                    gone.push(idle.remove(i));
                }
            }
            gone
        };
        // Closed outside the lock.
        drop(expired);
    }
}

/// An HTTP/1.1 request as it goes on the wire: the path and query in the request line, the
/// origin in `Host` (what hyper-util's client does on its own).
fn origin_form(req: Request<ProxyBody>) -> Request<ProxyBody> {
    let (mut parts, body) = req.into_parts();
    if let Some(a) = parts.uri.authority() {
        if let Ok(v) = HeaderValue::from_str(a.as_str()) {
            parts.headers.insert(header::HOST, v);
        }
    }
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    if let Ok(u) = Uri::try_from(pq) {
        parts.uri = u;
    }
    Request::from_parts(parts, body)
}

/// True for how a written request is lost to a server's close: the connection ended, or was
/// reset, before a byte of the response (`Pooled::send` returns at the response head, so any error
/// it gives came before one).
fn lost_unanswered(e: &hyper::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    if e.is_incomplete_message() {
        return true;
    }
    let io = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>());
    io.is_some_and(|io| {
        matches!(
            io.kind(),
            BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof
        )
    })
}

// === impl Inner ===

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection that is still open, if any.
    fn checkout(&self) -> Option<Pooled> {
        let now = Instant::now();
        loop {
            let i = self.lock().pop()?;
            if now.duration_since(i.since) >= self.idle_timeout {
                // The newest is expired: so are all older ones.
                let old = std::mem::take(&mut *self.lock());
                drop(old);
                return None;
            }
            let mut conn = i.conn;
            if conn.usable() {
                return Some(conn);
            }
        }
    }

    fn checkin(&self, mut conn: Pooled) {
        if !conn.usable() {
            return;
        }
        let mut idle = self.lock();
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push(Idle {
            conn,
            since: Instant::now(),
        });
    }

    /// A new connection.
    async fn connect(&self) -> Result<Pooled, BoxError> {
        let io = self.connector.clone().call(self.origin.clone()).await?;
        Inner::handshake(io).await
    }

    /// HTTP/1.1 over a connection made.
    async fn handshake(io: Io) -> Result<Pooled, BoxError> {
        let (send, driver) = http1::handshake(io).await?;
        let (signal, waker) = Signal::new();
        Ok(Pooled {
            send,
            driver: Some(Mutex::new(Box::pin(driver))),
            signal,
            waker,
        })
    }
}

// === impl Pooled ===

impl Pooled {
    /// Polls the connection's I/O; forgets it once it has ended.
    fn drive(&mut self, cx: &mut Context<'_>) {
        drive(&mut self.driver, cx);
    }

    /// Polls the connection's I/O with its [`Signal`]'s waker, for a response body.
    fn drive_signalled(&mut self) {
        drive(&mut self.driver, &mut Context::from_waker(&self.waker));
    }

    /// True when the connection is open and idle, ready for a request (polled once to see).
    fn usable(&mut self) -> bool {
        let mut cx = Context::from_waker(&NO_WAKER);
        self.drive(&mut cx);
        self.driver.is_some() && self.send.is_ready()
    }

    /// Sends one request and waits for its response head, driving the connection meanwhile.
    async fn send(&mut self, req: Request<ProxyBody>) -> Result<Response<Incoming>, SendError> {
        let mut sent = Box::pin(self.send.try_send_request(origin_form(req)));
        let driver = &mut self.driver;
        let out = poll_fn(|cx| {
            if let Some(d) = driver {
                let d = d.get_mut().unwrap_or_else(|e| e.into_inner());
                if d.as_mut().poll(cx).is_ready() {
                    *driver = None;
                }
            }
            sent.as_mut().poll(cx)
        })
        .await;
        out.map_err(|mut e| match e.take_message() {
            Some(req) => SendError::Unsent(Box::new(req), e.into_error()),
            None => SendError::Failed(e.into_error()),
        })
    }
}

/// Polls a connection's I/O; forgets it once it has ended.
fn drive(driver: &mut Option<Mutex<Driver>>, cx: &mut Context<'_>) {
    if let Some(d) = driver {
        let d = d.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Poll::Ready(r) = d.as_mut().poll(cx) {
            if let Err(e) = r {
                tracing::debug!(error = %e, "upstream connection ended");
            }
            *driver = None;
        }
    }
}

/// A response body that drives its connection, and gives the connection back to the pool when
/// the body has been read to its end.
pub struct PooledBody {
    inner: Incoming,
    conn: Option<Pooled>,
    ended: bool,
    pool: Weak<Inner>,
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = match this.conn.as_mut().filter(|c| c.driver.is_some()) {
            Some(conn) => drive_and_poll(conn, &mut this.inner, cx),
            // The connection has ended: what the body still holds needs no driving.
            None => Pin::new(&mut this.inner).poll_frame(cx),
        };
        match &polled {
            Poll::Ready(None) => this.ended = true,
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.ended = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Polls the connection when it was woken, then the body it feeds; again while the connection
/// was woken meanwhile ([`wake`] says why the task's own waker is not used for either).
fn drive_and_poll(
    conn: &mut Pooled,
    inner: &mut Incoming,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
    let mut woken = conn.signal.begin(cx.waker());
    for _ in 0..ROUNDS {
        if woken {
            conn.drive_signalled();
        }
        // Only the driver's polls feed the body, and each is followed by this one.
        let polled = Pin::new(&mut *inner).poll_frame(&mut Context::from_waker(&NO_WAKER));
        if polled.is_ready() {
            conn.signal.end();
            return polled;
        }
        if conn.driver.is_none() {
            // Ended in this poll: from now on the body is polled alone, with the task's waker.
            conn.signal.end();
            return Pin::new(inner).poll_frame(cx);
        }
        if conn.signal.settle() {
            return Poll::Pending;
        }
        woken = true;
    }
    conn.signal.set();
    conn.signal.end();
    cx.waker().wake_by_ref();
    Poll::Pending
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // A body read to its end leaves the connection idle and reusable; one dropped before
        // (the client went away) closes it, since the rest of the response would follow.
        let (Some(conn), Some(pool)) = (self.conn.take(), self.pool.upgrade()) else {
            return;
        };
        if self.ended || self.inner.is_end_stream() {
            pool.checkin(conn);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::wake::tests::{task, Count};
    use super::*;
    use crate::tls::client::{Alpn, UpstreamTls};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An upstream that answers one request with a chunked head, then writes each chunk it is
    /// given.
    async fn upstream() -> (http::Uri, tokio::sync::mpsc::Sender<&'static [u8]>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<&'static [u8]>(1);
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 4096];
            let _ = s.read(&mut head).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                .await
                .unwrap();
            while let Some(chunk) = rx.recv().await {
                s.write_all(chunk).await.unwrap();
            }
        });
        (format!("http://{addr}").parse().unwrap(), tx)
    }

    /// Lets the runtime turn until `wakes` has seen more than `before`.
    async fn woken(wakes: &Count, before: usize) -> usize {
        for _ in 0..5000 {
            if wakes.seen() > before {
                // And a moment more, for any second wake to show.
                tokio::task::yield_now().await;
                return wakes.seen() - before;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("the body's task was never woken");
    }

    #[tokio::test]
    async fn a_chunk_wakes_the_bodys_task_once_and_handing_it_over_wakes_nobody() {
        let (origin, chunks) = upstream().await;
        let tls = UpstreamTls::default().load(false).unwrap();
        let pool = Pool::new(
            origin.clone(),
            tls.connector(Alpn::Http1, None),
            Duration::from_secs(60),
        );
        let req = Request::post(origin)
            .body(super::super::full(Bytes::new()))
            .unwrap();
        let Ok(resp) = pool.send(req, None).await else {
            panic!("no response");
        };
        let mut body = resp.into_body();
        let (wakes, waker) = task();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        for _ in 0..5 {
            let before = wakes.seen();
            chunks.send(b"5\r\nhello\r\n").await.unwrap();
            assert_eq!(woken(&wakes, before).await, 1, "the socket's wake");
            let before = wakes.seen();
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(f))) => assert_eq!(f.data_ref().unwrap(), "hello"),
                other => panic!("expected the chunk, got {:?}", other.map(|_| ())),
            }
            // hyper polls again after every frame, and twice when it finds nothing.
            assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
            assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
            assert_eq!(wakes.seen(), before, "a wake from inside the poll");
        }
        let before = wakes.seen();
        chunks.send(b"0\r\n\r\n").await.unwrap();
        woken(&wakes, before).await;
        assert!(matches!(
            Pin::new(&mut body).poll_frame(&mut cx),
            Poll::Ready(None)
        ));
        drop(body);
        assert_eq!(pool.idle(), 1, "read to its end, the connection goes back");
    }
}
