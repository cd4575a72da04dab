//! Who a request is, as its head says: the W3C Trace Context it carries, its `x-request-id`,
//! its method and path; and the sampling decision that says whether tokenmeter records a span
//! for it.
//!
//! A leaf: it imports nothing of the crate. The request log and the span exporter read an
//! [`Ident`] off the one `Finished` record; the proxy forwards [`Trace::traceparent`] upstream.
//!
//! The parse is strict, as the W3C recommendation asks: version `00`, a 32-hex-digit trace id
//! and a 16-hex-digit parent id, lowercase, neither all zeros, two hex digits of flags and
//! nothing after them. Anything else is treated as no `traceparent` at all (a new trace, when
//! sampled), never as an error.

use std::sync::Arc;
use std::time::SystemTime;

use http::HeaderMap;

/// Longest `x-request-id` kept; longer ones are cut. Request ids are UUIDs (36) or
/// gateway-made tokens; 128 bytes holds any of them and bounds the log line.
pub const MAX_REQUEST_ID: usize = 128;

/// Longest path kept (without the query string); longer ones are cut at a character boundary.
/// Inference paths are short (`/v1/chat/completions`); the bound keeps a hostile URI from
/// growing the log line.
pub const MAX_PATH: usize = 256;

/// Longest `tracestate` carried into a span: the W3C limit a vendor must propagate (512).
pub const MAX_TRACESTATE: usize = 512;

/// An incoming `traceparent`, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// The header value, strictly (see the module's doc); `None` for anything malformed.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        // 2 + 1 + 32 + 1 + 16 + 1 + 2: version 00 has exactly this length.
        if value.len() != 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        if &value[..2] != b"00" {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut parent_id = [0u8; 8];
        let mut flags = [0u8; 1];
        hex_into(&value[3..35], &mut trace_id)?;
        hex_into(&value[36..52], &mut parent_id)?;
        hex_into(&value[53..55], &mut flags)?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags: flags[0],
        })
    }

    /// The caller sampled its span (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// Lowercase hex digits into bytes; `None` on any other character.
fn hex_into(hex: &[u8], out: &mut [u8]) -> Option<()> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(())
}

/// Bytes as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// How new spans are sampled: parent-based (a caller's sampled flag decides) or not, and the
/// share of trace ids sampled where no parent decides (`root`, 0 to 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    pub parent_based: bool,
    pub root: f64,
}

impl Default for Sampler {
    /// Parent-based, no new traces: callers that trace are followed; tokenmeter starts none of
    /// its own unless told (docs/tracing.md says why).
    fn default() -> Self {
        Sampler {
            parent_based: true,
            root: 0.0,
        }
    }
}

impl Sampler {
    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`, as the OpenTelemetry SDKs read
    /// them; `Err` names what is wrong. The `_ARG` of a ratio sampler defaults to 1.
    pub fn from_otel(name: &str, arg: Option<&str>) -> Result<Sampler, String> {
        let ratio = || -> Result<f64, String> {
            match arg {
                None => Ok(1.0),
                Some(a) => parse_ratio(a)
                    .ok_or_else(|| format!("OTEL_TRACES_SAMPLER_ARG {a:?} is not a ratio 0..1")),
            }
        };
        let (parent_based, root) = match name.trim() {
            "always_on" => (false, 1.0),
            "always_off" => (false, 0.0),
            "traceidratio" => (false, ratio()?),
            "parentbased_always_on" => (true, 1.0),
            "parentbased_always_off" => (true, 0.0),
            "parentbased_traceidratio" => (true, ratio()?),
            other => {
                return Err(format!(
                    "OTEL_TRACES_SAMPLER {other:?} is not a known sampler"
                ))
            }
        };
        Ok(Sampler { parent_based, root })
    }

    /// Whether a span with `trace_id` is sampled, given the caller's parent (if any).
    pub fn sampled(&self, parent: Option<&TraceParent>, trace_id: &[u8; 16]) -> bool {
        match parent {
            Some(p) if self.parent_based => p.sampled(),
            _ => ratio_admits(self.root, trace_id),
        }
    }
}

/// A ratio from 0 to 1 (`--trace-sample`, `OTEL_TRACES_SAMPLER_ARG`).
pub fn parse_ratio(s: &str) -> Option<f64> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|r| (0.0..=1.0).contains(r))
}

/// The trace-id-ratio rule: the trace id's last 8 bytes, read as a number, below `ratio` of
/// their range. Every process that sees the same trace id decides the same way.
fn ratio_admits(ratio: f64, trace_id: &[u8; 16]) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    let x = u64::from_be_bytes(low) >> 1;
    (x as f64) < ratio * (1u64 << 63) as f64
}

/// A request's place in a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub trace_id: [u8; 16],
    /// The caller's span (`traceparent`'s parent id); `None` when tokenmeter started the trace.
    pub parent_id: Option<[u8; 8]>,
    /// tokenmeter's span for the request, when it records one (sampled, with an exporter).
    pub span_id: Option<[u8; 8]>,
    /// The caller's `tracestate`, kept as sent (bounded), for the span.
    pub tracestate: Option<Box<str>>,
}

impl Trace {
    /// The `traceparent` to send upstream when tokenmeter records a span: the same trace, with
    /// tokenmeter's span as the parent, sampled. `None` when no span is recorded (the caller's
    /// header, if any, then goes upstream unchanged).
    pub fn traceparent(&self) -> Option<String> {
        let span = self.span_id?;
        Some(format!("00-{}-{}-01", hex(&self.trace_id), hex(&span)))
    }
}

/// What the request log and the span take from a request's head, read once when it arrives.
#[derive(Debug, Clone, PartialEq)]
pub struct Ident {
    /// The wall clock at the head's arrival (the span's start; the meter's durations are added
    /// to it).
    pub arrived: SystemTime,
    pub method: http::Method,
    /// The path, without the query string, control characters dropped, at most [`MAX_PATH`].
    pub path: Box<str>,
    /// `x-request-id`, sanitised: printable ASCII other than `"` and `\`, at most
    /// [`MAX_REQUEST_ID`]; `None` when absent or empty.
    pub request_id: Option<Box<str>>,
    /// The request's trace, when it has one (a caller's `traceparent`, or one started here).
    pub trace: Option<Trace>,
    /// The `host` (or `:authority`) the client addressed, bounded as the path: `server.address`.
    pub server_address: Option<Box<str>>,
    /// The value of `--workload-conversation-header`, hashed (the value itself is not kept):
    /// the workload trace numbers conversations by it.
    pub conversation: Option<u64>,
}

