//! One streamed request, measured where the user sits: on the client side of the connection.
//!
//! [`Client::send`] posts a body, reads the response with tokenmeter's own SSE decoder and OpenAI
//! extractor (the same code the proxy meters with, so both count tokens alike), and returns a
//! [`Sample`]: when the request was sent, when each token-bearing event arrived and how many
//! tokens it carried, and the usage the server reported. Every timestamp is taken when a body
//! frame is handed to us, before it is parsed, so parsing time never counts as server time.
//!
//! Connections are pooled (hyper-util's client) with `TCP_NODELAY` on, so that after the first
//! request of a worker no connection setup lands in TTFT, and idle connections are dropped before
//! a server's keep-alive timeout (vLLM's is 5 s) could close them under a new request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::timeout_at;

use super::stats;
use tokenmeter::protocol::openai::OpenAi;
use tokenmeter::protocol::{Extractor, Message};
use tokenmeter::read::sse;

/// Longest SSE line or event kept while parsing. OpenAI chunks are a few hundred bytes; a line
/// over this is skipped (its tokens go uncounted) rather than buffered without bound.
const MAX_LINE: usize = 1 << 20;

/// Idle pooled connections are closed after this, below the 5 s keep-alive of vLLM's server.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// Largest `/v1/models` answer read when looking for a model name.
const MAX_MODELS_BODY: usize = 1 << 20;

/// Bytes of a failure's body quoted in the error: enough for a JSON error's message, short
/// enough for one line of a terminal's error.
pub const MAX_ERROR_BODY: usize = 300;

/// Why a request did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request failed before a response: {0}")]
    Send(String),
    #[error("HTTP status {0}")]
    Status(u16),
    /// A failure status with the start of the body that came with it: a proxy's or a server's
    /// own words for what went wrong (tokenmeter's 502 says why the upstream is unavailable).
    #[error("HTTP status {status}: {body}")]
    Answered { status: u16, body: String },
    #[error("response body failed: {0}")]
    Stream(String),
    #[error("no complete response within the timeout")]
    Timeout,
    #[error("the stream carried no output token")]
    NoTokens,
}

impl RequestError {
    /// A short, bounded name for tables and the JSON report.
    pub fn kind(&self) -> &'static str {
        match self {
            RequestError::Send(_) => "send",
            RequestError::Status(_) | RequestError::Answered { .. } => "status",
            RequestError::Stream(_) => "stream",
            RequestError::Timeout => "timeout",
            RequestError::NoTokens => "no_tokens",
        }
    }
}

/// What one request measured. Offsets are from the moment the request was handed to the client
/// or, in the open loop, from the moment it was due ([`Client::send_scheduled`]).
#[derive(Debug, Clone)]
pub struct Sample {
    pub sent: Instant,
    /// How late the request actually left after `sent`, the time it was due: zero in the closed
    /// loop; in the open loop, the client's own lateness, counted in every latency.
    pub late: Duration,
    /// Sent to the first token-bearing event.
    pub ttft: Option<Duration>,
    /// Sent to the end of the response body (or to the failure).
    pub e2e: Duration,
    /// Every token-bearing event: its arrival offset and the tokens it carried.
    pub events: Vec<(Duration, u32)>,
    /// `usage.completion_tokens` from the stream, when the server sent it.
    pub usage_output: Option<u64>,
    /// `usage.prompt_tokens` from the stream.
    pub input_tokens: Option<u64>,
    pub error: Option<RequestError>,
}

impl Sample {
    /// Tokens counted event by event.
    pub fn counted_tokens(&self) -> u64 {
        self.events.iter().map(|&(_, n)| u64::from(n)).sum()
    }

