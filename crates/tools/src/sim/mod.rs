//! `tokenmeter sim`: a simulated inference server, the test instrument behind the demo and the
//! benchmarks.
//!
//! It serves an OpenAI-compatible API (and, with `--api`, Anthropic's, Ollama's or TGI's) and
//! behaves like continuous batching on a GPU ([`engine`]): every decode step emits one token for
//! each running request (or several, [`decoding`]) and takes `step_base + step_per_seq x batch`, prefill costs time per
//! prompt token (less what the prefix cache serves: a fixed share with `--prefix-cache-hit-rate`,
//! the blocks earlier prompts left with `--prefix-cache-tokens`), and past
//! `--max-batch` requests queue. It is deterministic given `--seed` (the
//! tokens and lengths depend only on the seed and the request, see [`text`]) and exact about what
//! it sent: `GET /sim/stats` reports its own per-request timestamps. The modules:
//!
//! - [`engine`]: the decode loop and its performance [`Model`].
//! - [`prefix`]: the prefix cache, the share of a prompt that costs no prefill.
//! - [`decoding`]: `--tokens-per-event` and `--spec-acceptance`, the tokens one step (and one
//!   event) carries.
//! - [`http`]: routes, request handling, the streaming body.
//! - [`wire`]: reading requests and writing responses, one file per [`Dialect`].
//! - [`text`]: the seeded generator, vocabulary and length distribution.
//! - [`stall`]: `--stall-every`, a few responses pausing mid-stream (for the capacity fit's tests).

pub mod account;
pub mod decoding;
pub mod engine;
pub mod http;
pub mod kv;
pub mod metrics;
pub mod model;
pub mod prefix;
pub mod stall;
pub mod text;
pub mod wire;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::net::TcpListener;

pub use decoding::Decoding;
use engine::{Engine, Stats};
pub use model::Model;
use prefix::{parse_hit_rate, PrefixLookup, PREFIX_BLOCK_TOKENS};
pub use prefix::{PrefixCache, PrefixCaching};
pub use stall::Stall;
use text::Lengths;
use tokenmeter::units::parse_duration;
pub use wire::Dialect;

/// The simulator's flags. Every one also reads a `TOKENMETER_SIM_*` environment variable.
#[derive(Debug, Clone, Args)]
pub struct SimArgs {
    /// Where to serve.
    #[arg(long, env = "TOKENMETER_SIM_LISTEN", default_value = "127.0.0.1:8000")]
    pub listen: String,

    /// The API to speak besides OpenAI's (which is always served).
    #[arg(long, env = "TOKENMETER_SIM_API", value_enum, default_value_t = Dialect::Openai)]
    pub api: Dialect,

    /// Model name reported when a request names none (a request's own `model` is echoed).
    #[arg(long, env = "TOKENMETER_SIM_MODEL", default_value = "tokenmeter-sim")]
    pub model: String,

    /// Fixed cost of one decode step (at least 1ms, the timer's resolution).
    #[arg(long, env = "TOKENMETER_SIM_STEP_BASE", default_value = "16ms", value_parser = parse_duration)]
    pub step_base: Duration,

    /// Cost added to a decode step per running request.
    #[arg(long, env = "TOKENMETER_SIM_STEP_PER_SEQ", default_value = "0.2ms", value_parser = parse_duration)]
    pub step_per_seq: Duration,

    /// Prefill cost per prompt token (prompt tokens are estimated at 4 characters each).
    #[arg(long, env = "TOKENMETER_SIM_PREFILL_PER_TOKEN", default_value = "0.05ms", value_parser = parse_duration)]
    pub prefill_per_token: Duration,

    /// Cost added to a decode step per 1,000 tokens of context the running requests hold
    /// (prompt and output so far): attention reads every sequence's KV cache each step. 0 (the
    /// default) leaves the step independent of context.
    #[arg(long = "step-per-1k-kv-tokens", env = "TOKENMETER_SIM_STEP_PER_1K_KV_TOKENS", default_value = "0ms", value_parser = parse_duration)]
    pub step_per_1k_kv_tokens: Duration,

