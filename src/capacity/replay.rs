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
//!   everyone's next token (the decode slowdown while prefilling).
//!
//! The load is either `n` closed-loop clients, each sending its next request the moment the last
//! one ends (a fixed number of users, `tokenmeter bench --concurrency`), or Poisson arrivals at a
//! rate (a service open to the world, `--request-rate`). Jobs are drawn from the live mix with a
//! fixed seed, so a replay is a pure function of its inputs: the same window gives the same answer.
//!
//! **Bounded:** a replay stops after a fixed number of measured requests or a fixed amount of work
//! (sequence-steps), whichever comes first, so its cost does not depend on the traffic.

use std::collections::VecDeque;

use super::summary::MAX_CONCURRENCY;

/// Requests measured per replay, after the warm-up: enough for a stable 0.99 quantile.
pub const MEASURED: usize = 400;

/// The most sequence-steps (one sequence's share of one step) a replay may run: about 10 ms of
/// one core. A replay that reaches it (a long-output mix at a high concurrency) answers from the
/// requests it measured by then.
pub const MAX_WORK: u64 = 1_500_000;

/// What a step costs, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Engine {
    pub base: f64,
    pub per_seq: f64,
    pub prefill_per_token: f64,
}

/// One request of the mix: its uncached prompt tokens and its output tokens (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub uncached: u32,
    pub output: u32,
}

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// This many clients, each sending its next request when the last one ends.
    Closed(u32),
    /// Poisson arrivals at this many requests per second.
    Open(f64),
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
}

impl Replayed {
    /// The `q` quantile of the TTFTs (nearest rank); `None` with no request measured.
    pub fn ttft_quantile(&self, q: f64) -> Option<f64> {
        quantile(&self.ttft, q)
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

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// SplitMix64: a tiny, well-mixed generator; the replay needs reproducible draws, not secrecy.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    arrival: f64,
    job: Job,
    /// Counted in the results (not warm-up).
    measured: bool,
}

#[derive(Debug, Clone, Copy)]
struct Running {
    arrival: f64,
    first: Option<f64>,
    left: u32,
    output: u32,
    measured: bool,
}

/// The most a closed-loop client's turnaround takes, in decode steps of one sequence.
pub const TURNAROUND: f64 = 1.0;

/// The seed every replay of the model uses.
pub const SEED: u64 = 0x746f_6b65_6e6d_6574;

/// Replays `load` over `jobs`; `None` without jobs or with a step that costs nothing.
pub fn run(engine: &Engine, jobs: &[Job], load: Load) -> Option<Replayed> {
    let step = engine.base + engine.per_seq;
    if jobs.is_empty() || step.is_nan() || step <= 0.0 {
        return None;
    }
    let mut rng = Rng(SEED);
    let draw = |rng: &mut Rng| {
        let j = jobs[rng.below(jobs.len())];
        Job {
            uncached: j.uncached,
            output: j.output.max(1),
        }
    };
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let (warm, mut next_arrival, rate) = match load {
        Load::Closed(n) => {
            // The clients start together, as a load test's level or a burst after an outage
            // does. With a varied mix they drift apart within a few requests; with equal
            // lengths they stay in step, which is the worst case of n clients and the one a
            // limit has to hold.
            let n = n.max(1);
            for _ in 0..n {
                let job = draw(&mut rng);
                waiting.push_back(Waiting {
                    arrival: 0.0,
                    job,
                    measured: false,
                });
            }
            (2 * n as usize, f64::INFINITY, 0.0)
        }
        Load::Open(rate) => {
            if rate.is_nan() || rate <= 0.0 || rate.is_infinite() {
                return None;
            }
            (MEASURED / 10, 0.0, rate)
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
    let mut t = 0.0f64;
    loop {
        // Open loop: every arrival up to now joins the queue.
        while open && next_arrival <= t && measured_started < MEASURED {
            let measured = arrivals >= warm;
            arrivals += 1;
            measured_started += usize::from(measured);
            waiting.push_back(Waiting {
                arrival: next_arrival,
                job: draw(&mut rng),
                measured,
            });
            next_arrival -= rng.unit().ln() / rate;
        }
        if running.is_empty() {
            // An idle engine starts a step as soon as a request is there.
            let next = waiting
                .front()
                .map(|w| w.arrival)
                .into_iter()
                .chain((open && measured_started < MEASURED).then_some(next_arrival))
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
        let mut prefill = 0u64;
        while running.len() < MAX_CONCURRENCY {
            // A request that arrives just as a step starts waits for the next one, unless the
            // engine was idle (then the step starts for it).
            match waiting.front() {
                Some(w) if w.arrival < t || (idle && w.arrival <= t) => {}
                _ => break,
            }
            let Some(w) = waiting.pop_front() else { break };
            prefill += u64::from(w.job.uncached);
            running.push(Running {
                arrival: w.arrival,
                first: None,
                left: w.job.output,
                output: w.job.output,
                measured: w.measured,
            });
        }
        let step = engine.base
            + engine.per_seq * running.len() as f64
            + engine.prefill_per_token * prefill as f64;
        let end = t + step.max(1e-9);
        work += running.len() as u64;
        let mut i = 0;
        while i < running.len() {
            let s = &mut running[i];
            s.left -= 1;
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
            let s = running.swap_remove(i);
            if s.measured && s.output > 1 {
                let first = s.first.unwrap_or(end);
                if end > first {
                    tps.push(f64::from(s.output - 1) / (end - first));
                }
            }
            finished += 1;
            if !open && measured_started < MEASURED {
                let measured = finished > warm;
                measured_started += usize::from(measured);
                // The client's turnaround (reading the end, sending the next request) is a
                // moment, but not always the same one: drawn within one decode step, it lets
                // clients that end near each other meet in one admission, as real ones do.
                let turnaround = rng.unit() * TURNAROUND * (engine.base + engine.per_seq);
                waiting.push_back(Waiting {
                    arrival: end + turnaround,
                    job: draw(&mut rng),
                    measured,
                });
            }
        }
        t = end;
        let done = measured_started >= MEASURED
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
            .filter(|w| w.measured)
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
    })
}

/// The long-prompt case the tests of the first token's end share: 10 ms + 0.2 ms steps and
/// 0.2 ms per prompt token.
#[cfg(test)]
pub(crate) const LONG: Engine = Engine {
    base: 0.010,
    per_seq: 0.0002,
    prefill_per_token: 0.0002,
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

    #[test]
    fn quantiles_and_shares_are_exact_on_a_known_list() {
        let r = Replayed {
            ttft: (1..=10).map(f64::from).collect(),
            tps: vec![5.0, 10.0, 20.0, 40.0],
            output_tps: 0.0,
        };
        assert_eq!(r.ttft_quantile(0.9), Some(9.0));
        assert_eq!(r.ttft_quantile(0.5), Some(5.0));
        assert_eq!(r.ttft_quantile(0.99), Some(10.0));
        assert!((r.share_meeting(Some(7.0), None) - 0.7).abs() < 1e-12);
        assert!((r.share_meeting(None, Some(10.0)) - 0.75).abs() < 1e-12);
        assert!((r.share_meeting(Some(7.0), Some(10.0)) - 0.525).abs() < 1e-12);
    }
}
