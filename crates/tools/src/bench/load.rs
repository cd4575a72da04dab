//! Closed-loop load: N workers, each sending its next request as soon as the last one ends, so
//! exactly N requests are in flight for the whole measurement window.
//!
//! A level stops topping up when its budget runs out: at the deadline (`--duration`) or when the
//! last of its requests has been handed out (`--requests`). That moment ends the **window**, the
//! span during which N requests were in flight. The requests still running then are waited for
//! (their latencies count; no request is cut, which would skew both the per-request figures and
//! a proxy's counters), but the aggregate throughput counts only the output tokens that arrived
//! inside the window, divided by the window: the server's throughput at N, not a blend of N and
//! the drain.
//!
//! [`Driver::run_open`] is the open loop (`--request-rate`): requests are sent on a seeded
//! Poisson schedule ([`Arrivals`]) whatever the server is doing, and every latency is measured
//! from the time a request was due, so a server that queues shows its queue and a client that
//! falls behind shows its lateness. Nothing caps the requests in flight but
//! [`MAX_OUTSTANDING`]; a request due while that many are out is not sent, and counted. The loop
//! itself, [`Driver::run_schedule`], takes any [`Schedule`] of due times and bodies: a trace's
//! replay is another one.
//!
//! [`Ramp`] is the same closed loop with a target that moves while it runs (the demo's ramp):
//! worker `i` sends while the target is above `i`, so when the target drops, the workers above it
//! finish the request they are on and then wait; no request is cut off by the ramp.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use super::arrivals::Arrivals;
use super::client::{Client, Sample};
use super::live::Live;
use super::prompt::RequestBuilder;

/// When a level stops sending new requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Keep N in flight for this long.
    After(Duration),
    /// Send this many requests in all (at least N).
    Requests(u64),
}

/// Everything one level measured.
#[derive(Debug)]
pub struct LevelRun {
    /// Closed loop: the requests held in flight. Open loop: the most that were in flight at once.
    pub concurrency: usize,
    /// Open loop: the level's rate, requests/s; `None` for a closed-loop level.
    pub rate: Option<f64>,
    /// Open loop: requests due while [`MAX_OUTSTANDING`] were in flight, so never sent.
    pub not_sent: u64,
    pub started: Instant,
    /// The end of the window: the first moment fewer than N requests were in flight.
    pub window_end: Instant,
    /// When the last request ended.
    pub finished: Instant,
    pub samples: Vec<Sample>,
}

impl LevelRun {
    pub fn window(&self) -> Duration {
        self.window_end.saturating_duration_since(self.started)
    }

    /// Output tokens that arrived inside the window.
    pub fn tokens_in_window(&self) -> f64 {
        self.samples
            .iter()
            .map(|s| s.tokens_until(self.window_end))
            .sum()
    }

    /// The mean number of requests in flight over the window: the time each request spent in
    /// flight inside the window (from when it actually left), summed, over the window.
    pub fn mean_concurrency(&self) -> f64 {
        let w = self.window().as_secs_f64();
        if w <= 0.0 {
            return 0.0;
        }
        let busy: f64 = self
            .samples
            .iter()
            .map(|s| {
                let from = (s.sent + s.late).max(self.started);
                let to = (s.sent + s.e2e).min(self.window_end);
                to.saturating_duration_since(from).as_secs_f64()
            })
            .sum();
        busy / w
    }

    /// Output tokens per second over the window, all requests together.
    pub fn aggregate_tps(&self) -> f64 {
        let w = self.window().as_secs_f64();
        if w > 0.0 {
            self.tokens_in_window() / w
        } else {
            0.0
        }
    }
}

/// What every level of a run shares.
#[derive(Clone)]
pub struct Driver {
    pub client: Arc<Client>,
    pub requests: Arc<RequestBuilder>,
    /// Numbers requests across the whole run, so every prompt differs.
    pub next_id: Arc<AtomicU64>,
    /// Set on Ctrl-C: no new request is sent; the ones in flight finish.
    pub interrupted: Arc<AtomicBool>,
}