    /// Share of every prompt's tokens served from the prefix cache, 0 to 1: floor(prompt x R)
    /// tokens are not charged --prefill-per-token, and the usage states them as cached. Not
    /// with --prefix-cache-tokens.
    #[arg(long, env = "TOKENMETER_SIM_PREFIX_CACHE_HIT_RATE", default_value = "0", value_parser = parse_hit_rate, value_name = "R")]
    pub prefix_cache_hit_rate: PrefixCache,

    /// A prefix cache learnt from the prompts, holding N tokens (0: none), as vLLM's automatic
    /// prefix caching: a prompt's text is cut into blocks of 16 tokens (64 characters), each
    /// keyed by its text and every block before it; its leading blocks that earlier prompts left
    /// in the cache (at most all its tokens but the last) are not charged --prefill-per-token,
    /// and the usage states them as cached. The least recently used blocks are evicted. Not
    /// with --prefix-cache-hit-rate.
    #[arg(
        long,
        env = "TOKENMETER_SIM_PREFIX_CACHE_TOKENS",
        default_value_t = 0,
        value_name = "N"
    )]
    pub prefix_cache_tokens: u32,

    /// Requests decoded at once; the rest wait in a FIFO queue (visible in TTFT). Also read as
    /// --max-num-seqs, vLLM's name for it.
    #[arg(
        long,
        alias = "max-num-seqs",
        env = "TOKENMETER_SIM_MAX_BATCH",
        default_value_t = 256
    )]
    pub max_batch: usize,

    /// The KV cache's size in tokens: sequences are admitted only when their blocks fit,
    /// queue otherwise, and the last admitted is preempted (and later recomputed) when a
    /// running one needs a block and none is free, as vLLM V1 schedules. Unset: memory is never
    /// short.
    #[arg(long, env = "TOKENMETER_SIM_KV_CACHE_TOKENS", value_name = "N")]
    pub kv_cache_tokens: Option<u32>,

    /// Tokens per KV-cache block (vLLM's --block-size).
    #[arg(long, env = "TOKENMETER_SIM_BLOCK_SIZE", default_value_t = kv::DEFAULT_BLOCK_SIZE, value_name = "B")]
    pub block_size: u32,

    /// Output length when the request sets no limit: N, or MIN-MAX drawn uniformly. A request's
    /// max_tokens (max_completion_tokens, num_predict, max_new_tokens) is honoured exactly.
    #[arg(long, env = "TOKENMETER_SIM_OUTPUT_TOKENS", default_value = "32-512")]
    pub output_tokens: Lengths,

    /// Tokens every decode step makes for a request, so every token-bearing event carries (the
    /// last one of a request the rest): as vLLM's --stream-interval, or an engine that sends
    /// several tokens at once. A request of L tokens finishes in ceil(L / N) steps; the usage
    /// states the true count. Not with --spec-acceptance.
    #[arg(
        long,
        env = "TOKENMETER_SIM_TOKENS_PER_EVENT",
        default_value_t = 1,
        value_name = "N"
    )]
    pub tokens_per_event: u32,

    /// Speculative decoding: each step drafts --spec-tokens tokens, each accepted with
    /// probability R (0 to 1) until the first rejection, and the step's event carries 1 +
    /// accepted tokens ((1 - R^(K+1)) / (1 - R) on average), seeded by --seed. /metrics adds
    /// vLLM's vllm:spec_decode_* counters. Not with --tokens-per-event above 1.
    #[arg(long, env = "TOKENMETER_SIM_SPEC_ACCEPTANCE", value_name = "R", value_parser = decoding::parse_acceptance)]
    pub spec_acceptance: Option<f64>,

    /// Draft tokens proposed per step under --spec-acceptance (vLLM's num_speculative_tokens).
    #[arg(
        long,
        env = "TOKENMETER_SIM_SPEC_TOKENS",
        default_value_t = 4,
        value_name = "K"
    )]
    pub spec_tokens: u32,

    /// Seed of everything generated: the same seed and request give the same tokens.
    #[arg(long, env = "TOKENMETER_SIM_SEED", default_value_t = 0)]
    pub seed: u64,

    /// Finished requests kept for GET /sim/stats (the oldest are dropped).
    #[arg(long, env = "TOKENMETER_SIM_STATS_KEEP", default_value_t = 10_000)]
    pub stats_keep: usize,

    /// Runtime worker threads (default: one per core).
    #[arg(long, env = "TOKENMETER_SIM_THREADS")]
    pub threads: Option<usize>,

    /// Every Nth request pauses once mid-stream (0: none), leaving the batch meanwhile, as a
    /// preempted sequence does: outliers for the capacity fit to ignore.
    #[arg(
        long,
        env = "TOKENMETER_SIM_STALL_EVERY",
        default_value_t = 0,
        value_name = "N"
    )]
    pub stall_every: u64,

    /// Tokens a stalling request emits before its pause.
    #[arg(
        long,
        env = "TOKENMETER_SIM_STALL_AFTER",
        default_value_t = 10,
        value_name = "TOKENS"
    )]
    pub stall_after: u32,

    /// How long a stalling request pauses.
    #[arg(long, env = "TOKENMETER_SIM_STALL_FOR", default_value = "1s", value_parser = parse_duration)]
    pub stall_for: Duration,

    /// Put vLLM's per-request `metrics` object (queue, prefill and generation time, as the
    /// simulated engine timed them, and under --spec-acceptance the request's drafts) on the
    /// usage chunk of OpenAI streams, as vLLM does with the same flag.
    #[arg(long, env = "TOKENMETER_SIM_ENABLE_PER_REQUEST_METRICS")]
    pub enable_per_request_metrics: bool,

    /// The header whose value names a request's tenant in the engine's own account of GPU
    /// time (`tokenmeter_sim_gpu_seconds_total{tenant}` on /metrics): the truth tokenmeter's
    /// `--tenant-header` estimate is held against.
    #[arg(
        long,
        env = "TOKENMETER_SIM_TENANT_HEADER",
        default_value = "x-tenant",
        value_name = "NAME"
    )]
    pub tenant_header: hyper::header::HeaderName,
}

