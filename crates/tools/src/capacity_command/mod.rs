//! `tokenmeter capacity --metrics URL`: the capacity model for a planner without Grafana.
//!
//! It scrapes a running tokenmeter's `/metrics`, reads the capacity families back
//! ([`CapacityReading::from_samples`]), prints the fitted model, a table per class and the curve, and
//! writes the trade-off chart as SVG with the bench's chart code. Everything it prints is
//! tokenmeter's own figures; the curve in the chart is drawn from the fitted coefficients, so it
//! is exact at every concurrency, not only at the nine the metrics carry.
//!
//! With `--trace FILE` it answers another question instead, for a recorded mix: the highest
//! rate multiple of that traffic each class holds on the engine the model fitted, and which
//! bound binds there ([`whatif`]). The scrape gives the engine ([`CapacityReading::engine`]) and
//! the classes' targets ([`CapacityReading::targets`]); the what-if knows nothing of the scrape.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::bench::chart::{self, Axis, Chart, Marker, Series};
use crate::scrape::{is_prometheus, metrics_url, scrape, ScrapeError};
use crate::trace::TraceError;
use tokenmeter::capacity::memory::DEFAULT_BLOCK_SIZE;
use tokenmeter::capacity::plan::CURVE;
use tokenmeter::capacity::replay::Engine;
use tokenmeter::capacity::steps::MAX_CONCURRENCY;
use tokenmeter::capacity::{Bound, ClassTargets, Memory};
use tokenmeter::exposition::Sample;
use tokenmeter::metrics::capacity::{
    BOUNDS, CHECK_QUANTITIES, CHECK_SOURCES, KINDS, PERCENTILE_LABELS, TERMS, WORKLOAD_KINDS,
};
use tokenmeter::metrics::names::capacity as names;
use tokenmeter::slo::DEFAULT_OBJECTIVE;

pub mod whatif;

use whatif::{Fitted, Format, Trace};

/// The command's flags.
#[derive(Debug, Clone, Args)]
pub struct CapacityArgs {
    /// A tokenmeter's /metrics URL, e.g. http://127.0.0.1:9090/metrics.
    #[arg(long, env = "TOKENMETER_CAPACITY_METRICS", value_name = "URL")]
    pub metrics: String,

    /// Where the trade-off chart is written.
    #[arg(
        long,
        env = "TOKENMETER_CAPACITY_SVG",
        value_name = "FILE",
        default_value = "capacity.svg"
    )]
    pub svg: PathBuf,

    /// A workload trace (the JSON lines `--workload-log` writes, the Mooncake format): instead
    /// of the model's report, the highest rate multiple of this traffic each SLO class holds on
    /// the engine the model fitted, and which bound binds there. No chart is written.
    #[arg(long, env = "TOKENMETER_CAPACITY_TRACE", value_name = "FILE")]
    pub trace: Option<PathBuf>,

    /// With --trace: the most requests read from it, from its start [default: 20000].
    #[arg(long, env = "TOKENMETER_CAPACITY_MAX_REQUESTS", value_name = "N")]
    pub max_requests: Option<u64>,

    /// With --trace: the tokens of one of its `hash_ids` blocks, as `--workload-block-tokens`
    /// wrote it, to count the prompt tokens a prefix cache serves [default: 512].
    #[arg(long, env = "TOKENMETER_CAPACITY_TRACE_BLOCK_TOKENS", value_name = "B")]
    pub trace_block_tokens: Option<u32>,

    /// With --trace: how the answer is printed, a table to read or json to load [default:
    /// table].
    #[arg(long, env = "TOKENMETER_CAPACITY_FORMAT", value_enum)]
    pub format: Option<Format>,
}

/// What `--trace` asks, from the flags.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceQuestion {
    pub path: PathBuf,
    pub max_requests: u64,
    pub block_tokens: u32,
    pub format: Format,
}

impl CapacityArgs {
    /// The trace question the flags ask, `None` without `--trace`, or which flag to fix.
    pub fn trace_question(&self) -> Result<Option<TraceQuestion>, CommandError> {
        let usage = |s: &str| Err(CommandError::Usage(s.to_string()));
        let Some(path) = &self.trace else {
            if self.max_requests.is_some()
                || self.trace_block_tokens.is_some()
                || self.format.is_some()
            {
                return usage("--max-requests, --trace-block-tokens and --format go with --trace");
            }
            return Ok(None);
        };
        let max_requests = self.max_requests.unwrap_or(whatif::DEFAULT_MAX_REQUESTS);
        if max_requests == 0 {
            return usage("--max-requests must be at least 1");
        }
        let block_tokens = self
            .trace_block_tokens
            .unwrap_or(whatif::DEFAULT_BLOCK_TOKENS);
        if block_tokens == 0 {
            return usage("--trace-block-tokens must be at least 1");
        }
        Ok(Some(TraceQuestion {
            path: path.clone(),
            max_requests,
            block_tokens,
            format: self.format.unwrap_or(Format::Table),
        }))
    }
}

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0}")]
    Usage(String),
    #[error("--metrics {0:?} is not an http:// URL")]
    BadUrl(String),
    /// The trace cannot be read: no file, a line that is not a request (named), no requests.
    #[error(transparent)]
    Trace(TraceError),
    #[error("{metrics} has no fit yet ({samples} token samples at usable concurrencies; a fit needs 3 concurrencies with 20 samples each): there is no engine to replay the trace on")]
    NoFit { metrics: String, samples: u64 },
    #[error("{0} states no prefill cost per token yet (tokenmeter_capacity_prefill_seconds_per_token): the replay cannot time the first tokens")]
    NoPrefill(String),
    #[error("{0} exports no SLO class with a TTFT target or a tokens/s floor: there is nothing to judge the trace by")]
    NoTargets(String),
    #[error(transparent)]
    Fetch(ScrapeError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{0} has no tokenmeter capacity metrics: give a tokenmeter's /metrics, on its --metrics-listen address (e.g. http://127.0.0.1:9090/metrics)")]
    NotCapacity(String),
    #[error("{0} is a Prometheus server's own metrics: capacity reads one tokenmeter's /metrics, on its --metrics-listen address (e.g. http://127.0.0.1:9090/metrics)")]
    Prometheus(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl CommandError {
    /// True for errors the user fixes by changing the flags.
    pub fn is_usage(&self) -> bool {
        matches!(self, CommandError::BadUrl(_) | CommandError::Usage(_))
    }

    /// True when the input, the trace, cannot be read: the command exits 2, not 1, so a
    /// script tells a bad file from a tokenmeter that is not there.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, CommandError::Trace(_))
    }
}

/// One class's row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassRow {
    pub name: String,
    pub floor: Option<f64>,
    pub max_concurrency: Option<f64>,
    pub output_tps: Option<f64>,
    pub output_tps_per_gpu: Option<f64>,
    pub cost_per_million: Option<f64>,
    pub utilization: Option<f64>,
    /// The limits: the TTFT end's, the decode end's, and memory's (the KV cache's and the
    /// engine's cap on sequences).
    pub limit_ttft: Option<f64>,
    pub limit_tps: Option<f64>,
    pub limit_kv: Option<f64>,
    pub limit_seqs: Option<f64>,
    pub max_request_rate: Option<f64>,
    /// `tokenmeter_capacity_supported`: false when the model cannot answer for the class yet
    /// (its max streams and utilization are then absent); `None` from an exporter without it.
    pub supported: Option<bool>,
    /// The class's TTFT target, seconds (`tokenmeter_capacity_ttft_target_seconds`).
    pub ttft_target: Option<f64>,
    /// The share of its requests that must meet its targets (`tokenmeter_slo_objective`).
    pub objective: Option<f64>,
}

impl ClassRow {
    /// The limit `bound` puts on the class's streams, where exported.
    pub fn limit(&self, bound: Bound) -> Option<f64> {
        match bound {
            Bound::Ttft => self.limit_ttft,
            Bound::TokensPerSecond => self.limit_tps,
            Bound::KvCache => self.limit_kv,
            Bound::MaxNumSeqs => self.limit_seqs,
        }
    }

