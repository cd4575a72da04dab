//! `tokenmeter capacity --trace FILE`: the capacity model's answer for a recorded mix.
//!
//! The live model answers for the window's own traffic. A planner asks about other traffic: a
//! day recorded with `--workload-log`, and what twice as much of it would need. This replays
//! the trace on the engine the model fitted ([`replay::trace`]), open loop, each request at its
//! recorded time divided by a rate multiple `m` (`m` = 2: the same requests, twice as fast),
//! and asks each SLO class for the highest `m` whose replayed requests meet its TTFT target and
//! its tokens/s floor in its objective's share ([`Replayed::share_meeting`]). It is found by
//! bisection to within [`PRECISION`] between [`MIN_MULTIPLE`] and [`MAX_MULTIPLE`]. The bound
//! that binds is read from the replay just above it: memory (the KV cache, the engine's cap on
//! sequences) where that replay shows it full and the class is met there once it is lifted,
//! else whichever of the TTFT target and the tokens/s floor falls further below the objective.
//! Engines for `k` times the traffic are then `ceil(k / m)`.
//!
//! Which requests a class is judged on: where the trace names classes (`class`), each class on
//! its own requests, with every request replayed as load; otherwise every class on the whole
//! trace. The first [`WARM_UP_SHARE`] of the replayed requests fill the engine and are not
//! judged.
//!
//! What it assumes:
//! - **The same engine** as fitted: the step's line, the prefill cost per uncached token, the
//!   KV cache and the engine's cap on sequences where exported, in blocks of 16 tokens (the
//!   block size is not exported), without the context term (not exported either).
//! - **Open loop at the trace's times**: a request arrives when it did (over `m`) whatever the
//!   engine does; a client that waited for one answer before sending the next is replayed as if
//!   it had not waited.
//! - **Prefix reuse by block ids**: a prompt's leading blocks whose `hash_ids` appeared earlier
//!   in the trace are served by the prefix cache ([`cached_tokens`]), which never evicts them
//!   (the most reuse the trace allows); a trace without `hash_ids` has no cached tokens.
//! - The traffic spreads evenly over the engines, as `--replicas` assumes.
//!
//! **Bounded.** At most `--max-requests` requests are read, from the trace's start; block ids
//! are remembered up to [`MAX_SEEN_BLOCKS`]; one replay runs at most [`MAX_WORK`]
//! sequence-steps, so where the requests read need more, the busiest contiguous stretch that
//! fits is replayed ([`stretch`]) and the output says which.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::ops::Range;
use std::path::Path;

use clap::ValueEnum;
use serde_json::{json, Value};
use tokenmeter::capacity::replay::{self, Arrival, Engine, Job, Replayed, MAX_WORK};
use tokenmeter::capacity::{Bound, ClassTargets, Memory};

use crate::trace::{TraceError, TraceReader};

/// `--max-requests` without the flag. A replay runs at most [`MAX_WORK`] (1.5 million)
/// sequence-steps, which 20,000 requests of 75 output tokens fill: more would rarely be
/// replayed, and reading them costs time (each request kept is some 50 bytes).
pub const DEFAULT_MAX_REQUESTS: u64 = 20_000;

/// `--trace-block-tokens` without the flag: `--workload-block-tokens`' default, and the
/// block of the Mooncake traces.
pub const DEFAULT_BLOCK_TOKENS: u32 = 512;

/// Block ids remembered for the prefix cache's estimate: 20,000 prompts of 25,000 tokens in
/// 512-token blocks, some 20 MB. A block first seen after that is not remembered, so its
/// repeats count as uncached: the safe side.
pub const MAX_SEEN_BLOCKS: usize = 1 << 20;

/// The share of the replayed requests that fill the engine before any is judged: an engine
/// replayed from empty is faster than one that has been running, as
/// `replay::run`'s open loop warms up on a tenth too.
pub const WARM_UP_SHARE: f64 = 0.1;

