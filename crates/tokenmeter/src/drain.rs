//! What the drain waits for: the open proxy connections, counted, and the deadline after which
//! what is left is cut.
//!
//! The server counts a connection from accept until its task ends. An upgraded connection (a
//! WebSocket) leaves hyper's connection task when it is handed over, so the code that joins it
//! to the upstream takes a place in the same count with [`Drain::hold`] for as long as the two
//! are joined, and ends them at [`Drain::deadline`]. The server lends a [`Drain`] to every
//! request in its extensions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Notify};

/// The crowded flag's bit in [`Connections`]' state word; the bits below it are the count.
const CROWDED: usize = 1 << (usize::BITS - 1);

/// Counts open connections, wakes the drain when the last one closes, and says when they are
/// near `--max-connections` (what `/readyz` reports).
///
/// Crowding has hysteresis, as the in-flight cap's overload has ([`crate::overload`]): the
/// count turns crowded at 95% of the cap, so a Service stops sending new connections before the
/// last ones are taken and closed at accept, and uncrowded only at 90%, so a pod near its limit
/// does not flap in and out of the endpoints with every connection that closes. The count and
/// the flag change together, in one atomic word.
#[derive(Debug)]
pub struct Connections {
    /// The count in the low bits, [`CROWDED`] on top.
    state: AtomicUsize,
    /// Crowded from this many open connections on.
    crowded_at: usize,
    /// Uncrowded again at or below this many.
    eased_at: usize,
    closed: Notify,
}

impl Default for Connections {
    /// A count with no cap: never crowded.
    fn default() -> Self {
        Connections::with_cap(CROWDED - 1)
    }
}

impl Connections {
    /// A count of connections under a cap of `cap` (at least 1).
    pub fn with_cap(cap: usize) -> Self {
        let cap = cap.clamp(1, CROWDED - 1);
        Connections {
            state: AtomicUsize::new(0),
            crowded_at: cap - cap / 20,
            eased_at: cap / 10 * 9 + cap % 10 * 9 / 10,
            closed: Notify::new(),
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.state.load(Ordering::SeqCst) & !CROWDED
    }

    /// Whether new connections should go elsewhere: 95% of the cap was reached and the count
    /// has not yet fallen to 90%.
    pub fn is_crowded(&self) -> bool {
        self.state.load(Ordering::SeqCst) & CROWDED != 0
    }

    /// Counts one more open connection until the guard drops.
    pub fn hold(self: &Arc<Self>) -> Held {
        let _ = self
            .state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                let count = (s & !CROWDED) + 1;
                let flag = if count >= self.crowded_at {
                    CROWDED
                } else {
                    s & CROWDED
                };
                Some(count | flag)
            });
        Held(Arc::clone(self))
    }

    /// Completes when no connection is open.
    pub async fn all_closed(&self) {
        loop {
            let notified = self.closed.notified();
            if self.open() == 0 {
                return;
            }
            notified.await;
        }
    }

    fn release(&self) {
        let mut left = 0;
        let _ = self
            .state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                left = (s & !CROWDED).saturating_sub(1);
                let flag = if left <= self.eased_at {
                    0
                } else {
                    s & CROWDED
                };
                Some(left | flag)
            });
        if left == 0 {
            self.closed.notify_waiters();
        }
    }
}

/// One place in the count of open connections, given back on drop, however the holder ends.
#[derive(Debug)]
pub struct Held(Arc<Connections>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// The server's drain as a request sees it.
#[derive(Debug, Clone)]
pub struct Drain {
    conns: Arc<Connections>,
    cut: watch::Receiver<bool>,
}

impl Drain {
    pub fn new(conns: Arc<Connections>, cut: watch::Receiver<bool>) -> Self {
        Drain { conns, cut }
    }

    /// Counts the caller as an open connection until the guard drops.
    pub fn hold(&self) -> Held {
        self.conns.hold()
    }

    /// Completes when the drain timeout has passed and what is left must close, or when the
    /// server is gone.
    pub async fn deadline(mut self) {
        let _ = self.cut.wait_for(|c| *c).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_count_follows_the_guards_and_wakes_at_zero() {
        let conns = Arc::new(Connections::default());
        let (a, b) = (conns.hold(), conns.hold());
        assert_eq!(conns.open(), 2);
        drop(a);
        assert_eq!(conns.open(), 1);
        let waiter = {
            let conns = Arc::clone(&conns);
            tokio::spawn(async move { conns.all_closed().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        waiter.await.expect("woken at zero");
        assert_eq!(conns.open(), 0);
    }

    #[test]
    fn crowded_from_95_percent_of_the_cap_until_back_at_90() {
        let conns = Arc::new(Connections::with_cap(100));
        let mut held: Vec<_> = (0..94).map(|_| conns.hold()).collect();
        assert!(!conns.is_crowded(), "94 of 100");
        held.push(conns.hold());
        assert!(conns.is_crowded(), "95 of 100");
        held.truncate(91);
        assert!(conns.is_crowded(), "91 of 100: not yet eased");
        held.truncate(90);
        assert!(!conns.is_crowded(), "90 of 100");
        assert_eq!(conns.open(), 90);
        // A cap of 1 is crowded by its one connection and eased when it closes.
        let one = Arc::new(Connections::with_cap(1));
        let h = one.hold();
        assert!(one.is_crowded());
        drop(h);
        assert!(!one.is_crowded());
        // No cap: never crowded.
        let free = Arc::new(Connections::default());
        let _h: Vec<_> = (0..1000).map(|_| free.hold()).collect();
        assert!(!free.is_crowded());
    }

    #[tokio::test]
    async fn the_deadline_fires_when_cut() {
        let (tx, rx) = watch::channel(false);
        let drain = Drain::new(Arc::default(), rx);
        let d = tokio::spawn(drain.deadline());
        tokio::task::yield_now().await;
        assert!(!d.is_finished());
        tx.send(true).expect("send");
        d.await.expect("deadline");
    }
}
