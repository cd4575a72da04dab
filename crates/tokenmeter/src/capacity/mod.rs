//! The live capacity model: how many streams an engine can carry at each SLO class's speed
//! floor, fitted from production traffic.
//!
//! Decode is memory-bandwidth-bound: a step costs a fixed part (reading the weights) plus a
//! part per running sequence (reading its KV cache), `t(b) = base + per_seq * b`. Every gap
//! between two token-bearing events of a stream is one observation of `t` at the number of
//! streams decoding as it ends (docs/capacity.md says why not a mean over the gap). The pieces:
//!
//! - [`steps`]: the bounded sliding window of (concurrency, time per token), lock-free to push.
//! - [`bins`]: its time-per-token axis and the per-concurrency median.
//! - [`busy`]: the time-weighted mean of a count over the last minute, for utilization.
//! - [`fit`]: Theil-Sen through the per-concurrency medians, and the fit's quality.
//! - [`plan`]: the answers per class, the curve, and the cost.
//! - [`stream`]: one stream's observations, the events of one network read grouped.
//!
//! Prefill, the compute-bound half, is the first token's end of the answer:
//!
//! - [`workload`]: the live mix of prompt, cached and output lengths, bounded.
//! - [`prefill`]: the cost per uncached prompt token, from the engine's stated prefill times
//!   or the proxy's TTFTs.
//! - [`step_ends`]: the ends of the engine's steps as the proxy sees them, where a request's
//!   own step began.
//! - [`replay`]: the engine replayed over the mix with both costs, closed loop or open.
//! - [`limits`]: the concurrency and arrival rate at which a class's TTFT objective breaks,
//!   and the predicted TTFT curve.
//!
//! [`check`] holds the model to the truth where it can be: the last minute's own arrivals
//! replayed, its predicted TTFT and tokens/s beside the measured ones. [`support`] says when the
//! window cannot answer at all (one steady level: no slope), [`arrivals`] how its requests
//! arrived (the limits replay that shape), and [`seen`] the highest level each class was seen
//! met at, below which no answer goes.
//!
//! Memory, the third end: [`memory`] holds the KV cache's size (the flags over what the engine
//! states, [`Capacity::set_engine_memory`]) and the mix's footprint in it; the replay admits by
//! blocks and preempts, and the plan bounds each class by the cache and by the engine's cap on
//! sequences.
//!
//! `tokenmeter capacity`, which reads the answers back from `/metrics`, is a tool
//! (`tokenmeter-tools`' `capacity_command`).
//!
//! [`Capacity`] ties them together: the meter pushes into it on every event, it refits on its own
//! clock ([`refits`]), and whoever renders the metrics reads the last [`Report`] published. In front of
//! several replicas (`--replicas N`, or `auto`: [`crate::replicas`]) the decoding concurrency
//! tokenmeter sees is spread over them, so it is divided by N before it is recorded: the model
//! is per engine. The count can change while the proxy runs ([`Capacity::set_replicas`]); a
//! sample keeps the per-engine concurrency it was recorded at.

pub mod arrivals;
pub mod bins;
pub mod busy;
pub mod check;
pub mod context;
pub mod fit;
pub mod intake;
pub mod limits;
pub mod memory;
pub mod plan;
pub mod prefill;
pub mod refits;
pub mod replay;
pub mod seen;
pub mod step_ends;
pub mod steps;
pub mod stream;
pub mod support;
pub mod wire;
pub mod workload;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::cost::rates::HALF_A_STEP;
use crate::cost::{Ledger, Rates, Step};
use crate::units::HumanDuration;
pub use fit::Fit;
pub use limits::TtftPoint;
pub use memory::Memory;
pub use plan::{Answer, Bound, ClassTargets, Fleet, TradeoffPoint};
pub use prefill::PrefillFit;
pub use stream::StreamGaps;
pub use workload::{Mix, Request};

/// What [`Capacity::costs`] reads of the window, for a refit to go on from.
struct Costs {
    columns: Vec<steps::Column>,
    fit: Option<fit::Fit>,
    recent: Vec<workload::Request>,
    prefill: Option<prefill::PrefillFit>,
}

