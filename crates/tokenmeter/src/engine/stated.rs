//! What an engine states of its own limits in a JSON document beside its metrics, for the
//! dialects whose `/metrics` does not say how big their memory is.
//!
//! - **TGI** `/info`: `max_batch_total_tokens`, the tokens its batch may hold at once (prompt and
//!   answer of every running request: the router's block allocator admits by it, so it is the
//!   KV cache for the capacity model's purpose); `block_size` where it states one (v3, else 1: v1
//!   and v2 counted tokens); `max_batch_size` where it is set (the `max_num_seqs` bound; it is
//!   null unless the launcher was given `--max-batch-size`).
//! - **llama.cpp** `/props`: `total_slots` (`--parallel`, requests decoded at once: the
//!   `max_num_seqs` bound) and `default_generation_settings.n_ctx`, the context of one slot; the
//!   cache is the slots' contexts together, `total_slots × n_ctx`, in cells of one token. A
//!   server started with a unified cache (`--kv-unified`) shares one context of `n_ctx` between
//!   its slots, which this document does not tell apart: give `--kv-cache-tokens` then.
//!
//! Any field missing, of the wrong type, zero or absurd is left out, as if not stated; a
//! document that is not JSON states nothing.

use super::view::EngineView;

/// The largest figure taken from a document: 2^40 tokens is beyond any engine's cache by
/// orders of magnitude; a larger number is a broken document, not a cache.
const MAX_TOKENS: u64 = 1 << 40;

/// A positive integer at `path` in `doc`, at most `max`.
fn positive(doc: &serde_json::Value, path: &[&str], max: u64) -> Option<u64> {
    let mut v = doc;
    for key in path {
        v = v.get(key)?;
    }
    v.as_u64().filter(|&n| n > 0 && n <= max)
}

/// Reads TGI's `/info` into `view`: its cache, block size and batch cap.
pub fn tgi_info(doc: &[u8], view: &mut EngineView) {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(doc) else {
        return;
    };
    if let Some(tokens) = positive(&doc, &["max_batch_total_tokens"], MAX_TOKENS) {
        view.kv_cache_tokens = Some(tokens);
        let block = positive(&doc, &["block_size"], u64::from(u32::MAX)).unwrap_or(1);
        view.block_size = u32::try_from(block).ok();
    }
    view.max_num_seqs = positive(&doc, &["max_batch_size"], u64::from(u32::MAX))
        .and_then(|n| u32::try_from(n).ok());
}

/// Reads llama.cpp's `/props` into `view`: its slots and their context.
pub fn llamacpp_props(doc: &[u8], view: &mut EngineView) {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(doc) else {
        return;
    };
    let slots = positive(&doc, &["total_slots"], u64::from(u32::MAX));
    let n_ctx = positive(&doc, &["default_generation_settings", "n_ctx"], MAX_TOKENS);
    if let Some(tokens) = slots
        .zip(n_ctx)
        .and_then(|(s, n)| s.checked_mul(n))
        .filter(|&t| t <= MAX_TOKENS)
    {
        view.kv_cache_tokens = Some(tokens);
        view.block_size = Some(1);
    }
    view.max_num_seqs = slots.and_then(|n| u32::try_from(n).ok());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TGI 3.x's `/info` (its field names; values of a Llama 3.1 8B on one L4).
    const TGI_INFO: &str = r#"{"model_id":"meta-llama/Llama-3.1-8B-Instruct","model_sha":null,"model_pipeline_tag":"text-generation","max_concurrent_requests":128,"max_best_of":2,"max_stop_sequences":4,"max_input_tokens":8191,"max_total_tokens":8192,"validation_workers":2,"max_client_batch_size":4,"router":"text-generation-router","version":"3.0.1","sha":null,"docker_label":null,"model_device_type":"cuda","model_dtype":"torch.bfloat16","speculate":0,"waiting_served_ratio":0.3,"max_batch_total_tokens":51984,"max_waiting_tokens":20,"max_batch_size":null,"support_chunking":true,"prefix_caching":true,"attention_impl":"flashinfer","block_size":1}"#;

    /// llama.cpp's `/props` with `-c 8192 -np 4` (abridged to the fields read and a few more).
    const LLAMACPP_PROPS: &str = r#"{"default_generation_settings":{"id":0,"id_task":-1,"n_ctx":2048,"speculative":false,"is_processing":false,"params":{"n_predict":-1,"temperature":0.8}},"total_slots":4,"model_path":"models/llama-3.2-1b-q4.gguf","chat_template":"...","build_info":"b5000-abc"}"#;

    #[test]
    fn tgi_states_its_batch_tokens_and_block_size() {
        let mut v = EngineView::default();
        tgi_info(TGI_INFO.as_bytes(), &mut v);
        assert_eq!(
            (v.kv_cache_tokens, v.block_size, v.max_num_seqs),
            (Some(51_984), Some(1), None)
        );
        // Older routers: no block size (tokens counted one by one), a batch size set.
        let old = r#"{"max_batch_total_tokens":16000,"max_batch_size":32,"version":"1.4.3"}"#;
        let mut v = EngineView::default();
        tgi_info(old.as_bytes(), &mut v);
        assert_eq!(
            (v.kv_cache_tokens, v.block_size, v.max_num_seqs),
            (Some(16_000), Some(1), Some(32))
        );
    }

    #[test]
    fn llamacpp_states_its_slots_and_their_context() {
        let mut v = EngineView::default();
        llamacpp_props(LLAMACPP_PROPS.as_bytes(), &mut v);
        assert_eq!(
            (v.kv_cache_tokens, v.block_size, v.max_num_seqs),
            (Some(8192), Some(1), Some(4))
        );
    }

    #[test]
    fn a_broken_document_states_nothing() {
        for doc in [
            "",
            "<html>",
            "null",
            "[1,2]",
            r#"{"max_batch_total_tokens":-5,"max_batch_size":0}"#,
            r#"{"max_batch_total_tokens":"51984"}"#,
            r#"{"max_batch_total_tokens":1e300}"#,
            r#"{"max_batch_total_tokens":18446744073709551615}"#,
        ] {
            let mut v = EngineView::default();
            tgi_info(doc.as_bytes(), &mut v);
            assert_eq!(v, EngineView::default(), "{doc}");
        }
        for doc in [
            "{",
            r#"{"total_slots":4}"#,
            r#"{"total_slots":0,"default_generation_settings":{"n_ctx":2048}}"#,
            r#"{"total_slots":4294967296,"default_generation_settings":{"n_ctx":4294967296}}"#,
        ] {
            let mut v = EngineView::default();
            llamacpp_props(doc.as_bytes(), &mut v);
            assert_eq!(v.kv_cache_tokens, None, "{doc}");
        }
    }
}
