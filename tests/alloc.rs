//! No heap allocation per chunk on the common path: a content chunk of a streaming OpenAI
//! response, metered (SSE decoding, the extractor, the timing, the metrics) as the tap shows it.
//!
//! A test binary of its own, without the test harness, because it counts every allocation of
//! the process through dhat's global allocator (in testing mode). The figure is a count, not a
//! time, so it holds on any machine: after a warm-up (the first token fixes the model label and
//! the histograms' handles), feeding a thousand more chunks allocates nothing.
//!
//! The same count bounds what an open stream holds: the heap a whole proxy (in this process)
//! keeps for each of 200 streams held open after their first chunk, less what the test's own
//! upstream keeps for each. Bytes allocated, not resident: the loopback benchmark measures RSS
//! (docs/bench.md); this catches a change that makes every stream carry more.
//!
//! And it bounds the allocations of a whole proxied request, from its head to its last chunk:
//! a change that clones a header map or formats a label per request shows here as a count,
//! where the benchmark's time per request could not tell it from the noise.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenmeter::app;
use tokenmeter::config::Config;
use tokenmeter::server::Settings;
use tokenmeter_flags::parse_upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use tokenmeter::capacity::{Capacity, Inputs};
use tokenmeter::meter::Recorder;
use tokenmeter::metrics::{Compat, Metrics, MetricsConfig};
use tokenmeter::protocol::request::RequestInfo;
use tokenmeter::record::Outcome;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// A vLLM chat chunk, as it arrives: one event per frame.
const CHUNK: &[u8] = b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";

fn blocks() -> u64 {
    dhat::HeapStats::get().total_blocks
}

/// Run without libtest (`harness = false` in Cargo.toml): the harness's own thread allocates
/// while a test runs, and the count is of the whole process, so only this thread may run.
fn main() {
    metering_a_content_chunk_allocates_nothing();
    println!("alloc: metering a content chunk allocates nothing: ok");
    an_open_idle_stream_holds_a_bounded_heap();
    a_proxied_request_makes_a_bounded_count_of_allocations();
}

fn metering_a_content_chunk_allocates_nothing() {
    let _profiler = dhat::Profiler::builder().testing().build();
    // Without tenants, and with them: the tenant is resolved once per request, before the
    // first chunk, so the per-chunk path is the same. (One test: dhat profiles one at a time.)
    // The compat schemes resolve their handles with the request's too (vLLM's generation
    // counter moves per event): still nothing per chunk.
    let compat = Compat {
        vllm: true,
        otel: true,
    };
    for (tenant, compat) in [
        (false, Compat::default()),
        (true, Compat::default()),
        (false, compat),
        (true, compat),
    ] {
        let metrics = Metrics::new(&MetricsConfig {
            tenant,
            compat,
            ..MetricsConfig::default()
        })
        .expect("metrics");
        let allocated = allocations_over_chunks(Arc::new(metrics), tenant);
        assert_eq!(
            allocated, 0,
            "{allocated} heap allocations over 1,100 chunks on the common path (tenant: {tenant}, {compat:?})"
        );
    }
}

/// Heap allocations while a warmed-up meter reads 1,100 content chunks.
fn allocations_over_chunks(metrics: Arc<Metrics>, tenant: bool) -> u64 {
    // The capacity model as the server wires it: fed on every token-bearing event.
    let capacity = Arc::new(Capacity::new(Inputs::default(), Instant::now()));
    let recorder = Arc::new(Recorder::new(metrics, Default::default()).with_capacity(capacity));
    let mut meter = recorder.start(RequestInfo::default());
    if tenant {
        meter.set_tenant(Some(Arc::from("team-a")));
    }
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
    let t0 = Instant::now();
    let at = |i: u64| t0 + Duration::from_micros(20_000 * i);
    // A chunk split across two frames, as TCP may deliver it.
    let (a, b) = CHUNK.split_at(50);
    // Warm-up: the first token fixes the model label and the per-model histogram handles; the
    // first split chunk sizes the decoder's buffer for an incomplete line.
    for i in 0..10 {
        meter.on_data(CHUNK, at(i));
    }
    meter.on_data(a, at(10));
    meter.on_data(b, at(10));
    let before = blocks();
    for i in 10..1010 {
        meter.on_data(CHUNK, at(i));
    }
    for i in 1010..1110 {
        meter.on_data(a, at(i));
        meter.on_data(b, at(i));
    }
    let allocated = blocks() - before;
    meter.finish(Outcome::Complete);
    allocated
}

/// Heap a proxy holds per open idle stream, at most. Measured 48.0 KiB, the same in every run
/// (debug build, hyper 1.12, tokio 1.54; 48.8 before the upstream stage sat behind one `Arc`): the client side's read and write buffers (8 KiB
/// each), the upstream side's read and write buffers (8 KiB each) and its request channel
/// (8.4 KiB: hyper's dispatch channel, a tokio block of 32 slots), the connection task, the
/// rest under 1 KiB each. It was 57.3 KiB while hyper-util's `auto` connection read the first
/// 24 bytes in front of hyper's read buffer (which then grew to 16 KiB), and 61.7 KiB while the
/// connection task carried copies of the request path; this bound (3% over the measure) would
/// have caught either.
const HEAP_PER_IDLE_STREAM_MAX: f64 = 50.0 * 1024.0;
/// Streams held open for the measure.
const HELD: usize = 200;

