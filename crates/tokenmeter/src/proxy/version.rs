//! Which HTTP version the upstream is spoken to in, chosen once for the process.
//!
//! Each version has its own client and connector, as pingora keeps one per version: HTTP/1.1
//! goes through the [`Pool`](super::pool::Pool), HTTP/2 through hyper-util's client, and a
//! request is given to the one the version names, never to one and then back to the other.
//!
//! - `http://` is HTTP/1.1, and `--upstream-http2` HTTP/2 (prior knowledge, or `h2` by ALPN
//!   over TLS), from the start.
//! - An `https://` upstream says which by ALPN. The first request connects once, offering `h2`
//!   and `http/1.1`, and what the server picks holds from then on. That connection is not
//!   wasted when it settled HTTP/1.1: the request that made it is sent on it, as the pool's
//!   first connection. One that settled `h2` is closed and hyper-util's client opens its own,
//!   once for the process. A connection that fails settles nothing: the request fails (502,
//!   its cause named as any other's), and the next request tries again. Requests that arrive
//!   while the first connects wait for it, so a burst at start-up makes one connection to ask,
//!   not one each.

use hyper_util::client::legacy::connect::Connection as _;
use tokio::sync::OnceCell;
use tower::Service;

use crate::error::BoxError;
use crate::tls::client::{Conn, Connector};

/// An HTTP version the upstream is spoken to in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamVersion {
    Http1,
    Http2,
}

/// The upstream's version: fixed, or learnt by ALPN on the first connection.
pub struct VersionChoice {
    settled: OnceCell<UpstreamVersion>,
    /// How the first connection is made when the version is not fixed: a connector offering
    /// both, and the upstream's origin.
    ask: Option<(Connector, http::Uri)>,
}

impl VersionChoice {
    /// A version known from the start.
    pub fn fixed(version: UpstreamVersion) -> Self {
        VersionChoice {
            settled: OnceCell::new_with(Some(version)),
            ask: None,
        }
    }

    /// A version the first connection's ALPN will tell: `connector` offers `h2` and `http/1.1`.
    pub fn by_alpn(connector: Connector, origin: http::Uri) -> Self {
        VersionChoice {
            settled: OnceCell::new(),
            ask: Some((connector, origin)),
        }
    }

    /// The version, when it is settled: without waiting, for every request after the first.
    pub fn settled(&self) -> Option<UpstreamVersion> {
        self.settled.get().copied()
    }

    /// The version, and, to the one caller whose connection just settled it as HTTP/1.1, that
    /// connection, to send its request on. Boxed: a TLS connection is kilobytes, and every
    /// request's future would otherwise hold room for one.
    pub async fn get(&self) -> Result<(UpstreamVersion, Option<Box<Conn>>), BoxError> {
        let mut first = None;
        let version = *self
            .settled
            .get_or_try_init(|| async {
                let Some((connector, origin)) = &self.ask else {
                    // `fixed` set the cell, so a fixed choice never gets here.
                    return Ok(UpstreamVersion::Http1);
                };
                let io = connector.clone().call(origin.clone()).await?;
                if io.connected().is_negotiated_h2() {
                    return Ok(UpstreamVersion::Http2);
                }
                first = Some(Box::new(io));
                Ok::<_, BoxError>(UpstreamVersion::Http1)
            })
            .await?;
        Ok((version, first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fixed_version_asks_nobody() {
        for v in [UpstreamVersion::Http1, UpstreamVersion::Http2] {
            let (got, first) = VersionChoice::fixed(v).get().await.expect("fixed");
            assert_eq!(got, v);
            assert!(first.is_none());
        }
    }
}
