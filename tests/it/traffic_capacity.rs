//! The capacity answer on traffic as it comes, against the simulator, whose costs are known.
//!
//! The tests before this file drove ramps through many levels, where the fits are well posed.
//! Production traffic is mostly something else: a steady closed loop at one level, open-loop
//! arrivals, bursts. Each case here sends one of those through a fresh proxy, reads the answer,
//! and then measures the truth through another proxy: an open-loop ramp of Poisson request
//! rates, each level's concurrency (the mean in flight at the clients) and whether it met the
//! class (the objective's share of requests within the TTFT target and at or above the speed
//! floor, timed from each request's scheduled send). Must hold:
//!
//! - `max_concurrency` lies between the concurrency of the last level that met the class and
//!   the first that missed, 15% either side; or, for a steady closed loop at one level only,
//!   the class is unsupported (`tokenmeter_capacity_supported` 0) and neither
//!   `max_concurrency` nor `utilization` is exported;
//! - never below the level the class was seen meeting;
//! - the fitted costs within 25% of the simulator's (the per-sequence cost where the answer is
//!   supported; the prefill cost always).
//!
//! The simulator's defaults run in the suite (about 3 minutes); two other cost settings run on
//! request (`cargo test --test it traffic_capacity -- --ignored --nocapture`, 3 minutes each).

use std::sync::Arc;
use std::time::Duration;

use tokenmeter_tools::bench::client::Sample;
use tokenmeter_tools::bench::live::Live;
use tokenmeter_tools::bench::load::{Driver, Stop};
use tokenmeter_tools::exposition::Scrape;
use tokenmeter_tools::sim::{Model, Sim, SimConfig};

use crate::support::levels;
use crate::support::{serial, spawn_proxy};

/// Every case's prompt (words, as many of the simulator's tokens: the 284 the cases were tuned
/// with, when the bench's 256 words averaged 1.11 tokens) and answer.
const PROMPT: usize = 284;
const OUTPUT: u64 = 128;
/// How long each kind of traffic runs before the answer is read.
const TRAFFIC: Duration = Duration::from_secs(40);
/// How long each rate of the truth's ramp is held.
const TRUTH_HOLD: Duration = Duration::from_secs(10);

/// One cost setting and the class its answers are for.
struct Setting {
    model: Model,
    /// The `--slo` class, named `chat`.
    class: &'static str,
    ttft: f64,
    tps: f64,
    objective: f64,
}

impl Setting {
    /// The decode line's edge for the floor, `(1/F - base) / per_seq`: where the truth's rates
    /// are centred (prefill's share of each step moves the real edge below it).
    fn line_edge(&self) -> f64 {
        let base = self.model.step_base.as_secs_f64();
        let per_seq = self.model.step_per_seq.as_secs_f64();
        (1.0 / self.tps - base) / per_seq
    }

    /// The arrival rate that holds `b` in flight at the line's speed (Little's law).
    fn rate_at(&self, b: f64) -> f64 {
        let step = self.model.step_base.as_secs_f64() + self.model.step_per_seq.as_secs_f64() * b;
        b / (OUTPUT as f64 * step)
    }
}

/// The kinds of traffic the answer is read on.
#[derive(Debug, Clone, Copy)]
enum Traffic {
    /// A closed loop of this many clients, started together (`tokenmeter bench
    /// --concurrency`): one level.
    Steady(usize),
    /// Poisson arrivals at this share of the line's edge rate.
    Poisson(f64),
    /// Poisson arrivals at this share of the edge rate, and 20 more requests at once every
    /// 10 s.
    Bursts(f64),
}

/// What the proxy answered after the traffic.
#[derive(Debug)]
struct Read {
    supported: Option<f64>,
    max_concurrency: Option<f64>,
    utilization: Option<f64>,
    per_seq: Option<f64>,
    prefill: Option<f64>,
    shape: Option<String>,
    trusted: Option<f64>,
    text: String,
}

