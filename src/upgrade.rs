//! Protocol upgrades (WebSocket): forwarding the request's intent, and joining the two
//! connections once the upstream agrees.
//!
//! `Connection` and `Upgrade` are hop-by-hop headers, so the proxy strips them, which makes a
//! WebSocket handshake impossible through it. For a request that asks to upgrade
//! ([`requested`]), the proxy forwards `Connection: upgrade` and the `Upgrade` value after
//! stripping ([`restore`]), over an HTTP/1.1 connection of its own (HTTP/2 has no `Upgrade`).
//! When the upstream answers `101 Switching Protocols`, [`join`] waits for both sides to hand
//! over their connections (hyper's upgrade API: the client's once the 101 is written to it,
//! the upstream's once the 101 is read) and copies bytes both ways, untouched, until both
//! directions are closed or `stop` fires (the drain's deadline). Nothing is parsed: reading
//! tokens out of WebSocket frames is not done here.

use std::future::Future;

use http::header::{self, HeaderMap, HeaderValue};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// Why a joined connection ended badly.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("the client's connection did not upgrade: {0}")]
    Client(hyper::Error),
    #[error("the upstream's connection did not upgrade: {0}")]
    Upstream(hyper::Error),
    #[error("copying between the upgraded connections: {0}")]
    Io(#[from] std::io::Error),
    #[error("cut by the drain timeout")]
    Stopped,
}

/// Bytes copied each way over a joined connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Joined {
    pub from_client: u64,
    pub from_upstream: u64,
}

/// The `Upgrade` value of a request that asks to switch protocols: `Connection` lists the
/// `upgrade` token (it is a comma-separated, case-insensitive list) and `Upgrade` is present.
pub fn requested(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if !asks {
        return None;
    }
    headers.get(header::UPGRADE).cloned()
}

/// Puts the upgrade request (or a 101's answer) back after hop-by-hop headers were stripped.
pub fn restore(headers: &mut HeaderMap, upgrade: HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, upgrade);
}

/// Joins the client's and the upstream's upgraded connections until both directions close,
/// or until `stop` completes.
pub async fn join(
    client: OnUpgrade,
    upstream: OnUpgrade,
    stop: impl Future<Output = ()>,
) -> Result<Joined, UpgradeError> {
    let work = async {
        // The upstream's connection is ready first (its 101 is already read); the client's
        // when hyper has written our 101 to it.
        let upstream = upstream.await.map_err(UpgradeError::Upstream)?;
        let client = client.await.map_err(UpgradeError::Client)?;
        let (mut c, mut u) = (TokioIo::new(client), TokioIo::new(upstream));
        let (from_client, from_upstream) = tokio::io::copy_bidirectional(&mut c, &mut u).await?;
        Ok(Joined {
            from_client,
            from_upstream,
        })
    };
    tokio::select! {
        r = work => r,
        _ = stop => Err(UpgradeError::Stopped),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn an_upgrade_needs_both_headers_and_the_token() {
        let ws = headers(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert_eq!(requested(&ws), Some(HeaderValue::from_static("websocket")));
        let listed = headers(&[
            ("connection", "keep-alive, UPGRADE"),
            ("upgrade", "websocket"),
        ]);
        assert!(requested(&listed).is_some());
        let two_lines = headers(&[
            ("connection", "keep-alive"),
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
        ]);
        assert!(requested(&two_lines).is_some());
        assert!(requested(&headers(&[("upgrade", "websocket")])).is_none());
        assert!(requested(&headers(&[("connection", "upgrade")])).is_none());
        let lookalike = headers(&[("connection", "upgraded"), ("upgrade", "websocket")]);
        assert!(requested(&lookalike).is_none());
    }

    #[test]
    fn restore_sets_exactly_the_two_headers() {
        let mut h = headers(&[("content-type", "text/plain")]);
        restore(&mut h, HeaderValue::from_static("websocket"));
        assert_eq!(
            h.get("connection").map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
        assert_eq!(
            h.get("upgrade").map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(h.len(), 3);
    }
}
