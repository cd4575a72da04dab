//! What the capacity model takes from a finished request, as one of the record's sinks: its
//! prompt (the whole prompt, whichever way the format counts the cache), the cached share, the
//! output and the first token's timings join the mix ([`super::workload`]).
//!
//! Only complete requests that said how long their prompt was and produced a first token are
//! workload: a failed request or one without a prompt count says nothing of what the engine
//! was asked to do.

use std::time::Instant;

use super::{Capacity, Request};
use crate::protocol::Api;
use crate::record::{Finished, Outcome, Sink};

impl Sink for Capacity {
    fn finished(&self, f: &Finished, at: Instant) {
        if let Some(r) = request(f, at, self.replicas()) {
            self.join_mix(r);
        }
    }
}

/// The mix's record of `f`, which ended at `at` in front of `replicas` engines; `None` when it
/// is not workload.
fn request(f: &Finished, at: Instant, replicas: u32) -> Option<Request> {
    let (Outcome::Complete, Some(prompt), Some(ttft)) = (f.outcome, f.input_tokens, f.first_token)
    else {
        return None;
    };
    let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let read = f.cached_input.read.unwrap_or(0);
    let prompt = whole_prompt(f, prompt);
    let stated = f.engine.as_ref();
    let arrival = at.checked_sub(f.duration).unwrap_or(at);
    Some(Request {
        at,
        arrival,
        prompt: count(prompt),
        cached: count(read),
        output: count(f.output_tokens),
        ttft: Some(ttft.as_secs_f64()),
        stated_prefill: stated.and_then(|e| e.prefill).map(|d| d.as_secs_f64()),
        stated_queue: stated.and_then(|e| e.queue).map(|d| d.as_secs_f64()),
        step_end: f.running_step_end.and_then(|d| arrival.checked_add(d)),
        tps: f.tokens_per_second(),
        batch: f.mean_in_flight.map(|b| b / f64::from(replicas.max(1))),
    })
}

/// The whole prompt of `f`, whose usage counted `prompt` input tokens: Anthropic's
/// `input_tokens` leaves out the tokens read from and written to the cache; the others count
/// the whole prompt.
pub fn whole_prompt(f: &Finished, prompt: u64) -> u64 {
    match f.api {
        Api::Anthropic => prompt
            .saturating_add(f.cached_input.read.unwrap_or(0))
            .saturating_add(f.cached_input.write.unwrap_or(0)),
        _ => prompt,
    }
}

/// The prompt tokens the engine computed for `f`: its whole prompt less what the prefix cache
/// served; `None` where the response did not say how long its prompt was.
pub fn uncached_prompt(f: &Finished) -> Option<u64> {
    let prompt = whole_prompt(f, f.input_tokens?);
    Some(prompt.saturating_sub(f.cached_input.read.unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::protocol::timings::{EngineTimings, TimingSource};
    use crate::record::tests::finished;
    use crate::record::CachedInput;

    fn lengths(r: Option<Request>) -> Option<(u32, u32, u32)> {
        r.map(|r| (r.prompt, r.cached, r.output))
    }

    #[test]
    fn the_whole_prompt_joins_the_mix_whichever_way_the_format_counts_the_cache() {
        let now = Instant::now();
        // OpenAI counts the cached tokens inside the prompt.
        let openai = Finished {
            input_tokens: Some(1000),
            cached_input: CachedInput {
                read: Some(600),
                write: None,
            },
            ..finished()
        };
        assert_eq!(lengths(request(&openai, now, 1)), Some((1000, 600, 5)));
        // Anthropic counts them beside it: 100 new, 600 read, 300 written = 1,000.
        let anthropic = Finished {
            api: Api::Anthropic,
            input_tokens: Some(100),
            cached_input: CachedInput {
                read: Some(600),
                write: Some(300),
            },
            ..finished()
        };
        assert_eq!(lengths(request(&anthropic, now, 1)), Some((1000, 600, 5)));
    }

    #[test]
    fn failed_requests_and_those_without_a_prompt_count_or_a_first_token_stay_out() {
        let now = Instant::now();
        let failed = Finished {
            outcome: Outcome::UpstreamError,
            ..finished()
        };
        let no_prompt = Finished {
            input_tokens: None,
            ..finished()
        };
        let no_token = Finished {
            first_token: None,
            ..finished()
        };
        for f in [failed, no_prompt, no_token] {
            assert!(request(&f, now, 1).is_none(), "{:?}", f.outcome);
        }
    }

    #[test]
    fn the_first_token_and_the_engine_s_stated_parts_come_in_seconds() {
        let f = Finished {
            engine: Some(EngineTimings {
                source: TimingSource::Vllm,
                queue: Some(Duration::from_millis(100)),
                model_load: None,
                prefill: Some(Duration::from_millis(150)),
                generation: None,
                spec_acceptance: None,
            }),
            ..finished()
        };
        let r = request(&f, Instant::now(), 1).expect("workload");
        assert_eq!(
            (r.ttft, r.stated_queue, r.stated_prefill),
            (Some(0.1), Some(0.1), Some(0.15))
        );
    }
}
