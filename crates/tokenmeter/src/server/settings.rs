//! The server's own settings: where it listens, and how it holds connections and ends them.
//! The command line maps its flags onto these ([`crate::config`]); every default is here, and
//! the command line's `--help` shows these same constants.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use crate::tls::KeyPair;
use crate::units::HumanDuration;

/// `--listen`'s default: every interface, the port a sidecar's clients are pointed at.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080));

/// `--metrics-listen`'s default: every interface (Prometheus scrapes from another pod).
pub const DEFAULT_METRICS_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 9090));

/// `--max-connections`' default: 16,384 connections, each counted as if it carried a stream
/// (an idle keep-alive connection costs less), are 416 MiB; with the idle process (about
/// 10 MiB) that leaves some 86 MiB of a 512 MiB limit for request bodies being read.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16384;

/// `--listen-backlog`'s default: connections the kernel completes and queues before the
/// accept loop takes them. tokio binds with 128 (the standard library's number), which a burst
/// overflows: 1,000 streams opened at once by 256 clients overflowed it about 100 times, and
/// each of those clients waited for its 1 s SYN retry. 4,096 is Linux's `somaxconn` since 5.4:
/// every client of a gateway reconnecting after a deploy fits, and a queued connection costs
/// the kernel a socket, not the proxy a task.
pub const DEFAULT_LISTEN_BACKLOG: u32 = 4096;

/// `--metrics-max-connections`' default. Prometheus, a second scraper, the kubelet's probes
/// and a few people on the page use a handful; 256 leaves room for a crowd of dashboards and
/// bounds what the listener's connections can cost in all to a few MiB (an idle hyper
/// connection is a task and an 8 KiB read buffer).
pub const DEFAULT_METRICS_MAX_CONNECTIONS: usize = 256;

/// `--drain-timeout`'s default: Kubernetes' own grace period.
pub const DEFAULT_DRAIN_TIMEOUT: HumanDuration = HumanDuration::secs(30);

/// `--header-read-timeout`'s default: long enough for a slow client on a bad link, short
/// enough that a connection which never sends a head is not held for minutes.
pub const DEFAULT_HEADER_READ_TIMEOUT: HumanDuration = HumanDuration::secs(30);

/// Both listeners, and how the server holds their connections.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--listen`: the proxy.
    pub listen: SocketAddr,
    /// `--metrics-listen`: `/metrics`, the probes and the page.
    pub metrics_listen: SocketAddr,
    /// `--listen-backlog`, both listeners': at least 1.
    pub listen_backlog: u32,
    /// `--drain-timeout`: how long open connections may finish after SIGTERM.
    pub drain_timeout: Duration,
    /// `--header-read-timeout`: from accept to a request head (and between heads).
    pub header_read_timeout: Duration,
    /// `--max-connections`: at least 1.
    pub max_connections: usize,
    /// `--metrics-max-connections`: at least 1.
    pub metrics_max_connections: usize,
    /// `--tls-cert/--tls-key`: TLS on the proxy listener.
    pub tls: Option<KeyPair>,
    /// `--metrics-tls-cert/--metrics-tls-key`: TLS on the metrics listener.
    pub metrics_tls: Option<KeyPair>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: DEFAULT_LISTEN,
            metrics_listen: DEFAULT_METRICS_LISTEN,
            listen_backlog: DEFAULT_LISTEN_BACKLOG,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT.get(),
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT.get(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            metrics_max_connections: DEFAULT_METRICS_MAX_CONNECTIONS,
            tls: None,
            metrics_tls: None,
        }
    }
}

impl Settings {
    /// Both listeners on the loopback interface, on ports the system picks: what tests bind.
    pub fn loopback() -> Self {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        Settings {
            listen: loopback,
            metrics_listen: loopback,
            ..Settings::default()
        }
    }
}
