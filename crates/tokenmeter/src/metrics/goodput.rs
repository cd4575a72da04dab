//! The goodput rule: which finished requests' output tokens count as good for their SLO class.
//!
//! `tokenmeter_goodput_output_tokens_total{class, model}` is the output of the requests that met
//! every target of their class: beside `tokenmeter_output_tokens_total`, the share of the GPUs'
//! work that served its purpose, and the cost per goodput token of the recording rules
//! (`deploy/prometheus/rules.yml`). It is a rule of its own, apart from the recording of the
//! families, because its cases are worth pinning: a request without a class adds nothing, one
//! that missed a target (or failed, or lost its client) adds no series at all, and one that met
//! its targets always adds one, with 0 tokens when no parser read its stream, so goodput is
//! never absent where requests were met.

use crate::protocol::Api;
use crate::slo::Verdict;

/// The output tokens a request that ended with `verdict` adds to its class's goodput, or `None`
/// when it adds nothing (not even a zero). `output_tokens` is the record's final count; a
/// request no parser read (`api` unknown) has no token count, so it adds 0.
pub(super) fn goodput_tokens(verdict: Verdict, api: Api, output_tokens: u64) -> Option<u64> {
    if verdict != Verdict::Met {
        return None;
    }
    Some(match api {
        Api::Unknown => 0,
        _ => output_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_request_that_met_its_targets_adds_goodput() {
        for verdict in Verdict::ALL {
            let want = (verdict == Verdict::Met).then_some(5);
            assert_eq!(goodput_tokens(verdict, Api::OpenAi, 5), want, "{verdict:?}");
        }
    }

    #[test]
    fn a_met_request_always_adds_a_series_even_with_no_tokens() {
        assert_eq!(goodput_tokens(Verdict::Met, Api::OpenAi, 0), Some(0));
        // No parser read it: its (unknown) count is not goodput, but the series exists.
        assert_eq!(goodput_tokens(Verdict::Met, Api::Unknown, 11), Some(0));
        assert_eq!(goodput_tokens(Verdict::TpsMissed, Api::Unknown, 11), None);
    }
}
