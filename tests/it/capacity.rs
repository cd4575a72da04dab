//! The live capacity model against the simulator, whose step costs are known exactly.
//!
//! Must hold: under a load ramping from 1 to 64 streams, the fitted `base` and
//! `per_sequence` land within 15% of the simulator's, and the max concurrency for a 40 tok/s
//! floor within 15% of the truth; repeated with a second pair; a run where a few responses
//! pause for 1 s moves them by less than 5%.
//!
//! Each run is a real simulator, a real proxy in front of it (the same process, port 0) and the
//! bench's closed-loop clients: 17 s of ramp, so the whole file takes about 75 s of wall time.

use std::sync::Arc;
use std::time::Duration;

use tokenmeter_tools::exposition::Scrape;
use tokenmeter_tools::sim::{Model, Sim, SimConfig, Stall};

use crate::support::levels;
use crate::support::{serial, spawn_proxy};

/// The class whose floor the issue names.
const CLASS: &str = "floor40";
const FLOOR: f64 = 40.0;

/// What the proxy's `/metrics` said at the end of a run.
#[derive(Debug, Clone)]
struct Fitted {
    base: f64,
    per_seq: f64,
    r2: f64,
    samples: f64,
    max_concurrency: f64,
    /// The scrape's lines that say why the answer is what it is: each bound's limit, how the
    /// requests arrived, the self-check (shown when an assertion fails).
    why: Vec<String>,
}

impl Fitted {
    /// The capacity the fitted line gives before it is rounded down to whole streams.
    fn exact_capacity(&self) -> f64 {
        (1.0 / FLOOR - self.base) / self.per_seq
    }
}

/// The ramp's levels: every concurrency up to 6, then wider steps. A level is held long enough
/// (a second: 24 to 100 steps) for the batch to settle at it, so most of its tokens are
/// observed at the concurrency they were produced at; the moments in between, while clients
/// join, land on the neighbouring concurrencies, where they are minorities.
const LEVELS: [usize; 17] = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 56, 64];
const HOLD: Duration = Duration::from_millis(1000);

/// Tokens per answer. 40: a closed-loop client spends about 1 step in 40 waiting for its next
/// first token, so the decoding count follows the target closely, and each client sends
/// several requests a level. With 100-token answers most clients sent one or two in all, so
/// their first requests (joins, which follow no end) were half of the window's arrivals and
/// the window could read as open arrivals (`capacity::arrivals`), its limit then 24 for 32.
const ANSWER: u64 = 40;

async fn fitted(model: Model, stall: Option<Stall>) -> Fitted {
    let sim = Sim::bind(&SimConfig {
        model,
        stall,
        ..SimConfig::default()
    })
    .await
    .expect("bind the simulator");
    let upstream = format!("http://{}", sim.local_addr());
    let sim_task = tokio::spawn(sim.serve(std::future::pending()));
    let proxy = spawn_proxy(&upstream, &["--slo", &format!("{CLASS}:tps={FLOOR}")]).await;
    let driver = levels::driver(&proxy.url(), "capacity-test", 0, ANSWER, 7);
    let ramp = driver.ramp(64, Arc::new(|_| (0, ANSWER)), Arc::new(|_| {}));
    for level in LEVELS {
        ramp.set_target(level);
        tokio::time::sleep(HOLD).await;
    }
    ramp.abort().await;
    // Let the proxy finish the streams the abort cut, then read a report of the whole ramp (the
    // model refits on its own clock; one may have been published mid-ramp).
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.capacity.next_report().await;
    let text = proxy.scrape().await;
    if std::env::var_os("CAPACITY_TEST_COLUMNS").is_some() {
        for c in proxy.capacity.columns(std::time::Instant::now()) {
            eprintln!(
                "{:>4} {:>6} {:.3} ms",
                c.concurrency,
                c.samples,
                c.median * 1e3
            );
        }
    }
    sim_task.abort();
    let s = Scrape::parse(&text);
    let one = |name: &str, labels: &[(&str, &str)]| {
        s.select(name, labels)
            .next()
            .unwrap_or_else(|| panic!("no {name}{labels:?} in\n{text}"))
            .value
    };
    Fitted {
        base: one("tokenmeter_capacity_step_seconds", &[("term", "base")]),
        per_seq: one(
            "tokenmeter_capacity_step_seconds",
            &[("term", "per_sequence")],
        ),
        r2: one("tokenmeter_capacity_fit_r2", &[]),
        samples: one("tokenmeter_capacity_fit_samples", &[]),
        max_concurrency: one("tokenmeter_capacity_max_concurrency", &[("class", CLASS)]),
        why: text
            .lines()
            .filter(|l| {
                [
                    "tokenmeter_capacity_limit_concurrency",
                    "tokenmeter_capacity_arrivals",
                    "tokenmeter_capacity_check_",
                    "tokenmeter_capacity_observed_concurrency",
                ]
                .iter()
                .any(|p| l.starts_with(p))
            })
            .map(str::to_owned)
            .collect(),
    }
}

