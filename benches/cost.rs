//! What charging a request its GPU time costs: pricing it by the rule and drawing the charge
//! from the ledger, once per request when it ends (never per chunk). The whole request through
//! the meter, charge included, is `cargo bench --bench tenant`'s `request` group.
//!
//! `cargo bench --bench cost`

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use tokenmeter::cost::{Clock, Facts, Ledger, Prices};

fn bench(c: &mut Criterion) {
    let prices = Prices {
        base: 0.016,
        per_seq: 0.0002,
        prefill_per_token: 0.00005,
    };
    let facts = Facts {
        share: 1.2,
        share_prefill: 0.1,
        first_token: true,
        output_tokens: 256,
        uncached_prompt: Some(1500),
        mean_in_flight: Some(8.0),
    };
    let ledger = Ledger::new(8.0);
    let mut age = 0.0;
    let mut g = c.benchmark_group("cost");
    g.bench_function("price_and_charge", |b| {
        b.iter(|| {
            age += 0.01;
            let price = black_box(&facts).price(&prices, 8.0, 1.0);
            let share = facts.time_share(8.0);
            ledger.left();
            ledger.charge(
                price,
                share,
                &Clock {
                    age,
                    idle: 0.0,
                    in_flight: 4,
                },
            )
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
