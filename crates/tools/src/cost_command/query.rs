//! The bill for a range from a store: instant queries against a Prometheus-compatible HTTP API
//! (`GET /api/v1/query`, which Prometheus, VictoriaMetrics, Thanos and Mimir all serve).
//!
//! Each figure is one query at the range's end over the range's length,
//! `sum by (tenant, model, phase) (increase(tokenmeter_gpu_seconds_total[30d]))` with
//! `time=END`: summed over every pod and instance the store holds, and `increase`, not a
//! difference of two readings, because a counter starts again from 0 when its proxy restarts.
//! A store's `increase` is its own estimate: Prometheus extrapolates the first and last samples
//! in the range out to its edges, VictoriaMetrics counts from the last sample before the start.
//! They differ by about a scrape interval's share of the range at most: 15 s in 30 days is six
//! parts in a million.
//!
//! The I/O is the scrape's, for a JSON answer: plain `http://` (hyper's client, as
//! [`crate::scrape`]), a timeout over the whole exchange, a bounded body. The store's own error
//! (`"status": "error"`, a bad query, a timeout of its own) is read from the body whatever the
//! HTTP status, so the user sees why; anything else that is not a query API's answer is one
//! line naming the URL, never a panic. A URL with credentials in it is refused, and no URL is
//! printed with them.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use tokenmeter::metrics::names::cost as names;
use tokenmeter::metrics::names::OUTPUT_TOKENS_TOTAL;

use crate::scrape::{get_bounded, GetError, Http, MAX_SCRAPE};

use super::range::Range;
use super::split::{Row, Split};

/// How long one query may take, answer and body together. A month's `increase` over a fleet
/// reads every sample in it, which takes the store seconds to minutes; the stores end a query
/// themselves first (Prometheus's `--query.timeout` is 2 minutes, VictoriaMetrics'
/// `-search.maxQueryDuration` 30 s) and say so in an error this command prints. This only ends
/// a wait on something that never answers.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(150);

/// Largest answer read: the scrape's bound, which fits here too. A vector sample is some 100
/// bytes of JSON, at most about 300 with a 128-character model name and a 64-byte tenant, so
/// 16 MiB holds over 50,000 rows: twenty times the tenant, model and phase series one proxy can
/// export at its default caps (35 tenants x 33 models x 2 phases), room for a fleet whose
/// proxies saw different tenants. Past it is a wrong URL that streams, not a bill.
pub const MAX_ANSWER: usize = MAX_SCRAPE;

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// Not an `http://` URL with a host, or one with a query or fragment of its own.
    #[error(
        "--prometheus {0:?} is not an http:// URL of a query API (e.g. http://prometheus:9090)"
    )]
    BadUrl(String),
    /// `user:password@` in the URL: never sent, never printed back.
    #[error("--prometheus: a URL with credentials in it (user:password@) is not taken, and is not printed here")]
    Credentials,
    #[error("cannot query {url}: {reason}")]
    Fetch { url: String, reason: String },
    #[error("{url} answered an error: {kind}: {error}")]
    Store {
        url: String,
        kind: String,
        error: String,
    },
    #[error("{url} did not answer as a Prometheus query API: {reason}")]
    Answer { url: String, reason: String },
}

impl QueryError {
    /// True for errors the user fixes by changing the flags.
    pub fn is_usage(&self) -> bool {
        matches!(self, QueryError::BadUrl(_) | QueryError::Credentials)
    }
}

/// The base URL of a query API, without a trailing `/` or `/api/v1/query`: the URL checked.
pub fn base_url(url: &str) -> Result<String, QueryError> {
    let uri: Uri = url
        .parse()
        .map_err(|_| QueryError::BadUrl(url.to_string()))?;
    let authority = uri
        .authority()
        .ok_or_else(|| QueryError::BadUrl(url.to_string()))?;
    if authority.as_str().contains('@') {
        return Err(QueryError::Credentials);
    }
    if uri.scheme_str() != Some("http") || uri.query().is_some() || url.contains('#') {
        return Err(QueryError::BadUrl(url.to_string()));
    }
    let path = uri.path().trim_end_matches('/');
    let path = path.strip_suffix("/api/v1/query").unwrap_or(path);
    Ok(format!("http://{authority}{path}"))
}