/// The smallest multiple tried: below it, a class is not met even at 1/64 of the traffic,
/// which says the engine misses it alone (a prompt too long for the TTFT target, a floor above
/// one stream's speed), not that more engines would help.
pub const MIN_MULTIPLE: f64 = 1.0 / 64.0;

/// The largest multiple tried: a class met at 64 times the traffic needs one engine for any
/// growth a plan considers.
pub const MAX_MULTIPLE: f64 = 64.0;

/// The bisection stops when the highest multiple met and the lowest missed are this close (2%):
/// finer than the replay's own agreement with an engine.
pub const PRECISION: f64 = 1.02;

/// The multiples of the traffic whose engines the answer prices: as it is, and twice.
pub const PRICED: [u32; 2] = [1, 2];

/// How the answer is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A table to read.
    Table,
    /// One JSON document to load.
    Json,
}

/// What the answer says of the engine beside it, from the scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    pub engine: Engine,
    /// Where the prefill cost was read (`stated`, `wire`, `none`).
    pub prefill_source: Option<String>,
    /// GPUs behind one engine, where the scrape says.
    pub gpus_per_engine: Option<f64>,
    /// Warnings to print before the answer.
    pub notes: Vec<String>,
}

/// One request of the trace as the replay takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// Seconds from the trace's first request.
    pub at: f64,
    pub prompt: u32,
    /// The prompt's tokens in blocks seen earlier in the trace: the prefix cache's.
    pub cached: u32,
    pub output: u32,
    pub class: Option<String>,
    /// The trace's line, 1-based.
    pub line: u64,
}

impl Recorded {
    fn job(&self) -> Job {
        Job {
            uncached: self.prompt - self.cached,
            output: self.output,
        }
    }
}

/// A trace read for the what-if, in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub path: String,
    pub requests: Vec<Recorded>,
    /// Requests out of order beyond the reader's window, replayed at the time of the one before.
    pub late: u64,
    /// Requests that named their prompt's blocks.
    pub with_blocks: usize,
    /// True when [`MAX_SEEN_BLOCKS`] filled: later blocks were not remembered.
    pub blocks_forgotten: bool,
    /// True when any request names its class: each is then judged by its own.
    pub by_class: bool,
}

impl Trace {
    /// Reads at most `max_requests` requests of the trace at `path`; `block_tokens` is the size
    /// of its `hash_ids` blocks.
    pub fn read(path: &Path, max_requests: u64, block_tokens: u32) -> Result<Trace, TraceError> {
        let reader = TraceReader::open(path, Some(max_requests))?;
        Trace::from_reader(path, reader, block_tokens)
    }

    /// The requests `reader` gives, each with the prompt tokens of its blocks seen before.
    pub fn from_reader(
        path: &Path,
        mut reader: TraceReader,
        block_tokens: u32,
    ) -> Result<Trace, TraceError> {
        let mut seen = HashSet::new();
        let (mut requests, mut with_blocks, mut forgotten) = (Vec::new(), 0, false);
        for r in reader.by_ref() {
            let r = r?;
            let cached = cached_tokens(
                &r.hash_ids,
                r.input_length,
                block_tokens,
                &mut seen,
                &mut forgotten,
            );
            with_blocks += usize::from(!r.hash_ids.is_empty());
            requests.push(Recorded {
                at: r.at_ms / 1e3,
                prompt: r.input_length,
                cached,
                output: r.output_length,
                class: r.class,
                line: r.line,
            });
        }
        if requests.is_empty() {
            return Err(TraceError::Empty {
                path: path.to_path_buf(),
            });
        }
        let by_class = requests.iter().any(|r| r.class.is_some());
        Ok(Trace {
            path: path.display().to_string(),
            requests,
            late: reader.late(),
            with_blocks,
            blocks_forgotten: forgotten,
            by_class,
        })
    }

    /// Seconds from the first request to the last.
    pub fn seconds(&self) -> f64 {
        match (self.requests.first(), self.requests.last()) {
            (Some(a), Some(b)) => b.at - a.at,
            _ => 0.0,
        }
    }

