//! Property tests: the decoders give the same messages however their input is split,
//! agree with a plain reference reading of the format, never panic and never hold more than their
//! limit; the proxy forwards arbitrary bodies in arbitrary pieces byte-exact; the meter counts
//! exactly the content chunks of an OpenAI stream, and the stream's usage report wins when present.
//!
//! The fuzz targets in `fuzz/` push the same properties much further; these keep them in the
//! normal suite at a few hundred cases each, so the suite stays fast.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tokenmeter::meter::Recorder;
use tokenmeter::metrics::{Metrics, MetricsConfig};
use tokenmeter::protocol::request::RequestInfo;
use tokenmeter::protocol::Message;
use tokenmeter::read::{ndjson, sse, DecodeErrors};
use tokenmeter::record::Outcome;

use tokenmeter::metrics::names;

use crate::support::client;
use crate::support::metrics::metric;
use crate::support::spawn_proxy;
use crate::support::upstream::{self, Reply, Step};

const BOM: &[u8] = b"\xEF\xBB\xBF";

type Owned = (String, Vec<u8>);

/// Cuts `input` into consecutive pieces of the given sizes (cycled; 0 gives an empty piece).
fn split<'a>(input: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = input;
    for &n in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (piece, tail) = rest.split_at(n.min(rest.len()));
        out.push(piece);
        rest = tail;
    }
    out
}

/// Piece sizes: mostly small (every split point matters), sometimes empty, sometimes large.
fn sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(
        prop_oneof![3 => 1..8usize, 1 => Just(0usize), 1 => 8..300usize],
        1..32,
    )
    .prop_filter("some piece must make progress", |v| {
        v.iter().any(|&n| n > 0)
    })
}

/// Bytes biased towards the ones that mean something to SSE and NDJSON: about one in six is a
/// line ending, a colon, a space, a letter of `data` or of a BOM.
fn stream_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    const SPECIAL: &[u8] = b"\n\n\r\r: data\xEF\xBB\xBF\t";
    prop::collection::vec(any::<u8>(), 0..max).prop_map(|v| {
        v.into_iter()
            .map(|b| match b {
                0..=41 => SPECIAL[usize::from(b) % SPECIAL.len()],
                _ => b,
            })
            .collect()
    })
}

// === SSE ===

/// Decodes `pieces`, checking the memory bound after every one.
fn sse_decode(pieces: &[&[u8]], limit: usize) -> (Vec<Owned>, DecodeErrors) {
    let mut d = sse::Decoder::new(limit);
    let mut out = Vec::new();
    let mut on = |m: Message<'_>| out.push((m.event.to_owned(), m.data.to_vec()));
    for p in pieces {
        d.feed(p, &mut on);
        // The partial line and the event's data are each bounded by the limit, the event name by
        // 3x (lossy UTF-8 replacement can triple it); the start of a BOM is not held at all.
        assert!(
            d.buffered() <= 5 * limit,
            "holds {} bytes with limit {limit}",
            d.buffered()
        );
    }
    d.finish(&mut on);
    assert_eq!(d.buffered(), 0, "finish left bytes behind");
    (out, d.errors())
}

