//! Reading a workload trace: the Mooncake format that tokenmeter's `--workload-log` writes and
//! vLLM's `bench serve --dataset-name timed_trace` and GuideLLM's `mooncake` data kind read, one
//! JSON object per line:
//!
//! ```text
//! {"timestamp": 0, "input_length": 1030, "output_length": 64, "hash_ids": [0, 1, 2]}
//! ```
//!
//! `timestamp` is milliseconds (a number, or a string of digits as some published traces write
//! it); `input_length` and `output_length` are tokens; `hash_ids`, where present, name the
//! prompt's blocks (the same id, the same block under the same prefix); `class`, where present,
//! the SLO class the request was in. Other keys are kept where a tool uses them and otherwise
//! ignored.
//!
//! **Bounded, whatever the file.** The file is read line by line, never whole: a 10 GB trace
//! costs what its lines in hand cost. A line is at most [`MAX_LINE_BYTES`]; a longer one is an
//! error naming it, as are a line that is not a JSON object, a length that is not a
//! non-negative integer, and a prompt of no tokens.
//!
//! **Time.** Times are taken from the first request of the trace, so a trace of absolute times
//! (epoch milliseconds, long past) replays from its start. Lines may be out of order by up to
//! [`REORDER_LINES`] lines (tokenmeter writes a request that outlived its reordering hold after
//! later arrivals); they come out sorted. A line later than that window is given out when read,
//! at its own time, which has then passed: the replay sends it at once, and [`TraceReader::late`]
//! counts it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The longest line read: a 128k-token prompt's `hash_ids` in 16-token blocks is 8,000 ids of at
/// most 10 digits, about 90 KB; 1 MiB is ten times that, and bounds what one bad line costs.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Lines held to put a trace back in order: tokenmeter holds its own lines for a while before
/// writing (a request that ran longer lands after later arrivals), and some published traces are
/// sorted by another key. 4,096 lines of a few hundred bytes each are a megabyte or two.
pub const REORDER_LINES: usize = 4096;

/// The most prompt or output tokens one request may state: far beyond any model's context
/// today (10 million), so that a trace's typo cannot ask a replay for a prompt of gigabytes.
pub const MAX_TOKENS: u64 = 10_000_000;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Milliseconds from the trace's first request.
    pub at_ms: f64,
    pub input_length: u32,
    pub output_length: u32,
    /// The prompt's blocks; empty where the trace has none.
    pub hash_ids: Vec<u64>,
    /// The SLO class the request was in, where the trace names one (tokenmeter writes it where
    /// classes are configured).
    pub class: Option<String>,
    /// The line it was read from, 1-based.
    pub line: u64,
}

/// Why a trace cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("{path}: line {line}: {source}")]
    Io {
        path: PathBuf,
        line: u64,
        source: io::Error,
    },
    #[error("{path}: line {line} is longer than {MAX_LINE_BYTES} bytes")]
    TooLong { path: PathBuf, line: u64 },
    #[error("{path}: line {line}: {why}")]
    Line {
        path: PathBuf,
        line: u64,
        why: String,
    },
    #[error("{path} has no requests")]
    Empty { path: PathBuf },
}

/// A trace being read: an iterator of its requests in time order.
pub struct TraceReader {
    path: PathBuf,
    lines: Box<dyn BufRead + Send>,
    line: u64,
    /// Read ahead, the earliest first; ties keep the file's order.
    ahead: BinaryHeap<Reverse<Held>>,
    /// The first request's time, in the trace's own milliseconds.
    origin: Option<f64>,
    /// The time of the last request given out.
    last: f64,
    late: u64,
    limit: Option<u64>,
    given: u64,
    done: bool,
    buf: Vec<u8>,
}

/// A request held for ordering.
#[derive(Debug, Clone, PartialEq)]
struct Held(f64, u64, Request);

impl Eq for Held {}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

