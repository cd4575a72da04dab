//! Closed-loop load levels against a proxy, as `tokenmeter bench --concurrency` runs them, and
//! the edge a class's TTFT target puts among them: what the capacity tests hold the model's
//! answer to.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokenmeter_tools::bench::client::Client;
use tokenmeter_tools::bench::live::Live;
use tokenmeter_tools::bench::load::{Driver, Stop};
use tokenmeter_tools::bench::prompt::{Endpoint, RequestBuilder};

/// The bench's driver for chat requests of `prompt` words and `output` tokens through `proxy`
/// (`http://HOST:PORT`).
pub fn driver(proxy: &str, model: &str, prompt: usize, output: u64, seed: u64) -> Driver {
    Driver {
        client: Arc::new(Client::new(
            format!("{proxy}/v1"),
            None,
            Duration::from_secs(120),
        )),
        requests: Arc::new(RequestBuilder {
            endpoint: Endpoint::Chat,
            model: model.into(),
            prompt_tokens: prompt,
            shared_prefix_tokens: 0,
            output_tokens: output,
            seed,
        }),
        next_id: Arc::new(AtomicU64::new(0)),
        interrupted: Default::default(),
    }
}

/// What the levels measured at the clients.
#[derive(Debug, Default)]
pub struct Measured {
    /// Each level and its TTFT p90, seconds.
    pub p90: Vec<(usize, f64)>,
    /// The prompt tokens each response's usage stated.
    pub prompts: Vec<u64>,
}

impl Measured {
    /// The mean prompt tokens usage stated.
    pub fn usage_prompt(&self) -> f64 {
        self.prompts.iter().sum::<u64>() as f64 / self.prompts.len().max(1) as f64
    }

    /// The last level whose p90 met `ttft` seconds and the first that missed: the edge. Panics
    /// (with `why`) when every level met it (too light a case) or none did.
    pub fn edge(&self, ttft: f64, why: &str) -> (f64, f64) {
        let met = |p: f64| p <= ttft;
        let first_missed = self
            .p90
            .iter()
            .find(|(_, p)| !met(*p))
            .map(|(n, _)| *n as f64)
            .unwrap_or_else(|| panic!("every level met the class: the case is too light\n{why}"));
        let last_met = self
            .p90
            .iter()
            .take_while(|(_, p)| met(*p))
            .last()
            .map(|(n, _)| *n as f64)
            .unwrap_or_else(|| panic!("no level met the class\n{why}"));
        (last_met, first_missed)
    }
}

/// The nearest-rank `q` quantile.
pub fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Runs each of `levels` closed-loop clients for `hold`, one after the other.
pub async fn run(driver: &Driver, levels: &[usize], hold: Duration) -> Measured {
    let mut m = Measured::default();
    for &n in levels {
        let level = driver
            .run_level(n, Stop::After(hold), Arc::new(Live::default()))
            .await;
        let ttfts: Vec<f64> = level.samples.iter().filter_map(|s| s.ttft_secs()).collect();
        assert!(!ttfts.is_empty(), "level {n} measured nothing");
        m.prompts
            .extend(level.samples.iter().filter_map(|s| s.input_tokens));
        m.p90.push((n, quantile(ttfts, 0.9)));
    }
    m
}
