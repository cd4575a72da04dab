//! The tools' subcommands as a user runs them, through the `tokenmeter` binary: the demo, the
//! bench's command line (its errors and exit codes, the files it names), and the simulator's
//! one-core measurement. What the tools do is tested beside them, in `crates/tools/tests`;
//! these need the binary, which only this package builds.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::Value;
use tokenmeter_testkit::sim::{chat, connect, request, stats};
use tokenmeter_testkit::tempdir;
use tokenmeter_tools::bench;

use tokenmeter::metrics::names;

use crate::support::metrics::metric;
use crate::support::{sim_flags, start_sim};

// === the demo ===

/// Reads the demo's output up to the line naming its metrics URL: the address it serves.
fn metrics_addr(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> String {
    lines
        .map_while(Result::ok)
        .find_map(|l| {
            l.trim()
                .strip_prefix("metrics:")
                .and_then(|u| u.trim().strip_prefix("http://"))
                .and_then(|u| u.strip_suffix("/metrics"))
                .map(str::to_string)
        })
        .expect("the metrics URL")
}

fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to /metrics");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

#[test]
fn demo_runs_headless_and_exits_zero() {
    let _turn = crate::support::serial_blocking();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args([
            "demo",
            "--duration",
            "15s",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .env_remove("TOKENMETER_LISTEN")
        .env_remove("TOKENMETER_METRICS_LISTEN")
        .env_remove("TOKENMETER_GPUS")
        .env("TOKENMETER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the demo");
    let started = Instant::now();
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut metrics_addr = None;
    let mut mid_run = None;
    let mut lines = Vec::new();
    for line in stdout.lines() {
        let line = line.expect("utf-8 output");
        if let Some(rest) = line.trim().strip_prefix("metrics:") {
            let url = rest.trim();
            metrics_addr = url
                .strip_prefix("http://")
                .and_then(|u| u.strip_suffix("/metrics"))
                .map(str::to_string);
        }
        // Scrape while the load runs, once the ramp is well up.
        if mid_run.is_none() && line.trim_start().starts_with("8s") {
            mid_run = Some(scrape(
                metrics_addr
                    .as_deref()
                    .expect("the metrics URL is printed first"),
            ));
        }
        lines.push(line);
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the demo runs too long"
        );
    }
    let status = child.wait().expect("wait");
    let out = lines.join("\n");
    assert!(status.success(), "exit {status:?}\n{out}");
    // The page's address comes first, on the metrics listener.
    let metrics_addr = metrics_addr.expect("the metrics URL");
    assert_eq!(
        lines[0],
        format!("Open http://{metrics_addr}/ in a browser: tokenmeter's live page.")
    );
    let m = mid_run.unwrap_or_else(|| panic!("no row at 8s:\n{out}"));
    let tokens = metric(names::OUTPUT_TOKENS_TOTAL)
        .label("model", "sim-llama-8b")
        .value(&m);
    let complete = metric(names::REQUESTS_TOTAL)
        .label("outcome", "complete")
        .sum(&m);
    assert!(
        tokens > 0.0 && complete > 0.0,
        "tokens {tokens}, complete {complete}\n{m}"
    );
    let rows = lines
        .iter()
        .filter(|l| l.trim_end().ends_with(char::is_numeric) && l.contains("ms"))
        .count();
    assert!(rows >= 10, "a row a second:\n{out}");
    // The closing summary: client and proxy totals agree exactly.
    let client = lines
        .iter()
        .find(|l| l.starts_with("The clients sent"))
        .unwrap_or_else(|| panic!("{out}"));
    let proxy = lines
        .iter()
        .find(|l| l.starts_with("tokenmeter counted"))
        .unwrap_or_else(|| panic!("{out}"));
    let number_before = |l: &str, word: &str| -> u64 {
        let words: Vec<&str> = l.split_whitespace().collect();
        let i = words
            .iter()
            .position(|w| *w == word)
            .unwrap_or_else(|| panic!("{word} in {l}"));
        words[i - 1]
            .trim_start_matches('(')
            .parse()
            .unwrap_or_else(|_| panic!("{l}"))
    };
    let client_tokens = number_before(client, "output");
    assert!(client_tokens > 0);
    assert_eq!(
        client_tokens,
        number_before(proxy, "output"),
        "{client}\n{proxy}"
    );
    assert_eq!(number_before(client, "failed,"), 0, "{client}");
    assert_eq!(number_before(client, "cut"), 0, "{client}");
}

#[test]
fn demo_with_no_ui_serves_no_page() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args([
            "demo",
            "--no-ui",
            "--duration",
            "2s",
            "--max-concurrency",
            "2",
        ])
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .env_remove("TOKENMETER_LISTEN")
        .env_remove("TOKENMETER_METRICS_LISTEN")
        .env("TOKENMETER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the demo");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("utf-8");
    assert!(first.starts_with("tokenmeter demo:"), "{first}");
    let addr = metrics_addr(&mut lines);
    let mut s = std::net::TcpStream::connect(&addr).expect("connect");
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut page = String::new();
    s.read_to_string(&mut page).expect("read");
    assert!(page.starts_with("HTTP/1.1 404"), "{page}");
    assert!(scrape(&addr).contains("tokenmeter_build_info"));
    // Read the rest, so the demo's table never meets a closed pipe.
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(!rest.iter().any(|l| l.starts_with("Open ")), "{rest:?}");
    assert!(child.wait().expect("wait").success());
}

/// The demo is the first thing a newcomer sees: on a quiet machine its capacity model must be
/// trusted within its first two minutes, and until it is, the reasons are on its metrics.
#[test]
fn the_demos_capacity_model_is_trusted_within_two_minutes() {
    let _turn = crate::support::serial_blocking();
    const LIMIT: Duration = Duration::from_secs(120);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(["demo", "--no-ui", "--duration", "150s"])
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .env_remove("TOKENMETER_LISTEN")
        .env_remove("TOKENMETER_METRICS_LISTEN")
        .env_remove("TOKENMETER_GPUS")
        .env("TOKENMETER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the demo");
    let started = Instant::now();
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr = metrics_addr(&mut lines);
    // Keep reading the table, so the demo never meets a closed pipe.
    let reader = std::thread::spawn(move || lines.map_while(Result::ok).count());
    let (trusted_after, last) = loop {
        std::thread::sleep(Duration::from_secs(2));
        let scraped = scrape(&addr);
        if metric(names::capacity::CHECK_TRUSTED).sum_or_zero_if_absent(&scraped) == 1.0 {
            break (Some(started.elapsed()), scraped);
        }
        if started.elapsed() > LIMIT {
            break (None, scraped);
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    let capacity: String = last
        .lines()
        .filter(|l| l.starts_with("tokenmeter_capacity_"))
        .map(|l| format!("{l}\n"))
        .collect();
    let at = trusted_after.unwrap_or_else(|| panic!("not trusted within {LIMIT:?}:\n{capacity}"));
    eprintln!("the demo's model trusted after {:.0} s", at.as_secs_f64());
    // Its answers are exported with it.
    assert!(
        last.contains("tokenmeter_capacity_supported{class=\"interactive\"} 1"),
        "{capacity}"
    );
}

// === capacity (a measurement, run by hand) ===

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().expect("utime") + f[12].parse::<f64>().expect("stime");
    ticks / 100.0 // USER_HZ is 100 on Linux
}

/// How many concurrent streams one core of `tokenmeter sim` sustains, and its CPU per token.
///
/// `SIM_STREAMS=1000 SIM_STEP_PER_SEQ=0.2ms taskset -c 1 cargo test --release --test it
/// sim_one_core_capacity -- --ignored --nocapture` (the simulator itself runs on core 0 with
/// one worker thread).
#[test]
#[ignore = "a measurement: run by hand, see docs/sim.md"]
fn sim_one_core_capacity() {
    let streams: usize = std::env::var("SIM_STREAMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let per_seq = std::env::var("SIM_STEP_PER_SEQ").unwrap_or_else(|_| "0.2ms".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut sim = Command::new("taskset")
        .args([
            "-c",
            "0",
            env!("CARGO_BIN_EXE_tokenmeter"),
            "sim",
            "--threads",
            "1",
            "--listen",
            &listen,
        ])
        .args([
            "--max-batch",
            &(streams + 1).to_string(),
            "--step-per-seq",
            &per_seq,
            "--stats-keep",
            "0",
        ])
        .env("TOKENMETER_LOG", "warn")
        .spawn()
        .expect("start the simulator (needs taskset)");
    let addr: SocketAddr = listen.parse().expect("addr");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
        use std::sync::Arc;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stop = Arc::new(AtomicBool::new(false));
        // Tokens the clients received (one `{"content":"` per token event), and frames.
        let received = Arc::new(AtomicU64::new(0));
        let frames = Arc::new(AtomicU64::new(0));
        let endless = chat(Some(1_000_000), true);
        for _ in 0..streams {
            let (stop, received, frames, body) = (
                stop.clone(),
                received.clone(),
                frames.clone(),
                endless.clone(),
            );
            tokio::spawn(async move {
                let mut sender = connect(addr).await;
                let req = request("POST", addr, "/v1/chat/completions", &body);
                let mut body = sender
                    .send_request(req)
                    .await
                    .expect("response")
                    .into_body();
                while let Some(Ok(f)) = body.frame().await {
                    if stop.load(Relaxed) {
                        break;
                    }
                    if let Ok(d) = f.into_data() {
                        let n = d.windows(12).filter(|w| w == b"{\"content\":\"").count();
                        received.fetch_add(n as u64, Relaxed);
                        frames.fetch_add(1, Relaxed);
                    }
                }
            });
        }
        // Let every stream join the batch, then measure a steady window.
        for _ in 0..200 {
            if stats(addr).await["running"].as_u64() == Some(streams as u64) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let snap = || (received.load(Relaxed), frames.load(Relaxed));
        let (s0, c0, r0, t0) = (
            stats(addr).await,
            cpu_seconds(sim.id()),
            snap(),
            Instant::now(),
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
        let (s1, c1, r1, t1) = (
            stats(addr).await,
            cpu_seconds(sim.id()),
            snap(),
            Instant::now(),
        );
        stop.store(true, Relaxed);
        let secs = t1.duration_since(t0).as_secs_f64();
        let num = |v: &Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}"));
        let emitted = num(&s1, "output_tokens") - num(&s0, "output_tokens");
        let running = num(&s1, "running");
        let model = running / (num(&s1, "step_base_s") + num(&s1, "step_per_seq_s") * running);
        let cpu = c1 - c0;
        let got = (r1.0 - r0.0) as f64;
        println!(
            "streams {streams} (running {running}), step_per_seq {per_seq}: emitted {:.0} tok/s, \
             modelled {model:.0} ({:+.1}%), clients received {:.0} tok/s in {:.0} frames/s; \
             sim CPU {:.0}% of one core, {:.2} us per token",
            emitted / secs,
            (emitted / secs / model - 1.0) * 100.0,
            got / secs,
            (r1.1 - r0.1) as f64 / secs,
            cpu / secs * 100.0,
            cpu / emitted * 1e6
        );
        let _ = sim.kill();
        let _ = sim.wait();
    });
}

// === The command ===

#[test]
fn bad_flags_are_one_line_and_exit_64() {
    for (args, needle) in [
        (
            &["--target", "https://h"][..],
            "scheme https is not supported",
        ),
        (
            &["--target", "http://h", "--concurrency", "1,0"][..],
            "--concurrency",
        ),
        (
            &[
                "--target",
                "http://h",
                "--concurrency",
                "1,16",
                "--requests",
                "8",
            ][..],
            "--requests 8 is below the highest --concurrency 16",
        ),
        (
            &[
                "--target",
                "http://h",
                "--trace",
                "t.jsonl",
                "--time-scale",
                "0",
            ][..],
            "--time-scale 0: give a factor above 0",
        ),
        (
            &["--target", "http://h", "--time-scale", "2"][..],
            "--time-scale is for --trace",
        ),
        (
            &[
                "--target",
                "http://h",
                "--trace",
                "t.jsonl",
                "--concurrency",
                "4",
            ][..],
            "cannot be used with",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .arg("bench")
            .args(args)
            .output()
            .expect("run tokenmeter bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_against_the_simulator_and_names_its_files() {
    let url = format!("http://{}", start_sim(sim_flags(&[])).await);
    let out = tempdir("command");
    let dir = out.clone();
    let cmd = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .args([
                "bench",
                "--target",
                &url,
                "--concurrency",
                "2",
                "--requests",
                "2",
            ])
            .args(["--output-tokens", "4", "--out"])
            .arg(&dir)
            .output()
    })
    .await
    .expect("the command's thread")
    .expect("run tokenmeter bench");
    let stdout = String::from_utf8_lossy(&cmd.stdout);
    assert!(
        cmd.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&cmd.stderr)
    );
    // Not a terminal: no progress bar, nothing on stderr.
    assert_eq!(String::from_utf8_lossy(&cmd.stderr), "");
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("2 "))
        .expect("a row for concurrency 2");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[..3], ["2", "2", "0"], "{stdout}");
    for f in [
        bench::JSON_FILE,
        bench::CSV_FILE,
        bench::THROUGHPUT_SVG,
        bench::TTFT_SVG,
    ] {
        assert!(
            stdout.contains(&format!("wrote {}", out.join(f).display())),
            "{stdout}"
        );
    }
}

#[test]
fn a_trace_that_cannot_be_read_exits_2_naming_the_line() {
    let dir = tempdir("bad-trace");
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1}\n\
         {\"timestamp\": 5, \"input_length\": \"ten\", \"output_length\": 1}\n",
    )
    .expect("write the trace");
    let missing = dir.join("missing.jsonl");
    // 10 GiB of nothing (a sparse file: no disk is spent): the reader takes a line at most
    // 1 MiB long, so it stops a megabyte in, never reading the rest.
    let huge = dir.join("huge.jsonl");
    std::fs::File::create(&huge)
        .and_then(|f| f.set_len(10 << 30))
        .expect("a sparse file");
    // Nothing listens at the target: a trace that cannot be read fails before any request.
    for (path, needle) in [
        (
            &bad,
            "line 2: \"input_length\" is not a non-negative integer: \"ten\"",
        ),
        (&missing, "cannot read"),
        (&huge, "line 1 is longer than 1048576 bytes"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .args(["bench", "--target", "http://127.0.0.1:9", "--trace"])
            .arg(path)
            .output()
            .expect("run tokenmeter bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
        assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
