//! The books: every GPU-second behind the proxy is idle, or split among the requests in flight
//! the moment it is spent, and the two add up to `--gpus` x the wall time since the proxy
//! started, exactly, whatever the engine's costs are thought to be.
//!
//! # The split
//!
//! Between two events (a request enters, joins the batch, makes its first token, leaves, or its
//! prompt is counted; a prefill's budget runs out) nothing the split depends on changes, so it
//! is integrated there, not per chunk.
//! With `k` requests in flight on `R` replicas (`--replicas`), `min(k, R)` engines are busy and
//! the rest idle. A busy engine's time goes to its batch as its steps are spent:
//!
//! - every request in flight is a member of a batch of `N = max(k / R, 1)` and weighs `u =
//!   step(N) / N`: the step's fixed part shared, its own part;
//! - a request sent while every engine computes a step for others joins the batch at the next
//!   step, half a step later on average, or a whole one after a closed loop's last answer
//!   ([`Rates::admission_wait`]); until then it weighs nothing;
//! - a request whose prompt is being prefilled weighs its prefill `P = prefill_per_token x
//!   prompt` on top, for as long as the model says that step lasts: until the budget clock
//!   below has run one engine's GPUs (`--gpus / R`), which is one step of `W` seconds, so it is
//!   charged exactly `P` of one engine. The clock starts when it joins. A request that leaves
//!   before its clock ran out takes the rest from those in flight.
//!
//! Each request's share of the busy GPUs is its weight over the total `W = k u + sum(P)`. Every
//! share is the same for every request but the prefill part, so three integrals carry every
//! request's account: the share one weight-`u` request grew by (`common`), the GPU-seconds per
//! second of prefill weight (`extra`; the budget clock runs at the same rate), and the
//! settlements spread over whoever was in flight (`lump`). A request's charge is their
//! difference between its ends plus its prefill's part. So a request is never charged more than
//! the GPUs while it was in flight, and two requests in the same batches with the same prompt
//! are charged the same.
//!
//! With fewer requests than replicas each is alone on its engine and takes `--gpus / R`.
//!
//! # What is estimated, and settled
//!
//! A prompt's length is what the tokenizer counted, or its body's size ([`Estimate`]) until a
//! count or the usage report comes. When it does, the prefill charged so far is scaled to the
//! count, and the difference moves between the request and the requests in flight then, in
//! equal parts (or not at all if none are).
//!
//! Before the capacity model has published [`Rates`], prompts weigh nothing and the split is
//! the equal share of the time in flight. Those first seconds are settled when the believed
//! prefill fit comes: every event until then is kept (`Provisional`) and replayed with it,
//! the replayed books become the live ones, and what the finished requests were charged is
//! corrected in the counters ([`Ledger::settle_into`]). These two settlements are the only time
//! that moves after it was spent.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::estimate::Estimate;
use super::rates::Rates;
use super::seconds::GpuSeconds;

/// A request's place in the books, from [`Ledger::enter`] to [`Ledger::leave`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

/// A map by ticket. Tickets are a counter, never chosen by a client, so they need no
/// flood-resistant hash: a multiply spreads them (SipHash was a third of a request's cost
/// in the books).
type Tickets<V> = HashMap<Ticket, V, std::hash::BuildHasherDefault<TicketHash>>;

/// Fibonacci hashing of a ticket's number.
#[derive(Default)]
struct TicketHash(u64);

impl std::hash::Hasher for TicketHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// What a prompt was found to be: its tokens, and of those the ones the engine computed (not
/// read from its prefix cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prompt {
    pub tokens: u64,
    pub uncached: u64,
}

/// A request that has left, with its share of the time while it was in flight; its charge is
/// booked by [`Ledger::charge`] once its prompt is settled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Held {
    ticket: Ticket,
    share: GpuSeconds,
    /// Prefill charged, and the prefill (engine-seconds) it was charged for.
    prefill_charged: f64,
    prefill_for: f64,
    /// Its body's bytes were matched with a count, for the estimate.
    learned: bool,
    body_bytes: u64,
    /// `--gpus` x its time in flight: its charge's ceiling.
    ceiling: f64,
}

/// The books at one instant, in GPU-seconds since the proxy started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Balance {
    /// `--gpus` x the wall time.
    pub wall: f64,
    /// Time with no request in flight on an engine.
    pub idle: f64,
    /// Charged to finished requests.
    pub charged: f64,
    /// The rest: held by the requests in flight, or left and not yet charged.
    pub unassigned: f64,
}

/// The GPUs' time, split among the requests in flight as it is spent.
pub struct Ledger {
    gpus: f64,
    origin: Instant,
    books: Mutex<Books>,
    /// Where the settlements of provisional charges are counted.
    book: OnceLock<Book>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("gpus", &self.gpus).finish()
    }
}

/// Counts a settlement: model, tenant, GPU-seconds.
pub type Book = Box<dyn Fn(&str, Option<&str>, &GpuSeconds) + Send + Sync>;

/// The series a request's charge is counted in.
#[derive(Debug, Clone, PartialEq)]
pub struct Labels {
    pub model: String,
    pub tenant: Option<Arc<str>>,
}

/// Until the capacity model first publishes rates, every event is kept, and every charge
/// booked with its labels: the first rates replay them, and what each finished request should
/// have been charged is settled ([`Books::settle_provisional`]). A proxy's first seconds (two,
/// in the tests) would otherwise split long prompts' prefill over everyone.
#[derive(Debug, Default)]
struct Provisional {
    events: Vec<Event>,
    booked: Vec<(Ticket, GpuSeconds, Labels)>,
}

/// Events kept before the first rates: at most this many (about 5 MiB), a few minutes of a
/// busy proxy. Past it, the charges made stand as they were.
const MAX_PROVISIONAL_EVENTS: usize = 100_000;