/// The validated simulator settings.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub listen: SocketAddr,
    pub api: Dialect,
    pub model_name: String,
    pub model: Model,
    /// `--prefix-cache-hit-rate` or `--prefix-cache-tokens`.
    pub prefix_cache: PrefixCaching,
    pub lengths: Lengths,
    pub seed: u64,
    pub stats_keep: usize,
    pub threads: Option<usize>,
    /// `--stall-every`: `None` when no request stalls.
    pub stall: Option<Stall>,
    /// `--enable-per-request-metrics`.
    pub per_request_metrics: bool,
    /// `--kv-cache-tokens` and `--block-size`; `None` without a cache size.
    pub kv: Option<kv::KvConfig>,
    /// `--tenant-header`.
    pub tenant_header: hyper::header::HeaderName,
    /// `--tokens-per-event` or `--spec-acceptance`: the tokens each step makes.
    pub decoding: Decoding,
}

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("--listen {0:?} is not a valid address (expected HOST:PORT, e.g. 127.0.0.1:8000)")]
    BadAddress(String),
    #[error("--step-base must be at least 1ms (the timer's resolution), got {0:?}")]
    StepTooShort(Duration),
    #[error("--{0} must be at least 1")]
    Zero(&'static str),
    #[error(
        "--spec-acceptance and --tokens-per-event {0} are two ways of sizing an event: give one"
    )]
    SpecWithFixed(u32),
    #[error("--kv-cache-tokens {tokens} holds no whole block of --block-size {block_size}")]
    NoBlock { tokens: u32, block_size: u32 },
    #[error(
        "--prefix-cache-hit-rate and --prefix-cache-tokens are two kinds of prefix cache: give one"
    )]
    TwoPrefixCaches,
    #[error("--prefix-cache-tokens {0} holds no whole block of {PREFIX_BLOCK_TOKENS} tokens")]
    NoPrefixBlock(u32),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

impl SimError {
    /// True for errors the user fixes by changing the flags.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            SimError::BadAddress(_)
                | SimError::StepTooShort(_)
                | SimError::Zero(_)
                | SimError::SpecWithFixed(_)
                | SimError::NoBlock { .. }
                | SimError::TwoPrefixCaches
                | SimError::NoPrefixBlock(_)
        )
    }
}