/// Groups of first tokens the GPU-time split's first prefill reading needs
/// ([`prefill::fit_at_least`]): two, so one odd group does not set it alone.
const FIRST_PREFILL: usize = 2;

/// How often the fit is redone. A refit reads the whole step window (at most 256 x 10 histograms)
/// and sorts at most 32,640 slopes: about a millisecond, so every few seconds costs nothing,
/// and the answers move as fast as a 15-minute window can.
pub const REFIT_INTERVAL: Duration = Duration::from_secs(5);

/// `--capacity-window`'s default: long enough to see many concurrencies, short enough to follow
/// a change of model or traffic within the hour.
pub const DEFAULT_WINDOW: HumanDuration = HumanDuration::mins(15);

/// The capacity model's own flags; the rest of what it needs (the SLO classes, the fleet) is
/// other subsystems' settings, joined in [`Inputs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `--capacity-window`: the sliding window of the fit (at least [`steps::MIN_WINDOW`]).
    pub window: Duration,
    /// `--kv-cache-tokens`, `--block-size`, `--max-num-seqs`: the engine's memory as the flags
    /// state it (each `None` when not given); they win over what the engine states.
    pub memory: memory::Stated,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            window: DEFAULT_WINDOW.get(),
            memory: memory::Stated::default(),
        }
    }
}

/// What the capacity model is built from: its own flags ([`Settings`]) joined with the other
/// subsystems' facts it needs (the SLO classes' targets, the fleet). `Config::capacity_model` joins
/// them.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    /// `--capacity-window`.
    pub window: Duration,
    /// The classes and their floors (from the SLO classes).
    pub classes: Vec<ClassTargets>,
    pub fleet: Fleet,
    /// What the flags say of the engine's memory (`--kv-cache-tokens`, `--block-size`,
    /// `--max-num-seqs`); they win over what the engine states.
    pub memory: memory::Stated,
}

impl Default for Inputs {
    fn default() -> Self {
        Inputs {
            window: DEFAULT_WINDOW.get(),
            classes: Vec::new(),
            fleet: Fleet {
                replicas: 1,
                gpus: 1.0,
                gpu_hour_cost: None,
            },
            memory: memory::Stated::default(),
        }
    }
}

/// The model's state at one refit: what the metrics show.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// `None` until the window has [`fit::MIN_POINTS`] concurrencies with enough samples.
    pub fit: Option<Fit>,
    /// Why the model cannot answer yet, where it cannot ([`support`]): then there are no
    /// answers, no curves, and every class with a target is unsupported.
    pub unsupported: Option<support::Unsupported>,
    /// How the window's requests arrived, once there are enough of them ([`arrivals`]).
    pub shape: Option<arrivals::Shape>,
    /// Token samples at the concurrencies with enough of them ([`fit::MIN_SAMPLES`]); the
    /// fit's own count once there is a fit.
    pub samples: u64,
    /// The lowest and highest of those concurrencies.
    pub observed: Option<(u32, u32)>,
    /// One per class with a floor, once there is a fit.
    pub answers: Vec<Answer>,
    pub curve: Vec<TradeoffPoint>,
    /// The predicted TTFT at the curve's concurrencies, once the prefill cost is known.
    pub ttft_curve: Vec<TtftPoint>,
    /// The prefill cost, once the window has enough long prompts (or only short ones).
    pub prefill: Option<PrefillFit>,
    /// The workload the predictions assume: the window's mix.
    pub mix: Option<Mix>,
    /// Mean decoding concurrency per engine over the last minute.
    pub decoding: f64,
    /// Mean requests in flight per engine over the last minute (decoding, or waiting for
    /// their first token): what utilization divides.
    pub in_flight: f64,
    /// The replicas the concurrency was divided by at this refit.
    pub replicas: u32,
    /// The engine's memory as the model took it at this refit.
    pub memory: Memory,
    /// The KV blocks one closed-loop client of the mix holds on average
    /// ([`Memory::mean_blocks`]); `None` without a mix.
    pub kv_blocks_per_request: Option<f64>,
    /// The model against the last minute, once there is a replay and enough requests.
    pub check: Option<check::Check>,
    /// What a step's context adds to the line, where the window's contexts differ enough to
    /// say ([`context`]).
    pub context: Option<context::ContextTerm>,
}

