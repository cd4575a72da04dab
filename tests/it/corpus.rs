//! Every corpus body through the decoders and extractors: the same messages and token counts
//! however the body is cut into pieces, the manifest's exact token counts, format detection with
//! and without the request path, and the SSE conformance cases byte for byte.

use tokenmeter::protocol::{Api, Message, Summary};
use tokenmeter::read::{self, ndjson, sse};

use tokenmeter::metrics::names;

use crate::support::corpus::{self, Entry};
use crate::support::metrics::metric;
use crate::support::upstream::{self, Reply, Step};
use crate::support::{client, spawn_proxy, Rng};

/// The `--max-line-bytes` default: every corpus line fits.
const MAX_LINE: usize = 1 << 20;

/// Bodies up to this size are also cut literally in two at every byte offset (larger ones are
/// covered per event, see [`check_every_split`]).
const LITERAL_SPLIT_MAX: usize = 4 * 1024;

/// One decoded message, owned.
type Msg = (String, Vec<u8>);

/// Where the manifest disagrees with what tokenmeter reports, and why tokenmeter is right.
/// `(file, field, manifest value, tokenmeter's value, reason)`.
const EXCEPTIONS: &[(&str, &str, u64, u64, &str)] = &[(
    "openai_compat_other/xai-grok-text.sse",
    "output",
    1,
    291,
    "xAI's completion_tokens (1) leaves out the 290 reasoning tokens that completion_tokens_details \
     and total_tokens (303 = 12 prompt + 291) report; the manifest's own definition of output \
     counts reasoning tokens, as OpenAI's completion_tokens does",
)];

/// The manifest value, or the documented exception to it.
fn expected(e: &Entry, field: &str, manifest: Option<u64>) -> Option<u64> {
    EXCEPTIONS
        .iter()
        .find(|x| x.0 == e.path && x.1 == field)
        .map(|x| {
            assert_eq!(manifest, Some(x.2), "{}: stale exception", e.path);
            x.3
        })
        .or(manifest)
}

/// The request path of a manifest endpoint: "POST https://host/v1/x?q=1 (note)" -> "/v1/x".
fn request_path(endpoint: &str) -> String {
    let mut words = endpoint.split_whitespace();
    let url = match words.next() {
        Some("GET" | "POST") => words.next().unwrap_or("/"),
        _ => return "/".into(),
    };
    let no_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = match no_scheme.find('/') {
        Some(0) => no_scheme,
        Some(i) => &no_scheme[i..],
        None => "/",
    };
    path.split('?').next().unwrap_or("/").to_string()
}

fn content_type(e: &Entry) -> &'static str {
    if e.path.ends_with(".ndjson") {
        "application/x-ndjson"
    } else {
        "text/event-stream"
    }
}

/// The format each family speaks (the manifest's endpoint tells OpenAI-compatible routes apart).
fn expected_api(e: &Entry) -> Api {
    let path = request_path(&e.endpoint);
    match e.family.as_str() {
        "anthropic" => Api::Anthropic,
        "gemini" => Api::Gemini,
        "ollama" => Api::Ollama,
        "llamacpp" => Api::LlamaCpp,
        "triton" => Api::Triton,
        "cohere" => Api::Cohere,
        "openai_responses" => Api::Responses,
        "misc_sse" if e.path.contains("replicate") => Api::Replicate,
        "misc_sse" => Api::Watsonx,
        "sse_edge" => Api::Unknown,
        "tgi" if !path.ends_with("/chat/completions") => Api::Tgi,
        _ if path.contains("/responses") => Api::Responses,
        _ => Api::OpenAi,
    }
}

// === Decoding ===

#[derive(Debug, Clone, PartialEq)]
enum Dec {
    Sse(sse::Decoder),
    Ndjson(ndjson::Decoder),
}