impl Default for SimConfig {
    /// The defaults of the flags, on an ephemeral loopback port.
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            api: Dialect::Openai,
            model_name: "tokenmeter-sim".to_string(),
            model: Model {
                step_base: Duration::from_millis(16),
                step_per_seq: Duration::from_micros(200),
                prefill_per_token: Duration::from_micros(50),
                step_per_1k_kv_tokens: Duration::ZERO,
                max_batch: 256,
            },
            prefix_cache: PrefixCaching::default(),
            lengths: Lengths { min: 32, max: 512 },
            seed: 0,
            stats_keep: 10_000,
            threads: None,
            stall: None,
            per_request_metrics: false,
            kv: None,
            tenant_header: hyper::header::HeaderName::from_static("x-tenant"),
            decoding: Decoding::PLAIN,
        }
    }
}

impl SimArgs {
    pub fn validate(&self) -> Result<SimConfig, SimError> {
        use std::net::ToSocketAddrs;
        let listen = self
            .listen
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| SimError::BadAddress(self.listen.clone()))?;
        if self.step_base < Duration::from_millis(1) {
            return Err(SimError::StepTooShort(self.step_base));
        }
        if self.max_batch == 0 {
            return Err(SimError::Zero("max-batch"));
        }
        if self.threads == Some(0) {
            return Err(SimError::Zero("threads"));
        }
        if self.block_size == 0 {
            return Err(SimError::Zero("block-size"));
        }
        if self.tokens_per_event == 0 {
            return Err(SimError::Zero("tokens-per-event"));
        }
        if self.spec_tokens == 0 {
            return Err(SimError::Zero("spec-tokens"));
        }
        let decoding = match self.spec_acceptance {
            Some(_) if self.tokens_per_event > 1 => {
                return Err(SimError::SpecWithFixed(self.tokens_per_event))
            }
            Some(acceptance) => Decoding::Speculative {
                acceptance,
                draft: self.spec_tokens,
            },
            None => Decoding::Fixed(self.tokens_per_event),
        };
        let kv = self.kv_cache_tokens.map(|tokens| kv::KvConfig {
            tokens,
            block_size: self.block_size,
        });
        if let Some(k) = kv.filter(|k| k.tokens < k.block_size) {
            return Err(SimError::NoBlock {
                tokens: k.tokens,
                block_size: k.block_size,
            });
        }
        // A hit rate of 0 is no cache, so it goes with the learnt one.
        let prefix_cache = match self.prefix_cache_tokens {
            0 => PrefixCaching::Rate(self.prefix_cache_hit_rate),
            _ if !self.prefix_cache_hit_rate.is_off() => return Err(SimError::TwoPrefixCaches),
            tokens if tokens < PREFIX_BLOCK_TOKENS => return Err(SimError::NoPrefixBlock(tokens)),
            tokens => PrefixCaching::Blocks { tokens },
        };
        Ok(SimConfig {
            listen,
            api: self.api,
            model_name: self.model.clone(),
            model: Model {
                step_base: self.step_base,
                step_per_seq: self.step_per_seq,
                prefill_per_token: self.prefill_per_token,
                step_per_1k_kv_tokens: self.step_per_1k_kv_tokens,
                max_batch: self.max_batch,
            },
            prefix_cache,
            lengths: self.output_tokens,
            seed: self.seed,
            stats_keep: self.stats_keep,
            threads: self.threads,
            stall: (self.stall_every > 0).then_some(Stall {
                every: self.stall_every,
                after_tokens: self.stall_after,
                pause: self.stall_for,
            }),
            per_request_metrics: self.enable_per_request_metrics,
            kv,
            tenant_header: self.tenant_header.clone(),
            decoding,
        })
    }
}

/// A simulator with its listener bound and its engine running.
pub struct Sim {
    listener: TcpListener,
    state: Arc<http::State>,
}

