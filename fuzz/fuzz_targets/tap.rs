//! The whole meter path a tapped response takes: `Recorder::start`, `Meter::on_response` with an
//! arbitrary content type and path, `on_data` for every piece, then the end (a `finish` with any
//! outcome, which consumes the meter, or a drop as when the client goes away). It must not panic,
//! must count the request exactly once, and must leave every in-flight gauge at 0.
//!
//! Input: the shared header, then four bytes (content type, path, flags, status), then the body. A content
//! type or path index past its table takes the string from the body's first line instead.

#![no_main]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pieces, Header};
use libfuzzer_sys::fuzz_target;
use tokenmeter::capacity::{Capacity, CapacityConfig};
use tokenmeter::exposition::Scrape;
use tokenmeter::meter::Recorder;
use tokenmeter::metrics::{names, Metrics, MetricsConfig, Phase};
use tokenmeter::record::{Outcome};
use tokenmeter::protocol::request::RequestInfo;

const TYPES: &[&str] = &[
    "text/event-stream",
    "text/event-stream; charset=utf-8",
    "TEXT/EVENT-STREAM",
    "application/x-ndjson",
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    "",
];
const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/api/chat",
    "/api/generate",
    "/generate_stream",
    "/v1/embeddings",
    "/",
];
const STATUSES: &[u16] = &[
    200, 200, 200, 200, 201, 204, 400, 404, 429, 500, 502, 503, 504,
];

/// The sum of every `tokenmeter_requests_total` sample in the exposition.
fn pick<'a>(table: &[&'a str], i: u8, fallback: &'a str) -> &'a str {
    table.get(usize::from(i)).copied().unwrap_or(fallback)
}

fuzz_target!(|data: &[u8]| {
    let Some((h, rest)) = Header::parse(data) else {
        return;
    };
    let Some((&[ct, path, flags, status], body)) = rest.split_first_chunk::<4>() else {
        return;
    };
    let first_line = body.split(|&b| b == b'\n').next().unwrap_or_default();
    let first_line = std::str::from_utf8(first_line).unwrap_or("");
    let ct = pick(TYPES, ct % 16, first_line);
    let path = pick(PATHS, path % 16, first_line);
    let encoded = flags & 1 == 1;
    let status = STATUSES[usize::from(status) % STATUSES.len()];

    let metrics = Arc::new(Metrics::new(&MetricsConfig::default()).expect("metrics"));
    let capacity = Arc::new(Capacity::new(CapacityConfig::default(), Instant::now()));
    let recorder = Arc::new(Recorder::new(metrics.clone(), h.limit).with_capacity(capacity));
    let request = RequestInfo {
        model: (flags & 2 == 2).then(|| "req-model".to_owned()),
        stream: true,
        include_usage: flags & 4 == 4,
        usage_injected: flags & 128 == 128,
    };
    let mut meter = recorder.start(request);
    if flags & 64 == 0 {
        meter.on_response(status, path, ct, encoded);
    } else {
        // The upstream never answered: the proxy made the response itself.
        meter.set_status(status);
    }
    let start = Instant::now();
    for (i, piece) in pieces(body, h.max_piece, h.seed).into_iter().enumerate() {
        // Times move forward a millisecond a piece, so the timing arithmetic sees real gaps.
        meter.on_data(piece, start + Duration::from_millis(i as u64));
    }
    match (flags >> 3) & 7 {
        0 => meter.finish(Outcome::Complete),
        1 => meter.finish(Outcome::UpstreamError),
        2 => meter.finish(Outcome::Timeout),
        3 => meter.finish(Outcome::BadRequest),
        4 => meter.finish(Outcome::ClientDisconnect),
        _ => drop(meter), // dropped unfinished: the client went away
    }

    let exposition = Scrape::parse(&String::from_utf8_lossy(&metrics.render()));
    assert_eq!(
        exposition.sum_of(names::REQUESTS_TOTAL),
        1.0,
        "request not counted exactly once"
    );
    for phase in [Phase::Prefill, Phase::Decode] {
        let gauge = format!("{}{{phase=\"{}\"}}", names::REQUESTS_IN_FLIGHT, phase.as_str());
        assert_eq!(exposition.sum_of(&gauge), 0.0, "{phase:?} gauge leaked");
    }
    assert_eq!(recorder.concurrency().current(), 0, "concurrency leaked");
});
