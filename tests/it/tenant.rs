//! The `tenant` label through real sockets: bounded by `--max-tenants`, the allow-list pinned,
//! key ids from bearer tokens, absent without the flags, never logged, bad flags refused.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokenmeter_tools::exposition::Scrape;

use tokenmeter::metrics::names;

use crate::cli::{sigterm, start_binary};
use crate::support::client;
use crate::support::metrics::metric;
use crate::support::spawn_proxy;
use crate::support::tls::Dir;
use crate::support::upstream::{self, Reply};

/// An upstream that answers every request with a short OpenAI stream (3 tokens, usage).
async fn chat_upstream() -> upstream::Upstream {
    let ms = Duration::from_millis(1);
    upstream::spawn(move |_| Reply::sse(upstream::openai_chat(ms, 3, ms, true))).await
}

/// POSTs a streaming chat request with `headers` to the proxy at `base`, reads the response.
async fn chat(base: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = http::Request::post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = client::chat_request(true, true);
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
    let resp = client::client().request(req).await.expect("response");
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

/// `tenant` label value -> requests, from `tokenmeter_requests_total`.
fn tenants(scrape: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in Scrape::parse(scrape).samples() {
        if s.name == "tokenmeter_requests_total" {
            let t = s
                .label("tenant")
                .expect("every request has a tenant")
                .to_string();
            *out.entry(t).or_default() += s.value;
        }
    }
    out
}

#[tokio::test]
async fn a_hundred_tenants_give_max_tenants_plus_one_values() {
    let up = chat_upstream().await;
    let proxy = spawn_proxy(
        &up.url(),
        &["--tenant-header", "x-tenant", "--max-tenants", "5"],
    )
    .await;
    for i in 0..100 {
        let t = format!("tenant-{i}");
        assert_eq!(chat(&proxy.url(), &[("x-tenant", &t)]).await, 200);
    }
    let s = proxy.settled(100.0).await;
    let got = tenants(&s);
    let want: BTreeMap<String, f64> = (0..5)
        .map(|i| (format!("tenant-{i}"), 1.0))
        .chain([("other".to_string(), 95.0)])
        .collect();
    assert_eq!(got, want, "{s}");
    // The other families carry the same bounded set (a histogram and a counter, say).
    for family in [
        "tokenmeter_request_tokens_per_second_count",
        "tokenmeter_output_tokens_total",
    ] {
        let values: std::collections::BTreeSet<_> = Scrape::parse(&s)
            .samples()
            .iter()
            .filter(|x| x.name == family)
            .filter_map(|x| x.label("tenant").map(String::from))
            .collect();
        assert_eq!(values.len(), 6, "{family}: {values:?}");
    }
    assert_eq!(
        metric(names::OUTPUT_TOKENS_TOTAL)
            .label("tenant", "other")
            .value(&s),
        95.0 * 3.0
    );
}

#[tokio::test]
async fn a_pinned_tenant_keeps_its_own_series_after_the_cap_is_full() {
    let dir = Dir::new("tenants");
    let file = dir.write(
        "allow.txt",
        "# paying customers\nvip-1\nvip-2 # since March\n",
    );
    let up = chat_upstream().await;
    let flags = [
        "--tenant-header",
        "x-tenant",
        "--max-tenants",
        "2",
        "--tenant-allow-file",
        Dir::arg(&file),
    ];
    let proxy = spawn_proxy(&up.url(), &flags).await;
    for t in ["a", "b", "c", "d", "vip-1", "a", "not a name!", ""] {
        let headers: &[(&str, &str)] = if t.is_empty() {
            &[]
        } else {
            &[("x-tenant", t)]
        };
        assert_eq!(chat(&proxy.url(), headers).await, 200);
    }
    let s = proxy.settled(8.0).await;
    let want: BTreeMap<String, f64> = [
        ("a", 2.0),
        ("b", 1.0),
        ("other", 2.0),
        ("vip-1", 1.0),
        ("invalid", 1.0),
        ("none", 1.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(tenants(&s), want, "{s}");
}

#[tokio::test]
async fn from_key_the_same_token_is_the_same_id_and_the_token_never_shows() {
    let up = chat_upstream().await;
    let proxy = spawn_proxy(&up.url(), &["--tenant-from-key"]).await;
    let (alpha, beta) = ("sk-alpha-3c9f0e1d2b", "sk-beta-77aa01ff4e");
    for token in [alpha, beta, alpha] {
        let auth = format!("Bearer {token}");
        assert_eq!(chat(&proxy.url(), &[("authorization", &auth)]).await, 200);
    }
    // Anthropic's clients send the key in x-api-key: the same key, the same tenant.
    assert_eq!(chat(&proxy.url(), &[("x-api-key", beta)]).await, 200);
    assert_eq!(chat(&proxy.url(), &[]).await, 200);
    let s = proxy.settled(5.0).await;
    let (a, b) = (
        tokenmeter::tenant::key_id(alpha.as_bytes()),
        tokenmeter::tenant::key_id(beta.as_bytes()),
    );
    assert_ne!(a, b);
    let want: BTreeMap<String, f64> = [(a.as_str(), 2.0), (b.as_str(), 2.0), ("none", 1.0)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(tenants(&s), want, "{s}");
    for secret in [alpha, beta, "sk-alpha", "sk-beta"] {
        assert!(!s.contains(secret), "{secret} in the exposition:\n{s}");
    }
}

#[tokio::test]
async fn without_the_flags_there_is_no_tenant_label() {
    let up = chat_upstream().await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let headers = [("x-tenant", "team-a"), ("authorization", "Bearer sk-x")];
    assert_eq!(chat(&proxy.url(), &headers).await, 200);
    let s = proxy.settled(1.0).await;
    assert!(!s.contains("tenant"), "{s}");
    assert!(!s.contains("team-a"), "{s}");
}

#[tokio::test]
async fn tenant_header_values_and_tokens_never_reach_the_logs() {
    let up = chat_upstream().await;
    let flags = [
        "--tenant-header",
        "x-tenant",
        "--tenant-from-key",
        "--max-tenants",
        "2",
    ];
    // Every target at TRACE: tokenmeter's and its libraries' (hyper, h2, rustls, tower).
    let (mut child, port, mport) = start_binary(&up.url(), &flags, "trace").await;
    let base = format!("http://127.0.0.1:{port}");
    let requests: [&[(&str, &str)]; 5] = [
        &[("x-tenant", "QuietOrchid-4471")],
        &[("x-tenant", "AmberFalcon-9022")],
        // Over the cap, and an invalid value: neither reaches a label or a log.
        &[("x-tenant", "CopperWren-1187")],
        &[("x-tenant", "Velvet Lantern 3305")],
        &[("authorization", "Bearer sk-live-TOKEN-5c1e8a7d3b")],
    ];
    for headers in requests {
        assert_eq!(chat(&base, headers).await, 200);
    }
    let scrape = client::get_text(&format!("http://127.0.0.1:{mport}/metrics")).await;
    // The label is the header's value (it is what the label is for), not the log's.
    assert!(scrape.contains("QuietOrchid-4471"), "{scrape}");
    sigterm(&child);
    let out = tokio::task::spawn_blocking(move || {
        let _ = child.wait();
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(child.stderr.as_mut().expect("stderr"), &mut s);
        s
    })
    .await
    .expect("join");
    // The capture holds TRACE lines of the requests themselves, so a leak would be caught.
    assert!(out.contains("TRACE"), "no trace lines captured:\n{out}");
    assert!(out.contains("request finished"), "no request lines:\n{out}");
    for secret in [
        "QuietOrchid",
        "AmberFalcon",
        "CopperWren",
        "Velvet Lantern",
        "sk-live-TOKEN",
        "5c1e8a7d3b",
    ] {
        assert!(!out.contains(secret), "{secret} logged at TRACE:\n{out}");
    }
}

/// The binary with an upstream and `args`, expecting a configuration error.
fn run_err(args: &[&str]) -> (i32, String) {
    crate::cli::run_err(&[&["--upstream", "http://127.0.0.1:1"], args].concat())
}

#[test]
fn bad_tenant_flags_exit_64_with_one_line_naming_the_flag() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["--tenant-header", "x-tenant", "--max-tenants", "0"],
            "--max-tenants",
        ),
        (
            &[
                "--tenant-header",
                "x-tenant",
                "--tenant-allow-file",
                "/nonexistent/tenants",
            ],
            "--tenant-allow-file",
        ),
        // Options of a label that does not exist.
        (&["--max-tenants", "8"], "--max-tenants"),
        (
            &["--tenant-allow-file", "/etc/hostname"],
            "--tenant-allow-file",
        ),
        // A credential as a label value.
        (&["--tenant-header", "Authorization"], "--tenant-header"),
        (&["--tenant-header", "x tenant"], "--tenant-header"),
    ];
    for (args, flag) in cases {
        let (code, err) = run_err(args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
        let line = err.trim().trim_start_matches("tokenmeter: error: ");
        assert!(line.starts_with("--"), "{args:?}: {err}");
    }
    let dir = Dir::new("tenants-bad");
    let file = dir.write("allow.txt", "ok\nnot ok\n");
    let (code, err) = run_err(&["--tenant-from-key", "--tenant-allow-file", Dir::arg(&file)]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("--tenant-allow-file") && err.contains("line 2"),
        "{err}"
    );
}

#[test]
fn every_tenant_flag_is_explained_with_its_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .arg("--help")
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&out.stdout);
    for (flag, env) in [
        ("--tenant-header", "TOKENMETER_TENANT_HEADER"),
        ("--tenant-from-key", "TOKENMETER_TENANT_FROM_KEY"),
        ("--max-tenants", "TOKENMETER_MAX_TENANTS"),
        ("--tenant-allow-file", "TOKENMETER_TENANT_ALLOW_FILE"),
    ] {
        assert!(help.contains(flag), "--help does not mention {flag}");
        assert!(help.contains(env), "--help does not mention {env}");
    }
}
