//! The load client: one process per measurement, which prints its result as one JSON line.
//!
//! It speaks HTTP/1.1 on raw sockets (request, chunked response, SSE events) so that it costs
//! little on the core it shares with the upstream, and it checks every response: each content
//! event has the upstream's exact length, the stream ends with `[DONE]` and the chunked
//! terminator, and no usage event arrives (the client never asks for one, so one that arrives
//! is a proxy's `--inject-usage` failing to remove it). A response that breaks any of these
//! counts as an error, and the smoke run fails on any error.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::wire;

/// Read buffer per connection.
const READ_BUF: usize = 64 * 1024;
/// Connections opened at once when many are opened (below the listen backlog of every target).
const CONNECT_AT_ONCE: usize = 256;
/// Longest any single response may take before it counts as an error.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(120);

/// What a client run reports.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Content events received (inside the window, for `saturate`).
    pub events: u64,
    /// Content events received in all (for `saturate`, also before and after the window).
    pub total_events: u64,
    /// Seconds of the measuring window (for `short`: the schedule, or longer if the last answer
    /// ended after it).
    pub secs: f64,
    /// Latency of each content event (receive minus send), ns; or time to first byte, ns; or,
    /// for `short`, of each whole answer from its request's due time, ns.
    pub samples_ns: Vec<u64>,
    /// For `paced`: the latency of each response's first content event, ns (the one an
    /// inference server sends after its prefill, when the connection has been quiet).
    #[serde(default)]
    pub first_ns: Vec<u64>,
    /// For `paced`: the latency of each content event after its stream's first second, ns.
    /// Every stream opens within one chunk interval, so the first second also carries all the
    /// connections' setup at once; after it the load is only the paced chunks.
    #[serde(default)]
    pub steady_ns: Vec<u64>,
    /// Responses that broke a rule (see the module docs), and the first reason.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Responses whose upstream sent a usage event that the proxy removed.
    pub usage_removed: u64,
    /// Responses completed (for `short`: answers read and checked).
    pub responses: u64,
}

impl Report {
    pub fn error(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }

    pub fn merge(&mut self, o: Report) {
        self.events += o.events;
        self.total_events += o.total_events;
        self.samples_ns.extend(o.samples_ns);
        self.first_ns.extend(o.first_ns);
        self.steady_ns.extend(o.steady_ns);
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        self.usage_removed += o.usage_removed;
        self.responses += o.responses;
    }
}

/// How one response ended.
#[derive(Debug, Default)]
struct Seen {
    events: u64,
    usage_header: bool,
    complete: bool,
}

/// Chunked transfer decoding, as a small state machine.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Chunk {
    Size(usize),
    SizeLine(usize),
    Data(usize),
    DataEnd,
    LastCrLf,
    Done,
}