/// One sample of an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// A vector answer, and the warnings the store sent with it (a partial answer, say).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Vector {
    pub samples: Vec<Sample>,
    pub warnings: Vec<String>,
}

/// The query API's envelope: `{"status": "success", "data": {...}}` or `{"status": "error",
/// "errorType": ..., "error": ...}`. Fields a store adds (`stats`, `isPartial`) are ignored.
#[derive(Deserialize)]
struct Envelope {
    status: String,
    data: Option<Data>,
    #[serde(rename = "errorType")]
    error_type: Option<String>,
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct VectorSample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    /// `[unix seconds, "value"]`: the value is a string, so NaN and infinities can be said.
    value: (f64, String),
}

/// Reads a query API's answer to an instant query; `url` names the store in errors.
pub fn parse_vector(url: &str, status: StatusCode, body: &[u8]) -> Result<Vector, QueryError> {
    let answer = |reason: String| QueryError::Answer {
        url: url.to_string(),
        reason,
    };
    let envelope: Envelope = match serde_json::from_slice(body) {
        Ok(e) => e,
        // A proxy's or a web server's page: the status says more than the parser.
        Err(_) if !status.is_success() => {
            return Err(QueryError::Fetch {
                url: url.to_string(),
                reason: format!("HTTP status {status}"),
            })
        }
        Err(e) => return Err(answer(format!("not JSON of the query API ({e})"))),
    };
    if envelope.status != "success" {
        return Err(QueryError::Store {
            url: url.to_string(),
            kind: one_line(envelope.error_type.as_deref().unwrap_or("unknown")),
            error: one_line(envelope.error.as_deref().unwrap_or("no error message")),
        });
    }
    let data = envelope
        .data
        .ok_or_else(|| answer("\"status\": \"success\" without \"data\"".into()))?;
    if data.result_type != "vector" {
        return Err(answer(format!(
            "a {:?} result where an instant vector was asked for",
            one_line(&data.result_type)
        )));
    }
    let raw: Vec<VectorSample> = serde_json::from_value(data.result)
        .map_err(|e| answer(format!("a vector result that is not one ({e})")))?;
    let samples = raw
        .into_iter()
        .map(|s| {
            let value = s
                .value
                .1
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| {
                    answer(format!(
                        "the value {:?} of {:?} is not a finite number",
                        one_line(&s.value.1),
                        s.metric
                    ))
                })?;
            Ok(Sample {
                labels: s.metric,
                value,
            })
        })
        .collect::<Result<_, QueryError>>()?;
    Ok(Vector {
        samples,
        warnings: envelope.warnings.iter().map(|w| one_line(w)).collect(),
    })
}

/// A store's message on one line, at most 300 characters: the error is one line.
fn one_line(s: &str) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut cut: String = flat.chars().take(300).collect();
    if flat.chars().count() > 300 {
        cut.push_str("...");
    }
    cut
}

/// `s` percent-encoded for a query string: every byte but the unreserved ones.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query API, queried again and again over one pooled client.
pub struct Store {
    client: Http,
    base: String,
}

impl Store {
    /// Checks the URL; nothing is sent yet.
    pub fn new(url: &str) -> Result<Store, QueryError> {
        Ok(Store {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: base_url(url)?,
        })
    }

    /// The base URL, as checked.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// One instant query at `time` (unix seconds, as the API takes them).
    pub async fn vector(&self, query: &str, time: &str) -> Result<Vector, QueryError> {
        let uri = format!(
            "{}/api/v1/query?query={}&time={}",
            self.base,
            encode(query),
            encode(time)
        );
        tokio::time::timeout(QUERY_TIMEOUT, self.get(&uri))
            .await
            .map_err(|_| self.fail(format!("no answer within {QUERY_TIMEOUT:?}")))?
    }

