//! A request counted with the model's tokenizer (`--tokenizer`), for what no usage report gives.
//!
//! Inspection starts a [`Counting`] as the request is sent: the model's tokenizer and a slot
//! the prompt's count lands in. The prompt is tokenized on threads of its own while the body is
//! already on its way, so tokenizing never delays a byte; its count is there long before the
//! first token in practice, and gives the TTFT its prompt band then. As the response streams,
//! the reader keeps the text of its token-bearing events (bounded,
//! [`crate::read::transcript`]). When the request ends, [`Counting::settle`] runs on the
//! tokenizing threads before the request is recorded:
//!
//! - the prompt: the stream's usage stands where it came, and is checked against the count
//!   here; where it did not (the client left, the upstream failed, a server that never reports),
//!   the count here is the request's input tokens;
//! - the output: the same, by the text the response streamed. Counted events are replaced by
//!   the tokenizer's count (`source="tokenizer"`); usage and per-event token ids stand;
//! - tokens per event: each event's tokens by where its text ends, unless the stream's own
//!   count per event is exact (token ids).
//!
//! The text is dropped once counted; nothing of it is logged.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::protocol::TokenSource;
use crate::ratelog::{RateLimited, LOG_PERIOD};
use crate::read::Transcript;
use crate::record::Finished;
use crate::tokenize::{Count, Tokenizer};

/// The most tokenizing jobs queued or running at once, over the whole process: a prompt or an
/// answer past this is not counted by the tokenizer (its request keeps what the stream says), so
/// a burst of long prompts cannot queue without bound, each holding its body. 256 jobs of a few
/// milliseconds each are a second of work for a core: far beyond what a steady load needs, and
/// bounded in memory by 256 bodies.
pub const MAX_JOBS: usize = 256;

/// Threads that tokenize: as many as the machine has cores, at most this many. Threads of their
/// own, not tokio's blocking pool: that pool starts a thread for every job it cannot hand to an
/// idle one (up to 512), and a burst of 8,000 streams left hundreds of threads' stacks resident
/// (4 KiB more per open stream in the loopback benchmark). Tokenizing is CPU-bound: more
/// threads than cores only queue in the kernel instead of here.
pub const MAX_THREADS: usize = 4;

static JOBS: AtomicUsize = AtomicUsize::new(0);

/// A place among [`MAX_JOBS`], taken before a job is built and given back when the job is done:
/// a request that finds none keeps what it has, and is recorded where it is.
pub struct Place(());

impl Place {
    /// A place, if one is free.
    pub fn take() -> Option<Place> {
        JOBS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_JOBS).then_some(n + 1)
        })
        .ok()
        .map(|_| Place(()))
    }

    /// Runs `job` on the tokenizing threads (inline where none could be started), then gives
    /// the place back.
    pub fn run(self, job: impl FnOnce() + Send + 'static) {
        let work: Work = Box::new(move || {
            job();
            drop(self);
        });
        if let Some(tx) = queue() {
            // The places bound the queue: a send never waits for room, and only fails with
            // every thread gone, when the job is run here instead.
            match tx.send(work) {
                Ok(()) => {}
                Err(std::sync::mpsc::SendError(work)) => work(),
            }
        } else {
            work();
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        JOBS.fetch_sub(1, Ordering::AcqRel);
    }
}

type Work = Box<dyn FnOnce() + Send>;

/// The tokenizing threads' queue, started with the first job; `None` if no thread could be.
fn queue() -> Option<&'static Sender<Work>> {
    static QUEUE: OnceLock<Option<Sender<Work>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = channel::<Work>();
            let rx = Arc::new(Mutex::new(rx));
            let threads = std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .clamp(1, MAX_THREADS);
            let mut started = 0;
            for i in 0..threads {
                let rx = Arc::clone(&rx);
                let spawned = std::thread::Builder::new()
                    .name(format!("tokenize-{i}"))
                    .spawn(move || loop {
                        // One waits on the queue at a time; the lock is not held while working.
                        let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        match next {
                            Ok(work) => work(),
                            Err(_) => return,
                        }
                    });
                started += usize::from(spawned.is_ok());
            }
            (started > 0).then_some(tx)
        })
        .as_ref()
}

/// Where a check's two counts stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    pub direction: Direction,
    pub equal: bool,
}

/// Which count was checked: `direction` of `tokenmeter_tokenizer_checks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Input,
    Output,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Input => "input",
            Direction::Output => "output",
        }
    }
}

/// An output count off by more than this share of the usage report is worth a warning; less
/// is what re-encoding the text costs (a split the model sampled that is not the canonical
/// one; the random-weight e2e model is off by a few percent), no sign of a wrong tokenizer.
const OUTPUT_WARN_SHARE: f64 = 0.10;

/// The warning that a tokenizer's counts differ from the engine's, at most once a minute per
/// direction.
pub struct Mismatches(RateLimited<Direction>);

impl Default for Mismatches {
    fn default() -> Self {
        Mismatches(RateLimited::new(LOG_PERIOD))
    }
}

impl Mismatches {
    fn warn(&self, direction: Direction, model: &str, ours: u64, stated: u64) {
        if let Some(held_back) = self.0.check(direction, Instant::now()) {
            tracing::warn!(
                direction = direction.as_str(),
                model,
                tokenizer = ours,
                usage = stated,
                held_back,
                "the tokenizer's count differs from the server's usage: is --tokenizer the model's own?"
            );
        }
    }
}

