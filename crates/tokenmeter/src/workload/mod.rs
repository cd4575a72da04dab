//! The workload trace (`--workload-log FILE|-`): one line per request for generation, in the
//! Mooncake trace format that replay tools read (vLLM's `bench serve --dataset-name
//! timed_trace`, GuideLLM's `mooncake` data, `tokenmeter bench --trace`): when it arrived, its
//! prompt and output lengths in tokens, its prompt's blocks by shared prefix (with
//! `--tokenizer`), how long it took, its conversation, model, class and outcome ([`mod@line`]).
//! It is the user's own traffic, to replay anywhere and to ask the capacity model "what if" of
//! (`tokenmeter capacity --trace`), with no prompt text in it.
//!
//! **Off the request path.** The request's thread copies a few facts of its record
//! ([`line::Entry`]) into a bounded queue ([`QUEUE_ENTRIES`]); a full queue drops the entry and
//! counts it (`tokenmeter_workload_log_dropped_total`), so no request waits for the file. A
//! writer thread of its own numbers the blocks and conversations (`ids`), puts lines in
//! arrival order and writes them in batches ([`crate::logfile`]: reopened on SIGHUP).
//!
//! **In arrival order.** Requests end in another order than they arrive. The writer holds each
//! entry until [`HOLD`] after its arrival (or until [`MAX_HELD`] are held), then writes the
//! earliest first: a request that took longer than the hold lands after later arrivals, and
//! readers must allow that (tokenmeter's own re-sort a window). On shutdown, after the drain,
//! everything held is written ([`WorkloadLog::close`]).

mod ids;
pub mod line;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::IntCounter;

use crate::logfile::{Destination, LineFile};
use crate::record::{Finished, Sink};

use self::ids::FirstSight;
use self::line::{Entry, Kept};

/// Entries the queue holds before new ones are dropped: about 200 bytes each, so at most
/// 1 MiB, a few seconds of a busy proxy's requests while the disk stalls.
pub const QUEUE_ENTRIES: usize = 4096;

/// How long an entry is held to put lines in arrival order: longer than most requests take (a
/// long answer at a slow speed: 2,000 tokens at 70 tokens/s is under 30 s).
pub const HOLD: Duration = Duration::from_secs(30);

/// The most entries held at once, whatever their age: at 1,000 requests a second, 16 s of them;
/// about 3 MiB.
pub const MAX_HELD: usize = 16_384;

/// How often the writer takes the queue's entries and writes those whose hold is over. The
/// queue fills in a tick only past [`QUEUE_ENTRIES`] / `TICK` requests a second (80,000).
const TICK: Duration = Duration::from_millis(50);

/// Lines written before each flush.
const BATCH_LINES: usize = 256;

/// `--workload-log`'s settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadConfig {
    pub destination: Destination,
    /// `--workload-block-tokens`: the tokens a `hash_ids` entry stands for.
    pub block_tokens: usize,
    /// `--workload-conversation-header`: the header whose value names a conversation.
    pub conversation_header: Option<http::HeaderName>,
    /// How long an entry is held for ordering: [`HOLD`] (shorter in tests, which cannot wait).
    pub hold: Duration,
}

/// The default `--workload-block-tokens`: the Mooncake traces' block, which the replay tools
/// take by default (vLLM's `--timed-trace-chunk-hash-size 512`, GuideLLM's block size).
pub const DEFAULT_BLOCK_TOKENS: usize = 512;

/// The trace's counters.
#[derive(Clone)]
pub struct Counters {
    pub written: IntCounter,
    pub dropped: IntCounter,
    pub skipped: IntCounter,
}

enum Message {
    Entry(Entry),
    /// Write everything held, then say so.
    Close(mpsc::Sender<()>),
}

/// The trace's sending half: a [`Sink`] the meter hands every finished record.
pub struct WorkloadLog {
    tx: SyncSender<Message>,
    counters: Counters,
    /// The writer, until closed.
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl WorkloadLog {
    /// Opens the destination and starts the writer thread; fails only when the file cannot be
    /// opened (the caller exits 64, naming the flag).
    pub fn open(cfg: &WorkloadConfig, counters: Counters) -> io::Result<WorkloadLog> {
        let out = LineFile::open(&cfg.destination, "workload log")?;
        let (tx, rx) = mpsc::sync_channel(QUEUE_ENTRIES);
        let writer = Writer {
            out,
            counters: counters.clone(),
            block_tokens: cfg.block_tokens.max(1) as u64,
            hold: cfg.hold,
            held: BinaryHeap::new(),
            seq: 0,
            origin: None,
            blocks: FirstSight::default(),
            conversations: FirstSight::default(),
        };
        let handle = std::thread::Builder::new()
            .name("workload-log".into())
            .spawn(move || writer.run(rx))?;
        Ok(WorkloadLog {
            tx,
            counters,
            writer: Mutex::new(Some(handle)),
        })
    }

    /// Writes every entry held and waits for it, at most `deadline`: at shutdown, after the
    /// drain, so the last requests' lines are not lost with the process.
    pub fn close(&self, deadline: Duration) {
        let (ack, done) = mpsc::channel();
        if self.tx.send(Message::Close(ack)).is_ok() {
            let _ = done.recv_timeout(deadline);
        }
        let handle = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(handle);
    }
}

impl Sink for WorkloadLog {
    fn finished(&self, f: &Finished, at: Instant) {
        match line::kept(f) {
            Kept::Yes => {}
            Kept::Skipped => return self.counters.skipped.inc(),
            Kept::NotWorkload => return,
        }
        match self.tx.try_send(Message::Entry(Entry::of(f, at))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.dropped.inc()
            }
        }
    }
}

