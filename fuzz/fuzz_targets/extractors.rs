//! Every extractor on arbitrary messages: none may panic, each must be deterministic, a message
//! can be counted malformed at most once, and `Summary::ended`, once set by an end marker, stays
//! set whatever follows. The request inspector gets the raw body too.
//!
//! Input: one byte that picks the path and content type for the auto-detecting extractor
//! (`read::select` without `--api`), then messages separated by NUL bytes; a message with a
//! 0x1F byte has the part before it as its SSE event name. Every pinned extractor
//! (`protocol::extractor` for each of `Api::KNOWN`, so a new format is covered as soon as it is
//! listed there) reads the same messages.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmeter::protocol::{self, request, Api, Extractor, Message, Summary};
use tokenmeter::read;

/// Paths the formats serve (and some they do not), each tried with every framing.
const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/api/chat",
    "/api/generate",
    "/generate",
    "/generate_stream",
    "/v1/responses",
    "/v1beta/models/m:streamGenerateContent",
    "/v1/embeddings",
    "/v2/chat",
    "/completion",
    "/v2/models/ensemble/generate_stream",
    "/ml/v1/generation/text_stream",
    "/v1/streams/abc",
    "/",
];
const TYPES: &[&str] = &[
    "text/event-stream",
    "application/x-ndjson",
    "application/json",
];

/// Runs messages through one extractor: the token count of each, and the final summary. Checks
/// after every message that `ended` never goes from set back to unset.
fn run(x: &mut dyn Extractor, msgs: &[Message<'_>]) -> (Vec<u32>, Summary, &'static str) {
    let mut ended_at = None;
    let mut counts = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        counts.push(x.on_message(m));
        match (ended_at, x.summary().ended) {
            (None, true) => ended_at = Some(i),
            (Some(first), false) => panic!(
                "{}: ended after message {first}, then not after message {i}",
                x.api().as_str()
            ),
            _ => {}
        }
    }
    (counts, x.summary().clone(), x.api().as_str())
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let _ = request::inspect(body);

    let names: Vec<String> = body
        .split(|&b| b == 0)
        .map(|m| match m.iter().position(|&b| b == 0x1F) {
            Some(i) => String::from_utf8_lossy(&m[..i]).into_owned(),
            None => String::new(),
        })
        .collect();
    let msgs: Vec<Message<'_>> = body
        .split(|&b| b == 0)
        .zip(&names)
        .map(|(m, event)| Message {
            event,
            data: m.iter().position(|&b| b == 0x1F).map_or(m, |i| &m[i + 1..]),
        })
        .collect();

    let path = PATHS[usize::from(pick) % PATHS.len()];
    let ct = TYPES[usize::from(pick / 16) % TYPES.len()];
    let (_, mut a) = read::select(path, ct, None);
    let (_, mut b) = read::select(path, ct, None);
    let first = run(a.as_mut(), &msgs);
    assert_eq!(
        first,
        run(b.as_mut(), &msgs),
        "auto extractor is not deterministic"
    );
    assert!(first.1.malformed <= msgs.len() as u64, "auto: {first:?}");

    for api in Api::KNOWN.into_iter().chain([Api::Unknown]) {
        let mut x = protocol::extractor(api);
        let (counts, s, name) = run(x.as_mut(), &msgs);
        assert!(s.malformed <= msgs.len() as u64, "{name}: {s:?}");
        let mut y = protocol::extractor(api);
        assert_eq!(
            (counts, s, name),
            run(y.as_mut(), &msgs),
            "{name} is not deterministic"
        );
    }
});
