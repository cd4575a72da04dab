//! The planner's answers from a fitted step cost: how many streams fit under each class's speed
//! floor, what they produce there, what a million of their tokens costs, and the trade-off curve.
//!
//! With `t(b) = base + per_seq * b` one stream gets `1/t(b)` tokens/s and the engine `b/t(b)`.
//! The largest `b` whose `1/t(b)` still meets a floor `F` is `floor((1/F - base) / per_seq)`.
//! That is the decode end. The first-token end, where a class has a TTFT target, comes from
//! replaying the engine ([`super::limits`]); a class's max concurrency is the smaller of the two.
//! Everything here is per engine (one replica) unless it says fleet.

use super::fit::Fit;
use super::limits::Replays;
use super::steps::MAX_CONCURRENCY;
use crate::slo::{Classes, Targets};

/// The concurrencies the curve is reported at: the concurrency bands' edges.
pub const CURVE: [u32; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// A class's targets, as the SLO classes declare them.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassTargets {
    pub name: String,
    /// Per-request decode tokens/s the class needs; `None`: no floor, no decode bound.
    pub tps_floor: Option<f64>,
    /// The longest TTFT the class allows, seconds; `None`: no first-token bound.
    pub ttft: Option<f64>,
    /// The share of requests that must meet the targets.
    pub objective: f64,
}

impl ClassTargets {
    /// What the capacity model takes of one SLO class: its speed floor, its TTFT target and
    /// its objective (the end-to-end target bounds no concurrency).
    pub fn new(name: &str, t: &Targets) -> Self {
        ClassTargets {
            name: name.to_string(),
            tps_floor: t.tps,
            ttft: t.ttft.map(|d| d.as_secs_f64()),
            objective: t.objective,
        }
    }

    /// Every class of the table, in its order.
    pub fn of(classes: &Classes) -> Vec<Self> {
        classes
            .iter()
            .map(|(n, t)| ClassTargets::new(n, t))
            .collect()
    }

    /// A class with a speed floor only, met by 95% of requests.
    pub fn floor(name: &str, tps: f64) -> Self {
        ClassTargets {
            name: name.into(),
            tps_floor: Some(tps),
            ttft: None,
            objective: 0.95,
        }
    }
}

/// Which end of the engine a limit comes from: the `bound` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Ttft,
    TokensPerSecond,
    /// The KV cache holds no more of the mix's requests.
    KvCache,
    /// The engine runs no more sequences (`--max-num-seqs`).
    MaxNumSeqs,
}

impl Bound {
    /// Every bound, in the order a tie is named: the speed and first-token ends first, as
    /// they were before memory was known.
    pub const ALL: [Bound; 4] = [
        Bound::Ttft,
        Bound::TokensPerSecond,
        Bound::KvCache,
        Bound::MaxNumSeqs,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Bound::Ttft => "ttft",
            Bound::TokensPerSecond => "tokens_per_second",
            Bound::KvCache => "kv_cache",
            Bound::MaxNumSeqs => "max_num_seqs",
        }
    }
}

/// What the engine's memory holds whatever the class: the same for every class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    /// Closed-loop clients of the live mix the KV cache holds ([`super::Memory::kv_limit`]);
    /// `None` while the cache's size is not known.
    pub kv_cache: Option<u32>,
    /// The engine's cap on running sequences, where known.
    pub max_num_seqs: Option<u32>,
}

/// What the fleet looks like, beyond the fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fleet {
    /// Engines the traffic is spread over (`--replicas`).
    pub replicas: u32,
    /// GPUs behind the proxy, all replicas together (`--gpus`).
    pub gpus: f64,
    /// `--gpu-hour-cost`, in the user's currency.
    pub gpu_hour_cost: Option<f64>,
}

/// One class's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub class: String,
    /// Largest per-engine concurrency whose predicted per-request speed meets the floor (0:
    /// not even one stream does; [`MAX_CONCURRENCY`] when the fit shows no slowdown within it);
    /// `None` without a floor.
    pub limit_tps: Option<u32>,
    /// Largest number of requests in flight per engine whose predicted TTFT meets the target
    /// at the objective; `None` without a target or while the prefill cost is not known yet.
    pub limit_ttft: Option<u32>,
    /// The memory bounds, where the engine's memory is known ([`Held`]).
    pub limit_kv: Option<u32>,
    pub limit_seqs: Option<u32>,
    /// The highest level the window saw the class met at ([`super::seen`]); the answer is
    /// never below it.
    pub seen_met: Option<u32>,
    /// The smallest of the bounds, or the level seen met where that is higher: what the
    /// engine can hold for this class.
    pub max_concurrency: u32,
    pub binding: Bound,
    /// Poisson arrivals per second per engine at which the class still holds.
    pub max_request_rate: Option<f64>,
    /// Tokens/s the fleet produces with every engine at that concurrency.
    pub output_tps: f64,
    /// The same per GPU.
    pub output_tps_per_gpu: f64,
    /// Cost per million output tokens there; `None` without `--gpu-hour-cost` or when nothing
    /// is produced.
    pub cost_per_million: Option<f64>,
    /// Mean requests in flight per engine over the last minute / `max_concurrency`; `None`
    /// when `max_concurrency` is 0.
    pub utilization: Option<f64>,
}