/// What the workers of one level share.
struct Level {
    driver: Driver,
    handed_out: AtomicU64,
    stop: Stop,
    deadline: Instant,
    window_end: Mutex<Option<Instant>>,
    samples: Mutex<Vec<Sample>>,
    live: Arc<Live>,
}

impl Level {
    /// May a worker send another request? The first `false` ends the window.
    fn take(&self) -> bool {
        let more = !self.driver.interrupted.load(Ordering::Relaxed)
            && match self.stop {
                Stop::After(_) => Instant::now() < self.deadline,
                Stop::Requests(n) => self.handed_out.fetch_add(1, Ordering::Relaxed) < n,
            };
        if !more {
            let now = Instant::now();
            let mut end = self.window_end.lock().unwrap_or_else(|e| e.into_inner());
            let first = end.map_or(now, |e| e.min(now));
            *end = Some(match self.stop {
                Stop::After(_) => first.min(self.deadline),
                Stop::Requests(_) => first,
            });
        }
        more
    }

    async fn work(self: Arc<Self>) {
        let d = &self.driver;
        while self.take() {
            let id = d.next_id.fetch_add(1, Ordering::Relaxed);
            let body = d.requests.body(id, d.requests.output_tokens);
            self.live.sent.fetch_add(1, Ordering::Relaxed);
            let sample = d.client.send(d.requests.endpoint.path(), body).await;
            self.live.record(&sample);
            self.samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(sample);
        }
    }
}

impl Driver {
    /// Runs one level: `concurrency` workers until `stop` (or an interrupt), then waits for the
    /// requests still in flight.
    pub async fn run_level(&self, concurrency: usize, stop: Stop, live: Arc<Live>) -> LevelRun {
        let started = Instant::now();
        let deadline = match stop {
            Stop::After(d) => started + d,
            Stop::Requests(_) => started,
        };
        let level = Arc::new(Level {
            driver: self.clone(),
            handed_out: AtomicU64::new(0),
            stop,
            deadline,
            window_end: Mutex::new(None),
            samples: Mutex::new(Vec::new()),
            live,
        });
        let mut workers = JoinSet::new();
        for _ in 0..concurrency {
            workers.spawn(level.clone().work());
        }
        while let Some(joined) = workers.join_next().await {
            if let Err(e) = joined {
                tracing::error!(error = %e, "bench worker failed");
            }
        }
        let finished = Instant::now();
        let window_end = level
            .window_end
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(finished);
        let samples = std::mem::take(&mut *level.samples.lock().unwrap_or_else(|e| e.into_inner()));
        LevelRun {
            concurrency,
            rate: None,
            not_sent: 0,
            started,
            window_end,
            finished,
            samples,
        }
    }
}

/// The most requests the open loop keeps in flight. Past it a due request is not sent (and is
/// counted as such): each request in flight holds a connection, and a server that has stopped
/// answering would otherwise take the client's file descriptors and memory with it. Far above
/// what an engine batches, so a server that is merely slow never meets it.
pub const MAX_OUTSTANDING: usize = 4096;

/// One request of an open loop: when it is due, from the level's start, and what it sends.
#[derive(Debug)]
pub struct Due {
    pub offset: Duration,
    pub body: Vec<u8>,
}

/// Where an open loop's requests come from: the Poisson schedule of `--request-rate`, drawn as
/// it goes, or a trace, read as it is replayed.
pub trait Schedule {
    /// Why the schedule cannot go on (a trace's bad line).
    type Error;

    /// The next request, its body built, asked for once the one before it has been sent;
    /// `None` when the schedule is over. Offsets never go back.
    fn next_due(&mut self) -> impl Future<Output = Result<Option<Due>, Self::Error>> + Send;

    /// Where the window ends, from the level's start, once the schedule is over: at a deadline
    /// it stopped at, or (`None`) when its last request was due.
    fn window(&self) -> Option<Duration>;
}