    /// The bound that binds: the smallest limit, on a tie the first of [`Bound::ALL`], as the
    /// model chose it.
    pub fn binds(&self) -> Option<Bound> {
        Bound::ALL
            .iter()
            .filter_map(|&b| Some((self.limit(b)?, b)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, b)| b)
    }

    /// True when the model says it cannot answer for the class yet.
    pub fn cannot_answer(&self) -> bool {
        self.supported == Some(false)
    }

    /// The class's max streams and the bound that sets it: the binding limit (which the model
    /// exports as the max streams too), or the max streams alone from an exporter without
    /// limits. `None` when the model cannot answer for the class.
    pub fn max_streams(&self) -> Option<(f64, Option<Bound>)> {
        if self.cannot_answer() {
            return None;
        }
        match self.binds().and_then(|b| Some((self.limit(b)?, Some(b)))) {
            Some(bound) => Some(bound),
            None => self.max_concurrency.map(|v| (v, None)),
        }
    }

    /// The class's limit as the chart labels it: "interactive: max 30 (ttft binds)", or
    /// "batch: cannot answer yet".
    pub fn limit_label(&self) -> Option<String> {
        if self.cannot_answer() {
            return Some(format!("{}: {CANNOT_ANSWER}", self.name));
        }
        let (v, bound) = self.max_streams()?;
        Some(match bound {
            Some(b) => format!("{}: max {v:.0} ({} binds)", self.name, b.as_str()),
            None => format!("{}: max {v:.0}", self.name),
        })
    }
}

/// What the report says in place of an answer the model cannot give yet.
const CANNOT_ANSWER: &str = "cannot answer yet";

/// A `reason` of `tokenmeter_capacity_unsupported` in words: the model's own.
fn reason_in_words(reason: &str) -> String {
    tokenmeter::metrics::capacity::unsupported_in_words(reason)
}

/// The self-check's families.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckReading {
    pub concurrency: Option<f64>,
    pub ttft: [Option<f64>; 2],
    pub tps: [Option<f64>; 2],
    pub trusted: Option<f64>,
    /// Predicted ÷ observed − 1 for TTFT and tokens/s, in the order of [`CHECK_QUANTITIES`].
    pub error: [Option<f64>; 2],
}

impl CheckReading {
    /// False only when the model says not to trust it.
    pub fn trusted(&self) -> bool {
        self.trusted != Some(0.0)
    }

    /// How far off the model is, e.g. "TTFT p90 +120%, tokens/s per request -20%": the
    /// exported errors, else the same from the predicted and observed pairs.
    pub fn errors(&self) -> Option<String> {
        let of_pair = |p: [Option<f64>; 2]| match p {
            [Some(a), Some(b)] if b > 0.0 => Some(a / b - 1.0),
            _ => None,
        };
        let ttft = self.error[0].or_else(|| of_pair(self.ttft));
        let tps = self.error[1].or_else(|| of_pair(self.tps));
        let parts: Vec<String> = [("TTFT p90", ttft), ("tokens/s per request", tps)]
            .into_iter()
            .filter_map(|(q, e)| Some(format!("{q} {:+.0}%", e? * 100.0)))
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// The mix the first-token predictions assume.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    pub requests: Option<f64>,
    pub prompt: Option<f64>,
    pub cached: Option<f64>,
    pub output: Option<f64>,
    /// The prefill cost per uncached token and where it was read from.
    pub prefill: Option<(f64, String)>,
}

/// The capacity families of one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapacityReading {
    pub base: Option<f64>,
    pub per_seq: Option<f64>,
    pub r2: Option<f64>,
    pub samples: f64,
    pub observed: (Option<f64>, Option<f64>),
    /// The model's self-check: the concurrency, TTFT p90 and median tokens/s (predicted,
    /// observed), and whether it is trusted.
    pub check: CheckReading,
    /// The KV cache the model takes, and a client's mean footprint in it, where known.
    pub kv_cache_tokens: Option<f64>,
    pub kv_tokens_per_request: Option<f64>,
    /// Sorted by name.
    pub classes: Vec<ClassRow>,
    /// (concurrency, per-request, aggregate) as exported.
    pub curve: Vec<(u32, Option<f64>, Option<f64>)>,
    /// (concurrency, TTFT at 0.5, 0.9, 0.99) as exported.
    pub ttft: Vec<(u32, [Option<f64>; 3])>,
    pub workload: Workload,
    /// Mean requests in flight per engine over the last minute.
    pub in_flight: Option<f64>,
    /// Why the model cannot answer yet (`tokenmeter_capacity_unsupported`'s reasons at 1),
    /// sorted; empty when it can.
    pub unsupported: Vec<String>,
    /// The engines the model is per (`tokenmeter_capacity_replicas`) and the GPUs behind them
    /// all (`tokenmeter_gpus`), where exported.
    pub replicas: Option<f64>,
    pub gpus: Option<f64>,
}

impl CapacityReading {
    /// Reads the capacity families; `None` when the scrape has none (not tokenmeter, or an older
    /// one).
    pub fn from_samples(samples: &[Sample]) -> Option<CapacityReading> {
        let mut r = CapacityReading::default();
        let mut seen = false;
        let mut curve: Vec<(u32, Option<f64>, Option<f64>)> =
            CURVE.iter().map(|&b| (b, None, None)).collect();
        let mut ttft: Vec<(u32, [Option<f64>; 3])> =
            CURVE.iter().map(|&b| (b, [None; 3])).collect();
        // Every class has an objective, also one the model has nothing to say of: taken for
        // the classes the capacity families name, once they are all read.
        let mut objectives: Vec<(String, f64)> = Vec::new();
        for s in samples {
            let v = Some(s.value);
            let class = |r: &mut CapacityReading| -> Option<usize> {
                let name = s.label("class")?;
                Some(match r.classes.iter().position(|c| c.name == name) {
                    Some(i) => i,
                    None => {
                        r.classes.push(ClassRow {
                            name: name.to_string(),
                            ..ClassRow::default()
                        });
                        r.classes.len() - 1
                    }
                })
            };
            match s.name.as_str() {
                names::FIT_SAMPLES => {
                    seen = true;
                    r.samples = s.value;
                }
                names::STEP_SECONDS if s.label("term") == Some(TERMS[0]) => r.base = v,
                names::STEP_SECONDS if s.label("term") == Some(TERMS[1]) => r.per_seq = v,
                names::FIT_R2 => r.r2 = v,
                names::OBSERVED_CONCURRENCY if s.label("bound") == Some(BOUNDS[0]) => {
                    r.observed.0 = v
                }
                names::OBSERVED_CONCURRENCY if s.label("bound") == Some(BOUNDS[1]) => {
                    r.observed.1 = v
                }
                names::CURVE_TPS => {
                    let b = s.label("concurrency").and_then(|c| c.parse::<u32>().ok());
                    if let Some(p) = curve.iter_mut().find(|p| Some(p.0) == b) {
                        match s.label("kind") {
                            Some(k) if k == KINDS[0] => p.1 = v,
                            Some(k) if k == KINDS[1] => p.2 = v,
                            _ => {}
                        }
                    }
                }
                names::TTFT_SECONDS => {
                    let b = s.label("concurrency").and_then(|c| c.parse::<u32>().ok());
                    let q = s
                        .label("percentile")
                        .and_then(|q| PERCENTILE_LABELS.iter().position(|l| *l == q));
                    if let (Some(p), Some(q)) = (ttft.iter_mut().find(|p| Some(p.0) == b), q) {
                        p.1[q] = v;
                    }
                }
                names::WORKLOAD_REQUESTS => r.workload.requests = v,
                names::WORKLOAD_TOKENS => match s.label("kind") {
                    Some(k) if k == WORKLOAD_KINDS[0] => r.workload.prompt = v,
                    Some(k) if k == WORKLOAD_KINDS[1] => r.workload.cached = v,
                    Some(k) if k == WORKLOAD_KINDS[2] => r.workload.output = v,
                    _ => {}
                },
                names::PREFILL_PER_TOKEN => {
                    let source = s.label("source").unwrap_or("-").to_string();
                    r.workload.prefill = Some((s.value, source));
                }
                names::IN_FLIGHT => r.in_flight = v,
                names::KV_CACHE_TOKENS => r.kv_cache_tokens = v,
                names::CHECK_CONCURRENCY => r.check.concurrency = v,
                names::CHECK_TRUSTED => r.check.trusted = v,
                names::CHECK_ERROR => {
                    let q = s
                        .label("quantity")
                        .and_then(|l| CHECK_QUANTITIES.iter().position(|c| *c == l));
                    if let Some(q) = q {
                        r.check.error[q] = v;
                    }
                }
                names::SUPPORTED => {
                    if let Some(i) = class(&mut r) {
                        r.classes[i].supported = Some(s.value != 0.0);
                    }
                }
                names::UNSUPPORTED => {
                    if let Some(reason) = s.label("reason").filter(|_| s.value == 1.0) {
                        r.unsupported.push(reason.to_string());
                    }
                }
                names::CHECK_TTFT | names::CHECK_TPS => {
                    let i = s
                        .label("source")
                        .and_then(|l| CHECK_SOURCES.iter().position(|c| *c == l));
                    if let Some(i) = i {
                        let pair = if s.name == names::CHECK_TTFT {
                            &mut r.check.ttft
                        } else {
                            &mut r.check.tps
                        };
                        pair[i] = v;
                    }
                }
                names::KV_TOKENS_PER_REQUEST => r.kv_tokens_per_request = v,
                names::REPLICAS => r.replicas = v,
                tokenmeter::metrics::names::GPUS => {
                    r.gpus = Some(r.gpus.unwrap_or(0.0) + s.value);
                }
                tokenmeter::metrics::names::SLO_OBJECTIVE => {
                    if let Some(class) = s.label("class") {
                        objectives.push((class.to_string(), s.value));
                    }
                }
                names::LIMIT_CONCURRENCY => {
                    let bound = s.label("bound");
                    if let Some(i) = class(&mut r) {
                        let c = &mut r.classes[i];
                        match bound {
                            Some(b) if b == Bound::Ttft.as_str() => c.limit_ttft = v,
                            Some(b) if b == Bound::TokensPerSecond.as_str() => c.limit_tps = v,
                            Some(b) if b == Bound::KvCache.as_str() => c.limit_kv = v,
                            Some(b) if b == Bound::MaxNumSeqs.as_str() => c.limit_seqs = v,
                            _ => {}
                        }
                    }
                }
                name => {
                    let field: fn(&mut ClassRow) -> &mut Option<f64> = match name {
                        names::MAX_REQUEST_RATE => |c| &mut c.max_request_rate,
                        names::TPS_FLOOR => |c| &mut c.floor,
                        names::TTFT_TARGET => |c| &mut c.ttft_target,
                        names::MAX_CONCURRENCY => |c| &mut c.max_concurrency,
                        names::OUTPUT_TPS => |c| &mut c.output_tps,
                        names::OUTPUT_TPS_PER_GPU => |c| &mut c.output_tps_per_gpu,
                        names::COST_PER_MILLION => |c| &mut c.cost_per_million,
                        names::UTILIZATION => |c| &mut c.utilization,
                        _ => continue,
                    };
                    if let Some(i) = class(&mut r) {
                        *field(&mut r.classes[i]) = v;
                    }
                }
            }
        }
        for (class, objective) in objectives {
            if let Some(c) = r.classes.iter_mut().find(|c| c.name == class) {
                c.objective = Some(objective);
            }
        }
        r.classes.sort_by(|a, b| a.name.cmp(&b.name));
        r.unsupported.sort();
        r.unsupported.dedup();
        r.curve = curve;
        r.ttft = ttft;
        seen.then_some(r)
    }

