//! The engine's own account of where a request's time went, where its stream states it.
//!
//! tokenmeter sees one interval before the first token: arrival to first token-bearing event.
//! Three engines now say, in the bytes tokenmeter already parses, how much of it they spent
//! where:
//! - **vLLM** (`--enable-per-request-metrics`) puts a `metrics` object on the final usage chunk:
//!   `queue_time_ms` (queued to scheduled), `time_to_first_token_ms` (scheduled to the first
//!   token: the prefill), `generation_time_ms` (first to last token) and, under speculative
//!   decoding, `speculative_decoding.draft_acceptance_rate`;
//! - **Ollama**'s final line: `load_duration` (loading the model: a cold start),
//!   `prompt_eval_duration` (prefill) and `eval_duration` (generation), in nanoseconds;
//! - **llama.cpp**'s final event (native, and its OpenAI-compatible final chunk): `timings` with
//!   `prompt_ms` (prefill) and `predicted_ms` (generation), and `cache_n`, the prompt tokens its
//!   cache served (`LlamacppTimings::cached`).
//!
//! Each reader turns its engine's fields into one [`EngineTimings`] and states only what the
//! stream stated: a part the engine did not give stays `None`, never 0, so a reader of the
//! split can tell "no queue" from "not said". A value that is no duration (negative, a string)
//! is not stated either. The latest statement in a stream wins, as for usage.

use std::time::Duration;

use serde::Deserialize;

use super::json::{Count, Number};

/// Which engine stated the timings: the `source` label of
/// `tokenmeter_engine_timings_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingSource {
    Vllm,
    Ollama,
    Llamacpp,
}

impl TimingSource {
    /// Every variant, in exposition order.
    pub const ALL: [TimingSource; 3] = [
        TimingSource::Vllm,
        TimingSource::Ollama,
        TimingSource::Llamacpp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TimingSource::Vllm => "vllm",
            TimingSource::Ollama => "ollama",
            TimingSource::Llamacpp => "llamacpp",
        }
    }
}

/// A part of the time to first token: the `part` label of
/// `tokenmeter_time_to_first_token_part_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Waiting in the engine's queue for a slot in the batch (vLLM).
    Queue,
    /// Loading the model before the request could run (Ollama: a cold start).
    ModelLoad,
    /// Computing the prompt: the engine's prefill.
    Prefill,
    /// tokenmeter's own TTFT less every stated part: what no engine accounts for (its API
    /// server, tokenization, the network, the proxy; docs/metrics.md, "Where TTFT goes").
    Other,
}

impl Part {
    /// Every variant, in exposition (and stacking) order.
    pub const ALL: [Part; 4] = [Part::Queue, Part::ModelLoad, Part::Prefill, Part::Other];

    pub fn as_str(self) -> &'static str {
        match self {
            Part::Queue => "queue",
            Part::ModelLoad => "model_load",
            Part::Prefill => "prefill",
            Part::Other => "other",
        }
    }
}

/// What one engine stated about one request's time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineTimings {
    pub source: TimingSource,
    /// Queued to scheduled.
    pub queue: Option<Duration>,
    /// Loading the model.
    pub model_load: Option<Duration>,
    /// Scheduled to the first token: the prompt's computation.
    pub prefill: Option<Duration>,
    /// First to last token.
    pub generation: Option<Duration>,
    /// The share of draft tokens the target model accepted (speculative decoding), 0 to 1.
    pub spec_acceptance: Option<f64>,
}

impl EngineTimings {
    pub(crate) fn empty(source: TimingSource) -> Self {
        EngineTimings {
            source,
            queue: None,
            model_load: None,
            prefill: None,
            generation: None,
            spec_acceptance: None,
        }
    }

    /// The stated parts before the first token, in [`Part::ALL`] order (`Other` is not stated:
    /// it is what is left of tokenmeter's TTFT, see [`EngineTimings::split`]).
    pub fn stated(&self) -> [(Part, Option<Duration>); 3] {
        [
            (Part::Queue, self.queue),
            (Part::ModelLoad, self.model_load),
            (Part::Prefill, self.prefill),
        ]
    }

    /// Splits tokenmeter's own `ttft` into the stated parts and `other`, the rest. The second
    /// value says the stated parts were more than the TTFT (an engine that counts from an
    /// earlier instant, or another clock): `other` is then 0, not below it.
    pub fn split(&self, ttft: Duration) -> (Split, bool) {
        let stated: Duration = self.stated().iter().filter_map(|(_, d)| *d).sum();
        let other = ttft.checked_sub(stated);
        let [queue, model_load, prefill] = self.stated().map(|(_, d)| d);
        let split = Split {
            queue,
            model_load,
            prefill,
            other: other.unwrap_or(Duration::ZERO),
        };
        (split, other.is_none())
    }

