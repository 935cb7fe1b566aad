//! A relaylet replica of a real-Kubernetes world as its own process (the shipped binary, with
//! the env an in-process replica gets), for tests that end a replica the way a node does:
//! SIGKILL (a crash: nothing runs) or SIGTERM (the real signal handler and hand-over).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::world::World;

/// A running replica process; killed when dropped.
pub struct ReplicaProcess {
    pub name: String,
    pub child: Child,
    /// Its operations port (`/metrics`).
    pub metrics: SocketAddr,
}

impl ReplicaProcess {
    /// Starts replica `i` of `world` from `binary` (a test's `env!("CARGO_BIN_EXE_relaylet")`),
    /// logging to `<world dir>/relaylet-<i>.log`.
    pub fn start(world: &World, i: usize, binary: &Path) -> ReplicaProcess {
        Self::start_via(world, i, binary, None)
    }

    /// Like [`start`](Self::start), its root apiserver calls sent to `root` (a
    /// [`Forwarder`](crate::testkit::forwarder::Forwarder) in front of the root apiserver, so a
    /// test can cut this replica's root traffic alone) when given.
    pub fn start_via(
        world: &World,
        i: usize,
        binary: &Path,
        root: Option<SocketAddr>,
    ) -> ReplicaProcess {
        let env: BTreeMap<String, String> = world.replica_env(i);
        let name = env.get("POD_NAME").cloned().unwrap_or_default();
        let metrics = env
            .get("METRICS_ADDR")
            .and_then(|a| a.parse().ok())
            .expect("a METRICS_ADDR");
        let kubeconfig = world.dir.path().join(format!("{name}.kubeconfig"));
        let mut config = world.replica_kubeconfig(i).to_string();
        if let Some(root) = root {
            // The apiserver's certificate names 127.0.0.1, where the forwarder listens too.
            assert!(config.contains(&world.root.url), "{config}");
            config = config.replace(&world.root.url, &format!("https://{root}"));
        }
        std::fs::write(&kubeconfig, config).expect("write kubeconfig");
        let log = std::fs::File::create(world.dir.path().join(format!("{name}.log")))
            .expect("replica log");
        let child = Command::new(binary)
            .env_clear()
            .envs(&env)
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("relaylet starts as its own process");
        ReplicaProcess {
            name,
            child,
            metrics,
        }
    }

    /// Sends `signal` (`TERM`, `KILL`) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} {}", self.child.id());
    }

    /// Waits for the process to exit; whether it exited successfully.
    pub fn wait(&mut self) -> bool {
        self.child.wait().is_ok_and(|s| s.success())
    }

    /// Finished sessions of `leaf` this replica served (`relaylet_sessions_total`).
    pub fn sessions_of(&self, leaf: &str) -> f64 {
        self.metric("relaylet_sessions_total", &[("leaf", leaf)])
    }

    /// The sum of metric `name` over the series with `labels`, as its operations port says.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let metrics = self.metrics;
        let scrape = crate::testkit::RT
            .block_on(async move { crate::testkit::metrics::http_get(metrics, "/metrics").await });
        let scrape = crate::testkit::metrics::parse(&scrape.body);
        crate::testkit::metrics::sum(&scrape, name, labels)
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
