//! The one integration-test binary: each module tests one area through real sockets.

mod support;

mod cli;
mod faults;
mod props;
mod proxy;