/// Reads one response from `s`, calling `on_event(sent_ns, received_ns)` for each content event.
/// `stop` ends the read early (the measuring window is over): the response is then incomplete,
/// which is not an error.
async fn read_response(
    s: &mut TcpStream,
    buf: &mut [u8],
    stop: Option<Instant>,
    mut on_event: impl FnMut(u64, u64),
) -> Result<Seen, String> {
    let mut head = Vec::new();
    let mut body: Vec<u8> = Vec::new();
    let mut seen = Seen::default();
    let mut state = None::<Chunk>;
    let deadline = Instant::now() + RESPONSE_TIMEOUT;
    let mut done_marker = false;
    loop {
        let until = stop.map_or(deadline, |s| s.min(deadline));
        let n = match tokio::time::timeout_at(until, s.read(buf)).await {
            Err(_) if stop.is_some_and(|s| Instant::now() >= s) => return Ok(seen),
            Err(_) => return Err("response timed out".into()),
            Ok(Err(e)) => return Err(format!("read: {e}")),
            Ok(Ok(0)) => return Err("connection closed mid-response".into()),
            Ok(Ok(n)) => n,
        };
        let received = wire::now_ns();
        let mut data = &buf[..n];
        let mut st = match state {
            Some(st) => st,
            None => {
                head.extend_from_slice(data);
                let Some(end) = memchr::memmem::find(&head, b"\r\n\r\n") else {
                    continue;
                };
                let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
                if !text.starts_with("http/1.1 200") {
                    let line = text.lines().next().unwrap_or("").to_string();
                    return Err(format!("status: {line}"));
                }
                if !text.contains("transfer-encoding: chunked") {
                    return Err("response is not chunked".into());
                }
                seen.usage_header = text.contains(wire::H_USAGE);
                // What followed the head in this read.
                let rest = head.len() - (end + 4);
                data = &buf[n - rest..n];
                Chunk::Size(0)
            }
        };
        while !data.is_empty() && st != Chunk::Done {
            match st {
                Chunk::Size(acc) => {
                    let b = data[0];
                    data = &data[1..];
                    st = match b {
                        b'0'..=b'9' => Chunk::Size(acc * 16 + usize::from(b - b'0')),
                        b'a'..=b'f' => Chunk::Size(acc * 16 + usize::from(b - b'a' + 10)),
                        b'A'..=b'F' => Chunk::Size(acc * 16 + usize::from(b - b'A' + 10)),
                        _ => Chunk::SizeLine(acc),
                    };
                    if b == b'\n' {
                        st = if acc == 0 {
                            Chunk::LastCrLf
                        } else {
                            Chunk::Data(acc)
                        };
                    }
                }
                Chunk::SizeLine(acc) => {
                    let b = data[0];
                    data = &data[1..];
                    if b == b'\n' {
                        st = if acc == 0 {
                            Chunk::LastCrLf
                        } else {
                            Chunk::Data(acc)
                        };
                    }
                }
                Chunk::Data(left) => {
                    let take = left.min(data.len());
                    body.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    st = if take == left {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left - take)
                    };
                }
                Chunk::DataEnd => {
                    // The CRLF after a chunk's data.
                    if data[0] == b'\n' {
                        st = Chunk::Size(0);
                    }
                    data = &data[1..];
                }
                Chunk::LastCrLf => {
                    if data[0] == b'\n' {
                        st = Chunk::Done;
                    }
                    data = &data[1..];
                }
                Chunk::Done => {}
            }
        }
        // Whole events in what was decoded so far.
        let mut at = 0;
        while let Some(i) = memchr::memmem::find(&body[at..], b"\n\n") {
            let event = &body[at..at + i + 2];
            at += i + 2;
            if let Some(sent) = wire::timestamp(event) {
                if event.len() != wire::EVENT_LEN {
                    return Err(format!(
                        "content event of {} bytes, not {}",
                        event.len(),
                        wire::EVENT_LEN
                    ));
                }
                seen.events += 1;
                on_event(sent, received);
            } else if event == wire::DONE {
                done_marker = true;
            } else {
                return Err(format!(
                    "unexpected event: {}",
                    String::from_utf8_lossy(&event[..event.len().min(80)])
                ));
            }
        }
        body.drain(..at);
        state = Some(st);
        if st == Chunk::Done {
            if !done_marker || !body.is_empty() {
                return Err("stream ended without [DONE]".into());
            }
            seen.complete = true;
            return Ok(seen);
        }
    }
}

pub async fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// One request on `s`; checks the response and counts it into `report`.
async fn exchange(
    s: &mut TcpStream,
    buf: &mut [u8],
    req: &[u8],
    stop: Option<Instant>,
    report: &mut Report,
    on_event: impl FnMut(u64, u64),
) -> bool {
    if let Err(e) = s.write_all(req).await {
        report.error(format!("write: {e}"));
        return false;
    }
    match read_response(s, buf, stop, on_event).await {
        Ok(seen) => {
            if seen.complete {
                report.responses += 1;
                report.usage_removed += u64::from(seen.usage_header);
            }
            seen.complete
        }
        Err(e) => {
            report.error(e);
            false
        }
    }
}

