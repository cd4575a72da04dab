//! What tests and benches drive a meter with, beside the proxy's own path: a request sent
//! without a head read first, and the facts the head would have given set by hand. Compiled
//! for tests and the `testing` feature only.

use std::sync::Arc;
use std::time::Instant;

use super::recorder::route;
use super::{Meter, Recorder, Stage};
use crate::context::Ident;
use crate::protocol::request::RequestInfo;
use crate::slo::Choice;

impl Recorder {
    /// A request that arrived just now is being sent upstream (for tests and benches: the
    /// proxy receives a request first, [`Recorder::receive`], and sends it when it is read).
    pub fn start(self: &Arc<Self>, request: RequestInfo) -> Meter {
        self.start_at(request, Instant::now())
    }

    /// A request that arrived at `arrived` is being sent upstream now (for tests and benches).
    pub fn start_at(self: &Arc<Self>, request: RequestInfo, arrived: Instant) -> Meter {
        Meter {
            stage: Some(Stage::Sent(self.sent(request, arrived))),
        }
    }
}

impl Meter {
    /// The request's SLO class and targets (chosen from its headers, path and model), or `None`
    /// for a request that is not judged.
    pub fn set_slo(&mut self, choice: Option<Choice>) {
        if let Some(s) = self.sending() {
            s.clock.slo = choice;
        }
    }

    /// The request's path (the client's, before any `--upstream` prefix): what it says of the
    /// GenAI operation and the wire format, known before any response (so a request that fails
    /// before its response head still has them).
    pub fn set_route(&mut self, path: &str) {
        if let Some(s) = self.sending() {
            s.clock.route = route(path);
        }
    }

    /// The request's `tenant` label value (bounded: [`Tenants::resolve`]); set before the first
    /// token, which resolves the live handles with it.
    pub fn set_tenant(&mut self, tenant: Option<Arc<str>>) {
        if let Some(s) = self.sending() {
            s.clock.tenant = tenant;
        }
    }

    /// What the request's head said of it (for the request log and the span).
    pub fn set_ident(&mut self, ident: Option<Arc<Ident>>) {
        if let Some(s) = self.sending() {
            s.clock.ident = ident;
        }
    }
}
