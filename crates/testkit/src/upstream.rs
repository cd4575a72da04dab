//! Scripted upstreams: a real hyper server on loopback whose responses follow a script of
//! sends and sleeps, and which counts the connections it sees open and close.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// One step of a scripted response body.
#[derive(Debug, Clone)]
pub enum Step {
    Send(Bytes),
    Sleep(Duration),
    /// Fail the body: hyper cuts the connection mid-response.
    Abort,
    /// Never finish (until the peer goes away).
    Hang,
}

/// A scripted response.
#[derive(Debug, Clone)]
pub struct Reply {
    /// How long the upstream waits before sending the response head.
    pub head_delay: Duration,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub steps: Vec<Step>,
}

impl Reply {
    /// A `text/event-stream` response.
    pub fn sse(steps: Vec<Step>) -> Self {
        Reply {
            head_delay: Duration::ZERO,
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            steps,
        }
    }

    /// A JSON response sent in one piece, with a Content-Length (as servers send them).
    pub fn json(status: u16, body: &str) -> Self {
        Reply {
            head_delay: Duration::ZERO,
            status,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("content-length".into(), body.len().to_string()),
            ],
            steps: vec![Step::Send(Bytes::from(body.to_string()))],
        }
    }
}

/// What the upstream received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `HTTP/1.1` or `HTTP/2.0`.
    pub version: String,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// A running scripted upstream.
pub struct Upstream {
    pub addr: SocketAddr,
    pub opened: Arc<AtomicUsize>,
    pub closed: Arc<AtomicUsize>,
    /// Response bodies whose reader went away before the script ended.
    pub abandoned: Arc<AtomicUsize>,
    /// Body bytes handed to hyper so far (over all responses).
    pub sent_bytes: Arc<AtomicUsize>,
    pub received: Arc<Mutex<Vec<Received>>>,
}

impl Upstream {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `https://127.0.0.1:PORT`, for an upstream from [`spawn_tls`].
    pub fn https_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::SeqCst)
    }

    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }
}

struct ChannelBody(mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx)
    }
}

/// Starts an upstream that answers every request with `script(request)`.
pub async fn spawn<F>(script: F) -> Upstream
where
    F: Fn(&Received) -> Reply + Send + Sync + 'static,
{
    spawn_on(None, script).await
}

/// The same over TLS (`https://127.0.0.1:PORT`); ALPN and client auth are the acceptor's.
pub async fn spawn_tls<F>(tls: tokio_rustls::TlsAcceptor, script: F) -> Upstream
where
    F: Fn(&Received) -> Reply + Send + Sync + 'static,
{
    spawn_on(Some(tls), script).await
}

/// A connection of either kind, for the one serve loop.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

