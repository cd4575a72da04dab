//! The simulated engine's own `/metrics`, with vLLM's names: the truth tokenmeter's view of the
//! engine is tested against.
//!
//! The series are vLLM's (0.32, V1 engine) for the scheduler and the KV cache:
//! `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:num_preemptions_total`,
//! `vllm:generation_tokens_total` (tokens, however many an event carries), with
//! `--kv-cache-tokens` `vllm:kv_cache_usage_perc` (a ratio, 0 to 1, as vLLM's is) and
//! `vllm:cache_config_info` (an info gauge whose labels state the cache: `block_size`,
//! `num_gpu_blocks`, and the size in tokens), and with `--spec-acceptance` the speculative
//! decoding counters `vllm:spec_decode_num_drafts_total`,
//! `vllm:spec_decode_num_draft_tokens_total` and `vllm:spec_decode_num_accepted_tokens_total`,
//! and with either prefix cache (`--prefix-cache-hit-rate`, `--prefix-cache-tokens`)
//! `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` (prompt tokens looked
//! up, and served from the cache). Each carries `model_name`, as vLLM's do.

use std::fmt::Write as _;

use super::account::Accounts;
use super::engine::{Counters, Stats};

/// Everything the simulator's `/metrics` serves: vLLM's series, then its own account of GPU time.
pub fn render_all(model: &str, stats: &Stats) -> String {
    let mut out = render(model, &stats.counters());
    out.push_str(&render_accounts(model, &stats.accounts, stats.uptime()));
    out
}

/// The engine's account of who used it (`super::account`): seconds by tenant and phase, its
/// busy seconds and its uptime (idle is the difference). One simulated engine is one GPU.
pub fn render_accounts(model: &str, accounts: &Accounts, uptime: f64) -> String {
    let model = escape(model);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP tokenmeter_sim_gpu_seconds_total Seconds of the simulated GPU spent on each tenant's requests, by phase (docs/cost.md's rule)."
    );
    let _ = writeln!(out, "# TYPE tokenmeter_sim_gpu_seconds_total counter");
    for row in accounts.rows() {
        let tenant = escape(&row.tenant);
        for (phase, v) in [("prefill", row.prefill), ("decode", row.decode)] {
            let _ = writeln!(
                out,
                "tokenmeter_sim_gpu_seconds_total{{model_name=\"{model}\",tenant=\"{tenant}\",phase=\"{phase}\"}} {v}"
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP tokenmeter_sim_gpu_busy_seconds_total Seconds the simulated GPU computed steps.\n# TYPE tokenmeter_sim_gpu_busy_seconds_total counter\ntokenmeter_sim_gpu_busy_seconds_total{{model_name=\"{model}\"}} {}",
        accounts.busy()
    );
    let _ = writeln!(
        out,
        "# HELP tokenmeter_sim_uptime_seconds Seconds since the simulated engine started.\n# TYPE tokenmeter_sim_uptime_seconds gauge\ntokenmeter_sim_uptime_seconds{{model_name=\"{model}\"}} {uptime}"
    );
    out
}

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
    series(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        "",
        c.output_tokens as f64,
    );
    if let Some(p) = c.prefix_cache {
        series(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            "",
            p.queries as f64,
        );
        series(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            "",
            p.hits as f64,
        );
    }
    if let Some(spec) = c.spec {
        series(
            "vllm:spec_decode_num_drafts_total",
            "counter",
            "Number of spec decoding drafts.",
            "",
            spec.drafts as f64,
        );
        series(
            "vllm:spec_decode_num_draft_tokens_total",
            "counter",
            "Number of draft tokens.",
            "",
            spec.draft_tokens as f64,
        );
        series(
            "vllm:spec_decode_num_accepted_tokens_total",
            "counter",
            "Number of accepted tokens.",
            "",
            spec.accepted_tokens as f64,
        );
    }
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
    use crate::sim::account::{Part, Phase};
    use crate::sim::decoding::SpecCounts;
    use crate::sim::engine::{KvBlocks, PrefixCounts};
    use std::time::Duration;

    #[test]
    fn the_account_is_served_by_tenant_and_phase() {
        let a = Accounts::default();
        let t = a.tenant(Some("team-a"));
        a.step(
            &crate::sim::account::tests::model(
                Duration::from_millis(10),
                Duration::ZERO,
                Duration::ZERO,
            ),
            &[Part {
                tenant: t,
                phase: Phase::Decode,
                prefill_tokens: 0,
                kv_tokens: 0,
            }],
        );
        let text = render_accounts("m", &a, 2.5);
        assert!(text.contains(
            "tokenmeter_sim_gpu_seconds_total{model_name=\"m\",tenant=\"team-a\",phase=\"decode\"} 0.01\n"
        ), "{text}");
        assert!(text.contains("tokenmeter_sim_gpu_busy_seconds_total{model_name=\"m\"} 0.01\n"));
        assert!(text.contains("tokenmeter_sim_uptime_seconds{model_name=\"m\"} 2.5\n"));
    }

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
        assert!(!text.contains("spec_decode"), "{text}");
        assert!(!text.contains("prefix_cache"), "{text}");
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

    #[test]
    fn tokens_and_speculative_drafts_are_counted_with_vllms_names() {
        let mut c = Counters {
            output_tokens: 200,
            steps: 67,
            ..Counters::default()
        };
        let text = render("m", &c);
        assert!(
            text.contains("vllm:generation_tokens_total{model_name=\"m\"} 200\n"),
            "{text}"
        );
        c.spec = Some(SpecCounts {
            drafts: 10,
            draft_tokens: 40,
            accepted_tokens: 25,
        });
        let text = render("m", &c);
        for line in [
            "# TYPE vllm:spec_decode_num_drafts_total counter\n",
            "vllm:spec_decode_num_drafts_total{model_name=\"m\"} 10\n",
            "vllm:spec_decode_num_draft_tokens_total{model_name=\"m\"} 40\n",
            "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} 25\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }

    #[test]
    fn the_prefix_cache_is_counted_in_tokens_with_vllms_names() {
        let c = Counters {
            prefix_cache: Some(PrefixCounts {
                queries: 650,
                hits: 240,
            }),
            ..Counters::default()
        };
        let text = render("m", &c);
        for line in [
            "# TYPE vllm:prefix_cache_queries_total counter\n",
            "vllm:prefix_cache_queries_total{model_name=\"m\"} 650\n",
            "# TYPE vllm:prefix_cache_hits_total counter\n",
            "vllm:prefix_cache_hits_total{model_name=\"m\"} 240\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }
}
