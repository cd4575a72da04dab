//! One GET of a `/metrics` page, parsed: what the tools beside the proxy (`tokenmeter bench
//! --proxy-metrics`, `tokenmeter capacity --metrics`) read tokenmeter's figures back with.
//!
//! [`tokenmeter::exposition`] parses text and does no I/O; this is the I/O around it: a plain
//! `http://` URL, a timeout over the whole exchange, a success status, and a bounded body (a
//! wrong URL that streams forever must not fill the memory). The request path never uses it.

use std::time::Duration;

use bytes::Bytes;
use http::{StatusCode, Uri};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use tokenmeter::exposition::Scrape;

/// How long one scrape may take, answer and body together: tokenmeter renders its exposition
/// in milliseconds, so this only ends a wait for something that is not a tokenmeter.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest exposition read: tokenmeter's is tens of KiB (a few hundred KiB with many models and
/// classes), so this only stops a wrong URL that streams forever.
pub const MAX_SCRAPE: usize = 16 << 20;

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// Not an `http://` URL with a host (the caller names its flag).
    #[error("{0:?} is not an http:// URL")]
    BadUrl(String),
    #[error("cannot scrape {url}: {reason}")]
    Fetch { url: String, reason: String },
}

/// A plain-HTTP client for GETs with no body: the scrape's, and the query API's.
pub type Http = Client<HttpConnector, Empty<Bytes>>;

/// Why a bounded GET failed.
#[derive(Debug)]
pub enum GetError {
    /// The exchange failed; the reason, in one line.
    Fetch(String),
    /// The body was longer than the bound.
    TooLarge,
}

/// GETs `uri` and reads at most `max` bytes of its body: its status and body, whatever the
/// status (the caller decides what a failure status means). No timeout: the caller's covers
/// the whole exchange.
pub async fn get_bounded(
    client: &Http,
    uri: Uri,
    max: usize,
) -> Result<(StatusCode, Bytes), GetError> {
    let resp = client
        .get(uri)
        .await
        .map_err(|e| GetError::Fetch(e.to_string()))?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), max)
        .collect()
        .await
        .map_err(|e| match e.downcast_ref::<LengthLimitError>() {
            Some(_) => GetError::TooLarge,
            None => GetError::Fetch(e.to_string()),
        })?
        .to_bytes();
    Ok((status, body))
}

/// The path tokenmeter serves its exposition on.
pub const METRICS_PATH: &str = "/metrics";

/// A `--metrics` URL as the commands read it: a base URL with no path (`http://host:9090`, or
/// with a lone `/`) is what a user types for "the metrics listener", and its root is the page,
/// not the exposition, so `/metrics` is added. The second value says whether it was, for the
/// command to say which URL it read. Anything else is kept as given (a checked URL fails later
/// with its flag's name).
pub fn metrics_url(url: &str) -> (String, bool) {
    let Ok(uri) = url.parse::<Uri>() else {
        return (url.to_string(), false);
    };
    // No path, or `/` alone with no query.
    let bare = uri.path_and_query().map_or(true, |pq| pq.as_str() == "/");
    match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(authority)) if bare => {
            (format!("http://{authority}{METRICS_PATH}"), true)
        }
        _ => (url.to_string(), false),
    }
}

/// Whether a scrape is a Prometheus server's own exposition: what a user gets who gave a
/// Prometheus server's address where a tokenmeter's was meant (both default to port 9090).
pub fn is_prometheus(scrape: &Scrape) -> bool {
    scrape.contains("prometheus_build_info")
}

/// Scrapes one URL, again and again over one pooled client.
pub struct Scraper {
    client: Http,
    url: String,
    uri: Uri,
}

impl Scraper {
    /// Checks the URL; nothing is sent yet.
    pub fn new(url: &str) -> Result<Scraper, ScrapeError> {
        let uri: Uri = url
            .parse()
            .ok()
            .filter(|u: &Uri| u.scheme_str() == Some("http") && u.authority().is_some())
            .ok_or_else(|| ScrapeError::BadUrl(url.to_string()))?;
        Ok(Scraper {
            client: Client::builder(TokioExecutor::new()).build_http(),
            url: url.to_string(),
            uri,
        })
    }

    /// The URL as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// GETs the page and parses it.
    pub async fn get(&self) -> Result<Scrape, ScrapeError> {
        tokio::time::timeout(SCRAPE_TIMEOUT, self.fetch())
            .await
            .map_err(|_| self.fail(format!("no answer within {SCRAPE_TIMEOUT:?}")))?
    }

