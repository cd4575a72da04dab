//! Replaying a workload trace (`tokenmeter bench --trace FILE`): each request of the trace is
//! sent at its own time, scaled by `--time-scale`, with its lengths and its shared prefixes, as
//! one open-loop level ([`Driver::run_schedule`](super::load::Driver::run_schedule)).
//!
//! **Bounded, whatever the trace.** The trace is read as it is replayed, never whole, on a
//! thread of its own (reading and building bodies never delays a send on the runtime), which
//! keeps at most [`READ_AHEAD`] requests built ahead of their due time; the reader
//! ([`crate::trace`]) holds its own bounded window to put the lines in order. A block's words are
//! drawn when a prompt needs them ([`RequestBuilder::blocks_prompt`]): nothing is kept per id.
//!
//! **A request.** It is due `at_ms x time_scale` after the replay's start (the first request at
//! once). Its prompt is exactly `input_length` words, one token each to the simulator: block `i`
//! the words of id `hash_ids[i]`, `--trace-block-tokens` of them, so requests whose blocks
//! have the same ids start with the same text, as the traced ones did. It asks for
//! `output_length` tokens with `ignore_eos`; a trace's `0` is sent as 1, since a server refuses
//! a limit of 0, and counted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::load::{Due, Schedule};
use super::prompt::RequestBuilder;
use crate::trace::{Request, TraceError, TraceReader};

/// Requests read and built ahead of their due time. Enough that a burst of that many requests
/// due at once is sent without waiting for the disk or for prompts to be built; few enough that
/// even 128k-token prompts (half a megabyte each) hold about 32 MB.
pub const READ_AHEAD: usize = 64;

/// The default of `--trace-block-tokens`: what tokenmeter's `--workload-block-tokens` writes
/// by default, and the Mooncake traces' block.
pub const DEFAULT_BLOCK_TOKENS: usize = 512;

/// How a trace is replayed: the validated `--trace` flags.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplaySettings {
    pub path: PathBuf,
    /// Multiplies every gap: 0.5 replays twice as fast. Finite, above 0.
    pub time_scale: f64,
    /// Stop after this many requests of the trace.
    pub max_requests: Option<u64>,
    /// The prompt tokens one entry of `hash_ids` stands for; at least 1.
    pub block_tokens: usize,
    /// `--duration`: no request due later than this (from the start) is sent.
    pub duration: Option<Duration>,
}

impl ReplaySettings {
    /// The level's name in the table, the files and the progress bar, e.g. `trace x0.5`.
    pub fn label(&self) -> String {
        format!("trace x{}", self.time_scale)
    }
}

/// When a request `at_ms` into the trace is due, from the replay's start, at `time_scale`.
pub fn due_offset(at_ms: f64, time_scale: f64) -> Duration {
    Duration::try_from_secs_f64(at_ms * time_scale / 1000.0).unwrap_or(Duration::MAX)
}

/// What the replay handed out to be sent, for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplayCounts {
    pub requests: u64,
    /// Asked for no output by the trace: sent with `max_tokens` 1.
    pub zero_output: u64,
    /// Out of order in the file beyond the reader's window, so sent as soon as read
    /// ([`TraceReader::late`]).
    pub late_in_trace: u64,
    /// The prompt and output tokens the trace states for them.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The trace's own times of the first and the last, milliseconds.
    pub first_ms: f64,
    pub last_ms: f64,
    /// The replay stopped at `--duration`, before the trace's end.
    pub cut_by_duration: bool,
}

impl ReplayCounts {
    /// The trace's own mean request rate over these requests (gaps over their span),
    /// requests/s; `None` below two requests or over no time.
    pub fn trace_rate(&self) -> Option<f64> {
        let span = (self.last_ms - self.first_ms) / 1000.0;
        (self.requests >= 2 && span > 0.0).then(|| (self.requests - 1) as f64 / span)
    }

    fn count(&mut self, b: &Built) {
        if self.requests == 0 {
            self.first_ms = b.at_ms;
        }
        self.last_ms = b.at_ms;
        self.requests += 1;
        self.zero_output += u64::from(b.output_length == 0);
        self.late_in_trace += u64::from(b.late);
        self.input_tokens += u64::from(b.input_length);
        self.output_tokens += u64::from(b.output_length);
    }
}

/// One request read and built.
struct Built {
    due: Due,
    at_ms: f64,
    input_length: u32,
    output_length: u32,
    /// The reader gave it out late: out of order beyond its window.
    late: bool,
}

/// A trace opened to be replayed: its reader, and its first request in hand.
pub struct Opened {
    reader: TraceReader,
    first: Request,
}

/// Opens the trace and reads its first request, which fills the reader's window: a trace that
/// cannot be opened, has no request, or has a bad line among its first
/// [`REORDER_LINES`](crate::trace::REORDER_LINES) fails here, before anything is sent.
pub fn open(settings: &ReplaySettings) -> Result<Opened, TraceError> {
    let reader = TraceReader::open(&settings.path, settings.max_requests)?;
    first_of(reader, &settings.path)
}

