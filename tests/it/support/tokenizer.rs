//! A model directory whose tokenizer cuts text where the simulator's tokens begin (an optional
//! space and a word, or one other character), for the tests that count with `--tokenizer`
//! against the simulator: its counts are the simulator's own.

use std::path::PathBuf;

use serde_json::json;

/// Writes `tokenizer.json` into a fresh temporary directory named after `tag`. Each word of
/// `words` gets an id of its own, with and without its leading space (so prompts that differ
/// get different ids, as a prefix's blocks need); any other piece is `<unk>`, one token.
pub fn word_level(tag: &str, words: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tokenmeter-it-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let mut vocab = serde_json::Map::new();
    vocab.insert("<unk>".into(), json!(0));
    for w in words {
        let n = vocab.len();
        vocab.insert((*w).into(), json!(n));
        vocab.insert(format!(" {w}"), json!(n + 1));
    }
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": " ?\\w+| ?[^\\w\\s]|\\s"},
            "behavior": "Isolated",
            "invert": false
        },
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).expect("write");
    dir
}