impl Dec {
    fn new(e: &Entry) -> Dec {
        if e.path.ends_with(".ndjson") {
            Dec::Ndjson(ndjson::Decoder::new(MAX_LINE))
        } else {
            Dec::Sse(sse::Decoder::new(MAX_LINE))
        }
    }

    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Msg>) {
        let mut on = |m: Message<'_>| out.push((m.event.to_string(), m.data.to_vec()));
        match self {
            Dec::Sse(d) => d.feed(bytes, &mut on),
            Dec::Ndjson(d) => d.feed(bytes, &mut on),
        }
    }

    fn finish(&mut self, out: &mut Vec<Msg>) {
        let mut on = |m: Message<'_>| out.push((m.event.to_string(), m.data.to_vec()));
        match self {
            Dec::Sse(d) => d.finish(&mut on),
            Dec::Ndjson(d) => d.finish(&mut on),
        }
    }

    fn errors(&self) -> u64 {
        match self {
            Dec::Sse(d) => d.errors().line_too_long,
            Dec::Ndjson(d) => d.errors().line_too_long,
        }
    }
}

/// Decodes a body given in pieces.
fn decode<'a>(e: &Entry, pieces: impl IntoIterator<Item = &'a [u8]>) -> Vec<Msg> {
    let mut d = Dec::new(e);
    let mut out = Vec::new();
    for p in pieces {
        d.feed(p, &mut out);
    }
    d.finish(&mut out);
    assert_eq!(d.errors(), 0, "{}: no corpus line is too long", e.path);
    out
}

/// What an extractor made of a body.
#[derive(Debug, Clone, PartialEq)]
struct Read {
    api: Api,
    /// The tokens each message carried, in order.
    tokens: Vec<u32>,
    summary: Summary,
}

impl Read {
    fn counted(&self) -> u64 {
        self.tokens.iter().map(|&n| u64::from(n)).sum()
    }

    fn bearing(&self) -> u64 {
        self.tokens.iter().filter(|&&n| n > 0).count() as u64
    }
}

/// Runs the messages through the extractor `select` picks for this path and pin, as the meter does.
fn read(e: &Entry, path: &str, pin: Option<Api>, msgs: &[Msg]) -> Read {
    let (_, mut x) = read::select(path, content_type(e), pin);
    let tokens = msgs
        .iter()
        .map(|(event, data)| x.on_message(&Message { event, data }))
        .collect();
    Read {
        api: x.api(),
        tokens,
        summary: x.summary().clone(),
    }
}

/// Checks every two-piece split of `e.body` against the whole-body decode `whole`.
///
/// Cutting every body literally at every offset costs the square of its length; instead the
/// body is fed byte by byte once, keeping the decoder's state after each byte that completed a
/// message. A split at offset `i` only matters between the message boundaries around it, so it
/// is checked there: from the state at the boundary before `i`, the two pieces up to the next
/// boundary must give that stretch's messages and the very state the boundary has (from which
/// the rest of the body decodes as it did). Small bodies are also cut literally.
fn check_every_split(e: &Entry, whole: &[Msg]) {
    let input = &e.body;
    let mut d = Dec::new(e);
    let mut out = Vec::new();
    let mut bounds = vec![(0usize, d.clone(), 0usize)];
    for k in 0..input.len() {
        let before = out.len();
        d.feed(&input[k..k + 1], &mut out);
        if out.len() > before {
            bounds.push((k + 1, d.clone(), out.len()));
        }
    }
    d.finish(&mut out);
    assert_eq!(out, whole, "{}: byte by byte", e.path);

    for w in 0..bounds.len() {
        let (start, state, done) = &bounds[w];
        let next = bounds.get(w + 1);
        let end = next.map_or(input.len(), |b| b.0);
        let upto = next.map_or(whole.len(), |b| b.2);
        for i in *start..=end {
            let mut d = state.clone();
            let mut got = Vec::new();
            d.feed(&input[*start..i], &mut got);
            d.feed(&input[i..end], &mut got);
            match next {
                Some((_, boundary, _)) => assert!(d == *boundary, "{}: state at split {i}", e.path),
                None => d.finish(&mut got),
            }
            assert!(
                got == whole[*done..upto],
                "{}: messages at split {i}",
                e.path
            );
        }
    }

    if input.len() <= LITERAL_SPLIT_MAX {
        for i in 0..=input.len() {
            let (a, b) = input.split_at(i);
            assert!(
                decode(e, [a, b]) == whole,
                "{}: literal split at {i}",
                e.path
            );
        }
    }
}

