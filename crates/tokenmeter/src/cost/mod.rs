//! Who pays for the GPU: every second of every GPU behind the proxy, split among the requests
//! in flight as it is spent, or idle, so that per-tenant and per-model GPU time adds up to the
//! bill and no request is charged more than the GPUs it was on while it was in flight.
//!
//! Under continuous batching one decode step serves the whole batch, and a long prompt costs
//! prefill compute a short one does not, so token counts split the GPU badly. The rule
//! (docs/cost.md states it for users, and the simulator's truth, `tools::sim::account`, keeps
//! it step by step):
//!
//! - a decode step's fixed part is shared by the sequences in it, its per-sequence part goes
//!   to each;
//! - prefill (the fitted cost per uncached prompt token) goes to the request whose prompt it is;
//! - a request's part of the step that makes its first token is `prefill`, of later steps
//!   `decode`;
//! - a second with nothing in flight is idle.
//!
//! The proxy does not see the engine's steps, but it sees when each request enters, makes its
//! first token and leaves, and the capacity model measures what a step and a prompt token cost
//! ([`Rates`]). The [`ledger`] applies the rule between those events, as the time passes: each
//! moment's busy time goes to the requests in flight then, by their weight in the step. What
//! it cannot know yet, a prompt's length before it is counted, is [`estimate`]d from the
//! request's body and settled when the count comes.
//!
//! The files: `ledger.rs`, the books, integrated between a request's events and never per chunk,
//! idle counted per replica; `rates.rs`, what the split reads of the engine (a step's cost at a
//! batch, prefill per token), published by the capacity model at each refit
//! (`Capacity::publish_rates`, on the model's own clock); `estimate.rs`, a prompt's tokens from its
//! body's bytes, at a ratio learnt from the counts, until the tokenizer or the usage report settles
//! it; `seconds.rs`, GPU-seconds by phase. The meter holds each request's `Ticket` and charges it
//! once, after it leaves (`Ledger::charge`); the charge rides on the `Finished` record to the
//! counters, the request log and the span.

pub mod estimate;
pub mod ledger;
pub mod rates;
pub mod seconds;

pub use ledger::{Balance, Book, Held, Labels, Ledger, Prompt, Ticket};
pub use rates::{Rates, Step};
pub use seconds::GpuSeconds;
