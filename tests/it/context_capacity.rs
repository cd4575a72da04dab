//! The decode step's context term against the simulator, whose step grows with the context its
//! batch holds (`--step-per-1k-kv-tokens`).
//!
//! The traffic shifts from short contexts to long ones, the same closed-loop levels in each
//! half, as a day does when retrieval or agent traffic takes over from chat. The decode line
//! alone, drawn through both halves, predicts the average of the two for every request; with
//! the term, the model predicts each context's own step. Held to the simulator's known step
//! time for the long half (the traffic the engine serves now): the line alone and the line
//! with the term, from the same window, side by side.

use std::time::Duration;

use tokenmeter_tools::sim::{Model, SimConfig};

use crate::support::levels;
use crate::support::{serial, spawn_proxy, start_sim};

/// The simulator's engine: 10 ms + 0.2 ms per sequence, prefill cheap enough not to crowd the
/// decode steps, and 2 ms per 1,000 tokens of context (4 sequences of 3,000 tokens add 24 ms).
const MODEL: Model = Model {
    step_base: Duration::from_millis(10),
    step_per_seq: Duration::from_micros(200),
    prefill_per_token: Duration::from_micros(5),
    step_per_1k_kv_tokens: Duration::from_millis(2),
    max_batch: 256,
};

/// The levels each half runs, and how long each is held.
const LEVELS: &[usize] = &[1, 2, 4, 6];
const HOLD: Duration = Duration::from_secs(3);
const OUTPUT: u64 = 120;

/// The simulator's step at `batch` sequences holding `context` tokens each: the truth.
fn truth(batch: f64, context: f64) -> f64 {
    MODEL.step_base.as_secs_f64()
        + MODEL.step_per_seq.as_secs_f64() * batch
        + MODEL.step_per_1k_kv_tokens.as_secs_f64() / 1000.0 * batch * context
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_shift_to_long_contexts_the_term_predicts_the_long_step() {
    let _turn = serial().await;
    let sim = start_sim(SimConfig {
        model: MODEL,
        ..SimConfig::default()
    })
    .await;
    let upstream = format!("http://{sim}");
    let proxy = spawn_proxy(&upstream, &["--capacity-window", "10m"]).await;
    let short = levels::driver(&proxy.url(), "context-test", 60, OUTPUT, 11);
    let long = levels::driver(&proxy.url(), "context-test", 2400, OUTPUT, 12);
    let short = levels::run(&short, LEVELS, HOLD).await;
    let long = levels::run(&long, LEVELS, HOLD).await;
    let report = proxy.capacity.next_report().await;
    let line = report.fit.expect("a decode fit");
    let term = report
        .context
        .expect("a context term: the window's contexts differ tenfold");
    // A long request's mean context over its decode: its prompt and half its answer.
    let (c_short, c_long) = (
        short.usage_prompt() + OUTPUT as f64 / 2.0,
        long.usage_prompt() + OUTPUT as f64 / 2.0,
    );
    let mut worst = (0.0f64, 0.0f64);
    for b in [2.0, 4.0, 6.0] {
        let t = truth(b, c_long);
        let alone = line.step(b);
        let with = alone + term.extra(b, b * c_long);
        let (e_alone, e_with) = (alone / t - 1.0, with / t - 1.0);
        eprintln!(
            "b={b}: truth {:.2} ms, line alone {:.2} ms ({:+.1}%), with the term {:.2} ms ({:+.1}%)",
            t * 1e3,
            alone * 1e3,
            e_alone * 100.0,
            with * 1e3,
            e_with * 100.0
        );
        worst = (worst.0.max(e_alone.abs()), worst.1.max(e_with.abs()));
    }
    eprintln!(
        "contexts {c_short:.0} and {c_long:.0} tokens; term {:.3} us per token over {} requests, mean {:.0}; worst error: line alone {:.1}%, with the term {:.1}%",
        term.per_token * 1e6,
        term.requests,
        term.mean,
        worst.0 * 100.0,
        worst.1 * 100.0
    );
    // The simulator's own slope, 2 us per token, within a quarter (the proxy sees the steps
    // through the network and the prefill stalls between them).
    assert!(
        (term.per_token / 2e-6 - 1.0).abs() < 0.25,
        "term {:.3} us per token",
        term.per_token * 1e6
    );
    assert!(worst.1 < 0.15, "with the term, {:.1}% off", worst.1 * 100.0);
    assert!(
        worst.1 < worst.0 / 2.0,
        "the term does not halve the line's error: {:.1}% against {:.1}%",
        worst.1 * 100.0,
        worst.0 * 100.0
    );
}
