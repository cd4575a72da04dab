//! What an engine's `/metrics` says of its memory and queue, in the dialects tokenmeter knows.
//!
//! - **vLLM** (`vllm:` names): the cache's size from `vllm:cache_config_info`'s
//!   `kv_cache_size_tokens` label, else `num_gpu_blocks x block_size`; its usage
//!   (`vllm:kv_cache_usage_perc`, before v0.10 `vllm:gpu_cache_usage_perc`, a ratio despite the
//!   name); `vllm:num_requests_running`, `vllm:num_requests_waiting`, and
//!   `vllm:num_preemptions_total` (before V1 `vllm:num_preemptions`). A data-parallel vLLM
//!   states each engine (`engine="0"`, ...): sizes and counts are summed over them, usage is
//!   their mean weighted by size.
//! - **SGLang** (`sglang:` names): `sglang:max_total_num_tokens` (its token pool: a block of one
//!   token), `sglang:token_usage`, `sglang:num_running_reqs`, `sglang:num_queue_reqs`.
//! - **TGI** (`tgi_` names): `tgi_queue_size` waiting, `tgi_batch_current_size` running. Its
//!   cache's size is on `/info`, not here ([`super::stated`]); with it, the usage is
//!   `tgi_batch_current_max_tokens` (the tokens its running batch has reserved) over
//!   `max_batch_total_tokens`.
//! - **llama.cpp** (`llamacpp:` names, with `--metrics`): `llamacpp:requests_processing`
//!   running, `llamacpp:requests_deferred` waiting, `llamacpp:kv_cache_usage_ratio` where the
//!   build still has it. Its slots and their context are on `/props` ([`super::stated`]).
//!
//! Anything else is not a dialect known here; a page with none of these names says nothing. A
//! series with a value that is not finite is left out, as if absent.

use crate::exposition::Scrape;

/// The engine families a dialect names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Vllm,
    Sglang,
    Tgi,
    LlamaCpp,
}

impl Dialect {
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Vllm => "vllm",
            Dialect::Sglang => "sglang",
            Dialect::Tgi => "tgi",
            Dialect::LlamaCpp => "llamacpp",
        }
    }

    /// The path, at the page's origin, of the document where this dialect states its limits
    /// ([`super::stated`]); `None` where the page itself states them.
    pub fn stated_path(self) -> Option<&'static str> {
        match self {
            Dialect::Vllm | Dialect::Sglang => None,
            Dialect::Tgi => Some("/info"),
            Dialect::LlamaCpp => Some("/props"),
        }
    }
}

/// What the engine stated in one scrape; every field may be missing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineView {
    pub kv_cache_tokens: Option<u64>,
    pub block_size: Option<u32>,
    /// The share of the cache in use, 0 to 1.
    pub kv_usage: Option<f64>,
    pub requests_running: Option<f64>,
    pub requests_waiting: Option<f64>,
    /// The engine's own counter of preemptions since it started.
    pub preemptions_total: Option<f64>,
    /// The most requests it decodes at once, where it states that (TGI, llama.cpp).
    pub max_num_seqs: Option<u32>,
    /// TGI: the tokens its running batch has reserved, made a usage once `/info` is read.
    pub reserved_tokens: Option<f64>,
}

/// Reads `scrape` in the first dialect whose names it has; `None` when it has neither's.
pub fn read(scrape: &Scrape) -> Option<(Dialect, EngineView)> {
    let has = |prefix: &str| scrape.samples().iter().any(|s| s.name.starts_with(prefix));
    if has("vllm:") {
        Some((Dialect::Vllm, vllm(scrape)))
    } else if has("sglang:") {
        Some((Dialect::Sglang, sglang(scrape)))
    } else if has("tgi_") {
        Some((Dialect::Tgi, tgi(scrape)))
    } else if has("llamacpp:") {
        Some((Dialect::LlamaCpp, llamacpp(scrape)))
    } else {
        None
    }
}

/// The sum of every finite sample of the first of `names` that has any; `None` when none has.
fn sum(scrape: &Scrape, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|name| {
        let values: Vec<f64> = scrape
            .select(name, &[])
            .map(|s| s.value)
            .filter(|v| v.is_finite())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    })
}