fn load(test: &str) -> Option<Vec<Entry>> {
    let entries = corpus::load(test)?;
    assert_eq!(entries.len(), 185, "MANIFEST.tsv rows");
    Some(entries)
}

// === Tests ===

#[test]
fn every_file_decodes_the_same_at_every_split_position() {
    let _turn = crate::support::serial_blocking();
    let Some(entries) = load("every split position") else {
        return;
    };
    for e in &entries {
        let whole = decode(e, [&e.body[..]]);
        check_every_split(e, &whole);
    }
}

#[test]
fn every_file_reads_the_same_in_random_pieces() {
    let _turn = crate::support::serial_blocking();
    let Some(entries) = load("random pieces") else {
        return;
    };
    for e in &entries {
        let path = request_path(&e.endpoint);
        let whole = decode(e, [&e.body[..]]);
        let want = read(e, &path, None, &whole);
        for seed in 1..=6u64 {
            let max = [1, 3, 17, 256, 4096, 65536][seed as usize - 1];
            let mut rng = Rng::new(seed * 7919 + e.body.len() as u64);
            let pieces = rng.pieces(&e.body, 1, max);
            let msgs = decode(e, pieces.iter().map(|p| &p[..]));
            assert!(msgs == whole, "{}: messages, pieces of 1..={max}", e.path);
            let got = read(e, &path, None, &msgs);
            assert_eq!(got, want, "{}: tokens, pieces of 1..={max}", e.path);
        }
    }
}