/// An entry held for ordering: the earliest arrival first; ties in the order they came.
struct Held(Instant, u64, Entry);

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.0, self.1) == (other.0, other.1)
    }
}

impl Eq for Held {}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(other.0, other.1))
    }
}

/// The writer thread's state.
struct Writer {
    out: LineFile,
    counters: Counters,
    block_tokens: u64,
    hold: Duration,
    held: BinaryHeap<Reverse<Held>>,
    seq: u64,
    /// The arrival line times count from: the first request written to this file.
    origin: Option<Instant>,
    blocks: FirstSight,
    conversations: FirstSight,
}

impl Writer {
    /// Wakes every [`TICK`] and takes what the queue holds: nothing is held for less than
    /// the hold anyway, and a writer that never blocks on the queue costs a request's thread
    /// no wake-up of another (a sleeping receiver must be woken by each send).
    fn run(mut self, rx: Receiver<Message>) {
        loop {
            std::thread::sleep(TICK);
            loop {
                match rx.try_recv() {
                    Ok(Message::Entry(e)) => self.hold(e),
                    Ok(Message::Close(ack)) => {
                        self.release(None);
                        let _ = ack.send(());
                        return;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return self.release(None),
                }
            }
            self.release(Some(Instant::now()));
        }
    }

    fn hold(&mut self, e: Entry) {
        self.seq += 1;
        self.held.push(Reverse(Held(e.arrived, self.seq, e)));
    }

    /// Writes the entries whose hold is over at `now` (all of them with `None`), the earliest
    /// first.
    fn release(&mut self, now: Option<Instant>) {
        if self.out.reopen_if_asked() {
            // A new file: its times count from its own first line.
            self.origin = None;
        }
        let mut lines: Vec<String> = Vec::new();
        while let Some(Reverse(Held(arrived, _, _))) = self.held.peek() {
            let due = match now {
                None => true,
                Some(now) => self.held.len() > MAX_HELD || *arrived + self.hold <= now,
            };
            if !due {
                break;
            }
            let Some(Reverse(Held(_, _, e))) = self.held.pop() else {
                break;
            };
            let origin = *self.origin.get_or_insert(e.arrived);
            lines.push(e.line(
                origin,
                self.block_tokens,
                &mut self.blocks,
                &mut self.conversations,
            ));
            if lines.len() >= BATCH_LINES {
                self.write(&mut lines);
            }
        }
        self.write(&mut lines);
    }

    fn write(&mut self, lines: &mut Vec<String>) {
        if lines.is_empty() {
            return;
        }
        let n = lines.len() as u64;
        match self.out.write_batch(lines.iter().map(String::as_str)) {
            Ok(()) => self.counters.written.inc_by(n),
            Err(_) => self.counters.dropped.inc_by(n),
        }
        lines.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::finished;

    fn counters() -> Counters {
        let c = |n: &str| IntCounter::new(n, "t").expect("counter");
        Counters {
            written: c("w"),
            dropped: c("d"),
            skipped: c("s"),
        }
    }

    #[test]
    fn lines_come_out_in_arrival_order_and_all_of_them_at_close() {
        let dir = std::env::temp_dir().join(format!("tokenmeter-workload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("trace.jsonl");
        let cfg = WorkloadConfig {
            destination: Destination::File(path.clone()),
            block_tokens: 512,
            conversation_header: None,
            hold: HOLD,
        };
        let counters = counters();
        let log = WorkloadLog::open(&cfg, counters.clone()).expect("open");
        let t0 = Instant::now();
        // Three requests ending in another order than they arrived (arrivals at 0, 100, 200 ms).
        for (arrived_ms, took_ms, input) in [(200, 100, 3), (0, 1000, 1), (100, 300, 2)] {
            let f = Finished {
                input_tokens: Some(input),
                duration: Duration::from_millis(took_ms),
                ..finished()
            };
            log.finished(&f, t0 + Duration::from_millis(arrived_ms + took_ms));
        }
        let shed = Finished {
            outcome: crate::record::Outcome::Shed,
            ..finished()
        };
        log.finished(&shed, t0);
        // Held (30 s): nothing is written before the close.
        log.close(Duration::from_secs(10));
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        let got: Vec<(u64, u64)> = lines
            .iter()
            .map(|v| {
                (
                    v["timestamp"].as_u64().expect("ms"),
                    v["input_length"].as_u64().expect("n"),
                )
            })
            .collect();
        assert_eq!(got, vec![(0, 1), (100, 2), (200, 3)]);
        assert_eq!(counters.written.get(), 3);
        assert_eq!(counters.skipped.get(), 1);
        assert_eq!(counters.dropped.get(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
