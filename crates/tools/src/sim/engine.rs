//! The continuous-batching model: one decode loop for every sequence, as an inference server runs
//! one forward pass for its whole batch.
//!
//! Each step emits one token for every running sequence (or several: [`super::decoding`]) and
//! takes
//! `step_base + step_per_seq x batch + prefill_per_token x (uncached prompt tokens admitted this
//! step) + step_per_1k_kv_tokens x (context the running sequences hold) / 1000`: the share of a prompt the prefix cache serves ([`super::prefix`]) costs nothing, as a
//! cached block's KV is read rather than computed.
//! New requests wait in a FIFO queue and join at a step boundary while fewer than `max_batch`
//! sequences run, so a full batch shows up as queueing in TTFT, and a joining prompt's prefill
//! stalls everyone's next token, as it does on a server without chunked prefill.
//!
//! **Invariant:** there is one timer for the whole engine, not one per stream or per token: a step
//! costs one pass over the running sequences, which is what lets one core carry a thousand streams.
//! The engine never renders bytes; it bumps a per-sequence counter and wakes the response body,
//! which renders whatever tokens it has not written yet (a slow reader gets them coalesced into
//! one frame, so memory per stream stays constant).
//!
//! Steps are scheduled from the ideal end of the previous step, not from when the timer actually
//! fired, so the timer's millisecond granularity does not slow the modelled rate down.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
// Tokio's clock, so that tests can pause it and check the schedule exactly.
use tokio::time::Instant;

use super::account;
use super::decoding::{Decoding, SpecCounts, Steps};
use super::kv::{KvCache, KvConfig};
use super::model::Model;
use super::stall::Stall;

/// A step may start late by this much and the engine still keeps to its ideal schedule, running
/// the late steps back to back: the simulated GPU does not slow down because the host stalled the
/// simulator (a busy CI machine does that for tens of milliseconds at a time). A longer stall is
/// accepted as lost time, rather than answered with an unbounded burst; the batch it held up is
/// charged it in the accounts, equally ([`account::Accounts::stalled`]).
const MAX_CATCH_UP: Duration = Duration::from_millis(250);

/// What a request asks of the engine.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub prompt_tokens: u32,
    /// Of the prompt, the tokens served from the prefix cache: not charged prefill.
    pub cached_tokens: u32,
    /// Tokens to generate; at least 1.
    pub output_tokens: u32,
}

/// Tokens the engine has emitted for one sequence so far, and how long it queued and prefilled
/// (what vLLM states with `--enable-per-request-metrics`). Written by the engine, read by the
/// body.
#[derive(Debug)]
pub struct Progress {
    emitted: AtomicU32,
    /// Arrival to admission, in nanoseconds; [`UNSET`] until admitted.
    queue_ns: AtomicU64,
    /// Admission (the start of the step that runs its prefill) to the first token; [`UNSET`]
    /// until then. Stored before the first token's `emitted`, so a reader that sees a token
    /// sees it.
    prefill_ns: AtomicU64,
}

/// A time not measured yet.
const UNSET: u64 = u64::MAX;

impl Default for Progress {
    fn default() -> Self {
        Progress {
            emitted: AtomicU32::new(0),
            queue_ns: AtomicU64::new(UNSET),
            prefill_ns: AtomicU64::new(UNSET),
        }
    }
}

fn stored(v: &AtomicU64) -> Option<Duration> {
    let ns = v.load(Ordering::Acquire);
    (ns != UNSET).then(|| Duration::from_nanos(ns))
}

fn store(v: &AtomicU64, d: Duration) {
    v.store(
        u64::try_from(d.as_nanos()).unwrap_or(UNSET - 1),
        Ordering::Release,
    );
}

impl Progress {
    pub fn emitted(&self) -> u32 {
        self.emitted.load(Ordering::Acquire)
    }

    /// How long the sequence waited in the queue, once it was admitted.
    pub fn queue(&self) -> Option<Duration> {
        stored(&self.queue_ns)
    }

    /// From admission to the first token, once it came.
    pub fn prefill(&self) -> Option<Duration> {
        stored(&self.prefill_ns)
    }
}

/// The response side of a submitted job.
#[derive(Debug)]
pub struct Ticket {
    /// The request's number, as in `/sim/stats`.
    pub id: u64,
    /// Receives a wake-up whenever new tokens were emitted; closed when the sequence is done
    /// (or the engine stopped). Dropping it cancels the sequence.
    pub wake: mpsc::Receiver<()>,
    pub progress: Arc<Progress>,
    /// The sizes of its steps, in the state the engine's copy starts from: replayed by the
    /// body to cut the emitted tokens into one event per step.
    pub steps: Steps,
}

/// The engine stopped: no new job can be submitted.
#[derive(Debug, thiserror::Error)]
#[error("the simulated engine has stopped")]
pub struct Stopped;

/// Submits jobs to the decode loop.
#[derive(Debug)]
pub struct Engine {
    submit: mpsc::UnboundedSender<Seq>,
    next_id: AtomicU64,
    stats: Arc<Stats>,
    model: Model,
    stall: Option<Stall>,
    decoding: Decoding,
}

impl Engine {
    /// Starts the decode loop on the current runtime. It runs until the `Engine` is dropped and the
    /// last sequence has finished.
    pub fn start(model: Model, keep_records: usize) -> Self {
        Engine::start_with_stalls(model, keep_records, None)
    }

    /// [`Engine::start`], with some sequences pausing mid-stream (`--stall-every`).
    pub fn start_with_stalls(model: Model, keep_records: usize, stall: Option<Stall>) -> Self {
        Engine::start_with(model, keep_records, stall, None)
    }

