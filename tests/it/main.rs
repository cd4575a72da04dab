//! The one integration-test binary: every module here runs against real sockets on 127.0.0.1.

// A test that unwraps fails loudly, which is its job.
#![allow(clippy::unwrap_used)]

mod bench;