    /// Output tokens: the server's usage report when it sent one, else the count of events.
    pub fn output_tokens(&self) -> u64 {
        self.usage_output.unwrap_or_else(|| self.counted_tokens())
    }

    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }

    pub fn ttft_secs(&self) -> Option<f64> {
        self.ttft.map(|d| d.as_secs_f64())
    }

    pub fn tpot(&self) -> Option<f64> {
        stats::tpot(
            self.ttft_secs()?,
            self.e2e.as_secs_f64(),
            self.output_tokens(),
        )
    }

    pub fn request_tps(&self) -> Option<f64> {
        stats::request_tps(
            self.ttft_secs()?,
            self.e2e.as_secs_f64(),
            self.output_tokens(),
        )
    }

    /// Appends this request's inter-token latencies: the gap before each token-bearing event
    /// divided by the tokens it carries, once per token (as SGLang, NVIDIA Dynamo and the
    /// proxy's histogram do), so a chunk of several tokens does not count as one long gap.
    pub fn push_itl(&self, out: &mut Vec<f64>) {
        for pair in self.events.windows(2) {
            let (prev, (at, n)) = (pair[0].0, pair[1]);
            if n == 0 {
                continue;
            }
            let gap = at.saturating_sub(prev).as_secs_f64() / f64::from(n);
            out.extend(std::iter::repeat(gap).take(n as usize));
        }
    }

    /// Output tokens that arrived by `until`. When the usage report and the event count differ
    /// (chunks of several tokens without token ids), each event is weighted so that the request
    /// as a whole adds up to its usage count.
    pub fn tokens_until(&self, until: Instant) -> f64 {
        let counted = self.counted_tokens();
        if counted == 0 {
            return 0.0;
        }
        let scale = self.output_tokens() as f64 / counted as f64;
        let arrived: u64 = self
            .events
            .iter()
            .take_while(|&&(at, _)| self.sent + at <= until)
            .map(|&(_, n)| u64::from(n))
            .sum();
        arrived as f64 * scale
    }
}

/// A pooled HTTP client bound to one OpenAI-compatible base URL.
pub struct Client {
    http: HttpClient<HttpConnector, Full<Bytes>>,
    /// The `/v1` base, e.g. `http://127.0.0.1:8000/v1`.
    base: String,
    authorization: Option<HeaderValue>,
    timeout: Duration,
}

impl Client {
    /// `base` is the URL the OpenAI paths hang under (ending in `/v1`); `timeout` bounds each
    /// request from send to the end of its body.
    pub fn new(base: String, api_key: Option<&str>, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        // Off by default in hyper-util: Nagle would delay small request writes.
        connector.set_nodelay(true);
        let http = HttpClient::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        let authorization = api_key.and_then(|k| {
            let mut v = HeaderValue::from_str(&format!("Bearer {k}")).ok()?;
            v.set_sensitive(true);
            Some(v)
        });
        Client {
            http,
            base,
            authorization,
            timeout,
        }
    }

    fn uri(&self, path: &str) -> Result<Uri, RequestError> {
        format!("{}{path}", self.base)
            .parse()
            .map_err(|e: http::uri::InvalidUri| RequestError::Send(e.to_string()))
    }

    /// Sends one streaming request to `path` (under the base) and measures its response.
    pub async fn send(&self, path: &str, body: Vec<u8>) -> Sample {
        self.send_counting(path, body, &AtomicU64::new(0)).await
    }

    /// As [`Client::send`], and adds each event's tokens to `arrived` as it comes, for a live
    /// throughput figure while the request is still streaming (the demo's table).
    pub async fn send_counting(&self, path: &str, body: Vec<u8>, arrived: &AtomicU64) -> Sample {
        let mut sample = Sample {
            sent: Instant::now(),
            late: Duration::ZERO,
            ttft: None,
            e2e: Duration::ZERO,
            events: Vec::new(),
            usage_output: None,
            input_tokens: None,
            error: None,
        };
        let req = match self.uri(path).and_then(|uri| {
            let mut b = Request::post(uri)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "text/event-stream");
            if let Some(auth) = &self.authorization {
                b = b.header(header::AUTHORIZATION, auth.clone());
            }
            b.body(Full::new(Bytes::from(body)))
                .map_err(|e| RequestError::Send(e.to_string()))
        }) {
            Ok(r) => r,
            Err(e) => {
                sample.error = Some(e);
                return sample;
            }
        };

        let sent = Instant::now();
        sample.sent = sent;
        let deadline = tokio::time::Instant::from_std(sent + self.timeout);
        let resp = match timeout_at(deadline, self.http.request(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return sample.failed(RequestError::Send(error_chain(&e))),
            Err(_) => return sample.failed(RequestError::Timeout),
        };
        if !resp.status().is_success() {
            return sample.failed(RequestError::Status(resp.status().as_u16()));
        }

        let mut body = resp.into_body();
        let mut decoder = sse::Decoder::new(MAX_LINE);
        let mut extractor = OpenAi::default();
        let mut events = Vec::new();
        let error = loop {
            match timeout_at(deadline, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    let at = sent.elapsed();
                    if let Some(data) = frame.data_ref() {
                        let before = events.len();
                        decoder.feed(data, &mut |m| {
                            on_message(&mut extractor, &mut events, m, at)
                        });
                        count(&events[before..], arrived);
                    }
                }
                Ok(None) => break None,
                Ok(Some(Err(e))) => break Some(RequestError::Stream(error_chain(&e))),
                Err(_) => break Some(RequestError::Timeout),
            }
        };
        let end = sent.elapsed();
        let before = events.len();
        decoder.finish(&mut |m| on_message(&mut extractor, &mut events, m, end));
        count(&events[before..], arrived);

