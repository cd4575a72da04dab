//! The metrics listener's connection cap (`--metrics-max-connections`), which a crowd of idle
//! or trickling clients cannot use to lock Prometheus out.
//!
//! The proxy listener closes a new connection past `--max-connections`: its clients are the
//! traffic, and a closed connection tells a load balancer to go elsewhere. On the metrics
//! listener that rule would hand the port to whoever holds the most connections: in a cluster
//! anyone on the pod network can open a few thousand and leave them idle, and Prometheus, the
//! page and the kubelet's `/readyz` probe would then be refused until those timed out. So at
//! the cap a new connection is taken and the one that has been **idle longest** (between
//! requests, or never sent one) is closed to make room; the new one is refused only when every
//! open connection is inside a request, which on this listener lasts as long as rendering the
//! exposition. Either way one connection is shed and counted
//! (`tokenmeter_metrics_connections_shed_total`). A scraper that loses its kept-alive connection
//! to a crowd connects again, and its new connection is never the idlest one.
//!
//! What a held connection may cost is bounded twice: by the cap, and by
//! `--header-read-timeout`, after which a connection that has not sent its next head is closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// The metrics listener's open connections, at most `cap` of them.
#[derive(Debug)]
pub struct AdminCap {
    cap: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    /// The open connections by id.
    conns: HashMap<u64, Entry>,
    /// The next connection's id; also the clock that orders idleness (a later value is more
    /// recent), so no system time is read per request.
    next: u64,
}

#[derive(Debug)]
struct Entry {
    /// In a request now: never shed.
    busy: bool,
    /// When the connection last became idle, on [`Open::next`]'s clock.
    idle_since: u64,
    /// Closes the connection when notified.
    close: Arc<Notify>,
}

/// One open connection's place under the cap, given back on drop.
#[derive(Debug)]
pub struct Place {
    cap: Arc<AdminCap>,
    id: u64,
    /// Notified when this connection is shed to make room for a newer one.
    pub close: Arc<Notify>,
}

/// What [`AdminCap::admit`] did with a new connection.
#[derive(Debug)]
pub enum Admitted {
    /// Under the cap: nothing shed.
    Room(Place),
    /// At the cap: the idlest connection was told to close, and this one has its place.
    Displaced(Place),
    /// At the cap with every connection in a request: this one is to be closed.
    Refused,
}

impl AdminCap {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(AdminCap {
            cap: cap.max(1),
            open: Mutex::new(Open::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // The lock guards plain bookkeeping that no panic can leave half-written.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connections open now.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.lock().conns.len()
    }

    /// Gives a new connection its place, shedding the idlest one at the cap.
    pub fn admit(self: &Arc<Self>) -> Admitted {
        let mut open = self.lock();
        let displaced = if open.conns.len() < self.cap {
            false
        } else {
            // A scan of at most `cap` entries, only while the cap is reached.
            let idlest = open
                .conns
                .iter()
                .filter(|(_, e)| !e.busy)
                .min_by_key(|(_, e)| e.idle_since)
                .map(|(id, _)| *id);
            let Some(id) = idlest else {
                return Admitted::Refused;
            };
            if let Some(e) = open.conns.remove(&id) {
                // `notify_one` keeps the wake-up if the connection is not waiting yet.
                e.close.notify_one();
            }
            true
        };
        let id = open.next;
        open.next += 1;
        let close = Arc::new(Notify::new());
        open.conns.insert(
            id,
            Entry {
                busy: false,
                idle_since: id,
                close: Arc::clone(&close),
            },
        );
        let place = Place {
            cap: Arc::clone(self),
            id,
            close,
        };
        if displaced {
            Admitted::Displaced(place)
        } else {
            Admitted::Room(place)
        }
    }

    fn set_busy(&self, id: u64, busy: bool) {
        let mut open = self.lock();
        let now = open.next;
        open.next += 1;
        if let Some(e) = open.conns.get_mut(&id) {
            e.busy = busy;
            e.idle_since = now;
        }
    }
}

impl Place {
    /// Marks the connection as in a request until the guard drops.
    pub fn busy(&self) -> Busy {
        self.cap.set_busy(self.id, true);
        Busy {
            cap: Arc::clone(&self.cap),
            id: self.id,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // Already gone if this connection was shed.
        self.cap.lock().conns.remove(&self.id);
    }
}

/// A request in progress on a connection: the connection is not shed meanwhile.
#[derive(Debug)]
pub struct Busy {
    cap: Arc<AdminCap>,
    id: u64,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.cap.set_busy(self.id, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(a: Admitted) -> Place {
        match a {
            Admitted::Room(p) | Admitted::Displaced(p) => p,
            Admitted::Refused => panic!("refused"),
        }
    }

    #[tokio::test]
    async fn at_the_cap_the_idlest_connection_gives_way_and_a_busy_one_never_does() {
        let cap = AdminCap::new(3);
        let a = place(cap.admit());
        let b = place(cap.admit());
        let c = place(cap.admit());
        assert_eq!(cap.open(), 3);
        // `a` served a request after `b` and `c` connected: `b` is now the idlest.
        drop(a.busy());
        let d = cap.admit();
        assert!(matches!(d, Admitted::Displaced(_)), "{d:?}");
        assert_eq!(cap.open(), 3);
        // `b` was told to close (the notification waits for it), the others were not.
        tokio::time::timeout(std::time::Duration::from_secs(5), b.close.notified())
            .await
            .expect("b is closed");
        // b's own drop later finds its place already gone.
        drop(b);
        assert_eq!(cap.open(), 3);
        // With every open connection in a request, a new one is refused.
        let d = place(d);
        let _busy = [a.busy(), c.busy(), d.busy()];
        assert!(matches!(cap.admit(), Admitted::Refused));
        assert_eq!(cap.open(), 3);
    }

    #[test]
    fn under_the_cap_nothing_is_shed_and_a_drop_gives_the_place_back() {
        let cap = AdminCap::new(2);
        let a = place(cap.admit());
        assert!(matches!(cap.admit(), Admitted::Room(_)));
        // The `Room` above was dropped at once: its place is back.
        assert_eq!(cap.open(), 1);
        drop(a);
        assert_eq!(cap.open(), 0);
    }
}
