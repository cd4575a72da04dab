//! Parse throughput of the SSE decoder and the extractors over the real corpus.
//!
//! `cargo bench --bench parse` (the corpus from `$TOKENMETER_CORPUS` or `../shared/corpus`).
//! Bytes per second count the response bodies, so the figures compare directly with the rate
//! at which an upstream can send.

use std::path::PathBuf;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use tokenmeter::capacity::{Capacity, Inputs};
use tokenmeter::meter::Recorder;
use tokenmeter::metrics::{Metrics, MetricsConfig};
use tokenmeter::protocol::request::RequestInfo;
use tokenmeter::protocol::{openai::OpenAi, Api, Extractor, Message};
use tokenmeter::read::{self, sse};
use tokenmeter::record::Outcome;

/// Network frames as a server flushes them: small pieces, most of an event or less.
const FRAME: usize = 256;

struct Body {
    path: String,
    sse: bool,
    bytes: Vec<u8>,
}

fn corpus() -> Option<Vec<Body>> {
    let dir = std::env::var_os("TOKENMETER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus"));
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv")).ok()?;
    let bodies = manifest
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split('\t');
            let (file, family, endpoint) = (f.next()?, f.next()?, f.next()?);
            if family == "sse_edge" {
                return None;
            }
            // "POST https://host/v1/chat/completions?x" -> "/v1/chat/completions"
            let url = endpoint.split_whitespace().nth(1).unwrap_or("");
            let after_scheme = url.split_once("://").map_or(url, |(_, r)| r);
            let path = after_scheme
                .find('/')
                .map_or("", |i| &after_scheme[i..])
                .split('?')
                .next()
                .unwrap_or("");
            Some(Body {
                path: path.to_string(),
                sse: file.ends_with(".sse"),
                bytes: std::fs::read(dir.join(file)).ok()?,
            })
        })
        .collect();
    Some(bodies)
}

fn feed_sse(body: &[u8], frame: usize, x: &mut dyn Extractor) -> u64 {
    let mut d = sse::Decoder::new(1 << 20);
    let mut tokens = 0u64;
    let mut on = |m: Message<'_>| tokens += u64::from(x.on_message(&m));
    for piece in body.chunks(frame) {
        d.feed(piece, &mut on);
    }
    d.finish(&mut on);
    tokens
}

fn bench(c: &mut Criterion) {
    let Some(all) = corpus() else {
        eprintln!("SKIPPED parse bench: corpus not found (set TOKENMETER_CORPUS)");
        return;
    };
    // The OpenAI-format bodies, as auto-detection sees them.
    let openai: Vec<&Body> = all
        .iter()
        .filter(|b| b.sse)
        .filter(|b| {
            let (_, mut x) = read::select(&b.path, "text/event-stream", None);
            feed_sse(&b.bytes, usize::MAX, &mut *x);
            x.api() == Api::OpenAi
        })
        .collect();
    let openai_bytes: usize = openai.iter().map(|b| b.bytes.len()).sum();
    let sse_bodies: Vec<&Body> = all.iter().filter(|b| b.sse).collect();
    let sse_bytes: usize = sse_bodies.iter().map(|b| b.bytes.len()).sum();
    eprintln!(
        "corpus: {} OpenAI-format bodies, {openai_bytes} bytes; {} SSE bodies, {sse_bytes} bytes",
        openai.len(),
        sse_bodies.len()
    );

    let mut g = c.benchmark_group("openai");
    g.throughput(Throughput::Bytes(openai_bytes as u64));
    g.bench_function("sse_decode_only", |bench| {
        bench.iter(|| {
            let mut n = 0usize;
            for b in &openai {
                let mut d = sse::Decoder::new(1 << 20);
                let mut on = |m: Message<'_>| n += m.data.len();
                d.feed(black_box(&b.bytes), &mut on);
                d.finish(&mut on);
            }
            n
        })
    });
    g.bench_function("sse_plus_openai_whole_body", |bench| {
        bench.iter(|| {
            openai
                .iter()
                .map(|b| feed_sse(black_box(&b.bytes), usize::MAX, &mut OpenAi::default()))
                .sum::<u64>()
        })
    });
    g.bench_function("sse_plus_openai_256_byte_frames", |bench| {
        bench.iter(|| {
            openai
                .iter()
                .map(|b| feed_sse(black_box(&b.bytes), FRAME, &mut OpenAi::default()))
                .sum::<u64>()
        })
    });
    g.finish();

    let mut g = c.benchmark_group("all_sse_formats");
    g.throughput(Throughput::Bytes(sse_bytes as u64));
    g.bench_function("sse_plus_auto_detect_256_byte_frames", |bench| {
        bench.iter(|| {
            sse_bodies
                .iter()
                .map(|b| {
                    let (_, mut x) = read::select(&b.path, "text/event-stream", None);
                    feed_sse(black_box(&b.bytes), FRAME, &mut *x)
                })
                .sum::<u64>()
        })
    });
    // The proxy's whole per-frame path short of the socket: the meter (timing, gauges, the
    // rate window) over the reader (framing, detection, extraction), then the record at the end.
    let rec = Arc::new(
        Recorder::new(
            Arc::new(Metrics::new(&MetricsConfig::default()).expect("metrics")),
            Default::default(),
        )
        .with_capacity(Arc::new(Capacity::new(Inputs::default(), Instant::now()))),
    );
    g.bench_function("meter_256_byte_frames", |bench| {
        bench.iter(|| {
            for b in &sse_bodies {
                let mut meter = rec.start(RequestInfo::default());
                meter.on_response(200, &b.path, "text/event-stream", false);
                let t0 = Instant::now();
                for (i, piece) in black_box(&b.bytes).chunks(FRAME).enumerate() {
                    meter.on_data(piece, t0 + Duration::from_micros(i as u64));
                }
                meter.finish(Outcome::Complete);
            }
        })
    });
    // The same from two threads at once over one recorder, as a runtime with two workers meters
    // two connections: what every token-bearing event shares (the concurrency tracker, the rate
    // window, the per-model handles) is met by both.
    g.bench_function("meter_256_byte_frames_2_threads", |bench| {
        bench.iter(|| {
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for b in &sse_bodies {
                            let mut meter = rec.start(RequestInfo::default());
                            meter.on_response(200, &b.path, "text/event-stream", false);
                            let t0 = Instant::now();
                            for (i, piece) in black_box(&b.bytes).chunks(FRAME).enumerate() {
                                meter.on_data(piece, t0 + Duration::from_micros(i as u64));
                            }
                            meter.finish(Outcome::Complete);
                        }
                    });
                }
            })
        })
    });
    g.finish();

    // Detection parses a response's first event to learn its format, and the extractor then
    // parses it again: once per request, so what the second parse costs is time to first byte.
    let mut g = c.benchmark_group("first_event");
    let first = Message {
        event: "",
        data: br#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
    };
    g.bench_function("detect_sniff", |bench| {
        bench.iter(|| tokenmeter::protocol::detect::sniff(black_box(&first)))
    });
    g.bench_function("openai_extract", |bench| {
        bench.iter(|| OpenAi::default().on_message(black_box(&first)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
