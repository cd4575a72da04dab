//! One budget for a connection's first request head: `--header-read-timeout` from accept.
//!
//! Before hyper reads a head, the server may wait for a TLS handshake and for the first bytes
//! that tell the HTTP version ([`super::version`]), each within the timeout. hyper's own timer
//! then starts when it first asks for the head, so a client that took its time over the first
//! bytes got the timeout a second time. [`HeadTimer`] is hyper's timer for one HTTP/1
//! connection, and the first time hyper asks it for the time (to set the first head's deadline)
//! it answers with the instant the connection was accepted: the whole wait, handshake, first
//! bytes and head, ends at `--header-read-timeout` after accept. Later heads (keep-alive) get
//! the whole timeout from the end of the response before them, as before.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};
use hyper_util::rt::TokioTimer;

/// hyper's timer for an HTTP/1 connection, whose first reading of the time is the accept.
#[derive(Debug)]
pub struct HeadTimer {
    accepted: Instant,
    first: AtomicBool,
}

impl HeadTimer {
    pub fn new(accepted: Instant) -> Self {
        HeadTimer {
            accepted,
            first: AtomicBool::new(true),
        }
    }
}

impl Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        TokioTimer::new().sleep(duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        TokioTimer::new().sleep_until(deadline)
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn Sleep>>, new_deadline: Instant) {
        TokioTimer::new().reset(sleep, new_deadline)
    }

    // hyper's HTTP/1 server reads the time only to set a head's deadline.
    fn now(&self) -> Instant {
        if self.first.swap(false, Ordering::Relaxed) {
            self.accepted
        } else {
            Instant::now()
        }
    }
}

/// What is left of a budget that ends at `deadline` (zero once it has passed).
pub fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reading_is_the_accept_and_the_next_ones_are_now() {
        let accepted = Instant::now() - Duration::from_secs(3);
        let t = HeadTimer::new(accepted);
        assert_eq!(t.now(), accepted);
        let later = t.now();
        assert!(later >= accepted + Duration::from_secs(3));
        assert!(t.now() >= later);
    }
}
