//! What the request path is set up with: where requests go and each layer's limits.
//!
//! The proxy owns these, with their defaults; the command line maps its flags onto them once and
//! builds nothing else of the path. A test or the demo can build one directly.

use std::time::Duration;

use http::Uri;

use crate::units::HumanDuration;

/// Where requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `scheme://host:port`, no path.
    pub origin: Uri,
    /// A path prefix put before every request path ("" for none).
    pub base_path: String,
}

impl Target {
    /// True for an `https://` upstream.
    pub fn is_https(&self) -> bool {
        self.origin.scheme_str() == Some("https")
    }

    /// The host (without an IPv6 literal's brackets) and port connections go to.
    pub fn host_and_port(&self) -> (String, u16) {
        let host = self.origin.host().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = self
            .origin
            .port_u16()
            .unwrap_or(if self.is_https() { 443 } else { 80 });
        (host.to_string(), port)
    }
}

/// `--max-in-flight`'s default: 8,192 open streams at about 26 KiB each (the measured memory
/// of an open stream, docs/bench.md) are 208 MiB, under half of a 512 MiB sidecar limit.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 8192;

/// `--retry-after`'s default: a shed request is told to come back in a second, when a
/// stream or two has ended (an inference server's short requests last about that long).
pub const DEFAULT_RETRY_AFTER: u32 = 1;

/// `--max-request-body`'s default: 8 MiB holds a 128k-token prompt with room for images' URLs;
/// a larger body is streamed through unread.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 8 << 20;

/// `--upstream-timeout`'s default: a long prompt on a busy engine can queue for minutes before
/// its first byte; five minutes is past any engine's own queue limit.
pub const DEFAULT_UPSTREAM_TIMEOUT: HumanDuration = HumanDuration::secs(300);

/// `--idle-timeout`'s default: a silence of five minutes inside a stream is a dead upstream,
/// never a slow one (a reasoning model still sends its events).
pub const DEFAULT_IDLE_TIMEOUT: HumanDuration = HumanDuration::secs(300);

/// `--pool-idle-timeout`'s default: nginx's upstream keep-alive.
pub const DEFAULT_POOL_IDLE_TIMEOUT: HumanDuration = HumanDuration::secs(60);

/// `--connect-timeout`'s default: a connection on a cluster network takes milliseconds; five
/// seconds covers a TLS handshake to a far endpoint and a DNS retry.
pub const DEFAULT_CONNECT_TIMEOUT: HumanDuration = HumanDuration::secs(5);

/// Admission's two limits ([`super::admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// `--max-in-flight`: requests proxied at once (at least 1); the rest are shed.
    pub max_in_flight: usize,
    /// `--retry-after`: the seconds a shed request is told to wait (at least 1).
    pub retry_after: u32,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            retry_after: DEFAULT_RETRY_AFTER,
        }
    }
}

/// The settings of the request path's layers, outermost first.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Admission: both of its limits.
    pub admission: Admission,
    /// Inspection: `--max-request-body`, the largest JSON body read whole for its model.
    pub max_request_body: usize,
    /// Inspection: `--inject-usage` (`auto`: once the upstream is known, [`crate::inject::policy`]).
    pub inject_usage: crate::inject::Setting,
    /// Metering: `--idle-timeout`, the longest silence between body frames; `None`: no limit.
    pub idle_timeout: Option<Duration>,
    /// `--upstream-timeout`: the longest wait for the response head (then 504); `None`: no limit.
    pub upstream_timeout: Option<Duration>,
    /// The upstream: `--upstream`.
    pub upstream: Target,
    /// `--upstream-http2`: speak HTTP/2 to the upstream.
    pub upstream_http2: bool,
    /// `--pool-idle-timeout`: how long an idle upstream connection is kept.
    pub pool_idle_timeout: Duration,
    /// `--connect-timeout`, over DNS, TCP and the TLS handshake; `None`: no limit.
    pub connect_timeout: Option<Duration>,
}

impl Settings {
    /// The flags' defaults in front of `upstream`; a test or the demo changes what it needs with
    /// `Settings { .., ..Settings::new(upstream) }`.
    pub fn new(upstream: Target) -> Self {
        Settings {
            admission: Admission::default(),
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            inject_usage: crate::inject::Setting::default(),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT.get()),
            upstream_timeout: Some(DEFAULT_UPSTREAM_TIMEOUT.get()),
            upstream,
            upstream_http2: false,
            pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT.get(),
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT.get()),
        }
    }
}
