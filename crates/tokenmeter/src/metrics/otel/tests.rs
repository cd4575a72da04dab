use super::*;
use crate::exposition::Scrape;
use crate::metrics::{Compat, Metrics, MetricsConfig};
use crate::protocol::operation::{Operation, Route};
use crate::protocol::TokenSource;
use crate::record::Finished;

/// One family the conventions define, as the OTel Prometheus exporter writes it.
struct Expected {
    /// The OTel instrument name and its UCUM unit (v1.41.0 `model/gen-ai/metrics.yaml`).
    otel: &'static str,
    unit: &'static str,
    /// The Prometheus family name, written out by hand.
    prometheus: &'static str,
    /// Every label but `le` and the scope's (`gen_ai.*` attributes with `.` as `_`).
    labels: &'static [&'static str],
    /// The conventions' ExplicitBucketBoundaries (v1.41.0 `docs/gen-ai/gen-ai-metrics.md`).
    buckets: &'static [f64],
}

const COMMON: [&str; 4] = [
    "gen_ai_operation_name",
    "gen_ai_provider_name",
    "gen_ai_request_model",
    "gen_ai_response_model",
];

const TABLE: [Expected; 4] = [
    Expected {
        otel: "gen_ai.server.time_to_first_token",
        unit: "s",
        prometheus: "gen_ai_server_time_to_first_token_seconds",
        labels: &COMMON,
        buckets: &[
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0,
        ],
    },
    Expected {
        otel: "gen_ai.server.time_per_output_token",
        unit: "s",
        prometheus: "gen_ai_server_time_per_output_token_seconds",
        labels: &COMMON,
        buckets: &[
            0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
        ],
    },
    Expected {
        otel: "gen_ai.server.request.duration",
        unit: "s",
        prometheus: "gen_ai_server_request_duration_seconds",
        labels: &[
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
            "gen_ai_response_model",
            "error_type",
        ],
        buckets: &[
            0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
        ],
    },
    Expected {
        otel: "gen_ai.client.token.usage",
        unit: "{token}",
        prometheus: "gen_ai_client_token_usage",
        labels: &[
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
            "gen_ai_response_model",
            "gen_ai_token_type",
        ],
        buckets: &[
            1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
            4194304.0, 16777216.0, 67108864.0,
        ],
    },
];

/// The specification's rule for a histogram's name ("OTLP Metric points to Prometheus"):
/// discouraged characters become `_`, bracketed unit annotations are dropped, a known UCUM unit
/// becomes its word as a suffix; no `_total` (histograms are no monotonic sums).
fn translate(name: &str, unit: &str) -> String {
    let base: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let unit = if unit.starts_with('{') { "" } else { unit };
    match unit {
        "" => base,
        "s" => format!("{base}_seconds"),
        other => panic!("no word for unit {other:?} in this table"),
    }
}

fn otel_metrics(max_models: usize) -> Metrics {
    let cfg = MetricsConfig {
        compat: Compat {
            otel: true,
            ..Compat::default()
        },
        max_models,
        ..MetricsConfig::default()
    };
    Metrics::new(&cfg).expect("metrics")
}

/// The metrics tests' record, with a response model of its own and its tokens counted by usage.
fn finished() -> Finished {
    Finished {
        model: "resp".into(),
        token_source: TokenSource::Usage,
        streamed_tokens: 5,
        ..crate::record::tests::finished()
    }
}

fn render(m: &Metrics) -> String {
    String::from_utf8(m.render()).expect("utf8")
}

#[test]
fn names_units_labels_and_buckets_follow_the_table() {
    let m = otel_metrics(32);
    m.record(&finished());
    let text = render(&m);
    let scrape = Scrape::parse(&text);
    for e in &TABLE {
        assert_eq!(translate(e.otel, e.unit), e.prometheus, "{}", e.otel);
        assert!(
            text.contains(&format!("# TYPE {} histogram\n", e.prometheus)),
            "{} is no histogram in\n{text}",
            e.prometheus
        );
        let bucket = format!("{}_bucket", e.prometheus);
        let series: Vec<_> = scrape
            .samples()
            .iter()
            .filter(|s| s.name == bucket)
            .collect();
        assert!(!series.is_empty(), "no {bucket} in\n{text}");
        for s in &series {
            let mut names: Vec<&str> = s
                .labels
                .iter()
                .map(|(k, _)| k.as_str())
                .filter(|k| *k != "le" && !k.starts_with("otel_scope_"))
                .collect();
            names.sort_unstable();
            let mut want = e.labels.to_vec();
            want.sort_unstable();
            assert_eq!(names, want, "{bucket}");
            assert_eq!(s.label("otel_scope_name"), Some("tokenmeter"));
            assert_eq!(s.label("otel_scope_schema_url"), Some(SCHEMA_URL));
            assert_eq!(
                s.label("otel_scope_version"),
                Some(env!("CARGO_PKG_VERSION"))
            );
        }
        let one = series[0];
        let labels: Vec<(&str, &str)> = one
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let les: Vec<f64> = scrape
            .buckets(e.prometheus, &labels)
            .into_iter()
            .map(|(le, _)| le)
            .collect();
        let mut want = e.buckets.to_vec();
        want.push(f64::INFINITY);
        assert_eq!(les, want, "{bucket}");
        for suffix in ["_sum", "_count"] {
            assert!(text.contains(&format!("{}{suffix}{{", e.prometheus)));
        }
    }
    // Exactly these four families, and no counter among them.
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE gen_ai_"))
        .collect();
    assert_eq!(families.len(), TABLE.len(), "{families:?}");
    assert!(!text.contains("gen_ai_client_token_usage_total"));
}

