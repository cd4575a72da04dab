//! How many inference engines the proxy's traffic is spread over (`--replicas`), found on its
//! own when asked, the way `--gpus auto` finds the GPUs.
//!
//! The capacity model is per engine: in front of N replicas (the gateway) the decoding
//! concurrency tokenmeter sees is spread over them, so it is divided by N. `--replicas N` gives
//! the number; `--replicas auto` counts the distinct addresses the upstream's host name resolves
//! to. A Kubernetes headless Service (`clusterIP: None`) has one A/AAAA record per ready pod, so
//! that count follows the Deployment as it scales; it is re-resolved every [`REFRESH`]. The
//! count never falls below 1 (a name with no address yet still has the engine the traffic
//! reaches), and a lookup that fails keeps the last count (a DNS hiccup is not a scale-in).
//! A ClusterIP Service or a load balancer resolves to one virtual address: auto then counts 1,
//! and `--replicas N` is the way.
//!
//! The lookup is behind [`Resolve`], so the watch loop is tested with a scripted resolver and
//! paused time; [`System`] asks the operating system's resolver.

use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// How often `--replicas auto` resolves the upstream again: as often as the records of a
/// headless Service change in practice (kube-dns and CoreDNS answer with a 5-30 s TTL), and
/// rarely enough that a lookup (a blocking `getaddrinfo` on tokio's blocking pool) costs
/// nothing.
pub const REFRESH: Duration = Duration::from_secs(30);

/// Longest wait for one lookup; a slower one counts as failed and the last count stays.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// `--replicas`: a number, or `auto`; one engine by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Fixed(u32),
    Auto,
}

impl Default for Setting {
    fn default() -> Self {
        Setting::Fixed(1)
    }
}

/// As the flag spells it: the number, or `auto`.
impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Setting::Fixed(n) => write!(f, "{n}"),
            Setting::Auto => f.write_str("auto"),
        }
    }
}

impl Setting {
    /// The count to start with: the number itself, or 1 until the first lookup answers.
    pub fn initial(self) -> u32 {
        match self {
            Setting::Fixed(n) => n,
            Setting::Auto => 1,
        }
    }
}

/// Why `--replicas` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--replicas must be auto or a whole number of 1 or more, got {0:?}")]
pub struct BadReplicas(pub String);

/// Parses `--replicas` (`auto`, or a whole number of at least 1).
pub fn parse(s: &str) -> Result<Setting, BadReplicas> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("auto") {
        return Ok(Setting::Auto);
    }
    t.parse::<u32>()
        .ok()
        .filter(|n| *n >= 1)
        .map(Setting::Fixed)
        .ok_or_else(|| BadReplicas(s.to_string()))
}

/// The number of replicas a lookup's addresses stand for: distinct addresses, at least 1.
pub fn count(addrs: &[IpAddr]) -> u32 {
    let distinct: BTreeSet<_> = addrs.iter().collect();
    u32::try_from(distinct.len()).unwrap_or(u32::MAX).max(1)
}

/// The future a [`Resolve`] returns.
pub type Lookup<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Resolves a host name to its addresses.
pub trait Resolve: Send + Sync + 'static {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Lookup<'a>;
}

/// The operating system's resolver (`getaddrinfo`, through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct System;

impl Resolve for System {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Lookup<'a> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host, port)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// What one lookup decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refresh {
    /// The count is this (it may be the same as before).
    Count(u32),
    /// The lookup failed or timed out: keep the last count.
    Failed(String),
}

/// One lookup of `host`, within [`LOOKUP_TIMEOUT`].
pub async fn refresh(resolver: &dyn Resolve, host: &str, port: u16) -> Refresh {
    match tokio::time::timeout(LOOKUP_TIMEOUT, resolver.resolve(host, port)).await {
        Ok(Ok(addrs)) => Refresh::Count(count(&addrs)),
        Ok(Err(e)) => Refresh::Failed(e.to_string()),
        Err(_) => Refresh::Failed(format!("no answer within {LOOKUP_TIMEOUT:?}")),
    }
}

