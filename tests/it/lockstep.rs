//! No byte waits for the next one: an upstream in lockstep with the client.
//!
//! The proxy must hand every byte the upstream sent to the client at once: parsing happens on
//! the side and may never delay a byte. A timing threshold cannot show that on a loaded machine;
//! a lockstep can. The upstream here sends each step only after the client has received every
//! byte of the step before, so a proxy that holds any bytes back (waiting for more to fill a
//! buffer, for the end of an SSE line, for a wake-up that never comes, for a flush) never lets
//! the exchange go on: the step times out and the test names the step. The timeout is a deadlock
//! detector, not a threshold: an exchange that goes through takes microseconds per step.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::support::raw::read_request;
use crate::support::spawn_proxy;

/// How long a step may wait for bytes the upstream has already sent. Only a proxy holding them
/// comes near it; it is long so that a loaded machine cannot fail the test.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

const HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                    transfer-encoding: chunked\r\n\r\n";

/// One content event whose text is `marker`.
fn event(marker: &str) -> String {
    format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{marker}\"}},\"finish_reason\":null}}]}}\n\n"
    )
}

/// One chunk of the chunked encoding.
fn chunk(payload: &str) -> String {
    format!("{:x}\r\n{payload}\r\n", payload.len())
}

/// What the upstream writes at one step (one `write`), and the bytes the client must have
/// received from the proxy before the upstream may go on.
struct Step {
    write: String,
    expect: Vec<String>,
}

fn step(write: String, expect: &[&str]) -> Step {
    Step {
        write,
        expect: expect.iter().map(|s| s.to_string()).collect(),
    }
}

/// The upstream: answers one request per connection with `steps`, each written when `go` says
/// so. Returns its address.
async fn lockstep_upstream(steps: Vec<Step>, mut go: mpsc::UnboundedReceiver<()>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let _ = s.set_nodelay(true);
        let _ = read_request(&mut s, &mut Vec::new(), None).await;
        for st in &steps {
            if go.recv().await.is_none() {
                return;
            }
            if s.write_all(st.write.as_bytes()).await.is_err() {
                return;
            }
        }
        // Keep the connection open until the proxy is done with it.
        let mut tmp = [0u8; 256];
        while matches!(s.read(&mut tmp).await, Ok(n) if n > 0) {}
    });
    format!("http://{addr}")
}

/// Runs one lockstep exchange through a proxy started with `flags`; panics naming the first
/// step whose bytes the proxy held back. Returns everything the client received.
async fn run(steps: Vec<Step>, flags: &[&str]) -> String {
    let expects: Vec<Vec<String>> = steps.iter().map(|s| s.expect.clone()).collect();
    let (go_tx, go_rx) = mpsc::unbounded_channel();
    let upstream = lockstep_upstream(steps, go_rx).await;
    let proxy = spawn_proxy(&upstream, flags).await;
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut c = TcpStream::connect(proxy.addr).await.expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut tmp = [0u8; 16 * 1024];
    for (i, expect) in expects.iter().enumerate() {
        go_tx.send(()).expect("upstream gone");
        // Everything up to this step must arrive without the upstream sending another byte.
        let seen = |got: &[u8], from: usize| {
            let text = String::from_utf8_lossy(got);
            expect
                .iter()
                .all(|m| text[from.min(text.len())..].contains(m.as_str()))
        };
        let from = got.len();
        let waited = tokio::time::timeout(STEP_TIMEOUT, async {
            while !seen(&got, from) {
                match c.read(&mut tmp).await {
                    Ok(n) if n > 0 => got.extend_from_slice(&tmp[..n]),
                    _ => return false,
                }
            }
            true
        })
        .await;
        match waited {
            Ok(true) => {}
            Ok(false) => panic!(
                "step {i}: the connection ended before {expect:?} arrived; got {:?}",
                String::from_utf8_lossy(&got)
            ),
            Err(_) => panic!(
                "step {i}: the proxy held back bytes the upstream had sent ({expect:?}); \
                 the client had {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// The steps of a stream of `n` events, one per chunk, one chunk per step, after the head.
fn one_event_per_step(n: usize) -> Vec<Step> {
    let mut steps = vec![step(HEAD.into(), &["HTTP/1.1 200"])];
    for i in 0..n {
        let m = format!("tok-{i}-");
        steps.push(step(chunk(&event(&m)), &[&m]));
    }
    steps.push(step(
        format!("{}0\r\n\r\n", chunk("data: [DONE]\n\n")),
        &["[DONE]", "0\r\n\r\n"],
    ));
    steps
}

#[tokio::test]
async fn the_head_and_every_event_reach_the_client_before_the_upstream_sends_more() {
    // The head alone first (an inference server sends it before its prefill), then each event
    // only once the client has the one before: the first after a quiet connection, as at
    // concurrency 1.
    let got = run(one_event_per_step(8), &[]).await;
    assert_eq!(got.matches("tok-").count(), 8, "{got}");
}

#[tokio::test]
async fn an_event_that_arrives_with_the_head_is_not_held_for_the_next() {
    // The head and the first event in one write: the upstream connection reads both before
    // the response body exists, so the first event waits in its read buffer.
    let mut steps = one_event_per_step(4);
    let first = steps.remove(1);
    steps[0].write.push_str(&first.write);
    steps[0].expect.extend(first.expect);
    run(steps, &[]).await;
}

#[tokio::test]
async fn two_events_in_one_read_both_reach_the_client() {
    // Two chunks in one write: the second waits in the upstream connection's read buffer after
    // the first is handed over (the body channel holds one chunk).
    let mut steps = vec![step(HEAD.into(), &["HTTP/1.1 200"])];
    for i in 0..4 {
        let (a, b) = (format!("pair-{i}a-"), format!("pair-{i}b-"));
        steps.push(step(
            format!("{}{}", chunk(&event(&a)), chunk(&event(&b))),
            &[&a, &b],
        ));
    }
    run(steps, &[]).await;
}

#[tokio::test]
async fn half_an_event_is_forwarded_before_its_end_arrives() {
    // The parser needs the whole line; the client does not wait for it.
    let ev = event("split-");
    let (a, b) = ev.split_at(ev.find("split-").expect("marker") + 3);
    let steps = vec![
        step(HEAD.into(), &["HTTP/1.1 200"]),
        step(chunk(a), &["\"content\":\"spl"]),
        step(chunk(b), &["it-\"}"]),
        step(chunk(&event("after-")), &["after-"]),
    ];
    run(steps, &[]).await;
}

#[tokio::test]
async fn with_inject_usage_every_whole_event_reaches_the_client_before_the_next() {
    // --inject-usage filters the usage event out, so it must see whole events; a whole one is
    // passed on at once.
    let got = run(one_event_per_step(6), &["--inject-usage"]).await;
    assert_eq!(got.matches("tok-").count(), 6, "{got}");
}
