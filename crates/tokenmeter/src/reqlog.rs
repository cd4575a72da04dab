//! The request log (`--request-log FILE|-`): one JSON object per line for each finished request,
//! made from the one [`Finished`] record the metrics take, so every request (refused, shed and
//! failed ones too) has exactly one line.
//!
//! The keys and their order are a contract (docs/request-log.md): [`KEYS`]. A line holds only
//! bounded facts: never the prompt, the completion, a header value other than the sanitised
//! request id, nor a credential.
//!
//! Off the hot path: the request's thread formats its line and offers it to a bounded queue
//! ([`QUEUE_LINES`]); a writer thread of its own drains it in batches. A line that finds the
//! queue full (a stalled disk, a pipe nobody reads) is dropped and counted in
//! `tokenmeter_request_log_dropped_total`; no stream ever waits for the log. A failed write is
//! logged at most once a minute and its lines counted as dropped; SIGHUP reopens the file
//! ([`crate::logfile`]).

use std::fmt::Write as _;
use std::io;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus::IntCounter;

pub use crate::logfile::Destination;
use crate::logfile::LineFile;
use crate::record::{Finished, Sink};

/// Lines the queue holds before new ones are dropped. A line is about 700 bytes (at most some
/// 2 KiB: every string in it is bounded), so the queue holds at most about 2 MiB; at a thousand
/// requests a second it rides out a second's stall of the disk. A writer stalled for longer is
/// not catching up anyway: dropping (and counting) beats growing the heap.
pub const QUEUE_LINES: usize = 1024;

/// Lines written before each flush: a busy proxy writes in batches, an idle one line by line.
const BATCH_LINES: usize = 256;

/// The keys of a line, in their order.
pub const KEYS: [&str; 34] = [
    "time",
    "trace_id",
    "span_id",
    "request_id",
    "method",
    "path",
    "model",
    "tenant",
    "class",
    "slo",
    "status",
    "outcome",
    "api",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "ttft_seconds",
    "duration_seconds",
    "tokens_per_second",
    "concurrency",
    "concurrency_band",
    "gpu_seconds",
    "gpu_prefill_seconds",
    "gpu_decode_seconds",
    "max_stall_seconds",
    "token_source",
    "engine_source",
    "engine_queue_seconds",
    "engine_model_load_seconds",
    "engine_prefill_seconds",
    "engine_other_seconds",
    "engine_generation_seconds",
    "stop",
];

/// The log's sending half: a [`Sink`] the meter hands every finished record.
pub struct RequestLog {
    tx: SyncSender<String>,
    dropped: IntCounter,
}

impl RequestLog {
    /// Opens `destination` (a file is created or appended to) and starts the writer thread; fails
    /// only when the file cannot be opened (the caller exits 64, naming the flag).
    pub fn open(destination: &Destination, dropped: IntCounter) -> io::Result<RequestLog> {
        let out = LineFile::open(destination, "request log")?;
        let (tx, rx) = mpsc::sync_channel(QUEUE_LINES);
        let counter = dropped.clone();
        std::thread::Builder::new()
            .name("request-log".into())
            .spawn(move || write_lines(rx, out, counter))?;
        Ok(RequestLog { tx, dropped })
    }
}

impl Sink for RequestLog {
    fn finished(&self, f: &Finished, _at: Instant) {
        let line = line(f, SystemTime::now());
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.dropped.inc(),
        }
    }
}

/// The writer thread: a batch at a time, one flush per batch.
fn write_lines(rx: Receiver<String>, mut out: LineFile, dropped: IntCounter) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_LINES {
            match rx.try_recv() {
                Ok(l) => batch.push(l),
                Err(_) => break,
            }
        }
        if out.write_batch(batch.iter().map(String::as_str)).is_err() {
            // What was in the batch is lost with the failed write.
            dropped.inc_by(batch.len() as u64);
        }
    }
}

