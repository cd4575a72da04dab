//! A raw HTTP/1.1 server's side of the wire, for upstreams that must control every byte and
//! every close (hyper would answer, or keep the connection, on its own).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Reads one request (head and `content-length` body) from `s` (plain TCP or TLS); `None` once
/// the peer is gone, or when no byte of a head came within `head_wait`.
pub async fn read_request<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    head_wait: Option<Duration>,
) -> Option<()> {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut tmp = [0u8; 4096];
        let read = match head_wait {
            Some(d) => tokio::time::timeout(d, s.read(&mut tmp)).await.ok()?,
            None => s.read(&mut tmp).await,
        };
        match read {
            Ok(n) if n > 0 => buf.extend_from_slice(&tmp[..n]),
            _ => return None,
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut tmp = [0u8; 4096];
        match s.read(&mut tmp).await {
            Ok(n) if n > 0 => buf.extend_from_slice(&tmp[..n]),
            _ => return None,
        }
    }
    buf.drain(..head_end + length);
    Some(())
}
