//! The binary as a user runs it: errors on bad flags, and the SIGTERM drain.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::client::{self, chat_request};
use crate::support::upstream::{self, Reply};

fn tokenmeter() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tokenmeter"));
    c.env_remove("TOKENMETER_UPSTREAM");
    c
}

pub(crate) fn run_err(args: &[&str]) -> (i32, String) {
    let out = tokenmeter().args(args).output().expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

#[test]
fn bad_configuration_is_one_line_and_a_nonzero_exit() {
    let (code, err) = run_err(&["--upstream", "not a url"]);
    assert_eq!(code, 64, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--upstream"), "{err}");

    let (code, err) = run_err(&[]);
    assert_eq!(code, 64);
    assert!(err.contains("--upstream is required"), "{err}");

    let (code, err) = run_err(&["--upstream", "http://127.0.0.1:1", "--gpus=-2"]);
    assert_eq!(code, 64, "{err}");

    let (code, err) = run_err(&["--upstream", "http://127.0.0.1:1", "--buckets", "fine"]);
    assert_eq!(code, 64, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--buckets \"fine\""), "{err}");

    // clap's own errors keep the contract: one line naming the flag, exit 64.
    let (code, err) = run_err(&["--no-such-flag"]);
    assert_eq!(code, 64, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--no-such-flag"), "{err}");
    let (code, err) = run_err(&["--upstream", "http://127.0.0.1:1", "--max-tenants", "many"]);
    assert_eq!(code, 64, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--max-tenants"), "{err}");
    let (code, err) = run_err_env(
        &["--upstream", "http://127.0.0.1:1"],
        &[("TOKENMETER_NO_UI", "maybe")],
    );
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--no-ui"), "{err}");
    let (code, err) = run_err(&[
        "--upstream",
        "http://127.0.0.1:1",
        "--inject-usage",
        "maybe",
    ]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--inject-usage"), "{err}");
    // A tokenizer that is not there: one line naming its path, before anything is bound.
    let (code, err) = run_err(&[
        "--upstream",
        "http://127.0.0.1:1",
        "--gpus",
        "1",
        "--tokenizer",
        "/nonexistent/tokenizer-dir",
    ]);
    assert_eq!(code, 64, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/tokenizer-dir"), "{err}");

    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = busy.local_addr().expect("addr").to_string();
    let (code, err) = run_err(&["--upstream", "http://127.0.0.1:1", "--listen", &addr]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot listen on") && err.contains("--listen"),
        "{err}"
    );
}

#[test]
fn a_mistyped_flag_or_subcommand_names_the_one_it_was_close_to() {
    for (args, meant) in [
        (&["--upsteam", "http://127.0.0.1:1"][..], "--upstream"),
        (&["--upsteam=http://127.0.0.1:1"][..], "--upstream"),
        (
            &["--upstream", "http://127.0.0.1:1", "--gpu", "1"][..],
            "--gpus",
        ),
        (&["proxy", "--lisen", "127.0.0.1:0"][..], "--listen"),
        // A subcommand's flags are its own, not the proxy's.
        (
            &["bench", "--target", "http://h", "--concurency", "4"][..],
            "--concurrency",
        ),
        (
            &["capacity", "--metric", "http://h/metrics"][..],
            "--metrics",
        ),
        (&["bnech"][..], "bench"),
    ] {
        let (code, err) = run_err(args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(&format!("did you mean `{meant}`?")),
            "{args:?}: {err}"
        );
    }
    // Nothing close: no guess, the same one line.
    for args in [
        &["--no-such-flag"][..],
        &["sim", "--upstream", "http://h"][..],
    ] {
        let (code, err) = run_err(args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("did you mean"), "{args:?}: {err}");
    }
}

#[test]
fn every_flag_reads_an_environment_variable_and_is_explained() {
    let out = tokenmeter().arg("--help").output().expect("help");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--upstream",
        "--listen",
        "--metrics-listen",
        "--gpus",
        "--max-models",
        "--rate-window",
        "--drain-timeout",
        "--max-line-bytes",
        "--connect-timeout",
        "--upstream-ca",
        "--upstream-client-cert",
        "--upstream-client-key",
        "--tls-cert",
        "--tls-key",
        "--metrics-tls-cert",
        "--metrics-tls-key",
        "--gpus-file",
        "--gpu-hour-cost",
        "--slo",
        "--slo-file",
        "--slo-class-header",
        "--slo-default-class",
        "--buckets",
    ] {
        let env = format!(
            "TOKENMETER_{}",
            flag.trim_start_matches("--")
                .replace('-', "_")
                .to_uppercase()
        );
        assert!(help.contains(flag), "--help does not mention {flag}");
        assert!(help.contains(&env), "--help does not mention {env}");
    }
    let port = free_port();
    let mut child = tokenmeter()
        .env("TOKENMETER_UPSTREAM", "http://127.0.0.1:1")
        .env("TOKENMETER_LISTEN", "127.0.0.1:0")
        .env("TOKENMETER_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let up = wait_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        up,
        "configured through the environment alone, it did not listen on {port}"
    );
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[tokio::test]
async fn sigterm_turns_readyz_503_at_once_finishes_open_streams_then_exits_0() {
    let ms = Duration::from_millis(1);
    let up =
        upstream::spawn(move |_| Reply::sse(upstream::openai_chat(ms, 40, 50 * ms, true))).await;
    let (port, mport) = (free_port(), free_port());
    let mut child = tokenmeter()
        .args([
            "--upstream",
            &up.url(),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{mport}"),
            "--drain-timeout",
            "20s",
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let ready_url = format!("http://127.0.0.1:{mport}/readyz");
    let mut ready = false;
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", mport)).is_ok() {
            ready = client::send(http::Method::GET, &ready_url, "").await.status == 200;
            if ready {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ready, "/readyz never answered 200");

    // A 2-second stream is open when SIGTERM arrives.
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let stream = tokio::spawn(async move { client::post(&url, &chat_request(true, true)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = child.id().to_string();
    let sent = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let mut readyz = 0;
    while sent.elapsed() < Duration::from_secs(1) {
        readyz = client::send(http::Method::GET, &ready_url, "").await.status;
        if readyz == 503 {
            break;
        }
    }
    assert_eq!(
        readyz, 503,
        "/readyz did not turn 503 within 1 s of SIGTERM"
    );
    let seen = stream.await.expect("stream");
    assert!(!seen.error, "the open stream was cut");
    assert!(
        seen.body.ends_with(b"data: [DONE]\n\n"),
        "the open stream did not finish"
    );
    assert_eq!(
        String::from_utf8_lossy(&seen.body)
            .matches("\"content\":\"t")
            .count(),
        40
    );
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "it waited for the drain timeout"
    );
}

/// Starts the binary in front of `upstream` and waits until `/readyz` answers.
pub(crate) async fn start_binary(
    upstream: &str,
    extra: &[&str],
    log: &str,
) -> (std::process::Child, u16, u16) {
    let (port, mport) = (free_port(), free_port());
    let child = tokenmeter()
        .args([
            "--upstream",
            upstream,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{mport}"),
        ])
        .args(extra)
        .env("TOKENMETER_LOG", log)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let url = format!("http://127.0.0.1:{mport}/readyz");
    for _ in 0..400 {
        if std::net::TcpStream::connect(("127.0.0.1", mport)).is_ok()
            && client::send(http::Method::GET, &url, "").await.status == 200
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (child, port, mport)
}

pub(crate) fn sigterm(child: &std::process::Child) {
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
}

#[tokio::test]
async fn under_load_sigterm_lets_every_open_stream_finish() {
    let ms = Duration::from_millis(1);
    let up =
        upstream::spawn(move |_| Reply::sse(upstream::openai_chat(ms, 30, 40 * ms, true))).await;
    let (mut child, port, _) = start_binary(&up.url(), &["--drain-timeout", "20s"], "info").await;
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let streams: Vec<_> = (0..20)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { client::post(&url, &chat_request(true, true)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    sigterm(&child);
    for s in streams {
        let seen = s.await.expect("stream");
        assert!(
            !seen.error && seen.body.ends_with(b"data: [DONE]\n\n"),
            "a stream was cut short by the drain"
        );
    }
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn after_the_drain_timeout_what_is_left_is_cut_and_new_connections_are_refused() {
    let up = upstream::spawn(|_| {
        Reply::sse(vec![
            upstream::Step::Send(bytes::Bytes::from_static(b": hi\n\n")),
            upstream::Step::Hang,
        ])
    })
    .await;
    let (mut child, port, _) = start_binary(&up.url(), &["--drain-timeout", "1s"], "info").await;
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let stream = tokio::spawn(async move { client::post(&url, &chat_request(true, false)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    sigterm(&child);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    let took = sent.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "exited after {took:?}"
    );
    assert!(
        stream.await.expect("stream").error,
        "the hanging stream was cut at the drain timeout"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "still accepting after exit"
    );
}

#[tokio::test]
async fn prompts_completions_and_credentials_never_reach_the_logs() {
    let up = upstream::spawn(|_| {
        let mut r = Reply::sse(vec![upstream::Step::Send(bytes::Bytes::from_static(
            b"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"SECRET-COMPLETION\"}}]}\n\ndata: [DONE]\n\n",
        ))]);
        r.headers.push(("set-cookie".into(), "SECRET-COOKIE=1".into()));
        r
    })
    .await;
    for level in ["info", "debug", "tokenmeter=trace"] {
        let (mut child, port, _) = start_binary(&up.url(), &[], level).await;
        let req = http::Request::post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .header("authorization", "Bearer SECRET-KEY")
            .header("x-api-key", "SECRET-API-KEY")
            .header("cookie", "session=SECRET-SESSION")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"SECRET-PROMPT"}]}"#,
            )))
            .expect("request");
        let resp = client::client().request(req).await.expect("response");
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
        // And one failure, which is logged.
        let _ = client::post(
            &format!("http://127.0.0.1:{port}/x"),
            "{\"prompt\":\"SECRET-PROMPT\"}",
        )
        .await;
        sigterm(&child);
        let out = tokio::task::spawn_blocking(move || {
            let _ = child.wait();
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().expect("stderr"), &mut s);
            s
        })
        .await
        .expect("join");
        assert!(
            out.contains("tokenmeter started"),
            "no logs captured at {level}: {out}"
        );
        for secret in [
            "SECRET-COMPLETION",
            "SECRET-PROMPT",
            "SECRET-KEY",
            "SECRET-API-KEY",
            "SECRET-SESSION",
            "SECRET-COOKIE",
        ] {
            assert!(
                !out.contains(secret),
                "{secret} logged at level {level}:\n{out}"
            );
        }
    }
}

#[tokio::test]
async fn logs_to_a_pipe_carry_no_colour_codes() {
    let (port, mport) = (free_port(), free_port());
    let child = tokenmeter()
        .args(["--upstream", "http://127.0.0.1:1"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{mport}")])
        // Not a terminal, and nothing in the environment asks for no colour: the pipe alone
        // must turn it off.
        .env_remove("NO_COLOR")
        .env("TOKENMETER_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let up = wait_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", mport)).is_ok()
    });
    // A 502 logs a warning too: a second level, a second colour if any were on.
    let _ = client::post(&format!("http://127.0.0.1:{port}/nothing"), "").await;
    sigterm(&child);
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("output");
    let (stdout, stderr) = (out.stdout, out.stderr);
    let log = String::from_utf8_lossy(&stderr);
    assert!(up, "it did not listen: {log}");
    assert!(log.contains("tokenmeter started"), "{log}");
    for (name, bytes) in [("stderr", &stderr), ("stdout", &stdout)] {
        assert!(
            !bytes.contains(&0x1b),
            "an escape code in {name}: {}",
            String::from_utf8_lossy(bytes).escape_debug()
        );
    }
}

// --- TLS ---

#[test]
fn a_missing_or_unreadable_certificate_or_key_is_one_line_and_exit_64() {
    let dir = crate::support::tls::Dir::new("cli-tls");
    let ca = crate::support::tls::Ca::new("cli ca");
    let leaf = ca.leaf(&["127.0.0.1"], crate::support::tls::Validity::Now);
    let cert = dir.write("tls.crt", &leaf.cert_pem);
    let key = dir.write("tls.key", &leaf.key_pem);
    let garbage = dir.write("garbage.pem", "not a certificate\n");
    let missing = dir.0.join("missing.pem");
    let (c, k, g, m) = (
        cert.to_str().expect("utf-8"),
        key.to_str().expect("utf-8"),
        garbage.to_str().expect("utf-8"),
        missing.to_str().expect("utf-8"),
    );
    // `--gpus 1`: no start-up warning about the GPU count beside the one error line.
    let http = [
        "--upstream",
        "http://127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--gpus",
        "1",
    ];
    let https = [
        "--upstream",
        "https://127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--gpus",
        "1",
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            [&http[..], &["--tls-cert", m, "--tls-key", k]].concat(),
            "--tls-cert",
        ),
        (
            [&http[..], &["--tls-cert", c, "--tls-key", m]].concat(),
            "--tls-key",
        ),
        (
            [&http[..], &["--tls-cert", g, "--tls-key", k]].concat(),
            "--tls-cert",
        ),
        (
            [&http[..], &["--tls-cert", c, "--tls-key", c]].concat(),
            "--tls-key",
        ),
        ([&http[..], &["--tls-cert", c]].concat(), "--tls-cert"),
        (
            [
                &http[..],
                &["--metrics-tls-cert", c, "--metrics-tls-key", m],
            ]
            .concat(),
            "--metrics-tls-key",
        ),
        (
            [&https[..], &["--upstream-ca", m]].concat(),
            "--upstream-ca",
        ),
        (
            [&https[..], &["--upstream-ca", g]].concat(),
            "--upstream-ca",
        ),
        (
            [
                &https[..],
                &["--upstream-client-cert", c, "--upstream-client-key", m],
            ]
            .concat(),
            "--upstream-client-key",
        ),
    ];
    for (args, flag) in cases {
        let (code, err) = run_err(&args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[tokio::test]
async fn a_certificate_failure_is_logged_once_per_cause_not_per_request() {
    let ca = crate::support::tls::Ca::new("untrusted ca");
    let leaf = ca.leaf(&["127.0.0.1"], crate::support::tls::Validity::Now);
    let up = upstream::spawn_tls(
        crate::support::tls::acceptor(&leaf, &[b"http/1.1"], None),
        |_| Reply::json(200, "{}"),
    )
    .await;
    let (mut child, port, _) = start_binary(&up.https_url(), &[], "info").await;
    for _ in 0..8 {
        let seen = client::post(
            &format!("http://127.0.0.1:{port}/v1/chat/completions"),
            &chat_request(true, true),
        )
        .await;
        assert_eq!(seen.status, 502);
    }
    sigterm(&child);
    let out = tokio::task::spawn_blocking(move || {
        let _ = child.wait();
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(child.stderr.as_mut().expect("stderr"), &mut s);
        s
    })
    .await
    .expect("join");
    let lines = out
        .lines()
        .filter(|l| l.contains("certificate_untrusted"))
        .count();
    assert_eq!(lines, 1, "{out}");
}

#[tokio::test]
async fn sigterm_lets_an_open_websocket_finish_within_the_drain_timeout() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let echo = crate::support::ws::spawn_echo(None).await;
    let (mut child, port, _) = start_binary(
        &format!("http://{}", echo.addr),
        &["--drain-timeout", "20s"],
        "info",
    )
    .await;
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let mut ws = crate::support::ws::connect_plain(addr, "/v1/realtime").await;
    crate::support::ws::echo_round_trips(&mut ws, &[Message::text("before")]).await;
    sigterm(&child);
    // The conversation goes on after SIGTERM, for a second.
    for i in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let m = Message::text(format!("after {i}"));
        crate::support::ws::echo_round_trips(&mut ws, &[m]).await;
    }
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "exited while the WebSocket was open"
    );
    ws.close(None).await.expect("close");
    while ws.next().await.is_some() {}
    drop(ws);
    let closed = Instant::now();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "{status:?}");
    assert!(
        closed.elapsed() < Duration::from_secs(5),
        "it waited for the drain timeout, not for the WebSocket"
    );
    assert_eq!(echo.closed_cleanly(), 1);
}

// === SLO classes and GPUs ===

/// Runs the binary with these flags and environment, expecting a configuration error.
pub(crate) fn run_err_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut c = tokenmeter();
    for var in ["TOKENMETER_SLO", "TOKENMETER_SLO_FILE", "TOKENMETER_GPUS"] {
        c.env_remove(var);
    }
    let out = c
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_slo_strings_exit_64_with_one_line_naming_the_problem() {
    let up = ["--upstream", "http://127.0.0.1:1"];
    for (slo, want) in [
        (
            "chat:ttft=soon",
            "--slo \"chat:ttft=soon\": \"soon\" is not a duration",
        ),
        (
            "chat:tps=0",
            "--slo \"chat:tps=0\": tps must be a positive number",
        ),
        ("Chat", "--slo \"Chat\": class name \"Chat\" must be"),
        (
            "chat:objective=1.5",
            "objective must be a share between 0 and 1",
        ),
        ("chat:speed=9", "unknown target \"speed\""),
    ] {
        let (code, err) = run_err_env(&[&up[..], &["--slo", slo]].concat(), &[]);
        assert_eq!(code, 64, "{slo}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "{slo}: {err}");
    }
    // The variable holds several classes, ';'-separated: the second one is named.
    let (code, err) = run_err_env(&up, &[("TOKENMETER_SLO", "chat:ttft=1s;bulk:tps=x")]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("--slo \"bulk:tps=x\": tps: \"x\" is not a number"),
        "{err}"
    );
    let (code, err) = run_err_env(&up, &[("TOKENMETER_SLO", "chat;chat")]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("class \"chat\" is declared twice"), "{err}");
    let (code, err) = run_err_env(&[&up[..], &["--slo-default-class", "vip"]].concat(), &[]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("--slo-default-class \"vip\" is not a declared class"),
        "{err}"
    );
    let (code, err) = run_err_env(
        &[&up[..], &["--slo-file", "/no/such/slo.yaml"]].concat(),
        &[],
    );
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("--slo-file /no/such/slo.yaml: cannot read it"),
        "{err}"
    );
    let (code, err) = run_err_env(&[&up[..], &["--gpus", "lots"]].concat(), &[]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("--gpus must be auto or a positive number"),
        "{err}"
    );
}

#[test]
fn bad_replicas_exit_64_with_one_line_naming_the_flag() {
    let up = ["--upstream", "http://127.0.0.1:1"];
    for bad in ["0", "-3", "some", "2.5"] {
        let flag = format!("--replicas={bad}");
        let (code, err) = run_err_env(&[&up[..], &[flag.as_str()]].concat(), &[]);
        assert_eq!(code, 64, "{bad}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!(
                "--replicas must be auto or a whole number of 1 or more, got {bad:?}"
            )),
            "{bad}: {err}"
        );
    }
    let (code, err) = run_err_env(&up, &[("TOKENMETER_REPLICAS", "none")]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--replicas must be auto"), "{err}");
}

// The release binary's allocator is jemalloc with its background thread (Cargo feature
// `jemalloc`, on by default): the thread that gives a burst's memory back to the system runs,
// under the name jemalloc gives it, in the proxy the user starts.
#[cfg(all(feature = "jemalloc", target_os = "linux", target_env = "gnu"))]
#[tokio::test]
async fn the_binary_runs_jemalloc_with_its_background_thread() {
    let (mut child, _, _) = start_binary("http://127.0.0.1:9", &[], "warn").await;
    let threads = |pid: u32| -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.filter_map(|t| t.ok())
                    .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                    .map(|c| c.trim().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let pid = child.id();
    let found = wait_until(Duration::from_secs(5), || {
        threads(pid).iter().any(|t| t == "jemalloc_bg_thd")
    });
    let seen = threads(pid);
    sigterm(&child);
    let _ = child.wait();
    assert!(found, "no jemalloc background thread among {seen:?}");
}
