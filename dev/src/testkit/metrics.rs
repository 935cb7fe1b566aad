//! Helpers for the operations tests: plain HTTP and HTTPS GETs against relaylet's ports, and
//! reading Prometheus exposition text with the `prometheus-parse` crate.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use prometheus_parse::{Scrape, Value};

/// A GET's status and body.
pub struct Got {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// GET `path` from `addr` over plain HTTP.
pub async fn http_get(addr: SocketAddr, path: &str) -> Got {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the metrics port");
    get(TokioIo::new(tcp), addr, path, &[]).await
}

/// GET `path` from `addr` over TLS with `tls` (a client identity and trust), with `headers`.
pub async fn https_get(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    path: &str,
    headers: &[(&str, &str)],
) -> Got {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the kubelet port");
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .expect("TLS handshake with relaylet");
    get(TokioIo::new(stream), addr, path, headers).await
}

async fn get<I>(io: I, addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Got
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let fut = async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("HTTP handshake");
        tokio::spawn(conn);
        let mut req = http::Request::get(path).header(http::header::HOST, addr.to_string());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = sender
            .send_request(req.body(Empty::<bytes::Bytes>::new()).expect("request"))
            .await
            .expect("response");
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        Got {
            status,
            content_type,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    };
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("GET answered in time")
}

/// Parses exposition text.
pub fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid exposition text")
}

/// The value of sample `name` whose labels include all of `labels`; `None` if absent.
pub fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .and_then(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        })
}

/// Like [`value`], 0 when absent (a counter not yet created).
pub fn count(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(scrape, name, labels).unwrap_or(0.0)
}

/// The sum of every sample of `name` whose labels include all of `labels` (a counter over all
/// its other labels: results, kinds); 0 when there is none.
pub fn sum(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// The `_count` of histogram `name` with `labels` (prometheus-parse folds buckets into one
/// sample; the count is the last bucket's).
pub fn histogram_count(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> u64 {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .and_then(|s| match &s.value {
            Value::Histogram(buckets) => buckets.last().map(|b| b.count as u64),
            _ => None,
        })
        .unwrap_or(0)
}
