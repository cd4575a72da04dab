//! A finished request's price by the rule (`super`): what it used of its engine, from the
//! fitted step cost and what the wire saw of it.

use super::seconds::GpuSeconds;

/// The cost of the engine's work as the capacity model fits it, in seconds of one engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prices {
    /// A decode step's fixed part, shared by the batch.
    pub base: f64,
    /// A decode step's part per sequence.
    pub per_seq: f64,
    /// Prefill per uncached prompt token.
    pub prefill_per_token: f64,
}

/// What the proxy knows of a finished request that its price depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Facts {
    /// Its equal share of the time it was in flight, in seconds (`meter::concurrency`).
    pub share: f64,
    /// The part of `share` before its first token (all of it without one).
    pub share_prefill: f64,
    /// A token was streamed: it decoded.
    pub first_token: bool,
    pub output_tokens: u64,
    /// Prompt tokens the engine computed (not served from its prefix cache), where stated.
    pub uncached_prompt: Option<u64>,
    /// Mean requests in flight over its decode (the batch its steps were shared with).
    pub mean_in_flight: Option<f64>,
}

impl Facts {
    /// Its equal share of the GPUs' time while it was in flight: the price without a fit.
    pub fn time_share(&self, gpus: f64) -> GpuSeconds {
        GpuSeconds {
            prefill: gpus * self.share_prefill,
            decode: gpus * (self.share - self.share_prefill).max(0.0),
        }
    }

    /// Its price by the rule: prefill at the fitted cost per uncached token, and each decode
    /// step's fixed part shared by the batch it ran in plus its own part, on the GPUs of one
    /// engine (`gpus / replicas`). A request that never decoded, or whose prompt is not
    /// known, is priced by its time share for what the fit cannot say.
    pub fn price(&self, p: &Prices, gpus: f64, replicas: f64) -> GpuSeconds {
        if !self.first_token {
            return self.time_share(gpus);
        }
        let per_engine = gpus / replicas.max(1.0);
        let batch = (self.mean_in_flight.unwrap_or(1.0) / replicas.max(1.0)).max(1.0);
        let step = p.base / batch + p.per_seq;
        let decode = self.output_tokens.saturating_sub(1) as f64 * step * per_engine;
        let prefill = match self.uncached_prompt {
            Some(u) => (p.prefill_per_token * u as f64 + step) * per_engine,
            None => gpus * self.share_prefill,
        };
        GpuSeconds { prefill, decode }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Prices = Prices {
        base: 0.016,
        per_seq: 0.0002,
        prefill_per_token: 0.00005,
    };

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn a_request_pays_its_prefill_and_its_part_of_each_step() {
        let f = Facts {
            share: 1.0,
            share_prefill: 0.1,
            first_token: true,
            output_tokens: 101,
            uncached_prompt: Some(2000),
            mean_in_flight: Some(8.0),
        };
        let g = f.price(&P, 1.0, 1.0);
        // Each step: 16 ms / 8 + 0.2 ms = 2.2 ms; prefill 2000 x 0.05 ms + its first step.
        assert!(close(g.prefill, 0.1 + 0.0022), "{g:?}");
        assert!(close(g.decode, 100.0 * 0.0022), "{g:?}");
        // Two GPUs per engine cost twice; two replicas halve the batch each engine ran.
        let two = f.price(&P, 2.0, 1.0);
        assert!(close(two.total(), 2.0 * g.total()));
        let spread = f.price(&P, 2.0, 2.0);
        assert!(close(spread.decode, 100.0 * (0.016 / 4.0 + 0.0002)));
    }

    #[test]
    fn without_a_first_token_or_a_prompt_the_time_share_stands_in() {
        let failed = Facts {
            share: 0.5,
            share_prefill: 0.5,
            ..Facts::default()
        };
        assert_eq!(
            failed.price(&P, 4.0, 1.0),
            GpuSeconds {
                prefill: 2.0,
                decode: 0.0
            }
        );
        let no_usage = Facts {
            share: 1.0,
            share_prefill: 0.25,
            first_token: true,
            output_tokens: 1,
            uncached_prompt: None,
            mean_in_flight: None,
        };
        let g = no_usage.price(&P, 1.0, 1.0);
        assert!(close(g.prefill, 0.25) && close(g.decode, 0.0), "{g:?}");
    }
}
