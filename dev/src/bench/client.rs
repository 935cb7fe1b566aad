//! The benchmark's clients: exec, port-forward and `logs -f` against one of the three routes.
//!
//! Exec and port-forward speak SPDY/3.1 with the sim's client (`upgrade_client` + streams),
//! as client-go does: remotecommand v4 streams `error`, `stdin`, `stdout`; port-forward streams
//! `error` + `data` per forwarded connection. Logs are a plain HTTPS GET with `follow=true`.
//! Every operation checks what it got (byte counts, exit status) so a broken route cannot pass
//! for a fast one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use relaylet_sim::spdy::{self, Connection, Incoming, Stream};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The exec protocol every benchmark session uses.
const EXEC_PROTOCOL: &str = "v4.channel.k8s.io";
/// Read size on the client side: large, so the client is never the narrow part.
const READ_BUF: usize = 256 * 1024;
/// How long any single operation may take before it counts as hung.
const OP_TIMEOUT: Duration = Duration::from_secs(120);

/// The three ways to reach a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The leaf apiserver's pod subresource, called by the client itself.
    Direct,
    /// The same, through the reference relay.
    Limit,
    /// relaylet's kubelet API, called as the root apiserver would.
    Relayed,
}

impl Route {
    pub const ALL: [Route; 3] = [Route::Direct, Route::Limit, Route::Relayed];
}

/// Where and how a client connects for one route.
#[derive(Clone)]
pub struct Target {
    pub route: Route,
    pub addr: SocketAddr,
    pub tls: Arc<rustls::ClientConfig>,
}

/// The pod the bench talks to.
#[derive(Debug, Clone)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

/// Bytes moved and the time they took.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    pub bytes: u64,
    pub elapsed: Duration,
}

impl Transfer {
    pub fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / (1024.0 * 1024.0) / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

impl Target {
    fn url(&self, path_and_query: &str) -> String {
        format!("https://{}{path_and_query}", self.addr)
    }

    /// The exec path: kubelet form for relaylet, pod subresource form otherwise.
    fn exec_path(&self, pod: &PodRef, container: &str, command: &[&str], stdin: bool) -> String {
        let args: String = command
            .iter()
            .map(|c| format!("command={}&", encode(c)))
            .collect();
        match self.route {
            Route::Relayed => format!(
                "/exec/{}/{}/{container}?{args}output=1{}",
                pod.namespace,
                pod.name,
                if stdin { "&input=1" } else { "" }
            ),
            _ => format!(
                "/api/v1/namespaces/{}/pods/{}/exec?container={container}&{args}stdout=true{}",
                pod.namespace,
                pod.name,
                if stdin { "&stdin=true" } else { "" }
            ),
        }
    }

    fn portforward_path(&self, pod: &PodRef, port: u16) -> String {
        match self.route {
            Route::Relayed => format!("/portForward/{}/{}?port={port}", pod.namespace, pod.name),
            _ => format!(
                "/api/v1/namespaces/{}/pods/{}/portforward?ports={port}",
                pod.namespace, pod.name
            ),
        }
    }

    fn logs_path(&self, pod: &PodRef, container: &str) -> String {
        match self.route {
            Route::Relayed => format!(
                "/containerLogs/{}/{}/{container}?follow=true",
                pod.namespace, pod.name
            ),
            _ => format!(
                "/api/v1/namespaces/{}/pods/{}/log?container={container}&follow=true",
                pod.namespace, pod.name
            ),
        }
    }

    async fn connect_tls(&self) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("connecting to {}", self.addr))?;
        tcp.set_nodelay(true)?;
        let name = ServerName::IpAddress(self.addr.ip().into());
        tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .with_context(|| format!("TLS with {}", self.addr))
    }

    async fn upgrade(&self, path: &str, protocol: &str) -> anyhow::Result<(Connection, Incoming)> {
        let (chosen, conn, incoming) =
            spdy::upgrade_client(&self.url(path), self.tls.clone(), &[protocol], &[])
                .await
                .with_context(|| format!("{:?} upgrade of {path}", self.route))?;
        anyhow::ensure!(
            chosen == protocol,
            "{:?}: server chose {chosen:?}, not {protocol}",
            self.route
        );
        Ok((conn, incoming))
    }
}

