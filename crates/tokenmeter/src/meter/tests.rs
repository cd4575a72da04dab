use std::time::Duration;

use super::*;
use crate::exposition::Scrape;
use crate::metrics::{Metrics, MetricsConfig};

fn recorder() -> Arc<Recorder> {
    let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
    Arc::new(Recorder::new(Arc::new(m), Default::default()))
}

/// The sum of the series `selector` picks in the recorder's exposition.
fn sample(rec: &Recorder, selector: &str) -> f64 {
    let text = String::from_utf8(rec.metrics.render()).expect("utf-8");
    Scrape::parse(&text).sum_of(selector)
}

const CHUNK: &str = "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n";

#[test]
fn tokens_ttft_and_itl_follow_the_event_times() {
    let rec = recorder();
    let mut meter = rec.start(RequestInfo::default());
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
    let t0 = meter.sending().expect("unfinished").clock.start;
    // Three events, the middle one split across two frames.
    let (a, b) = CHUNK.split_at(20);
    meter.on_data(CHUNK.as_bytes(), t0 + Duration::from_millis(100));
    meter.on_data(a.as_bytes(), t0 + Duration::from_millis(110));
    meter.on_data(b.as_bytes(), t0 + Duration::from_millis(120));
    meter.on_data(CHUNK.as_bytes(), t0 + Duration::from_millis(140));
    assert_eq!(
        sample(&rec, "tokenmeter_requests_in_flight{phase=\"decode\"}"),
        1.0
    );
    meter.finish(Outcome::Complete);
    let ttft = sample(&rec, "tokenmeter_time_to_first_token_seconds_sum");
    assert!((ttft - 0.1).abs() < 1e-9, "{ttft}");
    let itl = sample(&rec, "tokenmeter_inter_token_latency_seconds_sum");
    assert!((itl - 0.04).abs() < 1e-9, "{itl}");
    assert_eq!(sample(&rec, "tokenmeter_output_tokens_total"), 3.0);
    // (3 - 1) tokens over 40 ms of decode.
    let tps = sample(&rec, "tokenmeter_request_tokens_per_second_sum");
    assert!((tps - 50.0).abs() < 1e-6, "{tps}");
    assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
}

// Regression: behind a real vLLM, GuideLLM closed 3 of 99 completed streams right after
// `data: [DONE]`, before the chunked terminator, and they were counted as client_disconnect.
#[test]
fn a_client_that_leaves_after_done_got_a_complete_response() {
    let rec = recorder();
    let mut meter = rec.start(RequestInfo::default());
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
    meter.on_data(CHUNK.as_bytes(), Instant::now());
    meter.on_data(b"data: [DONE]\n\n", Instant::now());
    drop(meter);
    let complete =
        "tokenmeter_requests_total{api=\"openai\",code=\"200\",model=\"m\",outcome=\"complete\"}";
    assert_eq!(sample(&rec, complete), 1.0);
    assert_eq!(sample(&rec, "tokenmeter_output_tokens_total"), 1.0);

    // Before the end marker, leaving is still a disconnect.
    let mut meter = rec.start(RequestInfo::default());
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
    meter.on_data(CHUNK.as_bytes(), Instant::now());
    drop(meter);
    let cut = "tokenmeter_requests_total{api=\"openai\",code=\"200\",model=\"m\",outcome=\"client_disconnect\"}";
    assert_eq!(sample(&rec, cut), 1.0);
    assert_eq!(sample(&rec, complete), 1.0);
}

