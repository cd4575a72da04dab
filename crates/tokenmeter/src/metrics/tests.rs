use std::time::Duration;

use super::*;
use crate::exposition::Scrape;
use crate::protocol::{Api, Stop};
use crate::record::tests::finished;
use crate::record::{CachedInput, Outcome, ParseErrors, SloResult};
use crate::slo::Verdict;

/// The sum of the series `selector` picks in an exposition.
fn sum(text: &str, selector: &str) -> f64 {
    Scrape::parse(text).sum_of(selector)
}

#[test]
fn record_observes_every_end_of_request_family_once() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    m.record(&Finished {
        parse_errors: ParseErrors {
            line_too_long: 2,
            invalid_json: 1,
            content_encoding: 0,
        },
        ..finished()
    });
    let text = String::from_utf8(m.render()).expect("utf8");
    let one = |l: &str| assert_eq!(sum(&text, l), 1.0, "{l} in\n{text}");
    one("tokenmeter_requests_total{api=\"openai\",code=\"200\",model=\"m\",outcome=\"complete\"}");
    one("tokenmeter_token_count_source_total{source=\"counted\"}");
    one("tokenmeter_parse_errors_total{reason=\"invalid_json\"}");
    assert_eq!(
        sum(
            &text,
            "tokenmeter_parse_errors_total{reason=\"line_too_long\"}"
        ),
        2.0
    );
    assert_eq!(
        sum(&text, "tokenmeter_output_tokens_total{model=\"m\"}"),
        5.0
    );
    assert_eq!(
        sum(&text, "tokenmeter_input_tokens_total{model=\"m\"}"),
        7.0
    );
    let close = |l: &str, want: f64| {
        let got = sum(&text, l);
        assert!((got - want).abs() < 1e-9, "{l}: {got} != {want}");
    };
    close("tokenmeter_request_duration_seconds_sum", 0.5);
    close("tokenmeter_time_to_first_byte_seconds_sum", 0.05);
    // 4 gaps over 200 ms of decode.
    close("tokenmeter_time_per_output_token_seconds_sum", 0.05);
    close(
        "tokenmeter_request_tokens_per_second_sum{concurrency=\"2-4\",model=\"m\"}",
        20.0,
    );
    // TTFT and ITL are observed live, through the model's handles, not at the end.
    assert_eq!(
        sum(&text, "tokenmeter_time_to_first_token_seconds_count"),
        0.0
    );
}

#[test]
fn a_request_no_parser_read_counts_but_has_no_token_metrics() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    m.record(&Finished {
        api: Api::Unknown,
        outcome: Outcome::BadRequest,
        code: 400,
        ..finished()
    });
    let text = String::from_utf8(m.render()).expect("utf8");
    assert_eq!(sum(&text, "tokenmeter_requests_total{api=\"unknown\",code=\"400\",model=\"m\",outcome=\"bad_request\"}"), 1.0);
    assert_eq!(sum(&text, "tokenmeter_request_duration_seconds_count"), 1.0);
    assert_eq!(sum(&text, "tokenmeter_output_tokens_total"), 0.0);
    assert_eq!(sum(&text, "tokenmeter_token_count_source_total"), 0.0);
    assert_eq!(sum(&text, "tokenmeter_requests_total"), 1.0);
    assert_eq!(
        sum(&text, "tokenmeter_requests_total{outcome=\"complete\"}"),
        0.0
    );
}

#[test]
fn model_handles_observe_ttft_and_spread_itl_over_tokens() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    let h = m.model(m.model_label(Some("m")), None);
    assert_eq!(h.label(), "m");
    h.first_token(Duration::from_millis(250), Some(300));
    h.inter_token(Duration::from_millis(30), 3);
    let text = String::from_utf8(m.render()).expect("utf8");
    assert_eq!(
        sum(
            &text,
            "tokenmeter_time_to_first_token_seconds_count{model=\"m\",prompt=\"257-1k\"}"
        ),
        1.0
    );
    assert_eq!(
        sum(
            &text,
            "tokenmeter_inter_token_latency_seconds_count{model=\"m\"}"
        ),
        3.0
    );
    let itl = sum(
        &text,
        "tokenmeter_inter_token_latency_seconds_sum{model=\"m\"}",
    );
    assert!((itl - 0.03).abs() < 1e-9, "{itl}");
}