/// The live model: pushed into per event, read per scrape.
pub struct Capacity {
    steps: steps::StepWindow,
    step_ends: step_ends::StepEnds,
    busy: busy::Busy,
    /// Time requests spent waiting for their first token, per second: with `busy`, the
    /// time-weighted count of requests in flight.
    waiting: busy::Busy,
    workload: workload::Workload,
    config: Inputs,
    /// The replicas now (`--replicas`, or what `auto` last found), at least 1.
    replicas: AtomicU32,
    /// What the engine last stated of its memory (`--engine-metrics`).
    engine_memory: Mutex<memory::Stated>,
    /// The last report the background refit published ([`refits`]), from construction on;
    /// readers borrow it, waiters subscribe.
    published: tokio::sync::watch::Sender<Option<(Instant, Arc<Report>)>>,
    /// Someone waits for a refit now ([`Capacity::next_report`]).
    asked: tokio::sync::Notify,
    /// Output tokens the requests in flight have streamed: the wire's view of the KV cache
    /// they hold ([`wire`]).
    wire_streamed: std::sync::atomic::AtomicI64,
    /// The GPU-time books the step and prefill costs are published to at each refit, with the
    /// replicas whenever they change (`crate::cost`).
    books: OnceLock<Arc<Ledger>>,
    /// What was last published: kept for the replicas' changes, and for tests.
    rates: Mutex<Option<Rates>>,
}

impl Capacity {
    pub fn new(config: Inputs, origin: Instant) -> Self {
        let c = Capacity {
            steps: steps::StepWindow::new(config.window, origin),
            step_ends: step_ends::StepEnds::new(origin),
            busy: busy::Busy::new(origin),
            waiting: busy::Busy::new(origin),
            workload: workload::Workload::new(config.window),
            replicas: AtomicU32::new(config.fleet.replicas.max(1)),
            engine_memory: Mutex::new(memory::Stated::default()),
            config,
            published: tokio::sync::watch::Sender::new(None),
            asked: tokio::sync::Notify::new(),
            wire_streamed: std::sync::atomic::AtomicI64::new(0),
            books: OnceLock::new(),
            rates: Mutex::new(None),
        };
        // An empty window's report, so there is always one to read.
        c.publish_report(origin);
        c
    }

    pub fn config(&self) -> &Inputs {
        &self.config
    }