/// One point of the trade-off curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TradeoffPoint {
    pub concurrency: u32,
    /// Tokens/s one stream sees.
    pub per_request: f64,
    /// Tokens/s the engine produces.
    pub aggregate: f64,
}

/// The largest concurrency whose predicted per-request speed meets `floor` tokens/s.
pub fn max_concurrency(fit: &Fit, floor: f64) -> u32 {
    if !(floor.is_finite() && floor > 0.0) {
        return MAX_CONCURRENCY as u32;
    }
    let budget = 1.0 / floor;
    if fit.step(1.0) > budget {
        return 0;
    }
    if fit.per_seq <= 0.0 {
        return MAX_CONCURRENCY as u32;
    }
    // A hair of slack so that an exact boundary (the issue's 25 ms = 10 + 30 x 0.5) is not lost
    // to rounding.
    let b = ((budget - fit.base) / fit.per_seq * (1.0 + 1e-9)).floor();
    b.clamp(1.0, MAX_CONCURRENCY as f64) as u32
}

/// The curve at [`CURVE`]'s concurrencies (points whose predicted step is not positive, from a
/// nonsensical fit, are left out).
pub fn curve(fit: &Fit) -> Vec<TradeoffPoint> {
    CURVE
        .iter()
        .filter_map(|&b| {
            let t = fit.step(f64::from(b));
            (t > 0.0).then(|| TradeoffPoint {
                concurrency: b,
                per_request: 1.0 / t,
                aggregate: f64::from(b) / t,
            })
        })
        .collect()
}

