//! The tools' integration tests, one binary: the simulator (`sim`) through its HTTP endpoints,
//! and the load generator (`bench`) against scripted upstreams, the simulator and a proxy. The
//! support they share with the root package's tests is the `tokenmeter-testkit` crate; the
//! tests that need the `tokenmeter` binary itself are the root package's (`tests/it/commands.rs`).

use tokenmeter_testkit as support;

mod bench;
mod sim;