#[test]
fn exposition_has_every_family() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    m.record(&finished());
    let text = String::from_utf8(m.render()).expect("utf8");
    for name in [
        "tokenmeter_requests_in_flight{phase=\"prefill\"} 0",
        "tokenmeter_requests_total{api=\"openai\",code=\"200\",model=\"m\",outcome=\"complete\"} 1",
        "tokenmeter_gpus{source=\"default\"} 1",
        "tokenmeter_slo_objective{class=\"interactive\"} 0.95",
        "tokenmeter_slo_objective{class=\"batch\"} 0.95",
        "tokenmeter_output_tokens_per_second 0",
        "tokenmeter_token_count_source_total{source=\"usage\"} 0",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
}

fn vllm_metrics() -> Metrics {
    let cfg = MetricsConfig {
        compat: Compat {
            vllm: true,
            ..Compat::default()
        },
        ..MetricsConfig::default()
    };
    Metrics::new(&cfg).expect("metrics")
}

#[test]
fn vllm_names_carry_model_name_engine_and_vllms_buckets() {
    let m = vllm_metrics();
    let h = m.model("m".into(), None);
    h.first_token(Duration::from_millis(100), Some(7));
    // Two events: 2 tokens after 40 ms, 1 token after 10 ms. vLLM observes once per step.
    h.inter_token(Duration::from_millis(40), 2);
    h.inter_token(Duration::from_millis(10), 1);
    m.record(&Finished {
        stop: Some(Stop::Length),
        ..finished()
    });
    let text = String::from_utf8(m.render()).expect("utf8");
    let l = "{engine=\"tokenmeter\",model_name=\"m\"}";
    let get = |name: &str| sum(&text, &format!("{name}{l}"));
    let close = |got: f64, want: f64| assert!((got - want).abs() < 1e-9, "{got} != {want}");
    assert_eq!(get("vllm:time_to_first_token_seconds_count"), 1.0);
    close(get("vllm:time_to_first_token_seconds_sum"), 0.1);
    assert_eq!(get("vllm:inter_token_latency_seconds_count"), 2.0);
    close(get("vllm:inter_token_latency_seconds_sum"), 0.05);
    assert_eq!(get("vllm:e2e_request_latency_seconds_count"), 1.0);
    close(get("vllm:e2e_request_latency_seconds_sum"), 0.5);
    // (300 ms - 100 ms) / (5 - 1) tokens.
    close(get("vllm:request_time_per_output_token_seconds_sum"), 0.05);
    close(get("vllm:request_decode_time_seconds_sum"), 0.2);
    assert_eq!(get("vllm:generation_tokens_total"), 5.0);
    assert_eq!(get("vllm:prompt_tokens_total"), 7.0);
    assert_eq!(get("vllm:request_generation_tokens_sum"), 5.0);
    assert_eq!(get("vllm:request_prompt_tokens_sum"), 7.0);
    let success = "vllm:request_success_total{engine=\"tokenmeter\",finished_reason=\"length\",model_name=\"m\"}";
    assert_eq!(sum(&text, success), 1.0);
    // vLLM's own boundaries: the first and last TTFT buckets, the last e2e bucket.
    for line in [
        "vllm:time_to_first_token_seconds_bucket{engine=\"tokenmeter\",model_name=\"m\",le=\"0.001\"} 0",
        "vllm:time_to_first_token_seconds_bucket{engine=\"tokenmeter\",model_name=\"m\",le=\"2560\"} 1",
        "vllm:e2e_request_latency_seconds_bucket{engine=\"tokenmeter\",model_name=\"m\",le=\"7680\"} 1",
        "vllm:inter_token_latency_seconds_bucket{engine=\"tokenmeter\",model_name=\"m\",le=\"0.01\"} 1",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    // tokenmeter's own series are still there.
    assert_eq!(
        sum(&text, "tokenmeter_output_tokens_total{model=\"m\"}"),
        5.0
    );
}

#[test]
fn vllm_generation_tokens_move_per_event_and_settle_at_the_end() {
    let m = vllm_metrics();
    let h = m.model("m".into(), None);
    let total = |m: &Metrics| {
        let text = String::from_utf8(m.render()).expect("utf8");
        sum(
            &text,
            "vllm:generation_tokens_total{engine=\"tokenmeter\",model_name=\"m\"}",
        )
    };
    h.event(1);
    h.event(2);
    // Before the request ends, as vLLM's counter moves at every engine step.
    assert_eq!(total(&m), 3.0);
    // The usage report says 5: the 2 no event showed are added, nothing is counted twice.
    m.record(&Finished {
        streamed_tokens: 3,
        ..finished()
    });
    assert_eq!(total(&m), 5.0);
    // A final count below what streamed takes nothing back.
    h.event(4);
    m.record(&Finished {
        streamed_tokens: 4,
        output_tokens: 2,
        ..finished()
    });
    assert_eq!(total(&m), 9.0);
}

#[test]
fn vllm_series_are_absent_without_compat() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    m.record(&finished());
    let text = String::from_utf8(m.render()).expect("utf8");
    assert!(!text.contains("vllm:"), "{text}");
}

