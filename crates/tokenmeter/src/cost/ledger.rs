//! The books: every GPU-second behind the proxy is idle, charged to a finished request, or
//! unassigned (held by requests still in flight), and the three add up to `--gpus` x the wall
//! time since the proxy started, exactly, whatever the prices' error.
//!
//! The concurrency tracker (`meter::concurrency`) already divides time exactly: into idle, and
//! each request's equal share of the time it was in flight. The busy time is the pool. A
//! finished request draws its price from it, scaled by `kappa`: how the time shares of the
//! requests charged recently compared with their prices (over the last minute, or the busy
//! period since the last moment of quiet), so a fit that prices the whole too low or too high
//! still hands out the time there was, in the proportions it says. The last request out of a
//! busy period takes what is left: errors never pile up past a moment of quiet, and at such a
//! moment the charges are exactly the busy time.
//!
//! Why not split each moment among the requests in flight by their prices as they go? A
//! request's price is known only when it ends (its prompt's length comes with the usage at the
//! end of the stream), and the time shares of the requests still in flight overstate the
//! engine's work for them whenever a long prefill stretched their steps; scaling by them
//! undercharged long prompts by 15% against the simulator's truth (tests/it/cost.rs).

use std::sync::Mutex;

use super::seconds::GpuSeconds;

/// The time the books divide, at one instant: what the concurrency tracker
/// (`meter::concurrency`) reads, in seconds since it started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clock {
    /// Seconds since the tracker started.
    pub age: f64,
    /// Of those, seconds with nothing in flight.
    pub idle: f64,
    /// Requests in flight now.
    pub in_flight: u64,
}

/// How far back prices are compared with time shares: long enough to hold many requests,
/// short enough to follow a refit or a change of traffic within minutes.
const RATIO_WINDOW_SECS: f64 = 60.0;

/// The ratio of time shares to prices is taken within this factor of 1: beyond it the fit is
/// wrong, and the pool, not one request's charge, absorbs it.
const RATIO_LIMIT: f64 = 4.0;

/// The GPUs' time, kept as a pool the finished requests are charged from.
#[derive(Debug)]
pub struct Ledger {
    gpus: f64,
    pool: Mutex<Pool>,
}

#[derive(Debug, Default)]
struct Pool {
    /// GPU-seconds charged to finished requests.
    charged: f64,
    /// Requests that left the in-flight count and are not charged yet.
    pending: u64,
    /// Over the recent window (weights decaying with age): the time shares and the prices of
    /// the requests charged, and when they were last decayed (tracker seconds).
    window_shares: f64,
    window_prices: f64,
    window_at: f64,
}

/// The books at one instant, in GPU-seconds since the proxy started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Totals {
    /// `--gpus` x the wall time.
    pub wall: f64,
    /// Time with nothing in flight.
    pub idle: f64,
    /// Charged to finished requests.
    pub charged: f64,
    /// Busy time not charged yet: held by the requests in flight (never below 0).
    pub unassigned: f64,
}

impl Ledger {
    pub fn new(gpus: f64) -> Self {
        Ledger {
            gpus: gpus.max(0.0),
            pool: Mutex::new(Pool::default()),
        }
    }

