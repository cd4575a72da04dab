use std::time::Duration;

use super::*;
use crate::exposition::Scrape;

#[test]
fn bands_match_the_documented_edges() {
    let cases = [
        (1.0, "1"),
        (1.4, "1"),
        (2.0, "2-4"),
        (4.0, "2-4"),
        (5.0, "5-8"),
        (8.0, "5-8"),
        (16.0, "9-16"),
        (17.0, "17-32"),
        (64.0, "33-64"),
        (128.0, "65-128"),
        (256.0, "129-256"),
        (257.0, "257+"),
        (5000.0, "257+"),
    ];
    for (x, band) in cases {
        assert_eq!(concurrency_band(x), band, "{x}");
    }
}

#[test]
fn model_labels_are_bounded_and_sanitised() {
    let m = ModelLabels::new(2);
    assert_eq!(m.label(Some("a")), "a");
    assert_eq!(m.label(Some("b\n")), "b");
    assert_eq!(m.label(Some("c")), "other");
    assert_eq!(m.label(Some("a")), "a");
    assert_eq!(m.label(None), "unknown");
    assert_eq!(m.label(Some(" ")), "unknown");
    let long = "x".repeat(1000);
    let m = ModelLabels::new(5);
    assert_eq!(m.label(Some(&long)).len(), MAX_MODEL_LABEL_LEN);
}

fn finished() -> Finished {
    Finished {
        model: "m".into(),
        code: 200,
        outcome: Outcome::Complete,
        api: Api::OpenAi,
        duration: Duration::from_millis(500),
        first_byte: Some(Duration::from_millis(50)),
        first_token: Some(Duration::from_millis(100)),
        last_token: Some(Duration::from_millis(300)),
        output_tokens: 5,
        token_source: TokenSource::Counted,
        input_tokens: Some(7),
        mean_in_flight: Some(3.0),
        parse_errors: ParseErrors::default(),
        slo: None,
    }
}

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
    assert_eq!(m.request_totals(), (1, 0));
}

#[test]
fn model_handles_observe_ttft_and_spread_itl_over_tokens() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    let h = m.model(m.model_label(Some("m")));
    assert_eq!(h.label(), "m");
    h.first_token(Duration::from_millis(250));
    h.inter_token(Duration::from_millis(30), 3);
    let text = String::from_utf8(m.render()).expect("utf8");
    assert_eq!(
        sum(
            &text,
            "tokenmeter_time_to_first_token_seconds_count{model=\"m\"}"
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