    /// The engine the model fitted, as its replay runs it: the step's line, the prefill cost
    /// per uncached token, the KV cache and the engine's cap on sequences where exported (in
    /// blocks of [`DEFAULT_BLOCK_SIZE`] tokens: the block size is not exported). The context
    /// term is not exported either: the replay runs the line alone. `source` names the scrape
    /// in the errors: no fit yet, or no prefill cost yet.
    pub fn engine(&self, source: &str) -> Result<Engine, CommandError> {
        let (Some(base), Some(per_seq)) = (self.base, self.per_seq) else {
            return Err(CommandError::NoFit {
                metrics: source.into(),
                samples: self.samples as u64,
            });
        };
        let Some((prefill_per_token, _)) = self.workload.prefill else {
            return Err(CommandError::NoPrefill(source.into()));
        };
        // The cap on sequences is the same for every class that states it.
        let max_num_seqs = self
            .classes
            .iter()
            .find_map(|c| c.limit_seqs)
            .filter(|n| *n >= 1.0)
            .map(|n| n.min(f64::from(u32::MAX)) as u32);
        Ok(Engine {
            base,
            per_seq,
            prefill_per_token: prefill_per_token.max(0.0),
            context: None,
            memory: Memory {
                kv_cache_tokens: self.kv_cache_tokens.filter(|t| *t >= 1.0).map(|t| t as u64),
                block_size: DEFAULT_BLOCK_SIZE,
                max_num_seqs,
            },
        })
    }

    /// Every class with a TTFT target or a tokens/s floor, with its objective
    /// ([`DEFAULT_OBJECTIVE`] where the scrape states none), sorted by name.
    pub fn targets(&self) -> Vec<ClassTargets> {
        self.classes
            .iter()
            .filter(|c| c.floor.is_some() || c.ttft_target.is_some())
            .map(|c| ClassTargets {
                name: c.name.clone(),
                tps_floor: c.floor,
                ttft: c.ttft_target,
                objective: c.objective.unwrap_or(DEFAULT_OBJECTIVE),
            })
            .collect()
    }

    /// The GPUs behind one engine, where both the GPUs and the engines are exported.
    pub fn gpus_per_engine(&self) -> Option<f64> {
        let (gpus, replicas) = (self.gpus?, self.replicas?);
        (gpus > 0.0 && replicas >= 1.0).then(|| gpus / replicas)
    }

    /// What the what-if says of the model beside its answer: how it was fitted, and the
    /// warnings a reader of the answer must see (a model its check does not trust, one that
    /// cannot answer yet, objectives assumed).
    pub fn fitted(&self, engine: Engine) -> Fitted {
        let mut notes = Vec::new();
        if !self.check.trusted() {
            notes.push(self.not_trusted());
        }
        if let Some(why) = self.cannot_answer() {
            notes.push(format!(
                "the model says {why}: the replay runs the fit as it stands"
            ));
        }
        let assumed: Vec<&str> = self
            .classes
            .iter()
            .filter(|c| (c.floor.is_some() || c.ttft_target.is_some()) && c.objective.is_none())
            .map(|c| c.name.as_str())
            .collect();
        if !assumed.is_empty() {
            notes.push(format!(
                "no tokenmeter_slo_objective for {}: {DEFAULT_OBJECTIVE} assumed",
                assumed.join(", ")
            ));
        }
        Fitted {
            engine,
            prefill_source: self.workload.prefill.as_ref().map(|p| p.1.clone()),
            gpus_per_engine: self.gpus_per_engine(),
            notes,
        }
    }

    /// The fitted step in seconds at concurrency `b`.
    fn step(&self, b: f64) -> Option<f64> {
        let t = self.base? + self.per_seq? * b;
        (t > 0.0).then_some(t)
    }

    /// The mean requests in flight per engine now: exported, or from any class's utilization.
    pub fn operating_point(&self) -> Option<f64> {
        self.in_flight.or_else(|| {
            self.classes
                .iter()
                .find_map(|c| Some(c.utilization? * c.max_concurrency?))
        })
    }

    /// True when concurrency `b` is outside the observed range (an extrapolation).
    fn extrapolated(&self, b: f64) -> bool {
        match self.observed {
            (Some(lo), Some(hi)) => b < lo || b > hi,
            _ => true,
        }
    }

    /// `cannot answer yet: <why>` when the model says it cannot answer yet; the reasons in
    /// words.
    pub fn cannot_answer(&self) -> Option<String> {
        if self.unsupported.is_empty() {
            return None;
        }
        let why: Vec<String> = self
            .unsupported
            .iter()
            .map(|r| reason_in_words(r))
            .collect();
        Some(format!("{CANNOT_ANSWER}: {}", why.join("; ")))
    }