async fn open(conn: &Connection, headers: &[(&str, &str)]) -> anyhow::Result<Stream> {
    conn.open_stream(
        headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
    .await
    .with_context(|| format!("opening stream {headers:?}"))
}

/// Reads the remotecommand error stream to its end and fails unless the command succeeded
/// (v4 sends a `Success` Status, or nothing).
async fn expect_success(mut error: Stream) -> anyhow::Result<()> {
    let mut status = Vec::new();
    error
        .read_to_end(&mut status)
        .await
        .context("error stream")?;
    if status.is_empty() {
        return Ok(());
    }
    let value: serde_json::Value =
        serde_json::from_slice(&status).context("error stream is not a Status")?;
    anyhow::ensure!(
        value["status"] == "Success",
        "command failed: {}",
        String::from_utf8_lossy(&status)
    );
    Ok(())
}

async fn count_to_end(stream: &mut Stream) -> anyhow::Result<u64> {
    let mut buf = vec![0u8; READ_BUF];
    let mut total = 0u64;
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

/// Exec `head -c bytes /dev/zero` and time its stdout from the open streams to EOF.
pub async fn exec_stdout(target: &Target, pod: &PodRef, bytes: u64) -> anyhow::Result<Transfer> {
    tokio::time::timeout(OP_TIMEOUT, async {
        let size = bytes.to_string();
        let path = target.exec_path(pod, "main", &["head", "-c", &size, "/dev/zero"], false);
        let (conn, _incoming) = target.upgrade(&path, EXEC_PROTOCOL).await?;
        let error = open(&conn, &[("streamType", "error")]).await?;
        let start = Instant::now();
        let mut stdout = open(&conn, &[("streamType", "stdout")]).await?;
        let got = count_to_end(&mut stdout).await?;
        let elapsed = start.elapsed();
        expect_success(error).await?;
        anyhow::ensure!(
            got == bytes,
            "{:?}: stdout had {got} of {bytes} bytes",
            target.route
        );
        Ok(Transfer { bytes, elapsed })
    })
    .await
    .context("exec throughput timed out")?
}

/// Exec `cat` and time `iterations` one-byte round trips (stdin to stdout); microseconds each.
pub async fn exec_round_trips(
    target: &Target,
    pod: &PodRef,
    iterations: usize,
) -> anyhow::Result<Vec<f64>> {
    tokio::time::timeout(OP_TIMEOUT, async {
        let path = target.exec_path(pod, "main", &["cat"], true);
        let (conn, _incoming) = target.upgrade(&path, EXEC_PROTOCOL).await?;
        let error = open(&conn, &[("streamType", "error")]).await?;
        let mut stdin = open(&conn, &[("streamType", "stdin")]).await?;
        let mut stdout = open(&conn, &[("streamType", "stdout")]).await?;
        let mut byte = [0u8; 1];
        let mut samples = Vec::with_capacity(iterations);
        // A few unmeasured trips first: the process has just started.
        for i in 0..iterations + 20 {
            let start = Instant::now();
            stdin.write_all(b"x").await?;
            stdin.flush().await?;
            stdout.read_exact(&mut byte).await.context("echo")?;
            anyhow::ensure!(byte == *b"x", "echoed {byte:?}");
            if i >= 20 {
                samples.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
        stdin.shutdown().await?;
        let rest = count_to_end(&mut stdout).await?;
        anyhow::ensure!(rest == 0, "cat echoed {rest} unexpected bytes");
        expect_success(error).await?;
        Ok(samples)
    })
    .await
    .context("exec round trips timed out")?
}

/// One whole exec session of `true`: upgrade, streams, exit status, close. Returns its time.
pub async fn exec_true(target: &Target, pod: &PodRef) -> anyhow::Result<Duration> {
    tokio::time::timeout(OP_TIMEOUT, async {
        let start = Instant::now();
        let path = target.exec_path(pod, "main", &["true"], false);
        let (conn, incoming) = target.upgrade(&path, EXEC_PROTOCOL).await?;
        let error = open(&conn, &[("streamType", "error")]).await?;
        let mut stdout = open(&conn, &[("streamType", "stdout")]).await?;
        let got = count_to_end(&mut stdout).await?;
        expect_success(error).await?;
        anyhow::ensure!(got == 0, "`true` wrote {got} bytes");
        drop((stdout, incoming));
        conn.goaway().await;
        Ok(start.elapsed())
    })
    .await
    .context("exec session timed out")?
}

/// Port-forwards to `port`, asks the pod's sender for `bytes` bytes, and times them to EOF.
pub async fn portforward(
    target: &Target,
    pod: &PodRef,
    port: u16,
    bytes: u64,
) -> anyhow::Result<Transfer> {
    tokio::time::timeout(OP_TIMEOUT, async {
        let path = target.portforward_path(pod, port);
        let (conn, _incoming) = target.upgrade(&path, "portforward.k8s.io").await?;
        let port = port.to_string();
        let headers = |kind: &'static str| {
            [
                ("streamType", kind),
                ("port", port.as_str()),
                ("requestID", "0"),
            ]
        };
        let _error = open(&conn, &headers("error")).await?;
        let mut data = open(&conn, &headers("data")).await?;
        let start = Instant::now();
        data.write_all(format!("{bytes}\n").as_bytes()).await?;
        data.flush().await?;
        let got = count_to_end(&mut data).await?;
        let elapsed = start.elapsed();
        anyhow::ensure!(
            got == bytes,
            "{:?}: port-forward gave {got} of {bytes} bytes",
            target.route
        );
        Ok(Transfer { bytes, elapsed })
    })
    .await
    .context("port-forward timed out")?
}

/// `logs -f` of `container`: times the first `bytes` bytes of the body, then hangs up.
pub async fn logs_follow(
    target: &Target,
    pod: &PodRef,
    container: &str,
    bytes: u64,
) -> anyhow::Result<Transfer> {
    tokio::time::timeout(OP_TIMEOUT, async {
        let tls = target.connect_tls().await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        let driver = tokio::spawn(conn);
        let request = Request::get(target.logs_path(pod, container))
            .header(header::HOST, target.addr.to_string())
            .body(Empty::<Bytes>::new())?;
        let response = sender.send_request(request).await?;
        anyhow::ensure!(
            response.status() == StatusCode::OK,
            "{:?}: logs answered {}",
            target.route,
            response.status()
        );
        let start = Instant::now();
        let mut body = response.into_body();
        let mut got = 0u64;
        while got < bytes {
            let Some(frame) = body.frame().await else {
                anyhow::bail!(
                    "{:?}: log stream ended after {got} of {bytes} bytes",
                    target.route
                );
            };
            if let Ok(data) = frame?.into_data() {
                got += data.len() as u64;
            }
        }
        let elapsed = start.elapsed();
        driver.abort();
        Ok(Transfer {
            bytes: got,
            elapsed,
        })
    })
    .await
    .context("logs timed out")?
}

/// Opens one exec upgrade and returns the raw upgraded connection, left idle: no streams, no
/// bytes. Dropping it closes the session.
pub async fn open_idle(target: &Target, pod: &PodRef) -> anyhow::Result<hyper::upgrade::Upgraded> {
    tokio::time::timeout(OP_TIMEOUT, async {
        let tls = target.connect_tls().await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn.with_upgrades());
        let request = Request::post(target.exec_path(pod, "main", &["sh"], true))
            .header(header::HOST, target.addr.to_string())
            .header(header::CONTENT_LENGTH, "0")
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, spdy::upgrade::SPDY_31)
            .header(spdy::upgrade::PROTOCOL_VERSION_HEADER, EXEC_PROTOCOL)
            .body(Empty::<Bytes>::new())?;
        let mut response = sender.send_request(request).await?;
        anyhow::ensure!(
            response.status() == StatusCode::SWITCHING_PROTOCOLS,
            "idle session answered {}",
            response.status()
        );
        Ok(hyper::upgrade::on(&mut response).await?)
    })
    .await
    .context("opening an idle session timed out")?
}
