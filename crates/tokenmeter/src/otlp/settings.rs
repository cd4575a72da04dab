//! Where spans go and which are sampled: `--otlp-endpoint` and `--trace-sample`, else the
//! standard `OTEL_*` variables, as the OpenTelemetry SDKs read them. The command line hands the
//! two flags and its environment ([`Host`]) here; the rules are the exporter's own.
//!
//! - The endpoint: `--otlp-endpoint` (+ `/v1/traces`), else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//!   as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT` (+ `/v1/traces`); none: no spans. `http://`
//!   only.
//! - The sampler: `--trace-sample` (parent-based with that ratio), else `OTEL_TRACES_SAMPLER`
//!   and `OTEL_TRACES_SAMPLER_ARG`, else parent-based with no new traces.
//! - `service.name` from `OTEL_SERVICE_NAME` (default `tokenmeter`), the resource from
//!   `OTEL_RESOURCE_ATTRIBUTES`.
//!
//! A variable set to blanks counts as unset, as in the SDKs.

use http::Uri;

use super::TracingConfig;
use crate::context::{parse_ratio, Sampler};
use crate::host::Host;

/// The command line's two tracing flags, as given.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flags<'a> {
    /// `--otlp-endpoint`: the collector's base URL.
    pub endpoint: Option<&'a str>,
    /// `--trace-sample`: the share of new traces, 0 to 1.
    pub sample: Option<&'a str>,
}

/// Why span export was refused: each names the flag or variable.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BadSetting {
    #[error("--trace-sample {0:?} is not a ratio from 0 to 1")]
    TraceSample(String),
    #[error("{0}")]
    Sampler(String),
    #[error("{0} {1:?} is not an http:// URL")]
    Endpoint(&'static str, String),
}

impl TracingConfig {
    /// Span export as `flags` and the `OTEL_*` variables of `host` set it; `None`: no spans.
    pub fn from_flags(flags: Flags<'_>, host: &dyn Host) -> Result<Option<Self>, BadSetting> {
        let var = |k: &str| host.var(k).filter(|v| !v.trim().is_empty());
        let endpoint = match (flags.endpoint, var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
            (Some(url), _) => Some(("--otlp-endpoint", traces_url(url))),
            (None, Some(url)) => Some(("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)),
            (None, None) => var("OTEL_EXPORTER_OTLP_ENDPOINT")
                .map(|u| ("OTEL_EXPORTER_OTLP_ENDPOINT", traces_url(&u))),
        };
        let Some((source, url)) = endpoint else {
            return Ok(None);
        };
        let endpoint = url
            .trim()
            .parse::<Uri>()
            .ok()
            .filter(|u| u.scheme_str() == Some("http") && u.authority().is_some())
            .ok_or_else(|| BadSetting::Endpoint(source, url.clone()))?;
        let sampler = match (flags.sample, var("OTEL_TRACES_SAMPLER")) {
            (Some(r), _) => Sampler {
                parent_based: true,
                root: parse_ratio(r).ok_or_else(|| BadSetting::TraceSample(r.to_string()))?,
            },
            (None, Some(name)) => {
                let arg = var("OTEL_TRACES_SAMPLER_ARG");
                Sampler::from_otel(&name, arg.as_deref()).map_err(BadSetting::Sampler)?
            }
            (None, None) => Sampler::default(),
        };
        Ok(Some(TracingConfig {
            endpoint,
            service_name: var("OTEL_SERVICE_NAME").unwrap_or_else(|| "tokenmeter".to_string()),
            resource: var("OTEL_RESOURCE_ATTRIBUTES")
                .map(|s| resource_attributes(&s))
                .unwrap_or_default(),
            sampler,
        }))
    }
}

/// An OTLP base URL with the traces path, as the exporters add it: `URL/v1/traces`.
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim().trim_end_matches('/'))
}

/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value` pairs, comma-separated, percent-decoded; a pair
/// without `=` or with an empty key is skipped, as the SDKs skip it.
fn resource_attributes(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            let k = percent_decode(k.trim());
            (!k.is_empty()).then(|| (k, percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MapHost;

    #[test]
    fn the_flag_then_the_standard_variables() {
        let on = |extra: &[&str], host: MapHost| {
            let flag = |name: &str| {
                let at = extra.iter().position(|a| *a == name)?;
                extra.get(at + 1).copied()
            };
            let flags = Flags {
                endpoint: flag("--otlp-endpoint"),
                sample: flag("--trace-sample"),
            };
            TracingConfig::from_flags(flags, &host)
        };
        assert_eq!(on(&[], MapHost::default()), Ok(None));
        let t = on(
            &["--otlp-endpoint", "http://otel:4318/"],
            MapHost::default(),
        )
        .expect("valid")
        .expect("on");
        assert_eq!(t.endpoint.to_string(), "http://otel:4318/v1/traces");
        assert_eq!(t.service_name, "tokenmeter");
        assert_eq!(t.sampler, Sampler::default());
        let host = MapHost::default()
            .var("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318")
            .var(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:4318/custom",
            )
            .var("OTEL_SERVICE_NAME", "gw")
            .var(
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod,team=a%2Cb,bad",
            )
            .var("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
            .var("OTEL_TRACES_SAMPLER_ARG", "0.5");
        let t = on(&[], host).expect("valid").expect("on");
        assert_eq!(t.endpoint.to_string(), "http://traces:4318/custom");
        assert_eq!(t.service_name, "gw");
        assert_eq!(
            t.resource,
            vec![
                ("deployment.environment".to_string(), "prod".to_string()),
                ("team".to_string(), "a,b".to_string()),
            ]
        );
        assert_eq!(
            t.sampler,
            Sampler {
                parent_based: true,
                root: 0.5
            }
        );
        let host = MapHost::default().var("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318");
        let t = on(&["--trace-sample", "1"], host)
            .expect("valid")
            .expect("on");
        assert_eq!(t.endpoint.to_string(), "http://base:4318/v1/traces");
        assert_eq!(
            t.sampler,
            Sampler {
                parent_based: true,
                root: 1.0
            }
        );
        assert_eq!(
            on(&["--otlp-endpoint", "otel:4318"], MapHost::default()),
            Err(BadSetting::Endpoint(
                "--otlp-endpoint",
                "otel:4318/v1/traces".into()
            ))
        );
        assert_eq!(
            on(
                &["--otlp-endpoint", "http://o:1", "--trace-sample", "2"],
                MapHost::default()
            ),
            Err(BadSetting::TraceSample("2".into()))
        );
    }
}
