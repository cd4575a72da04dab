//! The judge: what one finished request's timings mean against its targets.
//!
//! It is a pure function of the request's measured times and how it ended, so every rule of
//! the result is tested here without a socket, and the meter calls it once, when it records the
//! request.

use std::time::Duration;

use super::Targets;

/// How a request ended, as far as its SLO is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The upstream answered with a 2xx status and the client received the whole response.
    Complete,
    /// The request did not complete: the upstream failed or timed out, answered a non-2xx
    /// status, or the request was refused before it was sent.
    Failed,
    /// The client went away before the end of the response.
    ClientDisconnect,
}

impl End {
    /// How a request ended, from its response's `status` (0: none came) and whether it was
    /// received whole (`complete`) or the client went away first (`client_left`). A client
    /// gone before any response head, or from a 2xx response, left; a 2xx received whole is
    /// complete; upstream errors, timeouts, refusals and every non-2xx answer failed.
    pub fn of(status: u16, complete: bool, client_left: bool) -> End {
        let two_xx = (200..300).contains(&status);
        if client_left && (status == 0 || two_xx) {
            End::ClientDisconnect
        } else if complete && two_xx {
            End::Complete
        } else {
            End::Failed
        }
    }
}

/// What was measured of one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// Arrival to the first token-bearing event; `None` when no token came.
    pub ttft: Option<Duration>,
    /// The decode speed of `tokenmeter_request_tokens_per_second`, (output tokens - 1) / (last
    /// token - first token); `None` without a decode window (fewer than 2 tokens, or all in one
    /// event).
    pub decode_tps: Option<f64>,
    /// Arrival to the end of the response (or to the moment the client left).
    pub elapsed: Duration,
    pub end: End,
}

/// The `result` label of `tokenmeter_slo_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    TtftMissed,
    TpsMissed,
    E2eMissed,
    Error,
    ClientDisconnect,
}

impl Verdict {
    /// Every value, in the order of the results table in docs/slo.md.
    pub const ALL: [Verdict; 6] = [
        Verdict::Met,
        Verdict::TtftMissed,
        Verdict::TpsMissed,
        Verdict::E2eMissed,
        Verdict::Error,
        Verdict::ClientDisconnect,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::TtftMissed => "ttft_missed",
            Verdict::TpsMissed => "tps_missed",
            Verdict::E2eMissed => "e2e_missed",
            Verdict::Error => "error",
            Verdict::ClientDisconnect => "client_disconnect",
        }
    }
}

