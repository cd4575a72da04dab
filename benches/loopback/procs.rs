//! The processes under test: starting them pinned to a core, and reading their RSS and CPU time.
//!
//! Every target is measured from the outside through `/proc`, the same way for tokenmeter and
//! nginx: resident memory (`VmRSS`) and user+system CPU time (`utime + stime`, in clock ticks).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a target may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// CPU pinning: the proxy on one core, upstream and client on the other. `None` when the
/// machine has one core or no `taskset`; then nothing is pinned (and the report says so).
#[derive(Debug, Clone)]
pub struct Pinning {
    pub proxy: Option<String>,
    pub load: Option<String>,
}

impl Pinning {
    pub fn detect() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let taskset = Command::new("taskset")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if cores >= 2 && taskset {
            Pinning {
                proxy: Some("0".into()),
                load: Some("1".into()),
            }
        } else {
            Pinning {
                proxy: None,
                load: None,
            }
        }
    }

    /// A command that runs `program` on `core` (or unpinned).
    pub fn command(core: &Option<String>, program: &Path) -> Command {
        match core {
            Some(c) => {
                let mut cmd = Command::new("taskset");
                cmd.arg("-c").arg(c).arg(program);
                cmd
            }
            None => Command::new(program),
        }
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until something accepts connections on `addr`.
pub fn wait_listening(addr: SocketAddr, child: &mut Child, what: &str) -> Result<(), String> {
    let t0 = Instant::now();
    while t0.elapsed() < START_TIMEOUT {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{what} exited at start: {status}"));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "{what} is not listening on {addr} after {START_TIMEOUT:?}"
    ))
}

/// Resident set size of `pid`, bytes.
pub fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// User + system CPU time of `pid` (all its threads), seconds.
pub fn cpu_secs(pid: u32, ticks_per_sec: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_sec)
}

/// Clock ticks per second for `/proc/*/stat` (`getconf CLK_TCK`; 100 on Linux everywhere).
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The soft limit on open files of this process (children inherit it).
pub fn open_files_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            let line = l
                .lines()
                .find(|l| l.starts_with("Max open files"))?
                .to_string();
            line.split_whitespace().nth(3)?.parse().ok()
        })
        .unwrap_or(1024)
}

/// The load average over the last minute.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A process the benchmark started; killed when dropped.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a proxy target is.
#[derive(Debug, Clone)]
pub enum Kind {
    /// The client talks to the upstream itself.
    Direct,
    Nginx,
    /// A tokenmeter binary with extra flags.
    Tokenmeter {
        bin: PathBuf,
        args: Vec<String>,
    },
}

/// A target as the report names it.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub kind: Kind,
}

/// A running target: where the client connects, and the process to measure.
pub struct Running {
    pub addr: SocketAddr,
    pub proc: Option<Proc>,
}

/// The nginx that Debian's `nginx-light` installs.
pub fn nginx_path() -> Option<PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// nginx as the issue describes the baseline: one worker, no buffering, upstream keep-alive.
fn nginx_conf(dir: &Path, port: u16, upstream: SocketAddr, nofile: u64) -> String {
    let d = dir.display();
    let conns = nofile.saturating_sub(64).max(1024);
    format!(
        r#"# Written by the loopback benchmark: nginx as a plain streaming reverse proxy.
daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile {nofile};
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections {conns}; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_timeout 65s;
  keepalive_requests 1000000;
  upstream backend {{
    server {upstream};
    keepalive 1024;
    keepalive_requests 1000000;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
"#
    )
}

/// Starts `target` in front of `upstream`, on the proxy core.
pub fn start(
    target: &Target,
    upstream: SocketAddr,
    pin: &Pinning,
    work: &Path,
) -> Result<Running, String> {
    let port = free_port().map_err(|e| format!("no free port: {e}"))?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut child = match &target.kind {
        Kind::Direct => {
            return Ok(Running {
                addr: upstream,
                proc: None,
            })
        }
        Kind::Nginx => {
            let nginx =
                nginx_path().ok_or("nginx is not installed (apt-get install nginx-light)")?;
            let dir = work.join("nginx").join(port.to_string());
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(&dir, port, upstream, open_files_limit()))
                .map_err(|e| format!("{}: {e}", conf.display()))?;
            Pinning::command(&pin.proxy, &nginx)
                .arg("-p")
                .arg(&dir)
                .arg("-e")
                .arg(dir.join("error.log"))
                .arg("-c")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("nginx: {e}"))?
        }
        Kind::Tokenmeter { bin, args } => {
            let metrics = free_port().map_err(|e| format!("no free port: {e}"))?;
            Pinning::command(&pin.proxy, bin)
                .arg("--upstream")
                .arg(format!("http://{upstream}"))
                .arg("--listen")
                .arg(addr.to_string())
                .arg("--metrics-listen")
                .arg(format!("127.0.0.1:{metrics}"))
                .args(args)
                // Errors only: a failed request is counted by the client, not logged per request.
                .env("TOKENMETER_LOG", "error")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("{}: {e}", bin.display()))?
        }
    };
    wait_listening(addr, &mut child, &target.name)?;
    Ok(Running {
        addr,
        proc: Some(Proc {
            child,
            name: target.name.clone(),
        }),
    })
}

/// A child that speaks in lines: the client in its `hold` mode.
pub struct Talker {
    pub proc: Proc,
    out: BufReader<ChildStdout>,
}

impl Talker {
    pub fn spawn(mut cmd: Command, name: &str) -> Result<Self, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Talker {
            proc: Proc {
                child,
                name: name.into(),
            },
            out,
        })
    }

    pub fn line(&mut self) -> Result<String, String> {
        let mut l = String::new();
        match self.out.read_line(&mut l) {
            Ok(0) => Err(format!("{} ended without output", self.proc.name)),
            Ok(_) => Ok(l.trim_end().to_string()),
            Err(e) => Err(format!("{}: {e}", self.proc.name)),
        }
    }

    pub fn say(&mut self, s: &str) -> Result<(), String> {
        let stdin = self.proc.child.stdin.as_mut().ok_or("no stdin")?;
        writeln!(stdin, "{s}").map_err(|e| format!("{}: {e}", self.proc.name))
    }
}
