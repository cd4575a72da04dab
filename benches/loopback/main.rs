//! The loopback benchmark: a direct connection, nginx, tokenmeter and tokenmeter with
//! `--inject-usage`, side by side in one run, in alternating rounds.
//!
//! `benches/loopback/run.sh` (or `cargo bench --bench loopback -- [flags]`) runs the full
//! benchmark and writes `target/loopback/report.md` and `results.json`; docs/bench.md has the
//! figures and what each one means. Run without `--bench` (as `cargo test --all-targets` does)
//! it is a smoke run of a few seconds that checks every target and scenario works and fails on
//! any error.
//!
//! One binary plays every part: the orchestrator (this file) starts the test upstream
//! (`upstream.rs`) and the load client (`client.rs`; `short.rs` for the short requests) as
//! copies of itself with `role ...`, pinned to one core, and the proxies under test on the
//! other core (`procs.rs`), then runs each scenario against each target in turn, rotating the
//! order every round, and reports medians over the rounds and ratios to nginx (`report.rs`).
//! The machine is shared and noisy: ratios from the same round are what to compare.

mod client;
mod procs;
mod report;
mod short;
mod upstream;
mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use procs::{Kind, Pinning, Proc, Talker, Target};
use report::{Outcome, RoundResult};

/// The test upstream's idle keep-alive: uvicorn's default, so vLLM's.
const UPSTREAM_KEEPALIVE: Duration = Duration::from_secs(5);
/// The test upstream's listen backlog (Linux caps it at net.core.somaxconn, 4096 by default).
const UPSTREAM_BACKLOG: u32 = 4096;
/// Descriptors kept aside from the hold scenario's streams: listeners, logs, and the idle
/// upstream connections a proxy keeps from the scenarios before (nginx's `keepalive 1024`; with
/// fewer spare, nginx closes some held streams to make room).
const SPARE_FDS: u64 = 1200;

/// Streams the `hold` scenario opens: under tokenmeter's default `--max-in-flight` of 8,192, so
/// that none is shed (a shed stream holds a connection but no upstream, and no stream's memory).
const HOLD_STREAMS: usize = 8_000;

/// What one run measures, and how long each measurement is.
#[derive(Debug, Clone)]
pub struct Settings {
    pub smoke: bool,
    pub rounds: usize,
    pub scenarios: Vec<Scenario>,
    pub sat_streams: usize,
    pub sat_warm: f64,
    pub sat_secs: f64,
    pub sat_chunks: u64,
    pub paced_loads: Vec<usize>,
    pub paced_rate: f64,
    pub paced_secs: f64,
    /// Delay of each response's first chunk after its head (an inference server's prefill).
    pub paced_first_us: u64,
    /// Requests each paced stream sends one after another (the chunks split among them).
    pub paced_requests: u64,
    pub ttfb_streams: usize,
    pub ttfb_idle: Duration,
    pub ttfb_reps: usize,
    pub seq_count: usize,
    pub seq_gap: Duration,
    pub hold_streams: usize,
    pub burst_streams: usize,
    pub burst_chunks: u64,
    pub burst_interval_us: u64,
    pub release_watch: Duration,
    /// Short requests per second, over all connections.
    pub short_rate: f64,
    /// Kept-alive connections the short requests are spread over.
    pub short_conns: usize,
    pub short_secs: f64,
}

/// The measurements, in the order a round runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Saturate,
    Paced,
    TtfbBurst,
    TtfbSeq,
    Short,
    Hold,
    Release,
}

impl Scenario {
    const ALL: [Scenario; 7] = [
        Scenario::Saturate,
        Scenario::Paced,
        Scenario::TtfbBurst,
        Scenario::TtfbSeq,
        Scenario::Short,
        Scenario::Hold,
        Scenario::Release,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Saturate => "saturate",
            Scenario::Paced => "paced",
            Scenario::TtfbBurst => "ttfb-burst",
            Scenario::TtfbSeq => "ttfb-seq",
            Scenario::Short => "short",
            Scenario::Hold => "hold",
            Scenario::Release => "release",
        }
    }
}

