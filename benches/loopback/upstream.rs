//! The test upstream: an HTTP/1.1 server that streams timestamped SSE chunks, and answers a
//! short request (`POST /v1/embeddings`) with one small JSON document and its Content-Length.
//!
//! It is written on raw sockets, not hyper, so that it costs as little as possible on the core it
//! shares with the client: every chunk is one pre-built buffer with 19 digits patched in and one
//! `write` (TCP_NODELAY, so each leaves at once, as an inference server flushes each token). It
//! keeps connections alive between requests and closes one that stays idle for `keepalive` (5 s
//! by default, uvicorn's and so vLLM's), so a proxy's pool meets the same close it meets in front
//! of vLLM.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::wire;

/// Longest request head read; the client's are ~250 bytes.
const MAX_HEAD: usize = 16 * 1024;

/// What one request asks for.
#[derive(Debug, Default)]
struct Ask {
    chunks: u64,
    interval_us: u64,
    first_us: u64,
    hold: bool,
    usage: bool,
    /// A short request: one JSON document, not a stream.
    short: bool,
}

/// Serves until the process is killed.
pub async fn serve(listener: TcpListener, keepalive: Duration) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors: wait for some to close.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(stream, keepalive));
    }
}

async fn connection(mut s: TcpStream, keepalive: Duration) {
    let mut buf = Vec::with_capacity(1024);
    loop {
        let ask = match tokio::time::timeout(keepalive, read_request(&mut s, &mut buf)).await {
            Ok(Some(a)) => a,
            // Idle past the keep-alive, the peer closed, or a request we cannot read.
            Ok(None) | Err(_) => return,
        };
        if respond(&mut s, &ask).await.is_err() {
            return;
        }
    }
}

/// Reads one request (head and body); `None` when the connection ends first.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Ask> {
    let head_end = loop {
        if let Some(i) = memchr::memmem::find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let mut ask = Ask {
        chunks: 10,
        ..Ask::default()
    };
    ask.short = head
        .strip_prefix("POST ")
        .and_then(|rest| rest.strip_prefix(wire::SHORT_PATH))
        .is_some_and(|rest| rest.starts_with(' '));
    let mut length = 0usize;
    for line in head.split("\r\n").skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().ok()?,
            wire::H_CHUNKS => ask.chunks = value.parse().ok()?,
            wire::H_INTERVAL => ask.interval_us = value.parse().ok()?,
            wire::H_FIRST => ask.first_us = value.parse().ok()?,
            wire::H_HOLD => ask.hold = value == "1",
            _ => {}
        }
    }
    while buf.len() < head_end + length {
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = &buf[head_end..head_end + length];
    ask.usage = memchr::memmem::find(body, b"\"include_usage\":true").is_some();
    buf.drain(..head_end + length);
    Some(ask)
}

/// The whole answer to a short request, built once.
fn short_answer() -> &'static [u8] {
    static ANSWER: OnceLock<Vec<u8>> = OnceLock::new();
    ANSWER.get_or_init(|| {
        let body = wire::short_body();
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        answer.extend_from_slice(body);
        answer
    })
}

/// One chunk of the chunked encoding around an SSE payload.
fn chunk(payload: &[u8]) -> Vec<u8> {
    let mut c = format!("{:x}\r\n", payload.len()).into_bytes();
    c.extend_from_slice(payload);
    c.extend_from_slice(b"\r\n");
    c
}

async fn respond(s: &mut TcpStream, ask: &Ask) -> std::io::Result<()> {
    if ask.short {
        // Head and body in one write, as a server answers a request it computed at once.
        return s.write_all(short_answer()).await;
    }
    let usage_header = if ask.usage {
        format!("{}: 1\r\n", wire::H_USAGE)
    } else {
        String::new()
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
         {usage_header}transfer-encoding: chunked\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await?;

    // One buffer for every content chunk: only the timestamp's digits change.
    let mut frame = chunk(
        format!(
            "{}{}{}",
            wire::EVENT_HEAD,
            "0".repeat(wire::TS_DIGITS),
            wire::EVENT_TAIL
        )
        .as_bytes(),
    );
    let digits_at = frame.len() - 2 - wire::EVENT_TAIL.len() - wire::TS_DIGITS;
    let start = Instant::now() + Duration::from_micros(ask.first_us);
    let chunks = if ask.hold { 1 } else { ask.chunks };
    for i in 0..chunks {
        if (ask.interval_us > 0 && i > 0) || (ask.first_us > 0 && i == 0) {
            tokio::time::sleep_until(start + Duration::from_micros(ask.interval_us * i)).await;
        }
        let mut ts = wire::now_ns();
        for d in frame[digits_at..digits_at + wire::TS_DIGITS]
            .iter_mut()
            .rev()
        {
            *d = b'0' + (ts % 10) as u8;
            ts /= 10;
        }
        s.write_all(&frame).await?;
    }
    if ask.hold {
        // Silence until the client (or the proxy in front) goes away.
        let mut tmp = [0u8; 256];
        while s.read(&mut tmp).await? > 0 {}
        return Err(std::io::ErrorKind::ConnectionAborted.into());
    }
    let mut tail = Vec::new();
    if ask.usage {
        tail.extend(chunk(wire::usage_event(ask.chunks).as_bytes()));
    }
    tail.extend(chunk(wire::DONE));
    tail.extend_from_slice(b"0\r\n\r\n");
    s.write_all(&tail).await
}
