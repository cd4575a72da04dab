//! The one integration-test binary: each module tests one area through real sockets.

mod support;

mod bench;
mod capacity;
mod cgroup;
mod cli;
mod compat;
mod corpus;
mod cost;
mod crowd;
mod documented;
mod engine_view;
mod faults;
mod first_token_capacity;
mod hostile;
mod https;
mod inject;
mod listener;
mod lockstep;
mod memory_capacity;
mod overload;
mod pool;
mod props;
mod proxy;
mod queue_or_shed;
mod reqlog;
mod sim;
mod slo;
mod tenant;
mod timings;
mod tls;
mod tracing;
mod ui;
mod upgrade;
mod wire;
mod wire_kv;