    /// Whether anything was stated at all (a `metrics` object of unknown fields states nothing).
    fn any(&self) -> bool {
        self.queue.is_some()
            || self.model_load.is_some()
            || self.prefill.is_some()
            || self.generation.is_some()
            || self.spec_acceptance.is_some()
    }
}

/// One request's TTFT, split into parts: the stated ones, and `other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub queue: Option<Duration>,
    pub model_load: Option<Duration>,
    pub prefill: Option<Duration>,
    pub other: Duration,
}

impl Split {
    /// Every part with its value, in [`Part::ALL`] order (`None`: not stated, not observed).
    pub fn parts(&self) -> [(Part, Option<Duration>); 4] {
        [
            (Part::Queue, self.queue),
            (Part::ModelLoad, self.model_load),
            (Part::Prefill, self.prefill),
            (Part::Other, Some(self.other)),
        ]
    }
}

/// Milliseconds as a duration; `None` for what is not one (too large for a `Duration`).
fn millis(ms: Number) -> Option<Duration> {
    Duration::try_from_secs_f64(ms.0? / 1e3).ok()
}

/// Nanoseconds as a duration, exactly.
fn nanos(ns: Count) -> Option<Duration> {
    ns.0.map(Duration::from_nanos)
}

// === vLLM ===

/// vLLM's per-request `metrics` object, on the final usage chunk of a streamed chat or
/// completion (`--enable-per-request-metrics`).
#[derive(Deserialize)]
pub(super) struct VllmMetrics {
    #[serde(default)]
    queue_time_ms: Number,
    /// Despite its name: from scheduled to the first token, i.e. the prefill (vLLM's own TTFT
    /// runs from arrival at its API server, and is `vllm:time_to_first_token_seconds`).
    #[serde(default)]
    time_to_first_token_ms: Number,
    #[serde(default)]
    generation_time_ms: Number,
    #[serde(default)]
    speculative_decoding: Option<SpecDecoding>,
}

#[derive(Deserialize)]
struct SpecDecoding {
    #[serde(default)]
    draft_acceptance_rate: Number,
}

impl VllmMetrics {
    /// What the object states; `None` when it states nothing.
    pub(super) fn timings(&self) -> Option<EngineTimings> {
        let t = EngineTimings {
            queue: millis(self.queue_time_ms),
            prefill: millis(self.time_to_first_token_ms),
            generation: millis(self.generation_time_ms),
            spec_acceptance: self
                .speculative_decoding
                .as_ref()
                .and_then(|s| s.draft_acceptance_rate.0)
                .filter(|r| *r <= 1.0),
            ..EngineTimings::empty(TimingSource::Vllm)
        };
        t.any().then_some(t)
    }
}

// === Ollama ===

/// Ollama's final-line durations, in nanoseconds (its extractor reads the fields beside the
/// rest of the line and hands them here).
pub(super) fn ollama(load: Count, prompt_eval: Count, eval: Count) -> Option<EngineTimings> {
    let t = EngineTimings {
        model_load: nanos(load),
        prefill: nanos(prompt_eval),
        generation: nanos(eval),
        ..EngineTimings::empty(TimingSource::Ollama)
    };
    t.any().then_some(t)
}

// === llama.cpp ===

/// llama.cpp's `timings` object: on the native final event and on its OpenAI-compatible
/// final chunk.
#[derive(Deserialize, Default)]
pub(super) struct LlamacppTimings {
    /// Prompt tokens computed (the cached ones not among them).
    #[serde(default)]
    pub prompt_n: Count,
    #[serde(default)]
    pub predicted_n: Count,
    #[serde(default)]
    prompt_ms: Number,
    #[serde(default)]
    predicted_ms: Number,
    /// Prompt tokens served from the cache (newer servers).
    #[serde(default)]
    cache_n: Count,
}

impl LlamacppTimings {
    /// What the object states; `None` when it states no duration.
    pub(super) fn timings(&self) -> Option<EngineTimings> {
        let t = EngineTimings {
            prefill: millis(self.prompt_ms),
            generation: millis(self.predicted_ms),
            ..EngineTimings::empty(TimingSource::Llamacpp)
        };
        t.any().then_some(t)
    }