impl Settings {
    fn full(nofile: u64) -> Self {
        Settings {
            smoke: false,
            rounds: 5,
            scenarios: Scenario::ALL.to_vec(),
            sat_streams: 64,
            sat_warm: 0.5,
            sat_secs: 5.0,
            sat_chunks: 2000,
            paced_loads: vec![16, 1000],
            paced_rate: 50.0,
            paced_secs: 4.0,
            paced_first_us: 0,
            paced_requests: 1,
            ttfb_streams: 16,
            // Short of the upstream's 5 s keep-alive: a pool that keeps connections until the
            // server closes them (tokenmeter's, 60 s) finds them warm.
            ttfb_idle: Duration::from_millis(4500),
            ttfb_reps: 2,
            seq_count: 50,
            seq_gap: Duration::from_millis(50),
            // A proxy holds two descriptors per stream.
            hold_streams: HOLD_STREAMS.min(((nofile.saturating_sub(SPARE_FDS)) / 2) as usize),
            burst_streams: 5_000.min(((nofile.saturating_sub(SPARE_FDS)) / 2) as usize),
            burst_chunks: 10,
            burst_interval_us: 100_000,
            release_watch: Duration::from_secs(60),
            short_rate: 10_000.0,
            short_conns: 32,
            short_secs: 4.0,
        }
    }