/// One call on the books, as [`Provisional`] keeps it.
#[derive(Debug, Clone, Copy)]
enum Event {
    Enter {
        at: f64,
        body_bytes: u64,
        prompt: Option<Prompt>,
    },
    Prompt {
        at: f64,
        ticket: Ticket,
        prompt: Prompt,
    },
    First {
        at: f64,
        ticket: Ticket,
    },
    Leave {
        at: f64,
        ticket: Ticket,
    },
    Charge {
        at: f64,
        ticket: Ticket,
        prompt: Option<Prompt>,
    },
    Void {
        at: f64,
        ticket: Ticket,
    },
}

#[derive(Debug)]
struct Books {
    /// Seconds since the origin the integrals run to.
    at: f64,
    idle: f64,
    /// GPU-seconds a request of weight `u` was given, summed.
    common: f64,
    /// GPU-seconds per engine-second of prefill weight, summed: both a prefill's charge and
    /// its budget clock.
    extra: f64,
    /// The budget clock: GPU-seconds per engine-second of prefill weight, summed at the pooled
    /// rate (which `extra` is, but for requests alone on an engine, who take it all anyway).
    clock: f64,
    /// Settlements, GPU-seconds per request in flight, summed.
    lump: f64,
    charged: f64,
    in_flight: u64,
    /// Of those, the ones in the engine's batch: the rest wait for the step they arrived in.
    joined: u64,
    /// Requests waiting to join, with when they do (in the order they came).
    joins: VecDeque<(f64, Ticket)>,
    /// Sum of `P` over the budgets running.
    running: f64,
    /// `u`, engine-seconds (1 while there are no rates: any unit gives the equal share).
    unit: f64,
    replicas: f64,
    rates: Option<Rates>,
    /// Running budgets in the order they end (a budget ends a fixed distance along the clock
    /// from where it began, so first in is first out), with the clock reading they end at.
    /// An entry whose request ended its budget early stays until it reaches the front.
    budgets: VecDeque<(f64, Ticket)>,
    accounts: Tickets<Account>,
    next: u64,
    /// Kept until the first rates.
    provisional: Option<Provisional>,
    /// Shares of requests that had left, not yet charged, when the first rates replayed them.
    replayed: Tickets<Held>,
    /// `common` when the last request entered, and what settlements took from each request
    /// in flight since: every request in flight was given at least the difference, which
    /// bounds what a settlement may take from each.
    common_at_entry: f64,
    taken: f64,
    /// `common` when the one before the last entered: the bound when the last is the request
    /// settled, who takes nothing from itself.
    common_at_prev_entry: f64,
    estimate: Estimate,
}

/// One request in flight.
#[derive(Debug, Clone, Copy)]
struct Account {
    entered: f64,
    /// In the engine's batch (its share runs from `common0`), or still waiting for the step it
    /// arrived in to end.
    joined: bool,
    common0: f64,
    lump0: f64,
    /// `extra` when its current budget segment began.
    extra0: f64,
    /// Its prefill, engine-seconds, as now known.
    prefill: f64,
    /// Prefill charged in closed segments, GPU-seconds.
    accrued: f64,
    running: bool,
    /// Settlements to itself, with what it gave back as one of the requests in flight.
    own: f64,
    /// Of `own`, the settlements of its prefill.
    settled: f64,
    /// Its share up to its first token, once it came, and of that its prefill's part.
    before_first: Option<f64>,
    prefill_before_first: f64,
    /// The budget clock's reading its prefill's budget ends at.
    budget_end: f64,
    /// Its body's bytes were matched with a count, for the estimate.
    learned: bool,
    body_bytes: u64,
}