/// A simulator on a runtime and thread of its own, as an engine is a process of its own: its
/// steps keep their time while the proxy and the clients load the test's runtime. Stops when
/// the returned sender is dropped.
pub(crate) fn simulator(model: Model) -> (String, tokio::sync::oneshot::Sender<()>) {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the simulator's runtime");
        runtime.block_on(async move {
            let sim = Sim::bind(&SimConfig {
                model,
                ..SimConfig::default()
            })
            .await
            .expect("bind the simulator");
            let _ = addr_tx.send(sim.local_addr());
            sim.serve(async move {
                let _ = stopped.await;
            })
            .await;
        });
    });
    let addr = addr_rx.recv().expect("the simulator's address");
    (format!("http://{addr}"), stop)
}

fn driver(proxy: &str, seed: u64) -> Driver {
    levels::driver(proxy, "traffic-test", PROMPT, OUTPUT, seed)
}

/// Sends `traffic` for [`TRAFFIC`] through a fresh proxy in front of `upstream` and reads the
/// answer.
async fn answer(upstream: &str, setting: &Setting, traffic: Traffic) -> Read {
    let proxy = spawn_proxy(upstream, &["--slo", setting.class]).await;
    let d = driver(&proxy.url(), 3);
    let edge = setting.rate_at(setting.line_edge());
    match traffic {
        Traffic::Steady(n) => {
            d.run_level(n, Stop::After(TRAFFIC), Arc::new(Live::default()))
                .await;
        }
        Traffic::Poisson(share) => {
            d.run_open(
                edge * share,
                5,
                Stop::After(TRAFFIC),
                Arc::new(Live::default()),
            )
            .await;
        }
        Traffic::Bursts(share) => {
            let background = d.run_open(
                edge * share,
                6,
                Stop::After(TRAFFIC),
                Arc::new(Live::default()),
            );
            let bursts = async {
                let mut sent = tokio::task::JoinSet::new();
                let start = tokio::time::Instant::now();
                for k in 0..(TRAFFIC.as_secs() / 10) {
                    tokio::time::sleep_until(start + Duration::from_secs(5 + 10 * k)).await;
                    for i in 0..20u64 {
                        let d = d.clone();
                        sent.spawn(async move {
                            let body = d.requests.body(1_000_000 + 100 * k + i, OUTPUT);
                            d.client.send(d.requests.endpoint.path(), body).await
                        });
                    }
                }
                while sent.join_next().await.is_some() {}
            };
            tokio::join!(background, bursts);
        }
    }
    proxy.capacity.next_report().await;
    let text = proxy.scrape().await;
    let s = Scrape::parse(&text);
    let one = |name: &str, labels: &[(&str, &str)]| s.select(name, labels).next().map(|x| x.value);
    let chat = [("class", "chat")];
    let shape = s
        .select("tokenmeter_capacity_arrivals", &[])
        .find(|x| x.value == 1.0)
        .and_then(|x| x.label("shape").map(str::to_string));
    Read {
        supported: one("tokenmeter_capacity_supported", &chat),
        max_concurrency: one("tokenmeter_capacity_max_concurrency", &chat),
        utilization: one("tokenmeter_capacity_utilization", &chat),
        per_seq: one(
            "tokenmeter_capacity_step_seconds",
            &[("term", "per_sequence")],
        ),
        prefill: one(
            "tokenmeter_capacity_prefill_seconds_per_token",
            &[("source", "wire")],
        ),
        shape,
        trusted: one("tokenmeter_capacity_check_trusted", &[]),
        text,
    }
}

/// One rate of the truth's ramp: its mean concurrency at the clients and the share of its
/// requests that met the class.
#[derive(Debug, Clone, Copy)]
struct Level {
    rate: f64,
    concurrency: f64,
    share: f64,
}

