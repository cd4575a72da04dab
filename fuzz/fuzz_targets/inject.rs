//! `--inject-usage`: the request rewriter and the response filter that removes the usage-only
//! event, on arbitrary input. Neither may panic; a rewritten request is valid JSON that asks for
//! usage and keeps every other top-level member unchanged; the filter's output (and its count of
//! removed events) is the same however the body was split, is the body itself, byte for byte,
//! when it removed nothing, and never loses an event holding a choice key (`"delta":`, `"text":`,
//! `"index":`), whole or split.
//!
//! Input: the shared header (piece sizes), one byte that picks the request path, then bytes used
//! both as a request body and as a response body.

#![no_main]

mod common;

use std::collections::BTreeMap;

use common::{pieces, Header};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tokenmeter::inject::{add_usage, UsageFilter};
use tokenmeter::protocol::request;

const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/",
];

/// Keys only a choice has (`inject::CHOICE_KEYS`): an event holding one is never removed.
const CHOICE_KEYS: [&[u8]; 3] = [b"\"delta\":", b"\"text\":", b"\"index\":"];

/// Occurrences of `key` in `bytes`, overlapping ones too.
fn count(bytes: &[u8], key: &[u8]) -> usize {
    bytes.windows(key.len()).filter(|w| *w == key).count()
}

/// The filter over `parts`: everything the client would get, and the events removed.
fn filter(parts: &[&[u8]]) -> (Vec<u8>, u64) {
    let mut f = UsageFilter::default();
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&f.feed(p));
    }
    out.extend_from_slice(&f.finish());
    assert!(!f.holding(), "finish left bytes held");
    (out, f.removed())
}

fn members(v: &Value) -> BTreeMap<String, Value> {
    v.as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| *k != "stream_options")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fuzz_target!(|data: &[u8]| {
    let Some((h, rest)) = Header::parse(data) else {
        return;
    };
    let Some((&pick, body)) = rest.split_first() else {
        return;
    };

    let path = PATHS[usize::from(pick) % PATHS.len()];
    if let Some(out) = add_usage(path, body, &request::read(body).1) {
        let new: Value = serde_json::from_slice(&out).expect("rewritten request is JSON");
        assert_eq!(new["stream_options"]["include_usage"], Value::Bool(true));
        // serde_json keeps the last of duplicate keys; compare only unambiguous bodies.
        if let Ok(old) = serde_json::from_slice::<Value>(body) {
            assert_eq!(members(&old), members(&new), "other members changed");
        }
    }

    let whole = filter(&[body]);
    let split = filter(&pieces(body, h.max_piece, h.seed));
    if whole.1 == 0 {
        assert!(whole.0 == body, "nothing removed, yet the body changed");
    }
    if split.1 == 0 {
        assert!(
            split.0 == body,
            "nothing removed, yet the split body changed"
        );
    }
    assert!(whole.0.len() <= body.len() && split.0.len() <= body.len());
    assert!(
        whole == split,
        "the filter's output depends on how the body was split: {whole:?} vs {split:?}"
    );
    // A removed event is whole, between terminators, and no choice key holds a CR or LF: every
    // key of the body is in the output exactly when no removed event held one.
    for k in CHOICE_KEYS {
        assert_eq!(
            count(&whole.0, k),
            count(body, k),
            "an event holding {} was removed",
            String::from_utf8_lossy(k)
        );
    }
});
