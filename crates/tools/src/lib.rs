//! The tools beside the product: each a subcommand of the one binary, none on the request path.
//!
//! They may use the product (the demo runs the real [`tokenmeter::server`]; the bench and the
//! capacity command read the metric names of [`tokenmeter::metrics`]); the product never imports
//! them: it is a crate that does not depend on this one.
//!
//! - [`sim`]: `tokenmeter sim`, a simulated inference server, the test instrument.
//! - [`bench`](mod@bench): `tokenmeter bench`, a load generator that measures any
//!   OpenAI-compatible server.
//! - [`demo`]: `tokenmeter demo`, the simulator, the proxy and a ramping load in one process.
//! - [`capacity_command`]: `tokenmeter capacity`, the live capacity model read back from
//!   `/metrics`, drawn with the bench's charts; with `--trace`, a recorded traffic replayed on
//!   the engine it fitted, at rate multiples.
//! - [`exposition`]: the product's reader of a `/metrics` text ([`tokenmeter::exposition`]), re-exported
//!   under the tools for their callers; [`scrape`] fetches one.
//! - [`trace`]: a workload trace read back (the Mooncake lines `--workload-log` writes), for the
//!   bench's and the capacity command's `--trace`.

pub mod bench;
pub mod capacity_command;
pub mod cost_command;
pub mod demo;
pub use tokenmeter::exposition;
pub mod scrape;
pub mod sim;
pub mod trace;