        let summary = extractor.summary();
        sample.usage_output = summary.output_tokens;
        sample.input_tokens = summary.input_tokens;
        sample.ttft = events.first().map(|&(at, _)| at);
        sample.events = events;
        sample.e2e = end;
        sample.error = error.or_else(|| sample.ttft.is_none().then_some(RequestError::NoTokens));
        sample
    }

    /// As [`Client::send`], for a request that was due at `scheduled`: every offset (TTFT,
    /// end-to-end, each token) is measured from `scheduled`, not from when the request left,
    /// so a client that could not send on time counts its lateness instead of hiding the
    /// server's queue behind it (no coordinated omission).
    pub async fn send_scheduled(&self, path: &str, body: Vec<u8>, scheduled: Instant) -> Sample {
        self.send(path, body).await.from_scheduled(scheduled)
    }

    /// The first model the server lists at `/v1/models`.
    pub async fn first_model(&self) -> Result<String, RequestError> {
        let uri = self.uri("/models")?;
        let mut b = Request::get(uri);
        if let Some(auth) = &self.authorization {
            b = b.header(header::AUTHORIZATION, auth.clone());
        }
        let req = b
            .body(Full::new(Bytes::new()))
            .map_err(|e| RequestError::Send(e.to_string()))?;
        let resp = timeout_at(
            tokio::time::Instant::now() + self.timeout,
            self.http.request(req),
        )
        .await
        .map_err(|_| RequestError::Timeout)?
        .map_err(|e| RequestError::Send(error_chain(&e)))?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            // The status alone hides the cause (a proxy's 502 says which upstream is down and
            // how): the body's start goes into the error, within the same timeout.
            let deadline = tokio::time::Instant::now() + self.timeout;
            let body = timeout_at(deadline, body_start(resp.into_body(), MAX_ERROR_BODY))
                .await
                .unwrap_or_default();
            return Err(RequestError::Answered { status, body });
        }
        let body = http_body_util::Limited::new(resp.into_body(), MAX_MODELS_BODY)
            .collect()
            .await
            .map_err(|e| RequestError::Stream(e.to_string()))?
            .to_bytes();
        #[derive(serde::Deserialize)]
        struct Models {
            data: Vec<Model>,
        }
        #[derive(serde::Deserialize)]
        struct Model {
            id: String,
        }
        let models: Models = serde_json::from_slice(&body)
            .map_err(|e| RequestError::Stream(format!("/v1/models is not a model list: {e}")))?;
        models
            .data
            .into_iter()
            .next()
            .map(|m| m.id)
            .ok_or_else(|| RequestError::Stream("/v1/models lists no model".into()))
    }
}

impl Sample {
    /// Re-bases the sample on the time it was due (at or before it was sent).
    pub fn from_scheduled(mut self, scheduled: Instant) -> Sample {
        let late = self.sent.saturating_duration_since(scheduled);
        self.sent = self.sent.min(scheduled);
        self.late = late;
        self.ttft = self.ttft.map(|t| t + late);
        self.e2e += late;
        for (at, _) in &mut self.events {
            *at += late;
        }
        self
    }

    fn failed(mut self, error: RequestError) -> Sample {
        self.e2e = self.sent.elapsed();
        self.error = Some(error);
        self
    }
}

fn on_message(x: &mut OpenAi, events: &mut Vec<(Duration, u32)>, m: Message<'_>, at: Duration) {
    let n = x.on_message(&m);
    if n > 0 {
        events.push((at, n));
    }
}

fn count(new: &[(Duration, u32)], arrived: &AtomicU64) {
    let n: u64 = new.iter().map(|&(_, n)| u64::from(n)).sum();
    if n > 0 {
        arrived.fetch_add(n, Ordering::Relaxed);
    }
}

/// An error with its sources, which is where hyper puts the useful part ("connection refused").
/// The first `max` bytes of `body` as one line of text: read only that far (a body that
/// streams forever is not waited for), invalid UTF-8 and control characters (a terminal's
/// escape codes, newlines) replaced, and `...` where it was cut. Empty when nothing came.
async fn body_start<B>(body: B, max: usize) -> String
where
    B: http_body::Body + Unpin,
{
    let mut body = body;
    let mut bytes: Vec<u8> = Vec::new();
    let mut cut = false;
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            bytes::BufMut::put(&mut bytes, data);
            if bytes.len() > max {
                bytes.truncate(max);
                cut = true;
                break;
            }
        }
    }
    one_line(&bytes, cut)
}