/// The Poisson schedule of one `--request-rate` level.
struct Poisson {
    arrivals: Arrivals,
    stop: Stop,
    given: u64,
    requests: Arc<RequestBuilder>,
    next_id: Arc<AtomicU64>,
}

impl Schedule for Poisson {
    type Error = std::convert::Infallible;

    async fn next_due(&mut self) -> Result<Option<Due>, Self::Error> {
        let Some(offset) = self.arrivals.next() else {
            return Ok(None);
        };
        let within = match self.stop {
            Stop::After(d) => offset < d,
            Stop::Requests(n) => self.given < n,
        };
        if !within {
            return Ok(None);
        }
        self.given += 1;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = self.requests.body(id, self.requests.output_tokens);
        Ok(Some(Due { offset, body }))
    }

    fn window(&self) -> Option<Duration> {
        match self.stop {
            Stop::After(d) => Some(d),
            Stop::Requests(_) => None,
        }
    }
}

impl Driver {
    /// Runs one open-loop level: requests sent at `rate` requests/s on the Poisson schedule of
    /// `seed`, until `stop` (the window ends at the deadline, or when the last request is
    /// due), then waits for the requests still in flight.
    pub async fn run_open(&self, rate: f64, seed: u64, stop: Stop, live: Arc<Live>) -> LevelRun {
        let mut schedule = Poisson {
            arrivals: Arrivals::new(rate, seed),
            stop,
            given: 0,
            requests: self.requests.clone(),
            next_id: self.next_id.clone(),
        };
        match self.run_schedule(&mut schedule, Some(rate), live).await {
            Ok(run) => run,
            Err(never) => match never {},
        }
    }

    /// Runs one open-loop level on any schedule: each request is sent when it is due, whatever
    /// the server is doing, and measured from that time; once the schedule is over (or on an
    /// interrupt) the requests still in flight are waited for. The level starts when the first
    /// request is in hand, so reading ahead (a trace's first lines) is not counted as lateness.
    /// A schedule's error ends the level at once: the requests in flight are cut off.
    pub async fn run_schedule<S: Schedule>(
        &self,
        schedule: &mut S,
        rate: Option<f64>,
        live: Arc<Live>,
    ) -> Result<LevelRun, S::Error> {
        let mut next = if self.interrupted.load(Ordering::Relaxed) {
            None
        } else {
            schedule.next_due().await?
        };
        let started = Instant::now();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let mut peak = 0usize;
        let mut not_sent = 0u64;
        let mut tasks = JoinSet::new();
        let mut last_due = started;
        while let Some(Due { offset, body }) = next.take() {
            // A time past what the clock can hold (a trace's absurd timestamp) is never due.
            let Some(due) = started.checked_add(offset) else {
                break;
            };
            if !self.wait_until(due).await {
                break;
            }
            last_due = due;
            // Finished tasks are reaped as we go, so the set holds only those in flight.
            while let Some(joined) = tasks.try_join_next() {
                if let Err(e) = joined {
                    tracing::error!(error = %e, "bench request task failed");
                }
            }
            let now_in_flight = in_flight.load(Ordering::Relaxed);
            if now_in_flight >= MAX_OUTSTANDING {
                not_sent += 1;
            } else {
                peak = peak.max(now_in_flight + 1);
                in_flight.fetch_add(1, Ordering::Relaxed);
                let d = self.clone();
                let (samples, in_flight, live) = (samples.clone(), in_flight.clone(), live.clone());
                tasks.spawn(async move {
                    live.sent.fetch_add(1, Ordering::Relaxed);
                    let sample = d
                        .client
                        .send_scheduled(d.requests.endpoint.path(), body, due)
                        .await;
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                    live.record(&sample);
                    samples
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(sample);
                });
            }
            if self.interrupted.load(Ordering::Relaxed) {
                break;
            }
            next = schedule.next_due().await?;
        }
        let interrupted = self.interrupted.load(Ordering::Relaxed);
        let window_end = match schedule.window() {
            Some(d) if !interrupted => started + d,
            _ => last_due.max(started),
        };
        while let Some(joined) = tasks.join_next().await {
            if let Err(e) = joined {
                tracing::error!(error = %e, "bench request task failed");
            }
        }
        let finished = Instant::now();
        let mut samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
        // In the order they were due, whatever order they ended in.
        samples.sort_by_key(|s| s.sent);
        Ok(LevelRun {
            concurrency: peak,
            rate,
            not_sent,
            started,
            window_end,
            finished,
            samples,
        })
    }
}

