//! The short-requests scenario's client: small non-streamed requests (embeddings, `/v1/models`,
//! classification) at a fixed rate, where a proxy's cost is per request, not per chunk.
//!
//! It is an open loop: request `i` is due at `i / rate` seconds after the start, whatever the
//! answers before it did, and the due requests are spread round-robin over a fixed set of
//! kept-alive connections (HTTP/1.1 has one request in flight per connection, as a client pool
//! holds it). A request whose connection is still busy with an earlier answer at its due time is
//! sent when that answer ends, and its latency counts from its due time, so a slow answer shows
//! in the latency of every request it held up (no coordinated omission). A request whose
//! connection was free counts from when it was sent: the client's timer wakes up to 1 ms late,
//! which is the client's delay, not the target's. Latency ends when the whole answer is read.
//!
//! Every answer is checked: status 200, a Content-Length framing the upstream's exact document,
//! and nothing after it. Anything else is an error, and the connection is opened anew.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::client::{connect, Report};
use crate::wire;

/// Read buffer per connection: the answer is about 1 KiB, its head a few hundred bytes.
const READ_BUF: usize = 16 * 1024;
/// Longest one short answer may take before it counts as an error.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time between the connections' warm-up and the first due request.
const SETTLE: Duration = Duration::from_millis(50);

/// Requests one run schedules: `rate` per second for `secs`.
pub fn scheduled(rate: f64, secs: f64) -> u64 {
    (rate * secs).round().max(1.0) as u64
}

/// How one answer ended: whether the target will close the connection after it.
struct Answer {
    close: bool,
}

/// Reads one answer from `s` and checks it against the upstream's document.
async fn read_answer(s: &mut TcpStream, buf: &mut [u8]) -> Result<Answer, String> {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let mut have = 0;
    let mut framed = None::<(usize, bool)>;
    loop {
        if let Some((end, close)) = framed {
            if have > end {
                return Err(format!("{} bytes after the answer", have - end));
            }
            if have == end {
                let body = wire::short_body();
                if buf[end - body.len()..end] != *body {
                    return Err("answer's body differs from the upstream's".into());
                }
                return Ok(Answer { close });
            }
        }
        if have == buf.len() {
            return Err("answer larger than the read buffer".into());
        }
        let n = match tokio::time::timeout_at(deadline, s.read(&mut buf[have..])).await {
            Err(_) => return Err("answer timed out".into()),
            Ok(Err(e)) => return Err(format!("read: {e}")),
            Ok(Ok(0)) => return Err("connection closed mid-answer".into()),
            Ok(Ok(n)) => n,
        };
        have += n;
        if framed.is_none() {
            let Some(head_end) = memchr::memmem::find(&buf[..have], b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            if !head.starts_with("http/1.1 200") {
                let line = head.lines().next().unwrap_or("").to_string();
                return Err(format!("status: {line}"));
            }
            let header = |name: &str| {
                head.split("\r\n")
                    .skip(1)
                    .filter_map(|l| l.split_once(':'))
                    .find(|(n, _)| n.trim() == name)
                    .map(|(_, v)| v.trim().to_string())
            };
            let length: usize = header("content-length")
                .ok_or("answer without content-length")?
                .parse()
                .map_err(|_| "bad content-length")?;
            let body = wire::short_body();
            if length != body.len() {
                return Err(format!("answer of {length} bytes, not {}", body.len()));
            }
            let close = header("connection").is_some_and(|v| v == "close");
            framed = Some((head_end + 4 + length, close));
        }
    }
}

/// One connection's share of the schedule: requests `first`, `first + every`, ... below
/// `total`, the first due at `t0`. Returns its report and when its last answer ended.
async fn connection(
    addr: SocketAddr,
    mut s: TcpStream,
    req: Rc<Vec<u8>>,
    t0: Instant,
    rate: f64,
    (first, every, total): (u64, u64, u64),
) -> (Report, Instant) {
    let mut r = Report::default();
    let mut buf = vec![0u8; READ_BUF];
    let mut lat = Vec::with_capacity((total / every + 1) as usize);
    let mut last = t0;
    let mut i = first;
    while i < total {
        let due = t0 + Duration::from_secs_f64(i as f64 / rate);
        i += every;
        let start = if Instant::now() < due {
            tokio::time::sleep_until(due).await;
            Instant::now()
        } else {
            due
        };
        let answered = match s.write_all(&req).await {
            Ok(()) => read_answer(&mut s, &mut buf).await,
            Err(e) => Err(format!("write: {e}")),
        };
        last = Instant::now();
        let reopen = match answered {
            Ok(a) => {
                lat.push((last - start).as_nanos() as u64);
                r.responses += 1;
                a.close
            }
            Err(e) => {
                r.error(e);
                true
            }
        };
        if reopen && i < total {
            // A new connection, as a client's pool would open.
            match connect(addr).await {
                Ok(n) => s = n,
                Err(e) => {
                    r.error(e);
                    break;
                }
            }
        }
    }
    r.events = lat.len() as u64;
    r.samples_ns = lat;
    (r, last)
}

/// `rate` requests/s for `secs` over `conns` kept-alive connections. Every connection first
/// sends one unmeasured request, all at once, so the samples are of connections kept alive on
/// both sides of a proxy. `secs` of the report is the schedule's length, or longer when the
/// last answer ended after it: requests answered per second of it is the rate the target
/// achieved.
pub async fn short(addr: SocketAddr, rate: f64, conns: usize, secs: f64) -> Report {
    let total = scheduled(rate, secs);
    let req = Rc::new(wire::short_request());
    let mut report = Report::default();
    // The warm-up requests go at once, so a proxy opens as many upstream connections as it
    // would for as many requests in flight, before the first sample.
    let warming: Vec<_> = (0..conns.max(1))
        .map(|_| {
            let req = Rc::clone(&req);
            tokio::task::spawn_local(async move {
                let mut buf = vec![0u8; READ_BUF];
                let mut s = connect(addr).await?;
                s.write_all(&req).await.map_err(|e| format!("write: {e}"))?;
                let a = read_answer(&mut s, &mut buf).await?;
                Ok::<_, String>(if a.close { connect(addr).await? } else { s })
            })
        })
        .collect();
    let mut open = Vec::with_capacity(conns);
    for w in warming {
        match w.await {
            Ok(Ok(s)) => open.push(s),
            Ok(Err(e)) => report.error(e),
            Err(e) => report.error(format!("warm-up: {e}")),
        }
    }
    let t0 = Instant::now() + SETTLE;
    let every = open.len() as u64;
    let mut tasks = Vec::new();
    for (k, s) in open.into_iter().enumerate() {
        let plan = (k as u64, every, total);
        tasks.push(tokio::task::spawn_local(connection(
            addr,
            s,
            Rc::clone(&req),
            t0,
            rate,
            plan,
        )));
    }
    let mut last = t0;
    for t in tasks {
        if let Ok((r, l)) = t.await {
            report.merge(r);
            last = last.max(l);
        }
    }
    report.secs = secs.max((last - t0).as_secs_f64());
    report
}