    /// [`Engine::start_with_stalls`], with a KV cache of a given size (`--kv-cache-tokens`):
    /// sequences are admitted by its blocks and preempted when it is full ([`super::kv`]).
    /// `None`: memory is never short, and `max_batch` alone caps the batch.
    pub fn start_with(
        model: Model,
        keep_records: usize,
        stall: Option<Stall>,
        kv: Option<KvConfig>,
    ) -> Self {
        Engine::start_decoding(model, keep_records, stall, kv, Decoding::PLAIN)
    }

    /// [`Engine::start_with`], each step making the tokens `decoding` says
    /// (`--tokens-per-event`, `--spec-acceptance`).
    pub fn start_decoding(
        model: Model,
        keep_records: usize,
        stall: Option<Stall>,
        kv: Option<KvConfig>,
        decoding: Decoding,
    ) -> Self {
        Engine::start_caching(model, keep_records, stall, kv, decoding, false)
    }

    /// [`Engine::start_decoding`], with a prefix cache in front of it (either kind): its
    /// counters add the prompt tokens looked up in the cache and those it served
    /// ([`Counters::prefix_cache`]).
    pub fn start_caching(
        model: Model,
        keep_records: usize,
        stall: Option<Stall>,
        kv: Option<KvConfig>,
        decoding: Decoding,
        prefix_cache: bool,
    ) -> Self {
        let (submit, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(Stats::new(
            keep_records,
            decoding.is_speculative(),
            prefix_cache,
        ));
        tokio::spawn(decode_loop(model, rx, Arc::clone(&stats), kv));
        Engine {
            submit,
            next_id: AtomicU64::new(1),
            stats,
            model,
            stall,
            decoding,
        }
    }

    /// Queues a job. The first token comes after the queue, and the step that admits it.
    pub fn submit(&self, job: Job) -> Result<Ticket, Stopped> {
        self.submit_for(job, account::NONE)
    }

    /// Queues a job for a tenant ([`Stats::accounts`]): its share of every step it is in is
    /// accounted to that tenant.
    pub fn submit_for(&self, job: Job, tenant: account::TenantId) -> Result<Ticket, Stopped> {
        self.submit_seeded(job, tenant, 0)
    }

    /// [`Engine::submit_for`], the sizes of its steps drawn from `seed` (they matter only under
    /// speculative decoding: the same seed gives the same sizes).
    pub fn submit_seeded(
        &self,
        job: Job,
        tenant: account::TenantId,
        seed: u64,
    ) -> Result<Ticket, Stopped> {
        let steps = Steps::new(self.decoding, seed);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // Capacity 1: a pending wake-up already tells the body to look at the counter, so further
        // ones can be dropped (that is the coalescing).
        let (wake_tx, wake) = mpsc::channel(1);
        let progress = Arc::new(Progress::default());
        let now = Instant::now();
        self.stats.submitted(&job);
        self.submit
            .send(Seq {
                id,
                job: Job {
                    output_tokens: job.output_tokens.max(1),
                    ..job
                },
                wake: wake_tx,
                progress: Arc::clone(&progress),
                emitted: 0,
                arrived: now,
                admitted: None,
                first_token: None,
                last_token: None,
                model_decode: Duration::ZERO,
                stall: self.stall.and_then(|s| s.of_request(id)),
                blocks: 0,
                preemptions: 0,
                tenant,
                step_prefill: 0,
                steps: steps.clone(),
            })
            .map_err(|_| Stopped)?;
        Ok(Ticket {
            id,
            wake,
            progress,
            steps,
        })
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The tokens each step makes (`--tokens-per-event`, `--spec-acceptance`).
    pub fn decoding(&self) -> Decoding {
        self.decoding
    }
}

/// A sequence, as the decode loop sees it.
#[derive(Debug)]
struct Seq {
    id: u64,
    job: Job,
    wake: mpsc::Sender<()>,
    progress: Arc<Progress>,
    emitted: u32,
    arrived: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// The modelled duration of the steps after the first token: the decode time the model
    /// predicts for this sequence, to compare with what was measured.
    model_decode: Duration,
    /// `(after how many tokens, for how long)` this sequence leaves the batch once (`--stall-every`).
    stall: Option<(u32, Duration)>,
    /// KV-cache blocks held (0 without a cache, and while queued).
    blocks: u32,
    /// Times it was preempted: each re-admission recomputes what it had generated.
    preemptions: u32,
    /// Who its share of each step is accounted to.
    tenant: account::TenantId,
    /// Prompt tokens (or recomputed ones) the coming step prefills for it.
    step_prefill: u64,
    /// How many tokens each of its steps makes.
    steps: Steps,
}

impl Seq {
    /// Its prompt and what it has generated: the tokens whose KV it holds, or must recompute.
    fn context(&self) -> u64 {
        u64::from(self.job.prompt_tokens) + u64::from(self.emitted)
    }

    /// Its part of a step that prefills none of its prompt.
    fn part(&self) -> account::Part {
        account::Part {
            tenant: self.tenant,
            phase: if self.first_token.is_none() {
                account::Phase::Prefill
            } else {
                account::Phase::Decode
            },
            prefill_tokens: 0,
            kv_tokens: self.context(),
        }
    }
}

async fn decode_loop(
    model: Model,
    mut rx: mpsc::UnboundedReceiver<Seq>,
    stats: Arc<Stats>,
    kv: Option<KvConfig>,
) {
    let max_batch = model.max_batch.max(1);
    let mut kv = kv.map(KvCache::new);
    if let Some(cache) = &kv {
        stats.set_kv(cache.used(), cache.total(), cache.block_size());
    }
    let mut queue: VecDeque<Seq> = VecDeque::new();
    let mut running: Vec<Seq> = Vec::new();
    // Sequences out of the batch for a while (`--stall-every`), with the time they rejoin.
    let mut paused: Vec<(Instant, Seq)> = Vec::new();
    // The ideal end of the last step; None after the engine was idle.
    let mut clock: Option<Instant> = None;
    // Each step's sequences, for the accounts (one buffer, reused).
    let mut parts: Vec<account::Part> = Vec::new();
    let mut open = true;
    loop {
        if running.is_empty() && queue.is_empty() {
            clock = None;
            stats.set_load(0, 0);
            let rejoin = paused.iter().map(|(at, _)| *at).min();
            match (rejoin, open) {
                (None, false) => return,
                (None, true) => match rx.recv().await {
                    Some(s) => queue.push_back(s),
                    None => return,
                },
                (Some(at), false) => tokio::time::sleep_until(at).await,
                (Some(at), true) => {
                    tokio::select! {
                        s = rx.recv() => match s {
                            Some(s) => queue.push_back(s),
                            None => open = false,
                        },
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
            }
        }
        while let Ok(s) = rx.try_recv() {
            queue.push_back(s);
        }
        let now = Instant::now();
        if let Some(lost) = clock
            .map(|c| now.saturating_duration_since(c))
            .filter(|late| *late > MAX_CATCH_UP)
        {
            // Lost time: the batch held the engine all along, so its account has it, as a GPU's
            // would (the truth the proxy's split is tested against is wall time).
            parts.clear();
            parts.extend(running.iter().map(|s| s.part()));
            stats.accounts.stalled(lost, &parts);
        }
        // A paused sequence rejoins at the first step boundary after its pause, ahead of the queue
        // (it was admitted long ago), while the batch has room.
        let mut i = 0;
        while i < paused.len() {
            if paused[i].0 <= now && running.len() < max_batch {
                running.push(paused.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        let start = match clock {
            Some(c) if now.saturating_duration_since(c) <= MAX_CATCH_UP => c,
            _ => now,
        };
        // The running sequences' blocks for this step first, in the order they were admitted;
        // a full cache preempts the one admitted last (vLLM V1's rule, `super::kv`).
        if let Some(cache) = kv.as_mut() {
            let mut i = 0;
            while i < running.len() {
                let need = cache
                    .blocks_for(running[i].context())
                    .saturating_sub(running[i].blocks);
                if cache.take(need) {
                    running[i].blocks += need;
                    i += 1;
                    continue;
                }
                let Some(mut victim) = running.pop() else {
                    break;
                };
                cache.give(victim.blocks);
                victim.blocks = 0;
                victim.preemptions += 1;
                stats.preempted();
                queue.push_front(victim);
            }
        }
        let mut prefill = 0u64;
        while running.len() < max_batch {
            let Some(mut s) = queue.pop_front() else {
                break;
            };
            if s.wake.is_closed() {
                stats.finish(&s, SeqOutcome::Cancelled);
                continue;
            }
            if let Some(cache) = kv.as_mut() {
                let need = cache.blocks_for(s.context());
                if need > cache.total() {
                    // A context larger than the whole cache can never run (vLLM refuses such
                    // a prompt at its API): the request ends without an answer.
                    stats.finish(&s, SeqOutcome::Cancelled);
                    continue;
                }
                if !cache.take(need) {
                    // The head of the queue waits for memory, and so does everyone behind it.
                    queue.push_front(s);
                    break;
                }
                s.blocks = need;
            }
            if s.admitted.is_none() {
                s.admitted = Some(start);
                store(
                    &s.progress.queue_ns,
                    start.saturating_duration_since(s.arrived),
                );
            }
            s.step_prefill = u64::from(s.job.prompt_tokens.saturating_sub(s.job.cached_tokens));
            if s.preemptions > 0 {
                // Recomputed: what it had generated is prefilled again.
                s.step_prefill += u64::from(s.emitted);
            }
            prefill += s.step_prefill;
            running.push(s);
        }
        stats.set_load(running.len(), queue.len());
        if let Some(cache) = &kv {
            stats.set_kv(cache.used(), cache.total(), cache.block_size());
        }
        if running.is_empty() {
            // Only memory held by paused sequences can keep the queue's head out: wait for the
            // first of them to rejoin rather than spin.
            if let Some(at) = paused.iter().map(|(at, _)| *at).min() {
                tokio::time::sleep_until(at).await;
            }
            continue;
        }
        let kv_tokens: u64 = running.iter().map(|s| s.context()).sum();
        let step = model.step_with_context(running.len(), prefill, kv_tokens);
        parts.clear();
        parts.extend(running.iter_mut().map(|s| account::Part {
            prefill_tokens: std::mem::take(&mut s.step_prefill),
            ..s.part()
        }));
        stats.accounts.step(&model, &parts);
        let end = start + step;
        tokio::time::sleep_until(end).await;
        clock = Some(end);
        let t = Instant::now();
        let mut emitted = 0u64;
        let mut spec = SpecCounts::default();
        let mut pausing = Vec::new();
        running.retain_mut(|s| {
            let made = s.steps.next(s.job.output_tokens.saturating_sub(s.emitted));
            let before = s.emitted;
            s.emitted += made.tokens;
            emitted += u64::from(made.tokens);
            spec.add(made);
            if s.first_token.is_none() {
                s.first_token = Some(t);
                let admitted = s.admitted.unwrap_or(t);
                store(
                    &s.progress.prefill_ns,
                    t.saturating_duration_since(admitted),
                );
            } else {
                s.model_decode += step;
            }
            s.last_token = Some(t);
            s.progress.emitted.store(s.emitted, Ordering::Release);
            if s.wake.is_closed() {
                stats.finish(s, SeqOutcome::Cancelled);
                if let Some(cache) = kv.as_mut() {
                    cache.give(s.blocks);
                }
                return false;
            }
            // Recorded before the body is woken, so a client that has its last token can already
            // find the request in /sim/stats.
            let done = s.emitted >= s.job.output_tokens;
            if done {
                stats.finish(s, SeqOutcome::Complete);
                if let Some(cache) = kv.as_mut() {
                    cache.give(s.blocks);
                }
            }
            // Full: a wake-up is already pending. Closed: seen at the next step.
            let _ = s.wake.try_send(());
            // The step that reaches its stall point (with several tokens a step, the one that
            // passes it).
            let reached = |after: u32| before < after && s.emitted >= after;
            if let Some((_, pause)) = s.stall.filter(|(after, _)| !done && reached(*after)) {
                pausing.push((s.id, t + pause));
            }
            // Dropping a finished sequence (and its sender) tells the body it is complete.
            !done
        });
        for (id, until) in pausing {
            if let Some(i) = running.iter().position(|s| s.id == id) {
                paused.push((until, running.swap_remove(i)));
            }
        }
        if let Some(cache) = &kv {
            stats.set_kv(cache.used(), cache.total(), cache.block_size());
        }
        stats.step(emitted, spec);
    }
}

/// How a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SeqOutcome {
    /// Every requested token was emitted.
    Complete,
    /// The client went away first; the sequence left the batch at the next step.
    Cancelled,
}

/// What the engine did for one request, times in seconds since the engine started.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub id: u64,
    pub outcome: SeqOutcome,
    pub prompt_tokens: u32,
    /// Of the prompt, served from the prefix cache (not charged prefill).
    pub cached_tokens: u32,
    /// Tokens requested.
    pub target_tokens: u32,
    /// Tokens emitted.
    pub output_tokens: u32,
    pub arrived_s: f64,
    /// When the step that ran its prefill started (None: cancelled in the queue).
    pub admitted_s: Option<f64>,
    pub first_token_s: Option<f64>,
    pub last_token_s: Option<f64>,
    /// First token time minus arrival.
    pub ttft_s: Option<f64>,
    /// The decode time the model predicts: the sum of the modelled durations of the steps after
    /// the first token.
    pub model_decode_s: f64,
    /// Times it was preempted for memory (and recomputed).
    pub preemptions: u32,
}

/// Engine-wide counters and the most recent request records, for `/sim/stats`.
#[derive(Debug)]
pub struct Stats {
    origin: Instant,
    inner: Mutex<StatsInner>,
    /// Who each step worked for: the truth of GPU time by tenant (docs/cost.md).
    pub accounts: account::Accounts,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Counters {
    pub submitted: u64,
    pub completed: u64,
    pub cancelled: u64,
    pub output_tokens: u64,
    pub steps: u64,
    pub running: usize,
    pub queued: usize,
    pub max_running: usize,
    /// Sequences preempted for memory, each time (`vllm:num_preemptions_total`).
    pub preemptions: u64,
    /// With a KV cache: its blocks taken, its blocks in all and their size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_blocks: Option<KvBlocks>,
    /// Under speculative decoding (`--spec-acceptance`): drafts, draft tokens proposed and
    /// accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<SpecCounts>,
    /// With a prefix cache (either kind): the prompt tokens looked up in it and those it served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCounts>,
}

/// A prefix cache's lookups, in tokens, as vLLM counts them (`vllm:prefix_cache_queries_total`,
/// `vllm:prefix_cache_hits_total`): every prompt's tokens are queried once, when it arrives.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PrefixCounts {
    /// Prompt tokens looked up.
    pub queries: u64,
    /// Of them, served from the cache (its requests' `cached_tokens`).
    pub hits: u64,
}

/// The KV cache's blocks at the last step.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct KvBlocks {
    pub used: u32,
    pub total: u32,
    pub block_size: u32,
    /// The most ever taken at once.
    pub max_used: u32,
}

#[derive(Debug)]
struct StatsInner {
    counters: Counters,
    keep: usize,
    records: VecDeque<Record>,
}

/// What [`Stats`] holds at one moment: the body of `/sim/stats` (with the settings).
#[derive(Debug, Clone, Serialize)]
pub struct StatsReport {
    #[serde(flatten)]
    pub counters: Counters,
    /// The most recent finished requests, oldest first.
    pub requests: Vec<Record>,
}

impl Stats {
    fn new(keep: usize, speculative: bool, prefix_cache: bool) -> Self {
        Stats {
            origin: Instant::now(),
            accounts: account::Accounts::default(),
            inner: Mutex::new(StatsInner {
                counters: Counters {
                    spec: speculative.then(SpecCounts::default),
                    prefix_cache: prefix_cache.then(PrefixCounts::default),
                    ..Counters::default()
                },
                keep,
                records: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StatsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Seconds since the engine started: what the accounts' busy time and idle time add up to.
    pub fn uptime(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64()
    }

    fn submitted(&self, job: &Job) {
        let mut s = self.lock();
        s.counters.submitted += 1;
        if let Some(p) = s.counters.prefix_cache.as_mut() {
            p.queries += u64::from(job.prompt_tokens);
            p.hits += u64::from(job.cached_tokens);
        }
    }

    fn set_load(&self, running: usize, queued: usize) {
        let mut s = self.lock();
        s.counters.running = running;
        s.counters.queued = queued;
        s.counters.max_running = s.counters.max_running.max(running);
    }

    fn set_kv(&self, used: u32, total: u32, block_size: u32) {
        let mut s = self.lock();
        let max_used = s.counters.kv_blocks.map_or(0, |k| k.max_used).max(used);
        s.counters.kv_blocks = Some(KvBlocks {
            used,
            total,
            block_size,
            max_used,
        });
    }

    fn preempted(&self) {
        self.lock().counters.preemptions += 1;
    }

    /// A step made `tokens` tokens (over all its sequences), and under speculative decoding
    /// drafted and accepted `spec`.
    fn step(&self, tokens: u64, spec: SpecCounts) {
        let mut s = self.lock();
        s.counters.steps += 1;
        s.counters.output_tokens += tokens;
        if let Some(c) = s.counters.spec.as_mut() {
            c.drafts += spec.drafts;
            c.draft_tokens += spec.draft_tokens;
            c.accepted_tokens += spec.accepted_tokens;
        }
    }

    fn finish(&self, seq: &Seq, outcome: SeqOutcome) {
        let record = Record {
            id: seq.id,
            outcome,
            prompt_tokens: seq.job.prompt_tokens,
            cached_tokens: seq.job.cached_tokens,
            target_tokens: seq.job.output_tokens,
            output_tokens: seq.emitted,
            arrived_s: self.secs(seq.arrived),
            admitted_s: seq.admitted.map(|t| self.secs(t)),
            first_token_s: seq.first_token.map(|t| self.secs(t)),
            last_token_s: seq.last_token.map(|t| self.secs(t)),
            ttft_s: seq
                .first_token
                .map(|t| t.saturating_duration_since(seq.arrived).as_secs_f64()),
            model_decode_s: seq.model_decode.as_secs_f64(),
            preemptions: seq.preemptions,
        };
        let mut s = self.lock();
        match outcome {
            SeqOutcome::Complete => s.counters.completed += 1,
            SeqOutcome::Cancelled => s.counters.cancelled += 1,
        }
        if s.keep > 0 {
            if s.records.len() == s.keep {
                s.records.pop_front();
            }
            s.records.push_back(record);
        }
    }

    /// The counters and the kept records.
    pub fn report(&self) -> StatsReport {
        let s = self.lock();
        StatsReport {
            counters: s.counters.clone(),
            requests: s.records.iter().cloned().collect(),
        }
    }

    /// The counters alone (cheap).
    pub fn counters(&self) -> Counters {
        self.lock().counters.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::prefix::PrefixCache;

    fn model() -> Model {
        Model {
            step_base: Duration::from_millis(16),
            step_per_seq: Duration::from_micros(200),
            prefill_per_token: Duration::from_micros(50),
            step_per_1k_kv_tokens: Duration::ZERO,
            max_batch: 256,
        }
    }

    #[test]
    fn defaults_give_the_promised_speeds() {
        let m = model();
        assert_eq!(m.step(1, 0), Duration::from_micros(16_200));
        assert_eq!(m.step(128, 0), Duration::from_micros(41_600));
        assert_eq!(m.step(2, 1000), Duration::from_micros(16_400 + 50_000));
        assert!((m.request_tps(1) - 61.73).abs() < 0.01);
        assert!((m.aggregate_tps(128) - 3076.9).abs() < 0.1);
        // Beyond max_batch the extra requests queue: aggregate stays flat.
        assert_eq!(m.aggregate_tps(1000), m.aggregate_tps(256));
    }

    async fn drain(t: &mut Ticket) -> u32 {
        while t.wake.recv().await.is_some() {}
        t.progress.emitted()
    }

    /// The paused clock makes the schedule exact: this checks the model's arithmetic, not the
    /// machine's timer.
    #[tokio::test(start_paused = true)]
    async fn one_sequence_follows_the_model_exactly() {
        let e = Engine::start(model(), 10);
        let t0 = Instant::now();
        let mut t = e
            .submit(Job {
                prompt_tokens: 100,
                cached_tokens: 0,
                output_tokens: 10,
            })
            .expect("running");
        assert_eq!(drain(&mut t).await, 10);
        // First step: base + 1 seq + 100 prompt tokens; then 9 plain steps.
        let expect = Duration::from_micros(16_200 + 5_000 + 9 * 16_200);
        // Tokens leave when the timer fires, which is on tokio's 1 ms grid; the schedule itself
        // runs on the exact model times, so the error never accumulates past that one grid step.
        let grid = Duration::from_millis(1);
        assert!(t0.elapsed() >= expect && t0.elapsed() < expect + grid);
        let snap = e.stats().report();
        assert_eq!(snap.counters.completed, 1);
        assert_eq!(snap.counters.output_tokens, 10);
        let r = &snap.requests[0];
        assert_eq!((r.output_tokens, r.outcome), (10, SeqOutcome::Complete));
        assert!((r.model_decode_s - 9.0 * 0.0162).abs() < 1e-9);
        let ttft = r.ttft_s.expect("ttft");
        assert!((0.0212..0.0222).contains(&ttft), "{r:?}");
    }

    /// Three tokens a step: 10 tokens come in 4 steps (3, 3, 3, 1), each the model's step
    /// duration, and every count is of tokens. The body sees whole steps only.
    #[tokio::test(start_paused = true)]
    async fn several_tokens_a_step_finish_in_fewer_steps() {
        let e = Engine::start_decoding(model(), 10, None, None, Decoding::Fixed(3));
        let t0 = Instant::now();
        let mut t = e
            .submit(Job {
                prompt_tokens: 100,
                cached_tokens: 0,
                output_tokens: 10,
            })
            .expect("running");
        let mut seen = Vec::new();
        while t.wake.recv().await.is_some() {
            seen.push(t.progress.emitted());
        }
        assert_eq!(seen, [3, 6, 9, 10]);
        let expect = Duration::from_micros(16_200 + 5_000 + 3 * 16_200);
        let grid = Duration::from_millis(1);
        assert!(t0.elapsed() >= expect && t0.elapsed() < expect + grid);
        let snap = e.stats().report();
        assert_eq!((snap.counters.output_tokens, snap.counters.steps), (10, 4));
        assert_eq!(snap.requests[0].output_tokens, 10);
        assert!(snap.counters.spec.is_none());
        // The ticket's copy of the steps replays the engine's sizes.
        let mut replay = t.steps.clone();
        let sizes: Vec<u32> = [10, 7, 4, 1].map(|left| replay.next(left).tokens).into();
        assert_eq!(sizes, [3, 3, 3, 1]);
    }

    /// A stall point inside a step of several tokens: the step that passes it pauses the
    /// sequence (5 tokens, at three a step: after the sixth).
    #[tokio::test(start_paused = true)]
    async fn a_stall_point_inside_a_step_pauses_after_it() {
        let stall = Stall {
            every: 1,
            after_tokens: 5,
            pause: Duration::from_secs(1),
        };
        let m = Model {
            prefill_per_token: Duration::ZERO,
            ..model()
        };
        let e = Engine::start_decoding(m, 10, Some(stall), None, Decoding::Fixed(3));
        let t0 = Instant::now();
        let mut t = e
            .submit(Job {
                prompt_tokens: 1,
                cached_tokens: 0,
                output_tokens: 12,
            })
            .expect("running");
        let mut seen = Vec::new();
        while t.wake.recv().await.is_some() {
            seen.push((t.progress.emitted(), t0.elapsed()));
        }
        let tokens: Vec<u32> = seen.iter().map(|(n, _)| *n).collect();
        assert_eq!(tokens, [3, 6, 9, 12]);
        let gap = seen[2].1 - seen[1].1;
        assert!(gap >= Duration::from_secs(1), "{seen:?}");
        assert!(
            seen[1].1 - seen[0].1 < Duration::from_millis(20),
            "{seen:?}"
        );
    }

    /// Speculative decoding: the engine's draft tallies add up to what the steps made, and a
    /// ticket's steps replay the same sizes the engine drew for it.
    #[tokio::test(start_paused = true)]
    async fn speculative_steps_are_tallied_and_replayable() {
        let d = Decoding::Speculative {
            acceptance: 0.7,
            draft: 4,
        };
        let e = Engine::start_decoding(model(), 10, None, None, d);
        let job = Job {
            prompt_tokens: 1,
            cached_tokens: 0,
            output_tokens: 200,
        };
        let mut t = e.submit_seeded(job, account::NONE, 99).expect("running");
        let mut seen = vec![0];
        while t.wake.recv().await.is_some() {
            seen.push(t.progress.emitted());
        }
        let mut replay = t.steps.clone();
        let mut drafted = SpecCounts::default();
        for w in seen.windows(2) {
            let step = replay.next(200 - w[0]);
            assert_eq!(step.tokens, w[1] - w[0], "{seen:?}");
            drafted.add(step);
        }
        assert_eq!(*seen.last().expect("tokens"), 200);
        let snap = e.stats().report();
        let spec = snap.counters.spec.expect("speculative");
        assert_eq!(spec, drafted);
        assert_eq!(snap.counters.steps, seen.len() as u64 - 1);
        // Every step but the last drafted: its tokens are 1 + accepted.
        assert_eq!(spec.accepted_tokens + snap.counters.steps, 200);
        assert!(spec.drafts + 1 >= snap.counters.steps);
    }

    /// A cache of 4 blocks of 16 tokens and two sequences of a 16-token prompt and 40 tokens:
    /// both run while their contexts fit in two blocks each; when the first needs its third
    /// block (after 17 tokens each) the cache is full, and the second, admitted last, is
    /// preempted. It waits until the first is done (its 33-token context needs 3 blocks; 1 is
    /// free), then recomputes prompt and generated tokens (33) in one prefill and finishes its
    /// 40 tokens, none twice. The paused clock makes every step's time exact.
    #[tokio::test(start_paused = true)]
    async fn a_full_cache_preempts_the_last_admitted_which_recomputes_later() {
        let kv = KvConfig {
            tokens: 64,
            block_size: 16,
        };
        let e = Engine::start_with(model(), 10, None, Some(kv));
        let t0 = Instant::now();
        let job = Job {
            prompt_tokens: 16,
            cached_tokens: 0,
            output_tokens: 40,
        };
        let mut a = e.submit(job).expect("running");
        let mut b = e.submit(job).expect("running");
        assert_eq!(drain(&mut a).await, 40);
        assert_eq!(drain(&mut b).await, 40);
        let snap = e.stats().report();
        assert_eq!(snap.counters.preemptions, 1);
        assert_eq!(snap.counters.output_tokens, 80, "no token twice");
        let blocks = snap.counters.kv_blocks.expect("a cache");
        assert_eq!((blocks.total, blocks.max_used, blocks.used), (4, 4, 0));
        let by_id = |id| snap.requests.iter().find(|r| r.id == id).expect("recorded");
        let (ra, rb) = (by_id(a.id), by_id(b.id));
        assert_eq!((ra.preemptions, rb.preemptions), (0, 1));
        // Step 1: 16 ms + 2 x 0.2 ms + 32 prompt tokens x 0.05 ms = 18.0 ms; steps 2-17 both
        // decode (16.4 ms each); steps 18-40 the first alone (16.2 ms): its last token at
        // 653.0 ms. Then the second's recompute of 33 tokens (16.2 + 1.65 ms) and its 22 more
        // tokens (16.2 ms each): 1,027.25 ms.
        let at = |s: Option<f64>| s.expect("a last token") - t0_secs(&e, t0);
        assert!((at(ra.last_token_s) - 0.653).abs() < 0.001, "{ra:?}");
        assert!((at(rb.last_token_s) - 1.02725).abs() < 0.001, "{rb:?}");
    }

    /// Seconds from the stats' origin to `t0` (the stats time records from their origin).
    fn t0_secs(e: &Engine, t0: Instant) -> f64 {
        e.stats().secs(t0)
    }

    /// Without room for its whole context a sequence waits, and the queue keeps its order: of
    /// two 48-token prompts in a 64-token cache the second waits for the first to finish, and a
    /// 1-token prompt behind it waits too, though its one block was free meanwhile. Admitted
    /// beside the second, it is the one preempted when the second needs its fourth block.
    #[tokio::test(start_paused = true)]
    async fn a_prompt_waits_for_its_blocks_and_the_queue_keeps_its_order() {
        let kv = KvConfig {
            tokens: 64,
            block_size: 16,
        };
        let e = Engine::start_with(model(), 10, None, Some(kv));
        let big = Job {
            prompt_tokens: 48,
            cached_tokens: 0,
            output_tokens: 3,
        };
        let mut a = e.submit(big).expect("running");
        let mut b = e.submit(big).expect("running");
        let mut c = e
            .submit(Job {
                prompt_tokens: 1,
                ..big
            })
            .expect("running");
        for t in [&mut a, &mut b, &mut c] {
            assert_eq!(drain(t).await, 3);
        }
        let snap = e.stats().report();
        let r = |id| snap.requests.iter().find(|r| r.id == id).expect("recorded");
        let (ra, rb, rc) = (r(a.id), r(b.id), r(c.id));
        let admitted = |r: &Record| r.admitted_s.expect("admitted");
        let a_done = ra.last_token_s.expect("done");
        assert!(admitted(rb) >= a_done, "{rb:?}");
        assert!(
            admitted(rc) >= a_done,
            "the small prompt kept its place: {rc:?}"
        );
        assert_eq!((ra.preemptions, rb.preemptions, rc.preemptions), (0, 0, 1));
        assert_eq!(snap.counters.preemptions, 1);
        assert_eq!(snap.counters.output_tokens, 9);
    }

    /// Only the uncached share of a prompt is charged: with 75% of a 1000-token prompt cached,
    /// the admitting step prefills 250 tokens (12.5 ms at 50 us), not 1000 (50 ms).
    #[tokio::test(start_paused = true)]
    async fn a_cached_prompt_is_charged_only_its_uncached_tokens() {
        let e = Engine::start(model(), 10);
        let cache = PrefixCache::new(0.75).expect("valid");
        let job = cache.job(1000, 3);
        assert_eq!(job.cached_tokens, 750);
        let mut t = e.submit(job).expect("running");
        assert_eq!(drain(&mut t).await, 3);
        let snap = e.stats().report();
        let r = &snap.requests[0];
        assert_eq!((r.prompt_tokens, r.cached_tokens), (1000, 750));
        // First step: base + 1 seq + 250 x 50 us = 28.7 ms (uncached 1000 would be 66.2 ms). The
        // token leaves when the timer fires, on tokio's 1 ms grid, so within one grid step of it.
        let grid = Duration::from_millis(1);
        let first = Duration::from_micros(28_700);
        let prefill = t.progress.prefill().expect("first token");
        assert!(prefill >= first && prefill < first + grid, "{prefill:?}");
        assert!((r.ttft_s.expect("ttft") - 0.0287).abs() < 1e-3, "{r:?}");
        // Then two plain steps: the cache does not touch decode.
        assert!((r.model_decode_s - 2.0 * 0.0162).abs() < 1e-9, "{r:?}");
        assert_eq!(t.progress.queue(), Some(Duration::ZERO));
    }

    /// Two prompts admitted by one step: the step is charged the sum of their uncached tokens,
    /// and both see it (the step that prefills stalls everyone's token).
    #[tokio::test(start_paused = true)]
    async fn a_step_admitting_several_prompts_charges_their_uncached_sum() {
        let e = Engine::start(model(), 10);
        let cache = PrefixCache::new(0.5).expect("valid");
        // 601 cached 300 (301 charged), 200 cached 100 (100 charged): 401 x 50 us = 20.05 ms.
        let mut a = e.submit(cache.job(601, 1)).expect("running");
        let mut b = e.submit(cache.job(200, 1)).expect("running");
        assert_eq!((drain(&mut a).await, drain(&mut b).await), (1, 1));
        // Admitted apart, the first would see 31.25 ms: the 1 ms grid tells the two apart.
        let expect = Duration::from_micros(16_000 + 2 * 200 + 20_050);
        let grid = Duration::from_millis(1);
        for t in [&a, &b] {
            let p = t.progress.prefill().expect("first token");
            assert!(p >= expect && p < expect + grid, "{p:?}");
        }
        let snap = e.stats().report();
        let cached: Vec<u32> = snap.requests.iter().map(|r| r.cached_tokens).collect();
        assert_eq!(cached, [300, 100]);
    }

    /// With a prefix cache the counters add every prompt's tokens as queried and its cached
    /// ones as hits, when it is submitted; without one they are absent.
    #[tokio::test(start_paused = true)]
    async fn a_prefix_cache_counts_queried_and_hit_tokens() {
        let e = Engine::start_caching(model(), 10, None, None, Decoding::PLAIN, true);
        let cache = PrefixCache::new(0.5).expect("valid");
        let mut a = e.submit(cache.job(601, 1)).expect("running");
        let mut b = e.submit(cache.job(200, 1)).expect("running");
        assert_eq!((drain(&mut a).await, drain(&mut b).await), (1, 1));
        let p = e.stats().counters().prefix_cache;
        assert_eq!(
            p,
            Some(PrefixCounts {
                queries: 801,
                hits: 400
            })
        );
        let plain = Engine::start(model(), 10);
        assert_eq!(plain.stats().counters().prefix_cache, None);
    }

    /// Runs one 20-token job, stalling the engine's timer by `stall` after its first token;
    /// returns how long the job took, and the engine's busy seconds in its account.
    async fn with_stall(stall: Duration) -> (Duration, f64) {
        let m = Model {
            prefill_per_token: Duration::ZERO,
            ..model()
        };
        let e = Engine::start(m, 10);
        let t0 = Instant::now();
        let mut t = e
            .submit(Job {
                prompt_tokens: 1,
                cached_tokens: 0,
                output_tokens: 20,
            })
            .expect("running");
        t.wake.recv().await;
        // Jumping the paused clock is what a host stall looks like to the engine: its timer fires
        // late, all at once.
        tokio::time::advance(stall).await;
        assert_eq!(drain(&mut t).await, 20);
        (t0.elapsed(), e.stats().accounts.busy())
    }

    #[tokio::test(start_paused = true)]
    async fn short_stalls_are_caught_up_long_ones_are_lost() {
        let model_time = Duration::from_micros(20 * 16_200);
        let grid = Duration::from_millis(2);
        let (short, busy) = with_stall(Duration::from_millis(200)).await;
        assert!(
            short >= model_time && short < model_time + grid,
            "{short:?}"
        );
        assert!((busy - model_time.as_secs_f64()).abs() < 1e-9, "{busy}");
        // The lost time is the job's: the account is the wall time the engine was busy.
        let (long, busy) = with_stall(Duration::from_millis(400)).await;
        assert!(long > model_time + Duration::from_millis(300), "{long:?}");
        assert!(
            (busy - long.as_secs_f64()).abs() < grid.as_secs_f64(),
            "{busy} against {long:?}"
        );
    }

    /// `--stall-every 2`: request 2 leaves the batch after 5 tokens for 1 s, so request 1
    /// decodes alone (cheaper steps) meanwhile, and request 2's sixth token comes 1 s after its
    /// fifth plus the step that carries it.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_sequence_leaves_the_batch_for_its_pause() {
        let m = Model {
            prefill_per_token: Duration::ZERO,
            ..model()
        };
        let stall = Stall {
            every: 2,
            after_tokens: 5,
            pause: Duration::from_secs(1),
        };
        let e = Engine::start_with_stalls(m, 10, Some(stall));
        let t0 = Instant::now();
        let job = Job {
            prompt_tokens: 1,
            cached_tokens: 0,
            output_tokens: 100,
        };
        let mut one = e.submit(job).expect("running");
        let mut two = e.submit(job).expect("running");
        // Both join the first step, so both have 5 tokens after 5 steps of two sequences.
        let five = Duration::from_micros(5 * 16_400);
        tokio::time::sleep(five + Duration::from_micros(100)).await;
        assert_eq!((one.progress.emitted(), two.progress.emitted()), (5, 5));
        // During the pause request 1 runs alone: 16.2 ms steps.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let alone = one.progress.emitted() - 5;
        assert_eq!(alone, (500_000 / 16_200) as u32, "{alone}");
        assert_eq!(two.progress.emitted(), 5);
        assert_eq!(drain(&mut two).await, 100);
        assert_eq!(drain(&mut one).await, 100);
        // Request 2 rejoined at the first step boundary after t0 + 82 ms + 1 s.
        let r = e.stats().report();
        let two_rec = r.requests.iter().find(|r| r.id == 2).expect("request 2");
        assert!(
            two_rec.last_token_s.expect("done") > 1.0 + 0.082 + 95.0 * 0.0162,
            "{two_rec:?}"
        );
        assert!(t0.elapsed() > Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_queues_the_rest_fifo() {
        let m = Model {
            max_batch: 2,
            prefill_per_token: Duration::ZERO,
            ..model()
        };
        let e = Engine::start(m, 10);
        let mut tickets: Vec<Ticket> = (0..3)
            .map(|_| {
                e.submit(Job {
                    prompt_tokens: 1,
                    cached_tokens: 0,
                    output_tokens: 5,
                })
                .expect("running")
            })
            .collect();
        for t in &mut tickets {
            assert_eq!(drain(t).await, 5);
        }
        let snap = e.stats().report();
        assert_eq!(snap.counters.max_running, 2);
        let third = snap.requests.iter().find(|r| r.id == 3).expect("third");
        // It waited for the first two to finish their five steps of 16.4 ms.
        let admitted = third.admitted_s.expect("admitted") - third.arrived_s;
        assert!((admitted - 5.0 * 0.0164).abs() < 1e-6, "{admitted}");
        let ttft = third.ttft_s.expect("ttft");
        let expect = 5.0 * 0.0164 + 0.0162;
        assert!((expect..expect + 0.001).contains(&ttft), "{ttft}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_ticket_leaves_the_batch() {
        let e = Engine::start(model(), 10);
        let mut keep = e
            .submit(Job {
                prompt_tokens: 1,
                cached_tokens: 0,
                output_tokens: 50,
            })
            .expect("running");
        let mut gone = e
            .submit(Job {
                prompt_tokens: 1,
                cached_tokens: 0,
                output_tokens: 50,
            })
            .expect("running");
        // Read three tokens, then hang up.
        while gone.progress.emitted() < 3 {
            gone.wake.recv().await;
        }
        drop(gone);
        assert_eq!(drain(&mut keep).await, 50);
        let snap = e.stats().report();
        assert_eq!((snap.counters.completed, snap.counters.cancelled), (1, 1));
        let c = snap.requests.iter().find(|r| r.id == 2).expect("cancelled");
        assert_eq!(c.outcome, SeqOutcome::Cancelled);
        assert!(c.output_tokens < 50);
        assert_eq!(snap.counters.output_tokens, 50 + u64::from(c.output_tokens));
    }
}
