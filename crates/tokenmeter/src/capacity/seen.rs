//! What the window has already shown: the highest concurrency at which a class was seen meeting
//! its targets.
//!
//! A model's answer is a prediction; a level the engine ran at, over enough requests, is a fact.
//! Where the model says fewer streams than a class was seen carrying within its targets, the
//! model is wrong there (it answered 3 where 24 were meeting the class), so the answer is never
//! below the highest level seen met ([`super::plan::answers`] takes the larger).
//!
//! A request's level is the mean number of requests in flight per engine while it decoded
//! (`Request::batch`), rounded; a level counts once it has [`MIN_REQUESTS`] requests, and it is
//! met when the class's objective share of them met every target the class has (TTFT, speed).

use std::collections::BTreeMap;

use super::plan::ClassTargets;
use super::workload::Request;

/// Requests a level needs before it says anything: with fewer, a share of 90% or 95% is one or
/// two requests' luck.
pub const MIN_REQUESTS: usize = 20;

/// Whether `r` met `class`'s targets: its TTFT within the target and its decode speed at or
/// above the floor, each where the class has one (a one-token answer has no speed to miss).
pub fn met(r: &Request, class: &ClassTargets) -> bool {
    let ttft_ok = class.ttft.map_or(true, |t| r.ttft.is_some_and(|x| x <= t));
    let tps_ok = class
        .tps_floor
        .map_or(true, |f| r.tps.map_or(true, |x| x >= f));
    ttft_ok && tps_ok
}

/// The highest level at which `class` was seen meeting its targets in `recent`; `None` where no
/// level with enough requests met them (or the class has no target).
pub fn highest_met(recent: &[Request], class: &ClassTargets) -> Option<u32> {
    if class.ttft.is_none() && class.tps_floor.is_none() {
        return None;
    }
    let mut levels: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    for r in recent {
        let Some(b) = r.batch.filter(|b| b.is_finite() && *b >= 0.5) else {
            continue;
        };
        let e = levels.entry(b.round() as u32).or_default();
        e.0 += 1;
        e.1 += usize::from(met(r, class));
    }
    levels
        .iter()
        .filter(|(_, (n, ok))| *n >= MIN_REQUESTS && *ok as f64 >= class.objective * *n as f64)
        .map(|(level, _)| *level)
        .max()
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn request(batch: f64, ttft: f64, tps: f64) -> Request {
        Request {
            at: Instant::now(),
            arrival: Instant::now(),
            prompt: 256,
            cached: 0,
            output: 256,
            ttft: Some(ttft),
            stated_prefill: None,
            stated_queue: None,
            step_end: None,
            tps: Some(tps),
            batch: Some(batch),
        }
    }

    #[test]
    fn the_highest_level_whose_requests_met_the_class_in_its_objective_share() {
        let chat = ClassTargets {
            name: "chat".into(),
            tps_floor: Some(20.0),
            ttft: Some(1.0),
            objective: 0.9,
        };
        let mut recent = Vec::new();
        // 24 streams met it (all fast), 30 streams met it in 90% exactly, 40 missed (80%).
        recent.extend((0..40).map(|_| request(24.2, 0.3, 45.0)));
        recent.extend((0..20).map(|i| request(30.0, if i < 18 { 0.5 } else { 2.0 }, 30.0)));
        recent.extend((0..20).map(|i| request(40.0, 0.5, if i < 16 { 25.0 } else { 10.0 })));
        // 50 streams met it, but only in 19 requests: not enough to say.
        recent.extend((0..19).map(|_| request(50.0, 0.2, 50.0)));
        assert_eq!(highest_met(&recent, &chat), Some(30));
        let strict = ClassTargets {
            objective: 0.99,
            ..chat.clone()
        };
        assert_eq!(highest_met(&recent, &strict), Some(24));
        let none = ClassTargets {
            tps_floor: None,
            ttft: None,
            ..chat
        };
        assert_eq!(highest_met(&recent, &none), None);
    }
}
