use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use http_body_util::{BodyExt, Full};

use super::mock::{End, MockBody, Step};
use super::*;
use crate::exposition::Scrape;
use crate::idle::IdleBody;
use crate::meter::Recorder;
use crate::metrics::{Metrics, MetricsConfig};
use crate::protocol::request::RequestInfo;

const CHUNK: &str = "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n";

fn recorder() -> Arc<Recorder> {
    let metrics = Arc::new(Metrics::new(&MetricsConfig::default()).expect("metrics"));
    Arc::new(Recorder::new(metrics, Default::default()))
}

/// A tap over `body` for an OpenAI-format SSE response, with the idle limit beneath it as the
/// proxy puts it there.
fn tap(rec: &Arc<Recorder>, body: MockBody, idle: Option<Duration>) -> TapBody<IdleBody<MockBody>> {
    let mut meter = rec.start(RequestInfo::default());
    meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
    TapBody::new(IdleBody::new(body, idle), meter)
}

/// `tokenmeter_requests_total` by outcome: how many requests were recorded, and how.
fn outcomes(rec: &Recorder) -> Vec<(String, f64)> {
    let text = String::from_utf8(rec.metrics().render()).expect("utf8");
    Scrape::parse(&text)
        .select("tokenmeter_requests_total", &[])
        .map(|s| (s.label("outcome").unwrap_or("").to_owned(), s.value))
        .collect()
}

fn recorded_once(rec: &Recorder, outcome: &str) {
    assert_eq!(outcomes(rec), [(outcome.to_owned(), 1.0)]);
    assert_eq!(rec.concurrency().current(), 0, "left the gauges");
}

/// What one poll of a body gives.
type Polled<B> = Poll<Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>>;

/// Polls `body` once with a waker that counts its wakes.
fn poll_once<B: Body + Unpin>(body: &mut B, wakes: &Arc<Wakes>) -> Polled<B> {
    let waker = std::task::Waker::from(Arc::clone(wakes));
    let mut cx = Context::from_waker(&waker);
    Pin::new(body).poll_frame(&mut cx)
}

#[derive(Default)]
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn frames_pass_unchanged_and_in_order_through_pending_and_trailers() {
    let rec = recorder();
    let (a, b) = CHUNK.split_at(17);
    let mut trailers = HeaderMap::new();
    trailers.insert("x-t", HeaderValue::from_static("1"));
    let script = [
        Step::Data(Bytes::from(CHUNK)),
        Step::Pending,
        Step::Data(Bytes::from(a)),
        Step::Data(Bytes::from(b)),
        Step::Pending,
        Step::Data(Bytes::from_static(b"data: [DONE]\n\n")),
        Step::Trailers(trailers.clone()),
    ];
    let mut body = tap(&rec, MockBody::new(script, End::None), None);
    let wakes = Arc::new(Wakes::default());
    let mut got = Vec::new();
    let mut pending = 0;
    loop {
        match poll_once(&mut body, &wakes) {
            Poll::Ready(Some(Ok(f))) => got.push(f),
            Poll::Ready(Some(Err(e))) => panic!("error {e}"),
            Poll::Ready(None) => break,
            Poll::Pending => pending += 1,
        }
    }
    // Pending passes through with the inner body's wake (no timer without an idle timeout).
    assert_eq!(
        (pending, wakes.0.load(std::sync::atomic::Ordering::SeqCst)),
        (2, 2)
    );
    let data: Vec<&[u8]> = got
        .iter()
        .filter_map(|f| f.data_ref())
        .map(|d| &d[..])
        .collect();
    assert_eq!(
        data,
        [
            CHUNK.as_bytes(),
            a.as_bytes(),
            b.as_bytes(),
            b"data: [DONE]\n\n"
        ]
    );
    assert_eq!(got.last().and_then(|f| f.trailers_ref()), Some(&trailers));
    assert!(body.is_end_stream());
    // Ended: nothing more, and the inner body is not polled again.
    let polls = body.inner.get_ref().polls;
    assert!(matches!(poll_once(&mut body, &wakes), Poll::Ready(None)));
    assert_eq!(body.inner.get_ref().polls, polls);
    drop(body);
    recorded_once(&rec, "complete");
    let text = String::from_utf8(rec.metrics().render()).expect("utf8");
    assert!(
        text.contains("tokenmeter_output_tokens_total{model=\"m\"} 2"),
        "{text}"
    );
}

#[test]
fn a_body_of_known_length_ends_at_its_last_frame() {
    let rec = recorder();
    let script = [
        Step::Data(Bytes::from(CHUNK)),
        Step::Data(Bytes::from(CHUNK)),
    ];
    let mut body = tap(&rec, MockBody::new(script, End::Known), None);
    let wakes = Arc::new(Wakes::default());
    assert!(matches!(
        poll_once(&mut body, &wakes),
        Poll::Ready(Some(Ok(_)))
    ));
    assert!(!body.is_end_stream());
    assert_eq!(outcomes(&rec), []);
    assert!(matches!(
        poll_once(&mut body, &wakes),
        Poll::Ready(Some(Ok(_)))
    ));
    assert!(body.is_end_stream());
    recorded_once(&rec, "complete");
    drop(body);
    recorded_once(&rec, "complete");
}

