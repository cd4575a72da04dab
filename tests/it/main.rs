//! The one integration-test binary: each module tests one area through real sockets.

mod support;

mod bench;
mod cli;
mod corpus;
mod faults;
mod inject;
mod pool;
mod props;
mod proxy;
mod sim;