    /// The printed report: the model, the classes, the curve.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let opt = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
        };
        match (self.base, self.per_seq) {
            (Some(base), Some(per_seq)) => {
                let _ = writeln!(
                    s,
                    "step cost: t(b) = {:.3} ms + {:.4} ms x b   (r² {}, {} token samples, concurrency {}-{} observed)",
                    base * 1e3,
                    per_seq * 1e3,
                    opt(self.r2, 3),
                    self.samples as u64,
                    opt(self.observed.0, 0),
                    opt(self.observed.1, 0),
                );
            }
            _ => {
                let _ = writeln!(
                    s,
                    "no fit yet: {} token samples at usable concurrencies (a fit needs 3 concurrencies with 20 samples each)",
                    self.samples as u64
                );
            }
        }
        if let Some(why) = self.cannot_answer() {
            let _ = writeln!(s, "{why}");
        }
        if let Some(now) = self.operating_point() {
            let _ = writeln!(
                s,
                "in flight now: {now:.1} requests per engine (mean of the last minute)"
            );
        }
        let _ = writeln!(
            s,
            "\n{:<16} {:>12} {:>12} {:>14} {:>12} {:>12} {:>12}",
            "class",
            "floor tok/s",
            "max streams",
            "fleet tok/s",
            "tok/s/GPU",
            "cost/M tok",
            "utilization"
        );
        for c in &self.classes {
            if c.cannot_answer() {
                // Its answer is absent: say so rather than a row of dashes.
                let _ = writeln!(s, "{:<16} {:>12}  {CANNOT_ANSWER}", c.name, opt(c.floor, 1));
                continue;
            }
            let _ = writeln!(
                s,
                "{:<16} {:>12} {:>12} {:>14} {:>12} {:>12} {:>12}",
                c.name,
                opt(c.floor, 1),
                opt(c.max_concurrency, 0),
                opt(c.output_tps, 1),
                opt(c.output_tps_per_gpu, 1),
                opt(c.cost_per_million, 4),
                opt(c.utilization, 2),
            );
            if c.max_concurrency
                .is_some_and(|b| b >= 1.0 && self.extrapolated(b))
            {
                let _ = writeln!(
                    s,
                    "{:<16} (max streams outside the observed concurrency: an extrapolation)",
                    ""
                );
            }
        }
        let _ = writeln!(
            s,
            "\n{:>11} {:>18} {:>16}",
            "concurrency", "per-request tok/s", "aggregate tok/s"
        );
        for &(b, exported_per_request, exported_aggregate) in &self.curve {
            // The fitted line gives the curve exactly; the exported points are the fallback.
            let x = f64::from(b);
            let per_request = self.step(x).map(|t| 1.0 / t).or(exported_per_request);
            let aggregate = self.step(x).map(|t| x / t).or(exported_aggregate);
            let mark = if per_request.is_some() && self.extrapolated(x) {
                "  (extrapolated)"
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "{b:>11} {:>18} {:>16}{mark}",
                opt(per_request, 1),
                opt(aggregate, 1)
            );
        }
        self.first_token_text(&mut s);
        self.check_text(&mut s);
        s
    }

    /// The self-check: the model against the last minute, and whether to trust the answer.
    fn check_text(&self, s: &mut String) {
        let c = &self.check;
        let Some(n) = c.concurrency else {
            // A check without its concurrency still says not to trust the answer.
            if !c.trusted() {
                let _ = writeln!(s, "\n{}", self.not_trusted());
            }
            return;
        };
        let pair = |p: [Option<f64>; 2], digits: usize| match p {
            [Some(a), Some(b)] if b > 0.0 => {
                format!(
                    "predicted {a:.digits$}, observed {b:.digits$} ({:+.0}%)",
                    (a / b - 1.0) * 100.0
                )
            }
            _ => "-".to_string(),
        };
        let _ = writeln!(
            s,
            "\nself-check at {n:.0} in flight: TTFT p90 s {}; tok/s per request {}",
            pair(c.ttft, 3),
            pair(c.tps, 1),
        );
        if !c.trusted() {
            let _ = writeln!(s, "{}", self.not_trusted());
        }
    }

    /// The warning of a model its self-check does not trust, with how far off it is.
    fn not_trusted(&self) -> String {
        let errors = self
            .check
            .errors()
            .map_or_else(String::new, |e| format!(" ({e})"));
        format!(
            "NOT TO BE TRUSTED: the model is more than 50% off what the engine does now{errors} (docs/capacity.md, \"When the model is off\")"
        )
    }

    /// The first token's and memory's ends: every limit per class and which binds, the arrival
    /// rate, the mix the predictions assume, the KV cache, and the predicted TTFT curve.
    /// Nothing when the scrape has none of it.
    fn first_token_text(&self, s: &mut String) {
        let opt = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
        };
        let w = &self.workload;
        let memory = self.kv_cache_tokens.is_some()
            || self
                .classes
                .iter()
                .any(|c| c.limit_kv.is_some() || c.limit_seqs.is_some());
        if !memory && w.requests.is_none() && self.ttft.iter().all(|p| p.1[1].is_none()) {
            return;
        }
        let _ = writeln!(
            s,
            "\nthe first token: {} requests in the mix, mean prompt {} tokens ({} cached), output {}; prefill {}",
            opt(w.requests, 0),
            opt(w.prompt, 0),
            opt(w.cached, 0),
            opt(w.output, 0),
            w.prefill.as_ref().map_or_else(
                || "not known yet".to_string(),
                |(v, source)| format!("{:.4} ms per uncached token ({source})", v * 1e3)
            ),
        );
        if let Some(kv) = self.kv_cache_tokens {
            let _ = writeln!(
                s,
                "memory: KV cache {kv:.0} tokens; a client of this mix holds {} tokens on average",
                opt(self.kv_tokens_per_request, 0),
            );
        }
        let _ = writeln!(
            s,
            "{:<16} {:>12} {:>13} {:>10} {:>10} {:>18} {:>10}",
            "class", "ttft limit", "tok/s limit", "kv limit", "seqs limit", "binds", "max req/s"
        );
        for c in &self.classes {
            let _ = writeln!(
                s,
                "{:<16} {:>12} {:>13} {:>10} {:>10} {:>18} {:>10}",
                c.name,
                opt(c.limit_ttft, 0),
                opt(c.limit_tps, 0),
                opt(c.limit_kv, 0),
                opt(c.limit_seqs, 0),
                if c.cannot_answer() {
                    CANNOT_ANSWER
                } else {
                    c.binds().map_or("-", Bound::as_str)
                },
                opt(c.max_request_rate, 2),
            );
        }
        let _ = writeln!(
            s,
            "\n{:>11} {:>14} {:>14} {:>14}",
            "concurrency", "TTFT p50 s", "TTFT p90 s", "TTFT p99 s"
        );
        for (b, q) in &self.ttft {
            let _ = writeln!(
                s,
                "{b:>11} {:>14} {:>14} {:>14}",
                opt(q[0], 3),
                opt(q[1], 3),
                opt(q[2], 3)
            );
        }
    }

    /// The trade-off chart: per-request tokens/s (left) and aggregate (right) against
    /// concurrency, each class's floor, the limit that binds each class (a marker labelled
    /// with its bound), and the operating point. A model its self-check does not trust says so
    /// in the title, with its errors, and its curves are drawn grey and dashed; a class the
    /// model cannot answer for yet has no marker, and a note says so.
    pub fn chart(&self) -> Chart {
        let mut xs: Vec<f64> = CURVE.iter().map(|&b| f64::from(b)).collect();
        let limits: Vec<f64> = self
            .classes
            .iter()
            .filter_map(|c| Some(c.max_streams()?.0))
            .filter(|b| *b >= 1.0)
            .collect();
        let now = self
            .operating_point()
            .map(|n| n.round().clamp(1.0, MAX_CONCURRENCY as f64));
        xs.extend(limits.iter().copied());
        xs.extend(now);
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let faded = !self.check.trusted();
        let per_request = |b: f64| self.step(b).map(|t| 1.0 / t);
        let mut series = vec![
            Series {
                name: "per-request tokens/s".into(),
                class: "request-tps",
                color: "#1f77b4",
                axis: Axis::Left,
                values: xs.iter().map(|&b| per_request(b)).collect(),
                faded,
            },
            Series {
                name: "aggregate tokens/s".into(),
                class: "aggregate-tps",
                color: "#d62728",
                axis: Axis::Right,
                values: xs.iter().map(|&b| self.step(b).map(|t| b / t)).collect(),
                faded,
            },
        ];
        for c in self.classes.iter().filter(|c| c.floor.is_some()) {
            series.push(Series {
                name: format!("{} floor", c.name),
                class: "floor",
                color: "#7f7f7f",
                axis: Axis::Left,
                values: xs.iter().map(|_| c.floor).collect(),
                faded: false,
            });
        }
        if let Some(now) = now {
            series.push(Series {
                name: "now".into(),
                class: "operating-point",
                color: "#2ca02c",
                axis: Axis::Left,
                values: xs
                    .iter()
                    .map(|&b| if b == now { per_request(b) } else { None })
                    .collect(),
                faded: false,
            });
        }
        let mut markers = Vec::new();
        let mut notes = Vec::new();
        for c in &self.classes {
            let Some(label) = c.limit_label() else {
                continue;
            };
            match c.max_streams() {
                // Not one stream meets the class's targets: no place on a log scale from 1.
                Some((x, _)) if x > 0.0 => markers.push(Marker {
                    x,
                    label,
                    class: "limit",
                }),
                _ => notes.push(label),
            }
        }
        let mut title = "Capacity: tokens/s against concurrency per engine (fitted)".to_string();
        if faded {
            title.push_str(": NOT TO BE TRUSTED");
            if let Some(errors) = self.check.errors() {
                let _ = write!(title, ", the self-check is off by {errors}");
            }
            notes.insert(
                0,
                "The model is more than 50% off what the engine does now: its curves are grey and dashed."
                    .into(),
            );
        }
        if let Some(why) = self.cannot_answer() {
            let _ = write!(title, "; {why}");
        }
        Chart {
            title,
            notes,
            x_label: "decoding streams per engine".into(),
            y_left: "per-request tokens/s".into(),
            y_right: Some("aggregate tokens/s per engine".into()),
            xs,
            series,
            markers,
        }
    }
}