// Regression: behind a real vLLM at concurrency 16, GuideLLM sent its next request as soon as
// it read `[DONE]`, before the old body's last chunk reached us, and the gauge showed 17.
#[test]
fn a_request_leaves_the_in_flight_gauges_at_its_end_marker() {
    let rec = recorder();
    let mut meter = rec.start(RequestInfo::default());
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
    meter.on_data(CHUNK.as_bytes(), Instant::now());
    assert_eq!(rec.concurrency.current(), 1);
    meter.on_data(b"data: [DONE]\n\n", Instant::now());
    assert_eq!(rec.concurrency.current(), 0);
    assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
    // Finishing later must not leave a second time.
    meter.finish(Outcome::Complete);
    assert_eq!(rec.concurrency.current(), 0);
    assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
    let other = rec.start(RequestInfo::default());
    assert_eq!(rec.concurrency.current(), 1);
    assert_eq!(
        sample(&rec, "tokenmeter_requests_in_flight{phase=\"prefill\"}"),
        1.0
    );
    drop(other);
    assert_eq!(rec.concurrency.current(), 0);

    // A broken upstream sends a token after its end marker: the gauges stay balanced.
    let mut meter = rec.start(RequestInfo::default());
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
    let role = "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    meter.on_data(role.as_bytes(), Instant::now());
    meter.on_data(b"data: [DONE]\n\n", Instant::now());
    assert_eq!(rec.concurrency.current(), 0);
    let by_phase = |rec: &Recorder| {
        ["prefill", "decode"].map(|p| {
            sample(
                rec,
                &format!("tokenmeter_requests_in_flight{{phase=\"{p}\"}}"),
            )
        })
    };
    meter.on_data(CHUNK.as_bytes(), Instant::now());
    assert_eq!(by_phase(&rec), [0.0, 0.0]);
    drop(meter);
    assert_eq!(by_phase(&rec), [0.0, 0.0]);
    assert_eq!(rec.concurrency.current(), 0);
}

#[test]
fn times_run_from_the_requests_arrival() {
    let rec = recorder();
    let arrived = Instant::now();
    let mut meter = rec.start_at(RequestInfo::default(), arrived);
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
    meter.on_data(CHUNK.as_bytes(), arrived + Duration::from_millis(250));
    meter.finish(Outcome::Complete);
    let ttft = sample(&rec, "tokenmeter_time_to_first_token_seconds_sum");
    assert!((ttft - 0.25).abs() < 1e-9, "{ttft}");
}

#[test]
fn a_stream_cut_mid_line_is_a_disconnect_not_malformed_input() {
    let rec = recorder();
    let mut meter = rec.start(RequestInfo::default());
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
    let now = Instant::now();
    meter.on_data(CHUNK.as_bytes(), now);
    meter.on_data(&CHUNK.as_bytes()[..30], now);
    drop(meter);
    assert_eq!(
        sample(&rec, "tokenmeter_requests_total{api=\"openai\",code=\"200\",model=\"m\",outcome=\"client_disconnect\"}"),
        1.0
    );
    assert_eq!(
        sample(
            &rec,
            "tokenmeter_parse_errors_total{reason=\"invalid_json\"}"
        ),
        0.0
    );
    assert_eq!(sample(&rec, "tokenmeter_output_tokens_total"), 1.0);
    assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
}

#[test]
fn usage_wins_over_counted_events_and_feeds_the_rate() {
    let rec = recorder();
    let mut meter = rec.start(RequestInfo {
        model: Some("asked".into()),
        ..RequestInfo::default()
    });
    meter.on_response(200, "/v1/completions", "text/event-stream", false);
    let now = Instant::now();
    meter.on_data(b"data: {\"choices\":[{\"text\":\"ab\"}]}\n\n", now);
    meter.on_data(
        b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n",
        now,
    );
    meter.finish(Outcome::Complete);
    assert_eq!(
        sample(&rec, "tokenmeter_output_tokens_total{model=\"asked\"}"),
        7.0
    );
    assert_eq!(
        sample(
            &rec,
            "tokenmeter_token_count_source_total{source=\"usage\"}"
        ),
        1.0
    );
    // All 7 tokens reach the windowed rate, not just the one event.
    assert!((rec.metrics.output_rate(Instant::now()) - 0.7).abs() < 1e-9);
}