    /// The replicas the traffic is spread over now.
    pub fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed)
    }

    /// Sets the replicas (`--replicas auto` after each lookup); 0 is taken as 1.
    pub fn set_replicas(&self, n: u32) {
        let before = self.replicas.swap(n.max(1), Ordering::Relaxed);
        if before != n.max(1) {
            self.publish();
        }
    }

    /// Publishes the step and prefill costs to `books` at every refit from now on (the first
    /// call wins: one ledger per process).
    pub fn publish_rates(&self, books: Arc<Ledger>) {
        if self.books.set(books).is_ok() {
            self.publish();
        }
    }

    /// Hands the books the rates last fitted and the replicas now.
    fn publish(&self) {
        // Now, not a refit's own instant (tests refit at instants of their choosing): the
        // books run on the wall clock.
        if let Some(books) = self.books.get() {
            books.set_terms(self.rates(), self.replicas(), Instant::now());
        }
    }

    /// Sets what the engine states of its memory (its cache size, block size and sequence
    /// cap, read from its metrics); the flags still win where they are given. Taken at the
    /// next refit.
    pub fn set_engine_memory(&self, stated: memory::Stated) {
        *self.engine_memory.lock().unwrap_or_else(|e| e.into_inner()) = stated;
    }

    /// The engine's memory as the model takes it now: the flags over the engine's word.
    pub fn memory(&self) -> Memory {
        let engine = *self.engine_memory.lock().unwrap_or_else(|e| e.into_inner());
        self.config.memory.over(engine)
    }

    /// `tokens` tokens arrived at `at`, `gap` after the stream's previous ones, while
    /// `decoding` requests (all replicas together) were decoding. Lock-free.
    pub fn push(&self, decoding: f64, gap: Duration, tokens: u32, at: Instant) {
        if tokens == 0 {
            return;
        }
        let per_engine = decoding / f64::from(self.replicas());
        let per_token = gap.as_secs_f64() / f64::from(tokens);
        self.steps.push(per_engine, per_token, tokens, at);
        self.busy.add(gap, at);
    }

    /// A token-bearing event passed at `at`: the end of an engine step was seen. Lock-free.
    pub fn saw_step_end(&self, at: Instant) {
        self.step_ends.sighted(at);
    }

    /// For a request that arrived at `arrived` and whose first token came at `now`: the end of
    /// the step the engine was running when it arrived, as the proxy saw it ([`step_ends`]);
    /// `None` where no step was seen running, and in front of several replicas, whose steps
    /// end apart: another engine's step end says nothing of when this request's began.
    pub fn running_step_end(&self, arrived: Instant, now: Instant) -> Option<Instant> {
        if self.replicas() > 1 {
            return None;
        }
        self.step_ends.running_step_end(arrived, now)
    }

    /// A request waited `wait` for its first token, which came at `at` (or it ended at `at`
    /// without one): load the engine held before it decoded. Lock-free.
    pub fn waited(&self, wait: Duration, at: Instant) {
        self.waiting.add(wait, at);
    }

    /// A request finished: its lengths and first-token wait join the mix. One short lock.
    /// The meter reaches it as a [`crate::record::Sink`] ([`intake`]).
    pub fn join_mix(&self, r: Request) {
        self.workload.push(r);
    }

    /// The step and prefill costs the last refit published (`None` before any level had
    /// enough samples).
    pub fn rates(&self) -> Option<Rates> {
        self.rates.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads the engine's costs for the GPU-time split alone (`crate::cost`), and publishes
    /// them: the step and the prefill, none of the capacity answers' replays. What the refit
    /// clock ([`refits`]) does between refits until both are known, as it costs a sort of the
    /// slopes and nothing more. Returns whether the prefill fit is believed.
    pub fn refresh_rates(&self, now: Instant) -> bool {
        self.costs(now).prefill.is_some()
    }

    /// The window's step and prefill fits, published to the books as they are.
    fn costs(&self, now: Instant) -> Costs {
        let columns = self.steps.columns(now);
        let usable = || columns.iter().filter(|c| c.samples >= fit::MIN_SAMPLES);
        let fit = fit::fit(&columns);
        let recent = self.workload.recent(now);
        // A decode step at `b` sequences: the line's, or without one (traffic at one or two
        // levels), the median of the level seen nearest `b`, which is what such traffic's
        // steps cost: enough to read prefill from steady traffic.
        let step_at = |b: f64| match &fit {
            Some(f) => Some(f.step(b)),
            None => usable()
                .min_by(|x, y| {
                    (f64::from(x.concurrency) - b)
                        .abs()
                        .total_cmp(&(f64::from(y.concurrency) - b).abs())
                })
                .map(|c| c.median),
        };
        let one = step_at(1.0);
        if let Some(one) = one {
            // One step's ends are seen as close together as one step's first tokens are.
            if let Ok(t) = Duration::try_from_secs_f64(prefill::group_tolerance(one)) {
                self.step_ends.set_tolerance(t);
            }
        }
        let prefill = match one {
            Some(_) if recent.len() >= prefill::MIN_SAMPLES => {
                prefill::fit(&recent, |b| step_at(b).unwrap_or(0.0))
            }
            _ => None,
        };
        // The split of GPU time needs the step where the traffic is, not a line through it:
        // the levels' medians do until there is one.
        let step = match &fit {
            Some(f) => Some(Step::Line {
                base: f.base,
                per_seq: f.per_seq,
            }),
            None => {
                let levels: Arc<[(f64, f64)]> = usable()
                    .map(|c| (f64::from(c.concurrency), c.median))
                    .collect();
                (!levels.is_empty()).then_some(Step::Levels(levels))
            }
        };
        // Before the prefill fit is believed, a first reading from fewer groups: every second
        // without one splits long prompts' prefill over the requests beside them. (Only a
        // reading from prompts: that prompts cost nothing takes the full fit's evidence.)
        let first_prefill = || match one {
            Some(_) => prefill::fit_at_least(&recent, |b| step_at(b).unwrap_or(0.0), FIRST_PREFILL)
                .filter(|p| p.samples >= FIRST_PREFILL),
            None => None,
        };
        if let Some(step) = step {
            let reading = prefill.or_else(first_prefill);
            // A closed loop's next request is sent as the step that ended the last one ends,
            // and waits the whole of the next.
            let closed = one
                .and_then(|one| arrivals::shape(&recent, one))
                .is_some_and(|s| s != arrivals::Shape::Open);
            *self.rates.lock().unwrap_or_else(|e| e.into_inner()) = Some(Rates {
                step,
                prefill_per_token: reading.map_or(0.0, |p| p.per_token),
                // The first seconds are settled by the believed fit, not the first reading.
                prefill_known: prefill.is_some(),
                admission_wait: if closed { 1.0 } else { HALF_A_STEP },
            });
            self.publish();
        }
        Costs {
            columns,
            fit,
            recent,
            prefill,
        }
    }

    /// Fits the window that ends at `now`, whatever the last refit's age.
    pub fn refit(&self, now: Instant) -> Report {
        let Costs {
            columns,
            fit,
            recent,
            prefill,
        } = self.costs(now);
        let usable = || columns.iter().filter(|c| c.samples >= fit::MIN_SAMPLES);
        let observed = usable()
            .map(|c| c.concurrency)
            .min()
            .zip(usable().map(|c| c.concurrency).max());
        let samples = usable().map(|c| c.samples).sum();
        let replicas = self.replicas();
        let decoding = self.busy.mean(now) / f64::from(replicas);
        let fleet = Fleet {
            replicas,
            ..self.config.fleet
        };
        let in_flight = (self.busy.mean(now) + self.waiting.mean(now)) / f64::from(replicas);
        let mix = workload::mix(&recent);
        let jobs = workload::jobs(&recent);
        let memory = self.memory();
        let context = fit.as_ref().and_then(|f| context::fit(&recent, f));
        let engine = match (&fit, &prefill) {
            (Some(f), Some(p)) => Some(replay::Engine {
                base: f.base,
                per_seq: f.per_seq,
                prefill_per_token: p.per_token,
                context,
                memory,
            }),
            _ => None,
        };
        let unsupported = support::judge(fit.as_ref(), samples).err();
        let shape = fit
            .as_ref()
            .and_then(|f| arrivals::shape(&recent, f.step(1.0)));
        let mut replays = engine
            .map(|e| limits::Replays::shaped(e, &jobs, shape.unwrap_or(arrivals::Shape::InStep)));
        let held = plan::Held {
            kv_cache: memory.kv_limit(workload::lengths(&jobs)),
            max_num_seqs: memory.max_num_seqs,
        };
        let (answers, curve) = match (&fit, unsupported) {
            (Some(f), None) => (
                plan::answers(
                    f,
                    &self.config.classes,
                    &fleet,
                    in_flight,
                    held,
                    replays.as_mut(),
                    &|c| seen::highest_met(&recent, c),
                ),
                plan::curve(f),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        let ttft_curve = match unsupported {
            None => replays
                .as_mut()
                .map(|r| r.curve(&plan::CURVE))
                .unwrap_or_default(),
            Some(_) => Vec::new(),
        };
        let check = engine.and_then(|e| check::check(&recent, now, in_flight, e));
        Report {
            fit,
            unsupported,
            shape,
            samples,
            observed,
            answers,
            curve,
            ttft_curve,
            prefill,
            mix,
            decoding,
            in_flight,
            replicas,
            kv_blocks_per_request: memory.mean_blocks(workload::lengths(&jobs)),
            check,
            memory,
            context,
        }
    }

    /// The window's samples per concurrency (its medians), for a reader that wants to see what
    /// the fit was drawn through.
    pub fn columns(&self, now: Instant) -> Vec<steps::Column> {
        self.steps.columns(now)
    }

    /// Samples dropped for a concurrency above [`steps::MAX_CONCURRENCY`].
    pub fn dropped(&self) -> u64 {
        self.steps.dropped()
    }
}

impl stream::Gaps for Capacity {
    fn push(&self, decoding: f64, gap: Duration, tokens: u32, at: Instant) {
        Capacity::push(self, decoding, gap, tokens, at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_divide_the_concurrency_and_the_report_waits_for_a_refit() {
        let t0 = Instant::now();
        let cap = Capacity::new(
            Inputs {
                classes: vec![ClassTargets::floor("interactive", 40.0)],
                fleet: Fleet {
                    replicas: 2,
                    gpus: 2.0,
                    gpu_hour_cost: None,
                },
                ..Inputs::default()
            },
            t0,
        );
        assert_eq!(cap.report().fit, None);
        // Seen through a gateway: 2b streams decoding over two engines, each at t(b).
        for b in 1..=40u32 {
            let step = Duration::from_micros(10_000 + 500 * u64::from(b));
            for _ in 0..50 {
                cap.push(f64::from(2 * b), step, 1, t0 + Duration::from_secs(1));
            }
        }
        // Readers see the last report published (empty) until the next refit publishes.
        assert_eq!(cap.report().fit, None);
        let r = cap.publish_report(t0 + Duration::from_secs(1));
        assert_eq!(cap.report(), r);
        let f = r.fit.expect("a fit");
        assert!((f.base / 0.010 - 1.0).abs() < 0.03, "{f:?}");
        assert!((f.per_seq / 0.0005 - 1.0).abs() < 0.03, "{f:?}");
        assert_eq!(r.observed, Some((1, 40)));
        assert_eq!(r.samples, 2000);
        let a = &r.answers[0];
        assert!((29..=31).contains(&a.max_concurrency), "{a:?}");
        assert_eq!(r.curve.len(), plan::CURVE.len());
        assert_eq!(r.replicas, 2);
    }

    #[test]
    fn a_new_replica_count_divides_what_comes_after_it_and_multiplies_the_fleet() {
        let t0 = Instant::now();
        let cap = Capacity::new(
            Inputs {
                classes: vec![ClassTargets::floor("interactive", 40.0)],
                ..Inputs::default()
            },
            t0,
        );
        let at = t0 + Duration::from_secs(1);
        let step = |b: u32| Duration::from_micros(10_000 + 500 * u64::from(b));
        // One engine for concurrencies 1..=20, then four (as `--replicas auto` found them) for
        // 21..=40: the gateway sees four times as many streams for the same per-engine batch.
        for b in 1..=20u32 {
            for _ in 0..30 {
                cap.push(f64::from(b), step(b), 1, at);
            }
        }
        cap.set_replicas(4);
        for b in 21..=40u32 {
            for _ in 0..30 {
                cap.push(f64::from(4 * b), step(b), 1, at);
            }
        }
        let r = cap.refit(t0 + Duration::from_secs(2));
        let f = r.fit.expect("a fit");
        assert!((f.per_seq / 0.0005 - 1.0).abs() < 0.03, "{f:?}");
        assert_eq!((r.observed, r.replicas), (Some((1, 40)), 4));
        let one = plan::answers(
            &f,
            &cap.config().classes,
            &cap.config().fleet,
            r.in_flight * 4.0,
            plan::Held::default(),
            None,
            &|_| None,
        );
        assert!((r.answers[0].output_tps / one[0].output_tps - 4.0).abs() < 1e-9);
        cap.set_replicas(0);
        assert_eq!(cap.replicas(), 1);
    }
}