    pub fn gpus(&self) -> f64 {
        self.gpus
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request left the in-flight count; its charge follows ([`Ledger::charge`]). Until
    /// then the pool is not handed to anyone as the last one out.
    pub fn left(&self) {
        self.pool().pending += 1;
    }

    /// Charges a request that has left: `price` by the rule, `share` its time share, `now` the
    /// tracker read after it left. Returns the charge.
    pub fn charge(&self, price: GpuSeconds, share: GpuSeconds, now: &Clock) -> GpuSeconds {
        let busy = self.gpus * (now.age - now.idle).max(0.0);
        let mut p = self.pool();
        p.pending = p.pending.saturating_sub(1);
        let decay = (-(now.age - p.window_at).max(0.0) / RATIO_WINDOW_SECS).exp();
        p.window_shares = p.window_shares * decay + share.total();
        p.window_prices = p.window_prices * decay + price.total();
        p.window_at = p.window_at.max(now.age);
        let available = (busy - p.charged).max(0.0);
        let amount = if now.in_flight == 0 && p.pending == 0 {
            // The last one out: the pool is closed.
            available
        } else {
            let kappa = if p.window_prices > 0.0 {
                (p.window_shares / p.window_prices).clamp(1.0 / RATIO_LIMIT, RATIO_LIMIT)
            } else {
                1.0
            };
            (price.total() * kappa).min(available)
        };
        p.charged += amount;
        drop(p);
        split(amount, price, share)
    }

    /// The books at `now` (a tracker read).
    pub fn totals(&self, now: &Clock) -> Totals {
        let wall = self.gpus * now.age;
        let idle = self.gpus * now.idle;
        let charged = self.pool().charged;
        Totals {
            wall,
            idle,
            charged,
            unassigned: (wall - idle - charged).max(0.0),
        }
    }
}

/// `amount` in the proportions of `price`, or of `share` where the price is nothing.
fn split(amount: f64, price: GpuSeconds, share: GpuSeconds) -> GpuSeconds {
    let by = if price.total() > 0.0 { price } else { share };
    if by.total() > 0.0 {
        by.scaled(amount / by.total())
    } else {
        GpuSeconds {
            prefill: amount,
            decode: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gs(prefill: f64, decode: f64) -> GpuSeconds {
        GpuSeconds { prefill, decode }
    }

    fn clock(age: f64, idle: f64, in_flight: u64) -> Clock {
        Clock {
            age,
            idle,
            in_flight,
        }
    }

    /// Two overlapping requests on 2 GPUs whose prices add up to less than the time: the
    /// charges plus idle are the wall time, in the prices' proportions. a is in flight from
    /// 0.1 s to 0.7 s, b from 0.2 s to 1.0 s; a's time share is 0.1 + 0.5 / 2 = 0.35 s.
    #[test]
    fn the_books_balance_whatever_the_prices() {
        let l = Ledger::new(2.0);
        l.left();
        let ca = l.charge(gs(0.1, 0.2), gs(0.0, 0.7), &clock(0.7, 0.1, 1));
        l.left();
        let cb = l.charge(gs(0.0, 0.3), gs(0.0, 1.1), &clock(1.0, 0.1, 0));
        let t = l.totals(&clock(1.5, 0.6, 0));
        assert!((t.charged + t.idle - t.wall).abs() < 1e-9, "{t:?}");
        assert!((ca.total() + cb.total() - t.charged).abs() < 1e-9);
        // a's charge is its price scaled by its own share over its price, 0.7 / 0.3, in its
        // price's phases.
        assert!((ca.total() - 0.7).abs() < 1e-9, "{ca:?}");
        assert!((ca.decode / ca.prefill - 2.0).abs() < 1e-9, "{ca:?}");
        // b, last out, took what was left: the 0.9 s busy on 2 GPUs less a's charge.
        assert!((cb.total() - (1.8 - ca.total())).abs() < 1e-9, "{cb:?}");
        assert_eq!(t.unassigned, 0.0);
    }

    /// Charged while another request is in flight, a request's charge is its price scaled by
    /// the recent ratio of time shares to prices; the rest stays unassigned.
    #[test]
    fn a_charge_mid_flight_is_its_scaled_price() {
        let l = Ledger::new(1.0);
        l.left();
        // The first charge: kappa is its own share over its price, 0.5 / 0.25.
        let first = l.charge(gs(0.05, 0.2), gs(0.0, 0.5), &clock(1.0, 0.0, 1));
        assert!((first.total() - 0.5).abs() < 1e-9, "{first:?}");
        let t = l.totals(&clock(1.0, 0.0, 1));
        assert!((t.unassigned - 0.5).abs() < 1e-9, "{t:?}");
        // Never more than the pool holds: a price ten times the time there was.
        l.left();
        let greedy = l.charge(gs(0.0, 5.0), gs(0.0, 0.5), &clock(1.0, 0.0, 1));
        assert!((greedy.total() - 0.5).abs() < 1e-9, "{greedy:?}");
    }

    /// Two requests leave at once: the first charged is not the last out, though the tracker
    /// says nothing is in flight, so it does not take the other's time.
    #[test]
    fn requests_leaving_together_do_not_take_each_others_time() {
        let l = Ledger::new(1.0);
        l.left();
        l.left();
        let now = clock(1.0, 0.0, 0);
        let a = l.charge(gs(0.0, 0.5), gs(0.0, 0.5), &now);
        let b = l.charge(gs(0.0, 0.5), gs(0.0, 0.5), &now);
        assert!((a.total() - 0.5).abs() < 1e-9 && (b.total() - 0.5).abs() < 1e-9);
    }
}