impl Sim {
    /// Binds the listener and starts the engine (on the current runtime).
    pub async fn bind(cfg: &SimConfig) -> Result<Sim, SimError> {
        let listener = TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| SimError::Bind {
                addr: cfg.listen,
                source,
            })?;
        Ok(Sim {
            listener,
            state: Arc::new(http::State {
                engine: Engine::start_caching(
                    cfg.model,
                    cfg.stats_keep,
                    cfg.stall,
                    cfg.kv,
                    cfg.decoding,
                    cfg.prefix_cache.is_on(),
                ),
                dialect: cfg.api,
                model: cfg.model_name.clone(),
                seed: cfg.seed,
                prefix_cache: cfg.prefix_cache,
                prefix: PrefixLookup::new(cfg.prefix_cache),
                lengths: cfg.lengths,
                per_request_metrics: cfg.per_request_metrics,
                tenant_header: cfg.tenant_header.clone(),
            }),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// The engine's own record of what it did.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(self.state.engine.stats())
    }

    /// Serves until `shutdown` completes.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        http::serve(self.listener, self.state, shutdown).await;
    }
}

/// `tokenmeter sim`: serves until SIGTERM or Ctrl-C.
pub fn run(args: &SimArgs) -> Result<(), SimError> {
    let cfg = args.validate()?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cfg.threads {
        builder.worker_threads(n);
    }
    let runtime = builder.enable_all().build().map_err(SimError::Runtime)?;
    runtime.block_on(async {
        let sim = Sim::bind(&cfg).await?;
        let m = cfg.model;
        tracing::info!(
            listen = %sim.local_addr(),
            api = ?cfg.api,
            single_user_tps = format!("{:.1}", m.request_tps(1)),
            aggregate_tps_at_128 = format!("{:.0}", m.aggregate_tps(128)),
            max_batch = m.max_batch,
            prefix_cache_hit_rate = cfg.prefix_cache.rate(),
            prefix_cache_tokens = cfg.prefix_cache.tokens(),
            tokens_per_event = format!("{:.2}", cfg.decoding.mean_tokens()),
            "simulator started"
        );
        sim.serve(tokenmeter::signal::shutdown()).await;
        tracing::info!("simulator stopped");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: SimArgs,
    }

    #[test]
    fn flag_defaults_match_the_config_defaults() {
        let args = T::try_parse_from(["t", "--listen", "127.0.0.1:0"])
            .expect("parse")
            .a;
        let cfg = args.validate().expect("valid");
        let d = SimConfig::default();
        assert_eq!(cfg.model, d.model);
        assert_eq!(cfg.lengths, d.lengths);
        assert_eq!(cfg.prefix_cache, d.prefix_cache);
        assert_eq!((cfg.api, cfg.seed), (d.api, d.seed));
        assert_eq!(cfg.decoding, d.decoding);
    }

    #[test]
    fn bad_flags_are_named() {
        let bad = |extra: &[&str]| {
            let mut v = vec!["t"];
            v.extend_from_slice(extra);
            T::try_parse_from(v).expect("parse").a.validate().err()
        };
        assert!(matches!(
            bad(&["--listen", "nope"]),
            Some(SimError::BadAddress(_))
        ));
        assert!(matches!(
            bad(&["--step-base", "0.5ms"]),
            Some(SimError::StepTooShort(_))
        ));
        assert!(matches!(
            bad(&["--max-batch", "0"]),
            Some(SimError::Zero("max-batch"))
        ));
        assert!(T::try_parse_from(["t", "--api", "gemini"]).is_err());
        assert!(T::try_parse_from(["t", "--prefix-cache-hit-rate", "1.5"]).is_err());
        let cached = T::try_parse_from(["t", "--prefix-cache-hit-rate", "0.9"]).expect("parse");
        assert_eq!(cached.a.prefix_cache_hit_rate.cached(2000), 1800);
        assert!(T::try_parse_from(["t", "--prefix-cache-tokens", "-1"]).is_err());
        assert!(T::try_parse_from(["t", "--output-tokens", "9-3"]).is_err());
        assert!(matches!(
            bad(&["--kv-cache-tokens", "8", "--block-size", "16"]),
            Some(SimError::NoBlock {
                tokens: 8,
                block_size: 16
            })
        ));
        assert!(matches!(
            bad(&["--block-size", "0"]),
            Some(SimError::Zero("block-size"))
        ));
        assert!(matches!(
            bad(&["--tokens-per-event", "0"]),
            Some(SimError::Zero("tokens-per-event"))
        ));
        assert!(matches!(
            bad(&["--spec-acceptance", "0.5", "--spec-tokens", "0"]),
            Some(SimError::Zero("spec-tokens"))
        ));
        let both = bad(&["--spec-acceptance", "0.5", "--tokens-per-event", "3"]);
        assert!(matches!(both, Some(SimError::SpecWithFixed(3))), "{both:?}");
        assert!(both.is_some_and(|e| e.is_usage()));
        assert!(T::try_parse_from(["t", "--spec-acceptance", "1.5"]).is_err());
    }

    #[test]
    fn the_event_size_flags() {
        let cfg = |extra: &[&str]| {
            let mut v = vec!["t", "--listen", "127.0.0.1:0"];
            v.extend_from_slice(extra);
            T::try_parse_from(v)
                .expect("parse")
                .a
                .validate()
                .expect("valid")
                .decoding
        };
        assert_eq!(cfg(&[]), Decoding::PLAIN);
        assert_eq!(cfg(&["--tokens-per-event", "3"]), Decoding::Fixed(3));
        assert_eq!(
            cfg(&["--spec-acceptance", "0.7"]),
            Decoding::Speculative {
                acceptance: 0.7,
                draft: 4
            }
        );
        // One token per event is plain decoding, so it goes with speculation.
        assert_eq!(
            cfg(&[
                "--spec-acceptance",
                "0.7",
                "--spec-tokens",
                "2",
                "--tokens-per-event",
                "1"
            ]),
            Decoding::Speculative {
                acceptance: 0.7,
                draft: 2
            }
        );
    }

    #[test]
    fn the_cache_flags_and_vllms_name_for_the_batch_cap() {
        let cfg = |extra: &[&str]| {
            let mut v = vec!["t", "--listen", "127.0.0.1:0"];
            v.extend_from_slice(extra);
            T::try_parse_from(v)
                .expect("parse")
                .a
                .validate()
                .expect("valid")
        };
        assert_eq!(cfg(&[]).kv, None);
        let c = cfg(&["--kv-cache-tokens", "2048", "--max-num-seqs", "8"]);
        assert_eq!(
            c.kv,
            Some(kv::KvConfig {
                tokens: 2048,
                block_size: 16
            })
        );
        assert_eq!(c.model.max_batch, 8);
    }

    /// The two prefix caches exclude each other, but a hit rate of 0 is none; the learnt cache
    /// holds at least one block.
    #[test]
    fn the_prefix_cache_flags() {
        let parse = |extra: &[&str]| {
            let mut v = vec!["t", "--listen", "127.0.0.1:0"];
            v.extend_from_slice(extra);
            T::try_parse_from(v).expect("parse").a.validate()
        };
        let cfg = |extra: &[&str]| parse(extra).expect("valid").prefix_cache;
        assert_eq!(cfg(&[]), PrefixCaching::default());
        assert!(!cfg(&[]).is_on());
        assert_eq!(
            cfg(&["--prefix-cache-tokens", "4096"]),
            PrefixCaching::Blocks { tokens: 4096 }
        );
        assert_eq!(
            cfg(&[
                "--prefix-cache-tokens",
                "4096",
                "--prefix-cache-hit-rate",
                "0"
            ]),
            PrefixCaching::Blocks { tokens: 4096 }
        );
        assert_eq!(
            cfg(&[
                "--prefix-cache-tokens",
                "0",
                "--prefix-cache-hit-rate",
                "0.5"
            ]),
            PrefixCaching::Rate(PrefixCache::new(0.5).expect("valid"))
        );
        let both = parse(&[
            "--prefix-cache-tokens",
            "4096",
            "--prefix-cache-hit-rate",
            "0.5",
        ]);
        assert!(matches!(both, Err(SimError::TwoPrefixCaches)), "{both:?}");
        assert!(both.is_err_and(|e| e.is_usage()));
        let small = parse(&["--prefix-cache-tokens", "15"]);
        assert!(
            matches!(small, Err(SimError::NoPrefixBlock(15))),
            "{small:?}"
        );
        assert!(small.is_err_and(|e| e.is_usage()));
        assert_eq!(
            cfg(&["--prefix-cache-tokens", "16"]),
            PrefixCaching::Blocks { tokens: 16 }
        );
    }
}
