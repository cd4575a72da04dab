//! The waker an upstream connection is polled with while its response body drives it.
//!
//! A [`PooledBody`](super::PooledBody) polls its connection's future (hyper's client dispatcher)
//! and then hyper's response body, both from the client connection's task. hyper hands each
//! chunk from the one to the other through a channel whose two ends wake the task that polls
//! them: the body's end when a chunk arrives after it returned `Pending`, the dispatcher's end
//! when the body takes the chunk it was parked on. With the task's own waker both wakes come
//! from inside the task's own poll, so tokio polls the whole client connection once more for
//! nothing: two polls of the task for every chunk, where the socket's one wake would do (a count
//! over 100 paced streams: 2.0 polls of the task and 4.0 polls of the body per chunk).
//!
//! So the connection is polled with a [`Signal`] instead, and hyper's body with a waker that does
//! nothing (only the connection's polls, all made here, feed it). A wake while the body is
//! being polled is only noted, and the body polls the connection once more before it returns;
//! a wake at any other time (the socket became readable) is noted and wakes the task. The body
//! polls the connection only when it was woken since its last poll, so hyper's server, which
//! polls the body twice per poll of its own, pays for one.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

use atomic_waker::AtomicWaker;

/// The body is polling the connection: a wake now is seen before the poll returns.
const POLLING: u8 = 1;
/// The connection was woken and has not been polled since.
const WOKEN: u8 = 2;

/// One connection's wake-ups: whether it asked to be polled, and the task to wake when it asks
/// while nobody is polling.
pub(super) struct Signal {
    state: AtomicU8,
    task: AtomicWaker,
}

impl Signal {
    /// A signal, and the waker that sets it, for a new connection.
    pub(super) fn new() -> (Arc<Signal>, Waker) {
        let signal = Arc::new(Signal {
            state: AtomicU8::new(WOKEN),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(Arc::clone(&signal));
        (signal, waker)
    }

    /// Marks the connection as woken: the next poll polls it. For a connection the task polled
    /// with its own waker (while the request was sent), whose registrations are not the signal's.
    pub(super) fn set(&self) {
        self.state.fetch_or(WOKEN, Ordering::AcqRel);
    }

    /// A poll from `task` begins. True when the connection was woken since the last poll ended.
    pub(super) fn begin(&self, task: &Waker) -> bool {
        self.task.register(task);
        self.state.swap(POLLING, Ordering::AcqRel) & WOKEN != 0
    }

    /// The poll would return `Pending`. True when it may: nothing woke the connection while it
    /// was polled. False when something did; the wake is taken, and the caller polls it again.
    pub(super) fn settle(&self) -> bool {
        match self
            .state
            .compare_exchange(POLLING, 0, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(_) => {
                self.state.store(POLLING, Ordering::Release);
                false
            }
        }
    }

    /// The poll returns with something to give, or gives up its turn: a wake noted meanwhile is
    /// kept for the next poll, which the caller's caller makes (it polls again after a frame) or
    /// the task's wake brings.
    pub(super) fn end(&self) {
        self.state.fetch_and(!POLLING, Ordering::AcqRel);
    }
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.state.fetch_or(WOKEN, Ordering::AcqRel) & POLLING == 0 {
            self.task.wake();
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A task's waker that counts its wakes (the pool's tests use it too).
    #[derive(Default)]
    pub struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Count {
        pub fn seen(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// A counted task's waker.
    pub fn task() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        (count, waker)
    }

    #[test]
    fn a_new_connection_is_polled_first() {
        let (_, task) = task();
        let (signal, _) = Signal::new();
        assert!(signal.begin(&task));
        assert!(signal.settle());
        assert!(!signal.begin(&task), "nothing woke it since");
    }

    #[test]
    fn a_wake_during_the_poll_is_kept_and_does_not_wake_the_task() {
        let (count, task) = task();
        let (signal, waker) = Signal::new();
        signal.begin(&task);
        waker.wake_by_ref();
        assert!(!signal.settle(), "the caller polls again");
        assert!(signal.settle(), "and then may return Pending");
        assert_eq!(count.seen(), 0);
    }

    #[test]
    fn a_wake_between_polls_wakes_the_task_and_marks_the_connection() {
        let (count, task) = task();
        let (signal, waker) = Signal::new();
        signal.begin(&task);
        assert!(signal.settle());
        waker.wake_by_ref();
        assert_eq!(count.seen(), 1);
        assert!(signal.begin(&task));
    }

    #[test]
    fn a_wake_during_a_poll_that_gives_a_frame_is_kept_for_the_next() {
        let (count, task) = task();
        let (signal, waker) = Signal::new();
        signal.begin(&task);
        waker.wake_by_ref();
        signal.end();
        assert_eq!(count.seen(), 0);
        assert!(signal.begin(&task));
    }

    #[test]
    fn set_marks_without_waking() {
        let (count, task) = task();
        let (signal, _) = Signal::new();
        signal.begin(&task);
        assert!(signal.settle());
        signal.set();
        assert_eq!(count.seen(), 0);
        assert!(signal.begin(&task));
    }
}