    /// Requests per second: the gaps between them over their span; `None` for requests that
    /// all arrived at once.
    pub fn rate(&self) -> Option<f64> {
        let s = self.seconds();
        (s > 0.0).then(|| (self.requests.len() - 1) as f64 / s)
    }

    fn mean(&self, f: impl Fn(&Recorded) -> u32) -> f64 {
        let n = self.requests.len().max(1) as f64;
        self.requests.iter().map(|r| f64::from(f(r))).sum::<f64>() / n
    }

    pub fn mean_input(&self) -> f64 {
        self.mean(|r| r.prompt)
    }

    pub fn mean_output(&self) -> f64 {
        self.mean(|r| r.output)
    }

    /// The share of prompt tokens in blocks seen before: what the prefix cache serves.
    pub fn cached_share(&self) -> f64 {
        let prompt = self.mean_input();
        if prompt > 0.0 {
            self.mean(|r| r.cached) / prompt
        } else {
            0.0
        }
    }
}

/// The prompt tokens of the leading blocks of `ids` seen before (each `block` tokens, the last
/// what is left of `prompt`): a prefix cache serves a prompt's prefix, and a block's id names
/// the whole prefix up to it. At most all but one token: an engine computes at least the last.
/// Then `ids` are remembered, up to [`MAX_SEEN_BLOCKS`] (`full` says when that filled).
pub fn cached_tokens(
    ids: &[u64],
    prompt: u32,
    block: u32,
    seen: &mut HashSet<u64>,
    full: &mut bool,
) -> u32 {
    let (prompt, block) = (u64::from(prompt), u64::from(block.max(1)));
    let cached: u64 = ids
        .iter()
        .enumerate()
        .take_while(|(_, id)| seen.contains(id))
        .map(|(i, _)| block.min(prompt.saturating_sub(i as u64 * block)))
        .sum();
    for id in ids {
        if seen.len() >= MAX_SEEN_BLOCKS && !seen.contains(id) {
            *full = true;
            continue;
        }
        seen.insert(*id);
    }
    cached.min(prompt.saturating_sub(1)) as u32
}

/// The requests one replay runs whole: all of them where their work fits [`MAX_WORK`]
/// sequence-steps (a request's output tokens, at least one), else the busiest contiguous
/// stretch that fits: the most engine time asked per second of arrivals (each request's
/// prefill and decode alone on `engine`), the earliest of equals.
pub fn stretch(requests: &[Recorded], engine: &Engine) -> Range<usize> {
    let work = |r: &Recorded| u64::from(r.output.max(1));
    if requests.iter().map(work).sum::<u64>() <= MAX_WORK {
        return 0..requests.len();
    }
    let step = engine.base + engine.per_seq;
    let asks = |r: &Recorded| {
        engine.prefill_per_token * f64::from(r.job().uncached) + step * work(r) as f64
    };
    let (mut best, mut best_rate) = (0..1, f64::NEG_INFINITY);
    let (mut end, mut sum, mut asked) = (0, 0u64, 0.0f64);
    for start in 0..requests.len() {
        if end <= start {
            (end, sum, asked) = (start, 0, 0.0);
        }
        while end < requests.len() && (end == start || sum + work(&requests[end]) <= MAX_WORK) {
            sum += work(&requests[end]);
            asked += asks(&requests[end]);
            end += 1;
        }
        // At least a millisecond: a burst that arrived at once is the busiest, not a division
        // by zero.
        let span = (requests[end - 1].at - requests[start].at).max(1e-3);
        if asked / span > best_rate {
            (best, best_rate) = (start..end, asked / span);
        }
        if end == requests.len() {
            // Every later stretch is a part of this one.
            break;
        }
        sum -= work(&requests[start]);
        asked -= asks(&requests[start]);
    }
    best
}

