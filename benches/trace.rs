//! What following a request costs it: a whole short request through the meter with nothing on,
//! with the request log, with a span exported, with both, and with the workload trace, side by side so the figures read
//! as differences on a noisy machine. The per-chunk path is the same in all four (the sinks run
//! once, at the finish): `tests/alloc.rs` holds it to 0 allocations per chunk.
//!
//! `cargo bench --bench trace`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue, Method};
use prometheus::IntCounter;
use tokenmeter::capacity::{Capacity, Inputs};
use tokenmeter::context::{Identify, Sampler};
use tokenmeter::meter::Recorder;
use tokenmeter::metrics::{Metrics, MetricsConfig};
use tokenmeter::otlp::{Exporter, TracingConfig};
use tokenmeter::protocol::request::RequestInfo;
use tokenmeter::record::{Outcome, Sink};
use tokenmeter::reqlog::{Destination, RequestLog};
use tokenmeter::workload::{Counters, WorkloadConfig, WorkloadLog};

/// A short OpenAI stream: a role chunk, 16 content chunks, usage, `[DONE]`.
fn stream() -> Vec<Vec<u8>> {
    let chunk = |delta: &str| {
        format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n").into_bytes()
    };
    let mut v = vec![chunk(r#"{"role":"assistant","content":""}"#)];
    v.extend((0..16).map(|i| chunk(&format!("{{\"content\":\"t{i} \"}}"))));
    v.push(b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":16,\"total_tokens\":28}}\n\n".to_vec());
    v.push(b"data: [DONE]\n\n".to_vec());
    v
}

fn bench(c: &mut Criterion) {
    // The exporter's task runs on a runtime of its own beside the measured thread. Its
    // collector is a port nothing listens on: each batch is refused at once, so the queue is
    // drained as in production and the figure is tokenmeter's own cost, not a collector's.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let tracing = TracingConfig {
        endpoint: format!("http://{dead}/v1/traces").parse().expect("uri"),
        service_name: "tokenmeter".into(),
        resource: Vec::new(),
        sampler: Sampler::default(),
    };
    let mut head = HeaderMap::new();
    head.insert(
        "traceparent",
        HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    );
    head.insert("x-request-id", HeaderValue::from_static("req-1"));
    let frames = stream();
    let mut g = c.benchmark_group("request");
    for (name, log, traced, workload) in [
        ("nothing", false, false, false),
        ("request_log", true, false, false),
        ("span", false, true, false),
        ("both", true, true, false),
        ("workload_log", false, false, true),
    ] {
        let metrics = Arc::new(Metrics::new(&MetricsConfig::default()).expect("metrics"));
        let mut sinks: Vec<Arc<dyn Sink>> = Vec::new();
        if log {
            let counter = IntCounter::new("log_dropped", "-").expect("counter");
            let target = Destination::File("/dev/null".into());
            sinks.push(Arc::new(RequestLog::open(&target, counter).expect("open")));
        }
        if traced {
            let counter = IntCounter::new("spans_dropped", "-").expect("counter");
            sinks.push(Arc::new(Exporter::start(&tracing, counter)));
        }
        if workload {
            let c = |n: &str| IntCounter::new(n, "-").expect("counter");
            let cfg = WorkloadConfig {
                destination: Destination::File("/dev/null".into()),
                block_tokens: 512,
                conversation_header: None,
                hold: tokenmeter::workload::HOLD,
            };
            let counters = Counters {
                written: c("written"),
                dropped: c("dropped"),
                skipped: c("skipped"),
            };
            sinks.push(Arc::new(WorkloadLog::open(&cfg, counters).expect("open")));
        }
        // The trace reads no head without a conversation header.
        let identify = (log || traced).then(|| Identify::new(traced.then(Sampler::default)));
        let recorder = Arc::new(
            Recorder::new(metrics, Default::default())
                .with_capacity(Arc::new(Capacity::new(Inputs::default(), Instant::now())))
                .with_sinks(identify.clone(), sinks),
        );
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut m = recorder.start(RequestInfo::default());
                // The head is read once per request, as `Recorder::receive` does.
                let ident = identify
                    .as_ref()
                    .map(|i| i.of(&Method::POST, "/v1/chat/completions", &head));
                m.set_ident(ident);
                m.set_route("/v1/chat/completions");
                m.on_response(200, "/v1/chat/completions", "text/event-stream", false);
                let t0 = Instant::now();
                for (i, f) in frames.iter().enumerate() {
                    m.on_data(f, t0 + Duration::from_millis(20 * i as u64));
                }
                m.finish(Outcome::Complete);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
