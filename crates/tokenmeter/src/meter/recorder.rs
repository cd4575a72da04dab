//! What every meter shares (the metrics, the capacity model, the books, the sinks), and
//! where a request's measurement begins: [`Recorder::receive`] reads its head once, and
//! [`Recorder::sent`] puts it in flight.

use std::sync::Arc;
use std::time::Instant;

use super::counting::Mismatches;
use super::{Clock, Concurrency, Head, Meter, Settings, Stage, State};
use crate::capacity::{Capacity, StreamGaps};
use crate::context::Identify;
use crate::cost::Ledger;
use crate::metrics::{Metrics, Phase};
use crate::protocol::detect;
use crate::protocol::operation::{Operation, Route};
use crate::protocol::request::RequestInfo;
use crate::read::Reader;
use crate::record::{FirstOutput, Sink};
use crate::slo::{Choice, Classes};
use crate::tenant::Tenants;

/// What every meter shares: the metrics, the concurrency tracker and the parsing limits.
pub struct Recorder {
    pub(super) metrics: Arc<Metrics>,
    /// The live capacity model the meter feeds (the server's); `None`: nothing is modelled.
    pub(super) capacity: Option<Arc<Capacity>>,
    pub(super) concurrency: Arc<Concurrency>,
    /// The GPUs' time, split among the requests in flight as it is spent (`crate::cost`).
    pub(super) ledger: Arc<Ledger>,
    /// `--max-line-bytes` and `--api`: how responses are read.
    pub(super) reading: Settings,
    /// The SLO class table (`--slo`): a request is in its default class until told otherwise.
    pub(super) classes: Arc<Classes>,
    /// The `tenant` label's resolver (`--tenant-header`, `--tenant-from-key`); `None`: no label.
    pub(super) tenants: Option<Arc<Tenants>>,
    /// Reads each request's [`Ident`] off its head; `None` when nothing takes it (no request
    /// log, no span export): then no request pays for it.
    pub(super) identify: Option<Identify>,
    /// What takes each finished record, in order: the metrics, the capacity model, the request
    /// log, the spans. The meter's work ends in one loop over them.
    pub(super) sinks: Vec<Arc<dyn Sink>>,
    /// With `--tokenizer`: the warning that its counts differ from the server's, rate-limited.
    pub(super) mismatches: Mismatches,
}

impl Recorder {
    /// A recorder into `metrics` that reads responses as `reading` says.
    pub fn new(metrics: Arc<Metrics>, reading: Settings) -> Self {
        let concurrency = Arc::new(Concurrency::default());
        let ledger = Arc::new(Ledger::new(metrics.gpus()));
        metrics.export_books(Arc::clone(&ledger));
        // Charges made before the first rates are settled into the same counters.
        let weak = Arc::downgrade(&metrics);
        ledger.settle_into(Box::new(move |model, tenant, g| {
            if let Some(m) = weak.upgrade() {
                m.charge_settled(model, tenant, g);
            }
        }));
        let sinks: Vec<Arc<dyn Sink>> = vec![Arc::clone(&metrics) as Arc<dyn Sink>];
        Recorder {
            metrics,
            capacity: None,
            concurrency,
            ledger,
            reading,
            classes: Arc::new(Classes::default()),
            tenants: None,
            identify: None,
            sinks,
            mismatches: Mismatches::default(),
        }
    }

    /// Hands every finished record to `sinks` too, after the metrics and the capacity model,
    /// with the heads read by `identify`.
    pub fn with_sinks(mut self, identify: Option<Identify>, sinks: Vec<Arc<dyn Sink>>) -> Self {
        self.identify = identify;
        self.sinks.extend(sinks);
        self
    }

    /// Feeds `capacity` as tokens pass and requests end (it takes each finished record right
    /// after the metrics).
    pub fn with_capacity(mut self, capacity: Arc<Capacity>) -> Self {
        self.sinks.insert(1, Arc::clone(&capacity) as Arc<dyn Sink>);
        capacity.publish_rates(Arc::clone(&self.ledger));
        self.capacity = Some(capacity);
        self
    }

    /// The concurrency tracker: requests in flight and their integral over time.
    pub fn concurrency(&self) -> &Concurrency {
        &self.concurrency
    }

    /// The metrics every meter records into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Labels requests by tenant (`--tenant-header`, `--tenant-from-key`).
    pub fn with_tenants(mut self, tenants: Option<Arc<Tenants>>) -> Self {
        self.tenants = tenants;
        self
    }

    /// Judges requests by these SLO classes (`--slo`, `--slo-file`).
    pub fn with_classes(mut self, classes: Arc<Classes>) -> Self {
        self.classes = classes;
        self
    }

    /// A request's head arrived at `arrived`: its meter, not yet in flight. What the head says
    /// is read here, once: the SLO class its headers and path name (a POST only: inference is
    /// always one), its tenant, and what the request log and spans take of it.
    pub fn receive<B>(self: &Arc<Self>, req: &http::Request<B>, arrived: Instant) -> Meter {
        let judged = req.method() == http::Method::POST;
        let (headers, path) = (req.headers(), req.uri().path());
        Meter {
            stage: Some(Stage::Received(Head {
                recorder: Arc::clone(self),
                arrived,
                slo: judged.then(|| self.classes.resolve(headers, path, None)),
                // Once per request, from the head: the hot path only carries the value.
                tenant: self.tenants.as_ref().map(|t| t.resolve(headers)),
                ident: self.identify.as_ref().map(|i| {
                    let authority = req.uri().authority().map(|a| a.as_str());
                    i.of_uri(req.method(), path, authority, headers)
                }),
            })),
        }
    }

    /// The measurement of a request sent now: it enters the in-flight gauges and the
    /// concurrency integral.
    pub(super) fn sent(self: &Arc<Self>, request: RequestInfo, arrived: Instant) -> State {
        let now = Instant::now();
        let in_flight = self.metrics.in_flight(request.model.as_deref());
        in_flight.add(Phase::Prefill, 1);
        let at_start = self.concurrency.update(now, 1);
        let ticket = self.ledger.enter(now, request.body_bytes, None);
        State {
            reader: Reader::opaque(),
            clock: Clock {
                recorder: Arc::clone(self),
                in_flight,
                request,
                start: arrived.min(now),
                status: 0,
                answered: false,
                encoded: false,
                model: None,
                first_byte: None,
                first_token: None,
                last_token: None,
                running_step_end: None,
                at_first: None,
                at_last: None,
                gaps: StreamGaps::default(),
                ttft_pending: None,
                max_stall: None,
                first_output: FirstOutput::default(),
                streamed: 0,
                held: 0,
                at_start,
                at_leave: None,
                ticket,
                share: None,
                slo: Some(self.classes.default_choice()),
                tenant: None,
                left: false,
                route: Route::default(),
                model_from_response: false,
                ident: None,
                counting: None,
            },
        }
    }
}

// === impl Head ===

impl Head {
    /// The request is sent now, with what its body said and its class: it enters the gauges.
    pub(super) fn send(self, request: RequestInfo, slo: Option<Choice>) -> State {
        let mut state = self.recorder.sent(request, self.arrived);
        let c = &mut state.clock;
        (c.slo, c.tenant, c.ident) = (slo, self.tenant, self.ident);
        state
    }
}

/// What the client's path says of the request: the GenAI operation and the format it implies.
pub(super) fn route(path: &str) -> Route {
    Route {
        operation: Operation::of_path(path),
        api: detect::path_hint(path),
    }
}