    async fn fetch(&self) -> Result<Scrape, ScrapeError> {
        let (status, body) = get_bounded(&self.client, self.uri.clone(), MAX_SCRAPE)
            .await
            .map_err(|e| match e {
                GetError::Fetch(reason) => self.fail(reason),
                // The bounded body's own words, as before.
                GetError::TooLarge => self.fail("length limit exceeded".to_owned()),
            })?;
        if !status.is_success() {
            return Err(self.fail(format!("HTTP status {status}")));
        }
        Ok(Scrape::parse(&String::from_utf8_lossy(&body)))
    }

    fn fail(&self, reason: String) -> ScrapeError {
        ScrapeError::Fetch {
            url: self.url.clone(),
            reason,
        }
    }
}

/// One scrape of `url`.
pub async fn scrape(url: &str) -> Result<Scrape, ScrapeError> {
    Scraper::new(url)?.get().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Serves `answers` in turn, one connection each, then stops.
    async fn serve(answers: Vec<Vec<u8>>) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            for answer in answers {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(&answer).await;
                let _ = s.shutdown().await;
            }
        });
        format!("http://{addr}/metrics")
    }

    fn http(status: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[test]
    fn only_a_plain_http_url_with_a_host_is_taken() {
        for bad in [
            "https://h/metrics",
            "h:9090/metrics",
            "/metrics",
            "not a url",
            "",
        ] {
            assert!(
                matches!(Scraper::new(bad), Err(ScrapeError::BadUrl(ref u)) if u == bad),
                "{bad}"
            );
        }
        assert_eq!(
            Scraper::new("http://h:9090/metrics").expect("ok").url(),
            "http://h:9090/metrics"
        );
    }

    #[test]
    fn a_base_url_reads_metrics_and_any_other_is_kept() {
        for (given, read) in [
            ("http://localhost:9090", "http://localhost:9090/metrics"),
            ("http://localhost:9090/", "http://localhost:9090/metrics"),
            ("http://10.0.0.1", "http://10.0.0.1/metrics"),
        ] {
            assert_eq!(metrics_url(given), (read.to_string(), true), "{given}");
        }
        for kept in [
            "http://localhost:9090/metrics",
            "http://localhost:9090/custom/path",
            "http://localhost:9090/?x=1",
            "https://localhost:9090",
            "localhost:9090",
            "not a url",
            "",
        ] {
            assert_eq!(metrics_url(kept), (kept.to_string(), false), "{kept}");
        }
    }

    #[test]
    fn a_prometheus_servers_own_page_is_told_from_a_tokenmeters() {
        let prometheus =
            "# TYPE prometheus_build_info gauge\nprometheus_build_info{version=\"3.0.0\"} 1\n";
        assert!(is_prometheus(&Scrape::parse(prometheus)));
        let tokenmeter =
            "# TYPE tokenmeter_build_info gauge\ntokenmeter_build_info{version=\"0.1.0\"} 1\n";
        assert!(!is_prometheus(&Scrape::parse(tokenmeter)));
    }

    #[tokio::test]
    async fn a_page_is_parsed_and_a_bad_status_is_an_error_naming_the_url() {
        let url = serve(vec![
            http("200 OK", "# TYPE up gauge\nup 1\nx{a=\"b\"} 2.5\n"),
            http("503 Service Unavailable", "draining"),
        ])
        .await;
        let s = scrape(&url).await.expect("scraped");
        assert_eq!(s.sum("x", &[("a", "b")]), 2.5);
        assert!(s.contains("up"));
        let Err(e) = scrape(&url).await else {
            panic!("a 503 is an error")
        };
        let line = e.to_string();
        assert!(
            line.starts_with(&format!("cannot scrape {url}: HTTP status 503")),
            "{line}"
        );
    }

    #[tokio::test]
    async fn nobody_listening_is_an_error_not_a_wait() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/metrics", l.local_addr().expect("addr"));
        drop(l);
        assert!(matches!(scrape(&url).await, Err(ScrapeError::Fetch { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_never_answers_times_out() {
        // Accepts and reads, never answers.
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/metrics", l.local_addr().expect("addr"));
        tokio::spawn(async move {
            let (_s, _) = l.accept().await.expect("accept");
            std::future::pending::<()>().await;
        });
        let Err(e) = scrape(&url).await else {
            panic!("a silent server is an error")
        };
        assert!(e.to_string().contains("no answer within"), "{e}");
    }
}