#[test]
fn vllm_in_flight_gauges_follow_the_request_model() {
    let m = vllm_metrics();
    let g = m.in_flight(Some("m"));
    g.add(Phase::Prefill, 1);
    let text = String::from_utf8(m.render()).expect("utf8");
    let l = "{engine=\"tokenmeter\",model_name=\"m\"}";
    assert_eq!(sum(&text, &format!("vllm:num_requests_waiting{l}")), 1.0);
    assert_eq!(
        sum(&text, "tokenmeter_requests_in_flight{phase=\"prefill\"}"),
        1.0
    );
    g.add(Phase::Prefill, -1);
    g.add(Phase::Decode, 1);
    let text = String::from_utf8(m.render()).expect("utf8");
    assert_eq!(sum(&text, &format!("vllm:num_requests_waiting{l}")), 0.0);
    assert_eq!(sum(&text, &format!("vllm:num_requests_running{l}")), 1.0);
    assert_eq!(
        sum(&text, "tokenmeter_requests_in_flight{phase=\"decode\"}"),
        1.0
    );
}

#[test]
fn the_final_count_settles_what_streamed_and_never_takes_back() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    let h = m.model(m.model_label(Some("m")), None);
    for tokens in [1, 1, 3] {
        h.event(tokens);
    }
    let total = |m: &Metrics| {
        let text = String::from_utf8(m.render()).expect("utf8");
        sum(&text, "tokenmeter_output_tokens_total{model=\"m\"}")
    };
    // Counted as they streamed, before the request ends.
    assert_eq!(total(&m), 5.0);
    // Usage says 7: the 2 no event showed are added.
    m.record(&Finished {
        output_tokens: 7,
        streamed_tokens: 5,
        ..finished()
    });
    assert_eq!(total(&m), 7.0);
    // A final count below what streamed takes nothing back.
    h.event(4);
    m.record(&Finished {
        output_tokens: 3,
        streamed_tokens: 4,
        ..finished()
    });
    assert_eq!(total(&m), 11.0);
    let text = String::from_utf8(m.render()).expect("utf8");
    assert_eq!(sum(&text, "tokenmeter_tokens_per_event_count"), 4.0);
    assert_eq!(sum(&text, "tokenmeter_tokens_per_event_sum"), 9.0);
    assert_eq!(
        sum(
            &text,
            "tokenmeter_tokens_per_event_bucket{model=\"m\",le=\"1\"}"
        ),
        2.0
    );
    assert_eq!(
        sum(
            &text,
            "tokenmeter_tokens_per_event_bucket{model=\"m\",le=\"3\"}"
        ),
        3.0
    );
}