/// The truth: an open-loop ramp of rates around the line's edge through a fresh proxy.
async fn truth(upstream: &str, setting: &Setting) -> Vec<Level> {
    let proxy = spawn_proxy(upstream, &[]).await;
    let d = driver(&proxy.url(), 9);
    let edge = setting.rate_at(setting.line_edge());
    let mut out = Vec::new();
    for (i, share) in [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0]
        .into_iter()
        .enumerate()
    {
        let rate = edge * share;
        let level = d
            .run_open(
                rate,
                40 + i as u64,
                Stop::After(TRUTH_HOLD),
                Arc::new(Live::default()),
            )
            .await;
        let n = level.samples.len().max(1);
        let ok = |s: &&Sample| s.is_ok();
        let fast = |s: &&Sample| s.ttft_secs().is_some_and(|t| t <= setting.ttft);
        let quick = |s: &&Sample| s.request_tps().map_or(true, |t| t >= setting.tps);
        let met = level
            .samples
            .iter()
            .filter(|s| ok(s) && fast(s) && quick(s))
            .count();
        let count = |f: &dyn Fn(&&Sample) -> bool| level.samples.iter().filter(|s| !f(s)).count();
        let busy: f64 = level.samples.iter().map(|s| s.e2e.as_secs_f64()).sum();
        eprintln!(
            "truth level {rate:.2}/s: {:.1} in flight, {n} requests, {} failed, {} past the TTFT target, {} below the floor",
            busy / TRUTH_HOLD.as_secs_f64(),
            count(&ok),
            count(&fast),
            count(&quick)
        );
        // Little's law at the clients: the time every request spent, over the level's span.
        out.push(Level {
            rate,
            concurrency: busy / TRUTH_HOLD.as_secs_f64(),
            share: met as f64 / n as f64,
        });
        if (met as f64) < 0.5 * n as f64 {
            // Far past the edge: the next rate says nothing more.
            break;
        }
    }
    out
}

/// The concurrency of the last level that met the class and of the first that missed.
fn edge(levels: &[Level], objective: f64, why: &str) -> (f64, f64) {
    let last_met = levels
        .iter()
        .take_while(|l| l.share >= objective)
        .last()
        .unwrap_or_else(|| panic!("no rate met the class\n{why}"))
        .concurrency;
    let first_missed = levels
        .iter()
        .find(|l| l.share < objective)
        .unwrap_or_else(|| panic!("every rate met the class: the ramp is too light\n{why}"))
        .concurrency;
    (last_met, first_missed)
}