    async fn get(&self, uri: &str) -> Result<Vector, QueryError> {
        let uri: Uri = uri
            .parse()
            .map_err(|_| QueryError::BadUrl(self.base.clone()))?;
        let (status, body) =
            get_bounded(&self.client, uri, MAX_ANSWER)
                .await
                .map_err(|e| match e {
                    GetError::Fetch(reason) => self.fail(reason),
                    GetError::TooLarge => {
                        self.fail(format!("an answer over {} MiB", MAX_ANSWER >> 20))
                    }
                })?;
        parse_vector(&self.base, status, &body)
    }

    fn fail(&self, reason: String) -> QueryError {
        QueryError::Fetch {
            url: self.base.clone(),
            reason,
        }
    }
}

/// The queries of a bill over `window` (a PromQL range), each an instant vector.
pub struct Queries {
    /// By tenant, model and phase.
    pub gpu_seconds: String,
    /// By tenant, model and basis.
    pub usd: String,
    /// By tenant and model.
    pub output_tokens: String,
    /// One sample, or none when no tokenmeter was in the store.
    pub idle: String,
    /// At the end: busy time the requests then in flight held.
    pub in_flight: String,
}

impl Queries {
    pub fn new(window: &str) -> Queries {
        let increase =
            |metric: &str, by: &str| format!("sum by ({by}) (increase({metric}[{window}]))");
        Queries {
            gpu_seconds: increase(names::GPU_SECONDS, "tenant, model, phase"),
            usd: increase(names::GPU_COST_USD, "tenant, model, basis"),
            output_tokens: increase(OUTPUT_TOKENS_TOTAL, "tenant, model"),
            idle: format!("sum(increase({}[{window}]))", names::GPU_IDLE_SECONDS),
            in_flight: format!("sum({})", names::GPU_UNASSIGNED_SECONDS),
        }
    }
}

/// The answers to [`Queries`], made into a split: rows keyed as the scrape's are (`all` for a
/// tenant without the label), rows with no GPU time left out, dollars shown where any were
/// counted. None when the store holds no tokenmeter idle counter in the range: no tokenmeter
/// that charges GPU time was in it then.
pub fn split(
    gpu_seconds: &Vector,
    usd: &Vector,
    output_tokens: &Vector,
    idle: &Vector,
    in_flight: &Vector,
) -> Option<Split> {
    let idle = idle.samples.first()?.value;
    let mut rows: BTreeMap<(String, String), Row> = BTreeMap::new();
    let mut add = |s: &Sample, field: fn(&mut Row) -> &mut f64| {
        let key = (
            s.label("tenant").unwrap_or("all").to_owned(),
            s.label("model").unwrap_or("").to_owned(),
        );
        *field(rows.entry(key).or_default()) += s.value;
    };
    for s in &gpu_seconds.samples {
        match s.label("phase") {
            Some("prefill") => add(s, |r| &mut r.prefill),
            Some("decode") => add(s, |r| &mut r.decode),
            _ => {}
        }
    }
    for s in &usd.samples {
        match s.label("basis") {
            Some("usage") => add(s, |r| &mut r.usage_usd),
            Some("allocation") => add(s, |r| &mut r.allocation_usd),
            _ => {}
        }
    }
    for s in &output_tokens.samples {
        add(s, |r| &mut r.output_tokens);
    }
    rows.retain(|_, r| r.gpu_seconds() > 0.0);
    Some(Split {
        rows,
        idle,
        unassigned: in_flight.samples.iter().map(|s| s.value).sum(),
        gpus: None,
        usd: !usd.samples.is_empty(),
    })
}