fn vllm(scrape: &Scrape) -> EngineView {
    // Per engine: its size in tokens and its block size, from the info series' labels.
    let mut engines: Vec<(Option<String>, u64, Option<u32>)> = Vec::new();
    for s in scrape.select("vllm:cache_config_info", &[]) {
        let label = |k: &str| s.label(k).and_then(|v| v.trim().parse::<u64>().ok());
        let block = label("block_size").and_then(|b| u32::try_from(b).ok());
        let tokens = label("kv_cache_size_tokens").or_else(|| {
            label("num_gpu_blocks")
                .zip(block)
                .map(|(n, b)| n.saturating_mul(u64::from(b)))
        });
        if let Some(tokens) = tokens.filter(|&t| t > 0) {
            engines.push((s.label("engine").map(str::to_string), tokens, block));
        }
    }
    let kv_cache_tokens = (!engines.is_empty()).then(|| engines.iter().map(|e| e.1).sum());
    let block_size = engines.iter().find_map(|e| e.2).filter(|&b| b > 0);
    // Usage per engine, weighted by its size where the sizes are known per engine.
    let usage: Vec<(Option<&str>, f64)> = ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
        .iter()
        .map(|name| {
            scrape
                .select(name, &[])
                .filter(|s| s.value.is_finite())
                .map(|s| (s.label("engine"), s.value))
                .collect::<Vec<_>>()
        })
        .find(|v| !v.is_empty())
        .unwrap_or_default();
    let kv_usage = if usage.is_empty() {
        None
    } else {
        let weight = |engine: Option<&str>| {
            engines
                .iter()
                .find(|e| e.0.as_deref() == engine)
                .map_or(1.0, |e| e.1 as f64)
        };
        let total: f64 = usage.iter().map(|(e, _)| weight(*e)).sum();
        let used: f64 = usage.iter().map(|(e, u)| weight(*e) * u).sum();
        (total > 0.0).then(|| (used / total).clamp(0.0, 1.0))
    };
    EngineView {
        kv_cache_tokens,
        block_size,
        kv_usage,
        requests_running: sum(scrape, &["vllm:num_requests_running"]),
        requests_waiting: sum(scrape, &["vllm:num_requests_waiting"]),
        preemptions_total: sum(
            scrape,
            &["vllm:num_preemptions_total", "vllm:num_preemptions"],
        ),
        ..EngineView::default()
    }
}

fn sglang(scrape: &Scrape) -> EngineView {
    let usage: Vec<f64> = scrape
        .select("sglang:token_usage", &[])
        .map(|s| s.value)
        .filter(|v| v.is_finite())
        .collect();
    EngineView {
        kv_cache_tokens: sum(scrape, &["sglang:max_total_num_tokens"])
            .filter(|&t| t >= 1.0)
            .map(|t| t as u64),
        block_size: Some(1),
        kv_usage: (!usage.is_empty())
            .then(|| (usage.iter().sum::<f64>() / usage.len() as f64).clamp(0.0, 1.0)),
        requests_running: sum(scrape, &["sglang:num_running_reqs"]),
        requests_waiting: sum(scrape, &["sglang:num_queue_reqs"]),
        ..EngineView::default()
    }
}

fn tgi(scrape: &Scrape) -> EngineView {
    EngineView {
        requests_running: sum(scrape, &["tgi_batch_current_size"]),
        requests_waiting: sum(scrape, &["tgi_queue_size"]),
        reserved_tokens: sum(scrape, &["tgi_batch_current_max_tokens"]),
        ..EngineView::default()
    }
}

fn llamacpp(scrape: &Scrape) -> EngineView {
    EngineView {
        kv_usage: sum(scrape, &["llamacpp:kv_cache_usage_ratio"]).map(|u| u.clamp(0.0, 1.0)),
        requests_running: sum(scrape, &["llamacpp:requests_processing"]),
        requests_waiting: sum(scrape, &["llamacpp:requests_deferred"]),
        ..EngineView::default()
    }
}