impl Ledger {
    pub fn new(gpus: f64) -> Self {
        Ledger {
            gpus: if gpus.is_finite() { gpus.max(0.0) } else { 0.0 },
            origin: Instant::now(),
            books: Mutex::new(Books::new(Some(Provisional::default()))),
            book: OnceLock::new(),
        }
    }

    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64()
    }

    /// Hands the settlements of the charges booked before the first rates to `book` (the
    /// metrics' counters): model, tenant, GPU-seconds. The first call wins.
    pub fn settle_into(&self, book: Book) {
        let _ = self.book.set(book);
    }

    /// The engine's costs from now on (the capacity model's refit), and the replicas behind
    /// the proxy. The first rates with a prefill reading settle what was charged before them
    /// (`Provisional`).
    pub fn set_terms(&self, rates: Option<Rates>, replicas: u32, now: Instant) {
        let at = self.secs(now);
        let mut b = self.books();
        b.advance(self.gpus, at);
        b.replicas = f64::from(replicas.max(1));
        if rates.as_ref().is_some_and(|r| r.prefill_known) {
            if let Some(log) = b.provisional.take() {
                let corrections = b.settle_provisional(self.gpus, log, rates.clone(), at);
                drop(b);
                if let Some(book) = self.book.get() {
                    for (labels, g) in &corrections {
                        book(&labels.model, labels.tenant.as_deref(), g);
                    }
                }
                b = self.books();
            }
        }
        b.rates = rates;
        b.reweigh();
    }

    /// A request was sent at `now`, its body `body_bytes` long, its prompt `prompt` where
    /// already counted.
    pub fn enter(&self, now: Instant, body_bytes: u64, prompt: Option<Prompt>) -> Ticket {
        let at = self.secs(now);
        let mut b = self.books();
        b.log(Event::Enter {
            at,
            body_bytes,
            prompt,
        });
        b.enter(self.gpus, at, body_bytes, prompt)
    }

    /// The request's prompt was counted (the tokenizer, or a usage report while it streams).
    pub fn prompt(&self, ticket: Ticket, prompt: Prompt, now: Instant) {
        let at = self.secs(now);
        let mut b = self.books();
        b.log(Event::Prompt { at, ticket, prompt });
        b.advance(self.gpus, at);
        b.settle_in_flight(self.gpus, ticket, prompt, at);
    }

    /// The request's first token passed at `now`: what it was given since it was sent is its
    /// `prefill` phase. Its prefill's budget runs on if the model's step has not ended: an
    /// engine that prefills prompts one after the other makes the first of them before the
    /// step the model sees, and the prefill is no less its cost.
    pub fn first_token(&self, ticket: Ticket, now: Instant) {
        let at = self.secs(now);
        let mut b = self.books();
        b.log(Event::First { at, ticket });
        b.first_token(self.gpus, ticket, at);
    }

    /// The request left the in-flight count at `now`: its share is fixed (`None` for a ticket
    /// already left).
    pub fn leave(&self, ticket: Ticket, now: Instant) -> Option<Held> {
        let at = self.secs(now);
        let mut b = self.books();
        b.log(Event::Leave { at, ticket });
        b.leave(self.gpus, ticket, at)
    }

    /// Books a request that has left: its share, with its prefill settled to `prompt` where
    /// that is known now. Returns its charge. `labels` are the series it is counted in, kept
    /// only while the first rates are awaited (its charge is then settled later).
    pub fn charge(
        &self,
        held: Held,
        prompt: Option<Prompt>,
        now: Instant,
        labels: impl FnOnce() -> Labels,
    ) -> GpuSeconds {
        let at = self.secs(now);
        let mut b = self.books();
        // A request that left before the first rates is charged as they would have split it.
        let held = b.replayed.remove(&held.ticket).unwrap_or(held);
        let charge = b.charge(self.gpus, held, prompt, at);
        if b.provisional.is_some() {
            b.log(Event::Charge {
                at,
                ticket: held.ticket,
                prompt,
            });
            if let Some(p) = b.provisional.as_mut() {
                p.booked.push((held.ticket, charge, labels()));
            }
        }
        charge
    }

    /// Books a request that has left without reaching the engine (the upstream could not be
    /// reached, or failed before it answered): its share goes to idle, not to its model and
    /// tenant. The GPUs did nothing for it, and a charge would put a row of GPU time on a
    /// request that never ran, onto which the allocation basis then spreads the idle time.
    pub fn void(&self, held: Held, now: Instant) {
        let at = self.secs(now);
        let mut b = self.books();
        let held = b.replayed.remove(&held.ticket).unwrap_or(held);
        b.void(self.gpus, held, at);
        if b.provisional.is_some() {
            b.log(Event::Void {
                at,
                ticket: held.ticket,
            });
        }
    }

    /// The books at `now`.
    pub fn totals(&self, now: Instant) -> Balance {
        let at = self.secs(now);
        let mut b = self.books();
        b.advance(self.gpus, at);
        let wall = self.gpus * b.at;
        Balance {
            wall,
            idle: b.idle,
            charged: b.charged,
            unassigned: (wall - b.idle - b.charged).max(0.0),
        }
    }
}

/// What settling a prefill charged `charged` GPU-seconds for `was` engine-seconds, found to be
/// `is`, moves to its request: the charge scaled to the count, less the charge.
fn settlement(charged: f64, was: f64, is: f64) -> f64 {
    if was > 0.0 && charged > 0.0 {
        charged * (is / was - 1.0)
    } else {
        0.0
    }
}

impl Books {
    fn new(provisional: Option<Provisional>) -> Books {
        Books {
            at: 0.0,
            idle: 0.0,
            common: 0.0,
            extra: 0.0,
            clock: 0.0,
            lump: 0.0,
            charged: 0.0,
            in_flight: 0,
            joined: 0,
            joins: VecDeque::new(),
            running: 0.0,
            unit: 1.0,
            replicas: 1.0,
            rates: None,
            budgets: VecDeque::new(),
            accounts: Tickets::default(),
            next: 0,
            provisional,
            replayed: Tickets::default(),
            common_at_entry: 0.0,
            taken: 0.0,
            common_at_prev_entry: 0.0,
            estimate: Estimate::default(),
        }
    }

    /// Keeps `e` for the first rates' replay, while they are awaited and there is room.
    fn log(&mut self, e: Event) {
        let full = match &mut self.provisional {
            Some(p) if p.events.len() < MAX_PROVISIONAL_EVENTS => {
                p.events.push(e);
                false
            }
            Some(_) => true,
            None => false,
        };
        if full {
            // The charges made so far stand.
            self.provisional = None;
        }
    }

    /// The first rates have come: replays every event since the start with them, takes the
    /// replayed books as its own, and returns what each charge already booked must have added
    /// (the ones it lacked; what others were overcharged is taken from the requests in flight
    /// now, which are mostly the ones that were overcharged beside them).
    fn settle_provisional(
        &mut self,
        gpus: f64,
        log: Provisional,
        rates: Option<Rates>,
        at: f64,
    ) -> Vec<(Labels, GpuSeconds)> {
        let mut fresh = Books::new(None);
        fresh.rates = rates;
        fresh.replicas = self.replicas;
        let mut held = Tickets::default();
        let mut charges: Tickets<GpuSeconds> = Tickets::default();
        for e in log.events {
            match e {
                Event::Enter {
                    at,
                    body_bytes,
                    prompt,
                } => {
                    fresh.enter(gpus, at, body_bytes, prompt);
                }
                Event::Prompt { at, ticket, prompt } => {
                    fresh.advance(gpus, at);
                    fresh.settle_in_flight(gpus, ticket, prompt, at);
                }
                Event::First { at, ticket } => fresh.first_token(gpus, ticket, at),
                Event::Leave { at, ticket } => {
                    if let Some(h) = fresh.leave(gpus, ticket, at) {
                        held.insert(ticket, h);
                    }
                }
                Event::Charge { at, ticket, prompt } => {
                    if let Some(h) = held.remove(&ticket) {
                        charges.insert(ticket, fresh.charge(gpus, h, prompt, at));
                    }
                }
                Event::Void { at, ticket } => {
                    if let Some(h) = held.remove(&ticket) {
                        fresh.void(gpus, h, at);
                    }
                }
            }
        }
        fresh.advance(gpus, at);
        let (mut more, mut less) = (Vec::new(), 0.0);
        let mut booked = 0.0;
        for (ticket, was, labels) in log.booked {
            booked += was.total();
            let Some(is) = charges.get(&ticket) else {
                continue;
            };
            let diff = GpuSeconds {
                prefill: is.prefill - was.prefill,
                decode: is.decode - was.decode,
            };
            if diff.total() > 0.0 {
                more.push((labels, diff));
            } else {
                less -= diff.total();
            }
        }
        let added: f64 = more.iter().map(|(_, d)| d.total()).sum();
        if fresh.in_flight > 0 {
            // The requests in flight give back what the finished ones were overcharged.
            fresh.lump -= less / fresh.in_flight as f64;
        } else if added > 0.0 {
            // Nobody to take it from: the additions shrink to what the books hold.
            let keep = ((added - less) / added).max(0.0);
            for (_, d) in &mut more {
                *d = d.scaled(keep);
            }
        }
        let added: f64 = more.iter().map(|(_, d)| d.total()).sum();
        let replayed_charged = fresh.charged;
        fresh.charged = booked + added;
        if fresh.in_flight == 0 && fresh.charged > replayed_charged {
            // What was overcharged stays counted (a counter does not go back) and nobody in
            // flight can give it back: it comes out of idle, so the books still add up to the
            // wall time. (A voided request's replayed share went to idle, not to a charge that
            // could have absorbed it.)
            fresh.idle = (fresh.idle - (fresh.charged - replayed_charged)).max(0.0);
        }
        fresh.replayed = held;
        // The estimate keeps what the live books learnt (the same counts, in the same order).
        *self = fresh;
        more
    }