/// The bill for `range` from `store`, and the warnings the store sent with its answers.
pub async fn bill(
    store: &Store,
    range: &Range,
) -> Result<(Option<Split>, Vec<String>), QueryError> {
    let q = Queries::new(&range.window());
    let time = range.end_param();
    let mut answers = Vec::with_capacity(5);
    for query in [
        &q.gpu_seconds,
        &q.usd,
        &q.output_tokens,
        &q.idle,
        &q.in_flight,
    ] {
        answers.push(store.vector(query, &time).await?);
    }
    let mut warnings: Vec<String> = answers.iter().flat_map(|a| a.warnings.clone()).collect();
    warnings.dedup();
    let [gpu_seconds, usd, output_tokens, idle, in_flight] = &answers[..] else {
        return Err(store.fail("lost an answer".into()));
    };
    Ok((
        split(gpu_seconds, usd, output_tokens, idle, in_flight),
        warnings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    const OK: StatusCode = StatusCode::OK;

    fn vector(json: &str) -> Result<Vector, QueryError> {
        parse_vector("http://store", OK, json.as_bytes())
    }

    fn sample(labels: &[(&str, &str)], value: f64) -> Sample {
        Sample {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    #[test]
    fn a_vector_answer_is_read_with_its_labels_and_warnings() {
        let v = vector(
            r#"{"status":"success","data":{"resultType":"vector","result":[
                {"metric":{"model":"m","phase":"prefill","tenant":"a"},"value":[1751328000.5,"3.25"]},
                {"metric":{"model":"m","phase":"decode"},"value":[1751328000,"1e3"]},
                {"metric":{},"value":[1751328000,"0"]}]},
              "warnings":["partial\nanswer"],"stats":{"seriesFetched":"3"},"isPartial":false}"#,
        )
        .expect("vector");
        assert_eq!(
            v.samples,
            vec![
                sample(
                    &[("model", "m"), ("phase", "prefill"), ("tenant", "a")],
                    3.25
                ),
                sample(&[("model", "m"), ("phase", "decode")], 1000.0),
                sample(&[], 0.0),
            ]
        );
        assert_eq!(v.warnings, vec!["partial answer".to_string()]);
    }

    #[test]
    fn an_empty_answer_is_no_samples() {
        let v = vector(r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#)
            .expect("vector");
        assert_eq!(v, Vector::default());
    }

    #[test]
    fn the_stores_error_is_said_whatever_the_status() {
        let body =
            br#"{"status":"error","errorType":"bad_data","error":"1:5: parse error:\nunexpected"}"#;
        for status in [
            StatusCode::BAD_REQUEST,
            StatusCode::UNPROCESSABLE_ENTITY,
            OK,
        ] {
            let Err(e) = parse_vector("http://store", status, body) else {
                panic!("an error answer is an error");
            };
            assert_eq!(
                e.to_string(),
                "http://store answered an error: bad_data: 1:5: parse error: unexpected"
            );
            assert!(!e.is_usage());
        }
    }

    #[test]
    fn what_is_not_a_vector_answer_is_one_line_naming_the_url() {
        let cases: &[(StatusCode, &str, &str)] = &[
            (
                OK,
                "<html>hi</html>",
                "did not answer as a Prometheus query API: not JSON",
            ),
            (OK, "{\"status\":\"success\"", "not JSON"),
            (OK, "", "not JSON"),
            (
                StatusCode::NOT_FOUND,
                "404 page not found",
                "HTTP status 404",
            ),
            (OK, r#"{"status":"success"}"#, "without \"data\""),
            (
                OK,
                r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#,
                "a \"scalar\" result",
            ),
            (
                OK,
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":"7"}]}}"#,
                "a vector result that is not one",
            ),
            (
                OK,
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"NaN"]}]}}"#,
                "not a finite number",
            ),
            (
                OK,
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"lots"]}]}}"#,
                "not a finite number",
            ),
        ];
        for (status, body, says) in cases {
            let Err(e) = parse_vector("http://store", *status, body.as_bytes()) else {
                panic!("{body} is no vector");
            };
            let line = e.to_string();
            assert!(
                line.contains(says) && line.contains("http://store"),
                "{body}: {line}"
            );
            assert!(!line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn only_a_plain_http_url_without_credentials_is_taken() {
        for (url, base) in [
            ("http://prometheus:9090", "http://prometheus:9090"),
            ("http://prometheus:9090/", "http://prometheus:9090"),
            (
                "http://vm:8481/select/0/prometheus",
                "http://vm:8481/select/0/prometheus",
            ),
            (
                "http://prometheus:9090/api/v1/query",
                "http://prometheus:9090",
            ),
        ] {
            assert_eq!(base_url(url).expect(url), base);
        }
        for bad in [
            "https://prometheus:9090",
            "prometheus:9090",
            "/api/v1/query",
            "http://p:9090/api/v1/query?query=up",
            "http://p:9090/#x",
            "not a url",
            "",
        ] {
            let e = base_url(bad).map(|_| ()).expect_err(bad);
            assert!(
                e.is_usage() && matches!(e, QueryError::BadUrl(_)),
                "{bad}: {e}"
            );
        }
        let e = base_url("http://admin:s3cret@prometheus:9090").expect_err("credentials");
        assert!(e.is_usage());
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn the_queries_name_the_products_metrics_and_sum_over_every_pod() {
        let q = Queries::new("2592000s");
        assert_eq!(
            q.gpu_seconds,
            "sum by (tenant, model, phase) (increase(tokenmeter_gpu_seconds_total[2592000s]))"
        );
        assert_eq!(
            q.usd,
            "sum by (tenant, model, basis) (increase(tokenmeter_gpu_cost_usd_total[2592000s]))"
        );
        assert_eq!(
            q.output_tokens,
            "sum by (tenant, model) (increase(tokenmeter_output_tokens_total[2592000s]))"
        );
        assert_eq!(
            q.idle,
            "sum(increase(tokenmeter_gpu_idle_seconds_total[2592000s]))"
        );
        assert_eq!(q.in_flight, "sum(tokenmeter_gpu_unassigned_seconds)");
        assert_eq!(encode("sum(x[5m]) / 2"), "sum%28x%5B5m%5D%29%20%2F%202");
    }

    #[test]
    fn the_answers_make_a_split() {
        let v = |samples: Vec<Sample>| Vector {
            samples,
            warnings: vec![],
        };
        let gpu = v(vec![
            sample(
                &[("tenant", "a"), ("model", "m"), ("phase", "prefill")],
                1.0,
            ),
            sample(&[("tenant", "a"), ("model", "m"), ("phase", "decode")], 2.0),
            sample(&[("model", "m"), ("phase", "decode")], 4.0),
            sample(&[("tenant", "c"), ("model", "m"), ("phase", "decode")], 0.0),
        ]);
        let usd = v(vec![
            sample(&[("tenant", "a"), ("model", "m"), ("basis", "usage")], 0.5),
            sample(
                &[("tenant", "a"), ("model", "m"), ("basis", "allocation")],
                0.75,
            ),
        ]);
        let tokens = v(vec![
            sample(&[("tenant", "a"), ("model", "m")], 3000.0),
            sample(&[("tenant", "c"), ("model", "m")], 10.0),
        ]);
        let idle = v(vec![sample(&[], 9.0)]);
        let s = split(&gpu, &usd, &tokens, &idle, &v(vec![sample(&[], 0.5)])).expect("split");
        assert_eq!(
            s.rows.keys().collect::<Vec<_>>(),
            [
                &("a".to_string(), "m".to_string()),
                &("all".to_string(), "m".to_string())
            ],
            "c had no GPU time in the range"
        );
        let a = s.rows[&("a".to_string(), "m".to_string())];
        assert_eq!(
            (
                a.prefill,
                a.decode,
                a.output_tokens,
                a.usage_usd,
                a.allocation_usd
            ),
            (1.0, 2.0, 3000.0, 0.5, 0.75)
        );
        assert_eq!(
            (s.idle, s.unassigned, s.gpus, s.usd),
            (9.0, 0.5, None, true)
        );
        let none = v(vec![]);
        assert!(
            !split(&gpu, &none, &tokens, &idle, &none)
                .expect("split")
                .usd
        );
        assert_eq!(
            split(&gpu, &usd, &tokens, &none, &none),
            None,
            "no tokenmeter"
        );
    }

    /// Serves one answer per connection, each the next of `answers`; records the requests.
    async fn serve(answers: Vec<Vec<u8>>) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let seen = tokio::spawn(async move {
            let mut seen = Vec::new();
            for answer in answers {
                let Ok((mut s, _)) = l.accept().await else {
                    break;
                };
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = s.write_all(&answer).await;
                let _ = s.shutdown().await;
            }
            seen
        });
        (format!("http://{addr}"), seen)
    }

    fn http(status: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[tokio::test]
    async fn a_bill_is_five_instant_queries_at_the_end_over_the_range() {
        let one = |v: &str| {
            format!(
                r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{}},"value":[1,"{v}"]}}]}}}}"#
            )
        };
        let gpu = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"model":"m","phase":"decode"},"value":[1,"6"]}]}}"#;
        let empty = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        let (url, seen) = serve(vec![
            http("200 OK", gpu),
            http("200 OK", empty),
            http("200 OK", empty),
            http("200 OK", &one("4")),
            http("200 OK", &one("0")),
        ])
        .await;
        let store = Store::new(&url).expect("store");
        let start = std::time::UNIX_EPOCH + Duration::from_secs(1_751_328_000);
        let range = Range {
            start,
            end: start + Duration::from_secs(3600),
        };
        let (s, warnings) = bill(&store, &range).await.expect("bill");
        let s = s.expect("a split");
        assert!(warnings.is_empty());
        assert_eq!(s.rows[&("all".to_string(), "m".to_string())].decode, 6.0);
        assert_eq!((s.idle, s.usd), (4.0, false));
        let seen = seen.await.expect("served");
        assert_eq!(seen.len(), 5);
        assert!(
            seen[0].starts_with(
                "GET /api/v1/query?query=sum%20by%20%28tenant%2C%20model%2C%20phase%29%20%28increase%28tokenmeter_gpu_seconds_total%5B3600s%5D%29%29&time=1751331600.000 HTTP/1.1"
            ),
            "{}",
            seen[0]
        );
    }

    #[tokio::test]
    async fn a_store_that_errs_or_is_not_there_is_one_line() {
        let (url, _) = serve(vec![http(
            "422 Unprocessable Entity",
            r#"{"status":"error","errorType":"execution","error":"query timed out"}"#,
        )])
        .await;
        let store = Store::new(&url).expect("store");
        let e = store.vector("up", "1").await.expect_err("an error");
        assert_eq!(
            e.to_string(),
            format!("{url} answered an error: execution: query timed out")
        );

        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        drop(l);
        let e = Store::new(&url)
            .expect("store")
            .vector("up", "1")
            .await
            .expect_err("nobody listening");
        assert!(
            e.to_string().starts_with(&format!("cannot query {url}: ")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn an_answer_past_the_bound_is_refused() {
        // One byte more than the bound, all of it sent: the read stops at the bound.
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            MAX_ANSWER + 1
        )
        .into_bytes();
        answer.resize(answer.len() + MAX_ANSWER + 1, b' ');
        let (url, _) = serve(vec![answer]).await;
        let e = Store::new(&url)
            .expect("store")
            .vector("up", "1")
            .await
            .expect_err("too large");
        assert!(e.to_string().contains("an answer over 16 MiB"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_never_answers_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        tokio::spawn(async move {
            let (_s, _) = l.accept().await.expect("accept");
            std::future::pending::<()>().await;
        });
        let e = Store::new(&url)
            .expect("store")
            .vector("up", "1")
            .await
            .expect_err("silent");
        assert!(e.to_string().contains("no answer within"), "{e}");
    }
}
