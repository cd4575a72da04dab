//! A log line per cause and period, not per request.
//!
//! When an upstream's certificate expires, every request fails the same way; a warning per
//! request would bury the log (and the disk) under identical lines at the request rate. A
//! [`RateLimited`] lets the first occurrence of each cause through, stays quiet for the rest of
//! its period, and reports how many it held back when the cause next gets through. The keys come
//! from a closed set (an enum or `&'static str`), so the table is bounded by that set.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often one cause may be logged: once a minute is enough to see that a problem goes on
/// and when it started, and few enough lines that a request rate never shows in the log volume.
pub const LOG_PERIOD: Duration = Duration::from_secs(60);

/// Decides, per key, whether this occurrence is logged.
#[derive(Debug)]
pub struct RateLimited<K> {
    period: Duration,
    seen: Mutex<HashMap<K, Slot>>,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    logged_at: Instant,
    held_back: u64,
}

impl<K: Eq + Hash + Copy> RateLimited<K> {
    /// One line per key and `period`.
    pub fn new(period: Duration) -> Self {
        RateLimited {
            period,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// `Some(held_back)` when this occurrence should be logged (with how many occurrences of
    /// the same key were not logged since the last line), `None` when it should not.
    pub fn check(&self, key: K, now: Instant) -> Option<u64> {
        // A panic elsewhere while the lock was held leaves a table that is still valid.
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match seen.get_mut(&key) {
            Some(slot) if now.saturating_duration_since(slot.logged_at) < self.period => {
                slot.held_back += 1;
                None
            }
            Some(slot) => {
                let held = slot.held_back;
                *slot = Slot {
                    logged_at: now,
                    held_back: 0,
                };
                Some(held)
            }
            None => {
                seen.insert(
                    key,
                    Slot {
                        logged_at: now,
                        held_back: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

impl<K: Eq + Hash + Copy> Default for RateLimited<K> {
    fn default() -> Self {
        RateLimited::new(LOG_PERIOD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_key_and_period_with_the_count_held_back() {
        let log = RateLimited::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(log.check("expired", at(0)), Some(0));
        assert_eq!(log.check("expired", at(1)), None);
        assert_eq!(log.check("expired", at(59)), None);
        // Another cause has its own period.
        assert_eq!(log.check("untrusted", at(30)), Some(0));
        assert_eq!(log.check("expired", at(60)), Some(2));
        assert_eq!(log.check("expired", at(61)), None);
        assert_eq!(log.check("untrusted", at(89)), None);
        assert_eq!(log.check("untrusted", at(90)), Some(1));
        assert_eq!(log.check("expired", at(200)), Some(1));
    }

    #[test]
    fn a_clock_reading_older_than_the_last_line_is_held_back() {
        let log = RateLimited::new(Duration::from_secs(60));
        let t0 = Instant::now() + Duration::from_secs(10);
        assert_eq!(log.check(1u8, t0), Some(0));
        assert_eq!(log.check(1u8, t0 - Duration::from_secs(5)), None);
    }
}
