//! `--inject-usage`: the request rewriter and the response filter that removes the usage-only
//! event, on arbitrary input. Neither may panic; a rewritten request is valid JSON that asks for
//! usage and keeps every other top-level member unchanged; the filter's output is the same
//! however the body was split, and is the body itself, byte for byte, when it removed nothing.
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

const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/",
];

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
    if let Some(out) = add_usage(path, body) {
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
    if whole != split {
        // Known and reported: an event that `is_usage_only` accepts but that holds a choice key
        // (`"index":` in its usage, say) is released as content when a piece ends after the key,
        // and removed when the event arrives whole. Anything else is a new bug.
        let key = [&b"\"delta\":"[..], b"\"text\":", b"\"index\":"]
            .iter()
            .any(|k| body.windows(k.len()).any(|w| w == *k));
        assert!(
            key && split.1 < whole.1,
            "the filter's output depends on how the body was split: {whole:?} vs {split:?}"
        );
    }
});