    fn enter(&mut self, g: f64, at: f64, body_bytes: u64, prompt: Option<Prompt>) -> Ticket {
        let b = self;
        b.advance(g, at);
        let ticket = Ticket(b.next);
        b.next += 1;
        let tokens = match prompt {
            Some(p) => p.uncached as f64,
            None => b.estimate.tokens(body_bytes),
        };
        let prefill = b.rates.as_ref().map_or(0.0, |r| r.prefill(tokens));
        let account = Account {
            entered: at,
            joined: false,
            common0: b.common,
            lump0: b.lump,
            extra0: b.extra,
            prefill,
            accrued: 0.0,
            running: false,
            own: 0.0,
            settled: 0.0,
            before_first: None,
            prefill_before_first: 0.0,
            budget_end: 0.0,
            learned: prompt.is_some(),
            body_bytes,
        };
        b.accounts.insert(ticket, account);
        b.in_flight += 1;
        // Every engine is computing a step for others: the request joins at the next one.
        let wait = match &b.rates {
            Some(r) if b.joined as f64 >= b.replicas => {
                r.admission_wait * r.step(((b.joined + 1) as f64 / b.replicas).max(1.0))
            }
            _ => 0.0,
        };
        if wait > 0.0 {
            b.joins.push_back((at + wait, ticket));
        } else {
            b.join(g, ticket);
        }
        ticket
    }

    /// The request enters the engine's batch: its share of the steps, and its prefill's
    /// budget, start now.
    fn join(&mut self, g: f64, ticket: Ticket) {
        let (common, extra, clock, r) = (self.common, self.extra, self.clock, self.replicas);
        let Some(a) = self.accounts.get_mut(&ticket) else {
            return;
        };
        if a.joined {
            return;
        }
        a.joined = true;
        (a.common0, a.extra0) = (common, extra);
        if a.prefill > 0.0 {
            a.running = true;
            a.budget_end = clock + g / r;
            self.budgets.push_back((a.budget_end, ticket));
            self.running += a.prefill;
        }
        self.joined += 1;
        self.common_at_prev_entry = self.common_at_entry;
        (self.common_at_entry, self.taken) = (self.common, 0.0);
        self.reweigh();
    }

    /// Everyone waiting joins now: the engine has nobody else to compute for.
    fn join_all_waiting(&mut self, g: f64) {
        while let Some((_, t)) = self.joins.pop_front() {
            self.join(g, t);
        }
    }

    fn first_token(&mut self, g: f64, ticket: Ticket, at: f64) {
        let b = self;
        b.advance(g, at);
        // A first token means it was in the batch, whatever the wait was thought to be.
        b.join(g, ticket);
        let (common, lump, extra) = (b.common, b.lump, b.extra);
        if let Some(a) = b.accounts.get_mut(&ticket) {
            if a.before_first.is_none() {
                let running = if a.running {
                    a.prefill * (extra - a.extra0)
                } else {
                    0.0
                };
                a.prefill_before_first = a.accrued + running;
                a.before_first =
                    Some(common - a.common0 + a.accrued + running + a.own + lump - a.lump0);
            }
        }
    }