#[test]
fn an_empty_body_is_complete_before_any_poll() {
    let rec = recorder();
    let body = tap(&rec, MockBody::new([], End::Known), None);
    assert!(body.is_end_stream());
    recorded_once(&rec, "complete");
    drop(body);
    recorded_once(&rec, "complete");
}

#[test]
fn an_upstream_error_passes_through_and_ends_the_request_once() {
    let rec = recorder();
    let script = [
        Step::Data(Bytes::from(CHUNK)),
        Step::Error("reset"),
        Step::Data(Bytes::from(CHUNK)),
    ];
    let mut body = tap(&rec, MockBody::new(script, End::None), None);
    let wakes = Arc::new(Wakes::default());
    assert!(matches!(
        poll_once(&mut body, &wakes),
        Poll::Ready(Some(Ok(_)))
    ));
    match poll_once(&mut body, &wakes) {
        Poll::Ready(Some(Err(e))) => assert_eq!(e.to_string(), "mock body error: reset"),
        other => panic!(
            "expected the error, got {:?}",
            other.map(|o| o.map(|r| r.is_ok()))
        ),
    }
    recorded_once(&rec, "upstream_error");
    assert!(matches!(poll_once(&mut body, &wakes), Poll::Ready(None)));
    drop(body);
    recorded_once(&rec, "upstream_error");
}

#[test]
fn a_body_dropped_before_its_end_is_a_client_disconnect_once() {
    let rec = recorder();
    let script = [
        Step::Data(Bytes::from(CHUNK)),
        Step::Data(Bytes::from(CHUNK)),
    ];
    let mut body = tap(&rec, MockBody::new(script, End::Never), None);
    let wakes = Arc::new(Wakes::default());
    assert!(matches!(
        poll_once(&mut body, &wakes),
        Poll::Ready(Some(Ok(_)))
    ));
    assert_eq!(outcomes(&rec), []);
    drop(body);
    recorded_once(&rec, "client_disconnect");
}

#[test]
fn a_meter_dropped_before_any_tap_is_a_client_disconnect() {
    let rec = recorder();
    let meter = rec.start(RequestInfo::default());
    assert_eq!(rec.concurrency().current(), 1);
    drop(meter);
    recorded_once(&rec, "client_disconnect");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_upstream_hits_the_idle_timeout_once() {
    let rec = recorder();
    let script = [Step::Data(Bytes::from(CHUNK))];
    let idle = Duration::from_secs(5);
    let mut body = tap(&rec, MockBody::new(script, End::Never), Some(idle));
    let first = body.frame().await.expect("a frame").expect("data");
    assert_eq!(first.into_data().expect("data"), CHUNK.as_bytes());
    let t0 = tokio::time::Instant::now();
    let err = body
        .frame()
        .await
        .expect("an error")
        .expect_err("the idle timeout");
    assert_eq!(t0.elapsed(), idle, "the timer starts at the first wait");
    assert!(err.downcast_ref::<IdleTimeout>().is_some(), "{err}");
    recorded_once(&rec, "timeout");
    assert!(body.frame().await.is_none());
    drop(body);
    recorded_once(&rec, "timeout");
}

// Regression: behind a real vLLM, every non-streaming response (sent with Content-Length)
// was counted as `client_disconnect` with 0 tokens, because hyper stops polling a body of
// known length after its last byte and the tap only finished on `None` or on drop.
#[tokio::test]
async fn a_body_of_known_length_is_complete_after_its_last_frame() {
    let metrics = Arc::new(Metrics::new(&MetricsConfig::default()).expect("metrics"));
    let recorder = Arc::new(Recorder::new(Arc::clone(&metrics), Default::default()));
    let mut meter = recorder.start(RequestInfo::default());
    meter.on_response(200, "/v1/chat/completions", "application/json", false);
    let json = r#"{"model":"m","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#;
    let mut body = TapBody::new(Full::new(Bytes::from(json)), meter);

    let frame = body.frame().await.expect("a frame").expect("no error");
    assert_eq!(frame.into_data().expect("data"), json.as_bytes());
    assert!(body.is_end_stream());
    // What hyper does next: drop the body without polling it again.
    drop(body);

    let text = String::from_utf8(metrics.render()).expect("utf8");
    for line in [
        r#"tokenmeter_requests_total{api="openai",code="200",model="m",outcome="complete"} 1"#,
        r#"tokenmeter_output_tokens_total{model="m"} 3"#,
        r#"tokenmeter_input_tokens_total{model="m"} 9"#,
        r#"tokenmeter_token_count_source_total{source="usage"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(!text.contains("client_disconnect"), "{text}");
}