/// Reads the capacity families from a scrape's samples, writes the chart to `svg` and returns
/// the text to print.
pub fn report(samples: &[Sample], source: &str, svg: &Path) -> Result<String, CommandError> {
    let reading = CapacityReading::from_samples(samples)
        .ok_or_else(|| CommandError::NotCapacity(source.into()))?;
    std::fs::write(svg, chart::render(&reading.chart())).map_err(|source| CommandError::Write {
        path: svg.to_path_buf(),
        source,
    })?;
    Ok(reading.text())
}

/// The answer to `--trace` from a scrape's samples and a trace read: the engine and the
/// targets the scrape states, the trace replayed on them, printed as `format` says.
pub fn what_if(
    samples: &[Sample],
    source: &str,
    trace: &Trace,
    format: Format,
) -> Result<String, CommandError> {
    let reading = CapacityReading::from_samples(samples)
        .ok_or_else(|| CommandError::NotCapacity(source.into()))?;
    let engine = reading.engine(source)?;
    let targets = reading.targets();
    if targets.is_empty() {
        return Err(CommandError::NoTargets(source.into()));
    }
    let answer = whatif::answer(&engine, &targets, trace);
    let fitted = reading.fitted(engine);
    Ok(match format {
        Format::Table => answer.text(&fitted),
        Format::Json => format!("{:#}\n", answer.json(&fitted)),
    })
}

