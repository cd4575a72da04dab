//! How long a step takes: the performance model of the simulated GPU, which the engine runs
//! its steps by and the accounts split each step's time by. A file of its own so that both
//! read it without reading each other.

use std::time::Duration;

/// How long a step takes: the performance model of the simulated GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Model {
    /// Fixed cost of a decode step (reading the weights once).
    pub step_base: Duration,
    /// Added per sequence in the batch (its KV cache reads and its share of the compute).
    pub step_per_seq: Duration,
    /// Prefill cost per prompt token, charged to the step that admits the prompt.
    pub prefill_per_token: Duration,
    /// Added per 1,000 tokens of context the running sequences hold (prompt and what they
    /// have made): attention reads each sequence's KV every step, so long contexts make every
    /// step slower. Zero by default, as the fits assume.
    pub step_per_1k_kv_tokens: Duration,
    /// Sequences decoded at once; the rest queue.
    pub max_batch: usize,
}

impl Model {
    /// The duration of a step with `batch` sequences that admits `prefill_tokens` prompt tokens.
    pub fn step(&self, batch: usize, prefill_tokens: u64) -> Duration {
        self.step_with_context(batch, prefill_tokens, 0)
    }

    /// [`Model::step`] when the running sequences hold `kv_tokens` tokens of context.
    pub fn step_with_context(&self, batch: usize, prefill_tokens: u64, kv_tokens: u64) -> Duration {
        let nanos = |d: Duration| d.as_nanos().min(u128::from(u64::MAX)) as u64;
        let total = nanos(self.step_base)
            .saturating_add(nanos(self.step_per_seq).saturating_mul(batch as u64))
            .saturating_add(nanos(self.prefill_per_token).saturating_mul(prefill_tokens))
            .saturating_add(nanos(self.step_per_1k_kv_tokens).saturating_mul(kv_tokens) / 1000);
        Duration::from_nanos(total)
    }

    /// Tokens/s one sequence sees in a steady batch of `batch` (no prefill).
    pub fn request_tps(&self, batch: usize) -> f64 {
        1.0 / self.step(batch.min(self.max_batch), 0).as_secs_f64()
    }

    /// Tokens/s summed over a steady batch of `batch` (no prefill); flat beyond `max_batch`.
    pub fn aggregate_tps(&self, batch: usize) -> f64 {
        let b = batch.min(self.max_batch);
        b as f64 * self.request_tps(b)
    }
}