/// The highest multiple a class holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Multiple {
    /// Met at this multiple, missed within [`PRECISION`] above it.
    Edge(f64),
    /// Met even at [`MAX_MULTIPLE`].
    AtLeast(f64),
    /// Missed even at [`MIN_MULTIPLE`].
    Below(f64),
}

impl Multiple {
    pub fn value(self) -> f64 {
        match self {
            Multiple::Edge(m) | Multiple::AtLeast(m) | Multiple::Below(m) => m,
        }
    }

    /// Engines for `k` times the traffic, `ceil(k / m)`: `None` below the smallest multiple
    /// tried, where no count of engines is known to be enough.
    pub fn engines(self, k: f64) -> Option<u64> {
        match self {
            Multiple::Below(_) => None,
            // A hair of slack: 2 / 0.5 is 4 engines, not 5 by rounding.
            Multiple::Edge(m) | Multiple::AtLeast(m) => {
                Some(((k / m) * (1.0 - 1e-9)).ceil().max(1.0) as u64)
            }
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Multiple::Edge(_) => "edge",
            Multiple::AtLeast(_) => "at_least",
            Multiple::Below(_) => "below",
        }
    }
}

/// One class's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassAnswer {
    pub targets: ClassTargets,
    /// The requests it was judged on (0: none of its own in the replayed stretch, after the
    /// warm-up; the rest is then absent).
    pub judged: usize,
    /// The share of them meeting its targets at the trace's own rate.
    pub at_one: Option<f64>,
    pub multiple: Option<Multiple>,
    /// What fails first just above the multiple; `None` when met at [`MAX_MULTIPLE`].
    pub binds: Option<Bound>,
}

impl ClassAnswer {
    pub fn met_at_one(&self) -> Option<bool> {
        Some(self.at_one? >= self.targets.objective)
    }
}

/// The answer for every class.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer<'t> {
    pub trace: &'t Trace,
    /// The requests replayed (indices into the trace's), and how many of them warm up.
    pub stretch: Range<usize>,
    pub warm: usize,
    pub classes: Vec<ClassAnswer>,
    /// Replayed requests past the warm-up that no class is judged on: their class has no
    /// targets in the scrape (or they name none while others do).
    pub unjudged: usize,
}

/// Replays the trace on `engine` and searches each class's highest multiple.
pub fn answer<'t>(engine: &Engine, classes: &[ClassTargets], trace: &'t Trace) -> Answer<'t> {
    let range = stretch(&trace.requests, engine);
    let requests = &trace.requests[range.clone()];
    let warm = (requests.len() as f64 * WARM_UP_SHARE) as usize;
    let mut search = Search {
        engine: *engine,
        requests,
        warm,
        memo: HashMap::new(),
    };
    let answers = classes
        .iter()
        .map(|c| {
            let only = trace.by_class.then_some(c.name.as_str());
            let a = search.class(c, only);
            if trace.by_class {
                // No other class is judged on the same requests: its replays go.
                search.memo.clear();
            }
            a
        })
        .collect();
    let unjudged = if trace.by_class {
        requests[warm..]
            .iter()
            .filter(|r| {
                !classes
                    .iter()
                    .any(|c| r.class.as_deref() == Some(c.name.as_str()))
            })
            .count()
    } else {
        0
    };
    Answer {
        trace,
        stretch: range,
        warm,
        classes: answers,
        unjudged,
    }
}

/// The replays of one stretch, memoised by the class judged and the multiple: classes judged on
/// the whole trace share them. Some 16 replays a class are kept, each two numbers per judged
/// request: with 8 classes (`slo::MAX_CLASSES`) on 20,000 requests, 40 MB at the very worst;
/// a class judged on its own requests drops its replays when done.
struct Search<'a> {
    engine: Engine,
    requests: &'a [Recorded],
    warm: usize,
    memo: HashMap<(Option<String>, u64), Option<Replayed>>,
}

