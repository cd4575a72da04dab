//! The engine replayed: how the first token's wait grows with load, from the fitted costs and the
//! live mix of requests.
//!
//! The decode fit says what a step costs and the prefill fit what an uncached prompt token costs.
//! Neither says how long a new request waits for its first token while others arrive too: that
//! depends on how arrivals meet steps and each other's prefills, which a closed formula gets
//! wrong exactly where it matters (near saturation, with a few long prompts). So the model runs
//! the engine as a continuous-batching loop:
//!
//! - a step costs `base + per_seq x batch + prefill_per_token x (uncached prompt tokens it admits)`;
//! - a request that arrived before a step starts joins it (the batch is capped at
//!   [`MAX_CONCURRENCY`]), and its first token comes at the end of that step;
//! - every running sequence gets one token per step, so a joining prompt's prefill delays
//!   everyone's next token (the decode slowdown while prefilling);
//! - where the KV cache's size is known ([`Memory`]), a request joins only when its prompt's
//!   blocks fit beside the running ones; a running sequence that needs a block the cache does
//!   not have preempts the newest one, which goes back to the front of the queue and is
//!   recomputed (its prompt and answer so far prefilled again) when it is admitted again, as
//!   vLLM's scheduler does; no request joins in a step that preempted. The engine's cap on
//!   sequences (`--max-num-seqs`) caps the batch.
//!
//! The load is `n` closed-loop clients, each sending its next request the moment the last one ends
//! (a fixed number of users, `tokenmeter bench --concurrency`), started together ([`Load::Closed`],
//! as a load test's level starts) or joining one after another over a request's time
//! ([`Load::Joining`], as real users do); Poisson arrivals at a rate (a service open to the world,
//! `--request-rate`); or a recorded list of arrivals ([`trace`], the window's own requests, with
//! their gaps and bursts). Jobs are drawn from the live mix with a fixed seed, so a replay is a
//! pure function of its inputs: the same window gives the same answer.
//!
//! **Bounded:** a replay stops after a fixed number of measured requests or a fixed amount of work
//! (sequence-steps), whichever comes first, so its cost does not depend on the traffic.

use std::collections::VecDeque;

use super::context::ContextTerm;
use super::memory::Memory;
use super::steps::MAX_CONCURRENCY;
pub use super::workload::Job;
use crate::quantile::nearest_rank;
use crate::rng::SplitMix64;

/// Requests measured per replay, after the warm-up: enough for a stable 0.99 quantile.
pub const MEASURED: usize = 400;

/// The most sequence-steps (one sequence's share of one step) a replay may run: about 10 ms of
/// one core. A replay that reaches it (a long-output mix at a high concurrency) answers from the
/// requests it measured by then.
pub const MAX_WORK: u64 = 1_500_000;

/// What a step costs, in seconds, and the memory it runs in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Engine {
    pub base: f64,
    pub per_seq: f64,
    pub prefill_per_token: f64,
    /// What a step's context adds beyond the line, where the window could say
    /// ([`super::context`]); each step then costs more or less by the tokens its sequences hold.
    pub context: Option<ContextTerm>,
    pub memory: Memory,
}

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// This many clients, each sending its next request when the last one ends, all starting
    /// at once: with equal lengths they stay in step, the worst case of `n` users.
    Closed(u32),
    /// The same clients joining one after another, evenly over the time one request takes
    /// alone: the steady state of users who did not all arrive in the same millisecond.
    Joining(u32),
    /// Poisson arrivals at this many requests per second.
    Open(f64),
}

/// One recorded arrival of a [`trace`]: when (seconds from the trace's start), what, and
/// whether it is measured (the ones before are the warm-up that fills the engine).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    pub at: f64,
    pub job: Job,
    pub measured: bool,
}