    /// The prompt tokens the server's cache served: `cache_n` where the server states it,
    /// else the whole prompt (`tokens_evaluated`, the native final event's) less the tokens
    /// it computed (`prompt_n`). Not `tokens_cached`: that is every token in the slot's cache
    /// after the request (prompt and output), not what this prompt reused.
    pub(super) fn cached(&self, prompt: Option<u64>) -> Option<u64> {
        self.cache_n
            .0
            .or_else(|| prompt?.checked_sub(self.prompt_n.0?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Option<Duration> {
        Duration::try_from_secs_f64(v / 1e3).ok()
    }

    #[test]
    fn vllm_states_queue_prefill_generation_in_ms() {
        let m: VllmMetrics = serde_json::from_str(
            r#"{"time_to_first_token_ms":46.974340000360826,"generation_time_ms":654.5342859999437,"queue_time_ms":495.0015800000074,"mean_itl_ms":21.1,"tokens_per_second":45.6}"#,
        )
        .expect("json");
        let t = m.timings().expect("stated");
        assert_eq!(t.source, TimingSource::Vllm);
        assert_eq!(t.queue, ms(495.0015800000074));
        assert_eq!(t.prefill, ms(46.974340000360826));
        assert_eq!(t.generation, ms(654.5342859999437));
        assert_eq!((t.model_load, t.spec_acceptance), (None, None));
        assert_eq!(t.queue.map(|d| d.as_nanos()), Some(495_001_580));
    }

    #[test]
    fn vllm_speculative_acceptance_and_odd_values() {
        let m: VllmMetrics = serde_json::from_str(
            r#"{"queue_time_ms":-1,"time_to_first_token_ms":"12","speculative_decoding":{"draft_acceptance_rate":0.625,"mean_acceptance_length":2.5,"num_drafts":8}}"#,
        )
        .expect("json");
        let t = m.timings().expect("stated");
        assert_eq!((t.queue, t.prefill), (None, None));
        assert_eq!(t.spec_acceptance, Some(0.625));
        let m: VllmMetrics = serde_json::from_str(r#"{"mean_itl_ms":3}"#).expect("json");
        assert_eq!(m.timings(), None);
        let m: VllmMetrics =
            serde_json::from_str(r#"{"speculative_decoding":{"draft_acceptance_rate":1.5}}"#)
                .expect("json");
        assert_eq!(m.timings(), None);
    }

    #[test]
    fn ollama_states_nanoseconds_exactly() {
        let t = ollama(
            Count(Some(38_473_250)),
            Count(Some(27_608_250)),
            Count(None),
        )
        .expect("stated");
        assert_eq!(t.source, TimingSource::Ollama);
        assert_eq!(t.model_load, Some(Duration::from_nanos(38_473_250)));
        assert_eq!(t.prefill, Some(Duration::from_nanos(27_608_250)));
        assert_eq!((t.queue, t.generation), (None, None));
        assert_eq!(ollama(Count(None), Count(None), Count(None)), None);
    }

    #[test]
    fn llamacpp_prefill_and_cache() {
        let t: LlamacppTimings = serde_json::from_str(
            r#"{"prompt_n":1,"prompt_ms":1468.578,"predicted_n":12,"predicted_ms":336.452}"#,
        )
        .expect("json");
        let s = t.timings().expect("stated");
        assert_eq!(s.prefill, ms(1468.578));
        assert_eq!(s.generation, ms(336.452));
        assert_eq!(t.cached(Some(47)), Some(46));
        assert_eq!(t.cached(None), None);
        let t: LlamacppTimings =
            serde_json::from_str(r#"{"cache_n":30,"prompt_n":4}"#).expect("json");
        assert_eq!(t.cached(Some(47)), Some(30));
        assert_eq!(t.timings(), None);
    }

    #[test]
    fn split_adds_up_and_never_goes_below_zero() {
        let t = EngineTimings {
            queue: Some(Duration::from_millis(100)),
            prefill: Some(Duration::from_millis(150)),
            ..EngineTimings::empty(TimingSource::Vllm)
        };
        let (s, over) = t.split(Duration::from_millis(300));
        assert!(!over);
        assert_eq!(s.other, Duration::from_millis(50));
        let sum: Duration = s.parts().iter().filter_map(|(_, d)| *d).sum();
        assert_eq!(sum, Duration::from_millis(300));
        assert_eq!(s.model_load, None);
        let (s, over) = t.split(Duration::from_millis(200));
        assert!(over);
        assert_eq!(s.other, Duration::ZERO);
    }
}