#[test]
fn every_file_gives_the_manifest_counts_and_format() {
    let Some(entries) = load("manifest counts") else {
        return;
    };
    let mut failures = Vec::new();
    let mut checked = (0, 0, 0);
    for e in &entries {
        let path = request_path(&e.endpoint);
        let msgs = decode(e, [&e.body[..]]);
        let r = read(e, &path, None, &msgs);
        let mut fail = |what: &str, want: String, got: String| {
            failures.push(format!("{}: {what}: manifest {want}, got {got}", e.path))
        };
        if r.api != expected_api(e) {
            fail(
                "api",
                format!("{:?}", expected_api(e)),
                format!("{:?}", r.api),
            );
        }
        if let Some(want) = expected(e, "output", e.expected_output_tokens) {
            checked.0 += 1;
            let (got, source) = r.summary.output(r.counted());
            if got != want {
                fail(
                    "output tokens",
                    want.to_string(),
                    format!("{got} ({source:?})"),
                );
            }
        }
        if let Some(want) = expected(e, "input", e.expected_input_tokens) {
            checked.1 += 1;
            if r.summary.input_tokens != Some(want) {
                fail(
                    "input tokens",
                    want.to_string(),
                    format!("{:?}", r.summary.input_tokens),
                );
            }
        }
        if let Some(want) = expected(e, "content_events", e.content_events) {
            checked.2 += 1;
            let got = if e.family == "sse_edge" {
                msgs.len() as u64
            } else {
                r.bearing()
            };
            if got != want {
                fail("content events", want.to_string(), got.to_string());
            }
        }
        if e.family != "sse_edge" && r.summary.malformed != 0 {
            fail("malformed", "0".into(), r.summary.malformed.to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The manifest's coverage, so a column that stops parsing cannot pass silently.
    assert_eq!(
        checked,
        (125, 124, 185),
        "(output, input, content_events) rows checked"
    );
}

#[test]
fn the_first_event_alone_tells_the_format() {
    let Some(entries) = load("detection without path") else {
        return;
    };
    for e in entries.iter().filter(|e| e.family != "sse_edge") {
        let msgs = decode(e, [&e.body[..]]);
        let by_path = read(e, &request_path(&e.endpoint), None, &msgs);
        let blind = read(e, "/", None, &msgs);
        assert_eq!(blind, by_path, "{}: detected without the path", e.path);
        let pinned = read(e, "/", Some(expected_api(e)), &msgs);
        assert_eq!(pinned, by_path, "{}: pinned with --api", e.path);
    }
}

/// The formats whose streams have no end marker (see their module docs).
const NO_END_MARKER: &[Api] = &[Api::Gemini, Api::Triton];

/// Bodies of formats with an end marker that do not end with it, and why. Each is OpenAI's
/// format, whose marker is `[DONE]`: every such stream is over without it only because the body
/// ended, and stays in the in-flight gauges until then.
const UNENDED: &[(&str, &str)] = &[
    (
        "groq/pydantic-ai-error-after-text.sse",
        "Groq ends a failed tool call with an `error` event and no [DONE]",
    ),
    (
        "groq/pydantic-ai-gpt-oss-midstream-error.sse",
        "Groq ends a failed tool call with an `error` event and no [DONE]",
    ),
    (
        "openai_compat_other/hf-router-cerebras-llama.sse",
        "Cerebras sends no [DONE]",
    ),
    (
        "openai_compat_other/perplexity-sonar-legacy.sse",
        "Perplexity sends no [DONE]",
    ),
    (
        "tgi/hfapi-chat-zephyr-tgi-1.4.3.sse",
        "truncated: the last event is unterminated, and TGI 1.4.3 sent no [DONE]",
    ),
    (
        "tgi/hfapi-chat-zephyr-tgi-2.0.4.sse",
        "TGI 2.0.4's chat route sent no [DONE]",
    ),
];

/// The formats whose own end marker is `data: [DONE]`; the others send theirs first, and some
/// hosts follow it with a `[DONE]` of their own.
fn ends_with_done(api: Api) -> bool {
    matches!(api, Api::OpenAi | Api::Sglang)
}

/// The index of the message after which the extractor `select` picks first said the stream
/// ended (`None`: never), checking that it then stays said.
fn ended_at(e: &Entry, path: &str, pin: Option<Api>, msgs: &[Msg]) -> Option<usize> {
    let (_, mut x) = read::select(path, content_type(e), pin);
    let mut at = None;
    for (i, (event, data)) in msgs.iter().enumerate() {
        x.on_message(&Message { event, data });
        match (at, x.summary().ended) {
            (None, true) => at = Some(i),
            (Some(first), false) => panic!("{}: ended at {first}, not at {i}", e.path),
            _ => {}
        }
    }
    at
}

#[test]
fn every_stream_ends_exactly_at_its_end_marker() {
    let Some(entries) = load("end markers") else {
        return;
    };
    let mut failures = Vec::new();
    let mut seen = (0, 0, 0);
    for e in entries.iter().filter(|e| e.family != "sse_edge") {
        let msgs = decode(e, [&e.body[..]]);
        let api = expected_api(e);
        let unended = UNENDED.iter().find(|u| u.0 == e.path);
        let last = msgs.len() - 1;
        let want = if NO_END_MARKER.contains(&api) {
            seen.0 += 1;
            None
        } else if unended.is_some() {
            seen.1 += 1;
            None
        } else if !ends_with_done(api) && msgs[last].1 == b"[DONE]" {
            seen.2 += 1;
            Some(last - 1)
        } else {
            seen.2 += 1;
            Some(last)
        };
        for (how, path, pin) in [
            ("by path", request_path(&e.endpoint), None),
            ("blind", "/".to_string(), None),
            ("pinned", "/".to_string(), Some(api)),
        ] {
            let got = ended_at(e, &path, pin, &msgs);
            if got != want {
                failures.push(format!(
                    "{}: {how}: ended at {got:?}, want {want:?} of {} messages",
                    e.path,
                    msgs.len()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every body was judged, and every exception still applies.
    assert_eq!(
        seen,
        (10, UNENDED.len(), 143),
        "(no marker, unended, ended) bodies"
    );
}

/// An expected SSE event: `(event name, data)`.
type Event = (&'static str, &'static [u8]);

/// The conformance cases, byte for byte: `(file, [(event, data)])` as the WHATWG standard
/// dispatches them (an event without `event:` has the empty name here, "message" in a browser).
const SSE_CASES: &[(&str, &[Event])] = &[
    (
        "eventsource-parser-bom-leading-and-midstream",
        &[("", b"bomful 1"), ("", b"bomless 3")],
    ),
    (
        "eventsource-parser-comment-fest",
        &[("", b"1"), ("", b"2"), ("", b"3"), ("", b"4")],
    ),
    (
        "eventsource-parser-cr-only-line-endings",
        &[("", b"dog\nbark"), ("", b"cat\nmeow")],
    ),
    (
        "eventsource-parser-cr-split-across-chunks",
        &[("", b"A\nB\nC")],
    ),
    (
        "eventsource-parser-crlf-line-endings",
        &[("", b"sheep\nbleat"), ("", b"pig\noink")],
    ),
    ("eventsource-parser-empty-event-field", &[("", b"Hello 1")]),
    (
        "eventsource-parser-empty-retry",
        &[("", "\u{1F9F9}".as_bytes())],
    ),
    ("eventsource-parser-id-with-nul", &[("", b"hello")]),
    ("eventsource-parser-invalid-retry", &[("", b"x")]),
    (
        "eventsource-parser-leading-blank-lines-multibyte",
        &[("", "我現在都看實況不玩遊戲".as_bytes())],
    ),
    (
        "eventsource-parser-lf-line-endings",
        &[("", b"cow\nmoo"), ("", b"horse\nneigh")],
    ),
    (
        "eventsource-parser-multiline-stock",
        &[("stock", b"YHOO\n+2\n10"), ("stock", b"GOOG\n-8\n1881")],
    ),
    (
        "eventsource-parser-oddly-shaped-data",
        &[("", b""), ("", b"\n"), ("", b"test")],
    ),
    ("eventsource-parser-unknown-fields", &[("", b"abc\n\n123")]),
    (
        "eventsource-stream-populate-fields-mixed-eol",
        &[("my-event", b"line1\nline2"), ("", b"second")],
    ),
    (
        "eventsource-stream-whatwg-example-1",
        &[
            ("", b"This is the first message."),
            ("", b"This is the second message, it\nhas two lines."),
            ("", b"This is the third message."),
        ],
    ),
    (
        "eventsource-stream-whatwg-example-2",
        &[
            ("add", b"73857293"),
            ("remove", b"2153"),
            ("add", b"113411"),
        ],
    ),
    (
        "eventsource-stream-whatwg-example-comment-id",
        &[
            ("", b"first event"),
            ("", b"second event"),
            ("", b" third event"),
        ],
    ),
    (
        "eventsource-stream-whatwg-example-data-no-colon",
        &[("", b""), ("", b"\n")],
    ),
    ("wpt-format-bom", &[("", b"1"), ("", b"3")]),
    ("wpt-format-comments", &[("", b"1\n2\n3\n4")]),
    ("wpt-format-data-before-final-empty-line", &[("", b"test1")]),
    (
        "wpt-format-field-data",
        &[("", b""), ("", b"\n"), ("", b"test")],
    ),
    ("wpt-format-field-retry-bogus", &[("", b"x")]),
    ("wpt-format-null-character", &[("", b"\0")]),
    (
        "wpt-format-utf-8-despite-charset",
        &[("", "ok…".as_bytes())],
    ),
];

#[test]
fn sse_conformance_cases_dispatch_exactly() {
    let Some(entries) = load("sse conformance") else {
        return;
    };
    let edge: Vec<&Entry> = entries.iter().filter(|e| e.family == "sse_edge").collect();
    assert_eq!(
        edge.len(),
        SSE_CASES.len(),
        "every conformance file has a case"
    );
    for (name, want) in SSE_CASES {
        let e = edge
            .iter()
            .find(|e| e.path == format!("sse_edge/{name}.sse"))
            .unwrap_or_else(|| panic!("{name} is in the corpus"));
        let want: Vec<Msg> = want
            .iter()
            .map(|(ev, d)| (ev.to_string(), d.to_vec()))
            .collect();
        assert_eq!(decode(e, [&e.body[..]]), want, "{name}");
        assert_eq!(
            e.content_events,
            Some(want.len() as u64),
            "{name}: manifest"
        );
    }
}

/// The last value of any of `keys` anywhere in a JSON value (depth first, in document order).
fn last_count(v: &serde_json::Value, keys: &[&str], found: &mut Option<u64>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, x) in map {
                if keys.contains(&k.as_str()) {
                    if let Some(n) = x.as_u64() {
                        *found = Some(n);
                    }
                }
                last_count(x, keys, found);
            }
        }
        serde_json::Value::Array(xs) => xs.iter().for_each(|x| last_count(x, keys, found)),
        _ => {}
    }
}

/// What a body's own usage reports under `keys` (the latest report), read with a plain JSON
/// walk over every message: an oracle independent of the extractors' typed fields.
fn usage_states(msgs: &[Msg], keys: &[&str]) -> Option<u64> {
    let mut found = None;
    for (_, data) in msgs {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
            last_count(&v, keys, &mut found);
        }
    }
    found
}

/// The prompt tokens a llama.cpp stream says its cache served, read with a plain JSON walk:
/// `timings.cache_n`, else `tokens_evaluated` (the whole prompt) less `timings.prompt_n` (the
/// tokens computed).
fn llamacpp_cached(msgs: &[Msg]) -> Option<u64> {
    let mut found = None;
    for (_, data) in msgs {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
            continue;
        };
        let t = &v["timings"];
        let computed = t["prompt_n"].as_u64();
        let cached = t["cache_n"].as_u64().or_else(|| {
            v["tokens_evaluated"]
                .as_u64()
                .zip(computed)
                .and_then(|(all, n)| all.checked_sub(n))
        });
        found = cached.or(found);
    }
    found
}

/// Reasoning and cached prompt tokens: every corpus file whose usage states them gives exactly
/// those counts (reasoning from `reasoning_tokens` / `thoughtsTokenCount`, cache reads from
/// `cached_tokens` / `cache_read_input_tokens` / `cachedContentTokenCount` / llama.cpp's
/// `timings`, writes from
/// `cache_creation_input_tokens`), and a stream whose usage has no reasoning count but that
/// marks reasoning events (Anthropic thinking, Ollama `thinking`) counts them, within its output.
#[test]
fn reasoning_and_cached_tokens_equal_what_usage_states() {
    let Some(entries) = load("reasoning and cached tokens") else {
        return;
    };
    let mut failures = Vec::new();
    let mut checked = (0, 0, 0, 0);
    for e in entries.iter().filter(|e| e.family != "sse_edge") {
        let path = request_path(&e.endpoint);
        let mut r = read::Reader::new(&path, content_type(e), None, MAX_LINE);
        r.feed(&e.body);
        r.finish(true);
        let s = r.summary();
        let msgs = decode(e, [&e.body[..]]);
        let reasoning = usage_states(&msgs, &["reasoning_tokens", "thoughtsTokenCount"]);
        let read_ = usage_states(
            &msgs,
            &[
                "cached_tokens",
                "cache_read_input_tokens",
                "cachedContentTokenCount",
            ],
        );
        // llama.cpp states its cache hits in `timings`, not in a usage count.
        let read_ = read_.or_else(|| llamacpp_cached(&msgs));
        let write = usage_states(&msgs, &["cache_creation_input_tokens"]);
        let mut check = |what: &str, want: Option<u64>, got: Option<u64>| {
            if want != got {
                failures.push(format!("{}: {what}: usage {want:?}, got {got:?}", e.path));
            }
        };
        if reasoning.is_some() {
            checked.0 += 1;
            check("reasoning", reasoning, s.reasoning_tokens);
            check("reasoning()", reasoning, r.reasoning());
        } else if let Some(n) = r.reasoning() {
            checked.1 += 1;
            let (output, _) = r.output();
            if n == 0 || n >= output {
                check("counted reasoning within output", Some(output), Some(n));
            }
        }
        if read_.is_some() {
            checked.2 += 1;
        }
        check("cache read", read_, s.cached_read);
        if write.is_some() {
            checked.3 += 1;
        }
        check("cache write", write, s.cached_write);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Coverage: the files that state each count, so a field that stops parsing cannot pass.
    assert_eq!(
        checked,
        (57, 11, 59, 17),
        "(usage reasoning, counted reasoning, cache read, cache write) files checked"
    );
    // Spot checks against the values the manifest's notes state in words.
    for (file, what, want) in [
        (
            "anthropic/openllmetry-prompt-caching-read.sse",
            "read",
            1165,
        ),
        (
            "anthropic/openllmetry-prompt-caching-write.sse",
            "write",
            1165,
        ),
        (
            "gemini/pydantic-ai-flash-usage-every-chunk.sse",
            "reasoning",
            35,
        ),
    ] {
        let e = entries.iter().find(|e| e.path == file).expect(file);
        let mut r = read::Reader::new(&request_path(&e.endpoint), content_type(e), None, MAX_LINE);
        r.feed(&e.body);
        r.finish(true);
        let got = match what {
            "read" => r.summary().cached_read,
            "write" => r.summary().cached_write,
            _ => r.reasoning(),
        };
        assert_eq!(got, Some(want), "{file}: {what}");
    }
}

/// A counter that counts tokens as they stream can never take one back, so the totals equal
/// usage only if no stream shows more tokens in its events than its usage states: checked here
/// for every corpus stream with usage (the proxy test below then sees the exact sum).
#[test]
fn no_stream_shows_more_tokens_than_its_usage_states() {
    let Some(entries) = load("streamed tokens within usage") else {
        return;
    };
    let mut over = Vec::new();
    let mut checked = 0;
    for e in &entries {
        let path = request_path(&e.endpoint);
        let r = read(e, &path, None, &decode(e, [&e.body[..]]));
        if let Some(usage) = r.summary.output_tokens {
            checked += 1;
            if r.counted() > usage {
                over.push(format!(
                    "{}: events {} > usage {usage}",
                    e.path,
                    r.counted()
                ));
            }
        }
    }
    assert!(over.is_empty(), "{}", over.join("\n"));
    assert_eq!(checked, 125, "streams with usage checked");
}

/// The counts reach the metrics: every file with usage, served through a real proxy, adds
/// exactly the manifest's tokens to the counters, each under its `api` label.
#[tokio::test]
async fn through_the_proxy_the_metrics_equal_the_manifest() {
    let Some(entries) = load("metrics through the proxy") else {
        return;
    };
    let files: Vec<Entry> = entries
        .into_iter()
        .filter(|e| e.expected_output_tokens.is_some())
        .collect();
    let served: std::collections::HashMap<String, (Vec<u8>, &'static str)> = files
        .iter()
        .map(|e| (e.path.clone(), (e.body.clone(), content_type(e))))
        .collect();
    let up = upstream::spawn(move |req| {
        let name = req.path.split("file=").nth(1).unwrap_or("");
        let (body, ct) = served.get(name).cloned().unwrap_or_default();
        let mut rng = Rng::new(body.len() as u64);
        Reply {
            head_delay: std::time::Duration::ZERO,
            status: 200,
            headers: vec![("content-type".into(), ct.into())],
            steps: rng
                .pieces(&body, 1, 700)
                .into_iter()
                .map(Step::Send)
                .collect(),
        }
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let (mut output, mut input) = (0.0, 0.0);
    let mut per_api = std::collections::BTreeMap::<&str, f64>::new();
    for e in &files {
        // A placeholder such as `<deployment>` is no valid URI: keep the path's shape.
        let path: String = request_path(&e.endpoint)
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '/' | '_' | '.' | ':' | '-' => c,
                _ => '_',
            })
            .collect();
        let url = format!("{}{path}?file={}", proxy.url(), e.path);
        let seen = client::post(&url, "{}").await;
        assert_eq!(seen.body, e.body, "{}: passed through", e.path);
        output += expected(e, "output", e.expected_output_tokens).unwrap_or(0) as f64;
        input += expected(e, "input", e.expected_input_tokens).unwrap_or(0) as f64;
        *per_api.entry(expected_api(e).as_str()).or_default() += 1.0;
    }
    let s = proxy.settled(files.len() as f64).await;
    assert_eq!(metric(names::OUTPUT_TOKENS_TOTAL).sum(&s), output);
    assert_eq!(metric(names::INPUT_TOKENS_TOTAL).sum(&s), input);
    assert_eq!(
        metric(names::TOKEN_COUNT_SOURCE_TOTAL)
            .label("source", "usage")
            .sum(&s),
        files.len() as f64
    );
    for (api, n) in per_api {
        assert_eq!(
            metric(names::REQUESTS_TOTAL).label("api", api).sum(&s),
            n,
            "api={api}"
        );
    }
    assert_eq!(
        metric(names::PARSE_ERRORS_TOTAL).sum(&s),
        0.0,
        "no parse errors:\n{s}"
    );
}