/// Saturation: `streams` connections, each sending its next request as soon as the last ends;
/// counts the content events that arrive in a `secs` window after `warm` seconds.
pub async fn saturate(
    addr: SocketAddr,
    streams: usize,
    warm: f64,
    secs: f64,
    chunks: u64,
) -> Report {
    let start = Instant::now() + Duration::from_secs_f64(warm);
    let end = start + Duration::from_secs_f64(secs);
    let req = Rc::new(wire::request(chunks, 0, false));
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let req = Rc::clone(&req);
        tasks.push(tokio::task::spawn_local(async move {
            let mut r = Report::default();
            let mut buf = vec![0u8; READ_BUF];
            let mut s = match connect(addr).await {
                Ok(s) => s,
                Err(e) => {
                    r.error(e);
                    return r;
                }
            };
            let counted = Rc::new(RefCell::new((0u64, 0u64)));
            while Instant::now() < end {
                let c = Rc::clone(&counted);
                let on = move |_, _| {
                    let mut c = c.borrow_mut();
                    c.1 += 1;
                    if Instant::now() >= start {
                        c.0 += 1;
                    }
                };
                if !exchange(&mut s, &mut buf, &req, Some(end), &mut r, on).await
                    && Instant::now() < end
                {
                    // Broken: a new connection, as any client would.
                    match connect(addr).await {
                        Ok(n) => s = n,
                        Err(e) => {
                            r.error(e);
                            break;
                        }
                    }
                }
            }
            (r.events, r.total_events) = *counted.borrow();
            r
        }));
    }
    let mut report = Report {
        secs,
        ..Report::default()
    };
    for t in tasks {
        if let Ok(r) = t.await {
            report.merge(r);
        }
    }
    report
}

/// Fixed load: `streams` streams of `rate` chunks/s for `secs`, their starts spread over one
/// interval; one latency sample per content event.
pub async fn paced(
    addr: SocketAddr,
    streams: usize,
    rate: f64,
    secs: f64,
    first_us: u64,
    requests: u64,
) -> Report {
    let interval_us = (1e6 / rate) as u64;
    let requests = requests.max(1);
    let chunks = ((rate * secs).max(1.0) as u64 / requests).max(1);
    let req = Rc::new(wire::request_after(chunks, interval_us, first_us, false));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..streams {
        let req = Rc::clone(&req);
        let offset = Duration::from_micros(interval_us * i as u64 / streams as u64);
        tasks.push(tokio::task::spawn_local(async move {
            tokio::time::sleep_until(t0 + offset).await;
            let mut r = Report::default();
            let mut buf = vec![0u8; READ_BUF];
            let mut lat = Vec::with_capacity((chunks * requests) as usize);
            let mut first = Vec::with_capacity(requests as usize);
            match connect(addr).await {
                Ok(mut s) => {
                    // The requests of one stream follow one another on its connection, as a
                    // client at concurrency 1 sends its next request when the last one ends.
                    for _ in 0..requests {
                        let at = lat.len();
                        let ok = exchange(&mut s, &mut buf, &req, None, &mut r, |sent, got| {
                            lat.push(got.saturating_sub(sent))
                        })
                        .await;
                        first.extend(lat.get(at).copied());
                        if !ok {
                            break;
                        }
                    }
                }
                Err(e) => r.error(e),
            }
            r.events = lat.len() as u64;
            r.steady_ns = lat.iter().skip(rate as usize).copied().collect();
            r.samples_ns = lat;
            r.first_ns = first;
            r
        }));
    }
    let mut report = Report {
        secs,
        ..Report::default()
    };
    for t in tasks {
        if let Ok(r) = t.await {
            report.merge(r);
        }
    }
    report
}

/// Time to first byte of `n` requests at once, each on a new connection: from before the
/// connect to the first content event.
async fn ttfb_once(addr: SocketAddr, n: usize) -> Report {
    let req = Rc::new(wire::request(2, 0, false));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let req = Rc::clone(&req);
        tasks.push(tokio::task::spawn_local(async move {
            let mut r = Report::default();
            let mut buf = vec![0u8; 16 * 1024];
            let t0 = Instant::now();
            let mut first = None;
            match connect(addr).await {
                Ok(mut s) => {
                    exchange(&mut s, &mut buf, &req, None, &mut r, |_, _| {
                        first.get_or_insert_with(|| t0.elapsed());
                    })
                    .await;
                }
                Err(e) => r.error(e),
            }
            r.samples_ns.extend(first.map(|d| d.as_nanos() as u64));
            r
        }));
    }
    let mut report = Report::default();
    for t in tasks {
        if let Ok(r) = t.await {
            report.merge(r);
        }
    }
    report
}

/// Bursts of `n` new connections, each burst after `idle` of silence (one unmeasured burst
/// first, so the target's state before the first idle is the same every time).
pub async fn ttfb_burst(addr: SocketAddr, n: usize, idle: Duration, reps: usize) -> Report {
    let mut report = Report::default();
    let warm = ttfb_once(addr, n).await;
    report.errors += warm.errors;
    report.first_error = warm.first_error;
    for _ in 0..reps {
        tokio::time::sleep(idle).await;
        report.merge(ttfb_once(addr, n).await);
    }
    report
}

