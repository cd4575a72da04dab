//! Binding a listener with a backlog that takes a burst of new connections.
//!
//! tokio's `TcpListener::bind` asks the kernel for a backlog of 128 (the standard library's
//! number). A gateway in front of many clients meets a burst of new connections at every
//! deploy and reconnect storm: 1,000 streams opened at once by 256 clients overflowed 128
//! about 100 times per 1,000, and each overflowed client waited for the kernel's 1 s SYN retry.
//! The listeners here are bound with `--listen-backlog` (default 4,096,
//! [`super::settings::DEFAULT_LISTEN_BACKLOG`] says why); the kernel caps it at `net.core.somaxconn` without saying so, so [`bind`] reads that cap and
//! logs once when it is lower than what was asked.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// Where Linux states the cap it puts on every listener's backlog.
const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// Binds `addr` (address reuse on, as tokio's own bind has it) and listens with `backlog`.
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // A restarted proxy must be able to bind while its old connections sit in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    if let Some(cap) = kernel_cap().filter(|cap| *cap < backlog) {
        tracing::warn!(
            %addr,
            asked = backlog,
            granted = cap,
            "the kernel caps listen backlogs at net.core.somaxconn; raise it to take bigger bursts"
        );
    }
    socket.listen(backlog)
}

/// The kernel's cap on a backlog, where it says (Linux); `None` elsewhere.
pub fn kernel_cap() -> Option<u32> {
    std::fs::read_to_string(SOMAXCONN).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::super::settings::DEFAULT_LISTEN_BACKLOG as DEFAULT_BACKLOG;
    use super::*;

    /// The backlog the kernel holds for a listening port, as `ss` reads it (inet_diag's
    /// `Send-Q` of a listening socket is its maximum backlog).
    fn backlog_of(port: u16) -> Option<u32> {
        let out = std::process::Command::new("ss")
            .args(["-ltnH", &format!("sport = :{port}")])
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        text.split_whitespace().nth(2)?.parse().ok()
    }

    #[tokio::test]
    async fn the_listener_gets_the_backlog_asked_for_up_to_the_kernels_cap() {
        let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let listener = bind(loopback, DEFAULT_BACKLOG).expect("bind");
        let port = listener.local_addr().expect("bound").port();
        let Some(granted) = backlog_of(port) else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "`ss` (iproute2) is needed to read a listener's backlog back"
            );
            // Straight to stderr, and into the run's list of skips when tests/run keeps one:
            // libtest hides what a passing test prints with eprintln!, and an unseen skip reads
            // as a pass.
            let line = "SKIPPED server::listen::tests::the_listener_gets_the_backlog_asked_for_up_to_the_kernels_cap: \
                        `ss` (iproute2) is not installed, so the backlog is not read back (apt-get install iproute2)\n";
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            if let Some(list) = std::env::var_os("TOKENMETER_SKIPPED_LIST") {
                let append = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(list);
                let _ = append.and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
            }
            return;
        };
        // What it gets: what was asked, up to the kernel's cap.
        let effective = kernel_cap().map_or(DEFAULT_BACKLOG, |cap| cap.min(DEFAULT_BACKLOG));
        assert_eq!(granted, effective);
        // tokio's own bind gets 128: this is what the function is for.
        let plain = TcpListener::bind(loopback).await.expect("bind");
        let port = plain.local_addr().expect("bound").port();
        assert_eq!(backlog_of(port), Some(128));
    }
}
