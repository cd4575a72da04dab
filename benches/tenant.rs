//! What the tenant label costs a request: resolving it from the head (once per request), and a
//! whole short request through the meter with and without the label, side by side so the
//! figures read as ratios on a noisy machine.
//!
//! `cargo bench --bench tenant`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderName, HeaderValue};
use tokenmeter::capacity::{Capacity, Inputs};
use tokenmeter::meter::Recorder;
use tokenmeter::metrics::{Metrics, MetricsConfig};
use tokenmeter::protocol::request::RequestInfo;
use tokenmeter::record::Outcome;
use tokenmeter::tenant::{TenantConfig, Tenants};

/// A short OpenAI stream: a role chunk, 16 content chunks, usage, `[DONE]`.
fn stream() -> Vec<Vec<u8>> {
    let chunk = |delta: &str| {
        format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n").into_bytes()
    };
    let mut v = vec![chunk(r#"{"role":"assistant","content":""}"#)];
    v.extend((0..16).map(|i| chunk(&format!("{{\"content\":\"t{i} \"}}"))));
    v.push(b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":16,\"total_tokens\":28}}\n\n".to_vec());
    v.push(b"data: [DONE]\n\n".to_vec());
    v
}

fn head(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        let name = HeaderName::from_bytes(k.as_bytes()).expect("name");
        h.insert(name, HeaderValue::from_str(v).expect("value"));
    }
    h
}

fn bench(c: &mut Criterion) {
    let tenants = Tenants::new(&TenantConfig {
        header: Some(HeaderName::from_static("x-tenant")),
        from_key: true,
        max: 32,
        pinned: vec!["vip".into()],
    });
    let known = head(&[("x-tenant", "team-a")]);
    let key = head(&[(
        "authorization",
        "Bearer sk-proj-0123456789abcdefghijklmnopqrstuvwxyz",
    )]);
    let invalid = head(&[("x-tenant", "not a name")]);
    tenants.resolve(&known);
    tenants.resolve(&key);
    let mut g = c.benchmark_group("tenant_resolve");
    g.bench_function("header_seen", |b| {
        b.iter(|| tenants.resolve(black_box(&known)))
    });
    g.bench_function("bearer_key_sha256", |b| {
        b.iter(|| tenants.resolve(black_box(&key)))
    });
    g.bench_function("invalid_header", |b| {
        b.iter(|| tenants.resolve(black_box(&invalid)))
    });
    g.finish();

    // A whole request: start, response head, 19 frames, finish (record), without and with the
    // label (its resolution included).
    let frames = stream();
    let mut g = c.benchmark_group("request");
    for tenant in [false, true] {
        let metrics = Metrics::new(&MetricsConfig {
            tenant,
            ..MetricsConfig::default()
        })
        .expect("metrics");
        let recorder = Arc::new(
            Recorder::new(Arc::new(metrics), Default::default())
                .with_capacity(Arc::new(Capacity::new(Inputs::default(), Instant::now()))),
        );
        let name = if tenant {
            "with_tenant"
        } else {
            "without_tenant"
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut m = recorder.start(RequestInfo::default());
                if tenant {
                    m.set_tenant(Some(tenants.resolve(&known)));
                }
                m.on_response(200, "/v1/chat/completions", "text/event-stream", false);
                let t0 = Instant::now();
                for (i, f) in frames.iter().enumerate() {
                    m.on_data(f, t0 + Duration::from_millis(20 * i as u64));
                }
                m.finish(Outcome::Complete);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