#[test]
fn record_observes_stall_first_outputs_reasoning_and_cache() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    m.record(&Finished {
        first_output: [
            Some(Duration::from_millis(100)),
            Some(Duration::from_millis(900)),
            None,
        ],
        reasoning_tokens: Some(40),
        cached_input: CachedInput {
            read: Some(1165),
            write: Some(0),
        },
        ..finished()
    });
    m.record(&Finished {
        max_stall: None,
        ..finished()
    });
    let text = String::from_utf8(m.render()).expect("utf8");
    let close = |l: &str, want: f64| {
        let got = sum(&text, l);
        assert!((got - want).abs() < 1e-9, "{l}: {got} != {want}");
    };
    close(
        "tokenmeter_request_max_stall_seconds_count{model=\"m\"}",
        1.0,
    );
    close(
        "tokenmeter_request_max_stall_seconds_sum{model=\"m\"}",
        0.12,
    );
    let first = "tokenmeter_time_to_first_output_seconds_sum{kind=";
    close(&format!("{first}\"reasoning\",model=\"m\"}}"), 0.1);
    close(&format!("{first}\"content\",model=\"m\"}}"), 0.9 + 0.1);
    close(
        "tokenmeter_time_to_first_output_seconds_count{kind=\"tool_call\"",
        0.0,
    );
    close("tokenmeter_reasoning_tokens_total{model=\"m\"}", 40.0);
    close(
        "tokenmeter_cached_input_tokens_total{kind=\"read\",model=\"m\"}",
        1165.0,
    );
    close(
        "tokenmeter_cached_input_tokens_total{kind=\"write\",model=\"m\"}",
        0.0,
    );
    // A request that reported no reasoning and no cache leaves those counters alone.
    assert_eq!(
        text.matches("tokenmeter_reasoning_tokens_total{").count(),
        1
    );
}

/// The series the per-event families add per model, at most (every prompt band and every
/// kind seen): the figure docs/metrics.md states ("Series per model").
#[test]
fn series_added_per_model_are_counted() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    let h = m.model(m.model_label(Some("m")), None);
    for n in [
        None,
        Some(1),
        Some(300),
        Some(2000),
        Some(5000),
        Some(20000),
        Some(70000),
    ] {
        h.first_token(Duration::from_millis(100), n);
    }
    h.event(1);
    m.record(&Finished {
        first_output: [Some(Duration::from_millis(1)); 3],
        reasoning_tokens: Some(1),
        cached_input: CachedInput {
            read: Some(1),
            write: Some(1),
        },
        ..finished()
    });
    let text = String::from_utf8(m.render()).expect("utf8");
    let series = |family: &str| {
        text.lines()
            .filter(|l| l.starts_with(family) && l.contains("model=\"m\""))
            .count()
    };
    let buckets = |b: &[f64]| b.len() + 3; // each boundary, +Inf, _sum, _count
    let d = Buckets::default();
    assert_eq!(
        series("tokenmeter_time_to_first_token_seconds"),
        7 * buckets(&d.ttft)
    );
    assert_eq!(
        series("tokenmeter_time_to_first_output_seconds"),
        3 * buckets(&d.ttft)
    );
    assert_eq!(series("tokenmeter_tokens_per_event"), buckets(&d.per_event));
    assert_eq!(
        series("tokenmeter_request_max_stall_seconds"),
        buckets(&d.stall)
    );
    assert_eq!(series("tokenmeter_reasoning_tokens_total"), 1);
    assert_eq!(series("tokenmeter_cached_input_tokens_total"), 2);
    // TTFT had one band's worth before the `prompt` label: 150 more; the new families 108.
    assert_eq!(6 * buckets(&d.ttft), 150);
    assert_eq!(
        3 * buckets(&d.ttft) + buckets(&d.per_event) + buckets(&d.stall) + 3,
        108
    );
}

