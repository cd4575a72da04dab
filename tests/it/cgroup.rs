//! Under a memory limit: tokenmeter in a memory cgroup of 64 MiB meets a flood of 20,000
//! connections and 5,000 requests, and is never OOM-killed: the admitted streams complete byte
//! for byte, the rest are shed, and its memory stays under the limit. Where the machine lets no
//! test make a memory cgroup (cgroup v2 with the memory controller delegated, or v1's memory
//! hierarchy, both writable), the test says so loudly and passes; in CI it fails.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::net::TcpStream;

use tokenmeter::metrics::names;

use crate::support::client::{chat_request, get_text};
use crate::support::metrics::metric;
use crate::support::process::Binary;
use crate::support::upstream::{self, openai_chat, script_bytes, Reply, Step};
use crate::support::{in_ci, serial};

const LIMIT: u64 = 64 << 20;

/// A memory cgroup made for one test, removed when dropped.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    /// A cgroup limited to `limit` bytes without swap, under this process's own where it can.
    fn make(limit: u64) -> Result<Cgroup, String> {
        let name = format!("tokenmeter-test-{}", std::process::id());
        let v2_root = Path::new("/sys/fs/cgroup");
        let v2 = std::fs::read_to_string(v2_root.join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"));
        let (dir, files): (PathBuf, &[(&str, String)]) = if v2 {
            (
                v2_root.join(&name),
                &[
                    ("memory.max", limit.to_string()),
                    ("memory.swap.max", "0".into()),
                ],
            )
        } else {
            let v1 = Path::new("/sys/fs/cgroup/memory");
            if !v1.join("memory.limit_in_bytes").exists() {
                return Err("no cgroup v2 memory controller and no v1 memory hierarchy".into());
            }
            let own = std::fs::read_to_string("/proc/self/cgroup")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
                })
                .unwrap_or_default();
            let parent = v1.join(own.trim_start_matches('/'));
            let parent = if parent.is_dir() {
                parent
            } else {
                v1.to_path_buf()
            };
            (
                parent.join(&name),
                &[("memory.limit_in_bytes", limit.to_string())],
            )
        };
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cg = Cgroup { dir, v2 };
        for (f, v) in files {
            std::fs::write(cg.dir.join(f), v)
                .map_err(|e| format!("cannot write {f} in {}: {e}", cg.dir.display()))?;
        }
        if !cg.v2 {
            // Without swap too, where the kernel accounts it (memsw), so the limit is real.
            let _ = std::fs::write(
                cg.dir.join("memory.memsw.limit_in_bytes"),
                limit.to_string(),
            );
        }
        Ok(cg)
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// OOM kills in the cgroup so far.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// The most the cgroup has been charged, in bytes.
    fn peak(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty by now (the binary was killed); rmdir removes a cgroup.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A stream of 20 chunks 50 ms apart: about a second in flight.
fn stream() -> Vec<Step> {
    openai_chat(Duration::ZERO, 20, Duration::from_millis(50), true)
}

/// 50 HTTP/2 connections, each carrying 100 streams at once, so the 5,000 requests arrive
/// together; meanwhile 20,000 connections come and go, at most 12,000 open at once (the test's
/// own descriptor limit is 20,000), each held a second without a byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_64_mib_cgroup_a_flood_is_shed_and_never_oom_killed() {
    let cg = match Cgroup::make(LIMIT) {
        Ok(cg) => cg,
        Err(why) if !in_ci() => {
            crate::support::skip(&crate::support::current_test(), &why);
            return;
        }
        Err(why) => panic!("{why}"),
    };
    let _turn = serial().await;
    let up = upstream::spawn(|_| Reply::sse(stream())).await;
    let mut proxy = Binary::start_in(
        Some(&cg.procs()),
        &up.url(),
        &["--max-connections", "2000", "--max-in-flight", "500"],
    );
    let want = Arc::new(script_bytes(&stream()));
    // Sampled through the flood: the process's own memory, apart from the binary's pages.
    let pid = proxy.child.id();
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = Arc::clone(&sampling);
        std::thread::spawn(move || {
            let mut peak = 0u64;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(anon_kib(pid) * 1024);
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let mut senders = Vec::new();
    for _ in 0..50 {
        let tcp = TcpStream::connect(proxy.addr).await.expect("connect");
        let (send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .expect("h2 handshake");
        tokio::spawn(conn);
        senders.push(send);
    }
    let addr = proxy.addr;
    let held = Arc::new(tokio::sync::Semaphore::new(12_000));
    let flood = tokio::spawn(async move {
        let mut opened = 0usize;
        let mut tasks = Vec::new();
        for _ in 0..20_000 {
            let permit = Arc::clone(&held).acquire_owned().await.expect("semaphore");
            tasks.push(tokio::spawn(async move {
                let tcp = TcpStream::connect(addr).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                drop((tcp, permit));
            }));
            opened += 1;
        }
        for t in tasks {
            let _ = t.await;
        }
        opened
    });
    let mut requests = Vec::new();
    for send in &senders {
        for _ in 0..100 {
            let mut send = send.clone();
            let want = Arc::clone(&want);
            requests.push(tokio::spawn(async move {
                let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(chat_request(true, true))))
                    .expect("request");
                // An error is returned, not panicked on, so that a process killed mid-flood
                // is reported as the OOM kill it is, not as the broken pipe it leaves behind.
                let resp = send
                    .send_request(req)
                    .await
                    .map_err(|e| format!("no response: {e}"))?;
                let status = resp.status().as_u16();
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("status {status}, then the body failed: {e}"))?
                    .to_bytes();
                if status == 200 && body[..] != want[..] {
                    return Err(format!("an admitted stream differs ({} bytes)", body.len()));
                }
                Ok::<u16, String>(status)
            }));
        }
    }
    let (mut ok, mut shed, mut failed) = (0, 0, Vec::new());
    for r in requests {
        match r.await.expect("request task") {
            Ok(200) => ok += 1,
            Ok(503) => shed += 1,
            Ok(other) => failed.push(format!("status {other}")),
            Err(e) => failed.push(e),
        }
    }
    let flooded = flood.await.expect("flood task");
    assert_eq!(
        cg.oom_kills(),
        0,
        "OOM kills in the cgroup (peak {} MiB)",
        cg.peak() >> 20
    );
    assert!(proxy.alive(), "tokenmeter died");
    assert!(
        failed.is_empty(),
        "{} requests failed, the first: {}",
        failed.len(),
        failed[0]
    );
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let anon = sampler.join().expect("sampler");
    let (peak, rss) = (cg.peak(), proxy.peak_rss());
    let s = get_text(&format!("http://{}/metrics", proxy.metrics_addr)).await;
    let counted = |outcome: &str| {
        metric(names::REQUESTS_TOTAL)
            .label("outcome", outcome)
            .value(&s)
    };
    let refused = metric(names::CONNECTIONS_REFUSED_TOTAL).value(&s);
    eprintln!(
        "{ok} streamed, {shed} shed, {flooded} flood connections ({refused} refused); \
         cgroup peak {} MiB; tokenmeter peak anonymous RSS {} MiB (VmHWM {} MiB, with the \
         binary's file pages)",
        peak >> 20,
        anon >> 20,
        rss >> 20
    );
    assert_eq!(ok + shed, 5_000);
    assert!(ok >= 500 && shed > 0, "{ok} streamed, {shed} shed");
    assert_eq!(
        (counted("complete"), counted("shed")),
        (ok as f64, shed as f64)
    );
    assert!(
        peak <= LIMIT && anon < LIMIT,
        "cgroup peak {peak}, anonymous RSS {anon}"
    );
}

/// `RssAnon` of a process, in KiB (0 once it is gone).
fn anon_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
