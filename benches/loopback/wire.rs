//! The bytes the test upstream sends and the client expects, shared by both sides.
//!
//! Every content event is an OpenAI chat-completion chunk of fixed length (about the size vLLM
//! sends) that ends in `"t":<19 digits>`, the upstream's wall clock in nanoseconds when it wrote
//! the chunk. Client and upstream are different processes on the same machine, so the wall clock
//! (not `Instant`) is the one clock both can read; over a few seconds its steps are negligible.
//!
//! The short-requests scenario's bytes are here too: a small embeddings request, and the one
//! fixed JSON document of about 1 KiB the upstream answers it with, whole, with Content-Length.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Everything before the timestamp's digits.
pub const EVENT_HEAD: &str = concat!(
    r#"data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"#,
    r#""model":"bench","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"#,
    r#""finish_reason":null}],"t":"#
);
/// Everything after them.
pub const EVENT_TAIL: &str = "}\n\n";
/// Digits of a nanosecond timestamp (enough until the year 2286).
pub const TS_DIGITS: usize = 19;
/// Bytes of one content event.
pub const EVENT_LEN: usize = EVENT_HEAD.len() + TS_DIGITS + EVENT_TAIL.len();
/// The stream's end marker.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Request headers that tell the upstream what to send.
pub const H_CHUNKS: &str = "x-bench-chunks";
pub const H_INTERVAL: &str = "x-bench-interval-us";
pub const H_HOLD: &str = "x-bench-hold";
/// Microseconds between the response head and the first event (an inference server sends its
/// head at once and its first token after the prefill).
pub const H_FIRST: &str = "x-bench-first-us";
/// Response header the upstream sets when it will send a usage chunk (the request asked for it):
/// a client that sees this header and no usage event knows a proxy removed the event.
pub const H_USAGE: &str = "x-bench-usage";

/// The wall clock in nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The usage-only chunk an OpenAI-compatible server sends when asked for usage.
pub fn usage_event(completion_tokens: u64) -> String {
    format!(
        concat!(
            r#"data: {{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"#,
            r#""model":"bench","choices":[],"usage":{{"prompt_tokens":8,"completion_tokens":{},"#,
            r#""total_tokens":{}}}}}"#,
            "\n\n"
        ),
        completion_tokens,
        completion_tokens + 8
    )
}

/// The request a client sends for `chunks` events, `interval_us` apart (0: as fast as the
/// connection takes them); `hold` asks for one event and then silence until the client leaves.
pub fn request(chunks: u64, interval_us: u64, hold: bool) -> Vec<u8> {
    request_after(chunks, interval_us, 0, hold)
}

/// [`request`], with the first event `first_us` after the response head.
pub fn request_after(chunks: u64, interval_us: u64, first_us: u64, hold: bool) -> Vec<u8> {
    let body = format!(
        r#"{{"model":"bench","stream":true,"max_tokens":{chunks},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n{H_CHUNKS}: {chunks}\r\n{H_INTERVAL}: {interval_us}\r\n{H_FIRST}: {first_us}\r\n\
         {H_HOLD}: {}\r\n\r\n{body}",
        body.len(),
        u8::from(hold)
    )
    .into_bytes()
}

/// The path of a short request: an endpoint whose answer is one small JSON document.
pub const SHORT_PATH: &str = "/v1/embeddings";
/// Numbers in the short answer's embedding: enough for a document of about 1 KiB.
const SHORT_DIMENSIONS: usize = 96;

/// A short request: an embeddings request of a few hundred bytes, not streamed.
pub fn short_request() -> Vec<u8> {
    let text = "The proxy's cost per request, not per chunk: a short input to embed. ".repeat(4);
    let body = format!(r#"{{"model":"bench","input":"{text}","encoding_format":"float"}}"#);
    format!(
        "POST {SHORT_PATH} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The body of every short answer, built once: an OpenAI embeddings response.
pub fn short_body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| {
        let numbers: Vec<String> = (0..SHORT_DIMENSIONS)
            .map(|i| format!("{:.6}", ((i * 37) % 200) as f64 / 1000.0 - 0.1))
            .collect();
        format!(
            concat!(
                r#"{{"object":"list","data":[{{"object":"embedding","index":0,"embedding":[{}]}}],"#,
                r#""model":"bench","usage":{{"prompt_tokens":64,"total_tokens":64}}}}"#
            ),
            numbers.join(",")
        )
        .into_bytes()
    })
}

/// Checks the shared bytes once: the smoke run calls it, so a broken event fails a test.
pub fn self_check() -> Result<(), String> {
    let ts = 1_733_000_000_123_456_789u64;
    let event = format!("{EVENT_HEAD}{ts:019}{EVENT_TAIL}");
    let json = |s: &str| serde_json::from_str::<serde_json::Value>(s.trim_end()).is_ok();
    if event.len() != EVENT_LEN
        || timestamp(event.as_bytes()) != Some(ts)
        || timestamp(DONE).is_some()
    {
        return Err(format!(
            "content event does not round-trip its timestamp: {event:?}"
        ));
    }
    if !json(&event[6..]) || !json(&usage_event(7)[6..]) {
        return Err("an event's data is not JSON".into());
    }
    let request = short_request();
    let request_body = memchr::memmem::find(&request, b"\r\n\r\n").map(|i| &request[i + 4..]);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if !request_body.is_some_and(|b| json(&text(b))) || !json(&text(short_body())) {
        return Err("a short request's or answer's body is not JSON".into());
    }
    Ok(())
}

/// Reads the timestamp out of a content event, or `None` when `event` is not one.
pub fn timestamp(event: &[u8]) -> Option<u64> {
    let digits = event.get(EVENT_HEAD.len()..EVENT_HEAD.len() + TS_DIGITS)?;
    if !event.starts_with(EVENT_HEAD.as_bytes()) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
    })
}
