//! The measurement behind having no admission queue (docs/operations.md, "Overload"): a burst above
//! `--max-in-flight`, and a sustained overload, each met two ways side by side. Shed: the 503
//! with `Retry-After: 1`, which the client honours, retrying twice at most (as OpenAI's SDKs
//! do). A 2 s queue, emulated: the client asks again every 10 ms for up to 2 s, so it is
//! admitted within 10 ms of a place freeing, as a queue in the proxy would admit it (minus the
//! memory the queue would hold). A report, not a check: `cargo test --test it queue_or_shed
//! -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use crate::support::client::{chat_request, post};
use crate::support::upstream::{self, openai_chat, Reply};
use crate::support::{serial, spawn_proxy, Rng};

/// One client: the time from its first attempt to its stream's first byte (`None`: it gave
/// up), and how many attempts it made.
async fn one(url: String, queue: Option<Duration>) -> (Option<Duration>, u32) {
    let start = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        let sent = Instant::now();
        let seen = post(&url, &chat_request(true, true)).await;
        if seen.status == 200 {
            let first = seen.frames.first().map_or(Duration::ZERO, |f| f.0);
            return (Some(sent - start + first), tries);
        }
        match queue {
            Some(t) if start.elapsed() < t => tokio::time::sleep(Duration::from_millis(10)).await,
            Some(_) => return (None, tries),
            None if tries <= 2 => tokio::time::sleep(Duration::from_secs(1)).await,
            None => return (None, tries),
        }
    }
}

fn pct(v: &mut [Duration], p: usize) -> Duration {
    v.sort();
    v.get((v.len() * p / 100).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of 30 s, reported, not checked"]
async fn queue_or_shed() {
    let _turn = serial().await;
    // Streams of 0.5-1.5 s (10-30 tokens 50 ms apart), so places free at spread-out times.
    let rng = std::sync::Mutex::new(Rng::new(28));
    let up = upstream::spawn(move |_| {
        let n = rng.lock().expect("rng").range(10, 30);
        Reply::sse(openai_chat(
            Duration::ZERO,
            n,
            Duration::from_millis(50),
            true,
        ))
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &["--max-in-flight", "10"]).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    for (name, queue) in [
        ("shed, Retry-After", None),
        ("2 s queue", Some(Duration::from_secs(2))),
    ] {
        // A burst: 30 at once against a cap of 10.
        let tasks: Vec<_> = (0..30)
            .map(|_| tokio::spawn(one(url.clone(), queue)))
            .collect();
        let (mut first, mut failed, mut tries) = (Vec::new(), 0, 0);
        for t in tasks {
            let (d, n) = t.await.expect("client");
            tries += n;
            match d {
                Some(d) => first.push(d),
                None => failed += 1,
            }
        }
        eprintln!(
            "burst, {name}: {} streamed, {failed} gave up, {tries} attempts; first byte p50 {:?} p90 {:?}",
            first.len(),
            pct(&mut first, 50),
            pct(&mut first, 90)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Sustained: 30 clients in a closed loop for 8 s.
        let end = Instant::now() + Duration::from_secs(8);
        let tasks: Vec<_> = (0..30)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move {
                    let (mut failed, mut first) = (0, Vec::new());
                    while Instant::now() < end {
                        match one(url.clone(), queue).await.0 {
                            Some(d) => first.push(d),
                            None => failed += 1,
                        }
                    }
                    (failed, first)
                })
            })
            .collect();
        let (mut failed, mut first) = (0, Vec::new());
        for t in tasks {
            let (f, mut d) = t.await.expect("client");
            failed += f;
            first.append(&mut d);
        }
        eprintln!(
            "sustained, {name}: {} streamed, {failed} gave up; first byte p50 {:?} p90 {:?}",
            first.len(),
            pct(&mut first, 50),
            pct(&mut first, 90)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