/// How often an open loop waiting for a request's due time looks for an interrupt: a trace may
/// wait minutes between two requests, and Ctrl-C should not.
const INTERRUPT_POLL: Duration = Duration::from_millis(100);

impl Driver {
    /// Sleeps until `due`; false when interrupted first.
    async fn wait_until(&self, due: Instant) -> bool {
        loop {
            if self.interrupted.load(Ordering::Relaxed) {
                return false;
            }
            let now = Instant::now();
            if now >= due {
                return true;
            }
            let wake = due.min(now + INTERRUPT_POLL);
            tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
        }
    }
}

/// After a failed request a ramp worker waits this long, so an unreachable server is not
/// hammered in a tight loop.
const RAMP_ERROR_BACKOFF: Duration = Duration::from_millis(200);

/// The `(prompt tokens, output tokens)` of request number `n` of a ramp.
pub type Sizes = Arc<dyn Fn(u64) -> (usize, u64) + Send + Sync>;

/// Called with every request a ramp finished (complete or failed, not cut off by an abort).
pub type OnDone = Arc<dyn Fn(&Sample) + Send + Sync>;

/// What a ramp's workers count as they go.
#[derive(Debug, Default)]
pub struct RampCounts {
    pub in_flight: AtomicUsize,
    /// Requests sent (complete, failed, or cut off by an abort).
    pub started: AtomicU64,
    pub completed: AtomicU64,
    pub errors: AtomicU64,
    /// Output tokens received, counted event by event as they arrive.
    pub tokens: AtomicU64,
}

/// A running closed loop whose concurrency follows [`Ramp::set_target`].
pub struct Ramp {
    target: watch::Sender<usize>,
    counts: Arc<RampCounts>,
    workers: Vec<JoinHandle<()>>,
}

impl Driver {
    /// Starts `workers` workers (idle until [`Ramp::set_target`]), sending requests sized by
    /// `sizes` and reporting each finished one to `on_done`. Workers a new target wakes start at
    /// once, together, as a load test's level does.
    pub fn ramp(&self, workers: usize, sizes: Sizes, on_done: OnDone) -> Ramp {
        self.ramp_joining(workers, sizes, on_done, Duration::ZERO)
    }

    /// As [`Driver::ramp`], but a worker a new target wakes joins within `spread` of it, each
    /// at its own moment (spread evenly whatever the number that join): users who arrive on
    /// their own, not a level that starts at one instant. Clients that start together with
    /// equal lengths stay in step, which is a load test's traffic, not a service's.
    pub fn ramp_joining(
        &self,
        workers: usize,
        sizes: Sizes,
        on_done: OnDone,
        spread: Duration,
    ) -> Ramp {
        let (target, rx) = watch::channel(0usize);
        let counts = Arc::new(RampCounts::default());
        let workers = (0..workers)
            .map(|i| {
                tokio::spawn(ramp_worker(
                    i,
                    spread.mul_f64(join_fraction(i)),
                    self.clone(),
                    rx.clone(),
                    Arc::clone(&counts),
                    Arc::clone(&sizes),
                    Arc::clone(&on_done),
                ))
            })
            .collect();
        Ramp {
            target,
            counts,
            workers,
        }
    }
}

impl Ramp {
    /// Sets how many requests should be in flight.
    pub fn set_target(&self, n: usize) {
        self.target.send_replace(n);
    }

    pub fn counts(&self) -> &RampCounts {
        &self.counts
    }

