//! The one integration-test binary: each module tests one part end to end.

mod sim;