fn first_of(mut reader: TraceReader, path: &std::path::Path) -> Result<Opened, TraceError> {
    match reader.next() {
        Some(first) => Ok(Opened {
            first: first?,
            reader,
        }),
        None => Err(TraceError::Empty {
            path: path.to_path_buf(),
        }),
    }
}

/// A trace being replayed: the [`Schedule`] of an open-loop level.
pub struct Replay {
    built: mpsc::Receiver<Result<Built, TraceError>>,
    duration: Option<Duration>,
    counts: ReplayCounts,
    over: bool,
}

impl Replay {
    /// Starts reading the trace on a thread of its own, building each request's body with
    /// `requests` (its model, endpoint and seed) as the settings say.
    pub fn start(
        trace: Opened,
        requests: Arc<RequestBuilder>,
        settings: &ReplaySettings,
    ) -> std::io::Result<Replay> {
        let (tx, rx) = mpsc::channel(READ_AHEAD);
        let (scale, block) = (settings.time_scale, settings.block_tokens);
        std::thread::Builder::new()
            .name("trace-reader".into())
            .spawn(move || read(trace, &requests, block, scale, &tx))?;
        Ok(Replay {
            built: rx,
            duration: settings.duration,
            counts: ReplayCounts::default(),
            over: false,
        })
    }

    /// What has been handed out so far.
    pub fn counts(&self) -> ReplayCounts {
        self.counts
    }
}

/// The reading thread: builds and hands over each request until the trace ends, an error
/// (handed over too), or the replay no longer wants any.
fn read(
    trace: Opened,
    requests: &RequestBuilder,
    block_tokens: usize,
    time_scale: f64,
    tx: &mpsc::Sender<Result<Built, TraceError>>,
) {
    let Opened { mut reader, first } = trace;
    let build = |r: Request, late: bool| {
        let prompt =
            requests.blocks_prompt(r.input_length as usize, &r.hash_ids, block_tokens, r.line);
        Built {
            due: Due {
                offset: due_offset(r.at_ms, time_scale),
                body: requests.body_of(&prompt, u64::from(r.output_length.max(1))),
            },
            at_ms: r.at_ms,
            input_length: r.input_length,
            output_length: r.output_length,
            late,
        }
    };
    // The first is never late: nothing was given out before it.
    if tx.blocking_send(Ok(build(first, false))).is_err() {
        return;
    }
    loop {
        let before = reader.late();
        let built = match reader.next() {
            None => return,
            Some(Err(e)) => Err(e),
            Some(Ok(r)) => Ok(build(r, reader.late() > before)),
        };
        let failed = built.is_err();
        if tx.blocking_send(built).is_err() || failed {
            return;
        }
    }
}

impl Schedule for Replay {
    type Error = TraceError;

    async fn next_due(&mut self) -> Result<Option<Due>, TraceError> {
        if self.over {
            return Ok(None);
        }
        let built = match self.built.recv().await {
            Some(Ok(b)) => b,
            Some(Err(e)) => return Err(e),
            None => {
                self.over = true;
                return Ok(None);
            }
        };
        if self.duration.is_some_and(|d| built.due.offset >= d) {
            self.counts.cut_by_duration = true;
            self.over = true;
            // The reading thread stops at its next request.
            self.built.close();
            return Ok(None);
        }
        self.counts.count(&built);
        Ok(Some(built.due))
    }

