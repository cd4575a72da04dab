//! `tokenmeter bench` end to end: against a scripted upstream with known timing, through the
//! proxy (client and proxy figures must agree), and the files it writes.

// A test that unwraps fails loudly, which is its job.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use tokenmeter_tools::bench::client::{Client, Sample};
use tokenmeter_tools::bench::load::{Driver, Ramp};
use tokenmeter_tools::bench::progress::Progress;
use tokenmeter_tools::bench::prompt::{Endpoint, RequestBuilder};
use tokenmeter_tools::bench::report::{self, LevelReport, Report};
use tokenmeter_tools::bench::stats::Percentiles;
use tokenmeter_tools::bench::{self, BenchArgs, BenchConfig, BenchError};
use tokenmeter_tools::sim::{Model, Sim, SimConfig};

use crate::support::upstream::{self, Reply, Upstream};
use crate::support::{self as s, tempdir};

// === A scripted upstream ===

/// The scripted upstream's timing: `ttft`, then `max_tokens` tokens `gap` apart, then a usage
/// chunk and `[DONE]`. It does not slow down with load, so per-request figures are known.
#[derive(Clone, Copy)]
struct Script {
    ttft: Duration,
    gap: Duration,
}

/// An OpenAI server for `test-model` that honours `max_tokens` exactly.
async fn spawn_upstream(script: Script) -> Upstream {
    upstream::spawn(move |r| {
        if r.path == "/v1/models" {
            return Reply::json(200, r#"{"object":"list","data":[{"id":"test-model"}]}"#);
        }
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(&r.body) else {
            return Reply::json(400, "{}");
        };
        if json["model"] != "test-model" {
            return Reply::json(404, r#"{"error":{"message":"no such model"}}"#);
        }
        let n = json["max_tokens"].as_u64().unwrap_or(16) as usize;
        Reply::sse(upstream::openai_chat(script.ttft, n, script.gap, true))
    })
    .await
}

// === Helpers ===

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn config(target: &str, extra: &[&str], out: &Path) -> BenchConfig {
    let mut args = vec!["bench", "--target", target, "--out"];
    let out = out.to_str().unwrap();
    args.push(out);
    args.extend_from_slice(extra);
    Cli::try_parse_from(args).unwrap().bench.validate().unwrap()
}

const SCRIPT: Script = Script {
    ttft: Duration::from_millis(40),
    gap: Duration::from_millis(10),
};

// === Against the scripted upstream ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measures_the_known_timing_of_a_scripted_upstream() {
    let _turn = s::serial().await;
    let up = spawn_upstream(SCRIPT).await;
    let out = tempdir("scripted");
    let cfg = config(
        &up.url(),
        &[
            "--concurrency",
            "1,4",
            "--requests",
            "8",
            "--output-tokens",
            "20",
            "--prompt-tokens",
            "50",
        ],
        &out,
    );
    let report = bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .unwrap();
    assert_eq!(report.model, "test-model", "model from /v1/models");
    assert_eq!(report.levels.len(), 2);
    for l in &report.levels {
        assert_eq!((l.requests, l.errors), (8, 0), "level {}", l.concurrency);
        // Exact: every request asked for 20 tokens and the usage chunk says 20.
        assert_eq!(l.output_tokens, 8 * 20);
        let per_req = l.output_tokens_per_request.unwrap();
        assert_eq!((per_req.min, per_req.max), (20.0, 20.0));
        // The scripted usage chunk always says 12 prompt tokens.
        assert_eq!(l.input_tokens_per_request.unwrap().mean, 12.0);
        // Timing: never earlier than the script (40 ms TTFT, 10 ms per token; timers do not
        // fire early), and later only by scheduling: generous upper bounds, as the suite shares
        // two cores with builds.
        let ttft = l.ttft.unwrap();
        assert!(ttft.min >= 0.040, "TTFT min {}", ttft.min);
        assert!(ttft.p50 < 0.040 + 0.100, "TTFT p50 {}", ttft.p50);
        let tpot = l.tpot.unwrap();
        assert!(
            tpot.p50 >= 0.009 && tpot.p50 < 0.030,
            "TPOT p50 {}",
            tpot.p50
        );
        let tps = l.request_tps.unwrap();
        assert!(
            tps.p50 > 33.0 && tps.p50 <= 111.0,
            "per-request tok/s {}",
            tps.p50
        );
        // One measure seen two ways: the slowest request has the longest TPOT.
        assert!(
            (tpot.max - 1.0 / tps.min).abs() < 1e-9,
            "TPOT is 1 / per-request tok/s"
        );
        let itl = l.itl.unwrap();
        assert_eq!(itl.count, 8 * 19, "one ITL per token after the first");
        assert!(itl.p50 >= 0.009 && itl.p50 < 0.030, "ITL p50 {}", itl.p50);
        // Little's law for a closed loop: N in flight, each yielding 20 tokens in a mean e2e,
        // deliver N x 20 / e2e tokens/s. The aggregate, computed from arrival times inside the
        // window, must agree (window edges cost a few tokens at N = 4).
        let little = l.concurrency as f64 * 20.0 / l.e2e.unwrap().mean;
        let ratio = l.aggregate_tps / little;
        assert!(
            ratio > 0.85 && ratio < 1.05,
            "level {}: aggregate {} vs Little's law {little}",
            l.concurrency,
            l.aggregate_tps
        );
    }
    for f in [
        bench::JSON_FILE,
        bench::CSV_FILE,
        bench::THROUGHPUT_SVG,
        bench::TTFT_SVG,
    ] {
        assert!(out.join(f).is_file(), "{f} written");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_mode_keeps_n_in_flight_for_the_window() {
    let _turn = s::serial().await;
    let up = spawn_upstream(SCRIPT).await;
    let out = tempdir("duration");
    let cfg = config(
        &up.url(),
        &[
            "--concurrency",
            "3",
            "--duration",
            "600ms",
            "--output-tokens",
            "10",
        ],
        &out,
    );
    let report = bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .unwrap();
    let l = &report.levels[0];
    // The window is the deadline; the drain after it waits for requests already sent.
    assert!(
        (l.window_seconds - 0.6).abs() < 0.02,
        "window {}",
        l.window_seconds
    );
    assert!(l.elapsed_seconds > l.window_seconds);
    // Closed loop: each of the 3 workers sends back to back until the deadline, so it sends
    // window / e2e requests, rounded up (the last one is sent before the deadline and ends
    // after it). Whatever the machine's speed, the count must tile the window.
    let expected = 3.0 * l.window_seconds / l.e2e.unwrap().mean;
    assert!(
        (l.requests as f64) >= expected - 1.0 && (l.requests as f64) <= expected + 3.0 + 1.0,
        "{} requests, {expected:.1} expected from e2e {}",
        l.requests,
        l.e2e.unwrap().mean
    );
    assert_eq!(l.output_tokens, l.requests as u64 * 10);
    assert!(l.window_output_tokens < l.output_tokens as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_ends_the_level_and_still_writes_the_files() {
    let _turn = s::serial().await;
    let up = spawn_upstream(SCRIPT).await;
    let out = tempdir("interrupt");
    let cfg = config(
        &up.url(),
        &[
            "--concurrency",
            "2,4",
            "--duration",
            "20s",
            "--output-tokens",
            "10",
        ],
        &out,
    );
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = interrupted.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let started = std::time::Instant::now();
    let report = bench::run(&cfg, Progress::disabled(), interrupted)
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(report.levels.len(), 1, "the second level never starts");
    let l = &report.levels[0];
    assert!(l.window_seconds < 1.0 && l.requests >= 2, "{l:?}");
    assert_eq!(l.errors, 0, "requests in flight finish, none is cut");
    assert!(out.join(bench::JSON_FILE).is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_model_fails_at_once_with_the_status() {
    let up = spawn_upstream(SCRIPT).await;
    let out = tempdir("wrong-model");
    let cfg = config(&up.url(), &["--model", "nope"], &out);
    match bench::run(&cfg, Progress::disabled(), Default::default()).await {
        Err(BenchError::Probe { source, .. }) => {
            assert_eq!(
                source,
                tokenmeter_tools::bench::client::RequestError::Status(404)
            )
        }
        other => panic!("expected a probe error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_is_one_clear_error() {
    // Bind and drop a listener: a port nobody listens on.
    let addr = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let out = tempdir("down");
    let cfg = config(&format!("http://{addr}"), &["--model", "m"], &out);
    let err = bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("Connection refused") || msg.contains("connection refused"),
        "{msg}"
    );
    assert!(!err.is_usage());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_whose_upstream_is_down_is_named_with_its_502_and_its_words() {
    // tokenmeter in front of a port nobody listens on: it answers every request 502 with a
    // JSON body saying why.
    let addr = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = s::spawn_proxy(&format!("http://{addr}"), &[]).await;
    let out = tempdir("upstream-down");
    let cfg = config(&proxy.url(), &[], &out);
    let err = bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, BenchError::Model { .. }), "{msg}");
    assert!(msg.contains("HTTP status 502"), "{msg}");
    assert!(msg.contains("the upstream is unavailable"), "{msg}");
    assert!(msg.contains("upstream_unavailable"), "{msg}");
    // A failing server fails a named model too: no advice that would not help.
    assert!(!msg.contains("--model"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
    assert!(!err.is_usage());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_model_list_is_quoted_and_told_to_pass_the_model() {
    let long = format!(r#"{{"detail":"Not Found","pad":"{}"}}"#, "y".repeat(1000));
    let up = upstream::spawn(move |_| Reply::json(404, &long)).await;
    let out = tempdir("no-models");
    let cfg = config(&up.url(), &[], &out);
    let msg = bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(r#"HTTP status 404: {"detail":"Not Found""#),
        "{msg}"
    );
    assert!(msg.ends_with("...; pass --model"), "{msg}");
    // The quote is capped: a server's whole page is not the error.
    assert!(msg.len() < 300 + 200, "{} bytes: {msg}", msg.len());
}

// === Through the proxy ===

/// TTFT buckets 1 ms apart up to 1 s: the proxy's interpolated median is then within a
/// millisecond of the true one, so the comparison tests measurement, not bucket resolution.
fn fine_ttft_buckets() -> String {
    (1..=1000)
        .map(|ms| format!("{}", ms as f64 / 1000.0))
        .collect::<Vec<_>>()
        .join(",")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_and_proxy_agree_on_ttft_and_tokens() {
    let _turn = s::serial().await;
    let up = spawn_upstream(SCRIPT).await;
    let proxy = s::spawn_proxy(&up.url(), &["--buckets-ttft", &fine_ttft_buckets()]).await;
    let out = tempdir("proxy");
    let metrics_url = format!("http://{}/metrics", proxy.metrics_addr);
    let cfg = config(
        &proxy.url(),
        &[
            "--concurrency",
            "1,8",
            "--requests",
            "16",
            "--output-tokens",
            "12",
            "--proxy-metrics",
            &metrics_url,
            // Opens the pooled connections (client to proxy, proxy to upstream) first, so
            // the levels compare measurement, not connection setup.
            "--warmup",
        ],
        &out,
    );
    let report = bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .unwrap();
    for l in &report.levels {
        let p = l.proxy.as_ref().expect("proxy figures");
        assert_eq!(p.requests, 16, "the probe is not counted in a level");
        assert_eq!(p.output_tokens, l.output_tokens, "level {}", l.concurrency);
        assert_eq!(l.output_tokens, 16 * 12);
        // Both medians read from the same 1 ms buckets: they differ only by what was measured.
        let client = p.client_ttft_p50_binned.unwrap();
        let proxy = p.ttft_p50.unwrap();
        let tolerance = 0.005 + 0.05 * client;
        assert!(
            (client - proxy).abs() <= tolerance,
            "level {}: client TTFT p50 {client} vs proxy {proxy}",
            l.concurrency
        );
        // Each request starts at the client before the proxy and its first token reaches the
        // proxy before the client: the client's TTFT is never the smaller, nor is its mean.
        let (cm, pm) = (l.ttft.unwrap().mean, p.ttft_mean.unwrap());
        assert!(cm >= pm, "TTFT means {cm} vs {pm}");
    }
}

// === The files ===

fn summary(v: f64) -> Option<Percentiles> {
    Percentiles::of(&mut vec![v * 0.9, v, v * 1.1])
}

fn synthetic_report(levels: &[usize]) -> Report {
    Report {
        tokenmeter_version: "test",
        target: "http://127.0.0.1:1 <&>".into(),
        model: "m \"quoted\" & <odd>".into(),
        endpoint: tokenmeter_tools::bench::prompt::Endpoint::Chat,
        prompt_tokens: 128,
        shared_prefix_tokens: 0,
        output_tokens: 64,
        stop: "requests".into(),
        stop_value: 100.0,
        warmup: false,
        levels: levels
            .iter()
            .map(|&c| LevelReport {
                concurrency: c,
                request_rate: None,
                mean_concurrency: c as f64,
                not_sent: 0,
                send_late: summary(0.0),
                requests: 100,
                errors: usize::from(c > 8),
                error_kinds: Default::default(),
                window_seconds: 10.0,
                elapsed_seconds: 11.0,
                output_tokens: 6400,
                window_output_tokens: 6000.0,
                aggregate_tps: 60.0 * c as f64,
                request_tps: summary(60.0 - c as f64 / 10.0),
                ttft: summary(0.02 * c as f64),
                itl: summary(0.016),
                tpot: summary(0.016),
                e2e: summary(1.0),
                output_tokens_per_request: summary(64.0),
                input_tokens_per_request: None,
                proxy: None,
                trace: None,
            })
            .collect(),
    }
}

#[test]
fn json_csv_and_charts_are_written_and_parse() {
    let levels = [1, 4, 16, 64, 256];
    let report = synthetic_report(&levels);
    let dir = tempdir("files");
    let files = bench::write_files(&report, &dir).unwrap();
    assert_eq!(files.len(), 4);

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(bench::JSON_FILE)).unwrap())
            .unwrap();
    let got: Vec<u64> = json["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["concurrency"].as_u64().unwrap())
        .collect();
    assert_eq!(got, [1, 4, 16, 64, 256]);
    assert_eq!(json["levels"][2]["aggregate_tps"], 960.0);
    assert_eq!(json["levels"][0]["ttft"]["p50"], 0.02);
    assert!(json["levels"][0]["input_tokens_per_request"].is_null());

    let csv = std::fs::read_to_string(dir.join(bench::CSV_FILE)).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(
        rows.len(),
        levels.len() + 1,
        "header plus one row per level"
    );
    assert_eq!(rows[0], report::CSV_COLUMNS);
    for (row, c) in rows[1..].iter().zip(levels) {
        assert_eq!(row.len(), report::CSV_COLUMNS.len());
        assert_eq!(row[0], c.to_string());
        let agg: f64 = row[5].parse().unwrap();
        assert_eq!(agg, 60.0 * c as f64);
    }

    for (file, classes) in [
        (bench::THROUGHPUT_SVG, ["request-tps", "aggregate-tps"]),
        (bench::TTFT_SVG, ["ttft-p50", "ttft-p99"]),
    ] {
        let svg = std::fs::read_to_string(dir.join(file)).unwrap();
        let root = check_xml(&svg).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(root, "svg");
        for class in classes {
            let points = svg.matches(&format!("class=\"point {class}\"")).count();
            assert_eq!(points, levels.len(), "{file}: one {class} point per level");
        }
    }
}

#[test]
fn a_chart_point_is_higher_for_a_higher_value() {
    let report = synthetic_report(&[1, 2, 4]);
    let svg = tokenmeter_tools::bench::chart::throughput(&report.levels, "t");
    // Aggregate tokens/s doubles at each level: its points climb (smaller y).
    let ys: Vec<f64> = svg
        .lines()
        .filter(|l| l.contains("class=\"point aggregate-tps\""))
        .map(|l| attr(l, "cy").parse().unwrap())
        .collect();
    assert_eq!(ys.len(), 3);
    assert!(ys[0] > ys[1] && ys[1] > ys[2], "{ys:?}");
}

fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let start = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
    let len = tag[start..].find('"').unwrap();
    &tag[start..start + len]
}

/// A small well-formedness check: balanced, properly nested tags, quoted attributes, no raw
/// `<` or stray `&` in text or attribute values. Returns the root element's name.
fn check_xml(doc: &str) -> Result<String, String> {
    let mut stack: Vec<&str> = Vec::new();
    let mut root = None;
    let mut rest = doc;
    if let Some(after) = rest.strip_prefix("<?xml") {
        rest = &after[after.find("?>").ok_or("unterminated declaration")? + 2..];
    }
    while let Some(lt) = rest.find('<') {
        check_text(&rest[..lt])?;
        if stack.is_empty() && root.is_some() && !rest[..lt].trim().is_empty() {
            return Err("text after the root element".into());
        }
        let gt = rest[lt..].find('>').ok_or("unterminated tag")? + lt;
        let tag = &rest[lt + 1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().ok_or(format!("</{name}> closes nothing"))?;
            if open != name.trim() {
                return Err(format!("<{open}> closed by </{name}>"));
            }
            continue;
        }
        let (body, self_closing) = match tag.strip_suffix('/') {
            Some(b) => (b, true),
            None => (tag, false),
        };
        let name_end = body.find(char::is_whitespace).unwrap_or(body.len());
        let name = &body[..name_end];
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_alphanumeric() || c == '-' || c == ':')
        {
            return Err(format!("bad element name in <{tag}>"));
        }
        check_attributes(&body[name_end..])?;
        if stack.is_empty() {
            if root.is_some() {
                return Err("two root elements".into());
            }
            root = Some(name.to_string());
        }
        if !self_closing {
            stack.push(name);
        }
    }
    check_text(rest)?;
    if let Some(open) = stack.pop() {
        return Err(format!("<{open}> never closed"));
    }
    root.ok_or_else(|| "no root element".into())
}

fn check_attributes(mut s: &str) -> Result<(), String> {
    loop {
        s = s.trim_start();
        if s.is_empty() {
            return Ok(());
        }
        let eq = s.find('=').ok_or(format!("attribute without value: {s}"))?;
        let value = s[eq + 1..]
            .strip_prefix('"')
            .ok_or(format!("unquoted attribute: {s}"))?;
        let end = value.find('"').ok_or("unterminated attribute value")?;
        check_text(&value[..end])?;
        s = &value[end + 1..];
    }
}

fn check_text(text: &str) -> Result<(), String> {
    if text.contains('<') {
        return Err(format!("raw < in {text:?}"));
    }
    for (i, _) in text.match_indices('&') {
        let entity = &text[i..text[i..].find(';').map_or(text.len(), |e| i + e + 1)];
        if !["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].contains(&entity) {
            return Err(format!("stray & in {text:?}"));
        }
    }
    Ok(())
}

#[test]
fn the_xml_checker_rejects_broken_documents() {
    assert_eq!(check_xml("<a><b x=\"1\"/></a>"), Ok("a".into()));
    assert!(check_xml("<a><b></a>").is_err());
    assert!(check_xml("<a x=1></a>").is_err());
    assert!(check_xml("<a>1 & 2</a>").is_err());
    assert!(check_xml("<a></a><b/>").is_err());
    assert!(check_xml("<a>").is_err());
}

#[test]
fn the_table_shows_every_level_and_the_proxy_line() {
    let mut report = synthetic_report(&[1, 4]);
    report.levels[1].proxy = Some(tokenmeter_tools::bench::proxy_view::ProxyLevel {
        requests: 101,
        output_tokens: 6400,
        ttft_mean: Some(0.081),
        ttft_p50: Some(0.0795),
        ttft_p50_bucket: Some((0.06, 0.08)),
        client_ttft_p50_binned: Some(0.08),
    });
    let row = report::table_row(&report.levels[1]);
    let first: Vec<&str> = row.lines().next().unwrap().split_whitespace().collect();
    // conc, reqs, err | req tok/s p50, p10 | agg | TTFT p50, p99 | ITL p50, p99 | TPOT p50
    assert_eq!(first[..3], ["4", "100", "0"]);
    assert_eq!(first[4], "59.6");
    assert_eq!(first[7], "240.0");
    assert_eq!(first[9], "80.0");
    let proxy = row.lines().nth(1).unwrap();
    assert!(
        proxy.contains(
            "TTFT p50 79.5 ms (bucket 60-80 ms) vs client 80.0 ms (binned alike; exact 80.0 ms)"
        ),
        "{proxy}"
    );
    assert!(
        proxy.contains("output tokens 6400 vs client 6400"),
        "{proxy}"
    );
    assert!(proxy.contains("requests 101 vs client 100"), "{proxy}");
}

// === The ramp (the demo's closed loop) ===

/// The most requests in flight seen while polling for `over`.
async fn peak_in_flight(ramp: &Ramp, over: Duration) -> usize {
    let end = std::time::Instant::now() + over;
    let mut peak = 0;
    while std::time::Instant::now() < end {
        peak = peak.max(ramp.counts().in_flight.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ramp_follows_its_target_and_cuts_no_request() {
    let _turn = s::serial().await;
    let up = spawn_upstream(SCRIPT).await;
    let driver = Driver {
        client: Arc::new(Client::new(
            format!("{}/v1", up.url()),
            None,
            Duration::from_secs(30),
        )),
        requests: Arc::new(RequestBuilder {
            endpoint: Endpoint::Chat,
            model: "test-model".into(),
            prompt_tokens: 0,
            shared_prefix_tokens: 0,
            output_tokens: 0,
            seed: 0,
        }),
        next_id: Default::default(),
        interrupted: Default::default(),
    };
    let done = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&done);
    // 20 tokens a request: 40 ms to the first, 10 ms apart, about 230 ms in all.
    let ramp = driver.ramp(
        4,
        Arc::new(|_| (8, 20)),
        Arc::new(move |s: &Sample| {
            seen.lock()
                .unwrap()
                .push((s.error.clone(), s.output_tokens()))
        }),
    );
    assert_eq!(peak_in_flight(&ramp, Duration::from_millis(300)).await, 0);
    ramp.set_target(2);
    assert_eq!(peak_in_flight(&ramp, Duration::from_millis(600)).await, 2);
    ramp.set_target(4);
    assert_eq!(peak_in_flight(&ramp, Duration::from_millis(600)).await, 4);
    // Workers above the new target finish the request they are on, then wait.
    ramp.set_target(1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(peak_in_flight(&ramp, Duration::from_millis(300)).await, 1);
    ramp.finish().await;
    let counts = ramp.abort().await;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let done = done.lock().unwrap().clone();
    assert!(n(&counts.started) >= 8, "{}", n(&counts.started));
    assert_eq!(n(&counts.completed), n(&counts.started), "none cut off");
    assert_eq!(n(&counts.errors), 0);
    assert_eq!(done.len() as u64, n(&counts.completed));
    assert!(done.iter().all(|d| *d == (None, 20)), "{done:?}");
    // Counted event by event as they arrived, and equal to the usage reports.
    assert_eq!(n(&counts.tokens), 20 * n(&counts.completed));
}

// === Against the simulator ===

/// A fast simulated GPU: 10 ms per step plus 2 ms per sequence, batches of at most 8. One user
/// decodes at 1 / 12 ms = 83 tok/s; 8 at 1 / 26 ms = 38 tok/s each, 308 tok/s together.
fn sim_model() -> Model {
    Model {
        step_base: Duration::from_millis(10),
        step_per_seq: Duration::from_millis(2),
        prefill_per_token: Duration::from_micros(10),
        step_per_1k_kv_tokens: Duration::ZERO,
        max_batch: 8,
    }
}

async fn spawn_sim(model: Model) -> String {
    let cfg = SimConfig {
        model,
        ..SimConfig::default()
    };
    let sim = Sim::bind(&cfg).await.unwrap();
    let url = format!("http://{}", sim.local_addr());
    tokio::spawn(sim.serve(std::future::pending()));
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_the_simulator_per_request_speed_falls_while_aggregate_climbs() {
    let _turn = s::serial().await;
    let model = sim_model();
    let url = spawn_sim(model).await;
    let out = tempdir("sim");
    let cfg = config(
        &url,
        &[
            "--concurrency",
            "1,4,8,16",
            "--duration",
            "800ms",
            "--prompt-tokens",
            "32",
            "--output-tokens",
            "16",
        ],
        &out,
    );
    let report = bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .unwrap();
    let levels = &report.levels;
    assert_eq!(levels.len(), 4);
    for l in levels {
        assert_eq!(l.errors, 0, "level {}", l.concurrency);
        assert_eq!(l.output_tokens, l.requests as u64 * 16, "exact lengths");
        // The bench reads the simulator's speed right: its decode step at this batch size
        // (generous: the suite shares two cores).
        let batch = l.concurrency.min(model.max_batch) as u32;
        let step = model.step_base + model.step_per_seq * batch;
        let want = 1.0 / step.as_secs_f64();
        let got = l.request_tps.unwrap().p50;
        assert!(
            (got / want - 1.0).abs() < 0.25,
            "level {}: per-request {got:.1} tok/s, the model says {want:.1}",
            l.concurrency
        );
    }
    // Up to --max-batch: every user slower, all users together faster.
    for pair in levels[..3].windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let (ta, tb) = (a.request_tps.unwrap().p50, b.request_tps.unwrap().p50);
        assert!(
            tb <= ta,
            "per-request tok/s rose from {ta} at {} to {tb} at {}",
            a.concurrency,
            b.concurrency
        );
        assert!(
            b.aggregate_tps >= a.aggregate_tps,
            "aggregate tok/s fell from {} at {} to {} at {}",
            a.aggregate_tps,
            a.concurrency,
            b.aggregate_tps,
            b.concurrency
        );
    }
    // Past it, the extra requests queue: the decode speed stays, TTFT grows by about a whole
    // request (16 steps of 26 ms), and the aggregate cannot climb further.
    let (full, over) = (&levels[2], &levels[3]);
    let ttft_gap = over.ttft.unwrap().p50 - full.ttft.unwrap().p50;
    assert!(
        ttft_gap > 0.2,
        "TTFT p50 {} at 8, {} at 16",
        full.ttft.unwrap().p50,
        over.ttft.unwrap().p50
    );
    assert!(
        over.aggregate_tps < full.aggregate_tps * 1.15,
        "{} vs {}",
        over.aggregate_tps,
        full.aggregate_tps
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_tokenmeter_client_and_proxy_agree_on_the_simulator() {
    let _turn = s::serial().await;
    let url = spawn_sim(sim_model()).await;
    let proxy = s::spawn_proxy(&url, &["--buckets-ttft", &fine_ttft_buckets()]).await;
    let out = tempdir("sim-proxy");
    let metrics_url = format!("http://{}/metrics", proxy.metrics_addr);
    let cfg = config(
        &proxy.url(),
        &[
            "--concurrency",
            "1,8",
            "--duration",
            "600ms",
            "--prompt-tokens",
            "32",
            "--output-tokens",
            "16",
            "--proxy-metrics",
            &metrics_url,
            "--warmup",
        ],
        &out,
    );
    let report = bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .unwrap();
    for l in &report.levels {
        let p = l.proxy.as_ref().expect("proxy figures");
        assert_eq!(
            p.requests as usize,
            l.requests + l.errors,
            "level {}",
            l.concurrency
        );
        assert_eq!(p.output_tokens, l.output_tokens, "level {}", l.concurrency);
        assert_eq!(l.output_tokens, l.requests as u64 * 16);
        let (client, proxy) = (p.client_ttft_p50_binned.unwrap(), p.ttft_p50.unwrap());
        assert!(
            (client - proxy).abs() <= 0.005 + 0.05 * client,
            "level {}: client TTFT p50 {client} vs proxy {proxy}",
            l.concurrency
        );
        assert!(l.ttft.unwrap().mean >= p.ttft_mean.unwrap());
    }
}

// === The open loop ===

/// An OpenAI server that serves one request at a time: each holds the server for `service`,
/// then gets its whole answer (two tokens, usage, `[DONE]`) at once, so a request's first token
/// comes `service` after the server took it up, and a backlog queues, in arrival order.
async fn spawn_serial_upstream(service: Duration) -> String {
    use http_body_util::{BodyExt, Full};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // tokio's mutex is fair: waiters take it in the order they asked.
    let server = Arc::new(tokio::sync::Mutex::new(()));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let server = server.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let server = server.clone();
                    async move {
                        let models = req.uri().path() == "/v1/models";
                        let _ = req.into_body().collect().await;
                        let body = if models {
                            r#"{"object":"list","data":[{"id":"test-model"}]}"#.to_string()
                        } else {
                            let _turn = server.lock().await;
                            tokio::time::sleep(service).await;
                            let chunk = |c: &str| {
                                format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{c}\"}}}}]}}\n\n")
                            };
                            format!(
                                "{}{}data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}}}\n\ndata: [DONE]\n\n",
                                chunk("a"),
                                chunk(" b")
                            )
                        };
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            bytes::Bytes::from(body),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

fn serial_driver(url: &str) -> Driver {
    Driver {
        client: Arc::new(Client::new(
            format!("{url}/v1"),
            None,
            Duration::from_secs(30),
        )),
        requests: Arc::new(RequestBuilder {
            endpoint: Endpoint::Chat,
            model: "test-model".into(),
            prompt_tokens: 5,
            shared_prefix_tokens: 0,
            output_tokens: 2,
            seed: 0,
        }),
        next_id: Default::default(),
        interrupted: Default::default(),
    }
}

/// At twice the rate a one-at-a-time server can serve (50 ms each, 40 requests/s), the open
/// loop's latency, counted from each request's due time, grows with the backlog: the server
/// cannot have given the j-th first token before `a_0 + (j + 1) x 50 ms` (a_0 the first due
/// time), so the latencies sum to at least `sum over j of (j + 1) x 50 ms - (a_j - a_0)`, and the
/// request served last waited at least `16 x 50 ms - (a_15 - a_0)` (about 400 ms at this rate).
/// These bounds hold whatever order the server took them in. A closed loop of one on the same
/// server never queues: none of its requests comes near that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_latency_counts_the_backlog_a_closed_loop_hides() {
    use tokenmeter_tools::bench::arrivals::Arrivals;
    use tokenmeter_tools::bench::load::Stop;
    let _turn = s::serial().await;
    let service = Duration::from_millis(50);
    let url = spawn_serial_upstream(service).await;
    let driver = serial_driver(&url);
    let (n, rate, seed) = (16usize, 40.0, 3);
    let run = driver
        .run_open(rate, seed, Stop::Requests(n as u64), Default::default())
        .await;
    assert_eq!(run.rate, Some(rate));
    assert_eq!(run.samples.len(), n);
    assert!(run.samples.iter().all(|s| s.is_ok()), "{:?}", run.samples);
    // The requests were due exactly when the seeded schedule says, to the nanosecond.
    let due: Vec<Duration> = run.samples.iter().map(|s| s.sent - run.started).collect();
    let schedule: Vec<Duration> = Arrivals::new(rate, seed).take(n).collect();
    assert_eq!(due, schedule);
    let a = |j: usize| schedule[j].as_secs_f64();
    let first_token = |s: &Sample| (s.sent - run.started).as_secs_f64() + s.ttft_secs().unwrap();
    let mut firsts: Vec<f64> = run.samples.iter().map(first_token).collect();
    firsts.sort_by(f64::total_cmp);
    let sv = service.as_secs_f64();
    for (j, t) in firsts.iter().enumerate() {
        assert!(*t >= a(0) + (j + 1) as f64 * sv, "first token {j} at {t}");
    }
    let latencies: Vec<f64> = run.samples.iter().map(|s| s.ttft_secs().unwrap()).collect();
    let floor: f64 = (0..n).map(|j| (j + 1) as f64 * sv - (a(j) - a(0))).sum();
    let total: f64 = latencies.iter().sum();
    assert!(total >= floor, "latencies sum {total} below {floor}");
    let longest = latencies.iter().copied().fold(0.0, f64::max);
    let last_floor = n as f64 * sv - (a(n - 1) - a(0));
    assert!(
        last_floor > 4.0 * sv,
        "the schedule builds a backlog: {last_floor}"
    );
    assert!(
        longest >= last_floor,
        "longest {longest} below {last_floor}"
    );
    // Every request of the open level queued behind some before it: at most the first was
    // served at once.
    assert!(
        latencies.iter().filter(|&&l| l < 2.0 * sv).count() <= 4,
        "{latencies:?}"
    );
    let report = LevelReport::from_run(&run);
    assert_eq!(report.request_rate, Some(rate));
    assert!(report.mean_concurrency > 1.0, "{}", report.mean_concurrency);
    assert_eq!(report.not_sent, 0);

    let closed = driver
        .run_level(1, Stop::Requests(8), Default::default())
        .await;
    let worst = closed
        .samples
        .iter()
        .map(|s| s.ttft_secs().unwrap())
        .fold(0.0, f64::max);
    assert!(
        worst < last_floor,
        "closed loop TTFT {worst} vs open-loop backlog {last_floor}"
    );
    assert!(closed.samples.iter().all(|s| s.late.is_zero()));
}

/// `--request-rate` levels run one after the other, and the JSON, CSV, table and charts carry
/// each level's rate and the concurrency it resulted in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_rate_levels_carry_their_rate_into_every_file() {
    let up = spawn_upstream(SCRIPT).await;
    let out = tempdir("open-loop");
    let cfg = config(
        &up.url(),
        &[
            "--request-rate",
            "40,10",
            "--requests",
            "6",
            "--output-tokens",
            "5",
            "--seed",
            "9",
        ],
        &out,
    );
    let report = bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .unwrap();
    let rates: Vec<Option<f64>> = report.levels.iter().map(|l| l.request_rate).collect();
    assert_eq!(rates, [Some(10.0), Some(40.0)]);
    for l in &report.levels {
        assert_eq!((l.requests, l.errors, l.not_sent), (6, 0, 0));
        assert_eq!(l.output_tokens, 6 * 5);
        assert!(l.concurrency >= 1 && l.mean_concurrency > 0.0);
        // Latency from the due time is never below the server's own 40 ms.
        assert!(l.ttft.unwrap().min >= 0.04);
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join(bench::JSON_FILE)).unwrap())
            .unwrap();
    assert_eq!(json["levels"][0]["request_rate"], 10.0);
    assert_eq!(json["levels"][1]["request_rate"], 40.0);
    assert!(json["levels"][1]["mean_concurrency"].as_f64().unwrap() > 0.0);
    assert!(json["levels"][1]["send_late"]["p99"].is_number());
    let csv = std::fs::read_to_string(out.join(bench::CSV_FILE)).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    let col = |name: &str| report::CSV_COLUMNS.iter().position(|c| *c == name).unwrap();
    assert_eq!(rows[1][col("request_rate")], "10");
    assert_eq!(rows[2][col("request_rate")], "40");
    assert_eq!(rows[2][col("not_sent")], "0");
    assert!(rows[2][col("concurrency_mean")].parse::<f64>().unwrap() > 0.0);
    let svg = std::fs::read_to_string(out.join(bench::TTFT_SVG)).unwrap();
    assert!(svg.contains("against request rate"), "{svg}");
    assert!(report::table_row(&report.levels[0])
        .trim_start()
        .starts_with("10 "));
    assert!(report::table_header(true).contains("rate/s"));

    // And the two loops are exclusive.
    let both = Cli::try_parse_from([
        "bench",
        "--target",
        "http://h",
        "--concurrency",
        "1",
        "--request-rate",
        "1",
    ])
    .unwrap()
    .bench
    .validate()
    .unwrap_err();
    assert!(matches!(both, BenchError::ClosedAndOpen));
}

// === Replaying a trace ===

/// A small trace of absolute times: 30 requests 100 ms apart (2.9 s in all), prompts of 300 and
/// 900 tokens in turn, every 900 starting with the same block (id 0), answers of 40 and 20.
/// Returns it with the sums of its prompt and output lengths.
fn small_trace() -> (String, u64, u64) {
    let (mut text, mut input, mut output) = (String::new(), 0, 0);
    for i in 0..30u64 {
        let (len, ids) = if i % 2 == 0 {
            (300, format!("[{}]", 100 + i))
        } else {
            (900, format!("[0, {}]", 100 + i))
        };
        let out = if i % 3 == 0 { 40 } else { 20 };
        text.push_str(&format!(
            "{{\"timestamp\": {}, \"input_length\": {len}, \"output_length\": {out}, \"hash_ids\": {ids}}}\n",
            1_700_000_000_000 + i * 100
        ));
        input += len;
        output += out;
    }
    (text, input, output)
}

/// Replayed twice as fast against the simulator, directly: the simulator served every request
/// of the trace with exactly its prompt and output lengths (completions: no chat template adds
/// to the prompt), and each request left within 20 ms of its scaled due time, beyond what the
/// machine itself held this process back (measured beside it: on a quiet machine, nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_is_replayed_with_its_lengths_exactly_at_its_scaled_times() {
    let _turn = s::serial().await;
    let url = spawn_sim(sim_model()).await;
    let out = tempdir("trace");
    let (text, input, output) = small_trace();
    let path = out.join("trace.jsonl");
    std::fs::write(&path, text).unwrap();
    let cfg = config(
        &url,
        &[
            "--trace",
            path.to_str().unwrap(),
            "--time-scale",
            "0.5",
            "--endpoint",
            "completions",
        ],
        &out,
    );
    let stalls = s::StallWatch::start();
    let report = bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .unwrap();
    let stalled = stalls.worst().as_secs_f64();
    assert_eq!(report.levels.len(), 1);
    let l = &report.levels[0];
    assert_eq!((l.requests, l.errors, l.not_sent), (30, 0, 0));
    assert_eq!(l.output_tokens, output);

    // The simulator's own record of each request, oldest first: the bench's probe (max_tokens
    // 1, a prompt of --prompt-tokens' default 256 words: 256 tokens), then the trace's 30.
    let stats: serde_json::Value =
        serde_json::from_str(&s::client::get_text(&format!("{url}/sim/stats")).await).unwrap();
    assert_eq!(stats["completed"], 31, "the probe and the trace's 30");
    let n = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap();
    let (probe, replayed) = stats["requests"].as_array().unwrap().split_first().unwrap();
    assert_eq!(
        (n(probe, "target_tokens"), n(probe, "prompt_tokens")),
        (1, 256)
    );
    assert_eq!(replayed.len(), 30);
    assert!(replayed
        .iter()
        .all(|r| [300, 900].contains(&n(r, "prompt_tokens"))));
    let sum = |k: &str| replayed.iter().map(|r| n(r, k)).sum::<u64>();
    assert_eq!(
        sum("prompt_tokens"),
        input,
        "prompt tokens as the trace states"
    );
    assert_eq!(
        sum("output_tokens"),
        output,
        "output tokens as the trace states"
    );
    assert_eq!(sum("target_tokens"), output);

    // The bench's own account, in its JSON.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join(bench::JSON_FILE)).unwrap())
            .unwrap();
    let t = &json["levels"][0]["trace"];
    assert_eq!(t["label"], "trace x0.5");
    assert_eq!(t["requests_sent"], 30);
    assert_eq!(
        (t["input_tokens"].as_u64(), t["output_tokens"].as_u64()),
        (Some(input), Some(output))
    );
    assert_eq!(
        (t["zero_output"].as_u64(), t["late_in_trace"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(t["ended"], "end");
    let f = |k: &str| t[k].as_f64().unwrap();
    let (p99, max) = (f("send_late_p99"), f("send_late_max"));
    eprintln!(
        "send lateness: p99 {:.3} ms, max {:.3} ms; the machine stalled this process up to {:.3} ms",
        p99 * 1e3,
        max * 1e3,
        stalled * 1e3
    );
    assert!(
        max < 0.020 + stalled,
        "a request left {max} s after its due time; the machine stalled the process {stalled} s"
    );
    // 29 gaps in 2.9 s: 10 requests/s in the trace, 20 at x0.5, as scheduled exactly.
    assert!((f("trace_rate") - 10.0).abs() < 1e-9, "{t}");
    assert!((f("scheduled_rate") - 20.0).abs() < 1e-3, "{t}");
    assert!((f("achieved_rate") / 20.0 - 1.0).abs() < 0.02, "{t}");
    assert_eq!(json["levels"][0]["request_rate"], t["scheduled_rate"]);
    // The means of the trace stand for the run's lengths.
    assert_eq!((report.prompt_tokens, report.output_tokens), (600, 27));
    assert_eq!(report.stop, "trace");
    let row = report::table_row(l);
    assert!(row.trim_start().starts_with("x0.5 "), "{row}");
    assert!(row.contains("trace: 30 requests sent"), "{row}");
    let csv = std::fs::read_to_string(out.join(bench::CSV_FILE)).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    let col = |name: &str| report::CSV_COLUMNS.iter().position(|c| *c == name).unwrap();
    assert_eq!(rows[1][col("trace_time_scale")], "0.5");
    assert_eq!(rows[1][col("trace_requests_sent")], "30");
    let svg = std::fs::read_to_string(out.join(bench::TTFT_SVG)).unwrap();
    assert!(
        svg.contains("a trace&apos;s, mean") || svg.contains("a trace's, mean"),
        "{svg}"
    );
}