/// A plain reading of the WHATWG event-stream rules over the whole input, with no limit.
fn sse_reference(input: &[u8]) -> Vec<Owned> {
    let input = input.strip_prefix(BOM).unwrap_or(input);
    let mut lines = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < input.len() {
        match input[i] {
            b'\r' => {
                lines.push(&input[start..i]);
                if input.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
                start = i + 1;
            }
            b'\n' => {
                lines.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    // What follows the last line ending is an incomplete line: the end of the stream discards
    // it, with any event not yet ended by a blank line.

    let mut out = Vec::new();
    let (mut event, mut data): (String, Option<Vec<u8>>) = (String::new(), None);
    for line in lines {
        if line.is_empty() {
            if let Some(mut d) = data.take() {
                d.pop(); // the last data line's LF
                out.push((std::mem::take(&mut event), d));
            }
            event.clear();
            continue;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => continue,
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                let d = data.get_or_insert_with(Vec::new);
                d.extend_from_slice(value);
                d.push(b'\n');
            }
            b"event" => event = String::from_utf8_lossy(value).into_owned(),
            _ => {}
        }
    }
    out
}

/// One line of an SSE-like stream: known and unknown fields, with and without a colon or the
/// space after it, comments and blank lines.
fn sse_line() -> impl Strategy<Value = Vec<u8>> {
    let name = prop::sample::select(vec![
        "data", "data", "data", "event", "id", "retry", "dat", "DATA", "datax", "",
    ]);
    let value = "[a-z0-9 :{}\"\\[\\]é]{0,12}";
    prop_oneof![
        4 => (name, prop::sample::select(vec![":", ": ", ":  "]), value)
            .prop_map(|(n, sep, v)| format!("{n}{sep}{v}").into_bytes()),
        1 => prop::sample::select(vec!["data", "event"]).prop_map(|n| n.as_bytes().to_vec()),
        1 => "[a-z ]{0,8}".prop_map(|c| format!(":{c}").into_bytes()),
        2 => Just(Vec::new()),
    ]
}

/// A structured SSE-like stream: lines with mixed CR, LF and CRLF endings, perhaps a BOM, perhaps
/// no terminator on the last line.
fn sse_stream() -> impl Strategy<Value = Vec<u8>> {
    let eol = prop::sample::select(vec![&b"\n"[..], b"\r", b"\r\n"]);
    (
        any::<bool>(),
        prop::collection::vec((sse_line(), eol), 0..24),
        any::<bool>(),
    )
        .prop_map(|(bom, lines, terminated)| {
            let mut out = if bom { BOM.to_vec() } else { Vec::new() };
            let n = lines.len();
            for (i, (line, eol)) in lines.into_iter().enumerate() {
                out.extend_from_slice(&line);
                if terminated || i + 1 < n {
                    out.extend_from_slice(eol);
                }
            }
            out
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sse_structured_streams_decode_as_the_reference_at_any_split(
        input in sse_stream(),
        sizes in sizes(),
    ) {
        let whole = sse_decode(&[&input], 1 << 20);
        prop_assert_eq!(&whole.0, &sse_reference(&input));
        prop_assert_eq!(sse_decode(&split(&input, &sizes), 1 << 20), whole);
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        prop_assert_eq!(sse_decode(&bytes, 1 << 20).0, sse_reference(&input));
    }

    #[test]
    fn sse_arbitrary_bytes_decode_the_same_at_any_split_and_stay_bounded(
        input in stream_bytes(600),
        sizes in sizes(),
        limit in prop_oneof![1..40usize, Just(1usize << 20)],
    ) {
        let whole = sse_decode(&[&input], limit);
        prop_assert_eq!(sse_decode(&split(&input, &sizes), limit), whole.clone());
        if limit > input.len() {
            // Nothing can overflow: the reference reading applies.
            prop_assert_eq!(whole.0, sse_reference(&input));
            prop_assert_eq!(whole.1.line_too_long, 0);
        }
    }

    #[test]
    fn sse_structured_streams_with_small_limits_decode_the_same_at_any_split(
        input in sse_stream(),
        sizes in sizes(),
        limit in 1..24usize,
    ) {
        let whole = sse_decode(&[&input], limit);
        prop_assert_eq!(sse_decode(&split(&input, &sizes), limit), whole.clone());
        for (_, data) in &whole.0 {
            prop_assert!(data.len() <= limit, "an event over the limit was dispatched");
        }
    }
}

// === NDJSON ===

fn ndjson_decode(pieces: &[&[u8]], limit: usize) -> (Vec<Owned>, DecodeErrors) {
    let mut d = ndjson::Decoder::new(limit);
    let mut out = Vec::new();
    let mut on = |m: Message<'_>| out.push((m.event.to_owned(), m.data.to_vec()));
    for p in pieces {
        d.feed(p, &mut on);
        assert!(
            d.buffered() <= limit,
            "holds {} bytes with limit {limit}",
            d.buffered()
        );
    }
    d.finish(&mut on);
    assert_eq!(d.buffered(), 0, "finish left bytes behind");
    (out, d.errors())
}

/// NDJSON read plainly: lines split on LF; a line over the limit (CR included) is skipped and
/// counted; otherwise a trailing CR is trimmed and blank lines are ignored.
fn ndjson_reference(input: &[u8], limit: usize) -> (Vec<Owned>, u64) {
    let mut out = Vec::new();
    let mut too_long = 0;
    for line in input.split(|&b| b == b'\n') {
        if line.len() > limit {
            too_long += 1;
            continue;
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if !line.iter().all(u8::is_ascii_whitespace) {
            out.push((String::new(), line.to_vec()));
        }
    }
    (out, too_long)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn ndjson_lines_match_the_reference_at_any_split_and_stay_bounded(
        input in stream_bytes(600),
        sizes in sizes(),
        limit in prop_oneof![1..40usize, Just(1usize << 20)],
    ) {
        let (msgs, errors) = ndjson_decode(&split(&input, &sizes), limit);
        let (want, too_long) = ndjson_reference(&input, limit);
        prop_assert_eq!(msgs, want);
        prop_assert_eq!(errors.line_too_long, too_long);
    }
}

// === The whole tap path through a real proxy ===

/// Arbitrary bodies, in arbitrary pieces, under every content type the meter reads differently,
/// come out of the proxy byte for byte; afterwards every request is counted and no gauge leaked.
#[test]
fn proxy_forwards_arbitrary_bodies_in_arbitrary_pieces_byte_exact() {
    const CASES: u32 = 64;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let scripts: Arc<Mutex<HashMap<String, Reply>>> = Arc::default();
    let served = scripts.clone();
    let (up, proxy) = rt.block_on(async move {
        let up = upstream::spawn(move |req| {
            let case = req.path.split("case=").nth(1).unwrap_or("").to_string();
            served
                .lock()
                .expect("lock")
                .remove(&case)
                .unwrap_or_else(|| Reply::json(500, "{}"))
        })
        .await;
        let proxy = spawn_proxy(&up.url(), &["--max-line-bytes", "64"]).await;
        (up, proxy)
    });

    let content_types = vec![
        "text/event-stream",
        "application/x-ndjson",
        "application/json",
        "application/octet-stream",
    ];
    // Pieces up to 16 KiB here: a proxy could mishandle only large frames.
    let pieces = prop::collection::vec(
        prop_oneof![3 => 1..8usize, 1 => 8..300usize, 1 => 300..16_384usize],
        1..16,
    );
    let strategy = (
        prop_oneof![stream_bytes(32 * 1024), sse_stream()],
        pieces,
        prop::sample::select(content_types),
    );
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let cases = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&strategy, |(body, sizes, ct)| {
            let n = cases.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let steps = split(&body, &sizes)
                .into_iter()
                .map(|p| Step::Send(Bytes::copy_from_slice(p)))
                .collect();
            let reply = Reply {
                headers: vec![("content-type".into(), ct.into())],
                ..Reply::sse(steps)
            };
            scripts.lock().expect("lock").insert(n.to_string(), reply);
            let url = format!("{}/v1/chat/completions?case={n}", proxy.url());
            let seen = rt.block_on(client::post(&url, &client::chat_request(true, false)));
            prop_assert_eq!(seen.status, 200);
            prop_assert!(!seen.error, "the body ended with an error");
            prop_assert!(
                seen.body == body,
                "body differs ({ct}, {} bytes)",
                body.len()
            );
            Ok(())
        })
        .expect("property holds");
    let n = cases.into_inner();

    // The meter records just after the body ends: give it a moment, then check the books.
    let scrape = rt.block_on(async {
        for _ in 0..100 {
            let s = proxy.scrape().await;
            if metric(names::REQUESTS_TOTAL).sum_or_zero_if_absent(&s) >= n as f64 {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        proxy.scrape().await
    });
    let complete = metric(names::REQUESTS_TOTAL)
        .label("outcome", "complete")
        .label("code", "200")
        .sum(&scrape);
    assert_eq!(complete, n as f64, "{scrape}");
    for phase in ["prefill", "decode"] {
        let v = metric(names::REQUESTS_IN_FLIGHT)
            .label("phase", phase)
            .value(&scrape);
        assert_eq!(v, 0.0, "{phase} gauge leaked:\n{scrape}");
    }
    drop(up);
}

// === The meter on generated OpenAI streams ===

/// One chunk of a generated OpenAI chat stream.
#[derive(Debug, Clone)]
enum Chunk {
    /// The first chunk: a role and empty content. Not token-bearing.
    Role,
    Content(String),
    Reasoning(String),
    /// `finish_reason` with an empty delta. Not token-bearing.
    Finish,
    /// A `: keep-alive` comment between events.
    Comment,
}

impl Chunk {
    fn bearing(&self) -> bool {
        matches!(self, Chunk::Content(_) | Chunk::Reasoning(_))
    }
}

fn chunk() -> impl Strategy<Value = Chunk> {
    // Any text but the empty string, which is not a token.
    let text = ".{1,6}";
    prop_oneof![
        1 => Just(Chunk::Role),
        6 => text.prop_map(Chunk::Content),
        2 => text.prop_map(Chunk::Reasoning),
        1 => Just(Chunk::Finish),
        1 => Just(Chunk::Comment),
    ]
}

/// Renders a stream as vLLM would send it, with the given line ending and optional usage.
fn openai_stream(chunks: &[Chunk], usage: Option<(u64, u64)>, eol: &str) -> Vec<u8> {
    let event = |delta: serde_json::Value, finish: Option<&str>| {
        let v = serde_json::json!({
            "id": "cmpl-1", "object": "chat.completion.chunk", "model": "gen-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        format!("data: {v}{eol}{eol}")
    };
    let mut out = String::new();
    for c in chunks {
        out += &match c {
            Chunk::Role => event(
                serde_json::json!({"role": "assistant", "content": ""}),
                None,
            ),
            Chunk::Content(t) => event(serde_json::json!({ "content": t }), None),
            Chunk::Reasoning(t) => event(serde_json::json!({ "reasoning_content": t }), None),
            Chunk::Finish => event(serde_json::json!({}), Some("stop")),
            Chunk::Comment => format!(": keep-alive{eol}"),
        };
    }
    if let Some((prompt, completion)) = usage {
        let v = serde_json::json!({
            "id": "cmpl-1", "object": "chat.completion.chunk", "model": "gen-model", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        });
        out += &format!("data: {v}{eol}{eol}");
    }
    out += &format!("data: [DONE]{eol}{eol}");
    out.into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn meter_counts_content_chunks_and_usage_wins(
        chunks in prop::collection::vec(chunk(), 0..40),
        usage in prop::option::of((0..5000u64, 0..5000u64)),
        eol in prop::sample::select(vec!["\n", "\r\n", "\r"]),
        sizes in sizes(),
    ) {
        let metrics = Arc::new(Metrics::new(&MetricsConfig::default()).expect("metrics"));
        let recorder = Arc::new(Recorder::new(metrics.clone(), Default::default()));
        let mut meter = recorder.start(RequestInfo {
            model: Some("req-model".into()),
            stream: true,
            include_usage: usage.is_some(),
            usage_injected: false,
            body_bytes: 0,
        });
        meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
        let body = openai_stream(&chunks, usage, eol);
        let t0 = Instant::now();
        for (i, piece) in split(&body, &sizes).into_iter().enumerate() {
            meter.on_data(piece, t0 + Duration::from_millis(i as u64));
        }
        meter.finish(Outcome::Complete);

        let content = chunks.iter().filter(|c| c.bearing()).count() as u64;
        // The model label is the one the response names (every JSON chunk does), else the request's.
        let named = usage.is_some() || chunks.iter().any(|c| !matches!(c, Chunk::Comment));
        let model = if named { "gen-model" } else { "req-model" };
        let (want, source) = match usage {
            Some((_, completion)) => (completion, "usage"),
            None => (content, "counted"),
        };
        let s = String::from_utf8(metrics.render()).expect("utf-8");
        // The request's count is usage's; the counter counted the chunks as they streamed and
        // never takes one back, so it holds the larger of the two (real streams never show
        // more chunks than their usage states: see corpus::no_stream_shows_more_tokens_than...).
        let length = metric("tokenmeter_request_output_tokens_sum").label("model", model).value(&s);
        prop_assert_eq!(length, want as f64, "{} content chunks, usage {:?}", content, usage);
        let output = metric(names::OUTPUT_TOKENS_TOTAL).label("model", model).value(&s);
        prop_assert_eq!(output, want.max(content) as f64, "{} content chunks, usage {:?}", content, usage);
        prop_assert_eq!(metric(names::TOKEN_COUNT_SOURCE_TOTAL).label("source", source).value(&s), 1.0);
        if let Some((prompt, _)) = usage {
            prop_assert_eq!(metric(names::INPUT_TOKENS_TOTAL).label("model", model).value(&s), prompt as f64);
        }
        prop_assert_eq!(metric(names::REQUESTS_IN_FLIGHT).label("phase", "prefill").value(&s), 0.0);
        prop_assert_eq!(metric(names::REQUESTS_IN_FLIGHT).label("phase", "decode").value(&s), 0.0);
        prop_assert_eq!(recorder.concurrency().current(), 0);
    }
}

// === Regressions found by fuzzing ===

/// What `--inject-usage`'s filter forwards for a body fed in `parts`, and how many events it
/// removed.
fn usage_filter(parts: &[&[u8]]) -> (Vec<u8>, u64) {
    let mut f = tokenmeter::inject::UsageFilter::default();
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&f.feed(p));
    }
    out.extend_from_slice(&f.finish());
    (out, f.removed())
}

/// Found by the `inject` fuzz target: an event that is usage-only (`"choices": []` and a `usage`)
/// but holds a key the filter takes for a choice's (`"index":`, `"text":`, `"delta":`) is removed
/// when it arrives in one piece, and forwarded to the client when a piece ends after that key,
/// because the filter releases a held event as soon as it sees one. Whether the client sees the
/// chunk must not depend on how the upstream's bytes were framed.
#[test]
fn regression_usage_only_event_holding_a_choice_key_is_filtered_the_same_however_split() {
    let body: &[u8] = b"data: {\"choices\":[],\"usage\":{\"index\":1}}\n\n";
    let whole = usage_filter(&[body]);
    for i in 0..=body.len() {
        let (a, b) = body.split_at(i);
        assert_eq!(usage_filter(&[a, b]), whole, "split at {i}");
    }
}