#[test]
fn slo_results_count_once_and_goodput_only_for_met() {
    let cfg = MetricsConfig {
        gpus: 4.0,
        gpu_source: gpus::Source::NvidiaVisibleDevices,
        gpu_hour_cost: Some(2.5),
        ..MetricsConfig::default()
    };
    let m = Metrics::new(&cfg).expect("metrics");
    let slo = |verdict, band| {
        Some(SloResult {
            class: Arc::from("interactive"),
            verdict,
            band,
        })
    };
    m.record(&Finished {
        slo: slo(Verdict::Met, "2-4"),
        ..finished()
    });
    m.record(&Finished {
        slo: slo(Verdict::TpsMissed, "2-4"),
        ..finished()
    });
    m.record(&Finished {
        slo: slo(Verdict::Met, "9-16"),
        output_tokens: 11,
        ..finished()
    });
    // Met, but no parser read it: counted, with no goodput tokens.
    m.record(&Finished {
        slo: slo(Verdict::Met, "1"),
        api: Api::Unknown,
        ..finished()
    });
    m.record(&finished());
    let text = String::from_utf8(m.render()).expect("utf8");
    let slo_line = |band: &str, result: &str| {
        format!("tokenmeter_slo_requests_total{{class=\"interactive\",concurrency=\"{band}\",model=\"m\",result=\"{result}\"}}")
    };
    assert_eq!(sum(&text, &slo_line("2-4", "met")), 1.0, "{text}");
    assert_eq!(sum(&text, &slo_line("2-4", "tps_missed")), 1.0);
    assert_eq!(sum(&text, &slo_line("9-16", "met")), 1.0);
    assert_eq!(sum(&text, &slo_line("1", "met")), 1.0);
    assert_eq!(sum(&text, "tokenmeter_slo_requests_total"), 4.0);
    assert_eq!(
        sum(
            &text,
            "tokenmeter_goodput_output_tokens_total{class=\"interactive\",model=\"m\"}"
        ),
        16.0
    );
    assert_eq!(
        sum(&text, "tokenmeter_gpus{source=\"nvidia_visible_devices\"}"),
        4.0
    );
    assert_eq!(sum(&text, "tokenmeter_gpu_hour_cost"), 2.5);
}

#[test]
fn no_gpu_hour_cost_no_series() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    let text = String::from_utf8(m.render()).expect("utf8");
    assert!(!text.contains("tokenmeter_gpu_hour_cost"), "{text}");
}

/// The families that carry `tenant` when it is on (docs/tenants.md); every other family
/// never does.
const TENANTED: [&str; 9] = [
    "tokenmeter_requests_total",
    "tokenmeter_output_tokens_total",
    "tokenmeter_input_tokens_total",
    "tokenmeter_reasoning_tokens_total",
    "tokenmeter_cached_input_tokens_total",
    "tokenmeter_slo_requests_total",
    "tokenmeter_goodput_output_tokens_total",
    "tokenmeter_time_to_first_token_seconds",
    "tokenmeter_request_tokens_per_second",
];

/// One request of tenant `tenant` through the live handles and `record`, every family fed.
fn record_tenant_request(m: &Metrics, tenant: Option<&str>) {
    let tenant: Option<Arc<str>> = tenant.map(Arc::from);
    let h = m.model(m.model_label(Some("m")), tenant.as_ref());
    h.first_token(Duration::from_millis(100), Some(7));
    h.event(2);
    h.inter_token(Duration::from_millis(20), 3);
    h.event(3);
    m.record(&Finished {
        tenant,
        streamed_tokens: 5,
        reasoning_tokens: Some(2),
        cached_input: CachedInput {
            read: Some(3),
            write: None,
        },
        slo: Some(SloResult {
            class: Arc::from("interactive"),
            verdict: Verdict::Met,
            band: "2-4",
        }),
        ..finished()
    });
}

#[test]
fn the_tenant_label_is_on_exactly_the_documented_families() {
    let m = Metrics::new(&MetricsConfig {
        tenant: true,
        ..MetricsConfig::default()
    })
    .expect("metrics");
    record_tenant_request(&m, Some("team-a"));
    record_tenant_request(&m, None);
    let text = String::from_utf8(m.render()).expect("utf8");
    let scrape = Scrape::parse(&text);
    let family = |name: &str| {
        TENANTED
            .iter()
            .find(|f| name == **f || name.strip_prefix(**f).is_some_and(|s| s.starts_with('_')))
            .copied()
    };
    let mut carried = std::collections::BTreeSet::new();
    for s in scrape.samples() {
        match family(&s.name) {
            Some(f) => {
                let t = s.label("tenant");
                assert!(matches!(t, Some("team-a" | "none")), "{s:?}");
                carried.insert(f);
            }
            None => assert_eq!(s.label("tenant"), None, "{s:?}"),
        }
    }
    assert_eq!(carried.len(), TENANTED.len(), "{carried:?}\n{text}");
    // Exact values, per tenant: the live output counter and the final settlement agree.
    for t in ["team-a", "none"] {
        let l = [("tenant", t)];
        assert_eq!(scrape.sum("tokenmeter_requests_total", &l), 1.0, "{t}");
        assert_eq!(scrape.sum("tokenmeter_output_tokens_total", &l), 5.0);
        assert_eq!(scrape.sum("tokenmeter_input_tokens_total", &l), 7.0);
        assert_eq!(scrape.sum("tokenmeter_reasoning_tokens_total", &l), 2.0);
        assert_eq!(scrape.sum("tokenmeter_cached_input_tokens_total", &l), 3.0);
        assert_eq!(
            scrape.sum("tokenmeter_goodput_output_tokens_total", &l),
            5.0
        );
        assert_eq!(scrape.sum("tokenmeter_slo_requests_total", &l), 1.0);
        let ttft = scrape.sum("tokenmeter_time_to_first_token_seconds_count", &l);
        assert_eq!(ttft, 1.0);
        let tps = scrape.sum("tokenmeter_request_tokens_per_second_count", &l);
        assert_eq!(tps, 1.0);
    }
}