impl Search<'_> {
    /// The stretch at `m` times its rate on `engine`, judging `only` that class's requests
    /// (every request with `None`) past the warm-up.
    fn arrivals(&self, m: f64, only: Option<&str>) -> Vec<Arrival> {
        let t0 = self.requests.first().map_or(0.0, |r| r.at);
        self.requests
            .iter()
            .enumerate()
            .map(|(i, r)| Arrival {
                at: (r.at - t0) / m,
                job: r.job(),
                measured: i >= self.warm && only.map_or(true, |c| r.class.as_deref() == Some(c)),
            })
            .collect()
    }

    /// The replay at `m` (memoised); `None` when no request is judged.
    fn at(&mut self, m: f64, only: Option<&str>) -> Option<&Replayed> {
        let key = (only.map(str::to_string), m.to_bits());
        if !self.memo.contains_key(&key) {
            let r = replay::trace(&self.engine, &self.arrivals(m, only));
            self.memo.insert(key.clone(), r);
        }
        self.memo.get(&key)?.as_ref()
    }

    fn meets(&mut self, c: &ClassTargets, m: f64, only: Option<&str>) -> Option<bool> {
        Some(self.at(m, only)?.share_meeting(c.ttft, c.tps_floor) >= c.objective)
    }

    /// The class's answer: its share at 1x, then the multiple, by doubling or halving from 1x
    /// to bracket it and bisecting (geometrically) to [`PRECISION`].
    fn class(&mut self, c: &ClassTargets, only: Option<&str>) -> ClassAnswer {
        let mut answer = ClassAnswer {
            targets: c.clone(),
            judged: 0,
            at_one: None,
            multiple: None,
            binds: None,
        };
        let Some(one) = self.at(1.0, only) else {
            return answer;
        };
        answer.judged = one.ttft.len();
        let share = one.share_meeting(c.ttft, c.tps_floor);
        answer.at_one = Some(share);
        let (mut lo, mut hi);
        if share >= c.objective {
            lo = 1.0;
            loop {
                let m = lo * 2.0;
                if !self.meets(c, m, only).unwrap_or(false) {
                    hi = m;
                    break;
                }
                lo = m;
                if lo >= MAX_MULTIPLE {
                    answer.multiple = Some(Multiple::AtLeast(lo));
                    return answer;
                }
            }
        } else {
            hi = 1.0;
            loop {
                let m = hi / 2.0;
                if self.meets(c, m, only).unwrap_or(false) {
                    lo = m;
                    break;
                }
                hi = m;
                if hi <= MIN_MULTIPLE {
                    answer.multiple = Some(Multiple::Below(hi));
                    answer.binds = self.binding(c, hi, only);
                    return answer;
                }
            }
        }
        while hi / lo > PRECISION {
            let mid = (lo * hi).sqrt();
            if self.meets(c, mid, only).unwrap_or(false) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        answer.multiple = Some(Multiple::Edge(lo));
        answer.binds = self.binding(c, hi, only);
        answer
    }

    /// What fails first at `m`, a multiple the class misses:
    ///
    /// - memory, where the replay shows it full (a request held back by the cache or a
    ///   preemption; by the engine's cap on sequences) and the class is met at `m` once that
    ///   memory is lifted: `kv_cache`, else `max_num_seqs`, else (both lifted) the one that held
    ///   requests back more often;
    /// - else the end further below the objective: the TTFT target's share of requests, or the
    ///   tokens/s floor's (a tie names TTFT, as the model's own answers do).
    fn binding(&mut self, c: &ClassTargets, m: f64, only: Option<&str>) -> Option<Bound> {
        let r = self.at(m, only)?;
        let short = |share: f64| c.objective - share;
        let ttft = c.ttft.map(|t| short(r.share_meeting(Some(t), None)));
        let tps = c.tps_floor.map(|f| short(r.share_meeting(None, Some(f))));
        let (cache, seqs) = (r.cache_full_steps + r.preemptions, r.seqs_full_steps);
        let arrivals = self.arrivals(m, only);
        let memory = self.engine.memory;
        let lifted = |kv: bool, cap: bool| {
            let engine = Engine {
                memory: Memory {
                    kv_cache_tokens: memory.kv_cache_tokens.filter(|_| !kv),
                    max_num_seqs: memory.max_num_seqs.filter(|_| !cap),
                    ..memory
                },
                ..self.engine
            };
            replay::trace(&engine, &arrivals)
                .is_some_and(|r| r.share_meeting(c.ttft, c.tps_floor) >= c.objective)
        };
        if cache > 0 && lifted(true, false) {
            return Some(Bound::KvCache);
        }
        if seqs > 0 && lifted(false, true) {
            return Some(Bound::MaxNumSeqs);
        }
        if cache > 0 && seqs > 0 && lifted(true, true) {
            return Some(if cache >= seqs {
                Bound::KvCache
            } else {
                Bound::MaxNumSeqs
            });
        }
        Some(match (ttft, tps) {
            (Some(a), Some(b)) if b > a => Bound::TokensPerSecond,
            (None, Some(_)) => Bound::TokensPerSecond,
            _ => Bound::Ttft,
        })
    }
}

