//! What the integration tests of the workspace's crates share: a proxy and the simulator in
//! the test process, scripted upstreams, a client that timestamps frames, the metric matchers,
//! the corpus loader, the serial turn, and how a test that cannot run says so.
//!
//! A crate of its own so that the root package's tests (`tests/it`) and the tools' tests
//! (`crates/tools/tests`) use one copy; it is never published and nothing but tests uses it.

pub mod client;
pub mod corpus;
pub mod metrics;
pub mod proxy;
pub mod sim;
pub mod skip;
pub mod upstream;

pub use proxy::{
    config, config_of, spawn, spawn_proxy, with_engine_metrics_off, Proxy, ENGINE_METRICS_OFF,
};
pub use sim::{sim_flags, start_sim};
pub use skip::{current_test, skip};

/// One test at a time among those that take it. The resource they share is the CPU's
/// promptness: a test takes the turn when it keeps the CPU busy (a flood, megabytes through the
/// proxy, every split of the corpus) or when an assertion of its could fail on a busy machine
/// (a time, a rate, or a fit from timed steps held to a tolerance; an ordering that needs a
/// sleep to be long enough). On a 2-core machine a busy test starves a timing test's timers,
/// and the timing test then measures the machine instead of the code. A test that asserts only
/// counts, bytes, labels or exit codes, and waits for conditions rather than for time, does not
/// take it: a slow machine makes it slower, never wrong. The turn is the process's: `cargo
/// test` runs one test binary at a time, so the root package's and the tools' never overlap.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Takes the serial turn in an async test.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// Takes the serial turn in a plain (non-async) test.
pub fn serial_blocking() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.blocking_lock()
}

/// A fresh, empty directory for a test's files, named by `name` and this process.
pub fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tokenmeter-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    dir
}

/// True when the suite runs in CI, where missing prerequisites are failures, not skips.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Watches, from a plain thread of its own, how long this process waits for a CPU: the thread
/// sleeps a millisecond at a time, and any longer gap is the machine's (the suite shares two
/// cores with builds), not a runtime's, since the thread runs no task.
pub struct StallWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<std::time::Duration>,
}

impl StallWatch {
    pub fn start() -> StallWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let tick = std::time::Duration::from_millis(1);
            let (mut worst, mut last) = (std::time::Duration::ZERO, std::time::Instant::now());
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(tick);
                let now = std::time::Instant::now();
                worst = worst.max((now - last).saturating_sub(tick));
                last = now;
            }
            worst
        });
        StallWatch { stop, thread }
    }

    /// The longest wait beyond its tick the thread saw.
    pub fn worst(self) -> std::time::Duration {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the watching thread")
    }
}