    fn window(&self) -> Option<Duration> {
        self.duration.filter(|_| self.counts.cut_by_duration)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;
    use crate::bench::prompt::Endpoint;
    use std::io;
    use std::path::Path;

    fn builder() -> Arc<RequestBuilder> {
        Arc::new(RequestBuilder {
            endpoint: Endpoint::Completions,
            model: "m".into(),
            prompt_tokens: 0,
            shared_prefix_tokens: 0,
            output_tokens: 0,
            seed: 5,
        })
    }

    fn settings(time_scale: f64, duration: Option<Duration>) -> ReplaySettings {
        ReplaySettings {
            path: "t.jsonl".into(),
            time_scale,
            max_requests: None,
            block_tokens: 4,
            duration,
        }
    }

    fn opened(text: &str, settings: &ReplaySettings) -> Result<Opened, TraceError> {
        let reader = TraceReader::new(
            Path::new("t.jsonl"),
            io::Cursor::new(text.to_owned()),
            settings.max_requests,
        );
        first_of(reader, Path::new("t.jsonl"))
    }

    fn replay(text: &str, settings: &ReplaySettings) -> Replay {
        Replay::start(opened(text, settings).unwrap(), builder(), settings).unwrap()
    }

    /// Every request the replay hands out, until it ends or fails.
    async fn drain(r: &mut Replay) -> Result<Vec<Due>, TraceError> {
        let mut out = Vec::new();
        while let Some(d) = r.next_due().await? {
            out.push(d);
        }
        Ok(out)
    }

    fn prompt_of(d: &Due) -> String {
        let v: serde_json::Value = serde_json::from_slice(&d.body).unwrap();
        v["prompt"].as_str().unwrap().to_owned()
    }

    const TRACE: &str = "\
{\"timestamp\": 1000, \"input_length\": 10, \"output_length\": 3, \"hash_ids\": [0, 1, 2]}
{\"timestamp\": 1200, \"input_length\": 6, \"output_length\": 0, \"hash_ids\": [0, 7]}
{\"timestamp\": 2000, \"input_length\": 5, \"output_length\": 2}
";

    #[test]
    fn due_times_are_the_traces_scaled() {
        assert_eq!(due_offset(0.0, 0.5), Duration::ZERO);
        assert_eq!(due_offset(1000.0, 1.0), Duration::from_secs(1));
        assert_eq!(due_offset(1000.0, 0.5), Duration::from_millis(500));
        assert_eq!(due_offset(250.0, 4.0), Duration::from_secs(1));
        assert_eq!(due_offset(f64::MAX, 2.0), Duration::MAX);
    }

    #[tokio::test]
    async fn a_replay_hands_out_each_request_at_its_scaled_time_with_its_lengths() {
        let mut r = replay(TRACE, &settings(0.5, None));
        let due = drain(&mut r).await.unwrap();
        let offsets: Vec<Duration> = due.iter().map(|d| d.offset).collect();
        assert_eq!(
            offsets,
            [
                Duration::ZERO,
                Duration::from_millis(100),
                Duration::from_millis(500)
            ]
        );
        let bodies: Vec<serde_json::Value> = due
            .iter()
            .map(|d| serde_json::from_slice(&d.body).unwrap())
            .collect();
        let max: Vec<u64> = bodies
            .iter()
            .map(|b| b["max_tokens"].as_u64().unwrap())
            .collect();
        assert_eq!(max, [3, 1, 2], "an output of 0 is asked as 1");
        let words: Vec<usize> = due
            .iter()
            .map(|d| prompt_of(d).split(' ').count())
            .collect();
        assert_eq!(words, [10, 6, 5]);
        // Both start with block 0: four words alike, then block 1 and block 7 differ.
        let (a, b) = (prompt_of(&due[0]), prompt_of(&due[1]));
        assert_eq!(a[..16], b[..16]);
        assert_ne!(a[16..23], b[16..23]);
        let c = r.counts();
        assert_eq!(
            (c.requests, c.zero_output, c.input_tokens, c.output_tokens),
            (3, 1, 21, 5)
        );
        assert_eq!((c.first_ms, c.last_ms, c.late_in_trace), (0.0, 1000.0, 0));
        // Two gaps in one second of the trace.
        assert_eq!(c.trace_rate(), Some(2.0));
        assert_eq!(r.window(), None, "ran to the trace's end");
    }

    #[tokio::test]
    async fn the_duration_stops_the_replay_and_ends_the_window() {
        // At x1 the third request is due at 1 s: past a 900 ms bound.
        let mut r = replay(TRACE, &settings(1.0, Some(Duration::from_millis(900))));
        assert_eq!(drain(&mut r).await.unwrap().len(), 2);
        assert!(r.counts().cut_by_duration);
        assert_eq!(r.window(), Some(Duration::from_millis(900)));
        // --max-requests is the reader's limit.
        let s = ReplaySettings {
            max_requests: Some(1),
            ..settings(1.0, None)
        };
        let mut r = replay(TRACE, &s);
        assert_eq!(drain(&mut r).await.unwrap().len(), 1);
    }

    #[test]
    fn a_bad_line_in_the_readers_window_fails_before_anything_is_sent() {
        // The reader reads ahead to put lines in order: a bad line within its window fails
        // when the trace is opened, with the line's number.
        let text = format!("{TRACE}{{\"timestamp\": 3000}}\n");
        let err = opened(&text, &settings(1.0, None)).err().unwrap();
        assert!(
            err.to_string()
                .contains("t.jsonl: line 4: no \"input_length\""),
            "{err}"
        );
        let err = opened("\n", &settings(1.0, None)).err().unwrap();
        assert!(matches!(err, TraceError::Empty { .. }), "{err}");
        let missing = ReplaySettings {
            path: "/nonexistent/trace.jsonl".into(),
            ..settings(1.0, None)
        };
        assert!(matches!(open(&missing), Err(TraceError::Open { .. })));
    }

    /// Past the reader's window, a bad line reaches the replay, after the good ones.
    #[tokio::test]
    async fn a_bad_line_later_ends_the_replay_naming_it() {
        let mut text = String::new();
        for i in 0..crate::trace::REORDER_LINES + 5 {
            text.push_str(&format!(
                "{{\"timestamp\": {i}, \"input_length\": 2, \"output_length\": 1}}\n"
            ));
        }
        text.push_str("not json\n");
        let mut r = replay(&text, &settings(1.0, None));
        let mut good = 0;
        let err = loop {
            match r.next_due().await {
                Ok(Some(_)) => good += 1,
                Ok(None) => panic!("ended without the error"),
                Err(e) => break e,
            }
        };
        assert_eq!(good, 6, "the lines read before the window reached it");
        let line = crate::trace::REORDER_LINES + 6;
        assert!(
            err.to_string()
                .contains(&format!("line {line}: not a JSON object")),
            "{err}"
        );
    }
}