const REQUEST_BODY: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// A runtime of one worker thread running `upstream` on a listener of its own and a whole
/// proxy (`Server`, every default setting) in front of it: the runtime, the upstream's address and the
/// proxy's. Call it once the profiler runs, so that every allocation of both is counted.
fn proxy_before<F, Fut>(upstream: F) -> (tokio::runtime::Runtime, SocketAddr, SocketAddr)
where
    F: FnOnce(tokio::net::TcpListener) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (upstream, proxy) = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(upstream(listener));
        let url = format!("http://{addr}");
        let cfg = Config {
            server: Settings::loopback(),
            ..Config::for_upstream(parse_upstream(&url).expect("upstream"))
        };
        let server = app::build(&cfg).await.expect("bind the proxy").server;
        let proxy = server.proxy_addr();
        tokio::spawn(server.serve(std::future::pending()));
        (addr, proxy)
    });
    (rt, upstream, proxy)
}

/// The test's streaming chat request, head and body, as one write.
fn chat_request() -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{REQUEST_BODY}",
        REQUEST_BODY.len()
    )
}

fn an_open_idle_stream_holds_a_bounded_heap() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let (rt, upstream, proxy) = proxy_before(hold_streams);
    let direct = heap_per_stream(upstream);
    let proxied = heap_per_stream(proxy);
    let own = proxied - direct;
    println!(
        "alloc: an open idle stream holds {:.1} KiB of the proxy's heap (at most {:.1}): {}",
        own / 1024.0,
        HEAP_PER_IDLE_STREAM_MAX / 1024.0,
        if own <= HEAP_PER_IDLE_STREAM_MAX {
            "ok"
        } else {
            "FAILED"
        }
    );
    assert!(
        own <= HEAP_PER_IDLE_STREAM_MAX,
        "{own:.0} bytes of heap per open idle stream, more than {HEAP_PER_IDLE_STREAM_MAX:.0}"
    );
    // The runtime's threads allocate while they stop; the count is done.
    std::mem::forget(rt);
}

/// Heap held per stream while [`HELD`] streams to `addr` stay open after their first chunk.
fn heap_per_stream(addr: SocketAddr) -> f64 {
    let mut held = Vec::with_capacity(HELD + 8);
    // The first streams pay the one-off costs (the pool, the model's label, the slabs' first pages).
    for _ in 0..8 {
        held.push(open_stream(addr));
    }
    std::thread::sleep(Duration::from_millis(100));
    let before = dhat::HeapStats::get().curr_bytes;
    for _ in 0..HELD {
        held.push(open_stream(addr));
    }
    // Until every stream's chunk has passed and its tasks have gone quiet.
    std::thread::sleep(Duration::from_millis(200));
    let after = dhat::HeapStats::get().curr_bytes;
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    (after as f64 - before as f64) / HELD as f64
}

/// Sends a streaming chat request and reads until its first SSE chunk: the stream is open.
fn open_stream(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(chat_request().as_bytes()).expect("write");
    let mut buf = [0u8; 4096];
    let mut seen = 0;
    while !buf[..seen].windows(5).any(|w| w == b"data:") {
        let n = s.read(&mut buf[seen..]).expect("read");
        assert!(n > 0, "the stream closed before its first chunk");
        seen += n;
    }
    s
}

/// The test's upstream: to every request, the head of an SSE response and one chunk; then the
/// stream stays open until the peer goes.
async fn hold_streams(listener: tokio::net::TcpListener) {
    while let Ok((mut s, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let mut seen = 0;
            // The test's request is one write: its head and its JSON body, ending in `}`.
            while !(buf[..seen].windows(4).any(|w| w == b"\r\n\r\n") && buf[..seen].ends_with(b"}"))
            {
                match s.read(&mut buf[seen..]).await {
                    Ok(n) if n > 0 => seen += n,
                    _ => return,
                }
            }
            let mut out = Vec::from(&b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"[..]);
            out.extend_from_slice(format!("{:x}\r\n", CHUNK.len()).as_bytes());
            out.extend_from_slice(CHUNK);
            out.extend_from_slice(b"\r\n");
            if s.write_all(&out).await.is_err() {
                return;
            }
            drop(out);
            let _ = s.read(&mut buf).await;
        });
    }
}

