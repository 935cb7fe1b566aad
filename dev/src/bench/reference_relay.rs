//! The reference relay (`relaylet-dev bench-relay`, hidden): the least any relay must do, written
//! only for the benchmark's "limit" column.
//!
//! It terminates TLS from the client, opens TLS to a target fixed on the command line (the leaf
//! apiserver), presenting a fixed client certificate, and copies bytes both ways until either
//! side ends. No HTTP parsing, no routing, no authentication, no logging per connection: what
//! is left is exactly one extra TLS hop and one copy. It runs as its own process so the
//! benchmark can read its memory, descriptors and CPU time from `/proc`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// Bytes per read in each direction: one TLS record's worth of plaintext, as in relaylet.
const COPY_BUF: usize = 16 * 1024;

/// Command-line settings of `bench-relay`.
#[derive(Debug, Clone)]
pub struct RelayArgs {
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub target: SocketAddr,
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl RelayArgs {
    /// Parses `--listen A --cert F --key F --target A --ca F --client-cert F --client-key F`.
    pub fn parse(args: &[String]) -> anyhow::Result<RelayArgs> {
        let mut values = std::collections::HashMap::new();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let value = it
                .next()
                .with_context(|| format!("bench-relay: {flag} needs a value"))?;
            values.insert(flag.as_str(), value.clone());
        }
        let mut take = |flag: &str| {
            values
                .remove(flag)
                .with_context(|| format!("bench-relay: {flag} is required"))
        };
        let args = RelayArgs {
            listen: take("--listen")?.parse().context("--listen")?,
            cert: take("--cert")?.into(),
            key: take("--key")?.into(),
            target: take("--target")?.parse().context("--target")?,
            ca: take("--ca")?.into(),
            client_cert: take("--client-cert")?.into(),
            client_key: take("--client-key")?.into(),
        };
        if let Some(extra) = values.keys().next() {
            anyhow::bail!("bench-relay: unknown option {extra}");
        }
        Ok(args)
    }

    /// The arguments that reproduce these settings.
    pub fn to_args(&self) -> Vec<String> {
        [
            ("--listen", self.listen.to_string()),
            ("--cert", self.cert.display().to_string()),
            ("--key", self.key.display().to_string()),
            ("--target", self.target.to_string()),
            ("--ca", self.ca.display().to_string()),
            ("--client-cert", self.client_cert.display().to_string()),
            ("--client-key", self.client_key.display().to_string()),
        ]
        .into_iter()
        .flat_map(|(f, v)| [f.to_string(), v])
        .collect()
    }
}

/// The line the relay prints on stdout once it listens, followed by the address.
pub const READY_PREFIX: &str = "bench-relay listening on ";

/// Runs the reference relay until the process is killed.
pub async fn run(args: RelayArgs) -> anyhow::Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs(&args.cert)?;
    let key = PrivateKeyDer::from_pem_file(&args.key)
        .with_context(|| format!("reading {}", args.key.display()))?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];

    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(&args.ca)? {
        roots.add(cert)?;
    }
    let client_key = PrivateKeyDer::from_pem_file(&args.client_key)
        .with_context(|| format!("reading {}", args.client_key.display()))?;
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(read_certs(&args.client_cert)?, client_key)?;
    client.alpn_protocols = vec![b"http/1.1".to_vec()];

    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let target_name = ServerName::IpAddress(args.target.ip().into());
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let mut stdout = tokio::io::stdout();
    stdout
        .write_all(format!("{READY_PREFIX}{}\n", listener.local_addr()?).as_bytes())
        .await?;
    stdout.flush().await?;
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                eprintln!("bench-relay: accept: {err}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let connector = connector.clone();
        let target_name = target_name.clone();
        let target = args.target;
        tokio::spawn(async move {
            if let Err(err) = relay_one(tcp, acceptor, connector, target, target_name).await {
                eprintln!("bench-relay: connection: {err:#}");
            }
        });
    }
}

async fn relay_one(
    tcp: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
    target: SocketAddr,
    target_name: ServerName<'static>,
) -> anyhow::Result<()> {
    tcp.set_nodelay(true)?;
    let mut inbound = acceptor.accept(tcp).await.context("TLS in")?;
    let out_tcp = TcpStream::connect(target).await.context("dialing target")?;
    out_tcp.set_nodelay(true)?;
    let mut outbound = connector
        .connect(target_name, out_tcp)
        .await
        .context("TLS out")?;
    // Errors here are the peers going away (resets included): the end of the session.
    let _ =
        tokio::io::copy_bidirectional_with_sizes(&mut inbound, &mut outbound, COPY_BUF, COPY_BUF)
            .await;
    Ok(())
}

fn read_certs(path: &std::path::Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", path.display());
    Ok(certs)
}