impl TraceReader {
    /// Opens `path`; `limit` stops after that many requests.
    pub fn open(path: &Path, limit: Option<u64>) -> Result<TraceReader, TraceError> {
        let file = File::open(path).map_err(|source| TraceError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(TraceReader::new(path, BufReader::new(file), limit))
    }

    /// Reads a trace from any reader; `path` names it in errors. Sendable, so that a replay
    /// can read on a thread of its own.
    pub fn new(path: &Path, read: impl Read + Send + 'static, limit: Option<u64>) -> TraceReader {
        TraceReader {
            path: path.to_path_buf(),
            lines: Box::new(BufReader::new(read)),
            line: 0,
            ahead: BinaryHeap::new(),
            origin: None,
            last: 0.0,
            late: 0,
            limit,
            given: 0,
            done: false,
            buf: Vec::new(),
        }
    }

    /// Requests given out after one of a later time: out of order beyond [`REORDER_LINES`].
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Reads every request (at most `limit`) into memory: for a caller that needs them all.
    pub fn read_all(path: &Path, limit: Option<u64>) -> Result<Vec<Request>, TraceError> {
        let all = TraceReader::open(path, limit)?.collect::<Result<Vec<_>, _>>()?;
        if all.is_empty() {
            return Err(TraceError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(all)
    }

    /// The next line's request, `None` at the end of the file; blank lines are skipped.
    fn read_line(&mut self) -> Result<Option<(f64, Request)>, TraceError> {
        loop {
            self.buf.clear();
            self.line += 1;
            let line = self.line;
            let n = (&mut self.lines)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|source| TraceError::Io {
                    path: self.path.clone(),
                    line,
                    source,
                })?;
            if n == 0 {
                return Ok(None);
            }
            if self.buf.len() > MAX_LINE_BYTES && self.buf.last() != Some(&b'\n') {
                return Err(TraceError::TooLong {
                    path: self.path.clone(),
                    line,
                });
            }
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return parse(&self.buf, line)
                .map(Some)
                .map_err(|why| TraceError::Line {
                    path: self.path.clone(),
                    line,
                    why,
                });
        }
    }

    /// Fills the read-ahead window.
    fn fill(&mut self) -> Result<(), TraceError> {
        while !self.done && self.ahead.len() < REORDER_LINES {
            match self.read_line()? {
                Some((at, request)) => {
                    let seq = request.line;
                    self.ahead.push(Reverse(Held(at, seq, request)));
                }
                None => self.done = true,
            }
        }
        Ok(())
    }
}

impl Iterator for TraceReader {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.limit.is_some_and(|l| self.given >= l) {
            return None;
        }
        if let Err(e) = self.fill() {
            self.done = true;
            self.ahead.clear();
            self.limit = Some(self.given);
            return Some(Err(e));
        }
        let Reverse(Held(at, _, mut request)) = self.ahead.pop()?;
        let origin = *self.origin.get_or_insert(at);
        let mut t = at - origin;
        if t < self.last {
            // Behind one already given out: its time has passed.
            self.late += 1;
            t = self.last;
        }
        self.last = t;
        request.at_ms = t;
        self.given += 1;
        Some(Ok(request))
    }
}

/// One line: its time in the trace's own milliseconds, and the request.
fn parse(bytes: &[u8], line: u64) -> Result<(f64, Request), String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JSON object ({e})"))?;
    let Value::Object(o) = value else {
        return Err("not a JSON object".into());
    };
    let at = match o.get("timestamp") {
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
        None => return Err("no \"timestamp\"".into()),
        _ => None,
    }
    .filter(|t| t.is_finite() && *t >= 0.0)
    .ok_or("\"timestamp\" is not a non-negative number of milliseconds")?;
    let tokens = |key: &str| -> Result<u32, String> {
        let v = o.get(key).ok_or_else(|| format!("no {key:?}"))?;
        let n = v
            .as_u64()
            .ok_or_else(|| format!("{key:?} is not a non-negative integer: {v}"))?;
        if n > MAX_TOKENS {
            return Err(format!("{key:?} is {n}, over {MAX_TOKENS} tokens"));
        }
        Ok(n as u32)
    };
    let input_length = tokens("input_length")?;
    let output_length = tokens("output_length")?;
    if input_length == 0 {
        return Err("\"input_length\" is 0: a request needs a prompt".into());
    }
    let hash_ids = match o.get("hash_ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|v| v.as_u64())
            .collect::<Option<Vec<u64>>>()
            .ok_or("\"hash_ids\" holds something other than non-negative integers")?,
        Some(_) => return Err("\"hash_ids\" is not an array".into()),
    };
    let class = match o.get("class") {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) => Some(c.clone()),
        Some(_) => return Err("\"class\" is not a string".into()),
    };
    Ok((
        at,
        Request {
            at_ms: at,
            input_length,
            output_length,
            hash_ids,
            class,
            line,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Vec<Result<Request, String>> {
        TraceReader::new(Path::new("t.jsonl"), io::Cursor::new(text.to_owned()), None)
            .map(|r| r.map_err(|e| e.to_string()))
            .collect()
    }

    fn ok(text: &str) -> Vec<Request> {
        read(text)
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("a good trace")
    }

    #[test]
    fn a_trace_is_read_from_its_first_request() {
        let t = ok(concat!(
            "{\"timestamp\": 1700000000000, \"input_length\": 600, \"output_length\": 10, \"hash_ids\": [0, 1]}\n",
            "\n",
            "{\"timestamp\": \"1700000000250\", \"input_length\": 3, \"output_length\": 0, \"class\": \"batch\"}\n",
        ));
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].class.as_deref(), t[1].class.as_deref()),
            (None, Some("batch"))
        );
        assert_eq!(
            (t[0].at_ms, t[0].input_length, t[0].hash_ids.clone()),
            (0.0, 600, vec![0, 1])
        );
        assert_eq!((t[1].at_ms, t[1].output_length, t[1].line), (250.0, 0, 3));
    }

    #[test]
    fn small_disorder_is_sorted_and_large_disorder_is_late() {
        let t = ok(
            "{\"timestamp\": 20, \"input_length\": 1, \"output_length\": 1}\n\
                    {\"timestamp\": 10, \"input_length\": 2, \"output_length\": 1}\n\
                    {\"timestamp\": 30, \"input_length\": 3, \"output_length\": 1}\n",
        );
        let order: Vec<(f64, u32)> = t.iter().map(|r| (r.at_ms, r.input_length)).collect();
        assert_eq!(order, vec![(0.0, 2), (10.0, 1), (20.0, 3)]);

        let mut text = String::new();
        for i in 0..REORDER_LINES + 10 {
            text.push_str(&format!(
                "{{\"timestamp\": {}, \"input_length\": 1, \"output_length\": 1}}\n",
                1000 + i
            ));
        }
        text.push_str("{\"timestamp\": 5, \"input_length\": 9, \"output_length\": 1}\n");
        let mut r = TraceReader::new(Path::new("t"), io::Cursor::new(text), None);
        let all: Vec<Request> = r.by_ref().map(|x| x.expect("ok")).collect();
        assert_eq!(r.late(), 1);
        assert_eq!(all.len(), REORDER_LINES + 11);
        // Given out as soon as it is read, at the time of the one before: never going back.
        let i = all
            .iter()
            .position(|r| r.input_length == 9)
            .expect("the late one");
        assert_eq!(all[i].at_ms, all[i - 1].at_ms);
        assert!(all.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    }

    #[test]
    fn broken_lines_are_errors_naming_the_line() {
        let cases = [
            ("not json\n", "line 1: not a JSON object"),
            ("[1, 2]\n", "line 1: not a JSON object"),
            (
                "{\"timestamp\": 0, \"input_length\": -5, \"output_length\": 1}\n",
                "\"input_length\" is not a non-negative integer: -5",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 2.5, \"output_length\": 1}\n",
                "\"input_length\" is not a non-negative integer",
            ),
            (
                "{\"timestamp\": -1, \"input_length\": 5, \"output_length\": 1}\n",
                "\"timestamp\" is not a non-negative number",
            ),
            (
                "{\"input_length\": 5, \"output_length\": 1}\n",
                "no \"timestamp\"",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1}\n",
                "a request needs a prompt",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 99999999999, \"output_length\": 1}\n",
                "over 10000000 tokens",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1, -2]}\n",
                "\"hash_ids\" holds",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"class\": 3}\n",
                "\"class\" is not a string",
            ),
        ];
        for (text, want) in cases {
            let got = read(text);
            assert_eq!(got.len(), 1, "{text}");
            let err = got[0].clone().expect_err(text);
            assert!(err.contains(want), "{text}: {err}");
        }
        // An error ends the trace: nothing after it is read.
        let got = read("{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\nbad\n");
        assert!(got.len() == 1 && got[0].is_err(), "{got:?}");
    }

    #[test]
    fn a_huge_line_is_refused_without_reading_it_whole() {
        // An endless line without a newline: the reader stops past the limit.
        let endless = io::repeat(b'x').take(64 << 20);
        let mut r = TraceReader::new(Path::new("big"), endless, None);
        let err = r.next().expect("an item").expect_err("too long");
        assert!(err.to_string().contains("longer than"), "{err}");
        assert!(r.next().is_none());
    }

    #[test]
    fn the_limit_stops_the_reading() {
        let mut text = String::new();
        for i in 0..100 {
            text.push_str(&format!(
                "{{\"timestamp\": {i}, \"input_length\": 1, \"output_length\": 1}}\n"
            ));
        }
        let r = TraceReader::new(Path::new("t"), io::Cursor::new(text), Some(7));
        assert_eq!(r.count(), 7);
        assert!(matches!(
            TraceReader::read_all(Path::new("/nonexistent/trace"), None),
            Err(TraceError::Open { .. })
        ));
    }
}