#[test]
fn without_tenants_no_series_has_the_label() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    // A tenant handed to metrics that have no label is ignored, never a panic.
    record_tenant_request(&m, Some("team-a"));
    let text = String::from_utf8(m.render()).expect("utf8");
    assert!(!text.contains("tenant"), "{text}");
    assert_eq!(
        Scrape::parse(&text).sum("tokenmeter_requests_total", &[]),
        1.0
    );
}

#[test]
fn coarse_buckets_are_a_subset_that_keeps_the_rules_edges() {
    let (d, c) = (Buckets::default(), Buckets::coarse());
    let mut kept = 0;
    let mut all = 0;
    for ((name, fine), (_, coarse)) in d.sets().into_iter().zip(c.sets()) {
        assert!(coarse.windows(2).all(|w| w[0] < w[1]), "{name}: {coarse:?}");
        for b in coarse {
            assert!(fine.contains(b), "{name}: {b} is not a default boundary");
        }
        // Each histogram keeps at most about half its series (boundaries + 3).
        assert!(2 * (coarse.len() + 3) <= fine.len() + 3 + 6, "{name}");
        kept += coarse.len() + 3;
        all += fine.len() + 3;
    }
    assert_eq!((kept, all), (82, 147));
    // The TTFT SLO rules read le="2.5"; the default interactive class is 1 s and 20 tokens/s;
    // the speed-floor alert is 10 tokens/s.
    for edge in [1.0, 2.5] {
        assert!(c.ttft.contains(&edge), "ttft {edge}");
    }
    for edge in [10.0, 20.0] {
        assert!(c.tps.contains(&edge), "tps {edge}");
    }
}

#[test]
fn coarse_buckets_thin_the_per_request_speed_histogram_in_every_band() {
    let m = Metrics::new(&MetricsConfig {
        buckets: Buckets::coarse(),
        ..MetricsConfig::default()
    })
    .expect("metrics");
    for mean in [1.0, 3.0, 6.0, 12.0, 24.0, 48.0, 96.0, 192.0, 320.0] {
        m.record(&Finished {
            mean_in_flight: Some(mean),
            ..finished()
        });
    }
    let text = String::from_utf8(m.render()).expect("utf8");
    let series = text
        .lines()
        .filter(|l| l.starts_with("tokenmeter_request_tokens_per_second"))
        .count();
    // 10 boundaries + 3, in 9 bands: 117 series instead of 216.
    assert_eq!(series, 9 * 13, "{text}");
    // The default test record decodes at 20 tokens/s: above 10, at most 30.
    let band = |le: &str| {
        sum(
            &text,
            &format!(
                "tokenmeter_request_tokens_per_second_bucket{{concurrency=\"2-4\",le=\"{le}\",model=\"m\"}}"
            ),
        )
    };
    assert_eq!((band("10"), band("30")), (0.0, 1.0));
}

/// The golden exposition: every family a tokenmeter can export, with its type, label names and
/// help, in `tests/golden/exposition.txt`. A family added, renamed, retyped, relabelled or
/// re-described shows as a diff of that file, reviewed with the change; rewrite it with
/// `TOKENMETER_BLESS=1 cargo test -p tokenmeter --lib golden_exposition`.
const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/exposition.txt");