async fn run(setting: Setting) {
    let (upstream, sim) = simulator(setting.model);
    let cases = [
        Traffic::Steady(24),
        Traffic::Poisson(0.6),
        Traffic::Bursts(0.4),
    ];
    let mut reads = Vec::new();
    // TOKENMETER_TRAFFIC_TRUTH_ONLY=1 measures the truth alone (for tuning a setting's rates).
    let truth_only = std::env::var("TOKENMETER_TRAFFIC_TRUTH_ONLY").is_ok_and(|v| v == "1");
    for traffic in cases.into_iter().filter(|_| !truth_only) {
        reads.push((traffic, answer(&upstream, &setting, traffic).await));
    }
    let levels = truth(&upstream, &setting).await;
    drop(sim);
    let prefill_truth = setting.model.prefill_per_token.as_secs_f64();
    let per_seq_truth = setting.model.step_per_seq.as_secs_f64();
    let mut failures = Vec::new();
    let truth_line = levels
        .iter()
        .map(|l| {
            format!(
                "rate {:.2}/s: {:.1} in flight, {:.1}% met\n",
                l.rate,
                l.concurrency,
                100.0 * l.share
            )
        })
        .collect::<String>();
    let (last_met, first_missed) = edge(&levels, setting.objective, &truth_line);
    for (traffic, r) in &reads {
        eprintln!(
            "traffic capacity, {traffic:?}: supported {:?}, max {:?} (truth {last_met:.1}-{first_missed:.1}), utilization {:?}, per_seq {:?} (truth {per_seq_truth}), prefill {:?} (truth {prefill_truth}), arrivals {:?}, trusted {:?}",
            r.supported, r.max_concurrency, r.utilization, r.per_seq, r.prefill, r.shape, r.trusted
        );
        let mut fail = |what: String| failures.push(format!("{traffic:?}: {what}"));
        match (r.supported, r.max_concurrency) {
            (Some(0.0), None) => {
                if !matches!(traffic, Traffic::Steady(_)) {
                    fail("unsupported on traffic that spreads the concurrency".into());
                }
                if r.utilization.is_some() {
                    fail("utilization exported while unsupported".into());
                }
            }
            (Some(1.0), Some(m)) => {
                if m < 0.85 * last_met || m > 1.15 * first_missed {
                    fail(format!(
                        "max_concurrency {m} outside [{last_met:.1}, {first_missed:.1}] +-15%"
                    ));
                }
                match r.per_seq {
                    Some(p) if (p / per_seq_truth - 1.0).abs() <= 0.25 => {}
                    p => fail(format!("per-sequence cost {p:?} vs {per_seq_truth}")),
                }
            }
            other => fail(format!("supported and max_concurrency disagree: {other:?}")),
        }
        match r.prefill {
            Some(p) if (p / prefill_truth - 1.0).abs() <= 0.25 => {}
            p => fail(format!("prefill cost {p:?} vs {prefill_truth}")),
        }
        // Never below the level it was seen meeting: a steady 24 that met the class.
        if let (Traffic::Steady(n), Some(m)) = (traffic, r.max_concurrency) {
            if m < *n as f64 && last_met >= *n as f64 {
                fail(format!(
                    "max_concurrency {m} below the {n} streams seen meeting it"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{failures:#?}\n{truth_line}\n{}",
        reads
            .iter()
            .map(|(t, r)| format!("--- {t:?}\n{}", capacity_lines(&r.text)))
            .collect::<String>()
    );
}

/// The capacity series of an exposition, for a failure's message.
fn capacity_lines(text: &str) -> String {
    text.lines()
        .filter(|l| l.starts_with("tokenmeter_capacity_"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulators_defaults_on_steady_open_and_bursty_traffic() {
    let _turn = serial().await;
    // `tokenmeter sim` as it starts: 16 ms + 0.2 ms per sequence a step, 0.05 ms per prompt
    // token; a class of 40 tokens/s (the line's edge at 45 streams) and 1 s TTFT at 95%.
    run(Setting {
        model: Model {
            step_base: Duration::from_millis(16),
            step_per_seq: Duration::from_micros(200),
            prefill_per_token: Duration::from_micros(50),
            step_per_1k_kv_tokens: Duration::ZERO,
            max_batch: 256,
        },
        class: "chat:ttft=1s,tps=40,objective=0.95",
        ttft: 1.0,
        tps: 40.0,
        objective: 0.95,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "3 minutes of wall time: run on request"]
async fn a_dearer_sequence_on_steady_open_and_bursty_traffic() {
    let _turn = serial().await;
    // 10 ms + 0.5 ms per sequence, 0.1 ms per prompt token: 40 tokens/s at 30 streams.
    run(Setting {
        model: Model {
            step_base: Duration::from_millis(10),
            step_per_seq: Duration::from_micros(500),
            prefill_per_token: Duration::from_micros(100),
            step_per_1k_kv_tokens: Duration::ZERO,
            max_batch: 256,
        },
        class: "chat:ttft=1s,tps=40,objective=0.95",
        ttft: 1.0,
        tps: 40.0,
        objective: 0.95,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "3 minutes of wall time: run on request"]
async fn a_slower_engine_on_steady_open_and_bursty_traffic() {
    let _turn = serial().await;
    // 20 ms + 0.3 ms per sequence, 0.08 ms per prompt token: 25 tokens/s at 66 streams.
    run(Setting {
        model: Model {
            step_base: Duration::from_millis(20),
            step_per_seq: Duration::from_micros(300),
            prefill_per_token: Duration::from_micros(80),
            step_per_1k_kv_tokens: Duration::ZERO,
            max_batch: 256,
        },
        class: "chat:ttft=1s,tps=25,objective=0.95",
        ttft: 1.0,
        tps: 25.0,
        objective: 0.95,
    })
    .await;
}