/// What one replay measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    /// Every measured request's TTFT, ascending. A request still waiting when the replay
    /// stopped counts with its wait so far (a lower bound), so an overloaded engine shows it.
    pub ttft: Vec<f64>,
    /// Every measured request's decode tokens/s (output after the first token over the time
    /// from the first to the last), for requests of two tokens or more, ascending.
    pub tps: Vec<f64>,
    /// Output tokens per second of replayed time.
    pub output_tps: f64,
    /// Sequences preempted for want of KV blocks (0 without a known cache).
    pub preemptions: u64,
    /// Steps that left a request that had arrived waiting because the KV cache had no room for
    /// its prompt (0 without a known cache): memory, not compute, held it back.
    pub cache_full_steps: u64,
    /// Steps that left a request that had arrived waiting because the batch was at the
    /// engine's cap on sequences (0 where the cap is not known; the replay's own cap of
    /// [`MAX_CONCURRENCY`] is not the engine's and is not counted).
    pub seqs_full_steps: u64,
    /// The mean number of requests in flight (waiting or running) over the replay: the
    /// concurrency its load holds. The clients' count in a closed loop; for arrivals, the
    /// arrival rate times the mean time in the engine of the measured requests (Little's law).
    pub mean_in_flight: f64,
}

impl Replayed {
    /// The `q` quantile of the TTFTs (nearest rank); `None` with no request measured.
    pub fn ttft_quantile(&self, q: f64) -> Option<f64> {
        nearest_rank(&self.ttft, q)
    }

    /// The share of measured requests whose TTFT is at most `ttft` and whose decode speed
    /// is at least `tps`, each where given.
    pub fn share_meeting(&self, ttft: Option<f64>, tps: Option<f64>) -> f64 {
        let n = self.ttft.len().max(1) as f64;
        let ttft_ok = ttft.map_or(1.0, |t| self.ttft.partition_point(|&x| x <= t) as f64 / n);
        let tps_ok = match tps {
            Some(f) if !self.tps.is_empty() => {
                let below = self.tps.partition_point(|&x| x < f);
                1.0 - below as f64 / self.tps.len() as f64
            }
            _ => 1.0,
        };
        // The two are measured on the same requests; the product is exact when they are
        // independent and errs low otherwise, which errs towards a smaller limit.
        ttft_ok * tps_ok
    }
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    arrival: f64,
    /// Tokens to prefill when admitted: the uncached prompt, or for a preempted request its
    /// prompt and its answer so far.
    prefill: u32,
    /// When its first token came, for a preempted request.
    first: Option<f64>,
    left: u32,
    output: u32,
    /// Counted in the results (not warm-up).
    measured: bool,
}