/// The result of one request: `error` when it did not complete; else the first target it
/// missed, in the order TTFT, TPS, e2e; else `met`, or `client_disconnect` when the client left
/// before the end without any target missed by then.
///
/// - TTFT is judged on the wait for the first token: with no token at all, the whole wait
///   counts (a client that gave up after 5 s without a token under a 1 s target was failed).
/// - TPS is judged only where there is a decode window: a 1-token answer, or one whose tokens
///   all came in one event (a non-streaming response), has no decode speed to judge.
/// - e2e is judged on the elapsed time.
///
/// A time equal to its target meets it, and so does a speed equal to its floor.
pub fn judge(targets: &Targets, obs: &Observation) -> Verdict {
    if obs.end == End::Failed {
        return Verdict::Error;
    }
    let missed = if targets
        .ttft
        .is_some_and(|t| obs.ttft.unwrap_or(obs.elapsed) > t)
    {
        Some(Verdict::TtftMissed)
    } else if matches!((targets.tps, obs.decode_tps), (Some(floor), Some(tps)) if tps < floor) {
        Some(Verdict::TpsMissed)
    } else if targets.e2e.is_some_and(|t| obs.elapsed > t) {
        Some(Verdict::E2eMissed)
    } else {
        None
    };
    match (missed, obs.end) {
        (Some(v), _) => v,
        (None, End::ClientDisconnect) => Verdict::ClientDisconnect,
        (None, _) => Verdict::Met,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn interactive() -> Targets {
        Targets {
            ttft: Some(ms(1000)),
            tps: Some(20.0),
            e2e: Some(ms(30_000)),
            objective: 0.95,
        }
    }

    fn obs(ttft: Option<u64>, tps: Option<f64>, elapsed: u64, end: End) -> Observation {
        Observation {
            ttft: ttft.map(ms),
            decode_tps: tps,
            elapsed: ms(elapsed),
            end,
        }
    }

    fn check(targets: &Targets, cases: &[(Observation, Verdict)]) {
        for (o, want) in cases {
            assert_eq!(judge(targets, o), *want, "{o:?}");
        }
    }

    #[test]
    fn each_result_from_its_own_case() {
        use End::*;
        check(
            &interactive(),
            &[
                (obs(Some(200), Some(45.0), 3_000, Complete), Verdict::Met),
                (
                    obs(Some(1_500), Some(45.0), 3_000, Complete),
                    Verdict::TtftMissed,
                ),
                (
                    obs(Some(200), Some(12.0), 3_000, Complete),
                    Verdict::TpsMissed,
                ),
                (
                    obs(Some(200), Some(45.0), 31_000, Complete),
                    Verdict::E2eMissed,
                ),
                (obs(Some(200), Some(45.0), 3_000, Failed), Verdict::Error),
                (
                    obs(Some(200), Some(45.0), 2_000, ClientDisconnect),
                    Verdict::ClientDisconnect,
                ),
            ],
        );
    }

    #[test]
    fn the_first_missed_target_wins_in_order_ttft_tps_e2e() {
        use End::*;
        check(
            &interactive(),
            &[
                (
                    obs(Some(1_500), Some(5.0), 60_000, Complete),
                    Verdict::TtftMissed,
                ),
                (
                    obs(Some(500), Some(5.0), 60_000, Complete),
                    Verdict::TpsMissed,
                ),
                // An error is an error, however slow it was.
                (obs(None, None, 60_000, Failed), Verdict::Error),
            ],
        );
    }

    #[test]
    fn a_client_that_leaves_after_a_miss_was_failed_not_impatient() {
        use End::ClientDisconnect as Gone;
        check(
            &interactive(),
            &[
                // 5 s without a token under a 1 s target.
                (obs(None, None, 5_000, Gone), Verdict::TtftMissed),
                // Left before the target could be missed.
                (obs(None, None, 800, Gone), Verdict::ClientDisconnect),
                // Left mid-stream, which was too slow so far.
                (obs(Some(300), Some(8.0), 4_000, Gone), Verdict::TpsMissed),
                // Left after the e2e deadline had passed.
                (obs(Some(300), Some(30.0), 40_000, Gone), Verdict::E2eMissed),
            ],
        );
    }

    #[test]
    fn no_decode_window_means_no_tps_judgement() {
        use End::Complete;
        check(
            &interactive(),
            &[
                // One token, or a non-streaming body: TTFT and e2e still count.
                (obs(Some(300), None, 300, Complete), Verdict::Met),
                (obs(Some(2_000), None, 2_000, Complete), Verdict::TtftMissed),
                // No token at all: the whole wait is the wait for the first token.
                (obs(None, None, 400, Complete), Verdict::Met),
                (obs(None, None, 1_001, Complete), Verdict::TtftMissed),
            ],
        );
    }

    #[test]
    fn equal_to_the_target_meets_it() {
        check(
            &interactive(),
            &[(
                obs(Some(1_000), Some(20.0), 30_000, End::Complete),
                Verdict::Met,
            )],
        );
    }

    #[test]
    fn a_class_without_targets_meets_everything_that_completes() {
        let batch = Targets::default();
        check(
            &batch,
            &[
                (
                    obs(Some(90_000), Some(0.5), 900_000, End::Complete),
                    Verdict::Met,
                ),
                (
                    obs(None, None, 10, End::ClientDisconnect),
                    Verdict::ClientDisconnect,
                ),
                (obs(None, None, 10, End::Failed), Verdict::Error),
            ],
        );
    }

    #[test]
    fn result_labels_are_the_documented_ones() {
        let names: Vec<_> = Verdict::ALL.iter().map(|v| v.as_str()).collect();
        assert_eq!(
            names,
            [
                "met",
                "ttft_missed",
                "tps_missed",
                "e2e_missed",
                "error",
                "client_disconnect"
            ]
        );
    }

    #[test]
    fn an_end_is_read_from_the_status_and_how_the_request_ended() {
        assert_eq!(End::of(200, true, false), End::Complete);
        assert_eq!(End::of(200, false, true), End::ClientDisconnect);
        assert_eq!(End::of(0, false, true), End::ClientDisconnect);
        assert_eq!(End::of(500, false, true), End::Failed);
        assert_eq!(End::of(429, true, false), End::Failed);
        assert_eq!(End::of(0, false, false), End::Failed);
    }
}