/// Metrics with every optional part on (both other schemes, tenants, a GPU-hour cost, the
/// logs, the span exporter, the engine's view and the capacity model), and one request
/// recorded.
fn every_family() -> Metrics {
    let m = Metrics::new(&MetricsConfig {
        compat: Compat {
            vllm: true,
            otel: true,
        },
        gpu_hour_cost: Some(2.5),
        tenant: true,
        ..MetricsConfig::default()
    })
    .expect("metrics");
    m.request_log_dropped().expect("request log");
    m.workload_log_counters().expect("workload log");
    m.trace_spans_dropped().expect("spans");
    m.export_engine_view(Arc::new(Observed::default()))
        .expect("engine view");
    let classes = crate::slo::Classes::default()
        .iter()
        .map(|(name, t)| crate::capacity::ClassTargets::floor(name, t.objective))
        .collect();
    let capacity = Capacity::new(
        crate::capacity::Inputs {
            classes,
            ..crate::capacity::Inputs::default()
        },
        Instant::now(),
    );
    m.export_capacity(Arc::new(capacity)).expect("capacity");
    record_tenant_request(&m, Some("team-a"));
    m
}

/// The golden file's text for `catalog`: a header, then per family a line `name type
/// {labels}` and its help, indented.
fn golden_text(catalog: &[(MetricFamily, Vec<String>)]) -> String {
    let mut out = String::from(
        "# Every metric family tokenmeter can export (all optional parts on), with its type,\n\
         # label names and help. Checked by crates/tokenmeter/src/metrics/tests.rs; rewrite with\n\
         # TOKENMETER_BLESS=1 cargo test -p tokenmeter --lib golden_exposition\n",
    );
    for (f, labels) in catalog {
        out.push_str(&format!(
            "{} {} {{{}}}\n    {}\n",
            f.name(),
            type_name(f),
            labels.join(","),
            f.help()
        ));
    }
    out
}

/// The type as the text exposition's `# TYPE` line writes it.
fn type_name(f: &MetricFamily) -> &'static str {
    use prometheus::proto::MetricType;
    match f.get_field_type() {
        MetricType::COUNTER => "counter",
        MetricType::GAUGE => "gauge",
        MetricType::HISTOGRAM => "histogram",
        MetricType::SUMMARY => "summary",
        MetricType::UNTYPED => "untyped",
    }
}

#[test]
fn golden_exposition() {
    let m = every_family();
    let catalog = m.registry.catalog();
    let text = golden_text(&catalog);
    if std::env::var_os("TOKENMETER_BLESS").is_some() {
        std::fs::write(GOLDEN, &text).expect("write the golden file");
    }
    let golden = std::fs::read_to_string(GOLDEN).unwrap_or_default();
    if golden != text {
        let diff: Vec<String> = diff_lines(&golden, &text);
        panic!(
            "the families differ from {GOLDEN} (- golden, + now); if the change is meant, rewrite \
             it with TOKENMETER_BLESS=1 cargo test -p tokenmeter --lib golden_exposition\n{}",
            diff.join("\n")
        );
    }
    // What a scrape shows agrees with the catalog: each family it exposes is one registered,
    // with the same type and help.
    let exposition = String::from_utf8(m.render()).expect("utf8");
    let registered: std::collections::BTreeMap<&str, String> = catalog
        .iter()
        .map(|(f, _)| (f.name(), format!("{} {}", type_name(f), f.help())))
        .collect();
    for f in m.gather() {
        assert_eq!(
            registered.get(f.name()),
            Some(&format!("{} {}", type_name(&f), f.help())),
            "{} as exposed",
            f.name()
        );
        let typed = format!("# TYPE {} {}\n", f.name(), type_name(&f));
        assert!(exposition.contains(&typed), "no {typed} in\n{exposition}");
    }
}

/// The lines only in `a` (`-`) and only in `b` (`+`), in order: enough to read a change of a
/// few families.
fn diff_lines(a: &str, b: &str) -> Vec<String> {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let gone = la
        .iter()
        .filter(|l| !lb.contains(l))
        .map(|l| format!("- {l}"));
    let new = lb
        .iter()
        .filter(|l| !la.contains(l))
        .map(|l| format!("+ {l}"));
    gone.chain(new).collect()
}