/// Reads an [`Ident`] off request heads, with the sampling rule of the process.
#[derive(Debug, Clone)]
pub struct Identify {
    /// `None`: no exporter, so no span is recorded; trace ids are still read for the log.
    pub sampler: Option<Sampler>,
    rng: Arc<ring::rand::SystemRandom>,
    /// `--workload-conversation-header`.
    conversation: Option<http::HeaderName>,
}

impl Identify {
    pub fn new(sampler: Option<Sampler>) -> Self {
        Identify {
            sampler,
            rng: Arc::new(ring::rand::SystemRandom::new()),
            conversation: None,
        }
    }

    /// Reads `header`'s value as the request's conversation (hashed).
    pub fn with_conversation(mut self, header: Option<http::HeaderName>) -> Self {
        self.conversation = header;
        self
    }

    /// The ident of a request whose head is `method`, `path` and `headers`, arrived now.
    pub fn of(&self, method: &http::Method, path: &str, headers: &HeaderMap) -> Arc<Ident> {
        self.of_uri(method, path, None, headers)
    }

    /// The same, with the URI's authority (HTTP/2's `:authority`), which wins over `host`.
    pub fn of_uri(
        &self,
        method: &http::Method,
        path: &str,
        authority: Option<&str>,
        headers: &HeaderMap,
    ) -> Arc<Ident> {
        let parent = headers
            .get("traceparent")
            .and_then(|v| TraceParent::parse(v.as_bytes()));
        let trace = self.trace(parent.as_ref(), headers);
        let authority = authority
            .or_else(|| {
                headers
                    .get(http::header::HOST)
                    .and_then(|v| v.to_str().ok())
            })
            .map(|h| bounded(h, MAX_PATH))
            .filter(|h| !h.is_empty());
        Arc::new(Ident {
            arrived: SystemTime::now(),
            method: method.clone(),
            path: bounded(path, MAX_PATH).into(),
            request_id: headers
                .get("x-request-id")
                .map(|v| request_id(v.as_bytes()))
                .filter(|id| !id.is_empty())
                .map(Into::into),
            trace,
            server_address: authority.map(Into::into),
            conversation: self.conversation.as_ref().and_then(|h| {
                use std::hash::{DefaultHasher, Hasher};
                let v = headers.get(h)?.as_bytes();
                let mut hasher = DefaultHasher::new();
                hasher.write(v);
                Some(hasher.finish())
            }),
        })
    }

    fn trace(&self, parent: Option<&TraceParent>, headers: &HeaderMap) -> Option<Trace> {
        let sampler = self.sampler;
        let trace_id = match (parent, sampler) {
            (Some(p), _) => p.trace_id,
            // No caller's trace, and none to start: nothing to log.
            (None, None) => return None,
            (None, Some(s)) if s.root <= 0.0 => return None,
            (None, Some(_)) => self.random::<16>()?,
        };
        let recorded = sampler.is_some_and(|s| s.sampled(parent, &trace_id));
        let span_id = if recorded { self.random::<8>() } else { None };
        let tracestate = match (span_id, headers.get("tracestate")) {
            (Some(_), Some(v)) => v
                .to_str()
                .ok()
                .filter(|s| s.len() <= MAX_TRACESTATE)
                .map(Into::into),
            _ => None,
        };
        if parent.is_none() && span_id.is_none() {
            // A trace id no span and no caller carries would name nothing.
            return None;
        }
        Some(Trace {
            trace_id,
            parent_id: parent.map(|p| p.parent_id),
            span_id,
            tracestate,
        })
    }

