//! The planner's answers from a fitted step cost: how many streams fit under each class's speed
//! floor, what they produce there, what a million of their tokens costs, and the trade-off curve.
//!
//! With `t(b) = base + per_seq * b` one stream gets `1/t(b)` tokens/s and the engine `b/t(b)`.
//! The largest `b` whose `1/t(b)` still meets a floor `F` is `floor((1/F - base) / per_seq)`.
//! Everything here is per engine (one replica) unless it says fleet.

use super::fit::Fit;
use super::summary::MAX_CONCURRENCY;

/// The concurrencies the curve is reported at: the concurrency bands' edges.
pub const CURVE: [u32; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// A class's speed floor, as the SLO classes declare it.
#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    pub name: String,
    /// Per-request decode tokens/s the class needs; `None`: no floor, so no capacity answer.
    pub tps_floor: Option<f64>,
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
    /// Largest per-engine concurrency that meets the floor (0: not even one stream does;
    /// [`MAX_CONCURRENCY`] when the fit shows no slowdown within it).
    pub max_concurrency: u32,
    /// Tokens/s the fleet produces with every engine at that concurrency.
    pub output_tps: f64,
    /// The same per GPU.
    pub output_tps_per_gpu: f64,
    /// Cost per million output tokens there; `None` without `--gpu-hour-cost` or when nothing
    /// is produced.
    pub cost_per_million: Option<f64>,
    /// Mean decoding concurrency per engine over the last minute / `max_concurrency`; `None`
    /// when `max_concurrency` is 0.
    pub utilization: Option<f64>,
}

/// One point of the trade-off curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CurvePoint {
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
pub fn curve(fit: &Fit) -> Vec<CurvePoint> {
    CURVE
        .iter()
        .filter_map(|&b| {
            let t = fit.step(f64::from(b));
            (t > 0.0).then(|| CurvePoint {
                concurrency: b,
                per_request: 1.0 / t,
                aggregate: f64::from(b) / t,
            })
        })
        .collect()
}

/// Every class with a floor; `decoding` is the mean decoding concurrency per engine.
pub fn answers(fit: &Fit, classes: &[Class], fleet: &Fleet, decoding: f64) -> Vec<Answer> {
    classes
        .iter()
        .filter_map(|c| {
            let floor = c.tps_floor?;
            let b = max_concurrency(fit, floor);
            let engine_tps = if b > 0 {
                f64::from(b) / fit.step(f64::from(b))
            } else {
                0.0
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
            Some(Answer {
                class: c.name.clone(),
                max_concurrency: b,
                output_tps,
                output_tps_per_gpu: per_gpu,
                cost_per_million,
                utilization: (b > 0).then(|| decoding / f64::from(b)),
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
            Class {
                name: "interactive".into(),
                tps_floor: Some(40.0),
            },
            Class {
                name: "batch".into(),
                tps_floor: None,
            },
            Class {
                name: "fast".into(),
                tps_floor: Some(200.0),
            },
        ];
        let fleet = Fleet {
            replicas: 2,
            gpus: 4.0,
            gpu_hour_cost: Some(2.0),
        };
        let a = answers(&f, &classes, &fleet, 15.0);
        assert_eq!(a.len(), 2);
        let i = &a[0];
        assert_eq!((i.class.as_str(), i.max_concurrency), ("interactive", 30));
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