    fn leave(&mut self, g: f64, ticket: Ticket, at: f64) -> Option<Held> {
        let b = self;
        b.advance(g, at);
        // What its prefill's budget has still to run, in GPU-seconds.
        let unpaid = match b.accounts.get(&ticket) {
            Some(a) if a.running => a.prefill * (a.budget_end - b.clock).max(0.0),
            _ => 0.0,
        };
        b.stop_budget(ticket);
        let a = b.accounts.remove(&ticket)?;
        b.in_flight = b.in_flight.saturating_sub(1);
        if a.joined {
            b.joined = b.joined.saturating_sub(1);
        }
        if b.in_flight == 0 {
            b.budgets.clear();
            b.joins.clear();
            b.running = 0.0;
        } else if b.joined == 0 {
            b.join_all_waiting(g);
        }
        b.reweigh();
        let steps = if a.joined { b.common - a.common0 } else { 0.0 };
        let mut total = steps + a.accrued + a.own + b.lump - a.lump0;
        if total < 0.0 {
            // Settlements took more than it was given: the rest is taken from those in flight,
            // or, with none, from idle.
            match b.in_flight {
                0 => b.idle += total,
                k => b.lump += total / k as f64,
            }
            total = 0.0;
        }
        let ceiling = g * (at - a.entered).max(0.0);
        if total > ceiling {
            // Settlements handed it more than its GPUs' time: the rest goes to those in flight,
            // or, with none, to idle, which is what the time was to nobody's account.
            let excess = total - ceiling;
            match b.in_flight {
                0 => b.idle += excess,
                k => b.lump += excess / k as f64,
            }
            total = ceiling;
        }
        // It leaves before its prefill's budget ran out (a short answer): the rest of its
        // prefill is taken from those in flight now, as a settlement.
        let others = b.in_flight as f64;
        let mut paid = 0.0;
        if unpaid > 0.0 && others > 0.0 {
            paid = unpaid
                .min(ceiling - total)
                .min(b.takeable() * others)
                .max(0.0);
            b.take_from_others(paid, others);
            total += paid;
        }
        let prefill = match a.before_first {
            // Its prefill's part after the first token was still prefill.
            Some(before) => before + a.accrued + paid - a.prefill_before_first,
            None => total,
        }
        .clamp(0.0, total);
        Some(Held {
            ticket,
            share: GpuSeconds {
                prefill,
                decode: total - prefill,
            },
            prefill_charged: a.accrued + a.settled + paid,
            prefill_for: a.prefill,
            learned: a.learned,
            body_bytes: a.body_bytes,
            ceiling,
        })
    }

    fn charge(&mut self, g: f64, held: Held, prompt: Option<Prompt>, at: f64) -> GpuSeconds {
        let b = self;
        b.advance(g, at);
        let mut share = held.share;
        if let Some(p) = prompt {
            if !held.learned {
                b.estimate.learn(held.body_bytes, p.tokens);
            }
            let wanted = b
                .rates
                .as_ref()
                .map_or(0.0, |r| r.prefill(p.uncached as f64));
            let others = b.in_flight as f64;
            if others > 0.0 {
                let diff = settlement(held.prefill_charged, held.prefill_for, wanted);
                let most = (held.ceiling - share.total()).min(b.takeable() * others);
                let diff = diff.clamp(-share.total(), most.max(0.0));
                b.take_from_others(diff, others);
                // Given back from its prefill first.
                let prefill = share.prefill + diff;
                share = GpuSeconds {
                    prefill: prefill.max(0.0),
                    decode: share.decode + prefill.min(0.0),
                };
            }
        }
        b.charged += share.total();
        share
    }

    fn void(&mut self, g: f64, held: Held, at: f64) {
        self.advance(g, at);
        self.idle += held.share.total();
    }

    /// The most a settlement may take from each request in flight: what the newest of them
    /// was given, less what settlements took since. (What they are handed beyond their own
    /// time is passed on when they leave, [`Ledger::leave`].)
    fn takeable(&self) -> f64 {
        (self.common - self.common_at_entry - self.taken).max(0.0)
    }

    /// [`Books::takeable`] from the others than `ticket`, in flight.
    fn takeable_beside(&self, ticket: Ticket) -> f64 {
        if ticket.0 + 1 == self.next {
            (self.common - self.common_at_prev_entry - self.taken).max(0.0)
        } else {
            self.takeable()
        }
    }

    /// Moves `diff` GPU-seconds to a request from the `others` in flight (from it to them,
    /// when negative), in equal parts.
    fn take_from_others(&mut self, diff: f64, others: f64) {
        self.lump -= diff / others;
        if diff > 0.0 {
            self.taken += diff / others;
        }
    }

    /// Recomputes the weight of a batch member after the number in flight or the rates changed.
    fn reweigh(&mut self) {
        let k = self.joined as f64;
        self.unit = match &self.rates {
            Some(r) if k > 0.0 => {
                let batch = (k / self.replicas).max(1.0);
                r.step(batch) / batch
            }
            _ => 1.0,
        };
    }

    /// Integrates the split from `self.at` to `to`, ending each budget where its clock runs
    /// out on the way.
    fn advance(&mut self, gpus: f64, to: f64) {
        while to > self.at {
            if self.in_flight == 0 {
                self.idle += gpus * (to - self.at);
                self.at = to;
                return;
            }
            if self.joined == 0 {
                self.join_all_waiting(gpus);
            }
            let k = self.joined as f64;
            let r = self.replicas;
            let busy = gpus * k.min(r) / r;
            let whole = k * self.unit + self.running;
            // Alone on its engine, a request takes the engine: prefill gets nothing on top.
            let (common_rate, extra_rate) = if k < r {
                (gpus / r, 0.0)
            } else {
                (busy * self.unit / whole, busy / whole)
            };
            // The budget clock runs at the pooled rate either way.
            let clock_rate = busy / whole;
            let mut until = to;
            let mut ends = None;
            if let Some(end) = self.next_budget_end() {
                let cross = self.at + (end - self.clock).max(0.0) / clock_rate;
                if cross < to {
                    (until, ends) = (cross, Some(end));
                }
            }
            let mut joins = None;
            if let Some(join) = self.next_join() {
                if join < until {
                    (until, ends, joins) = (join.max(self.at), None, Some(()));
                }
            }
            let dt = (until - self.at).max(0.0);
            self.idle += (gpus - busy) * dt;
            self.common += common_rate * dt;
            self.extra += extra_rate * dt;
            self.clock += clock_rate * dt;
            self.at = self.at.max(until);
            if let Some(end) = ends {
                // Exactly at its end, whatever the rounding: each pass ends one budget, so
                // the loop always moves on.
                self.clock = self.clock.max(end);
                if let Some((_, t)) = self.budgets.pop_front() {
                    self.stop_budget(t);
                }
            }
            if joins.is_some() {
                // Likewise, each pass admits one.
                if let Some((_, t)) = self.joins.pop_front() {
                    self.join(gpus, t);
                }
            }
        }
    }

