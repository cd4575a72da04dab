//! GPU-seconds split by the phase they were spent on.

/// GPU-seconds by phase: a request's charge, or its price before the ledger scales it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuSeconds {
    pub prefill: f64,
    pub decode: f64,
}

impl GpuSeconds {
    pub fn total(&self) -> f64 {
        self.prefill + self.decode
    }

    /// Both phases times `k`.
    pub fn scaled(&self, k: f64) -> GpuSeconds {
        GpuSeconds {
            prefill: self.prefill * k,
            decode: self.decode * k,
        }
    }
}