/// `bytes` as one line of printable text, `...` after it when it was `cut`.
fn one_line(bytes: &[u8], cut: bool) -> String {
    let text: String = String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if cut {
        // A cut through a character shows as its replacement; the dots say there was more.
        line.push_str("...");
    }
    line
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;

    #[test]
    fn an_error_body_is_quoted_as_one_printable_line() {
        assert_eq!(one_line(b"", false), "");
        assert_eq!(
            one_line(b"{\"error\":\n  \"down\"}\r\n", false),
            "{\"error\": \"down\"}"
        );
        assert_eq!(one_line(b"\x1b[31mred\x1b[0m", false), "[31mred [0m");
        assert_eq!(one_line(b"abc", true), "abc...");
        assert_eq!(one_line(&[b'a', 0xff], false), "a\u{fffd}");
    }

    #[tokio::test]
    async fn only_the_start_of_a_long_error_body_is_read() {
        let long = Full::new(Bytes::from(vec![b'x'; 10 * MAX_ERROR_BODY]));
        let got = body_start(long, MAX_ERROR_BODY).await;
        assert_eq!(got.len(), MAX_ERROR_BODY + 3, "{got}");
        assert!(got.ends_with("x..."));
        let short = Full::new(Bytes::from_static(b"bad gateway"));
        assert_eq!(body_start(short, MAX_ERROR_BODY).await, "bad gateway");
    }

    fn sample(events: &[(u64, u32)], usage: Option<u64>) -> Sample {
        Sample {
            sent: Instant::now(),
            late: Duration::ZERO,
            ttft: events.first().map(|&(ms, _)| Duration::from_millis(ms)),
            e2e: Duration::from_millis(events.last().map_or(0, |&(ms, _)| ms)),
            events: events
                .iter()
                .map(|&(ms, n)| (Duration::from_millis(ms), n))
                .collect(),
            usage_output: usage,
            input_tokens: None,
            error: None,
        }
    }

    #[test]
    fn itl_spreads_a_multi_token_gap_over_its_tokens() {
        let s = sample(&[(100, 1), (120, 1), (160, 2)], None);
        let mut itl = Vec::new();
        s.push_itl(&mut itl);
        let ms: Vec<f64> = itl.iter().map(|x| (x * 1e3).round()).collect();
        assert_eq!(ms, [20.0, 20.0, 20.0]);
        assert_eq!(s.counted_tokens(), 4);
    }

    #[test]
    fn a_late_send_counts_its_lateness_in_every_latency() {
        let s = sample(&[(100, 1), (150, 2)], Some(3));
        let sent = s.sent;
        let due = sent - Duration::from_millis(30);
        let r = s.from_scheduled(due);
        assert_eq!(r.sent, due);
        assert_eq!(r.late, Duration::from_millis(30));
        assert_eq!(r.ttft, Some(Duration::from_millis(130)));
        assert_eq!(r.e2e, Duration::from_millis(180));
        assert_eq!(
            r.events,
            [
                (Duration::from_millis(130), 1),
                (Duration::from_millis(180), 2)
            ]
        );
        // The tokens arrived when they did: the window counts them at the same instants.
        assert_eq!(r.tokens_until(sent + Duration::from_millis(100)), 1.0);
        // On time: nothing moves.
        let on_time = sample(&[(100, 1)], None);
        let at = on_time.sent;
        let r = on_time.from_scheduled(at);
        assert_eq!(
            (r.late, r.ttft),
            (Duration::ZERO, Some(Duration::from_millis(100)))
        );
    }

    #[test]
    fn usage_wins_over_counting_and_scales_tokens_in_a_window() {
        let s = sample(&[(100, 1), (200, 1), (300, 1), (400, 1)], Some(8));
        assert_eq!(s.output_tokens(), 8);
        assert_eq!(s.tokens_until(s.sent + Duration::from_millis(250)), 4.0);
        assert_eq!(s.tokens_until(s.sent + Duration::from_millis(400)), 8.0);
        assert_eq!(s.tokens_until(s.sent), 0.0);
        // TPOT: (0.4 - 0.1) / 7
        assert!((s.tpot().unwrap() - 0.3 / 7.0).abs() < 1e-12);
    }
}