    fn smoke() -> Self {
        Settings {
            smoke: true,
            rounds: 1,
            scenarios: Scenario::ALL.to_vec(),
            sat_streams: 8,
            sat_warm: 0.1,
            sat_secs: 0.4,
            // Short responses, so that some complete inside the window even in a debug build
            // on a loaded machine (the usage check needs complete responses).
            sat_chunks: 20,
            paced_loads: vec![16, 100],
            paced_rate: 50.0,
            paced_secs: 0.4,
            paced_first_us: 20_000,
            paced_requests: 2,
            ttfb_streams: 16,
            ttfb_idle: Duration::from_millis(200),
            ttfb_reps: 1,
            seq_count: 5,
            seq_gap: Duration::from_millis(10),
            hold_streams: 200,
            burst_streams: 100,
            burst_chunks: 5,
            burst_interval_us: 20_000,
            release_watch: Duration::from_secs(1),
            short_rate: 200.0,
            short_conns: 4,
            short_secs: 0.5,
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("role") {
        return match role(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("loopback role: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match orchestrate(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loopback: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--name value` from a role's arguments.
fn flag<T: std::str::FromStr>(args: &[String], name: &str) -> Result<T, String> {
    let i = args
        .iter()
        .position(|a| a == name)
        .ok_or_else(|| format!("missing {name}"))?;
    let v = args
        .get(i + 1)
        .ok_or_else(|| format!("{name} needs a value"))?;
    v.parse().map_err(|_| format!("{name}: bad value {v:?}"))
}

/// Runs the upstream or one client measurement in this process (one thread: it shares a core).
fn role(args: &[String]) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let local = tokio::task::LocalSet::new();
    match args.first().map(String::as_str) {
        Some("upstream") => {
            let keepalive = Duration::from_millis(flag(args, "--keepalive-ms")?);
            local.block_on(&rt, async {
                // A deep accept queue: a proxy opens thousands of upstream connections at once
                // in the burst scenario (tokio's default backlog of 1024 overflowed, and the
                // overflow came back as resets).
                let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
                socket
                    .bind(([127, 0, 0, 1], 0).into())
                    .map_err(|e| e.to_string())?;
                let listener = socket.listen(UPSTREAM_BACKLOG).map_err(|e| e.to_string())?;
                let port = listener.local_addr().map_err(|e| e.to_string())?.port();
                println!("listening {port}");
                upstream::serve(listener, keepalive).await;
                Ok(())
            })
        }
        Some("client") => {
            let scenario = args.get(1).ok_or("client needs a scenario")?.as_str();
            let addr: SocketAddr = flag(args, "--addr")?;
            let report = local.block_on(&rt, async {
                Ok::<_, String>(match scenario {
                    "saturate" => {
                        client::saturate(
                            addr,
                            flag(args, "--streams")?,
                            flag(args, "--warm")?,
                            flag(args, "--secs")?,
                            flag(args, "--chunks")?,
                        )
                        .await
                    }
                    "paced" => {
                        client::paced(
                            addr,
                            flag(args, "--streams")?,
                            flag(args, "--rate")?,
                            flag(args, "--secs")?,
                            flag(args, "--first-us")?,
                            flag(args, "--requests")?,
                        )
                        .await
                    }
                    "ttfb-burst" => {
                        client::ttfb_burst(
                            addr,
                            flag(args, "--streams")?,
                            Duration::from_millis(flag(args, "--idle-ms")?),
                            flag(args, "--reps")?,
                        )
                        .await
                    }
                    "ttfb-seq" => {
                        client::ttfb_seq(
                            addr,
                            flag(args, "--count")?,
                            Duration::from_millis(flag(args, "--gap-ms")?),
                        )
                        .await
                    }
                    "short" => {
                        short::short(
                            addr,
                            flag(args, "--rate")?,
                            flag(args, "--conns")?,
                            flag(args, "--secs")?,
                        )
                        .await
                    }
                    "hold" => client::hold(addr, flag(args, "--streams")?).await,
                    "burst" => {
                        client::burst(
                            addr,
                            flag(args, "--streams")?,
                            flag(args, "--chunks")?,
                            flag(args, "--interval-us")?,
                        )
                        .await
                    }
                    other => return Err(format!("unknown scenario {other:?}")),
                })
            })?;
            let line = serde_json::to_string(&report).map_err(|e| e.to_string())?;
            println!("{line}");
            Ok(())
        }
        other => Err(format!("unknown role {other:?}")),
    }
}

/// The orchestrator's command line (after `cargo bench --bench loopback --`).
struct Cli {
    settings: Settings,
    targets: Vec<Target>,
    out: PathBuf,
}

const USAGE: &str = "\
usage: cargo bench --bench loopback -- [--rounds N] [--only LIST] [--targets LIST]
           [--variant 'NAME=BIN [FLAGS...]']... [--hold-streams N] [--out DIR] [--paced-...]
           [--short-...]
  --only LIST      scenarios, comma-separated:
                   saturate,paced,ttfb-burst,ttfb-seq,short,hold,release
  --targets LIST   of direct,nginx,tokenmeter,inject (default: all four)
  --variant        one more target: a tokenmeter binary (`.` for this build) and its flags,
                   e.g. --variant 'pool60=. --pool-idle-timeout 60s'
  --paced-loads LIST, --paced-rate R, --paced-secs S, --paced-first-ms MS, --paced-requests N
                   the paced scenario: streams per load (16,1000), chunks/s per stream (50),
                   seconds of chunks per stream (4), delay of each response's first chunk (0),
                   requests per stream one after another (1)
  --short-rate R, --short-conns N, --short-secs S
                   the short scenario: requests/s in all (10000), over N kept-alive connections
                   (32), for S seconds (4)";

fn parse_cli(args: &[String]) -> Result<Cli, String> {
    let full = args.iter().any(|a| a == "--bench");
    let nofile = procs::open_files_limit();
    let mut settings = if full {
        Settings::full(nofile)
    } else {
        Settings::smoke()
    };
    let tokenmeter = PathBuf::from(env!("CARGO_BIN_EXE_tokenmeter"));
    let mut names = vec!["direct", "nginx", "tokenmeter", "inject"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    let mut variants = Vec::new();
    // A smoke run must not overwrite the last full run's report.
    let mut out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(if full {
        "target/loopback"
    } else {
        "target/loopback/smoke"
    });
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--bench" => {}
            "--rounds" => settings.rounds = value()?.parse().map_err(|_| "--rounds: a number")?,
            "--hold-streams" => {
                settings.hold_streams = value()?.parse().map_err(|_| "--hold-streams: a number")?
            }
            "--only" => {
                let list = value()?;
                settings.scenarios = Scenario::ALL
                    .into_iter()
                    .filter(|s| list.split(',').any(|n| n == s.name()))
                    .collect();
                if settings.scenarios.is_empty() {
                    return Err(format!("--only {list:?}: no known scenario\n{USAGE}"));
                }
            }
            "--targets" => names = value()?.split(',').map(String::from).collect(),
            "--paced-loads" => {
                settings.paced_loads = value()?
                    .split(',')
                    .map(|n| n.parse().map_err(|_| "--paced-loads: numbers"))
                    .collect::<Result<_, _>>()?
            }
            "--paced-rate" => {
                settings.paced_rate = value()?.parse().map_err(|_| "--paced-rate: a number")?
            }
            "--paced-secs" => {
                settings.paced_secs = value()?.parse().map_err(|_| "--paced-secs: a number")?
            }
            "--paced-first-ms" => {
                let ms: f64 = value()?.parse().map_err(|_| "--paced-first-ms: a number")?;
                settings.paced_first_us = (ms * 1e3) as u64;
            }
            "--paced-requests" => {
                settings.paced_requests =
                    value()?.parse().map_err(|_| "--paced-requests: a number")?
            }
            "--short-rate" => {
                settings.short_rate = value()?.parse().map_err(|_| "--short-rate: a number")?
            }
            "--short-conns" => {
                settings.short_conns = value()?.parse().map_err(|_| "--short-conns: a number")?
            }
            "--short-secs" => {
                settings.short_secs = value()?.parse().map_err(|_| "--short-secs: a number")?
            }
            "--variant" => variants.push(value()?),
            "--out" => out = PathBuf::from(value()?),
            "-h" | "--help" => return Err(USAGE.into()),
            // Whatever else cargo passes (a test filter) is ignored.
            _ => {}
        }
    }
    if !(settings.short_rate.is_finite() && settings.short_rate > 0.0) || settings.short_conns == 0
    {
        return Err(format!(
            "--short-rate must be above 0 and --short-conns at least 1\n{USAGE}"
        ));
    }
    let mut targets = Vec::new();
    for n in &names {
        let kind = match n.as_str() {
            "direct" => Kind::Direct,
            "nginx" => Kind::Nginx,
            // Both spelt out: `auto` would follow whatever the upstream's `/metrics` says.
            "tokenmeter" => Kind::Tokenmeter {
                bin: tokenmeter.clone(),
                args: vec!["--inject-usage".into(), "off".into()],
            },
            "inject" => Kind::Tokenmeter {
                bin: tokenmeter.clone(),
                args: vec!["--inject-usage".into(), "on".into()],
            },
            other => return Err(format!("--targets: unknown target {other:?}\n{USAGE}")),
        };
        targets.push(Target {
            name: n.clone(),
            kind,
        });
    }
    for v in variants {
        let (name, rest) = v
            .split_once('=')
            .ok_or_else(|| format!("--variant {v:?}: expected NAME=BIN [FLAGS]"))?;
        let mut words = rest.split_whitespace().map(String::from);
        let bin = match words.next().as_deref() {
            Some(".") | None => tokenmeter.clone(),
            Some(p) => PathBuf::from(p),
        };
        targets.push(Target {
            name: name.into(),
            kind: Kind::Tokenmeter {
                bin,
                args: words.collect(),
            },
        });
    }
    Ok(Cli {
        settings,
        targets,
        out,
    })
}

/// The context every measurement needs.
struct Bench {
    settings: Settings,
    pin: Pinning,
    exe: PathBuf,
    ticks: f64,
    out: PathBuf,
    upstream: SocketAddr,
}

impl Bench {
    fn client(&self, scenario: &str, addr: SocketAddr, params: &[(&str, String)]) -> Command {
        let mut cmd = Pinning::command(&self.pin.load, &self.exe);
        cmd.args(["role", "client", scenario, "--addr", &addr.to_string()]);
        for (k, v) in params {
            cmd.arg(k).arg(v);
        }
        cmd
    }

    /// Runs one client measurement to its end and returns its report.
    /// Runs a client, and reads the CPU seconds the proxy (`pid`, when it is a process of its
    /// own) used meanwhile.
    fn run_client_cpu(
        &self,
        cmd: Command,
        pid: Option<u32>,
    ) -> Result<(client::Report, Option<f64>), String> {
        let cpu = || pid.and_then(|p| procs::cpu_secs(p, self.ticks));
        let before = cpu();
        let r = self.run_client(cmd)?;
        Ok((r, before.zip(cpu()).map(|(a, b)| b - a)))
    }

    fn run_client(&self, mut cmd: Command) -> Result<client::Report, String> {
        let out = cmd
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("client: {e}"))?;
        if !out.status.success() {
            return Err(format!("client failed: {}", out.status));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let last = text.lines().last().unwrap_or("");
        serde_json::from_str(last).map_err(|e| format!("client output {last:?}: {e}"))
    }

    /// One scenario against one running target.
    fn measure(
        &self,
        scenario: Scenario,
        target: &Target,
        running: &procs::Running,
    ) -> Result<Vec<Outcome>, String> {
        let s = &self.settings;
        let pid = running.proc.as_ref().map(Proc::pid);
        let addr = running.addr;
        Ok(match scenario {
            Scenario::Saturate => {
                let t0 = Instant::now();
                let (r, cpu) = self.run_client_cpu(
                    self.client(
                        "saturate",
                        addr,
                        &[
                            ("--streams", s.sat_streams.to_string()),
                            ("--warm", s.sat_warm.to_string()),
                            ("--secs", s.sat_secs.to_string()),
                            ("--chunks", s.sat_chunks.to_string()),
                        ],
                    ),
                    pid,
                )?;
                let wall = t0.elapsed().as_secs_f64();
                vec![Outcome::saturate(&r, cpu, wall)]
            }
            Scenario::Paced => {
                let mut v = Vec::new();
                for &n in &s.paced_loads {
                    let (r, cpu) = self.run_client_cpu(
                        self.client(
                            "paced",
                            addr,
                            &[
                                ("--streams", n.to_string()),
                                ("--rate", s.paced_rate.to_string()),
                                ("--secs", s.paced_secs.to_string()),
                                ("--first-us", s.paced_first_us.to_string()),
                                ("--requests", s.paced_requests.to_string()),
                            ],
                        ),
                        pid,
                    )?;
                    let per_request = ((s.paced_rate * s.paced_secs).max(1.0) as u64
                        / s.paced_requests.max(1))
                    .max(1);
                    let expected = n as u64 * per_request * s.paced_requests.max(1);
                    v.push(Outcome::latency(n, &r, expected, cpu));
                }
                v
            }
            Scenario::TtfbBurst => {
                let r = self.run_client(self.client(
                    "ttfb-burst",
                    addr,
                    &[
                        ("--streams", s.ttfb_streams.to_string()),
                        ("--idle-ms", s.ttfb_idle.as_millis().to_string()),
                        ("--reps", s.ttfb_reps.to_string()),
                    ],
                ))?;
                vec![Outcome::ttfb("burst", &r, s.ttfb_streams * s.ttfb_reps)]
            }
            Scenario::TtfbSeq => {
                let r = self.run_client(self.client(
                    "ttfb-seq",
                    addr,
                    &[
                        ("--count", s.seq_count.to_string()),
                        ("--gap-ms", s.seq_gap.as_millis().to_string()),
                    ],
                ))?;
                vec![Outcome::ttfb("seq", &r, s.seq_count)]
            }
            Scenario::Short => {
                let r = self.run_client(self.client(
                    "short",
                    addr,
                    &[
                        ("--rate", s.short_rate.to_string()),
                        ("--conns", s.short_conns.to_string()),
                        ("--secs", s.short_secs.to_string()),
                    ],
                ))?;
                vec![Outcome::short(
                    &r,
                    short::scheduled(s.short_rate, s.short_secs),
                )]
            }
            Scenario::Hold => {
                let Some(pid) = pid else {
                    return Ok(vec![]);
                };
                let n = s.hold_streams;
                let before = procs::rss(pid).unwrap_or(0);
                let mut c = Talker::spawn(
                    self.client("hold", addr, &[("--streams", n.to_string())]),
                    "hold client",
                )?;
                let held: usize = c
                    .line()?
                    .strip_prefix("held ")
                    .and_then(|n| n.parse().ok())
                    .ok_or("hold client: no count")?;
                // Let the proxy settle (freed request buffers, timers) before reading it.
                std::thread::sleep(Duration::from_millis(500));
                let during = procs::rss(pid).unwrap_or(0);
                c.say("release")?;
                let r: client::Report = serde_json::from_str(&c.line()?)
                    .map_err(|e| format!("hold client output: {e}"))?;
                vec![Outcome::hold(n, held, before, during, &r)]
            }
            Scenario::Release => {
                // A fresh process, so "idle" is the figure a new sidecar starts from.
                let Some(_) = pid else { return Ok(vec![]) };
                let fresh = procs::start(target, self.upstream, &self.pin, &self.out)?;
                let fpid = fresh.proc.as_ref().map(Proc::pid).ok_or("no process")?;
                // One request, so the idle figure includes what the first request sets up.
                self.run_client(self.client(
                    "ttfb-seq",
                    fresh.addr,
                    &[("--count", "1".into()), ("--gap-ms", "0".into())],
                ))?;
                std::thread::sleep(Duration::from_millis(500));
                let idle = procs::rss(fpid).unwrap_or(0);
                let mut child = self
                    .client(
                        "burst",
                        fresh.addr,
                        &[
                            ("--streams", s.burst_streams.to_string()),
                            ("--chunks", s.burst_chunks.to_string()),
                            ("--interval-us", s.burst_interval_us.to_string()),
                        ],
                    )
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .map_err(|e| format!("burst client: {e}"))?;
                let mut peak = idle;
                while child.try_wait().map_err(|e| e.to_string())?.is_none() {
                    peak = peak.max(procs::rss(fpid).unwrap_or(0));
                    std::thread::sleep(Duration::from_millis(50));
                }
                let output = child.wait_with_output().map_err(|e| e.to_string())?;
                let text = String::from_utf8_lossy(&output.stdout);
                let r: client::Report = serde_json::from_str(text.lines().last().unwrap_or(""))
                    .map_err(|e| format!("burst client output: {e}"))?;
                let ended = Instant::now();
                let mut after = Vec::new();
                let mut back_within_2x = None;
                while ended.elapsed() < s.release_watch {
                    std::thread::sleep(Duration::from_millis(250));
                    let now = procs::rss(fpid).unwrap_or(0);
                    if back_within_2x.is_none() && now <= 2 * idle {
                        back_within_2x = Some(ended.elapsed().as_secs_f64());
                    }
                    after.push((ended.elapsed().as_secs_f64(), now));
                }
                vec![Outcome::release(
                    s.burst_streams,
                    idle,
                    peak,
                    &after,
                    back_within_2x,
                    &r,
                )]
            }
        })
    }
}

fn orchestrate(args: &[String]) -> Result<(), String> {
    let cli = parse_cli(args)?;
    wire::self_check()?;
    let settings = cli.settings;
    std::fs::create_dir_all(&cli.out).map_err(|e| format!("{}: {e}", cli.out.display()))?;
    // nginx's prefix directories from the last run.
    let _ = std::fs::remove_dir_all(cli.out.join("nginx"));
    let pin = Pinning::detect();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;

    let mut targets = cli.targets;
    if procs::nginx_path().is_none() && targets.iter().any(|t| matches!(t.kind, Kind::Nginx)) {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            return Err("nginx is not installed (tests/run installs nginx-light)".into());
        }
        eprintln!("loopback: SKIPPED nginx: not installed (apt-get install nginx-light)");
        targets.retain(|t| !matches!(t.kind, Kind::Nginx));
    }

    let mut up = Talker::spawn(
        {
            let mut c = Pinning::command(&pin.load, &exe);
            c.args(["role", "upstream", "--keepalive-ms"])
                .arg(UPSTREAM_KEEPALIVE.as_millis().to_string());
            c
        },
        "upstream",
    )?;
    let port: u16 = up
        .line()?
        .strip_prefix("listening ")
        .and_then(|p| p.parse().ok())
        .ok_or("upstream: no port")?;
    let upstream: SocketAddr = ([127, 0, 0, 1], port).into();

    let bench = Bench {
        settings: settings.clone(),
        pin: pin.clone(),
        exe,
        ticks: procs::clock_ticks(),
        out: cli.out.clone(),
        upstream,
    };
    let mut running = Vec::new();
    for t in &targets {
        running.push(procs::start(t, upstream, &pin, &cli.out)?);
    }
    eprintln!(
        "loopback: {} rounds of {:?} over {:?}; proxy on core {:?}, upstream and client on core {:?}",
        settings.rounds,
        settings.scenarios.iter().map(|s| s.name()).collect::<Vec<_>>(),
        targets.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        pin.proxy,
        pin.load
    );
    let load_before = procs::load_average();
    let started = Instant::now();
    let mut results = Vec::new();
    for round in 0..settings.rounds {
        for &scenario in &settings.scenarios {
            // The release scenario takes a minute per target: once, in the last round.
            if scenario == Scenario::Release && round + 1 != settings.rounds {
                continue;
            }
            for k in 0..targets.len() {
                let i = (k + round) % targets.len();
                let (t, r) = (&targets[i], &running[i]);
                let t0 = Instant::now();
                let outcomes = bench.measure(scenario, t, r)?;
                eprintln!(
                    "loopback: round {} {:<10} {:<12} {:>6.1} s  load {:.2}",
                    round + 1,
                    scenario.name(),
                    t.name,
                    t0.elapsed().as_secs_f64(),
                    procs::load_average()
                );
                for o in outcomes {
                    results.push(RoundResult {
                        round,
                        target: t.name.clone(),
                        outcome: o,
                    });
                }
            }
        }
    }
    drop(running);
    drop(up);
    let run = report::Run {
        settings: &settings,
        targets: targets.iter().map(|t| t.name.clone()).collect(),
        pinned: pin.proxy.is_some(),
        load_before,
        load_after: procs::load_average(),
        secs: started.elapsed().as_secs_f64(),
        results,
    };
    let md = report::markdown(&run);
    println!("{md}");
    std::fs::write(cli.out.join("report.md"), &md).map_err(|e| e.to_string())?;
    std::fs::write(cli.out.join("results.json"), report::json(&run)).map_err(|e| e.to_string())?;
    eprintln!("loopback: wrote {}", cli.out.join("report.md").display());
    if settings.smoke {
        report::check_smoke(&run)?;
        eprintln!("loopback smoke: every target and scenario checked, no errors");
    }
    Ok(())
}