impl EngineView {
    /// The usage TGI's page implies once its cache's size is known: reserved over total.
    pub fn with_reserved_usage(mut self) -> Self {
        if self.kv_usage.is_none() {
            if let (Some(r), Some(t)) = (self.reserved_tokens, self.kv_cache_tokens) {
                self.kv_usage = Some((r / t as f64).clamp(0.0, 1.0));
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What vLLM V1 serves with data parallelism of two (its names and labels; values made up):
    /// two engines of 1,000 blocks of 16.
    const VLLM_DP2: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 7.0
vllm:num_requests_running{engine="1",model_name="llama"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 2.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.9
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.5
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="llama"} 30.0
vllm:num_preemptions_total{engine="1",model_name="llama"} 4.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="1000",num_cpu_blocks="None"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_gpu_blocks="1000",num_cpu_blocks="None"} 1.0
"#;

    #[test]
    fn vllm_engines_are_summed_and_usage_weighted_by_size() {
        let (d, v) = read(&Scrape::parse(VLLM_DP2)).expect("vllm");
        assert_eq!(d, Dialect::Vllm);
        assert_eq!(v.kv_cache_tokens, Some(32_000));
        assert_eq!(v.block_size, Some(16));
        assert!((v.kv_usage.expect("usage") - 0.7).abs() < 1e-12);
        assert_eq!(
            (v.requests_running, v.requests_waiting, v.preemptions_total),
            (Some(12.0), Some(2.0), Some(34.0))
        );
    }

    #[test]
    fn the_simulators_page_and_older_vllm_names_are_read() {
        // tokenmeter sim --kv-cache-tokens 2048 --block-size 128: kv_cache_size_tokens stated.
        let sim = r#"vllm:num_requests_running{model_name="tokenmeter-sim"} 3
vllm:num_requests_waiting{model_name="tokenmeter-sim"} 1
vllm:num_preemptions_total{model_name="tokenmeter-sim"} 2
vllm:kv_cache_usage_perc{model_name="tokenmeter-sim"} 0.75
vllm:cache_config_info{model_name="tokenmeter-sim",block_size="128",num_gpu_blocks="16",kv_cache_size_tokens="2048"} 1
"#;
        let (_, v) = read(&Scrape::parse(sim)).expect("vllm");
        assert_eq!((v.kv_cache_tokens, v.block_size), (Some(2048), Some(128)));
        assert_eq!(v.kv_usage, Some(0.75));
        // Before v0.10: gpu_cache_usage_perc and num_preemptions (a counter without _total).
        let old = r#"vllm:gpu_cache_usage_perc{model_name="m"} 0.25
vllm:num_preemptions{model_name="m"} 5
vllm:cache_config_info{block_size="32",num_gpu_blocks="100"} 1
"#;
        let (_, v) = read(&Scrape::parse(old)).expect("vllm");
        assert_eq!((v.kv_cache_tokens, v.block_size), (Some(3200), Some(32)));
        assert_eq!((v.kv_usage, v.preemptions_total), (Some(0.25), Some(5.0)));
        assert_eq!(v.requests_running, None);
    }

    #[test]
    fn sglang_states_its_token_pool() {
        let text = r#"sglang:max_total_num_tokens{model_name="qwen"} 65536.0
sglang:token_usage{model_name="qwen"} 0.4
sglang:num_running_reqs{model_name="qwen"} 9.0
sglang:num_queue_reqs{model_name="qwen"} 3.0
"#;
        let (d, v) = read(&Scrape::parse(text)).expect("sglang");
        assert_eq!(d, Dialect::Sglang);
        assert_eq!((v.kv_cache_tokens, v.block_size), (Some(65536), Some(1)));
        assert_eq!(
            (v.kv_usage, v.requests_running, v.requests_waiting),
            (Some(0.4), Some(9.0), Some(3.0))
        );
    }

    #[test]
    fn tgi_and_llamacpp_state_their_queues_here_and_their_memory_elsewhere() {
        // TGI's page: a running batch of 3 with 6,000 tokens reserved, 2 queued.
        let text = "tgi_batch_current_size 3\ntgi_queue_size 2\ntgi_batch_current_max_tokens 6000\ntgi_request_count 40\n";
        let (d, v) = read(&Scrape::parse(text)).expect("tgi");
        assert_eq!((d, d.stated_path()), (Dialect::Tgi, Some("/info")));
        assert_eq!(
            (v.requests_running, v.requests_waiting, v.kv_cache_tokens),
            (Some(3.0), Some(2.0), None)
        );
        // No usage without the cache's size; with /info's 24,000 tokens, a quarter.
        assert_eq!(v.with_reserved_usage().kv_usage, None);
        let sized = EngineView {
            kv_cache_tokens: Some(24_000),
            ..v
        };
        assert_eq!(sized.with_reserved_usage().kv_usage, Some(0.25));
        // llama.cpp's page (`--metrics`), with the usage older builds still state.
        let text = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\nllamacpp:kv_cache_usage_ratio 0.5\nllamacpp:prompt_tokens_total 900\n";
        let (d, v) = read(&Scrape::parse(text)).expect("llama.cpp");
        assert_eq!((d, d.stated_path()), (Dialect::LlamaCpp, Some("/props")));
        assert_eq!(
            (v.requests_running, v.requests_waiting, v.kv_usage),
            (Some(2.0), Some(1.0), Some(0.5))
        );
    }

    #[test]
    fn garbage_and_other_dialects_say_nothing() {
        assert_eq!(read(&Scrape::parse("")), None);
        assert_eq!(
            read(&Scrape::parse("<html>not found</html>\n\u{0}\u{1}")),
            None
        );
        assert_eq!(
            read(&Scrape::parse(
                "ollama_queue_size 3\nprocess_cpu_seconds_total 1\n"
            )),
            None
        );
        // vLLM's names with values that are not numbers, or not finite: absent.
        let (_, v) = read(&Scrape::parse(
            "vllm:num_requests_running NaN\nvllm:cache_config_info{block_size=\"x\",num_gpu_blocks=\"-3\"} 1\n",
        ))
        .expect("vllm");
        assert_eq!(v, EngineView::default());
    }
}