    /// Sends no new request and waits for those in flight to finish.
    pub async fn finish(&self) {
        self.set_target(0);
        while self.counts.in_flight.load(Ordering::Relaxed) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Cancels every request still in flight (the clients hang up) and stops the workers; returns
    /// the counts, final.
    pub async fn abort(mut self) -> Arc<RampCounts> {
        for w in &self.workers {
            w.abort();
        }
        for w in self.workers.iter_mut() {
            let _ = w.await;
        }
        self.counts
    }
}

/// Counts a request in flight for as long as it lives, however it ends (even when aborted).
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        InFlight(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where in a join's spread worker `i` joins: the fractional parts of `i` times the golden
/// ratio, which spread any run of consecutive workers evenly over [0, 1).
fn join_fraction(i: usize) -> f64 {
    (i as f64 * 0.618_033_988_749_895).fract()
}

async fn ramp_worker(
    i: usize,
    join_after: Duration,
    d: Driver,
    mut target: watch::Receiver<usize>,
    counts: Arc<RampCounts>,
    sizes: Sizes,
    on_done: OnDone,
) {
    let mut active = false;
    loop {
        if *target.borrow() <= i {
            active = false;
        }
        if target.wait_for(|&t| t > i).await.is_err() {
            return;
        }
        if !active {
            // Woken by a new target: join at this worker's own moment of the spread.
            active = true;
            if !join_after.is_zero() {
                tokio::time::sleep(join_after).await;
            }
        }
        let id = d.next_id.fetch_add(1, Ordering::Relaxed);
        let (prompt_tokens, output_tokens) = sizes(id);
        let body = d.requests.body_sized(id, prompt_tokens, output_tokens);
        let sample = {
            let _guard = InFlight::new(&counts.in_flight);
            counts.started.fetch_add(1, Ordering::Relaxed);
            d.client
                .send_counting(d.requests.endpoint.path(), body, &counts.tokens)
                .await
        };
        on_done(&sample);
        if sample.is_ok() {
            counts.completed.fetch_add(1, Ordering::Relaxed);
        } else {
            counts.errors.fetch_add(1, Ordering::Relaxed);
            if let Some(e) = &sample.error {
                tracing::debug!(error = %e, "ramp request failed");
            }
            tokio::time::sleep(RAMP_ERROR_BACKOFF).await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;
    use crate::bench::prompt::Endpoint;

    /// The requests of a list, last first.
    struct Fixed(Vec<Due>);

    impl Schedule for Fixed {
        type Error = std::convert::Infallible;

        async fn next_due(&mut self) -> Result<Option<Due>, Self::Error> {
            Ok(self.0.pop())
        }

        fn window(&self) -> Option<Duration> {
            None
        }
    }

    fn driver() -> Driver {
        Driver {
            // Nothing listens there; no request is sent.
            client: Arc::new(Client::new(
                "http://127.0.0.1:9/v1".into(),
                None,
                Duration::from_secs(1),
            )),
            requests: Arc::new(RequestBuilder {
                endpoint: Endpoint::Chat,
                model: "m".into(),
                prompt_tokens: 1,
                shared_prefix_tokens: 0,
                output_tokens: 1,
                seed: 0,
            }),
            next_id: Default::default(),
            interrupted: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_time_past_the_clocks_reach_is_never_due() {
        let mut far = Fixed(vec![Due {
            offset: Duration::MAX,
            body: Vec::new(),
        }]);
        let run = driver()
            .run_schedule(&mut far, None, Default::default())
            .await
            .unwrap();
        assert!(run.samples.is_empty() && run.not_sent == 0);
        assert_eq!(run.window_end, run.started);
    }

    #[tokio::test]
    async fn an_interrupt_ends_the_wait_for_the_next_request() {
        let d = driver();
        let flag = d.interrupted.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            flag.store(true, Ordering::Relaxed);
        });
        let started = Instant::now();
        let mut hour = Fixed(vec![Due {
            offset: Duration::from_secs(3600),
            body: Vec::new(),
        }]);
        let run = d
            .run_schedule(&mut hour, None, Default::default())
            .await
            .unwrap();
        assert!(run.samples.is_empty());
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
    }
}