// === impl Answer: printing ===

impl Answer<'_> {
    fn replayed(&self) -> usize {
        self.stretch.len()
    }

    /// The engines (and GPUs) for `k` times the traffic that every class holds: the most any
    /// class needs; `None` when a class is missed whatever the count.
    fn fleet_for(&self, k: f64) -> Option<Option<u64>> {
        let needs: Vec<Option<u64>> = self
            .classes
            .iter()
            .filter_map(|c| c.multiple)
            .map(|m| m.engines(k))
            .collect();
        if needs.is_empty() {
            return None;
        }
        Some(needs.into_iter().try_fold(1u64, |a, n| Some(a.max(n?))))
    }

    /// The table: the engine, the trace, what was replayed, a row per class, and what 1x and
    /// 2x cost.
    pub fn text(&self, fitted: &Fitted) -> String {
        let mut s = String::new();
        for note in &fitted.notes {
            let _ = writeln!(s, "{note}");
        }
        let _ = writeln!(s, "the engine (fitted): {}", engine_text(fitted));
        let t = self.trace;
        let _ = writeln!(
            s,
            "the trace: {}, {} requests over {:.1} s: {} requests/s; mean input {:.0} tokens ({:.0}% in blocks seen before: {}), output {:.0}",
            t.path,
            t.requests.len(),
            t.seconds(),
            t.rate().map_or_else(|| "all at once, no".into(), |r| format!("{r:.2}")),
            t.mean_input(),
            t.cached_share() * 100.0,
            if t.with_blocks == 0 {
                "no hash_ids, so no prefix cache".to_string()
            } else {
                "served by the prefix cache".to_string()
            },
            t.mean_output(),
        );
        if t.blocks_forgotten {
            let _ = writeln!(
                s,
                "  (more than {MAX_SEEN_BLOCKS} distinct blocks: later ones are taken as uncached)"
            );
        }
        if t.late > 0 {
            let _ = writeln!(
                s,
                "  ({} requests were out of order beyond the reader's window: replayed late)",
                t.late
            );
        }
        let _ = writeln!(
            s,
            "judged: {}",
            if t.by_class {
                "each request by its own class (the trace's \"class\")"
            } else {
                "every class on the whole trace (the trace names no class)"
            }
        );
        if self.replayed() == t.requests.len() {
            let _ = writeln!(
                s,
                "replayed: all {} requests, open loop at the trace's times / m; the first {} warm the engine",
                self.replayed(),
                self.warm
            );
        } else {
            let r = &t.requests[self.stretch.clone()];
            let lines = (
                r.first().map_or(0, |r| r.line),
                r.last().map_or(0, |r| r.line),
            );
            let _ = writeln!(
                s,
                "replayed: requests {}-{} of {} (lines {}-{}, {:.1} s), the busiest stretch whose output fits one replay ({MAX_WORK} sequence-steps); open loop at the trace's times / m; the first {} warm the engine",
                self.stretch.start + 1,
                self.stretch.end,
                t.requests.len(),
                lines.0,
                lines.1,
                r.last().map_or(0.0, |l| l.at) - r.first().map_or(0.0, |f| f.at),
                self.warm
            );
        }
        if self.unjudged > 0 {
            let _ = writeln!(
                s,
                "{} replayed requests are in no class with targets here: load, not judged",
                self.unjudged
            );
        }
        let _ = writeln!(
            s,
            "\n{:<16} {:>9} {:>11} {:>11} {:>7} {:>14} {:>13} {:>18} {:>14} {:>14}",
            "class",
            "objective",
            "TTFT target",
            "tok/s floor",
            "judged",
            "at 1x",
            "max multiple",
            "binds",
            "engines 1x",
            "engines 2x"
        );
        let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or_else(|| "-".into(), f);
        for c in &self.classes {
            let t = &c.targets;
            let at_one = match (c.at_one, c.met_at_one()) {
                (Some(share), Some(met)) => {
                    format!(
                        "{} {:.1}%",
                        if met { "met" } else { "missed" },
                        share * 100.0
                    )
                }
                _ => "-".into(),
            };
            let multiple = match c.multiple {
                Some(Multiple::Edge(m)) => format!("{m:.2}x"),
                Some(Multiple::AtLeast(m)) => format!(">= {m:.0}x"),
                Some(Multiple::Below(m)) => format!("< 1/{:.0}x", 1.0 / m),
                None => "no requests".into(),
            };
            let binds = match (c.multiple, c.binds) {
                (Some(Multiple::AtLeast(_)), _) => "none within 64x",
                (_, Some(b)) => b.as_str(),
                _ => "-",
            };
            let cost = |k: u32| match c.multiple {
                None => "-".to_string(),
                Some(m) => engines_text(m, f64::from(k), fitted.gpus_per_engine),
            };
            let _ = writeln!(
                s,
                "{:<16} {:>9.3} {:>11} {:>11} {:>7} {:>14} {:>13} {:>18} {:>14} {:>14}",
                t.name,
                t.objective,
                opt(t.ttft, &|v| format!("{v:.3} s")),
                opt(t.tps_floor, &|v| format!("{v:.1}")),
                c.judged,
                at_one,
                multiple,
                binds,
                cost(PRICED[0]),
                cost(PRICED[1]),
            );
        }
        for k in PRICED {
            let _ = write!(s, "\n{k}x this traffic: ");
            match self.fleet_for(f64::from(k)) {
                None => {
                    let _ = write!(s, "no class has requests to judge");
                }
                Some(None) => {
                    let _ = write!(
                        s,
                        "a class is missed even at 1/{:.0} of it: no count of engines is enough",
                        1.0 / MIN_MULTIPLE
                    );
                }
                Some(Some(n)) => {
                    let _ = write!(
                        s,
                        "{n} engine{}{}, the most any class needs",
                        if n == 1 { "" } else { "s" },
                        gpus_text(n, fitted.gpus_per_engine)
                    );
                }
            }
        }
        s.push('\n');
        s
    }

    /// The same as one JSON document.
    pub fn json(&self, fitted: &Fitted) -> Value {
        let e = &fitted.engine;
        let t = self.trace;
        let r = &t.requests[self.stretch.clone()];
        let classes: Vec<Value> = self
            .classes
            .iter()
            .map(|c| {
                let priced = |per: &dyn Fn(u64) -> Value| -> Value {
                    PRICED
                        .iter()
                        .map(|&k| {
                            let n = c.multiple.and_then(|m| m.engines(f64::from(k)));
                            (format!("{k}x"), n.map_or(Value::Null, per))
                        })
                        .collect::<serde_json::Map<_, _>>()
                        .into()
                };
                json!({
                    "class": c.targets.name,
                    "objective": c.targets.objective,
                    "ttft_target_seconds": c.targets.ttft,
                    "tps_floor": c.targets.tps_floor,
                    "judged_requests": c.judged,
                    "at_1x": c.at_one.map(|share| json!({
                        "share_meeting": share,
                        "met": share >= c.targets.objective,
                    })),
                    "max_multiple": c.multiple.map(Multiple::value),
                    "max_multiple_is": c.multiple.map(Multiple::kind),
                    "binds": c.binds.map(Bound::as_str),
                    "engines": priced(&|n| json!(n)),
                    "gpus": priced(&|n| fitted.gpus_per_engine.map_or(Value::Null, |g| json!(g * n as f64))),
                })
            })
            .collect();
        json!({
            "engine": {
                "base_seconds": e.base,
                "per_sequence_seconds": e.per_seq,
                "prefill_seconds_per_token": e.prefill_per_token,
                "prefill_source": fitted.prefill_source,
                "kv_cache_tokens": e.memory.kv_cache_tokens,
                "block_size": e.memory.block_size,
                "max_num_seqs": e.memory.max_num_seqs,
                "context_term": false,
                "gpus_per_engine": fitted.gpus_per_engine,
            },
            "notes": fitted.notes,
            "trace": {
                "path": t.path,
                "requests": t.requests.len(),
                "seconds": t.seconds(),
                "requests_per_second": t.rate(),
                "mean_input_tokens": t.mean_input(),
                "mean_output_tokens": t.mean_output(),
                "cached_share": t.cached_share(),
                "with_hash_ids": t.with_blocks,
                "late": t.late,
                "judged_by": if t.by_class { "class" } else { "whole_trace" },
            },
            "replayed": {
                "first": self.stretch.start + 1,
                "last": self.stretch.end,
                "first_line": r.first().map(|r| r.line),
                "last_line": r.last().map(|r| r.line),
                "warm_up": self.warm,
                "unjudged": self.unjudged,
            },
            "classes": classes,
        })
    }
}