fn model(base_us: u64, per_seq_us: u64) -> Model {
    Model {
        step_base: Duration::from_micros(base_us),
        step_per_seq: Duration::from_micros(per_seq_us),
        // Empty prompts: the test is about decode; prefill interference is the stall run's job.
        ..SimConfig::default().model
    }
}

fn off(measured: f64, truth: f64) -> f64 {
    (measured / truth - 1.0).abs()
}

/// The must-hold check for one pair of step costs.
async fn check_pair(base_us: u64, per_seq_us: u64) {
    let _turn = serial().await;
    let (base, per_seq) = (base_us as f64 * 1e-6, per_seq_us as f64 * 1e-6);
    let truth = ((1.0 / FLOOR - base) / per_seq).floor();
    let clean = fitted(model(base_us, per_seq_us), None).await;
    let why = format!(
        "{base_us} us + {per_seq_us} us x b: {clean:?}\n{}",
        clean.why.join("\n")
    );
    assert!(off(clean.base, base) < 0.15, "base: {why}");
    assert!(off(clean.per_seq, per_seq) < 0.15, "per_sequence: {why}");
    assert!(
        off(clean.max_concurrency, truth) < 0.15,
        "max concurrency (truth {truth}): {why}"
    );
    // The fit's quality is reported, not the contract: on a shared 2-core machine the medians of
    // the briefly visited levels scatter, so r² only has to show a line better than a flat one.
    assert!(
        clean.r2 > 0.0 && clean.samples > 5_000.0,
        "fit quality: {why}"
    );

    // A few responses (every 25th, about five of a run) pause for 1 s mid-stream.
    let stall = Stall {
        every: 25,
        after_tokens: 30,
        pause: Duration::from_secs(1),
    };
    let stalled = fitted(model(base_us, per_seq_us), Some(stall)).await;
    let why = format!("{why}; with stalls: {stalled:?}");
    eprintln!("capacity fit, {why}");
    assert!(
        off(stalled.base, clean.base) < 0.05,
        "stalls moved base: {why}"
    );
    assert!(
        off(stalled.per_seq, clean.per_seq) < 0.05,
        "stalls moved per_sequence: {why}"
    );
    // The exported max concurrency is a whole number of streams, so it is compared through the
    // fitted line it is rounded from (within 5%), and must not move by more than one stream.
    assert!(
        off(stalled.exact_capacity(), clean.exact_capacity()) < 0.05,
        "stalls moved the capacity: {why}"
    );
    assert!(
        (stalled.max_concurrency - clean.max_concurrency).abs() <= 1.0,
        "stalls moved max concurrency: {why}"
    );
}

// 10 ms + 0.5 ms per sequence: 40 tok/s holds up to (25 - 10) / 0.5 = 30 streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_fit_recovers_the_simulators_step_cost() {
    check_pair(10_000, 500).await;
}

// 12 ms + 0.4 ms per sequence: 40 tok/s holds up to (25 - 12) / 0.4 = 32.5, so 32 streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_fit_recovers_a_second_step_cost() {
    check_pair(12_000, 400).await;
}

/// The first number after `prefix` in `text`.
fn number_after(text: &str, prefix: &str) -> f64 {
    let from = text
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in\n{text}"))
        + prefix.len();
    text[from..]
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number after {prefix:?} in\n{text}"))
}

/// The whitespace-separated cells of the first line that starts with `first`.
fn row<'a>(text: &'a str, first: &str) -> Vec<&'a str> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
        .unwrap_or_else(|| panic!("no row {first:?} in\n{text}"))
}