/// `tokenmeter capacity`: scrape, print, write the chart; with `--trace`, the trace's answer.
pub fn run(args: &CapacityArgs) -> Result<(), CommandError> {
    let question = args.trace_question()?;
    // The trace first: a bad file is said before anything is asked of the network.
    let trace = match &question {
        Some(q) => Some(
            Trace::read(&q.path, q.max_requests, q.block_tokens).map_err(CommandError::Trace)?,
        ),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CommandError::Runtime)?;
    let (url, added) = metrics_url(&args.metrics);
    if added {
        eprintln!("tokenmeter: reading {url}: --metrics had no path, and /metrics is where tokenmeter serves them");
    }
    let scrape = runtime.block_on(scrape(&url)).map_err(|e| match e {
        ScrapeError::BadUrl(_) => CommandError::BadUrl(args.metrics.clone()),
        other => CommandError::Fetch(other),
    })?;
    // Both listen on 9090 by default: a Prometheus server's address is the likeliest wrong one.
    let named = |e: CommandError| match e {
        CommandError::NotCapacity(u) if is_prometheus(&scrape) => CommandError::Prometheus(u),
        e => e,
    };
    if let (Some(q), Some(trace)) = (question, trace) {
        print!(
            "{}",
            what_if(scrape.samples(), &url, &trace, q.format).map_err(named)?
        );
        return Ok(());
    }
    let text = report(scrape.samples(), &url, &args.svg).map_err(named)?;
    print!("{text}");
    println!("\nchart written to {}", args.svg.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenmeter::exposition::Scrape;

    fn sample(name: &str, labels: &[(&str, &str)], value: f64) -> Sample {
        Sample {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    fn scrape() -> Vec<Sample> {
        let mut v = vec![
            sample(names::FIT_SAMPLES, &[], 12345.0),
            sample(names::STEP_SECONDS, &[("term", "base")], 0.010),
            sample(names::STEP_SECONDS, &[("term", "per_sequence")], 0.0005),
            sample(names::FIT_R2, &[], 0.998),
            sample(names::OBSERVED_CONCURRENCY, &[("bound", "min")], 1.0),
            sample(names::OBSERVED_CONCURRENCY, &[("bound", "max")], 64.0),
            sample(names::TPS_FLOOR, &[("class", "interactive")], 40.0),
            sample(names::MAX_CONCURRENCY, &[("class", "interactive")], 30.0),
            sample(names::OUTPUT_TPS, &[("class", "interactive")], 1200.0),
            sample(
                names::OUTPUT_TPS_PER_GPU,
                &[("class", "interactive")],
                1200.0,
            ),
            sample(names::COST_PER_MILLION, &[("class", "interactive")], 0.4630),
            sample(names::UTILIZATION, &[("class", "interactive")], 0.5),
            sample("tokenmeter_build_info", &[("version", "0.1.0")], 1.0),
        ];
        for b in CURVE {
            let t = 0.010 + 0.0005 * f64::from(b);
            let c = b.to_string();
            v.push(sample(
                names::CURVE_TPS,
                &[("concurrency", &c), ("kind", "per_request")],
                1.0 / t,
            ));
            v.push(sample(
                names::CURVE_TPS,
                &[("concurrency", &c), ("kind", "aggregate")],
                f64::from(b) / t,
            ));
        }
        v
    }

    #[test]
    fn the_first_tokens_end_is_read_back_and_printed() {
        let mut v = scrape();
        let chat = ("class", "chat");
        v.extend([
            sample(names::LIMIT_CONCURRENCY, &[chat, ("bound", "ttft")], 4.0),
            sample(
                names::LIMIT_CONCURRENCY,
                &[chat, ("bound", "tokens_per_second")],
                256.0,
            ),
            sample(names::MAX_CONCURRENCY, &[chat], 4.0),
            sample(names::MAX_REQUEST_RATE, &[chat], 1.25),
            sample(names::WORKLOAD_REQUESTS, &[], 300.0),
            sample(names::WORKLOAD_TOKENS, &[("kind", "prompt")], 2225.0),
            sample(names::WORKLOAD_TOKENS, &[("kind", "cached")], 0.0),
            sample(names::WORKLOAD_TOKENS, &[("kind", "output")], 100.0),
            sample(names::PREFILL_PER_TOKEN, &[("source", "wire")], 0.0002),
            sample(names::IN_FLIGHT, &[], 6.5),
        ]);
        for (q, t) in [("50", 0.41), ("90", 0.42), ("99", 0.43)] {
            v.push(sample(
                names::TTFT_SECONDS,
                &[("concurrency", "1"), ("percentile", q)],
                t,
            ));
        }
        let r = CapacityReading::from_samples(&v).expect("capacity families");
        let c = r.classes.iter().find(|c| c.name == "chat").expect("chat");
        assert_eq!(
            (c.limit_ttft, c.limit_tps, c.max_request_rate),
            (Some(4.0), Some(256.0), Some(1.25))
        );
        assert_eq!(r.ttft[0], (1, [Some(0.41), Some(0.42), Some(0.43)]));
        assert_eq!(r.operating_point(), Some(6.5));
        let text = r.text();
        assert!(
            text.contains("300 requests in the mix, mean prompt 2225 tokens (0 cached), output 100; prefill 0.2000 ms per uncached token (wire)"),
            "{text}"
        );
        let row = text
            .lines()
            .rev()
            .find(|l| l.starts_with("chat "))
            .expect("chat's limits row");
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["chat", "4", "256", "-", "-", "ttft", "1.25"]
        );
        assert!(
            text.contains("          1          0.410          0.420          0.430"),
            "{text}"
        );
    }

    #[test]
    fn the_self_check_is_printed_and_says_when_not_to_trust_the_answer() {
        let mut v = scrape();
        v.extend([
            sample(names::CHECK_CONCURRENCY, &[], 6.0),
            sample(names::CHECK_TTFT, &[("source", "predicted")], 0.9),
            sample(names::CHECK_TTFT, &[("source", "observed")], 2.0),
            sample(names::CHECK_TPS, &[("source", "predicted")], 40.0),
            sample(names::CHECK_TPS, &[("source", "observed")], 50.0),
            sample(names::CHECK_TRUSTED, &[], 0.0),
        ]);
        let r = CapacityReading::from_samples(&v).expect("capacity families");
        let text = r.text();
        assert!(
            text.contains("self-check at 6 in flight: TTFT p90 s predicted 0.900, observed 2.000 (-55%); tok/s per request predicted 40.0, observed 50.0 (-20%)"),
            "{text}"
        );
        assert!(text.contains("NOT TO BE TRUSTED"), "{text}");
        v.push(sample(names::CHECK_TRUSTED, &[], 1.0));
        let text = CapacityReading::from_samples(&v).expect("families").text();
        assert!(!text.contains("NOT TO BE TRUSTED"), "{text}");
        // No check exported: no line.
        let text = CapacityReading::from_samples(&scrape())
            .expect("families")
            .text();
        assert!(!text.contains("self-check"), "{text}");
    }

    #[test]
    fn the_memory_end_is_read_back_and_named_when_it_binds() {
        let mut v = scrape();
        let chat = ("class", "chat");
        for (bound, limit) in [
            ("ttft", 7.0),
            ("tokens_per_second", 256.0),
            ("kv_cache", 3.0),
            ("max_num_seqs", 8.0),
        ] {
            v.push(sample(
                names::LIMIT_CONCURRENCY,
                &[chat, ("bound", bound)],
                limit,
            ));
        }
        v.push(sample(names::KV_CACHE_TOKENS, &[], 2048.0));
        v.push(sample(names::KV_TOKENS_PER_REQUEST, &[], 563.2));
        let r = CapacityReading::from_samples(&v).expect("capacity families");
        let c = r.classes.iter().find(|c| c.name == "chat").expect("chat");
        assert_eq!((c.limit_kv, c.limit_seqs), (Some(3.0), Some(8.0)));
        assert_eq!(c.binds(), Some(Bound::KvCache));
        let text = r.text();
        assert!(
            text.contains(
                "memory: KV cache 2048 tokens; a client of this mix holds 563 tokens on average"
            ),
            "{text}"
        );
        let row = text
            .lines()
            .rev()
            .find(|l| l.starts_with("chat "))
            .expect("chat's limits row");
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["chat", "7", "256", "3", "8", "kv_cache", "-"]
        );
    }

    #[test]
    fn a_scrape_is_read_back_into_the_model_and_printed() {
        let r = CapacityReading::from_samples(&scrape()).expect("capacity families");
        assert_eq!((r.base, r.per_seq), (Some(0.010), Some(0.0005)));
        assert_eq!(r.classes.len(), 1);
        assert_eq!(r.classes[0].max_concurrency, Some(30.0));
        assert_eq!(r.operating_point(), Some(15.0));
        let text = r.text();
        assert!(text.contains("t(b) = 10.000 ms + 0.5000 ms x b"), "{text}");
        assert!(text.contains("interactive"), "{text}");
        assert!(text.contains("in flight now: 15.0 requests"), "{text}");
        // No first-token families in this scrape: no such section.
        assert!(!text.contains("the first token"), "{text}");
        // 128 and 256 lie beyond the observed 64.
        assert_eq!(text.matches("(extrapolated)").count(), 2, "{text}");
        let svg = chart::render(&r.chart());
        // The curve at the nine edges plus the class's limit (30) and the operating point (15).
        assert_eq!(
            svg.matches("class=\"point request-tps\"").count(),
            11,
            "{svg}"
        );
        assert_eq!(svg.matches("class=\"point operating-point\"").count(), 1);
        assert_eq!(svg.matches("class=\"point floor\"").count(), 11);
    }

    #[test]
    fn an_exposition_of_the_families_reads_back() {
        let text =
            "# TYPE tokenmeter_capacity_fit_samples gauge\ntokenmeter_capacity_fit_samples 99\n\
                    tokenmeter_capacity_step_seconds{term=\"base\"} 0.02\n\
                    tokenmeter_capacity_step_seconds{term=\"per_sequence\"} 0.00025\n\
                    tokenmeter_capacity_max_concurrency{class=\"agent\"} 20\n";
        let r = CapacityReading::from_samples(Scrape::parse(text).samples()).expect("present");
        assert_eq!(
            (r.base, r.per_seq, r.samples),
            (Some(0.02), Some(0.00025), 99.0)
        );
        assert_eq!(r.classes[0].max_concurrency, Some(20.0));
    }

    /// Three classes as an exposition: `interactive` bound by its first token, `agent` by its
    /// decode speed, `batch` not answered yet; the self-check trusted as `trusted` says.
    fn three_classes(trusted: u8) -> String {
        let mut text = String::from(
            "# TYPE tokenmeter_capacity_fit_samples gauge\n\
             tokenmeter_capacity_fit_samples 5000\n\
             tokenmeter_capacity_step_seconds{term=\"base\"} 0.010\n\
             tokenmeter_capacity_step_seconds{term=\"per_sequence\"} 0.0005\n\
             tokenmeter_capacity_observed_concurrency{bound=\"min\"} 1\n\
             tokenmeter_capacity_observed_concurrency{bound=\"max\"} 64\n",
        );
        for (class, floor, limits, supported) in [
            (
                "interactive",
                40,
                &[("ttft", 30), ("tokens_per_second", 80)][..],
                1,
            ),
            (
                "agent",
                38,
                &[("ttft", 90), ("tokens_per_second", 28)][..],
                1,
            ),
            ("batch", 10, &[][..], 0),
        ] {
            let _ = writeln!(
                text,
                "tokenmeter_capacity_tps_floor{{class=\"{class}\"}} {floor}"
            );
            let _ = writeln!(
                text,
                "tokenmeter_capacity_supported{{class=\"{class}\"}} {supported}"
            );
            for (bound, v) in limits {
                let _ = writeln!(
                    text,
                    "tokenmeter_capacity_limit_concurrency{{class=\"{class}\",bound=\"{bound}\"}} {v}"
                );
            }
            // The max streams is the binding limit; absent for a class not answered yet.
            if let Some(max) = limits.iter().map(|l| l.1).min() {
                let _ = writeln!(
                    text,
                    "tokenmeter_capacity_max_concurrency{{class=\"{class}\"}} {max}"
                );
                let _ = writeln!(
                    text,
                    "tokenmeter_capacity_utilization{{class=\"{class}\"}} 0.5"
                );
            }
        }
        let _ = write!(
            text,
            "tokenmeter_capacity_check_concurrency 6\n\
             tokenmeter_capacity_check_ttft_seconds{{source=\"predicted\"}} 0.9\n\
             tokenmeter_capacity_check_ttft_seconds{{source=\"observed\"}} 0.4\n\
             tokenmeter_capacity_check_error_ratio{{quantity=\"ttft\"}} 1.25\n\
             tokenmeter_capacity_check_error_ratio{{quantity=\"tokens_per_second\"}} -0.2\n\
             tokenmeter_capacity_check_trusted {trusted}\n"
        );
        text
    }

    /// The chart of an exposition, rendered, with its document's texts read back.
    fn svg_of(exposition: &str) -> (CapacityReading, String) {
        let r = CapacityReading::from_samples(Scrape::parse(exposition).samples())
            .expect("capacity families");
        let svg = chart::render(&r.chart());
        (r, svg)
    }

    /// The texts of the elements whose class is `class` (or starts with it and a space).
    fn texts(doc: &roxmltree::Document, class: &str) -> Vec<String> {
        doc.descendants()
            .filter(|n| {
                n.attribute("class")
                    .is_some_and(|c| c == class || c.starts_with(&format!("{class} ")))
            })
            .flat_map(|n| n.descendants().filter(|t| t.has_tag_name("text")))
            .filter_map(|t| t.text().map(str::to_string))
            .collect()
    }

    #[test]
    fn the_limit_that_binds_each_class_is_drawn_and_named() {
        let (r, svg) = svg_of(&three_classes(1));
        let doc = roxmltree::Document::parse(&svg).expect("the chart is well-formed XML");
        assert_eq!(
            texts(&doc, "marker"),
            [
                "agent: max 28 (tokens_per_second binds)",
                "interactive: max 30 (ttft binds)"
            ],
            "{svg}"
        );
        // Each marker's line stands where the curve has its point at that limit.
        let xs = r.chart().xs;
        let points: Vec<f64> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("point request-tps"))
            .filter_map(|n| n.attribute("cx")?.parse().ok())
            .collect();
        assert_eq!(points.len(), xs.len());
        for (limit, name) in [(28.0, "agent"), (30.0, "interactive")] {
            let g = doc
                .descendants()
                .find(|n| {
                    n.attribute("class") == Some("marker limit")
                        && n.descendants()
                            .any(|t| t.text().is_some_and(|t| t.starts_with(name)))
                })
                .expect("the class's marker");
            let line = g
                .descendants()
                .find(|n| n.has_tag_name("line"))
                .expect("its line");
            let x1: f64 = line
                .attribute("x1")
                .and_then(|v| v.parse().ok())
                .expect("x1");
            let i = xs
                .iter()
                .position(|x| *x == limit)
                .expect("the limit is an x");
            assert!(
                (x1 - points[i]).abs() < 0.11,
                "{name}: {x1} vs {}",
                points[i]
            );
        }
        // Trusted and answerable: the plain title, no notes, the curves in their colours.
        assert_eq!(
            texts(&doc, "title"),
            ["Capacity: tokens/s against concurrency per engine (fitted)"]
        );
        assert!(
            !svg.contains("NOT TO BE TRUSTED") && !svg.contains(FADED),
            "{svg}"
        );
    }

    /// The faded curves' colour (bench::chart's grey).
    const FADED: &str = "#9e9e9e";

    #[test]
    fn an_untrusted_model_says_so_in_the_title_with_its_errors_and_greys_its_curves() {
        let (r, svg) = svg_of(&three_classes(0));
        assert_eq!(r.check.error, [Some(1.25), Some(-0.2)]);
        let doc = roxmltree::Document::parse(&svg).expect("the chart is well-formed XML");
        let title = texts(&doc, "title").join(" ");
        assert!(
            title.contains(
                "NOT TO BE TRUSTED, the self-check is off by TTFT p90 +125%, tokens/s per request -20%"
            ),
            "{title}"
        );
        for class in ["line request-tps", "line aggregate-tps"] {
            let line = doc
                .descendants()
                .find(|n| n.attribute("class") == Some(class))
                .expect("the curve");
            assert_eq!(line.attribute("stroke"), Some(FADED), "{class}");
            assert!(line.attribute("stroke-dasharray").is_some(), "{class}");
        }
        // The floors are targets, not the model's: drawn as they were.
        let floor = doc
            .descendants()
            .find(|n| n.attribute("class") == Some("line floor"))
            .expect("a floor");
        assert_ne!(floor.attribute("stroke"), Some(FADED));
        let text = r.text();
        assert!(
            text.contains("NOT TO BE TRUSTED: the model is more than 50% off what the engine does now (TTFT p90 +125%, tokens/s per request -20%)"),
            "{text}"
        );
    }

    #[test]
    fn a_class_the_model_cannot_answer_yet_has_no_marker_and_says_so() {
        let mut exposition = three_classes(1);
        exposition.push_str("tokenmeter_capacity_unsupported{reason=\"warming_up\"} 1\n");
        exposition.push_str("tokenmeter_capacity_unsupported{reason=\"no_slowdown\"} 0\n");
        // A mix, so that the limits' table is printed too.
        exposition.push_str("tokenmeter_capacity_workload_requests 300\n");
        let (r, svg) = svg_of(&exposition);
        let batch = r.classes.iter().find(|c| c.name == "batch").expect("batch");
        assert!(batch.cannot_answer());
        assert_eq!((batch.max_streams(), batch.max_concurrency), (None, None));
        assert_eq!(r.unsupported, ["warming_up"]);
        let doc = roxmltree::Document::parse(&svg).expect("the chart is well-formed XML");
        assert!(
            texts(&doc, "marker")
                .iter()
                .all(|l| !l.starts_with("batch")),
            "{svg}"
        );
        assert_eq!(texts(&doc, "note"), ["batch: cannot answer yet"]);
        let title = texts(&doc, "title").join(" ");
        let words = tokenmeter::capacity::support::Unsupported::WarmingUp.explain();
        assert!(
            title.ends_with(&format!("; cannot answer yet: {words}")),
            "{title}"
        );
        let text = r.text();
        assert!(
            text.contains(&format!("\ncannot answer yet: {words}\n")),
            "{text}"
        );
        // Both of the class's rows say so instead of blanks.
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("batch ")).collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert_eq!(
            rows[0].split_whitespace().collect::<Vec<_>>(),
            ["batch", "10.0", "cannot", "answer", "yet"]
        );
        assert!(rows[1].ends_with("cannot answer yet          -"), "{text}");
        // An unknown reason (a newer tokenmeter's) is shown as it is.
        assert_eq!(reason_in_words("kv_cache_unknown"), "kv cache unknown");
    }

    #[test]
    fn labels_from_the_scrape_are_escaped_in_the_chart() {
        let exposition = "tokenmeter_capacity_fit_samples 1\n\
            tokenmeter_capacity_max_concurrency{class=\"a<b&\\\"c\\\"\"} 4\n\
            tokenmeter_capacity_supported{class=\"x&y\"} 0\n\
            tokenmeter_capacity_unsupported{reason=\"<odd>\"} 1\n";
        let (_, svg) = svg_of(exposition);
        let doc = roxmltree::Document::parse(&svg).expect("the chart is well-formed XML");
        assert_eq!(texts(&doc, "marker"), ["a<b&\"c\": max 4"]);
        assert_eq!(texts(&doc, "note"), ["x&y: cannot answer yet"]);
        assert!(texts(&doc, "title")
            .join(" ")
            .ends_with("cannot answer yet: <odd>"));
    }

    /// A scrape with what the what-if reads: the fit, the prefill cost, the KV cache, the
    /// classes' targets and objectives, the GPUs and the engines.
    fn what_if_scrape() -> String {
        "tokenmeter_capacity_fit_samples 5000\n\
         tokenmeter_capacity_step_seconds{term=\"base\"} 0.010\n\
         tokenmeter_capacity_step_seconds{term=\"per_sequence\"} 0.0002\n\
         tokenmeter_capacity_prefill_seconds_per_token{source=\"stated\"} 0.0002\n\
         tokenmeter_capacity_kv_cache_tokens 1048576\n\
         tokenmeter_capacity_replicas 2\n\
         tokenmeter_gpus{source=\"flag\"} 8\n\
         tokenmeter_slo_objective{class=\"batch\"} 0.95\n\
         tokenmeter_slo_objective{class=\"chat\"} 0.9\n\
         tokenmeter_slo_objective{class=\"agent\"} 0.99\n\
         tokenmeter_capacity_tps_floor{class=\"chat\"} 20\n\
         tokenmeter_capacity_ttft_target_seconds{class=\"chat\"} 0.5\n\
         tokenmeter_capacity_supported{class=\"chat\"} 1\n\
         tokenmeter_capacity_limit_concurrency{class=\"chat\",bound=\"max_num_seqs\"} 128\n\
         tokenmeter_capacity_tps_floor{class=\"agent\"} 40\n\
         tokenmeter_capacity_supported{class=\"agent\"} 1\n"
            .to_string()
    }

    #[test]
    fn the_engine_and_the_targets_are_read_from_the_scrape() {
        let r = CapacityReading::from_samples(Scrape::parse(&what_if_scrape()).samples())
            .expect("capacity families");
        let e = r.engine("x").expect("an engine");
        assert_eq!(
            (e.base, e.per_seq, e.prefill_per_token, e.context),
            (0.010, 0.0002, 0.0002, None)
        );
        assert_eq!(
            e.memory,
            Memory {
                kv_cache_tokens: Some(1 << 20),
                block_size: DEFAULT_BLOCK_SIZE,
                max_num_seqs: Some(128),
            }
        );
        // `batch` has an objective and no target: nothing to judge it by; the objectives
        // are each class's own.
        assert_eq!(
            r.targets(),
            [
                ClassTargets {
                    name: "agent".into(),
                    tps_floor: Some(40.0),
                    ttft: None,
                    objective: 0.99,
                },
                ClassTargets {
                    name: "chat".into(),
                    tps_floor: Some(20.0),
                    ttft: Some(0.5),
                    objective: 0.9,
                },
            ]
        );
        assert_eq!(r.gpus_per_engine(), Some(4.0));
        assert!(r.fitted(e).notes.is_empty());
        // Reading the objectives adds no row to the report's tables.
        assert!(!r.text().contains("batch"), "{}", r.text());
        // Without an objective the default is assumed, and said.
        let text = what_if_scrape().replace("tokenmeter_slo_objective{class=\"agent\"} 0.99\n", "");
        let r = CapacityReading::from_samples(Scrape::parse(&text).samples()).expect("present");
        assert_eq!(r.targets()[0].objective, DEFAULT_OBJECTIVE);
        assert_eq!(
            r.fitted(e).notes,
            ["no tokenmeter_slo_objective for agent: 0.95 assumed"]
        );
    }

    /// A trace of `n` requests a second apart, 2,000-token prompts and one token each.
    fn what_if_trace(n: usize) -> Trace {
        let text: String = (0..n)
            .map(|i| {
                format!(
                    "{{\"timestamp\": {}, \"input_length\": 2000, \"output_length\": 1}}\n",
                    i * 1000
                )
            })
            .collect();
        let path = Path::new("day.jsonl");
        let reader = crate::trace::TraceReader::new(path, std::io::Cursor::new(text), None);
        Trace::from_reader(path, reader, whatif::DEFAULT_BLOCK_TOKENS).expect("a trace")
    }

    #[test]
    fn a_trace_is_answered_from_the_scrapes_engine_and_targets() {
        let samples = Scrape::parse(&what_if_scrape()).samples().to_vec();
        let trace = what_if_trace(100);
        let text = what_if(&samples, "x", &trace, Format::Table).expect("an answer");
        // chat's 0.5 s TTFT binds at about 2.4x (a 410 ms prefill a request); agent's floor
        // is met at any multiple: 40 tokens/s is far below a step of 10 ms.
        let row = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} row in\n{text}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(row("chat")[9], "ttft", "{text}");
        assert!(row("chat")[8].starts_with("2.4"), "{text}");
        assert_eq!(row("agent")[7..10], [">=", "64x", "none"], "{text}");
        assert!(
            text.contains("2x this traffic: 1 engine (4 GPUs), the most any class needs"),
            "{text}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&what_if(&samples, "x", &trace, Format::Json).expect("json"))
                .expect("valid JSON");
        assert_eq!(json["classes"][1]["class"], "chat");
        assert_eq!(json["classes"][1]["binds"], "ttft");
        assert_eq!(json["engine"]["max_num_seqs"], 128);
    }

    #[test]
    fn without_a_fit_a_prefill_cost_or_a_target_the_trace_is_not_answered() {
        let trace = what_if_trace(10);
        let answer =
            |text: &str| what_if(Scrape::parse(text).samples(), "x", &trace, Format::Table);
        let no_fit = answer("tokenmeter_capacity_fit_samples 7\n").expect_err("no fit");
        assert!(matches!(no_fit, CommandError::NoFit { samples: 7, .. }));
        assert!(
            no_fit
                .to_string()
                .starts_with("x has no fit yet (7 token samples"),
            "{no_fit}"
        );
        assert!(!no_fit.is_bad_input() && !no_fit.is_usage());
        let full = what_if_scrape();
        let no_prefill = full.replace(
            "tokenmeter_capacity_prefill_seconds_per_token{source=\"stated\"} 0.0002\n",
            "",
        );
        assert!(matches!(
            answer(&no_prefill),
            Err(CommandError::NoPrefill(_))
        ));
        let no_targets: String = full
            .lines()
            .filter(|l| !l.contains("tps_floor") && !l.contains("ttft_target"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(matches!(
            answer(&no_targets),
            Err(CommandError::NoTargets(_))
        ));
        assert!(matches!(
            answer("tokenmeter_build_info 1\n"),
            Err(CommandError::NotCapacity(_))
        ));
    }

    #[test]
    fn a_trace_that_cannot_be_read_is_bad_input_naming_the_line() {
        let dir = std::env::temp_dir().join(format!("tokenmeter-whatif-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let bad = dir.join("bad.jsonl");
        std::fs::write(
            &bad,
            "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\nnot json\n",
        )
        .expect("written");
        let empty = dir.join("empty.jsonl");
        std::fs::write(&empty, "\n").expect("written");
        for (path, want) in [
            (&bad, "bad.jsonl: line 2: not a JSON object"),
            (&empty, "empty.jsonl has no requests"),
            (&dir.join("absent.jsonl"), "cannot read"),
        ] {
            let err = Trace::read(path, 10, 512)
                .map_err(CommandError::Trace)
                .expect_err("not a trace");
            assert!(err.is_bad_input() && !err.is_usage(), "{err}");
            assert!(err.to_string().contains(want), "{err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_trace_flags_go_with_trace_and_without_it_nothing_changes() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: CapacityArgs,
        }
        let parse = |extra: &[&str]| {
            let mut argv = vec!["capacity", "--metrics", "http://127.0.0.1:9090/metrics"];
            argv.extend(extra);
            Cli::try_parse_from(argv)
                .expect("parsed")
                .args
                .trace_question()
        };
        assert_eq!(parse(&[]).expect("no question"), None);
        for flags in [
            &["--format", "json"][..],
            &["--max-requests", "5"],
            &["--trace-block-tokens", "16"],
        ] {
            let err = parse(flags).expect_err("needs --trace");
            assert!(err.is_usage(), "{err}");
        }
        assert_eq!(
            parse(&["--trace", "day.jsonl"]).expect("a question"),
            Some(TraceQuestion {
                path: "day.jsonl".into(),
                max_requests: whatif::DEFAULT_MAX_REQUESTS,
                block_tokens: whatif::DEFAULT_BLOCK_TOKENS,
                format: Format::Table,
            })
        );
        let q = parse(&["--trace", "t", "--max-requests", "9", "--format", "json"])
            .expect("a question")
            .expect("asked");
        assert_eq!((q.max_requests, q.format), (9, Format::Json));
        assert!(parse(&["--trace", "t", "--max-requests", "0"])
            .expect_err("zero")
            .is_usage());
    }

    #[test]
    fn before_the_fit_it_says_so_and_without_the_families_it_refuses() {
        let r = CapacityReading::from_samples(&[sample(names::FIT_SAMPLES, &[], 7.0)])
            .expect("present");
        assert!(
            r.text().starts_with("no fit yet: 7 token samples"),
            "{}",
            r.text()
        );
        assert!(r.chart().series[0].values.iter().all(Option::is_none));
        let other = [sample("tokenmeter_build_info", &[], 1.0)];
        assert_eq!(CapacityReading::from_samples(&other), None);
        let dir = std::env::temp_dir().join("tokenmeter-capacity-test.svg");
        assert!(matches!(
            report(&other, "x", &dir),
            Err(CommandError::NotCapacity(_))
        ));
    }
}