// The proxy's own 400s (an unreadable body, an invalid URI) are metered like every request.
#[test]
fn a_request_the_proxy_rejects_is_recorded_once_as_bad_request() {
    let rec = recorder();
    let mut meter = rec.start(RequestInfo {
        model: Some("asked".into()),
        ..RequestInfo::default()
    });
    assert_eq!(rec.concurrency.current(), 1);
    meter.set_status(400);
    meter.finish(Outcome::BadRequest);
    assert_eq!(
        sample(&rec, "tokenmeter_requests_total{api=\"unknown\",code=\"400\",model=\"asked\",outcome=\"bad_request\"}"),
        1.0
    );
    assert_eq!(sample(&rec, "tokenmeter_requests_total"), 1.0);
    assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
    assert_eq!(rec.concurrency.current(), 0);
}

#[test]
fn a_compressed_body_is_counted_once_at_the_end_and_not_read() {
    let rec = recorder();
    let mut meter = rec.start(RequestInfo::default());
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", true);
    meter.on_data(CHUNK.as_bytes(), Instant::now());
    meter.finish(Outcome::Complete);
    assert_eq!(
        sample(
            &rec,
            "tokenmeter_parse_errors_total{reason=\"content_encoding\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(&rec, "tokenmeter_requests_total{api=\"unknown\",code=\"200\",model=\"unknown\",outcome=\"complete\"}"),
        1.0
    );
    assert_eq!(sample(&rec, "tokenmeter_output_tokens_total"), 0.0);
}

// TTFT waits for the prompt count that gives its `prompt` band: observed when usage arrives
// (here in a later frame), not at the first token, and never twice.
#[test]
fn ttft_is_observed_once_when_the_prompt_count_arrives() {
    let rec = recorder();
    let mut meter = rec.start(RequestInfo::default());
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
    let t0 = meter.sending().expect("unfinished").clock.start;
    let count = |rec: &Recorder| sample(rec, "tokenmeter_time_to_first_token_seconds_count");
    meter.on_data(CHUNK.as_bytes(), t0 + Duration::from_millis(100));
    meter.on_data(CHUNK.as_bytes(), t0 + Duration::from_millis(130));
    assert_eq!(count(&rec), 0.0);
    // Counted as they stream, before the request ends.
    assert_eq!(sample(&rec, "tokenmeter_output_tokens_total"), 2.0);
    let usage = "data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":2000,\"completion_tokens\":5}}\n\n";
    meter.on_data(usage.as_bytes(), t0 + Duration::from_millis(500));
    let band = "tokenmeter_time_to_first_token_seconds_count{model=\"m\",prompt=\"1k-4k\"}";
    assert_eq!(sample(&rec, band), 1.0);
    meter.finish(Outcome::Complete);
    assert_eq!(count(&rec), 1.0);
    let ttft = sample(&rec, "tokenmeter_time_to_first_token_seconds_sum");
    assert!((ttft - 0.1).abs() < 1e-9, "{ttft}");
    // Usage settles the total; the stall is the one 30 ms gap.
    assert_eq!(sample(&rec, "tokenmeter_output_tokens_total"), 5.0);
    let stall = sample(&rec, "tokenmeter_request_max_stall_seconds_sum");
    assert!((stall - 0.03).abs() < 1e-9, "{stall}");
    let content = "tokenmeter_time_to_first_output_seconds_sum{kind=\"content\",model=\"m\"}";
    assert!((sample(&rec, content) - 0.1).abs() < 1e-9);
}

// A request with no decode window (an error, or a client gone while queued) is placed in the
// band of its whole life's mean in flight: at 12 in flight it is in band 9-16, not band 1.
#[test]
fn a_request_without_a_decode_window_takes_the_band_of_its_life() {
    let rec = recorder();
    let mut others: Vec<Meter> = (0..11).map(|_| rec.start(RequestInfo::default())).collect();
    let mut failed = rec.start(RequestInfo::default());
    failed.set_status(502);
    failed.finish(Outcome::UpstreamError);
    let line = |band: &str, result: &str| {
        format!(
            "tokenmeter_slo_requests_total{{class=\"interactive\",concurrency=\"{band}\",model=\"unknown\",result=\"{result}\"}}"
        )
    };
    assert_eq!(sample(&rec, &line("9-16", "error")), 1.0);
    // Not judged at all: a request whose class choice said so (a GET).
    let mut get = others.pop().expect("one");
    get.set_slo(None);
    drop(get);
    assert_eq!(sample(&rec, "tokenmeter_slo_requests_total"), 1.0);
    drop(others);
    // The ten others left while queued, before any target could be missed.
    assert_eq!(
        sample(
            &rec,
            "tokenmeter_slo_requests_total{class=\"interactive\",result=\"client_disconnect\"}"
        ),
        10.0
    );
    assert_eq!(sample(&rec, "tokenmeter_slo_requests_total"), 11.0);
    assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
}

// The metering layer receives a meter with the head; the request is in flight only once it is
// sent, with what its body said.
#[test]
fn a_received_request_enters_the_gauges_when_it_is_sent_with_its_model() {
    let rec = recorder();
    let req = http::Request::post("/v1/chat/completions")
        .body(())
        .expect("request");
    let mut meter = rec.receive(&req, Instant::now());
    let prefill = |rec: &Recorder| sample(rec, "tokenmeter_requests_in_flight{phase=\"prefill\"}");
    assert_eq!(prefill(&rec), 0.0);
    assert!(meter.request().is_none());
    let (parts, ()) = req.into_parts();
    let info = RequestInfo {
        model: Some("llama".into()),
        ..RequestInfo::default()
    };
    meter.send(&parts, info);
    assert_eq!(prefill(&rec), 1.0);
    // A second send changes nothing: the request entered once.
    meter.send(&parts, RequestInfo::default());
    assert_eq!(prefill(&rec), 1.0);
    meter.set_status(500);
    meter.finish(Outcome::Complete);
    assert_eq!(prefill(&rec), 0.0);
    let done = r#"tokenmeter_requests_total{code="500",model="llama",outcome="complete"}"#;
    assert_eq!(sample(&rec, done), 1.0);
}

// A client gone while its body was read: the meter was never sent, and its drop records the
// request once, with the class its head named.
#[test]
fn a_meter_dropped_before_it_was_sent_is_recorded_once() {
    let rec = recorder();
    let req = http::Request::post("/v1/chat/completions")
        .body(())
        .expect("request");
    drop(rec.receive(&req, Instant::now()));
    let gone =
        r#"tokenmeter_requests_total{code="502",model="unknown",outcome="client_disconnect"}"#;
    assert_eq!(sample(&rec, gone), 1.0);
    assert_eq!(sample(&rec, "tokenmeter_requests_total"), 1.0);
    assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
    let judged = r#"tokenmeter_slo_requests_total{class="interactive",result="client_disconnect"}"#;
    assert_eq!(sample(&rec, judged), 1.0);
}

// An upstream that could not be reached ran nothing: no GPU time is charged to the request
// (and so no dollars are spread onto it), while one the upstream answered, even with an
// error, is charged its time.
#[test]
fn a_request_the_upstream_never_answered_is_charged_no_gpu_time() {
    let rec = recorder();
    let mut unreachable = rec.start(RequestInfo::default());
    std::thread::sleep(Duration::from_millis(5));
    unreachable.set_status(502);
    unreachable.finish(Outcome::UpstreamError);
    assert_eq!(sample(&rec, "tokenmeter_gpu_seconds_total"), 0.0);
    let mut answered = rec.start(RequestInfo::default());
    std::thread::sleep(Duration::from_millis(5));
    answered.on_response(500, "/v1/chat/completions", "application/json", false);
    answered.finish(Outcome::UpstreamError);
    assert!(sample(&rec, "tokenmeter_gpu_seconds_total") > 0.0);
}