/// One request's line, ending in `\n`; `now` stands in for the end when the head was not read.
pub fn line(f: &Finished, now: SystemTime) -> String {
    let mut w = Line(String::with_capacity(768));
    let ident = f.ident.as_deref();
    let end = ident.map_or(now, |i| i.arrived + f.duration);
    let trace = ident.and_then(|i| i.trace.as_ref());
    w.0.push('{');
    w.str("time", Some(&rfc3339(end)));
    w.str(
        "trace_id",
        trace.map(|t| crate::context::hex(&t.trace_id)).as_deref(),
    );
    w.str(
        "span_id",
        trace
            .and_then(|t| t.span_id)
            .map(|s| crate::context::hex(&s))
            .as_deref(),
    );
    w.str("request_id", ident.and_then(|i| i.request_id.as_deref()));
    w.str("method", ident.map(|i| i.method.as_str()));
    w.str("path", ident.map(|i| &*i.path));
    w.str("model", Some(&f.model));
    w.str("tenant", f.tenant.as_deref());
    w.str("class", f.slo.as_ref().map(|s| &*s.class));
    w.str("slo", f.slo.as_ref().map(|s| s.verdict.as_str()));
    w.num("status", Some(f64::from(f.code)));
    w.str("outcome", Some(f.outcome.as_str()));
    w.str("api", Some(f.api.as_str()));
    let read = f.api != crate::protocol::Api::Unknown;
    w.num("input_tokens", f.input_tokens.map(|n| n as f64));
    w.num("output_tokens", read.then_some(f.output_tokens as f64));
    w.num("cached_tokens", f.cached_input.read.map(|n| n as f64));
    w.num("reasoning_tokens", f.reasoning_tokens.map(|n| n as f64));
    w.num("ttft_seconds", secs(f.first_token));
    w.num("duration_seconds", secs(Some(f.duration)));
    w.num("tokens_per_second", f.tokens_per_second());
    w.num("concurrency", f.mean_in_flight);
    let band = f.slo.as_ref().map_or_else(|| f.band(), |s| s.band);
    w.str("concurrency_band", Some(band));
    let gpu = f.gpu_seconds.as_ref();
    w.num("gpu_seconds", gpu.map(|g| g.total()));
    w.num("gpu_prefill_seconds", gpu.map(|g| g.prefill));
    w.num("gpu_decode_seconds", gpu.map(|g| g.decode));
    w.num("max_stall_seconds", secs(f.max_stall));
    w.str("token_source", read.then(|| f.token_source.as_str()));
    let engine = f.engine.as_ref();
    let split = engine.zip(f.first_token).map(|(e, ttft)| e.split(ttft).0);
    w.str("engine_source", engine.map(|e| e.source.as_str()));
    w.num("engine_queue_seconds", secs(engine.and_then(|e| e.queue)));
    w.num(
        "engine_model_load_seconds",
        secs(engine.and_then(|e| e.model_load)),
    );
    w.num(
        "engine_prefill_seconds",
        secs(engine.and_then(|e| e.prefill)),
    );
    w.num("engine_other_seconds", secs(split.map(|s| s.other)));
    w.num(
        "engine_generation_seconds",
        secs(engine.and_then(|e| e.generation)),
    );
    w.str("stop", f.stop.map(|s| s.as_str()));
    w.0.push_str("}\n");
    w.0
}

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

/// A JSON object being written, key by key, in the order called.
struct Line(String);

impl Line {
    fn key(&mut self, k: &str) {
        if !self.0.ends_with('{') {
            self.0.push(',');
        }
        self.0.push('"');
        self.0.push_str(k);
        self.0.push_str("\":");
    }

    fn str(&mut self, k: &str, v: Option<&str>) {
        self.key(k);
        match v {
            None => self.0.push_str("null"),
            Some(v) => escape(&mut self.0, v),
        }
    }

    fn num(&mut self, k: &str, v: Option<f64>) {
        self.key(k);
        match v {
            Some(v) if v.is_finite() => {
                let _ = write!(self.0, "{v}");
            }
            _ => self.0.push_str("null"),
        }
    }
}

/// `v` as a JSON string.
fn escape(out: &mut String, v: &str) {
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A UTC time as RFC 3339 with milliseconds: `2026-12-02T21:58:39.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = crate::units::civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_000_719_123);
        assert_eq!(rfc3339(t), "2026-11-18T11:18:39.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // A leap day.
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn strings_are_escaped_as_json() {
        let mut s = String::new();
        escape(&mut s, "a\"b\\c\u{1}é");
        let back: String = serde_json::from_str(&s).expect("json");
        assert_eq!(back, "a\"b\\c\u{1}é");
    }

    #[test]
    fn a_line_has_every_key_in_order() {
        let f = crate::record::tests::finished();
        let l = line(&f, UNIX_EPOCH);
        assert!(l.ends_with("}\n"));
        let v: serde_json::Value = serde_json::from_str(&l).expect("json");
        let keys: Vec<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut sorted = KEYS.to_vec();
        sorted.sort_unstable();
        assert_eq!(keys, sorted);
        // In the contract's order on the line itself.
        let mut at = 0;
        for k in KEYS {
            let i = l[at..].find(&format!("\"{k}\":")).expect(k) + at;
            at = i;
        }
        assert_eq!(v["output_tokens"], 5.0);
        assert_eq!(v["tokens_per_second"], 20.0);
        assert_eq!(v["ttft_seconds"], 0.1);
        assert_eq!(v["trace_id"], serde_json::Value::Null);
    }
}
