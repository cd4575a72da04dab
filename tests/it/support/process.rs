//! tokenmeter as a process of its own: for what must be measured or limited apart from the
//! test process (its RSS, a memory cgroup) and must survive what the test throws at it.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `tokenmeter` binary, killed when dropped.
pub struct Binary {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
}

/// A loopback port free now (bound and released: the binary takes it a moment later).
fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

impl Binary {
    /// Starts the proxy in front of `upstream` with `extra` flags, and waits until it listens.
    pub fn start(upstream: &str, extra: &[&str]) -> Binary {
        Binary::start_in(None, upstream, extra)
    }

    /// The same, in the cgroup whose `cgroup.procs` is `procs` from its first instruction (a
    /// shell joins it, then becomes tokenmeter), so every page it touches is charged there.
    pub fn start_in(procs: Option<&std::path::Path>, upstream: &str, extra: &[&str]) -> Binary {
        let (addr, metrics_addr) = (free_port(), free_port());
        let (listen, metrics) = (addr.to_string(), metrics_addr.to_string());
        let bin = env!("CARGO_BIN_EXE_tokenmeter");
        let mut argv: Vec<&str> = vec![
            "--upstream",
            upstream,
            "--listen",
            &listen,
            "--metrics-listen",
            &metrics,
            "--no-ui",
        ];
        let extra = super::with_engine_metrics_off(extra);
        argv.extend_from_slice(&extra);
        let mut cmd = match procs {
            None => Command::new(bin),
            Some(procs) => {
                let mut c = Command::new("sh");
                c.args(["-c", r#"echo $$ > "$0" && exec "$@""#])
                    .arg(procs)
                    .arg(bin);
                c
            }
        };
        let child = cmd
            .args(&argv)
            .env("TOKENMETER_LOG", "warn,h2=error")
            .env_remove("TOKENMETER_GPUS")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tokenmeter");
        let mut b = Binary {
            child,
            addr,
            metrics_addr,
        };
        let start = Instant::now();
        while TcpStream::connect(addr).is_err() || TcpStream::connect(metrics_addr).is_err() {
            assert!(b.alive(), "tokenmeter exited at start");
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "tokenmeter never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        b
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The process's resident memory now, in bytes (`VmRSS`).
    pub fn rss(&self) -> u64 {
        status_kib(self.child.id(), "VmRSS:") * 1024
    }

    /// Its own resident memory now, in bytes (`RssAnon`: the heap and stacks, not the pages of
    /// the binary's file, which the page cache shares).
    pub fn anon_rss(&self) -> u64 {
        status_kib(self.child.id(), "RssAnon:") * 1024
    }

    /// The most it has been resident, in bytes (`VmHWM`).
    pub fn peak_rss(&self) -> u64 {
        status_kib(self.child.id(), "VmHWM:") * 1024
    }

    /// `http://ADDR` of the proxy listener.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
