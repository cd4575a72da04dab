//! No heap allocation per chunk on the common path: a content chunk of a streaming OpenAI
//! response, metered (SSE decoding, the extractor, the timing, the metrics) as the tap shows it.
//!
//! A test binary of its own, without the test harness, because it counts every allocation of
//! the process through dhat's global allocator (in testing mode). The figure is a count, not a
//! time, so it holds on any machine: after a warm-up (the first token fixes the model label and
//! the histograms' handles), feeding a thousand more chunks allocates nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenmeter::meter::Recorder;
use tokenmeter::metrics::{Compat, Metrics, MetricsConfig, Outcome};
use tokenmeter::protocol::request::RequestInfo;

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
    let recorder = Arc::new(Recorder::new(metrics, 1 << 20));
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