    /// Random bytes, never all zero (an invalid id); `None` if the system's source fails.
    fn random<const N: usize>(&self) -> Option<[u8; N]> {
        use ring::rand::SecureRandom;
        let mut b = [0u8; N];
        for _ in 0..4 {
            self.rng.fill(&mut b).ok()?;
            if b != [0; N] {
                return Some(b);
            }
        }
        None
    }
}

/// `s` without control characters, cut to at most `max` bytes at a character boundary.
fn bounded(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    for c in s.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(c);
    }
    out
}

/// An `x-request-id` value: printable ASCII without `"` or `\`, at most [`MAX_REQUEST_ID`].
fn request_id(raw: &[u8]) -> String {
    raw.iter()
        .copied()
        .filter(|b| b.is_ascii_graphic() && *b != b'"' && *b != b'\\')
        .take(MAX_REQUEST_ID)
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_read_exactly() {
        let p = TraceParent::parse(TP.as_bytes()).expect("valid");
        assert_eq!(hex(&p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&p.parent_id), "00f067aa0ba902b7");
        assert!(p.sampled());
        let p = TraceParent::parse(TP.replace("-01", "-00").as_bytes()).expect("valid");
        assert!(!p.sampled());
    }

    #[test]
    fn a_malformed_traceparent_is_absent() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    fn head(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    #[test]
    fn a_sampled_caller_is_followed_with_a_span_of_our_own() {
        let id = Identify::new(Some(Sampler::default()));
        let h = head(&[("traceparent", TP), ("tracestate", "congo=t61rcWkgMzE")]);
        let ident = id.of(&http::Method::POST, "/v1/chat/completions", &h);
        let t = ident.trace.as_ref().expect("traced");
        assert_eq!(hex(&t.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            t.parent_id.map(|p| hex(&p)).as_deref(),
            Some("00f067aa0ba902b7")
        );
        let span = t.span_id.expect("recorded");
        assert_ne!(span, [0; 8]);
        assert_eq!(t.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        assert_eq!(
            t.traceparent().as_deref(),
            Some(&*format!(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01",
                hex(&span)
            ))
        );
    }

    #[test]
    fn an_unsampled_caller_keeps_its_trace_id_for_the_log_and_gets_no_span() {
        let id = Identify::new(Some(Sampler::default()));
        let h = head(&[("traceparent", &TP.replace("-01", "-00"))]);
        let t = id
            .of(&http::Method::POST, "/", &h)
            .trace
            .clone()
            .expect("trace");
        assert_eq!(t.span_id, None);
        assert_eq!(t.traceparent(), None);
        // Without an exporter, no span either, whatever the flag.
        let id = Identify::new(None);
        let t = id.of(&http::Method::POST, "/", &head(&[("traceparent", TP)]));
        assert_eq!(t.trace.as_ref().and_then(|t| t.span_id), None);
    }

    #[test]
    fn new_traces_follow_the_ratio() {
        let h = HeaderMap::new();
        let never = Identify::new(Some(Sampler::default()));
        assert_eq!(never.of(&http::Method::POST, "/", &h).trace, None);
        let always = Identify::new(Some(Sampler {
            parent_based: true,
            root: 1.0,
        }));
        let t = always
            .of(&http::Method::POST, "/", &h)
            .trace
            .clone()
            .expect("new");
        assert_eq!(t.parent_id, None);
        assert!(t.span_id.is_some());
        // The ratio rule on the id's low bytes: exactly half of the range below 0.5.
        let mut id = [0u8; 16];
        id[8] = 0x7f;
        assert!(ratio_admits(0.5, &id));
        id[8] = 0x80;
        assert!(!ratio_admits(0.5, &id));
    }

    #[test]
    fn otel_sampler_variables_are_read_as_the_sdks_read_them() {
        let s = Sampler::from_otel("parentbased_traceidratio", Some("0.25")).expect("ok");
        assert_eq!(
            s,
            Sampler {
                parent_based: true,
                root: 0.25
            }
        );
        let s = Sampler::from_otel("always_on", None).expect("ok");
        assert_eq!(
            s,
            Sampler {
                parent_based: false,
                root: 1.0
            }
        );
        assert!(Sampler::from_otel("traceidratio", Some("2")).is_err());
        assert!(Sampler::from_otel("jaeger_remote", None).is_err());
        // Not parent-based: an unsampled caller is sampled by the ratio anyway.
        let p = TraceParent::parse(TP.replace("-01", "-00").as_bytes()).expect("valid");
        assert!(s.sampled(Some(&p), &p.trace_id));
    }

    #[test]
    fn request_id_and_path_are_bounded_and_clean() {
        let long = "a".repeat(300);
        let id = Identify::new(None);
        let h = head(&[("x-request-id", &format!("ab\"c\\d {long}"))]);
        let ident = id.of(&http::Method::GET, &format!("/v1/{long}"), &h);
        let rid = ident.request_id.as_deref().expect("id");
        assert!(rid.starts_with("abcd"));
        assert_eq!(rid.len(), MAX_REQUEST_ID);
        assert_eq!(ident.path.len(), MAX_PATH);
        assert_eq!(bounded("/é\u{7}x", 3), "/é");
    }
}
