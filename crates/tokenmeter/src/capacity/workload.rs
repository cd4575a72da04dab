//! The live mix: the last requests' prompt, cached and output lengths, and their first token's
//! wait, over the capacity window.
//!
//! A prediction of TTFT is only as true as the workload it assumes, so the model replays this
//! mix, and the metrics, the page and `tokenmeter capacity` show its means beside the answers.
//! It keeps the last [`KEEP`] requests: a sample, not a history, so memory is fixed whatever the
//! traffic. One lock per finished request (not per chunk).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Requests kept: enough for a 0.9 quantile of the prefill cost and a varied mix (the replay
/// draws from them), small enough (144 bytes each on x86-64 Linux, 144 KiB in all) to be little
/// beside the rest of the model.
pub const KEEP: usize = 1024;

/// One request of the mix as the replay runs it ([`super::replay`]): its uncached prompt tokens and its output tokens (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub uncached: u32,
    pub output: u32,
}

/// What one finished request says about the engine's first-token work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// When it ended.
    pub at: Instant,
    /// When it arrived at the proxy: with its TTFT, when its first token came, which tells the
    /// requests one step admitted together ([`super::prefill`]) and how the window's requests
    /// arrived ([`super::arrivals`]).
    pub arrival: Instant,
    /// Prompt tokens, and those of them the prefix cache served.
    pub prompt: u32,
    pub cached: u32,
    pub output: u32,
    /// Arrival to the first token, as the proxy saw it.
    pub ttft: Option<f64>,
    /// The engine's own prefill and queue times, where its stream stated them.
    pub stated_prefill: Option<f64>,
    pub stated_queue: Option<f64>,
    /// The end of the step that was running when it arrived, as the proxy saw it: the one step
    /// end seen between its arrival and its first token's own ([`super::step_ends`]); `None`
    /// where there was none or more than one.
    pub step_end: Option<Instant>,
    /// Its decode tokens/s, as the proxy saw it (for the model's self-check).
    pub tps: Option<f64>,
    /// The mean number of requests in flight per engine while it decoded (the context term's
    /// concurrency, [`super::context`]).
    pub batch: Option<f64>,
}

impl Request {
    pub fn uncached(&self) -> u32 {
        self.prompt.saturating_sub(self.cached)
    }

    /// When its first token came, where it had one.
    pub fn first_token(&self) -> Option<Instant> {
        let ttft = self.ttft.filter(|t| t.is_finite() && *t >= 0.0)?;
        self.arrival
            .checked_add(std::time::Duration::try_from_secs_f64(ttft).ok()?)
    }
}

/// The means of the mix: the workload a prediction assumes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mix {
    pub requests: usize,
    pub prompt: f64,
    pub cached: f64,
    pub output: f64,
}

/// The bounded window of recent requests.
pub struct Workload {
    window: Duration,
    kept: Mutex<VecDeque<Request>>,
}

impl Workload {
    pub fn new(window: Duration) -> Self {
        Workload {
            window,
            kept: Mutex::new(VecDeque::with_capacity(KEEP)),
        }
    }

    pub fn push(&self, r: Request) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() == KEEP {
            kept.pop_front();
        }
        kept.push_back(r);
    }

    /// The requests within the window that ends at `now`, oldest first.
    pub fn recent(&self, now: Instant) -> Vec<Request> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter()
            .filter(|r| now.saturating_duration_since(r.at) <= self.window)
            .copied()
            .collect()
    }
}

/// The replay's jobs: each request's uncached prompt and output.
pub fn jobs(requests: &[Request]) -> Vec<Job> {
    requests
        .iter()
        .map(|r| Job {
            uncached: r.uncached(),
            output: r.output.max(1),
        })
        .collect()
}

/// The jobs' `(uncached prompt, output)` lengths: what the memory footprint reads.
pub fn lengths(jobs: &[Job]) -> impl Iterator<Item = (u32, u32)> + '_ {
    jobs.iter().map(|j| (j.uncached, j.output))
}

/// The means; `None` for an empty window.
pub fn mix(requests: &[Request]) -> Option<Mix> {
    if requests.is_empty() {
        return None;
    }
    let n = requests.len() as f64;
    let mean = |f: fn(&Request) -> u32| requests.iter().map(|r| f64::from(f(r))).sum::<f64>() / n;
    Some(Mix {
        requests: requests.len(),
        prompt: mean(|r| r.prompt),
        cached: mean(|r| r.cached),
        output: mean(|r| r.output),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(at: Instant, prompt: u32, cached: u32, output: u32) -> Request {
        Request {
            at,
            arrival: at,
            prompt,
            cached,
            output,
            ttft: None,
            stated_prefill: None,
            stated_queue: None,
            step_end: None,
            tps: None,
            batch: None,
        }
    }

    #[test]
    fn the_window_keeps_the_last_requests_within_its_span() {
        let t0 = Instant::now();
        let w = Workload::new(Duration::from_secs(60));
        for i in 0..(KEEP as u64 + 10) {
            w.push(req(t0 + Duration::from_millis(i), 100, 40, 10));
        }
        let now = t0 + Duration::from_secs(2);
        assert_eq!(w.recent(now).len(), KEEP);
        assert_eq!(w.recent(now)[0].at, t0 + Duration::from_millis(10));
        assert!(w.recent(t0 + Duration::from_secs(120)).is_empty());
        let m = mix(&w.recent(now)).expect("a mix");
        assert_eq!(
            (m.requests, m.prompt, m.cached, m.output),
            (KEEP, 100.0, 40.0, 10.0)
        );
        assert_eq!(
            jobs(&w.recent(now)[..1]),
            vec![Job {
                uncached: 60,
                output: 10
            }]
        );
        assert_eq!(mix(&[]), None);
        // More cached than prompt (a stream that says so) is no negative work.
        assert_eq!(req(t0, 10, 20, 1).uncached(), 0);
    }
}