#[test]
fn a_successful_request_is_observed_with_its_attributes() {
    let m = otel_metrics(32);
    m.record(&finished());
    let s = Scrape::parse(&render(&m));
    let l = [
        ("gen_ai_operation_name", "chat"),
        ("gen_ai_provider_name", "openai"),
        ("gen_ai_request_model", "req"),
        ("gen_ai_response_model", "resp"),
    ];
    let close = |got: f64, want: f64| assert!((got - want).abs() < 1e-9, "{got} != {want}");
    close(
        s.sum("gen_ai_server_time_to_first_token_seconds_sum", &l),
        0.1,
    );
    assert_eq!(
        s.sum("gen_ai_server_time_to_first_token_seconds_count", &l),
        1.0
    );
    // (300 ms - 100 ms) / (5 - 1).
    close(
        s.sum("gen_ai_server_time_per_output_token_seconds_sum", &l),
        0.05,
    );
    let ok = [&l[..], &[("error_type", "")]].concat();
    close(
        s.sum("gen_ai_server_request_duration_seconds_sum", &ok),
        0.5,
    );
    let usage = |kind| {
        let l = [&l[..], &[("gen_ai_token_type", kind)]].concat();
        (
            s.sum("gen_ai_client_token_usage_sum", &l),
            s.sum("gen_ai_client_token_usage_count", &l),
        )
    };
    assert_eq!(usage("input"), (7.0, 1.0));
    assert_eq!(usage("output"), (5.0, 1.0));
}

#[test]
fn a_failed_request_has_an_error_type_and_no_ttft_or_tpot() {
    let m = otel_metrics(32);
    let cases = [
        (Outcome::Complete, 429, "429"),
        (Outcome::Complete, 500, "500"),
        (Outcome::UpstreamError, 200, "upstream_error"),
        (Outcome::Timeout, 200, "timeout"),
        (Outcome::ClientDisconnect, 200, "client_disconnect"),
    ];
    for (outcome, code, _) in cases {
        m.record(&Finished {
            outcome,
            code,
            ..finished()
        });
    }
    let s = Scrape::parse(&render(&m));
    for (_, _, error) in cases {
        assert_eq!(
            s.sum(
                "gen_ai_server_request_duration_seconds_count",
                &[("error_type", error)]
            ),
            1.0,
            "{error}"
        );
    }
    assert_eq!(
        s.sum("gen_ai_server_time_to_first_token_seconds_count", &[]),
        0.0
    );
    assert_eq!(
        s.sum("gen_ai_server_time_per_output_token_seconds_count", &[]),
        0.0
    );
    // Their tokens were still used.
    assert_eq!(
        s.sum(
            "gen_ai_client_token_usage_sum",
            &[("gen_ai_token_type", "output")]
        ),
        25.0
    );
}

#[test]
fn a_request_that_failed_before_its_response_is_named_by_its_path() {
    let m = otel_metrics(32);
    m.record(&Finished {
        api: Api::Unknown,
        code: 502,
        outcome: Outcome::UpstreamError,
        first_byte: None,
        first_token: None,
        last_token: None,
        output_tokens: 0,
        input_tokens: None,
        model: "req".into(),
        model_from_response: false,
        route: Route {
            operation: Operation::of_path("/v1/messages"),
            api: Some(Api::Anthropic),
        },
        ..finished()
    });
    let s = Scrape::parse(&render(&m));
    let l = [
        ("gen_ai_operation_name", "chat"),
        ("gen_ai_provider_name", "anthropic"),
        ("gen_ai_request_model", "req"),
        ("gen_ai_response_model", ""),
        ("error_type", "upstream_error"),
    ];
    assert_eq!(
        s.sum("gen_ai_server_request_duration_seconds_count", &l),
        1.0
    );
    // No parser read a body: no token usage to report.
    assert!(!s.contains("gen_ai_client_token_usage_count"));
}