/// One request at a time, each on a new connection, `gap` apart.
pub async fn ttfb_seq(addr: SocketAddr, count: usize, gap: Duration) -> Report {
    let mut report = Report::default();
    let warm = ttfb_once(addr, 1).await;
    report.errors += warm.errors;
    report.first_error = warm.first_error;
    for _ in 0..count {
        tokio::time::sleep(gap).await;
        report.merge(ttfb_once(addr, 1).await);
    }
    report
}

/// Opens `n` streams that get one event and then nothing, tells the caller (a line on stdout)
/// when all are open, holds them until a line arrives on stdin, then closes them all.
pub async fn hold(addr: SocketAddr, n: usize) -> Report {
    let req = Rc::new(wire::request(1, 0, true));
    let permits = Rc::new(tokio::sync::Semaphore::new(CONNECT_AT_ONCE));
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    // Streams that have their first event, or failed.
    let settled = Rc::new(Cell::new(0usize));
    let all_settled = Rc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (req, permits, mut release) =
            (Rc::clone(&req), Rc::clone(&permits), release_rx.clone());
        let (settled, all_settled) = (Rc::clone(&settled), Rc::clone(&all_settled));
        tasks.push(tokio::task::spawn_local(async move {
            let mut r = Report::default();
            let permit = permits.acquire().await;
            let opened = async {
                let mut s = connect(addr).await?;
                s.write_all(&req).await.map_err(|e| format!("write: {e}"))?;
                // Read up to the first event; the stream then stays open with nothing to read.
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                tokio::time::timeout(RESPONSE_TIMEOUT, async {
                    loop {
                        let k = s.read(&mut buf).await.map_err(|e| format!("hold: {e}"))?;
                        if k == 0 {
                            return Err("hold: closed before the first event".to_string());
                        }
                        got.extend_from_slice(&buf[..k]);
                        if memchr::memmem::find(&got, wire::EVENT_TAIL.as_bytes()).is_some() {
                            return Ok(());
                        }
                    }
                })
                .await
                .map_err(|_| "hold: no first event".to_string())??;
                Ok::<_, String>(s)
            }
            .await;
            drop(permit);
            let s = match opened {
                Ok(s) => {
                    r.events = 1;
                    Some(s)
                }
                Err(e) => {
                    r.error(e);
                    None
                }
            };
            settled.set(settled.get() + 1);
            if settled.get() == n {
                all_settled.notify_one();
            }
            let _ = release.wait_for(|go| *go).await;
            (r, s)
        }));
    }
    if n > 0 {
        all_settled.notified().await;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        let _ = tx.send(());
    });
    println!("held {}", settled.get());
    let _ = rx.await;
    let _ = release_tx.send(true);
    let mut report = Report::default();
    let mut open = Vec::with_capacity(n);
    for t in tasks {
        if let Ok((r, s)) = t.await {
            report.merge(r);
            open.push(s);
        }
    }
    drop(open);
    report
}

/// A burst: `n` streams at once (opened `CONNECT_AT_ONCE` at a time), each `chunks` events
/// `interval_us` apart, all run to their end.
pub async fn burst(addr: SocketAddr, n: usize, chunks: u64, interval_us: u64) -> Report {
    let req = Rc::new(wire::request(chunks, interval_us, false));
    let permits = Rc::new(tokio::sync::Semaphore::new(CONNECT_AT_ONCE));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (req, permits) = (Rc::clone(&req), Rc::clone(&permits));
        tasks.push(tokio::task::spawn_local(async move {
            let mut r = Report::default();
            let permit = permits.acquire().await;
            let mut s = match connect(addr).await {
                Ok(s) => s,
                Err(e) => {
                    r.error(e);
                    return r;
                }
            };
            drop(permit);
            let mut buf = vec![0u8; 4096];
            let mut events = 0;
            exchange(&mut s, &mut buf, &req, None, &mut r, |_, _| events += 1).await;
            r.events = events;
            r
        }));
    }
    let mut report = Report::default();
    for t in tasks {
        if let Ok(r) = t.await {
            report.merge(r);
        }
    }
    report
}