    /// When the first request waiting to join does, after dropping the ones that already did
    /// or left.
    fn next_join(&mut self) -> Option<f64> {
        while let Some(&(at, t)) = self.joins.front() {
            match self.accounts.get(&t) {
                Some(a) if !a.joined => return Some(at),
                _ => {
                    self.joins.pop_front();
                }
            }
        }
        None
    }

    /// The clock reading at which the first running budget ends, after dropping the entries of
    /// budgets already ended.
    fn next_budget_end(&mut self) -> Option<f64> {
        while let Some(&(end, t)) = self.budgets.front() {
            match self.accounts.get(&t) {
                Some(a) if a.running => return Some(end),
                _ => {
                    self.budgets.pop_front();
                }
            }
        }
        None
    }

    /// Ends the request's prefill budget, if it runs: its prefill so far is accrued.
    fn stop_budget(&mut self, ticket: Ticket) {
        let extra = self.extra;
        let Some(a) = self.accounts.get_mut(&ticket) else {
            return;
        };
        if !a.running {
            return;
        }
        a.accrued += a.prefill * (extra - a.extra0);
        a.running = false;
        self.running = (self.running - a.prefill).max(0.0);
        if self.running < 1e-15 {
            self.running = 0.0;
        }
    }

    /// Settles a request still in flight to its counted prompt.
    fn settle_in_flight(&mut self, gpus: f64, ticket: Ticket, prompt: Prompt, at: f64) {
        let wanted = self
            .rates
            .as_ref()
            .map_or(0.0, |r| r.prefill(prompt.uncached as f64));
        let (extra, common, lump) = (self.extra, self.common, self.lump);
        let others = self.in_flight.saturating_sub(1) as f64;
        let takeable = self.takeable_beside(ticket);
        let Some(a) = self.accounts.get_mut(&ticket) else {
            return;
        };
        if !std::mem::replace(&mut a.learned, true) {
            self.estimate.learn(a.body_bytes, prompt.tokens);
        }
        // What it was charged for its prefill so far, and what that would have been.
        let running = if a.running {
            a.prefill * (extra - a.extra0)
        } else {
            0.0
        };
        let so_far = a.accrued + a.settled + running;
        let mut diff = settlement(so_far, a.prefill, wanted);
        let steps = if a.joined { common - a.common0 } else { 0.0 };
        let held = steps + a.accrued + a.own + lump - a.lump0;
        let ceiling = gpus * (at - a.entered).max(0.0);
        let most = (ceiling - held).min(takeable * others);
        diff = diff.clamp(-held.max(0.0), most.max(0.0));
        if others == 0.0 {
            diff = 0.0;
        }
        if a.running {
            // The rest of its budget runs at the counted prefill.
            a.accrued += a.prefill * (extra - a.extra0);
            a.extra0 = extra;
            self.running = (self.running - a.prefill + wanted).max(0.0);
            a.prefill = wanted;
            if wanted <= 0.0 {
                a.running = false;
            }
        } else {
            a.prefill = wanted;
        }
        if diff != 0.0 {
            // Every request in flight, this one too, gives diff / others; this one is given
            // that back and diff.
            a.own += diff + diff / others;
            a.settled += diff;
            self.take_from_others(diff, others);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// 10 ms steps and 0.1 ms of prefill a token, on a line flat enough that a step's cost
    /// hardly depends on the batch.
    fn rates() -> Rates {
        Rates {
            step: super::super::Step::Line {
                base: 0.010,
                per_seq: 0.0,
            },
            prefill_per_token: 0.0001,
            prefill_known: true,
            admission_wait: super::super::rates::HALF_A_STEP,
        }
    }

    fn prompt(tokens: u64) -> Option<Prompt> {
        Some(Prompt {
            tokens,
            uncached: tokens,
        })
    }

    struct Rig {
        ledger: Ledger,
        t0: Instant,
    }

    impl Rig {
        fn new(gpus: f64, replicas: u32, rates: Option<Rates>) -> Rig {
            let ledger = Ledger::new(gpus);
            let t0 = ledger.origin;
            ledger.set_terms(rates, replicas, t0);
            Rig { ledger, t0 }
        }

        fn at(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }

        fn charge(&self, t: Ticket, ms: u64, p: Option<Prompt>) -> GpuSeconds {
            let held = self.ledger.leave(t, self.at(ms)).expect("in flight");
            self.ledger.charge(held, p, self.at(ms), || Labels {
                model: "m".into(),
                tenant: None,
            })
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// Without rates the split is the equal share of the time in flight, and the books add up:
    /// a alone 1 s, a and b 2 s, b alone 1 s, idle 1 s before and 2 s after, on 2 GPUs.
    #[test]
    fn without_rates_the_time_is_shared_equally() {
        let r = Rig::new(2.0, 1, None);
        let a = r.ledger.enter(r.at(1000), 0, None);
        let b = r.ledger.enter(r.at(2000), 0, None);
        let ca = r.charge(a, 4000, None);
        let cb = r.charge(b, 5000, None);
        assert!(close(ca.total(), 2.0 * 2.0) && close(cb.total(), 2.0 * 2.0));
        assert!(close(ca.prefill, ca.total()), "no first token: all prefill");
        let t = r.ledger.totals(r.at(7000));
        assert!(
            close(t.wall, 14.0) && close(t.idle, 6.0) && close(t.charged, 8.0),
            "{t:?}"
        );
        assert_eq!(t.unassigned, 0.0);
    }

    /// A request that never reached the engine is charged nothing: its time in flight is idle,
    /// and the books still add up, before the first rates and after they replay the events.
    #[test]
    fn a_voided_request_leaves_its_time_idle() {
        for rated_at in [None, Some(6000)] {
            let r = Rig::new(2.0, 1, None);
            // a: 1 s to 3 s, never answered; b: 2 s to 4 s, charged.
            let a = r.ledger.enter(r.at(1000), 0, None);
            let b = r.ledger.enter(r.at(2000), 0, None);
            let held = r.ledger.leave(a, r.at(3000)).expect("in flight");
            r.ledger.void(held, r.at(3000));
            let cb = r.charge(b, 4000, None);
            // b had half the GPUs while a was in flight, then all of them.
            assert!(close(cb.total(), 1.0 + 2.0), "{cb:?}");
            if let Some(ms) = rated_at {
                r.ledger.set_terms(Some(rates()), 1, r.at(ms));
            }
            let t = r.ledger.totals(r.at(6000));
            // Idle: 0-1 s and 4-6 s alone (6 GPU-s), and a's 1 s alone plus half of 2-3 s.
            assert!(
                close(t.wall, 12.0) && close(t.idle, 6.0 + 3.0) && close(t.charged, 3.0),
                "{rated_at:?}: {t:?}"
            );
            assert!(t.unassigned.abs() < 1e-9, "{t:?}");
        }
    }

    /// A long prompt is charged its prefill while it runs, out of the time of the request
    /// decoding beside it, which is left its part of the steps. b decodes from 0; a, 1,000
    /// tokens (100 ms of prefill), is sent at 1 s, waits half of b's 10 ms step to be
    /// admitted, and makes its first token 110 ms later (the step with its prefill), then both
    /// decode until 2 s.
    #[test]
    fn a_prompt_pays_its_prefill_as_it_runs() {
        let r = Rig::new(1.0, 1, Some(rates()));
        let b = r.ledger.enter(r.at(0), 0, prompt(10));
        r.ledger.first_token(b, r.at(10));
        // 4,000 bytes at the prior's 4 a token: 1,000 tokens.
        let a = r.ledger.enter(r.at(1000), 4000, None);
        r.ledger.first_token(a, r.at(1115));
        let ca = r.charge(a, 2000, prompt(1000));
        let cb = r.charge(b, 2000, prompt(10));
        // Its step: 10 ms shared by two, and its 100 ms prefill: 105 ms of a's, 5 ms of b's.
        // The prefill ends with the modeled step, 110 ms, at a's first token.
        assert!(close(ca.prefill, 0.105), "{ca:?}");
        // Then halves: 0.885 s.
        assert!(close(ca.decode, 0.4425), "{ca:?}");
        // b: alone 1 s and a's wait, its part of a's step, then half.
        assert!(close(cb.total(), 1.0 + 0.005 + 0.005 + 0.4425), "{cb:?}");
        let t = r.ledger.totals(r.at(2000));
        assert!(close(t.charged, 2.0) && t.idle == 0.0, "{t:?}");
    }

    /// Two requests of the same shape sent together, beside a third: the same charge.
    #[test]
    fn the_same_shape_in_the_same_batches_pays_the_same() {
        let r = Rig::new(4.0, 1, Some(rates()));
        let other = r.ledger.enter(r.at(0), 100, None);
        let x = r.ledger.enter(r.at(5), 8000, None);
        let y = r.ledger.enter(r.at(5), 8000, None);
        r.ledger.first_token(x, r.at(300));
        r.ledger.first_token(y, r.at(300));
        let cx = r.charge(x, 900, prompt(2000));
        let cy = r.charge(y, 900, prompt(2000));
        assert!(close(cx.prefill, cy.prefill) && close(cx.decode, cy.decode));
        let co = r.charge(other, 1000, None);
        let t = r.ledger.totals(r.at(1000));
        assert!(close(cx.total() + cy.total() + co.total(), t.charged));
        assert!(close(t.charged, 4.0), "{t:?}");
    }

    /// With two replicas, one request leaves one idle: half the GPUs are idle, and a request
    /// alone on its engine takes that engine, whatever its prompt.
    #[test]
    fn idle_is_counted_per_replica() {
        let r = Rig::new(8.0, 2, Some(rates()));
        let a = r.ledger.enter(r.at(0), 40_000, None);
        let ca = r.charge(a, 1000, prompt(10_000));
        assert!(close(ca.total(), 4.0), "{ca:?}");
        let t = r.ledger.totals(r.at(1000));
        assert!(close(t.idle, 4.0) && close(t.charged, 4.0), "{t:?}");
        // Three on two engines: all busy, no request over its engine's four GPUs.
        let xs: Vec<_> = (0..3)
            .map(|_| r.ledger.enter(r.at(1000), 400, None))
            .collect();
        let cs: Vec<_> = xs.into_iter().map(|x| r.charge(x, 2000, None)).collect();
        let t = r.ledger.totals(r.at(2000));
        assert!(close(t.idle, 4.0), "{t:?}");
        assert!(cs.iter().all(|c| c.total() <= 4.0 + 1e-9), "{cs:?}");
        assert!(close(t.charged, 12.0), "{t:?}");
    }

    /// A prompt estimated at half its length is settled when its count comes: the prefill
    /// charged is scaled to the count, and the difference is taken from the request in flight
    /// then. The books still add up.
    #[test]
    fn an_estimate_is_settled_by_the_count() {
        let r = Rig::new(1.0, 1, Some(rates()));
        let long = r.ledger.enter(r.at(0), 100, prompt(10));
        r.ledger.first_token(long, r.at(10));
        // 2,000 bytes: 500 tokens at the prior's ratio; it is 1,000.
        let a = r.ledger.enter(r.at(100), 2000, None);
        r.ledger.first_token(a, r.at(210));
        let ca = r.charge(a, 500, prompt(1000));
        // Estimated: 50 ms of prefill; counted, 100 ms: 50 ms more, from `long`.
        let exact = {
            let r = Rig::new(1.0, 1, Some(rates()));
            let long = r.ledger.enter(r.at(0), 100, prompt(10));
            r.ledger.first_token(long, r.at(10));
            let a = r.ledger.enter(r.at(100), 4000, prompt(1000));
            r.ledger.first_token(a, r.at(210));
            r.charge(a, 500, prompt(1000))
        };
        // The prefill charged is the counted one's: 105 ms, where the estimate gave 55 ms. The
        // estimate's shorter step ended 50 ms early, and the time until the first token was
        // then shared as if both decoded: 25 ms more than the engine spent on it, which no
        // settlement can see.
        assert!(
            (ca.total() - exact.total() - 0.025).abs() < 1e-6,
            "{ca:?} {exact:?}"
        );
        let cl = r.charge(long, 1000, prompt(10));
        let t = r.ledger.totals(r.at(1000));
        assert!(close(ca.total() + cl.total(), 1.0), "{ca:?} {cl:?} {t:?}");
        assert!(close(t.charged, 1.0) && t.unassigned == 0.0, "{t:?}");
        // The ratio is being learnt: the next body of 2,000 bytes is most of 1,000 tokens.
        assert!(r.ledger.books().estimate.tokens(2000) > 800.0);
    }

    /// A count that comes while the prefill runs (the tokenizer's) changes what it is charged
    /// from then on, and what it was charged so far.
    #[test]
    fn a_count_in_flight_settles_the_prefill() {
        let r = Rig::new(1.0, 1, Some(rates()));
        let other = r.ledger.enter(r.at(0), 100, prompt(10));
        r.ledger.first_token(other, r.at(10));
        let a = r.ledger.enter(r.at(100), 400, None);
        r.ledger
            .prompt(a, prompt(1000).expect("a prompt"), r.at(101));
        r.ledger.first_token(a, r.at(210));
        let ca = r.charge(a, 210, None);
        // 100 ms of prefill and half of its 10 ms step, as if counted from the start.
        assert!((ca.total() - 0.105).abs() < 0.002, "{ca:?}");
        let co = r.charge(other, 210, None);
        assert!(close(ca.total() + co.total(), 0.21), "{ca:?} {co:?}");
    }

    /// Charges made before the first rates are settled when they come: what the finished
    /// requests lacked is counted then, what they had too much is taken from the requests in
    /// flight, and every request ends as charged as if the rates had been known from the start.
    #[test]
    fn the_first_rates_settle_what_was_charged_before_them() {
        let settled = Arc::new(Mutex::new(Vec::new()));
        let run = |rates_from_start: bool| {
            let ledger = Ledger::new(1.0);
            let seen = Arc::clone(&settled);
            ledger.settle_into(Box::new(move |model, _, g| {
                seen.lock().expect("lock").push((model.to_owned(), *g));
            }));
            let t0 = ledger.origin;
            let at = |ms: u64| t0 + Duration::from_millis(ms);
            if rates_from_start {
                ledger.set_terms(Some(rates()), 1, t0);
            }
            let labels = |m: &str| {
                let model = m.to_owned();
                move || Labels {
                    model,
                    tenant: None,
                }
            };
            let long = ledger.enter(at(0), 100, prompt(10));
            ledger.first_token(long, at(10));
            let a = ledger.enter(at(100), 4000, None);
            ledger.first_token(a, at(210));
            let held = ledger.leave(a, at(300)).expect("in flight");
            let ca = ledger.charge(held, prompt(1000), at(300), labels("a"));
            if !rates_from_start {
                ledger.set_terms(Some(rates()), 1, at(400));
            }
            let held = ledger.leave(long, at(1000)).expect("in flight");
            let cl = ledger.charge(held, prompt(10), at(1000), labels("long"));
            (ca, cl, ledger.totals(at(1000)))
        };
        let (a_exact, long_exact, _) = run(true);
        assert!(settled.lock().expect("lock").is_empty());
        let (a_was, long_is, t) = run(false);
        // Charged before the rates: the equal share, half of the 200 ms it was in flight.
        assert!(close(a_was.total(), 0.1), "{a_was:?}");
        let added: Vec<_> = settled.lock().expect("lock").clone();
        assert_eq!(added.len(), 1, "{added:?}");
        assert_eq!(added[0].0, "a");
        assert!(
            close(a_was.total() + added[0].1.total(), a_exact.total()),
            "{a_was:?} + {added:?} against {a_exact:?}"
        );
        assert!(
            close(long_is.total(), long_exact.total()),
            "{long_is:?} {long_exact:?}"
        );
        assert!(
            close(t.charged + t.idle, t.wall) && t.unassigned == 0.0,
            "{t:?}"
        );
    }

    /// However the events fall, no request is charged more than the GPUs while it was in
    /// flight, and charges, idle and unassigned are the wall time.
    #[test]
    fn no_request_takes_more_than_its_time_and_the_books_balance() {
        let r = Rig::new(2.0, 1, Some(rates()));
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut live: Vec<(Ticket, u64, bool)> = Vec::new();
        let mut charged = 0.0;
        for ms in (0..20_000).step_by(7) {
            match next(4) {
                0 => {
                    let bytes = next(40_000);
                    live.push((r.ledger.enter(r.at(ms), bytes, None), ms, false));
                }
                1 if !live.is_empty() => {
                    let i = next(live.len() as u64) as usize;
                    r.ledger.first_token(live[i].0, r.at(ms));
                    live[i].2 = true;
                }
                2 if !live.is_empty() => {
                    let (t, from, _) = live.swap_remove(next(live.len() as u64) as usize);
                    // Counts between a third and three times the prior's estimate, which
                    // settlements then move time for.
                    let c = r.charge(t, ms, prompt(next(30_000)));
                    assert!(c.prefill >= 0.0 && c.decode >= 0.0, "{c:?}");
                    let most = 2.0 * (ms - from) as f64 / 1000.0;
                    assert!(c.total() <= most + 1e-9, "{c:?} over {most}");
                    charged += c.total();
                }
                _ => {}
            }
        }
        for (t, _, _) in live.drain(..) {
            charged += r.charge(t, 20_000, None).total();
        }
        let t = r.ledger.totals(r.at(20_000));
        assert!((t.charged - charged).abs() < 1e-6, "{t:?} {charged}");
        assert!(
            (t.charged + t.idle + t.unassigned - t.wall).abs() < 1e-6 * t.wall,
            "{t:?}"
        );
        assert!(t.unassigned < 1e-6, "{t:?}");
    }
}