#[test]
fn what_is_no_genai_operation_is_not_recorded() {
    let m = otel_metrics(32);
    m.record(&Finished {
        api: Api::Unknown,
        route: Route {
            operation: Operation::of_path("/v1/models"),
            api: None,
        },
        ..finished()
    });
    let text = render(&m);
    assert!(!text.contains("gen_ai_server_request_duration_seconds_count"));
}

#[test]
fn models_are_bounded_by_max_models_and_empty_when_not_known() {
    let m = otel_metrics(2);
    for i in 0..10 {
        m.record(&Finished {
            model: m.model_label(Some(&format!("resp-{i}"))),
            request_model: Some(format!("req-{i}")),
            ..finished()
        });
    }
    m.record(&Finished {
        request_model: None,
        model_from_response: false,
        ..finished()
    });
    let s = Scrape::parse(&render(&m));
    let values = |label: &str| {
        let mut v: Vec<String> = s
            .select("gen_ai_server_request_duration_seconds_count", &[])
            .filter_map(|x| x.label(label).map(str::to_string))
            .collect();
        v.sort();
        v.dedup();
        v
    };
    // One --max-models budget for every model label: resp-0 and req-0 take the two places,
    // everything after them is `other`.
    assert_eq!(values("gen_ai_response_model"), ["", "other", "resp-0"]);
    assert_eq!(values("gen_ai_request_model"), ["", "other", "req-0"]);
}

#[test]
fn operations_follow_the_route_then_the_format() {
    let cases = [
        ("/v1/chat/completions", Some(Operation::Chat)),
        ("/chat/completions/", Some(Operation::Chat)),
        ("/v1/completions", Some(Operation::TextCompletion)),
        ("/v1/embeddings", Some(Operation::Embeddings)),
        ("/v1/responses", Some(Operation::Chat)),
        ("/v1/messages", Some(Operation::Chat)),
        ("/api/chat", Some(Operation::Chat)),
        ("/api/generate", Some(Operation::TextCompletion)),
        ("/api/embed", Some(Operation::Embeddings)),
        ("/generate_stream", Some(Operation::TextCompletion)),
        ("/generate", Some(Operation::TextCompletion)),
        ("/completion", Some(Operation::TextCompletion)),
        (
            "/v2/models/m/generate_stream",
            Some(Operation::TextCompletion),
        ),
        ("/v2/chat", Some(Operation::Chat)),
        ("/v2/embed", Some(Operation::Embeddings)),
        (
            "/ml/v1/text/generation_stream",
            Some(Operation::TextCompletion),
        ),
        ("/ml/v1/text/chat_stream", Some(Operation::Chat)),
        (
            "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
            Some(Operation::GenerateContent),
        ),
        ("/v1beta/models/e:embedContent", Some(Operation::Embeddings)),
        ("/v1/models", None),
        ("/health", None),
        ("/", None),
    ];
    for (path, want) in cases {
        assert_eq!(Operation::of_path(path), want, "{path}");
    }
    assert_eq!(Operation::of_api(Api::Unknown), None);
    assert_eq!(
        Operation::of_api(Api::Gemini),
        Some(Operation::GenerateContent)
    );
    assert_eq!(Operation::of_api(Api::Tgi), Some(Operation::TextCompletion));
}

#[test]
fn providers_are_well_known_values_where_one_applies_and_bounded() {
    let mut seen = std::collections::HashSet::new();
    for api in Api::KNOWN.into_iter().chain([Api::Unknown]) {
        let p = provider(api);
        assert!(
            p.chars()
                .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_'),
            "{p}"
        );
        seen.insert(p);
    }
    assert_eq!(provider(Api::OpenAi), "openai");
    assert_eq!(provider(Api::Responses), "openai");
    assert_eq!(provider(Api::Anthropic), "anthropic");
    assert_eq!(provider(Api::Gemini), "gcp.gen_ai");
    assert_eq!(provider(Api::Watsonx), "ibm.watsonx.ai");
    assert_eq!(provider(Api::Cohere), "cohere");
    assert_eq!(provider(Api::Ollama), "ollama");
    assert!(seen.len() <= Api::KNOWN.len() + 1);
}

#[test]
fn otel_series_are_absent_without_the_flag() {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    m.record(&finished());
    let text = render(&m);
    assert!(!text.contains("gen_ai_"), "{text}");
    assert!(!text.contains("otel_scope"), "{text}");
}
