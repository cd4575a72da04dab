//! Who the simulated GPU worked for: the truth tokenmeter's GPU-time estimate is tested against.
//!
//! The engine knows which sequences each step served and what the step cost, so it can say
//! exactly who used the GPU, by the rule docs/cost.md states:
//!
//! - a step's fixed part (`--step-base`) is shared equally by the sequences in its batch, and
//!   its per-sequence part (`--step-per-seq`) goes to each;
//! - its prefill part (`--prefill-per-token` x the uncached prompt tokens it admits) goes to
//!   the request whose prompt it is, and its context part (`--step-per-1k-kv-tokens`) to each
//!   sequence by the context it holds;
//! - a request's share of the step that makes its first token is `prefill`, of every later
//!   step `decode`;
//! - time with no step running is idle.
//!
//! Requests are keyed by the value of a header (`--tenant-header`, `x-tenant` unless set),
//! the same one a tokenmeter in front reads. At most [`MAX_TENANTS`] values are kept apart;
//! later ones count as `other`, and a request without the header as `none`.

use std::sync::Mutex;
use std::time::Duration;

use super::model::Model;

/// Distinct tenants kept apart: enough for any test, and a bound on the sim's own series.
pub const MAX_TENANTS: usize = 16;

/// A tenant's index in [`Accounts`]: 0 is `none`, 1 `other`.
pub type TenantId = u8;
pub const NONE: TenantId = 0;
const OTHER: TenantId = 1;

/// The phase of a request a share of a step is spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Prefill,
    Decode,
}

/// One sequence's part in a step: its tenant, its phase, and the prompt tokens the step
/// prefilled for it.
#[derive(Debug, Clone, Copy)]
pub struct Part {
    pub tenant: TenantId,
    pub phase: Phase,
    pub prefill_tokens: u64,
    /// The context it holds: its share of the step's per-KV-token cost.
    pub kv_tokens: u64,
}

/// The engine's seconds by tenant and phase, and its busy time.
#[derive(Debug)]
pub struct Accounts {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    names: Vec<String>,
    /// Seconds by tenant index, `[prefill, decode]`.
    seconds: Vec<[f64; 2]>,
    busy: f64,
}

/// One row of the accounts: a tenant's prefill and decode seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub tenant: String,
    pub prefill: f64,
    pub decode: f64,
}

impl Default for Accounts {
    fn default() -> Self {
        Accounts {
            inner: Mutex::new(Inner {
                names: vec!["none".into(), "other".into()],
                seconds: vec![[0.0; 2]; 2],
                busy: 0.0,
            }),
        }
    }
}