async fn spawn_on<F>(tls: Option<tokio_rustls::TlsAcceptor>, script: F) -> Upstream
where
    F: Fn(&Received) -> Reply + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    let up = Upstream {
        addr,
        opened: Arc::default(),
        closed: Arc::default(),
        abandoned: Arc::default(),
        sent_bytes: Arc::default(),
        received: Arc::default(),
    };
    let (opened, closed, abandoned, received, sent) = (
        up.opened.clone(),
        up.closed.clone(),
        up.abandoned.clone(),
        up.received.clone(),
        up.sent_bytes.clone(),
    );
    let script = Arc::new(script);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            opened.fetch_add(1, Ordering::SeqCst);
            let (closed, abandoned, received, script, sent, tls) = (
                closed.clone(),
                abandoned.clone(),
                received.clone(),
                script.clone(),
                sent.clone(),
                tls.clone(),
            );
            tokio::spawn(async move {
                let stream: Box<dyn Io> = match tls {
                    None => Box::new(stream),
                    Some(tls) => match tls.accept(stream).await {
                        Ok(s) => Box::new(s),
                        Err(_) => {
                            closed.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    },
                };
                let service = service_fn(move |req: Request<Incoming>| {
                    let (abandoned, received, script, sent) = (
                        abandoned.clone(),
                        received.clone(),
                        script.clone(),
                        sent.clone(),
                    );
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let rec = Received {
                            version: format!("{:?}", parts.version),
                            method: parts.method.to_string(),
                            path: parts
                                .uri
                                .path_and_query()
                                .map_or("/".into(), |p| p.to_string()),
                            headers: parts
                                .headers
                                .iter()
                                .map(|(k, v)| {
                                    (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into())
                                })
                                .collect(),
                            body,
                        };
                        let reply = script(&rec);
                        received.lock().expect("lock").push(rec);
                        tokio::time::sleep(reply.head_delay).await;
                        let (tx, rx) = mpsc::channel(16);
                        tokio::spawn(play(reply.steps, tx, abandoned, sent));
                        let mut resp = Response::new(ChannelBody(rx));
                        *resp.status_mut() =
                            hyper::StatusCode::from_u16(reply.status).expect("status");
                        for (k, v) in reply.headers {
                            resp.headers_mut().append(
                                hyper::header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                                v.parse().expect("value"),
                            );
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                closed.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    up
}

async fn play(
    steps: Vec<Step>,
    tx: mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>,
    abandoned: Arc<AtomicUsize>,
    sent: Arc<AtomicUsize>,
) {
    for step in steps {
        match step {
            Step::Send(b) => {
                sent.fetch_add(b.len(), Ordering::SeqCst);
                if tx.send(Ok(Frame::data(b))).await.is_err() {
                    abandoned.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
            Step::Sleep(d) => {
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = tx.closed() => {
                        abandoned.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
            }
            Step::Abort => {
                let _ = tx.send(Err(std::io::Error::other("scripted abort"))).await;
                return;
            }
            Step::Hang => {
                tx.closed().await;
                abandoned.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
    }
}

/// The bytes a script sends, in order: what a client must get, byte for byte.
pub fn script_bytes(steps: &[Step]) -> Vec<u8> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Send(b) => Some(b.to_vec()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// An OpenAI chat stream: `tokens` content chunks `gap` apart after `ttft`, then (optionally) a
/// usage chunk and `[DONE]`.
pub fn openai_chat(ttft: Duration, tokens: usize, gap: Duration, usage: bool) -> Vec<Step> {
    let chunk = |delta: &str| {
        Bytes::from(format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"test-model\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n"
        ))
    };
    let mut steps = vec![
        Step::Sleep(ttft),
        Step::Send(chunk(r#"{"role":"assistant","content":""}"#)),
    ];
    for i in 0..tokens {
        if i > 0 {
            steps.push(Step::Sleep(gap));
        }
        steps.push(Step::Send(chunk(&format!("{{\"content\":\"t{i} \"}}"))));
    }
    if usage {
        steps.push(Step::Send(Bytes::from(format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"test-model\",\"choices\":[],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":{tokens},\"total_tokens\":{}}}}}\n\n",
            tokens + 12
        ))));
    }
    steps.push(Step::Send(Bytes::from_static(b"data: [DONE]\n\n")));
    steps
}

/// A listening socket that never accepts, with its accept queue filled: further SYNs are
/// dropped by the kernel, so a connect to `addr` hangs as it does to a black-holed host.
/// Keep the value alive while the test runs (it holds the socket and the queued connections).
pub struct BlackHole {
    pub addr: SocketAddr,
    _listener: TcpListener,
    _queued: Vec<tokio::net::TcpStream>,
}

/// Makes a [`BlackHole`] on loopback.
pub async fn black_hole() -> BlackHole {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(0).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let mut queued = Vec::new();
    // Linux queues backlog + 1 connections; a few more attempts in case a kernel queues more.
    for _ in 0..16 {
        match tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(s)) => queued.push(s),
            Ok(Err(e)) => panic!("connect to the black hole failed outright: {e}"),
            Err(_) => {
                return BlackHole {
                    addr,
                    _listener: listener,
                    _queued: queued,
                }
            }
        }
    }
    panic!(
        "the accept queue never filled after {} connections",
        queued.len()
    );
}
