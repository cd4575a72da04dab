//! What charging a request its GPU time costs: its four visits to the books (sent, first token,
//! left, charged), each a short lock and a few multiplications, with eight other requests in
//! flight and a prefill budget running. Never per chunk. The whole request through the meter,
//! charge included, is `cargo bench --bench tenant`'s `request` group.
//!
//! `four_bare_visits` is the floor under that design: four visits that split nothing, each a
//! time since the origin, an uncontended lock and an addition.
//!
//! `cargo bench --bench cost`

use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use tokenmeter::cost::{Labels, Ledger, Prompt, Rates, Step};

fn bench(c: &mut Criterion) {
    let ledger = Ledger::new(8.0);
    let t0 = Instant::now();
    let rates = Rates {
        step: Step::Line {
            base: 0.016,
            per_seq: 0.0002,
        },
        prefill_per_token: 0.00005,
        prefill_known: true,
        admission_wait: 0.5,
    };
    ledger.set_terms(Some(rates), 1, t0);
    // Eight requests in flight beside the one measured.
    for _ in 0..8 {
        ledger.enter(t0, 6000, None);
    }
    let mut at = t0;
    let prompt = Prompt {
        tokens: 1500,
        uncached: 1500,
    };
    let mut g = c.benchmark_group("cost");
    g.bench_function("request", |b| {
        b.iter(|| {
            at += Duration::from_micros(10);
            let t = ledger.enter(at, black_box(6000), None);
            ledger.first_token(t, at + Duration::from_micros(3));
            let held = ledger.leave(t, at + Duration::from_micros(6));
            held.map(|h| {
                let labels = || Labels {
                    model: "m".into(),
                    tenant: None,
                };
                ledger.charge(h, Some(prompt), at + Duration::from_micros(7), labels)
            })
        })
    });
    // The floor under any design that visits the books at a request's four events: each visit
    // a time since the origin, an uncontended lock and an addition, no split at all.
    let floor = std::sync::Mutex::new(0.0f64);
    g.bench_function("four_bare_visits", |b| {
        b.iter(|| {
            at += Duration::from_micros(10);
            for dt in [0, 3, 6, 7] {
                let secs = (at + Duration::from_micros(dt))
                    .saturating_duration_since(t0)
                    .as_secs_f64();
                *floor.lock().unwrap_or_else(|e| e.into_inner()) += black_box(secs);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
