//! `Capped`: the one mechanism that keeps a label fed by clients bounded.
//!
//! A label whose values come from what clients send (the `model` a body names, the `tenant` a
//! header names) would otherwise mint a new series per distinct value: one client looping over
//! random names could exhaust Prometheus. `Capped` admits the first `max` distinct values it is
//! shown, for the life of the process, plus the values configured as *pinned*, which are always
//! admitted and do not count against `max`; every other value is [`OTHER`]. So a label has at
//! most `max` + pinned + the caller's fixed values (`unknown`, `none`, ...) values.
//!
//! Callers clean a value first (the model's sanitising, the tenant's charset); `Capped` only
//! counts. It is consulted once per request, never per event: a lock and a hash lookup.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The value every label value beyond the cap becomes.
pub const OTHER: &str = "other";

/// At most `max` distinct values first come, first kept, plus pinned ones; the rest [`OTHER`].
#[derive(Debug)]
pub struct Capped {
    /// The label's name, for the one log line when the cap is reached.
    label: &'static str,
    max: usize,
    /// Always admitted, never counted against `max`; fixed at start, so read without a lock.
    pinned: HashSet<Arc<str>>,
    seen: Mutex<HashSet<Arc<str>>>,
    /// The cap was reached and said so in the log (once: a full cap is a steady state).
    full: AtomicBool,
}

impl Capped {
    /// A cap of `max` values first seen, beside the `pinned` ones.
    pub fn new(label: &'static str, max: usize, pinned: impl IntoIterator<Item = String>) -> Self {
        Capped {
            label,
            max,
            pinned: pinned.into_iter().map(Arc::from).collect(),
            seen: Mutex::new(HashSet::new()),
            full: AtomicBool::new(false),
        }
    }

    /// The label value `value` gets: its own (shared, so a known value costs no allocation)
    /// when pinned, already seen or the cap has room, else `None` (the caller writes
    /// [`OTHER`]).
    pub fn admit(&self, value: &str) -> Option<Arc<str>> {
        if let Some(p) = self.pinned.get(value) {
            return Some(Arc::clone(p));
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = seen.get(value) {
            return Some(Arc::clone(s));
        }
        if seen.len() < self.max {
            let v: Arc<str> = Arc::from(value);
            seen.insert(Arc::clone(&v));
            return Some(v);
        }
        drop(seen);
        if !self.full.swap(true, Ordering::Relaxed) {
            // The value itself is never logged: it is client input (a tenant header's value).
            tracing::warn!(
                label = self.label,
                max = self.max,
                "label cap reached: further values of this label are counted as \"other\""
            );
        }
        None
    }

    /// [`Capped::admit`], with [`OTHER`] for a value beyond the cap.
    pub fn label(&self, value: &str) -> Arc<str> {
        self.admit(value).unwrap_or_else(|| Arc::from(OTHER))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_max_values_and_the_pinned_ones_get_their_own() {
        let c = Capped::new("t", 2, ["vip".to_string()]);
        assert_eq!(&*c.label("a"), "a");
        assert_eq!(&*c.label("b"), "b");
        assert_eq!(&*c.label("c"), OTHER);
        // Seen before the cap filled: still its own. Pinned: its own after the cap filled,
        // and it took no place in it.
        assert_eq!(&*c.label("a"), "a");
        assert_eq!(&*c.label("vip"), "vip");
        assert_eq!(&*c.label("d"), OTHER);
        assert_eq!(c.seen.lock().expect("lock").len(), 2);
    }

    #[test]
    fn a_known_value_is_the_same_allocation() {
        let c = Capped::new("t", 4, ["vip".to_string()]);
        let a = c.label("a");
        assert!(Arc::ptr_eq(&a, &c.label("a")));
        assert!(Arc::ptr_eq(&c.label("vip"), &c.label("vip")));
    }
}