impl Accounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The index of a tenant named by the header's value (`None`: no header).
    pub fn tenant(&self, name: Option<&str>) -> TenantId {
        let Some(name) = name else { return NONE };
        let mut s = self.lock();
        if let Some(i) = s.names.iter().position(|n| n == name) {
            return i as TenantId;
        }
        if s.names.len() >= MAX_TENANTS + 2 {
            return OTHER;
        }
        s.names.push(name.to_owned());
        s.seconds.push([0.0; 2]);
        (s.names.len() - 1) as TenantId
    }

    /// Splits one step among its sequences by the stated rule.
    pub fn step(&self, model: &Model, parts: &[Part]) {
        if parts.is_empty() {
            return;
        }
        let shared =
            model.step_base.as_secs_f64() / parts.len() as f64 + model.step_per_seq.as_secs_f64();
        let (per_token, per_kv) = (
            model.prefill_per_token.as_secs_f64(),
            model.step_per_1k_kv_tokens.as_secs_f64() / 1000.0,
        );
        let mut s = self.lock();
        for p in parts {
            let own = shared + per_token * p.prefill_tokens as f64 + per_kv * p.kv_tokens as f64;
            let i = usize::from(p.tenant).min(s.seconds.len() - 1);
            s.seconds[i][p.phase as usize] += own;
            s.busy += own;
        }
    }

    /// The host held the simulator up for `lost` past catching up, while `parts` ran: the time
    /// is theirs in equal parts, as a stalled engine's wall time is its batch's. The accounts then
    /// add up to the engine's wall time busy, which is what a proxy in front splits.
    pub fn stalled(&self, lost: Duration, parts: &[Part]) {
        if parts.is_empty() {
            return;
        }
        let each = lost.as_secs_f64() / parts.len() as f64;
        let mut s = self.lock();
        for p in parts {
            let i = usize::from(p.tenant).min(s.seconds.len() - 1);
            s.seconds[i][p.phase as usize] += each;
            s.busy += each;
        }
    }

    /// Seconds the engine was busy: every step's, and the stalls that held a batch up.
    pub fn busy(&self) -> f64 {
        self.lock().busy
    }

    /// Every tenant seen (and `none` and `other`), with its seconds.
    pub fn rows(&self) -> Vec<Row> {
        let s = self.lock();
        s.names
            .iter()
            .zip(&s.seconds)
            .map(|(n, [p, d])| Row {
                tenant: n.clone(),
                prefill: *p,
                decode: *d,
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    /// A model with these step costs (and no context cost unless set).
    pub(crate) fn model(base: Duration, per_seq: Duration, per_token: Duration) -> Model {
        Model {
            step_base: base,
            step_per_seq: per_seq,
            prefill_per_token: per_token,
            step_per_1k_kv_tokens: Duration::ZERO,
            max_batch: 256,
        }
    }

    #[test]
    fn a_step_is_split_by_the_rule_and_adds_up() {
        let a = Accounts::default();
        let (x, y) = (a.tenant(Some("x")), a.tenant(Some("y")));
        // base 16 ms over 2, 1 ms each; x prefills 100 tokens at 0.1 ms.
        a.step(
            &model(16 * MS, MS, MS / 10),
            &[
                Part {
                    tenant: x,
                    phase: Phase::Prefill,
                    prefill_tokens: 100,
                    kv_tokens: 100,
                },
                Part {
                    tenant: y,
                    phase: Phase::Decode,
                    prefill_tokens: 0,
                    kv_tokens: 500,
                },
            ],
        );
        let rows = a.rows();
        let get = |t: &str| rows.iter().find(|r| r.tenant == t).cloned();
        let x = get("x").expect("x");
        let y = get("y").expect("y");
        assert!((x.prefill - 0.019).abs() < 1e-12, "{x:?}");
        assert_eq!(x.decode, 0.0);
        assert!((y.decode - 0.009).abs() < 1e-12, "{y:?}");
        // The step's model duration: 16 + 2 x 1 + 100 x 0.1 ms.
        assert!((a.busy() - 0.028).abs() < 1e-12);
    }

    /// A stall past catching up is the held-up batch's, equally, whatever its prompts.
    #[test]
    fn lost_time_goes_to_the_batch_it_held_up_in_equal_parts() {
        let a = Accounts::default();
        let (x, y) = (a.tenant(Some("x")), a.tenant(Some("y")));
        let part = |tenant, phase| Part {
            tenant,
            phase,
            prefill_tokens: 0,
            kv_tokens: 1000,
        };
        a.stalled(
            Duration::from_millis(300),
            &[
                part(x, Phase::Prefill),
                part(y, Phase::Decode),
                part(y, Phase::Decode),
            ],
        );
        a.stalled(Duration::from_millis(300), &[]);
        let rows = a.rows();
        let get = |t: &str| rows.iter().find(|r| r.tenant == t).cloned();
        let (x, y) = (get("x").expect("x"), get("y").expect("y"));
        assert!((x.prefill - 0.1).abs() < 1e-12, "{x:?}");
        assert!((y.decode - 0.2).abs() < 1e-12, "{y:?}");
        assert!((a.busy() - 0.3).abs() < 1e-12);
    }

    #[test]
    fn the_context_part_goes_to_each_sequence_by_the_context_it_holds() {
        let a = Accounts::default();
        let (x, y) = (a.tenant(Some("x")), a.tenant(Some("y")));
        // 10 ms shared by 2, and 2 ms per 1,000 tokens of context: x holds 500, y 1,500.
        let m = Model {
            step_per_1k_kv_tokens: 2 * MS,
            ..model(10 * MS, Duration::ZERO, Duration::ZERO)
        };
        let part = |tenant, kv_tokens| Part {
            tenant,
            phase: Phase::Decode,
            prefill_tokens: 0,
            kv_tokens,
        };
        a.step(&m, &[part(x, 500), part(y, 1500)]);
        let rows = a.rows();
        let decode = |t: &str| rows.iter().find(|r| r.tenant == t).map(|r| r.decode);
        assert!((decode("x").expect("x") - 0.006).abs() < 1e-12);
        assert!((decode("y").expect("y") - 0.008).abs() < 1e-12);
        // The step as the engine times it: 10 + 2 x 2 ms.
        assert_eq!(m.step_with_context(2, 0, 2000), 14 * MS);
        assert!((a.busy() - 0.014).abs() < 1e-12);
    }

    #[test]
    fn tenants_are_bounded() {
        let a = Accounts::default();
        let ids: Vec<_> = (0..40).map(|i| a.tenant(Some(&format!("t{i}")))).collect();
        assert_eq!(ids[0], 2);
        assert_eq!(ids[MAX_TENANTS - 1], (MAX_TENANTS + 1) as TenantId);
        assert_eq!(ids[MAX_TENANTS], OTHER);
        assert_eq!(a.tenant(None), NONE);
        assert_eq!(a.rows().len(), MAX_TENANTS + 2);
    }
}