// `tokenmeter capacity --metrics URL --svg PATH`, the binary, against a live proxy in front of
// the simulator (10 ms + 0.5 ms per sequence) after a short ramp to 32 streams, with two
// classes: 40 tok/s (truth 30 streams, inside the ramp) and 20 tok/s (truth 80, beyond it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_command_prints_the_live_model_and_writes_the_chart() {
    let _turn = serial().await;
    let sim = Sim::bind(&SimConfig {
        model: model(10_000, 500),
        ..SimConfig::default()
    })
    .await
    .expect("bind the simulator");
    let upstream = format!("http://{}", sim.local_addr());
    let sim_task = tokio::spawn(sim.serve(std::future::pending()));
    let proxy = spawn_proxy(
        &upstream,
        &[
            "--slo",
            &format!("{CLASS}:tps={FLOOR}"),
            "--slo",
            "floor20:tps=20",
        ],
    )
    .await;
    let driver = levels::driver(&proxy.url(), "capacity-command", 0, 100, 11);
    // 7 levels x 0.8 s: about 6 s, a few thousand samples; enough for a fit within 15%.
    let ramp = driver.ramp(32, Arc::new(|_| (0, 100)), Arc::new(|_| {}));
    for level in [1, 2, 4, 8, 16, 24, 32] {
        ramp.set_target(level);
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    ramp.abort().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let exposition = Scrape::parse(&proxy.scrape().await);
    let exported = |name: &str, labels: &[(&str, &str)]| {
        exposition
            .select(name, labels)
            .next()
            .unwrap_or_else(|| panic!("no {name}{labels:?}"))
            .value
    };

    let dir = std::env::temp_dir().join(format!("tokenmeter-capacity-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let svg_path = dir.join("chart.svg");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(["capacity", "--metrics"])
        .arg(format!("http://{}/metrics", proxy.metrics_addr))
        .arg("--svg")
        .arg(&svg_path)
        .env_remove("TOKENMETER_CAPACITY_METRICS")
        .env_remove("TOKENMETER_CAPACITY_SVG")
        .output()
        .await
        .expect("run tokenmeter capacity");
    sim_task.abort();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("tokenmeter capacity printed:\n{text}");

    // The model: within 15% of the simulator's step costs, and the exposition's own figures
    // to the printed precision (the command reads back exactly what the proxy exports).
    let base_ms = number_after(&text, "t(b) = ");
    let per_seq_ms = number_after(&text, "ms + ");
    assert!(off(base_ms, 10.0) < 0.15, "base {base_ms} ms:\n{text}");
    assert!(
        off(per_seq_ms, 0.5) < 0.15,
        "per_seq {per_seq_ms} ms:\n{text}"
    );
    let base = exported("tokenmeter_capacity_step_seconds", &[("term", "base")]);
    let per_seq = exported(
        "tokenmeter_capacity_step_seconds",
        &[("term", "per_sequence")],
    );
    assert!(
        (base_ms - base * 1e3).abs() <= 0.0005 + 1e-9,
        "{base} {text}"
    );
    assert!(
        (per_seq_ms - per_seq * 1e3).abs() <= 0.00005 + 1e-9,
        "{per_seq} {text}"
    );
    let samples = exported("tokenmeter_capacity_fit_samples", &[]);
    assert!(
        text.contains(&format!("{} token samples", samples as u64)),
        "{samples}: {text}"
    );

    // The table: one row per class, floors as configured, max streams within 15% of the truth
    // (30 at 40 tok/s; 80 at 20 tok/s, which lies past the ramp and is flagged).
    let r40 = row(&text, CLASS);
    assert_eq!(r40[1], "40.0", "{text}");
    let max40: f64 = r40[2].parse().expect("max streams");
    assert!(off(max40, 30.0) < 0.15, "{CLASS}: {max40} streams:\n{text}");
    assert_eq!(
        max40,
        exported("tokenmeter_capacity_max_concurrency", &[("class", CLASS)])
    );
    // Fleet tok/s there: max streams / t(max streams) of the fitted line, to 0.1.
    let fleet40: f64 = r40[3].parse().expect("fleet tok/s");
    let want = max40 / (base + per_seq * max40);
    assert!((fleet40 - want).abs() <= 0.05 + 1e-6, "{fleet40} vs {want}");
    let r20 = row(&text, "floor20");
    assert_eq!(r20[1], "20.0", "{text}");
    let max20: f64 = r20[2].parse().expect("max streams");
    assert!(off(max20, 80.0) < 0.15, "floor20: {max20} streams:\n{text}");
    let after20 = text
        .lines()
        .skip_while(|l| !l.starts_with("floor20"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        after20.contains("an extrapolation"),
        "80 streams lie beyond the observed range:\n{text}"
    );

    // The curve: nine rows, each the fitted line's per-request and aggregate tokens/s, marked
    // where it lies beyond the highest concurrency the fit saw (24 or 32 here, as the host
    // allowed the ramp's top level to gather samples).
    let observed_max = exported(
        "tokenmeter_capacity_observed_concurrency",
        &[("bound", "max")],
    );
    assert!((16.0..=32.0).contains(&observed_max), "{observed_max}");
    for b in [1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
        let cells = row(&text, &b.to_string());
        let t = base + per_seq * f64::from(b);
        let (per_request, aggregate): (f64, f64) = (
            cells[1].parse().expect("per-request"),
            cells[2].parse().expect("aggregate"),
        );
        assert!(
            (per_request - 1.0 / t).abs() <= 0.05 + 1e-6,
            "{b}: {cells:?}"
        );
        assert!(
            (aggregate - f64::from(b) / t).abs() <= 0.05 + 1e-6,
            "{b}: {cells:?}"
        );
        let truth = 1.0 / (0.010 + 0.0005 * f64::from(b));
        assert!(off(per_request, truth) < 0.15, "{b}: {cells:?}");
        assert_eq!(
            cells.last() == Some(&"(extrapolated)"),
            f64::from(b) > observed_max,
            "only beyond the observed {observed_max} streams: {cells:?}"
        );
    }
    assert!(text.contains(&format!("chart written to {}", svg_path.display())));

    // The chart: well-formed XML with the expected series and every legend entry named.
    let svg = std::fs::read_to_string(&svg_path).expect("the chart was written");
    let doc = roxmltree::Document::parse(&svg).expect("the chart is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let points = |class: &str| {
        doc.descendants()
            .filter(|n| n.tag_name().name() == "circle")
            .filter(|n| n.attribute("class") == Some(&format!("point {class}")[..]))
            .count()
    };
    // The curve at the nine edges plus each class's max streams (and the operating point,
    // when the last minute had any decoding): at least 11 x positions.
    let xs = points("request-tps");
    assert!(xs >= 11, "{xs} points:\n{svg}");
    assert_eq!(points("aggregate-tps"), xs);
    // Two floors, each drawn across every x.
    assert_eq!(points("floor"), 2 * xs);
    let legend: Vec<String> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("legend"))
        .filter_map(|g| g.descendants().find(|n| n.has_tag_name("text")))
        .filter_map(|t| t.text().map(str::to_string))
        .collect();
    for want in [
        "per-request tokens/s",
        "aggregate tokens/s",
        "floor20 floor",
        "floor40 floor",
    ] {
        assert!(legend.iter().any(|l| l == want), "{want} not in {legend:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tokenmeter capacity` (or `cost`) with `args`, its environment cleared of their variables.
async fn command(args: &[String]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(args)
        .env_remove("TOKENMETER_CAPACITY_METRICS")
        .env_remove("TOKENMETER_CAPACITY_SVG")
        .env_remove("TOKENMETER_COST_METRICS")
        .env_remove("TOKENMETER_COST_PROMETHEUS")
        .output()
        .await
        .expect("run tokenmeter")
}

#[tokio::test]
async fn a_base_url_reads_its_metrics_and_a_prometheus_server_is_named() {
    let proxy = spawn_proxy("http://127.0.0.1:1", &[]).await;
    let svg = std::env::temp_dir().join(format!(
        "tokenmeter-capacity-base-{}.svg",
        std::process::id()
    ));
    let svg = svg.to_string_lossy().into_owned();
    // The metrics listener's address alone, as a user types it: its /metrics is read, and said.
    for base in [
        format!("http://{}", proxy.metrics_addr),
        format!("http://{}/", proxy.metrics_addr),
    ] {
        let out = command(&[
            "capacity".into(),
            "--metrics".into(),
            base.clone(),
            "--svg".into(),
            svg.clone(),
        ])
        .await;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{base}: {stdout}{stderr}");
        assert!(stdout.contains("no fit yet"), "{base}: {stdout}");
        let read = format!("http://{}/metrics", proxy.metrics_addr);
        assert!(
            stderr.contains(&format!("reading {read}: --metrics had no path")),
            "{base}: {stderr}"
        );
    }
    let _ = std::fs::remove_file(&svg);

    // A Prometheus server, on the port both default to: named as one, with what to give instead.
    let prometheus = crate::support::upstream::spawn(|_| {
        crate::support::upstream::Reply::json(
            200,
            "# TYPE prometheus_build_info gauge\nprometheus_build_info{version=\"3.0.0\"} 1\n",
        )
    })
    .await;
    let out = command(&["capacity".into(), "--metrics".into(), prometheus.url()]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = stderr.lines().last().unwrap_or_default();
    assert!(
        line.contains(&format!(
            "{}/metrics is a Prometheus server's own metrics",
            prometheus.url()
        )) && line.contains("capacity reads one tokenmeter's /metrics"),
        "{stderr}"
    );
    let out = command(&[
        "cost".into(),
        "--metrics".into(),
        format!("{}/metrics", prometheus.url()),
    ])
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is a Prometheus server's own metrics") && stderr.contains("--prometheus"),
        "{stderr}"
    );
}
