//! The real Kubernetes network proxy (konnectivity, built from its module by
//! `tests/tools/build-k8s.sh`): a proxy server in HTTP CONNECT mode beside relaylet, serving its
//! clients over mutual TLS and picking the agent by the destination host (`destHost`), and an
//! agent that dials out to it, as in a leaf behind NAT. The agent can be killed and started
//! again, to cut the tunnel under a session and bring it back.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use relaylet_sim::tls::Ca;

use super::harness::{K8s, Process, free_port};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(120);

/// The proxy server's `/readyz` answer (status line and body), or what went wrong asking.
fn readyz(port: u16) -> String {
    let ask = || -> std::io::Result<String> {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        conn.write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)?;
        Ok(answer)
    };
    ask().unwrap_or_else(|err| err.to_string())
}

/// The pinned version, from `tests/realk8s/konnectivity/go.mod`.
pub fn version() -> String {
    let go_mod = crate::workspace_root().join("tests/realk8s/konnectivity/go.mod");
    std::fs::read_to_string(&go_mod)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("require sigs.k8s.io/apiserver-network-proxy ")
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// A running proxy server and (while it runs) its agent.
pub struct Konnectivity {
    /// Where clients CONNECT (TLS, client certificate required).
    pub server_port: u16,
    /// The CA of every certificate here: it verifies the server and the clients.
    pub ca_pem: String,
    /// A client certificate and key the server accepts.
    pub client_cert_pem: String,
    pub client_key_pem: String,
    /// The hosts the agent says it reaches (`--agent-identifiers=host=...`).
    agent_host: String,
    agent_port: u16,
    /// The server's health port: `/readyz` answers 200 once an agent is connected.
    health_port: u16,
    dir: PathBuf,
    _server: Process,
    agent: Option<Process>,
    agent_starts: usize,
}

impl Konnectivity {
    /// Starts the server and an agent that serves destinations on `agent_host`; their files
    /// and logs go in a directory removed when the test process exits. Clients reach the server
    /// on loopback and on `also_on` (its certificate names both).
    pub fn start(
        agent_host: &str,
        also_on: Option<std::net::IpAddr>,
    ) -> anyhow::Result<Konnectivity> {
        let dir = std::env::temp_dir().join(format!(
            "relaylet-konnectivity-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir)?;
        crate::testkit::remove_at_exit(dir.clone());
        let dir = dir.as_path();
        let ca = Ca::new("konnectivity-ca")?;
        let also = also_on.map(|ip| ip.to_string());
        let mut names = vec!["127.0.0.1", "localhost"];
        names.extend(also.as_deref());
        let serving = ca.issue_server(&names)?;
        let client = ca.issue_client("relaylet", &[])?;
        let agent = ca.issue_client("konnectivity-agent", &[])?;
        let write = |name: &str, pem: &str| -> anyhow::Result<String> {
            let path = dir.join(name);
            std::fs::write(&path, pem)?;
            Ok(path.display().to_string())
        };
        let ca_file = write("konnectivity-ca.crt", &ca.cert_pem())?;
        let cert = write("konnectivity-server.crt", &serving.cert_pem)?;
        let key = write("konnectivity-server.key", &serving.key_pem)?;
        write("konnectivity-agent.crt", &agent.cert_pem)?;
        write("konnectivity-agent.key", &agent.key_pem)?;
        let server_port = free_port();
        let agent_port = free_port();
        let health_port = free_port();
        let args = [
            "--mode=http-connect".to_string(),
            "--proxy-strategies=destHost,default".to_string(),
            "--uds-name=".to_string(),
            format!("--server-port={server_port}"),
            format!("--server-ca-cert={ca_file}"),
            format!("--server-cert={cert}"),
            format!("--server-key={key}"),
            format!("--agent-port={agent_port}"),
            format!("--cluster-ca-cert={ca_file}"),
            format!("--cluster-cert={cert}"),
            format!("--cluster-key={key}"),
            format!("--admin-port={}", free_port()),
            format!("--health-port={health_port}"),
            "--server-count=1".to_string(),
        ];
        let server = Process::spawn(
            "konnectivity-server",
            dir,
            &K8s::V1_35.bin_dir().join("proxy-server"),
            &args,
        );
        let mut konnectivity = Konnectivity {
            server_port,
            ca_pem: ca.cert_pem(),
            client_cert_pem: client.cert_pem,
            client_key_pem: client.key_pem,
            agent_host: agent_host.to_string(),
            agent_port,
            health_port,
            dir: dir.to_path_buf(),
            _server: server,
            agent: None,
            agent_starts: 0,
        };
        konnectivity.start_agent();
        // Until the agent has dialled in, every CONNECT fails ("No agent available"): a leaf
        // behind it would start unreachable and be retried on backoff, which on a loaded
        // machine can outlast the sandbox's wait for a Ready Node.
        konnectivity.wait_for_agent()?;
        Ok(konnectivity)
    }

    /// Waits until the server reports an agent connected (its `/readyz`).
    pub fn wait_for_agent(&self) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + HANG;
        loop {
            let answer = readyz(self.health_port);
            if answer.starts_with("HTTP/1.1 200") {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!(
                    "no konnectivity agent connected within {HANG:?}; the server's /readyz said {answer:?} (logs in {})",
                    self.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts the agent (again).
    pub fn start_agent(&mut self) {
        self.agent_starts += 1;
        let dir = self.dir.display().to_string();
        let args = [
            "--proxy-server-host=127.0.0.1".to_string(),
            format!("--proxy-server-port={}", self.agent_port),
            format!("--ca-cert={dir}/konnectivity-ca.crt"),
            format!("--agent-cert={dir}/konnectivity-agent.crt"),
            format!("--agent-key={dir}/konnectivity-agent.key"),
            format!("--agent-identifiers=host={}", self.agent_host),
            "--agent-id=leaf-agent".to_string(),
            format!("--admin-server-port={}", free_port()),
            format!("--health-server-port={}", free_port()),
            "--sync-interval=200ms".to_string(),
            "--sync-interval-cap=1s".to_string(),
        ];
        self.agent = Some(Process::spawn(
            &format!("konnectivity-agent-{}", self.agent_starts),
            &self.dir,
            &K8s::V1_35.bin_dir().join("proxy-agent"),
            &args,
        ));
    }

    /// Kills the agent as a crash would: every tunnel through it ends.
    pub fn kill_agent(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            agent.kill();
        }
    }
}
