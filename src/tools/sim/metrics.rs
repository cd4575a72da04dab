//! The simulated engine's own `/metrics`, with vLLM's names: the truth tokenmeter's view of the
//! engine is tested against.
//!
//! The series are vLLM's (0.32, V1 engine) for the scheduler and the KV cache:
//! `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:num_preemptions_total`, and
//! with `--kv-cache-tokens` `vllm:kv_cache_usage_perc` (a ratio, 0 to 1, as vLLM's is) and
//! `vllm:cache_config_info` (an info gauge whose labels state the cache: `block_size`,
//! `num_gpu_blocks`, and the size in tokens). Each carries `model_name`, as vLLM's do.

use std::fmt::Write as _;

use super::engine::Counters;

/// The exposition text of `counters` for a model named `model`.
pub fn render(model: &str, c: &Counters) -> String {
    let model = escape(model);
    let mut out = String::new();
    let mut series = |name: &str, kind: &str, help: &str, labels: &str, value: f64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{model_name=\"{model}\"{labels}}} {value}");
    };
    series(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        "",
        c.running as f64,
    );
    series(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        "",
        c.queued as f64,
    );
    series(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemption from the engine.",
        "",
        c.preemptions as f64,
    );
    if let Some(kv) = c.kv_blocks {
        let usage = if kv.total == 0 {
            0.0
        } else {
            f64::from(kv.used) / f64::from(kv.total)
        };
        series(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            "",
            usage,
        );
        let labels = format!(
            ",block_size=\"{}\",num_gpu_blocks=\"{}\",kv_cache_size_tokens=\"{}\"",
            kv.block_size,
            kv.total,
            u64::from(kv.total) * u64::from(kv.block_size)
        );
        series(
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig.",
            &labels,
            1.0,
        );
    }
    out
}

/// A label value as the exposition format writes it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::sim::engine::KvBlocks;

    #[test]
    fn the_cache_is_stated_only_when_it_has_a_size() {
        let mut c = Counters {
            running: 3,
            queued: 2,
            preemptions: 5,
            ..Counters::default()
        };
        let text = render("m\"1", &c);
        assert!(text.contains("vllm:num_requests_running{model_name=\"m\\\"1\"} 3\n"));
        assert!(text.contains("vllm:num_requests_waiting{model_name=\"m\\\"1\"} 2\n"));
        assert!(text.contains("vllm:num_preemptions_total{model_name=\"m\\\"1\"} 5\n"));
        assert!(!text.contains("kv_cache"), "{text}");
        c.kv_blocks = Some(KvBlocks {
            used: 12,
            total: 16,
            block_size: 16,
            max_used: 16,
        });
        let text = render("m", &c);
        assert!(
            text.contains("vllm:kv_cache_usage_perc{model_name=\"m\"} 0.75\n"),
            "{text}"
        );
        assert!(text.contains(
            "vllm:cache_config_info{model_name=\"m\",block_size=\"16\",num_gpu_blocks=\"16\",kv_cache_size_tokens=\"256\"} 1\n"
        ));
    }
}