/// The engine in a line: the step, prefill, memory, and what the replay leaves out.
fn engine_text(f: &Fitted) -> String {
    let e = &f.engine;
    let mut s = format!(
        "t(b) = {:.3} ms + {:.4} ms x b, prefill {:.4} ms per uncached token{}",
        e.base * 1e3,
        e.per_seq * 1e3,
        e.prefill_per_token * 1e3,
        f.prefill_source
            .as_deref()
            .map_or_else(String::new, |s| format!(" ({s})"))
    );
    match e.memory.kv_cache_tokens {
        Some(kv) => {
            let _ = write!(
                s,
                "; KV cache {kv} tokens in blocks of {} (assumed: the block size is not exported)",
                e.memory.block_size
            );
        }
        None => s.push_str("; KV cache not known (memory never binds)"),
    }
    if let Some(n) = e.memory.max_num_seqs {
        let _ = write!(s, ", at most {n} sequences");
    }
    s.push_str("; no context term (not exported)");
    if let Some(g) = f.gpus_per_engine {
        let _ = write!(s, "; {} per engine", gpus(g));
    }
    s
}

/// "1 (2 GPUs)", or "> 128" below the smallest multiple.
fn engines_text(m: Multiple, k: f64, gpus_per_engine: Option<f64>) -> String {
    match m.engines(k) {
        Some(n) => format!("{n}{}", gpus_text(n, gpus_per_engine)),
        None => format!("> {:.0}", (k / MIN_MULTIPLE).ceil()),
    }
}

fn gpus_text(engines: u64, gpus_per_engine: Option<f64>) -> String {
    gpus_per_engine.map_or_else(String::new, |g| format!(" ({})", gpus(g * engines as f64)))
}

/// "1 GPU", "4 GPUs", "2.50 GPUs": a count without a needless fraction.
fn gpus(v: f64) -> String {
    match v {
        1.0 => "1 GPU".into(),
        v if v.fract() == 0.0 => format!("{v:.0} GPUs"),
        v => format!("{v:.2} GPUs"),
    }
}

#[cfg(test)]
mod tests;
