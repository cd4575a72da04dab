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

/// Counts open connections, and wakes the drain when the last one closes.
#[derive(Debug, Default)]
pub struct Connections {
    open: AtomicUsize,
    closed: Notify,
}

impl Connections {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Counts one more open connection until the guard drops.
    pub fn hold(self: &Arc<Self>) -> Held {
        self.open.fetch_add(1, Ordering::SeqCst);
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
}

/// One place in the count of open connections, given back on drop, however the holder ends.
#[derive(Debug)]
pub struct Held(Arc<Connections>);

impl Drop for Held {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.closed.notify_waiters();
        }
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