/// Heap allocations of the proxy's own per request, at most: on a kept-alive client connection,
/// and on a new client connection each (the upstream connection is pooled in both). Measured
/// 47.0 and 64.0 over 300 requests (debug and release builds, hyper 1.12, tokio 1.54). They are
/// one or two each, none a copy of the body: the request's and the response's extensions and
/// boxed bodies, the boxed futures of the request path's layers, the request body collected for
/// inspection and kept for a resend, the upstream URI, hyper's channels for the response and its
/// body, the meter's reader, extractor and summary, the header read timer. A new connection adds
/// its task and hyper's buffers. They were 64.0 and 81.0 while detection parsed the first
/// message into a `serde_json::Value` (its keys and strings), 68.0 and 85.0 while the pool made
/// a waker for each check of a connection. The bounds are about 15% over.
const ALLOCATIONS_PER_REQUEST_MAX: f64 = 55.0;
const ALLOCATIONS_PER_CONNECTION_REQUEST_MAX: f64 = 74.0;
/// Requests counted per figure, after as many again to warm up.
const REQUESTS: usize = 300;

fn a_proxied_request_makes_a_bounded_count_of_allocations() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let (rt, upstream, proxy) = proxy_before(answer_streams);
    // The test's own client and upstream on one kept-alive connection: what the proxied counts
    // include that is not the proxy's. (Direct on new connections would count the upstream's
    // accepting each one, which the pooled proxied path does not cause.)
    let direct = allocations_per_request(upstream, Connection::KeptAlive);
    let kept = allocations_per_request(proxy, Connection::KeptAlive) - direct;
    let new = allocations_per_request(proxy, Connection::NewEach) - direct;
    for (what, own, max) in [
        (
            "a request on a kept-alive connection",
            kept,
            ALLOCATIONS_PER_REQUEST_MAX,
        ),
        (
            "a request on a new connection",
            new,
            ALLOCATIONS_PER_CONNECTION_REQUEST_MAX,
        ),
    ] {
        println!(
            "alloc: {what} makes {own:.2} heap allocations in the proxy (at most {max:.0}): {}",
            if own <= max { "ok" } else { "FAILED" }
        );
        assert!(
            own <= max,
            "{own:.1} heap allocations per proxied request ({what}), more than {max:.0}"
        );
    }
    std::mem::forget(rt);
}

#[derive(Clone, Copy)]
enum Connection {
    KeptAlive,
    NewEach,
}

/// Heap allocations (of the whole process) per streamed chat request to `addr`, one at a time.
fn allocations_per_request(addr: SocketAddr, conn: Connection) -> f64 {
    // Formatted once: the count is of the proxy, not of the test's client.
    let request = chat_request();
    let mut kept = None;
    let mut run = |n: usize| {
        for _ in 0..n {
            let s = match conn {
                Connection::KeptAlive => {
                    kept.get_or_insert_with(|| TcpStream::connect(addr).expect("connect"))
                }
                Connection::NewEach => kept.insert(TcpStream::connect(addr).expect("connect")),
            };
            stream_one(s, request.as_bytes());
        }
    };
    // The first requests pay the one-off costs (the pool's connection, the model's label).
    run(REQUESTS);
    std::thread::sleep(Duration::from_millis(100));
    let before = blocks();
    run(REQUESTS);
    // Until the last response's connection has been put away or closed.
    std::thread::sleep(Duration::from_millis(100));
    (blocks() - before) as f64 / REQUESTS as f64
}

/// One streaming chat request on `s`, read to the end of its response's last chunk.
fn stream_one(s: &mut TcpStream, request: &[u8]) {
    s.write_all(request).expect("write");
    let mut buf = [0u8; 4096];
    let mut seen = 0;
    while !buf[..seen].ends_with(b"0\r\n\r\n") {
        let n = s.read(&mut buf[seen..]).expect("read");
        assert!(n > 0, "the response ended before its last chunk");
        seen += n;
    }
    assert!(
        buf[..seen].windows(12).any(|w| w == b"data: [DONE]"),
        "no [DONE] in the response"
    );
}

/// The test's upstream for whole requests: to each, five content chunks and `[DONE]`, chunked,
/// on a connection kept alive; the response is built once.
async fn answer_streams(listener: tokio::net::TcpListener) {
    let mut response = Vec::from(
        &b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"[..],
    );
    let done: &[u8] = b"data: [DONE]\n\n";
    for event in [CHUNK; 5].into_iter().chain([done]) {
        response.extend_from_slice(format!("{:x}\r\n", event.len()).as_bytes());
        response.extend_from_slice(event);
        response.extend_from_slice(b"\r\n");
    }
    response.extend_from_slice(b"0\r\n\r\n");
    let response: Arc<[u8]> = response.into();
    while let Ok((mut s, _)) = listener.accept().await {
        let response = Arc::clone(&response);
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            loop {
                let mut seen = 0;
                while !(buf[..seen].windows(4).any(|w| w == b"\r\n\r\n")
                    && buf[..seen].ends_with(b"}"))
                {
                    match s.read(&mut buf[seen..]).await {
                        Ok(n) if n > 0 => seen += n,
                        _ => return,
                    }
                }
                if s.write_all(&response).await.is_err() {
                    return;
                }
            }
        });
    }
}