/// One request's counting: its tokenizer and its prompt's count, once known.
pub struct Counting {
    tokenizer: Arc<Tokenizer>,
    prompt: Arc<PromptSlot>,
    /// The prompt's job was queued (a place was free).
    started: bool,
}

/// How long settling a request waits for its prompt's job, still running on another tokenizing
/// thread (a short request that ended while its long prompt was being cut into blocks): far
/// longer than any prompt under the size limit takes, and only ever spent on a tokenizing
/// thread, after the response has ended.
const PROMPT_WAIT: Duration = Duration::from_millis(100);

/// What is done with a prompt's count as soon as it is known.
type OnPrompt = Box<dyn FnOnce(Count) + Send>;

/// A prompt's count, once the job set it, and who waits for it.
#[derive(Default)]
struct PromptSlot {
    count: OnceLock<Option<Count>>,
    /// Its blocks named by their prefixes, when asked for (`--workload-log`); set before the
    /// count.
    blocks: OnceLock<Arc<[u64]>>,
    then: Mutex<Option<OnPrompt>>,
}

impl PromptSlot {
    /// Hands the count to whoever waits, once: the job and the waiter may come in either order.
    fn deliver(&self) {
        let Some(Some(count)) = self.count.get().copied() else {
            return;
        };
        let then = self.then.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(f) = then {
            f(count);
        }
    }
}

/// What settling a request learnt, for the meter to record with it.
#[derive(Debug, Default)]
pub struct Settled {
    /// The counts checked against the stream's usage.
    pub checks: Vec<Check>,
    /// Tokens per event to observe, when the tokenizer's are the best known.
    pub per_event: Option<Vec<u32>>,
}

impl Counting {
    /// Starts counting a request sent to `path` with `body`: its prompt is tokenized on the
    /// tokenizing threads, unless [`MAX_JOBS`] are queued or running (then it is not counted).
    /// With `blocks`, the prompt is also cut into blocks of that many tokens, for the workload
    /// trace.
    pub fn start(
        tokenizer: Arc<Tokenizer>,
        path: &str,
        body: Bytes,
        blocks: Option<usize>,
    ) -> Counting {
        let prompt = Arc::new(PromptSlot::default());
        let place = Place::take();
        let started = place.is_some();
        if let Some(place) = place {
            let (tok, slot, path) = (Arc::clone(&tokenizer), Arc::clone(&prompt), path.to_owned());
            place.run(move || {
                let count = match blocks {
                    Some(b) => tok.prompt_blocks(&path, &body, b).map(|(count, ids)| {
                        let _ = slot.blocks.set(ids.into());
                        count
                    }),
                    None => tok.prompt_tokens(&path, &body),
                };
                let _ = slot.count.set(count);
                slot.deliver();
            });
        }
        Counting {
            tokenizer,
            prompt,
            started,
        }
    }

    /// The prompt's tokens, once counted (`None` before, or for a body that has none).
    pub fn prompt(&self) -> Option<Count> {
        self.prompt.count.get().copied().flatten()
    }

    /// Waits, at most [`PROMPT_WAIT`], for the prompt's job to end, if it was started.
    fn wait_for_prompt(&self) {
        if !self.started {
            return;
        }
        let deadline = Instant::now() + PROMPT_WAIT;
        while self.prompt.count.get().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Calls `f` with the prompt's count as soon as it is known (now, if it is), on whichever
    /// thread knows it first; never, for a prompt not counted.
    pub fn on_prompt(&self, f: impl FnOnce(Count) + Send + 'static) {
        *self.prompt.then.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(f));
        self.prompt.deliver();
    }

    /// Settles `f`'s counts with the tokenizer's (see the module doc); `transcript` is the text
    /// its response streamed, `token_ids` whether the stream gave exact counts per event.
    pub fn settle(
        &self,
        f: &mut Finished,
        transcript: Option<&Transcript>,
        token_ids: bool,
        mismatches: &Mismatches,
    ) -> Settled {
        let mut settled = Settled::default();
        self.wait_for_prompt();
        match (f.input_tokens, self.prompt()) {
            (Some(stated), Some(ours)) if ours.exact => {
                settled.checks.push(Check {
                    direction: Direction::Input,
                    equal: stated == ours.tokens,
                });
                if stated != ours.tokens {
                    mismatches.warn(Direction::Input, &f.model, ours.tokens, stated);
                }
            }
            (None, Some(ours)) => {
                f.input_tokens = Some(ours.tokens);
                f.input_estimated = !ours.exact;
            }
            _ => {}
        }
        if let Some(blocks) = self.prompt.blocks.get().filter(|b| !b.is_empty()) {
            f.prompt_blocks = Some(Arc::clone(blocks));
        }
        let Some(t) = transcript.filter(|t| !t.incomplete && !t.ends.is_empty()) else {
            return settled;
        };
        let out = self.tokenizer.output_tokens(&t.text, &t.ends);
        if !out.exact {
            return settled;
        }
        match f.token_source {
            TokenSource::Usage => {
                let stated = f.output_tokens;
                settled.checks.push(Check {
                    direction: Direction::Output,
                    equal: stated == out.tokens,
                });
                let off = out.tokens.abs_diff(stated) as f64;
                if off > OUTPUT_WARN_SHARE * stated.max(1) as f64 {
                    mismatches.warn(Direction::Output, &f.model, out.tokens, stated);
                }
            }
            TokenSource::Counted => {
                f.output_tokens = out.tokens;
                f.token_source = TokenSource::Tokenizer;
            }
            TokenSource::TokenIds | TokenSource::Tokenizer => {}
        }
        if !token_ids {
            settled.per_event = Some(out.per_event);
        }
        settled
    }
}