impl Waiting {
    fn new(arrival: f64, job: Job, measured: bool) -> Self {
        Waiting {
            arrival,
            prefill: job.uncached,
            first: None,
            left: job.output,
            output: job.output,
            measured,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Running {
    arrival: f64,
    first: Option<f64>,
    left: u32,
    output: u32,
    measured: bool,
    /// Tokens in its KV blocks, and the blocks.
    held: u64,
    blocks: u64,
}

impl Running {
    /// Back to the queue, to be recomputed: everything it holds is prefilled again.
    fn preempted(self) -> Waiting {
        Waiting {
            arrival: self.arrival,
            prefill: u32::try_from(self.held).unwrap_or(u32::MAX),
            first: self.first,
            left: self.left,
            output: self.output,
            measured: self.measured,
        }
    }
}

/// The most a closed-loop client's turnaround takes, in decode steps of one sequence.
pub const TURNAROUND: f64 = 1.0;

/// The seed every replay of the model uses.
pub const SEED: u64 = 0x746f_6b65_6e6d_6574;

/// Replays `load` over `jobs`; `None` without jobs or with a step that costs nothing.
///
/// With a known cache, a job that could not fit in it alone is cut to what fits (an engine
/// refuses a request longer than its context, so such a job is not in a real mix).
pub fn run(engine: &Engine, jobs: &[Job], load: Load) -> Option<Replayed> {
    simulate(engine, jobs, load, &[])
}

/// Replays recorded `arrivals` (ascending by time) open loop: each request arrives when it
/// did, with its own lengths, whatever the engine does, so the replay meets the bursts and
/// gaps the window had. `None` without a measured arrival.
pub fn trace(engine: &Engine, arrivals: &[Arrival]) -> Option<Replayed> {
    if !arrivals.iter().any(|a| a.measured) {
        return None;
    }
    let jobs: Vec<Job> = arrivals.iter().map(|a| a.job).collect();
    simulate(engine, &jobs, Load::Open(f64::INFINITY), arrivals)
}

/// The loop behind [`run`] and [`trace`]: with `recorded` arrivals, `load` is ignored and they
/// are the load.
fn simulate(engine: &Engine, jobs: &[Job], load: Load, recorded: &[Arrival]) -> Option<Replayed> {
    let step = engine.base + engine.per_seq;
    if jobs.is_empty() || step.is_nan() || step <= 0.0 {
        return None;
    }
    let memory = engine.memory;
    let cache = memory
        .blocks()
        .map(|b| b * u64::from(memory.block_size.max(1)));
    if cache.is_some_and(|c| c < 2) {
        return None;
    }
    let batch_cap = memory
        .max_num_seqs
        .map_or(MAX_CONCURRENCY, |n| (n as usize).clamp(1, MAX_CONCURRENCY));
    // Whether the batch's cap is the engine's own, for the steps it holds a request back.
    let engine_cap = memory
        .max_num_seqs
        .is_some_and(|n| (n as usize) <= MAX_CONCURRENCY);
    let mut free = memory.blocks().unwrap_or(u64::MAX);
    let mut rng = SplitMix64::new(SEED);
    let fit = |j: Job| {
        let (uncached, output) = match cache {
            Some(c) => {
                let c = u32::try_from(c).unwrap_or(u32::MAX);
                let uncached = j.uncached.min(c - 1);
                (uncached, j.output.max(1).min(c - uncached))
            }
            None => (j.uncached, j.output.max(1)),
        };
        Job { uncached, output }
    };
    let draw = |rng: &mut SplitMix64| fit(jobs[rng.below(jobs.len() as u64) as usize]);
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    // How many measured requests end the replay: a fixed number, or every measured one of a
    // recorded trace.
    let target = if recorded.is_empty() {
        MEASURED
    } else {
        recorded.iter().filter(|a| a.measured).count()
    };
    let mut next_recorded = 0usize;
    let (warm, mut next_arrival, rate) = if let Some(first) = recorded.first() {
        (0, first.at.max(0.0), f64::INFINITY)
    } else {
        match load {
            Load::Closed(n) | Load::Joining(n) => {
                // Started together, as a load test's level or a burst after an outage does,
                // the clients stay in step with equal lengths: the worst case of n clients and
                // the one a limit has to hold where the traffic does. Joining, they come one
                // after another over the time a request takes alone, the steady state of
                // users who arrive on their own.
                let n = n.max(1);
                let alone = alone_seconds(engine, jobs);
                for i in 0..n {
                    let at = match load {
                        Load::Joining(_) => alone * f64::from(i) / f64::from(n),
                        _ => 0.0,
                    };
                    let job = draw(&mut rng);
                    waiting.push_back(Waiting::new(at, job, false));
                }
                (2 * n as usize, f64::INFINITY, 0.0)
            }
            Load::Open(rate) => {
                if rate.is_nan() || rate <= 0.0 || rate.is_infinite() {
                    return None;
                }
                (MEASURED / 10, 0.0, rate)
            }
        }
    };
    let open = rate > 0.0;
    let mut arrivals = 0usize;
    let mut finished = 0usize;
    let mut ttft = Vec::with_capacity(MEASURED);
    let mut tps = Vec::with_capacity(MEASURED);
    let mut measured_started = 0usize;
    let mut work = 0u64;
    let mut output_tokens = 0u64;
    let mut preemptions = 0u64;
    let (mut cache_full_steps, mut seqs_full_steps) = (0u64, 0u64);
    let mut t = 0.0f64;
    // Time spent in the engine by the measured requests that finished, for the mean in flight.
    let mut measured_time = 0.0f64;
    let mut measured_done = 0usize;
    let (mut first_measured, mut last_measured) = (f64::INFINITY, 0.0f64);
    loop {
        // Open loop: every arrival up to now joins the queue.
        while open && next_arrival <= t && measured_started < target {
            let (job, measured) = match recorded.get(next_recorded) {
                Some(a) => (fit(a.job), a.measured),
                None if recorded.is_empty() => (draw(&mut rng), arrivals >= warm),
                None => break,
            };
            arrivals += 1;
            measured_started += usize::from(measured);
            if measured {
                first_measured = first_measured.min(next_arrival);
                last_measured = last_measured.max(next_arrival);
            }
            waiting.push_back(Waiting::new(next_arrival, job, measured));
            if recorded.is_empty() {
                next_arrival -= rng.unit_open().ln() / rate;
            } else {
                next_recorded += 1;
                next_arrival = recorded
                    .get(next_recorded)
                    .map_or(f64::INFINITY, |a| a.at.max(next_arrival));
            }
        }
        if running.is_empty() {
            // An idle engine starts a step as soon as a request is there.
            let next = waiting
                .front()
                .map(|w| w.arrival)
                .into_iter()
                .chain((open && measured_started < target).then_some(next_arrival))
                .fold(f64::INFINITY, f64::min);
            if !next.is_finite() {
                break;
            }
            if next > t {
                t = next;
                continue;
            }
        }
        let idle = running.is_empty();
        // Decode first: each running sequence gets the block its next token needs, the newest
        // giving up its blocks when the cache has none.
        let mut preempted = false;
        let mut i = 0;
        while i < running.len() {
            // The step computes the KV of the token it last made: its context so far.
            let need = memory.blocks_for(running[i].held);
            while need > running[i].blocks + free && i + 1 < running.len() {
                if let Some(last) = running.pop() {
                    free += last.blocks;
                    waiting.push_front(last.preempted());
                    preempted = true;
                    preemptions += 1;
                }
            }
            if need > running[i].blocks + free {
                // Nothing newer to take from: it goes back itself.
                let s = running.remove(i);
                free += s.blocks;
                waiting.push_front(s.preempted());
                preempted = true;
                preemptions += 1;
                continue;
            }
            free -= need.saturating_sub(running[i].blocks);
            running[i].blocks = running[i].blocks.max(need);
            i += 1;
        }
        let mut prefill = 0u64;
        // A request that arrives just as a step starts waits for the next one, unless the
        // engine was idle (then the step starts for it).
        let arrived = |w: &Waiting| w.arrival < t || (idle && w.arrival <= t);
        loop {
            let need = match waiting.front() {
                Some(w) if arrived(w) => memory.blocks_for(u64::from(w.prefill)),
                _ => break,
            };
            if preempted || need > free {
                // The cache is full: it preempted this step, or has no room for the prompt.
                cache_full_steps += 1;
                break;
            }
            if running.len() >= batch_cap {
                seqs_full_steps += u64::from(engine_cap);
                break;
            }
            let Some(w) = waiting.pop_front() else { break };
            free -= need;
            prefill += u64::from(w.prefill);
            running.push(Running {
                arrival: w.arrival,
                first: w.first,
                left: w.left,
                output: w.output,
                measured: w.measured,
                held: u64::from(w.prefill),
                blocks: need,
            });
        }
        if running.is_empty() {
            // Everything was preempted back into the queue: the next step takes them again.
            continue;
        }
        let batch = running.len() as f64;
        let line = engine.base + engine.per_seq * batch;
        // The context term moves the decode part by the tokens the batch holds; never below
        // the weights' read (`base`), whatever a short batch's distance from the mean.
        let decode = match &engine.context {
            Some(c) => {
                let held: u64 = running.iter().map(|s| s.held).sum();
                (line + c.extra(batch, held as f64)).max(engine.base)
            }
            None => line,
        };
        let step = decode + engine.prefill_per_token * prefill as f64;
        let end = t + step.max(1e-9);
        work += running.len() as u64;
        let mut i = 0;
        while i < running.len() {
            let s = &mut running[i];
            s.left -= 1;
            s.held += 1;
            output_tokens += 1;
            if s.first.is_none() {
                s.first = Some(end);
                if s.measured {
                    ttft.push(end - s.arrival);
                }
            }
            if s.left > 0 {
                i += 1;
                continue;
            }
            // Removed in place, not swapped: the running order is the admission order, which
            // says who is preempted first.
            let s = running.remove(i);
            free += s.blocks;
            if s.measured {
                measured_time += end - s.arrival;
                measured_done += 1;
            }
            if s.measured && s.output > 1 {
                let first = s.first.unwrap_or(end);
                if end > first {
                    tps.push(f64::from(s.output - 1) / (end - first));
                }
            }
            finished += 1;
            if !open && measured_started < target {
                let measured = finished > warm;
                measured_started += usize::from(measured);
                // The client's turnaround (reading the end, sending the next request) is a
                // moment, but not always the same one: drawn within one decode step, it lets
                // clients that end near each other meet in one admission, as real ones do.
                let turnaround = rng.unit_open() * TURNAROUND * (engine.base + engine.per_seq);
                waiting.push_back(Waiting::new(end + turnaround, draw(&mut rng), measured));
            }
        }
        t = end;
        let done = measured_started >= target
            && waiting.iter().all(|w| !w.measured)
            && running.iter().all(|r| !r.measured || r.first.is_some());
        if done || work >= MAX_WORK {
            break;
        }
    }
    // Requests still waiting for their first token count with their wait so far.
    ttft.extend(
        waiting
            .iter()
            .filter(|w| w.measured && w.first.is_none())
            .map(|w| (t - w.arrival).max(0.0)),
    );
    ttft.extend(
        running
            .iter()
            .filter(|r| r.measured && r.first.is_none())
            .map(|r| (t - r.arrival).max(0.0)),
    );
    ttft.sort_by(f64::total_cmp);
    tps.sort_by(f64::total_cmp);
    Some(Replayed {
        ttft,
        tps,
        output_tps: if t > 0.0 {
            output_tokens as f64 / t
        } else {
            0.0
        },
        preemptions,
        cache_full_steps,
        seqs_full_steps,
        mean_in_flight: match load {
            Load::Closed(n) | Load::Joining(n) if recorded.is_empty() => f64::from(n.max(1)),
            _ if measured_done == 0 => 0.0,
            // Little's law: arrivals per second times the mean time in the engine.
            _ if recorded.is_empty() => rate * measured_time / measured_done as f64,
            _ => {
                let span = last_measured - first_measured;
                let rate = if span > 0.0 {
                    (measured_started.max(1) - 1) as f64 / span
                } else {
                    0.0
                };
                rate * measured_time / measured_done as f64
            }
        },
    })
}

/// Seconds one request of the mix takes on an idle engine: its prefill and its decode steps
/// at one sequence, averaged over the mix.
pub fn alone_seconds(engine: &Engine, jobs: &[Job]) -> f64 {
    let n = jobs.len().max(1) as f64;
    let step = engine.base + engine.per_seq;
    jobs.iter()
        .map(|j| {
            engine.prefill_per_token * f64::from(j.uncached) + step * f64::from(j.output.max(1))
        })
        .sum::<f64>()
        / n
}

/// The long-prompt case the tests of the first token's end share: 10 ms + 0.2 ms steps and
/// 0.2 ms per prompt token.
#[cfg(test)]
pub(crate) const LONG: Engine = Engine {
    base: 0.010,
    per_seq: 0.0002,
    prefill_per_token: 0.0002,
    context: None,
    memory: Memory::UNKNOWN,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(uncached: u32, output: u32) -> Vec<Job> {
        vec![Job { uncached, output }]
    }

    #[test]
    fn one_client_waits_for_its_own_prefill_step_only() {
        let r = run(&LONG, &jobs(2000, 100), Load::Closed(1)).expect("a replay");
        // Alone, the engine is idle when the next request arrives: its step starts at once
        // and costs 10 + 0.2 + 400 ms.
        let p50 = r.ttft_quantile(0.5).expect("measured");
        assert!((p50 - 0.4102).abs() < 1e-9, "{p50}");
        assert_eq!(r.ttft.len(), MEASURED);
        // 99 decode steps of 10.2 ms after the first token.
        let tps = r.tps[r.tps.len() / 2];
        assert!((tps - 1.0 / 0.0102).abs() < 1e-6, "{tps}");
    }

    #[test]
    fn more_clients_wait_behind_each_others_prefill() {
        let p90 = |n| {
            run(&LONG, &jobs(2000, 100), Load::Closed(n))
                .and_then(|r| r.ttft_quantile(0.9))
                .expect("measured")
        };
        let (one, four, eight) = (p90(1), p90(4), p90(8));
        assert!(one < four && four < eight, "{one} {four} {eight}");
        // Started together with equal lengths, the clients stay in step: the last of n to be
        // admitted waits for all n prompts, n x 400 ms and a step.
        assert!((one - 0.4102).abs() < 1e-6, "{one}");
        assert!((four - (4.0 * 0.4 + 0.0108)).abs() < 0.02, "{four}");
        assert!((eight - (8.0 * 0.4 + 0.0116)).abs() < 0.02, "{eight}");
    }

    #[test]
    fn an_open_loop_past_saturation_shows_the_queue() {
        // One request needs 400 ms of prefill and 99 steps: about 2 requests/s at most.
        let ok = run(&LONG, &jobs(2000, 100), Load::Open(0.5)).expect("a replay");
        let over = run(&LONG, &jobs(2000, 100), Load::Open(4.0)).expect("a replay");
        let (a, b) = (
            ok.ttft_quantile(0.9).expect("ok"),
            over.ttft_quantile(0.9).expect("over"),
        );
        assert!(a < 1.0, "{a}");
        assert!(b > 10.0 * a, "{a} {b}");
    }

    #[test]
    fn the_same_inputs_replay_the_same() {
        let mix = [
            Job {
                uncached: 100,
                output: 50,
            },
            Job {
                uncached: 3000,
                output: 10,
            },
        ];
        let a = run(&LONG, &mix, Load::Open(3.0));
        assert_eq!(a, run(&LONG, &mix, Load::Open(3.0)));
        assert_eq!(run(&LONG, &[], Load::Closed(4)), None);
        assert_eq!(run(&LONG, &mix, Load::Open(0.0)), None);
    }

    #[test]
    fn the_work_is_bounded_whatever_the_mix() {
        let long = jobs(10, 100_000);
        let r = run(&LONG, &long, Load::Closed(256)).expect("a replay");
        // The budget ran out long before 400 requests of 100,000 tokens finished; the first
        // tokens it saw are measured, the rest count with their wait.
        assert!(r.ttft.len() <= MEASURED, "{}", r.ttft.len());
    }

    /// Short prompts, so memory and not prefill is what the clients wait for: 10 ms + 0.2 ms
    /// steps, 0.01 ms per prompt token, and a cache of `blocks` blocks of 16 tokens.
    fn small(blocks: u64, max_num_seqs: Option<u32>) -> Engine {
        Engine {
            base: 0.010,
            per_seq: 0.0002,
            prefill_per_token: 0.000_01,
            context: None,
            memory: Memory {
                kv_cache_tokens: Some(blocks * 16),
                block_size: 16,
                max_num_seqs,
            },
        }
    }

    const UNLIMITED: Engine = Engine {
        memory: Memory::UNKNOWN,
        ..LONG
    };

    #[test]
    fn clients_whose_blocks_fit_run_as_if_memory_were_endless() {
        // 100 prompt and 100 output tokens hold at most ceil(200 / 16) = 13 blocks: four
        // clients need 52 at their peak.
        let job = jobs(100, 100);
        let endless = Engine {
            prefill_per_token: 0.000_01,
            ..UNLIMITED
        };
        let fits = run(&small(52, None), &job, Load::Closed(4)).expect("a replay");
        let free = run(&endless, &job, Load::Closed(4)).expect("a replay");
        assert_eq!((fits.preemptions, fits.cache_full_steps), (0, 0));
        assert_eq!(fits.ttft, free.ttft);
        assert_eq!(fits.tps, free.tps);
    }

    #[test]
    fn clients_beyond_the_cache_wait_for_memory_and_preempt() {
        let job = jobs(100, 100);
        let endless = Engine {
            prefill_per_token: 0.000_01,
            ..UNLIMITED
        };
        let p90 = |e: &Engine, n| {
            run(e, &job, Load::Closed(n))
                .and_then(|r| r.ttft_quantile(0.9))
                .expect("measured")
        };
        // Without a cache bound eight clients join the batch as soon as they send: about
        // two steps.
        let free = p90(&endless, 8);
        assert!(free < 0.05, "{free}");
        // With room for four, the others wait for a whole request (about 100 steps of 11 ms)
        // and the growing answers push the newest out.
        let tight = run(&small(52, None), &job, Load::Closed(8)).expect("a replay");
        let waited = tight.ttft_quantile(0.9).expect("measured");
        assert!(waited > 0.5, "{waited}");
        assert!(tight.preemptions > 0);
        // The steps that held an arrived request back for want of blocks say so.
        assert!(tight.cache_full_steps > 0, "{tight:?}");
        assert_eq!(tight.seqs_full_steps, 0);
        // The cache caps the aggregate: more clients queue and add nothing, and eight make
        // far less than eight with endless memory (about five fit on average, less the
        // recomputed work).
        let twelve = run(&small(52, None), &job, Load::Closed(12)).expect("a replay");
        let endless8 = run(&endless, &job, Load::Closed(8)).expect("a replay");
        assert!(
            (tight.output_tps / twelve.output_tps - 1.0).abs() < 0.02,
            "{} vs {}",
            tight.output_tps,
            twelve.output_tps
        );
        assert!(
            tight.output_tps < 0.75 * endless8.output_tps,
            "{} vs {}",
            tight.output_tps,
            endless8.output_tps
        );
    }

    #[test]
    fn the_engines_cap_on_sequences_caps_the_batch() {
        let job = jobs(100, 100);
        let capped = run(&small(1 << 20, Some(2)), &job, Load::Closed(4)).expect("a replay");
        let two = run(&small(1 << 20, None), &job, Load::Closed(2)).expect("a replay");
        // Four clients through two slots: the aggregate of two, and half wait a request.
        assert!((capped.output_tps / two.output_tps - 1.0).abs() < 0.05);
        assert!(capped.ttft_quantile(0.9).expect("measured") > 0.5);
        assert_eq!(capped.preemptions, 0);
        // The cap, not the cache, held the other two back; the replay's own cap is not the
        // engine's.
        assert!(capped.seqs_full_steps > 0, "{capped:?}");
        assert_eq!(capped.cache_full_steps, 0);
        let many = run(&UNLIMITED, &job, Load::Closed(300)).expect("a replay");
        assert_eq!((many.seqs_full_steps, many.cache_full_steps), (0, 0));
    }

    #[test]
    fn a_job_longer_than_the_cache_is_cut_to_it_and_the_replay_ends() {
        // 4,000 tokens of prompt and answer in a 1,024-token cache: an engine would refuse the
        // request; the replay runs what fits instead of waiting for ever.
        let r = run(&small(64, None), &jobs(3000, 1000), Load::Closed(2)).expect("a replay");
        assert_eq!(r.ttft.len(), MEASURED);
        assert_eq!(run(&small(0, None), &jobs(10, 10), Load::Closed(1)), None);
    }

    #[test]
    fn clients_that_join_one_by_one_wait_for_fewer_prefills() {
        // Four clients with 2,000-token prompts: together they stay in step and the last waits
        // for all four prefills (1.6 s); joining over a request's time, each meets at most one
        // other prompt's prefill before its own (0.4 s each).
        let p90 = |load| {
            run(&LONG, &jobs(2000, 100), load)
                .and_then(|r| r.ttft_quantile(0.9))
                .expect("measured")
        };
        let (together, joining) = (p90(Load::Closed(4)), p90(Load::Joining(4)));
        assert!(together > 1.6, "{together}");
        assert!(
            joining < 0.85 && joining < 0.55 * together,
            "{joining} {together}"
        );
        let r = run(&LONG, &jobs(2000, 100), Load::Joining(4)).expect("a replay");
        assert_eq!(r.mean_in_flight, 4.0);
    }

    #[test]
    fn a_recorded_trace_is_replayed_at_its_own_times() {
        let job = Job {
            uncached: 2000,
            output: 100,
        };
        // Requests 5 s apart meet an idle engine: each waits for its own prefill step only.
        let apart: Vec<Arrival> = (0..20)
            .map(|i| Arrival {
                at: 5.0 * f64::from(i),
                job,
                measured: i >= 2,
            })
            .collect();
        let r = trace(&LONG, &apart).expect("a replay");
        assert_eq!(r.ttft.len(), 18);
        assert!((r.ttft_quantile(0.9).expect("a p90") - 0.4102).abs() < 1e-9);
        // Little's law: one request in the engine for 1.41 s every 5 s.
        assert!(
            (r.mean_in_flight - 1.4202 / 5.0).abs() < 0.01,
            "{}",
            r.mean_in_flight
        );
        // The same requests in bursts of four: the last of each burst waits for four prefills.
        let bursts: Vec<Arrival> = (0..20)
            .map(|i| Arrival {
                at: 5.0 * f64::from(i / 4),
                job,
                measured: i >= 4,
            })
            .collect();
        let r = trace(&LONG, &bursts).expect("a replay");
        assert!(r.ttft_quantile(0.9).expect("a p90") > 1.6, "{r:?}");
        assert_eq!(trace(&LONG, &bursts[..4]), None);
    }

    #[test]
    fn quantiles_and_shares_are_exact_on_a_known_list() {
        let r = Replayed {
            ttft: (1..=10).map(f64::from).collect(),
            tps: vec![5.0, 10.0, 20.0, 40.0],
            output_tps: 0.0,
            preemptions: 0,
            cache_full_steps: 0,
            seqs_full_steps: 0,
            mean_in_flight: 0.0,
        };
        assert_eq!(r.ttft_quantile(0.9), Some(9.0));
        assert_eq!(r.ttft_quantile(0.5), Some(5.0));
        assert_eq!(r.ttft_quantile(0.99), Some(10.0));
        assert!((r.share_meeting(Some(7.0), None) - 0.7).abs() < 1e-12);
        assert!((r.share_meeting(None, Some(10.0)) - 0.75).abs() < 1e-12);
        assert!((r.share_meeting(Some(7.0), Some(10.0)) - 0.525).abs() < 1e-12);
    }
}
