//! The crate's boxed error: what a body, a connector or a layer yields when the error's type is
//! not the caller's business (hyper, hyper-util and tower all take `Into<BoxError>`).
//!
//! A leaf: it imports nothing of the crate, so any module may name it without an arrow up.

/// Any error that can cross tasks; the one spelling of it in the crate.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
