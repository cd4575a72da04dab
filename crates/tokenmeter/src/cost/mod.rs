//! Who pays for the GPU: every second of every GPU behind the proxy, assigned to the requests
//! it served or to idle, so that per-tenant and per-model GPU time adds up to the bill.
//!
//! Under continuous batching one decode step serves the whole batch, and a long prompt costs
//! prefill compute a short one does not, so token counts split the GPU badly. The rule
//! (docs/cost.md states it for users, and the simulator's truth, `tools::sim::account`, keeps
//! it step by step):
//!
//! - a decode step's fixed part (the fitted `base`) is shared by the sequences in it, its
//!   per-sequence part goes to each;
//! - prefill (the fitted cost per uncached prompt token) goes to the request whose prompt it is;
//! - a request's part of the step that makes its first token is `prefill`, of later steps
//!   `decode`;
//! - a second with nothing in flight is idle.
//!
//! The proxy sees each request's tokens, prompt and the concurrency it ran at, and the capacity
//! model fits the step's cost, so it prices each request by the rule when it ends
//! ([`price`]). Prices come from a fit and the wire is not the engine, so the [`ledger`] keeps
//! the books exact: the busy time of the GPUs is a pool each finished request draws its price
//! from (scaled by how the recent prices compared with the time they had to cover), and the
//! last request out of a busy period takes what is left. So the charges plus idle add up to
//! `--gpus` x wall time whatever the model's error; what is in the pool at any instant belongs
//! to the requests still in flight (`tokenmeter_gpu_unassigned_seconds`).
//!
//! Until the capacity model has a fit, a request's price is its equal share of the time it was
//! in flight (Replicate's `time_share`), its part before the first token `prefill`.

pub mod ledger;
pub mod price;
pub mod seconds;

pub use ledger::{Clock, Ledger, Totals};
pub use price::{Facts, Prices};
pub use seconds::GpuSeconds;