/// `--replicas auto`'s loop: resolves `host` at once and every `period`, and calls `set` with
/// each new count. A failure is logged when the last lookup worked (not every 30 s while DNS is
/// down), a change of count always. Runs until aborted.
pub async fn watch(
    resolver: Arc<dyn Resolve>,
    host: String,
    port: u16,
    period: Duration,
    set: impl Fn(u32) + Send + 'static,
) {
    let mut last: Option<u32> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match refresh(resolver.as_ref(), &host, port).await {
            Refresh::Count(n) => {
                failing = false;
                if last != Some(n) {
                    tracing::info!(
                        replicas = n,
                        host = %host,
                        "--replicas auto: the upstream's host resolves to {n} distinct address(es)"
                    );
                    last = Some(n);
                    set(n);
                }
            }
            Refresh::Failed(why) => {
                if !failing {
                    tracing::warn!(
                        host = %host,
                        error = %why,
                        "--replicas auto: cannot resolve the upstream's host; keeping {} replica(s)",
                        last.unwrap_or(1)
                    );
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;

    #[test]
    fn the_flag_is_auto_or_a_whole_number_of_at_least_one() {
        assert_eq!(parse("auto"), Ok(Setting::Auto));
        assert_eq!(parse(" AUTO "), Ok(Setting::Auto));
        assert_eq!(parse("4"), Ok(Setting::Fixed(4)));
        for bad in ["0", "-1", "1.5", "two", "", "4294967296"] {
            assert_eq!(parse(bad), Err(BadReplicas(bad.to_string())), "{bad}");
        }
        let line = BadReplicas("0".into()).to_string();
        assert_eq!(
            line,
            "--replicas must be auto or a whole number of 1 or more, got \"0\""
        );
        assert_eq!(Setting::Auto.initial(), 1);
        assert_eq!(Setting::Fixed(3).initial(), 3);
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn distinct_addresses_are_counted_with_a_floor_of_one() {
        assert_eq!(count(&[]), 1);
        assert_eq!(count(&[ip("10.0.0.1")]), 1);
        // getaddrinfo repeats an address once per socket type; it is one pod.
        let pods = [
            ip("10.0.0.1"),
            ip("10.0.0.2"),
            ip("10.0.0.1"),
            ip("fd00::3"),
        ];
        assert_eq!(count(&pods), 3);
    }

    /// Answers with the next scripted result each time (the last one forever after).
    struct Scripted(Mutex<VecDeque<io::Result<Vec<IpAddr>>>>);

    impl Resolve for Scripted {
        fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Lookup<'a> {
            assert_eq!((host, port), ("vllm-headless", 8000));
            let mut q = self.0.lock().expect("lock");
            let next = if q.len() > 1 { q.pop_front() } else { None };
            let r = match next {
                Some(r) => r,
                None => match q.front() {
                    Some(Ok(v)) => Ok(v.clone()),
                    _ => Err(io::Error::other("no such host")),
                },
            };
            Box::pin(async move { r })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn auto_follows_the_records_keeps_the_count_on_failure_and_never_goes_below_one() {
        let pods = |n: u8| Ok((1..=n).map(|i| IpAddr::from([10, 0, 0, i])).collect());
        let script = VecDeque::from([
            pods(3),
            pods(5),
            Err(io::Error::other("SERVFAIL")),
            pods(0),
            pods(2),
        ]);
        let resolver: Arc<dyn Resolve> = Arc::new(Scripted(Mutex::new(script)));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let now = Arc::new(AtomicU32::new(Setting::Auto.initial()));
        let (s, n) = (Arc::clone(&seen), Arc::clone(&now));
        let task = tokio::spawn(watch(
            resolver,
            "vllm-headless".into(),
            8000,
            REFRESH,
            move |c| {
                n.store(c, Ordering::Relaxed);
                s.lock().expect("lock").push(c);
            },
        ));
        // The first lookup runs at once; each later one a period apart.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(now.load(Ordering::Relaxed), 3);
        tokio::time::sleep(REFRESH).await;
        assert_eq!(now.load(Ordering::Relaxed), 5);
        // The lookup fails: the count stays.
        tokio::time::sleep(REFRESH).await;
        assert_eq!(now.load(Ordering::Relaxed), 5);
        // No address: the floor.
        tokio::time::sleep(REFRESH).await;
        assert_eq!(now.load(Ordering::Relaxed), 1);
        tokio::time::sleep(REFRESH * 3).await;
        task.abort();
        // Only changes are passed on.
        assert_eq!(*seen.lock().expect("lock"), [3, 5, 1, 2]);
    }

    /// Never answers.
    struct Hangs;

    impl Resolve for Hangs {
        fn resolve<'a>(&'a self, _: &'a str, _: u16) -> Lookup<'a> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lookup_that_never_answers_fails_after_the_timeout() {
        let r = refresh(&Hangs, "h", 1).await;
        assert!(
            matches!(&r, Refresh::Failed(why) if why.contains("no answer within")),
            "{r:?}"
        );
    }

    #[tokio::test]
    async fn the_system_resolver_finds_an_address_literal() {
        let r = refresh(&System, "127.0.0.1", 80).await;
        assert_eq!(r, Refresh::Count(1));
    }
}