/// Every class with a floor or a TTFT target; `in_flight` is the mean number of requests in
/// flight per engine; `held` the memory's bounds, which apply to a class that has a target of
/// its own. `replays` is `None` until the prefill cost is known, and then only the decode
/// bound is answered. `seen` gives the highest level the window saw a class met at: no
/// answer is below it.
pub fn answers(
    fit: &Fit,
    classes: &[ClassTargets],
    fleet: &Fleet,
    in_flight: f64,
    held: Held,
    mut replays: Option<&mut Replays>,
    seen: &dyn Fn(&ClassTargets) -> Option<u32>,
) -> Vec<Answer> {
    classes
        .iter()
        .filter_map(|c| {
            let seen_met = seen(c);
            let at_least = |l: u32| seen_met.map_or(l, |s| l.max(s));
            // Open traffic's speed bound is its Poisson steady state's; a closed loop's is the
            // decode line's.
            let limit_tps = c.tps_floor.map(|f| {
                let open = replays
                    .as_deref()
                    .and_then(|r| r.speed_limit(f, c.objective));
                at_least(open.unwrap_or_else(|| max_concurrency(fit, f)))
            });
            let limit_ttft = match (c.ttft, replays.as_deref_mut()) {
                (Some(t), Some(r)) => r.concurrency_limit(t, c.objective).map(at_least),
                _ => None,
            };
            if limit_tps.is_none() && limit_ttft.is_none() {
                return None;
            }
            let limit = |bound| match bound {
                Bound::Ttft => limit_ttft,
                Bound::TokensPerSecond => limit_tps,
                Bound::KvCache => held.kv_cache,
                Bound::MaxNumSeqs => held.max_num_seqs,
            };
            // The smallest bound binds; on a tie the first named in `Bound::ALL`.
            let (b, binding) = Bound::ALL
                .iter()
                .filter_map(|&bound| limit(bound).map(|l| (l, bound)))
                .min_by_key(|&(l, _)| l)?;
            let b = at_least(b);
            let engine_tps = match (binding, replays.as_deref_mut()) {
                _ if b == 0 => 0.0,
                (Bound::TokensPerSecond, _) | (_, None) => f64::from(b) / fit.step(f64::from(b)),
                // Held by the first token or by memory: the replay knows prefill and memory,
                // the decode line neither.
                (_, Some(r)) => r.output_tps(b).unwrap_or(0.0),
            };
            let output_tps = engine_tps * f64::from(fleet.replicas.max(1));
            let per_gpu = if fleet.gpus > 0.0 {
                output_tps / fleet.gpus
            } else {
                output_tps
            };
            let cost_per_million = fleet
                .gpu_hour_cost
                .filter(|_| per_gpu > 0.0)
                .map(|cost| cost / (per_gpu * 3600.0) * 1e6);
            let max_request_rate = replays
                .as_deref()
                .and_then(|r| r.rate_limit(c.ttft, c.tps_floor, c.objective));
            Some(Answer {
                class: c.name.clone(),
                limit_tps,
                limit_ttft,
                limit_kv: held.kv_cache,
                limit_seqs: held.max_num_seqs,
                seen_met,
                max_concurrency: b,
                binding,
                max_request_rate,
                output_tps,
                output_tps_per_gpu: per_gpu,
                cost_per_million,
                utilization: (b > 0).then(|| in_flight / f64::from(b)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(base: f64, per_seq: f64) -> Fit {
        Fit {
            base,
            per_seq,
            r2: 1.0,
            samples: 1000,
            points: 10,
            min_concurrency: 1,
            slope_error: 0.0,
            central: (1, 64),
            max_concurrency: 64,
        }
    }

    #[test]
    fn the_issues_example_fits_thirty_streams_at_forty_tokens_per_second() {
        let f = line(0.010, 0.0005);
        assert_eq!(max_concurrency(&f, 40.0), 30);
        // 1 / (10 ms + 0.5 ms) = 95.2 tok/s alone: a 100 tok/s floor is out of reach.
        assert_eq!(max_concurrency(&f, 100.0), 0);
        assert_eq!(max_concurrency(&f, 95.0), 1);
        assert_eq!(max_concurrency(&f, 1.0), 256);
        assert_eq!(max_concurrency(&line(0.010, 0.0), 40.0), 256);
        assert_eq!(max_concurrency(&line(0.010, -0.0001), 40.0), 256);
    }

    #[test]
    fn answers_scale_to_the_fleet_and_cost_what_the_gpus_cost() {
        let f = line(0.010, 0.0005);
        let classes = [
            ClassTargets::floor("interactive", 40.0),
            ClassTargets {
                tps_floor: None,
                ..ClassTargets::floor("batch", 1.0)
            },
            ClassTargets::floor("fast", 200.0),
        ];
        let fleet = Fleet {
            replicas: 2,
            gpus: 4.0,
            gpu_hour_cost: Some(2.0),
        };
        let a = answers(&f, &classes, &fleet, 15.0, Held::default(), None, &|_| None);
        assert_eq!(a.len(), 2);
        let i = &a[0];
        assert_eq!((i.class.as_str(), i.max_concurrency), ("interactive", 30));
        assert_eq!(
            (i.limit_tps, i.limit_ttft, i.binding),
            (Some(30), None, Bound::TokensPerSecond)
        );
        assert_eq!(i.max_request_rate, None);
        // 30 / 25 ms = 1,200 tok/s per engine, 2,400 for two, 600 per GPU.
        assert!((i.output_tps - 2400.0).abs() < 1e-6, "{i:?}");
        assert!((i.output_tps_per_gpu - 600.0).abs() < 1e-6);
        // $2 per GPU-hour / (600 tok/s x 3600 s) x 1e6 = $0.926 per million.
        let cost = i.cost_per_million.expect("a cost");
        assert!((cost - 2.0 / 2.16).abs() < 1e-9, "{cost}");
        assert_eq!(i.utilization, Some(0.5));
        let fast = &a[1];
        assert_eq!((fast.max_concurrency, fast.output_tps), (0, 0.0));
        assert_eq!((fast.cost_per_million, fast.utilization), (None, None));
    }

    #[test]
    fn a_ttft_target_binds_first_with_long_prompts() {
        use crate::capacity::limits::Replays;
        use crate::capacity::replay::{Job, LONG};
        let f = line(LONG.base, LONG.per_seq);
        let jobs = [Job {
            uncached: 2000,
            output: 100,
        }];
        let mut replays = Replays::new(LONG, &jobs);
        let chat = ClassTargets {
            name: "chat".into(),
            tps_floor: Some(10.0),
            ttft: Some(2.0),
            objective: 0.9,
        };
        let fleet = Fleet {
            replicas: 1,
            gpus: 1.0,
            gpu_hour_cost: None,
        };
        let a = &answers(
            &f,
            &[chat],
            &fleet,
            8.0,
            Held::default(),
            Some(&mut replays),
            &|_| None,
        )[0];
        // Decode alone would hold 256 at 10 tok/s; the first token holds four.
        assert_eq!((a.limit_tps, a.limit_ttft), (Some(256), Some(4)));
        assert_eq!((a.max_concurrency, a.binding), (4, Bound::Ttft));
        assert_eq!(a.utilization, Some(2.0));
        let rate = a.max_request_rate.expect("a rate");
        assert!(rate > 0.0 && rate < 2.5, "{rate}");
        // Four clients in step: each cycle is 1.6 s of prefill and 99 steps of 10.8 ms for
        // 400 tokens.
        let want = 400.0 / (1.6 + 0.0108 + 99.0 * 0.0108 + 4.0 * 0.0108 / 2.0);
        assert!(
            (a.output_tps / want - 1.0).abs() < 0.05,
            "{} vs {want}",
            a.output_tps
        );
    }

    #[test]
    fn memory_binds_first_when_the_cache_holds_fewer_than_the_targets_allow() {
        use crate::capacity::limits::Replays;
        use crate::capacity::memory::Memory;
        use crate::capacity::replay::{Engine, Job};
        // 100 prompt and 100 output tokens, 0.01 ms per prompt token, a cache of 52 blocks
        // of 16: a client holds 10 blocks on average, so 5 fit.
        let memory = Memory {
            kv_cache_tokens: Some(52 * 16),
            block_size: 16,
            max_num_seqs: Some(64),
        };
        let engine = Engine {
            base: 0.010,
            per_seq: 0.0002,
            prefill_per_token: 0.000_01,
            context: None,
            memory,
        };
        let jobs = [Job {
            uncached: 100,
            output: 100,
        }];
        let held = Held {
            kv_cache: memory.kv_limit(crate::capacity::workload::lengths(&jobs)),
            max_num_seqs: memory.max_num_seqs,
        };
        assert_eq!(held.kv_cache, Some(5));
        let mut replays = Replays::new(engine, &jobs);
        let chat = ClassTargets {
            name: "chat".into(),
            tps_floor: Some(10.0),
            ttft: Some(2.0),
            objective: 0.9,
        };
        let fleet = Fleet {
            replicas: 1,
            gpus: 1.0,
            gpu_hour_cost: None,
        };
        let a = &answers(
            &f_line(),
            std::slice::from_ref(&chat),
            &fleet,
            10.0,
            held,
            Some(&mut replays),
            &|_| None,
        )[0];
        assert_eq!((a.limit_kv, a.limit_seqs), (Some(5), Some(64)));
        assert_eq!((a.max_concurrency, a.binding), (5, Bound::KvCache));
        assert_eq!(a.utilization, Some(2.0));
        // The aggregate at the bound is the replay's, which queues for memory: five clients
        // make about 5 / 11 ms less the recomputed work.
        assert!(
            a.output_tps > 350.0 && a.output_tps < 5.0 / 0.011,
            "{}",
            a.output_tps
        );
        // A cap on sequences below it binds instead; without memory known, the old two.
        let seqs = Held {
            max_num_seqs: Some(2),
            ..held
        };
        let a = &answers(
            &f_line(),
            std::slice::from_ref(&chat),
            &fleet,
            1.0,
            seqs,
            Some(&mut replays),
            &|_| None,
        )[0];
        assert_eq!((a.max_concurrency, a.binding), (2, Bound::MaxNumSeqs));
        let a = &answers(
            &f_line(),
            &[chat],
            &fleet,
            1.0,
            Held::default(),
            None,
            &|_| None,
        )[0];
        assert_eq!((a.limit_kv, a.binding), (None, Bound::TokensPerSecond));
    }

    fn f_line() -> Fit {
        line(0.010, 0.0002)
    }

    #[test]
    fn the_curve_trades_per_request_speed_for_aggregate() {
        let c = curve(&line(0.010, 0.0005));
        assert_eq!(c.len(), CURVE.len());
        assert!((c[0].per_request - 1.0 / 0.0105).abs() < 1e-9);
        let at64 = c.iter().find(|p| p.concurrency == 64).expect("64");
        assert!((at64.aggregate - 64.0 / 0.042).abs() < 1e-9);
        assert!(c.windows(2).all(|w| w[0].per_request > w[1].per_request));
        assert!(c.windows(2).all(|w| w[0].aggregate < w[1].aggregate));
        // A fit whose line goes below zero drops the points where it does.
        assert_eq!(curve(&line(0.010, -0.0001)).len(), 7);
    }
}
