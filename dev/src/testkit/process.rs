//! relaylet as its own process beside the sandbox's in-process replica (the shipped binary,
//! configured by env vars like the sandbox's), for tests that kill it or measure its memory.
//! It joins the sandbox's leader election (with a Running Pod of its name, `replica_pod`), so
//! the in-process replica keeps writing the Nodes until it shuts down; its own kubelet port
//! serves every virtual node's pods meanwhile.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::sandbox::{RELAYLET_NAMESPACE, RELAYLET_ROOT_USER};

use super::Env;

/// A running relaylet process; killed when dropped.
pub struct RelayletProcess {
    pub child: Child,
    /// Its shared kubelet port.
    pub addr: SocketAddr,
}

impl RelayletProcess {
    /// Starts `binary` (the test's `env!("CARGO_BIN_EXE_relaylet")`) as replica `pod_name`,
    /// with `env` over the sandbox's settings.
    pub fn start(e: &Env, binary: &Path, pod_name: &str, env: &[(&str, String)]) -> Self {
        let files = e.sandbox.files();
        let kubeconfig = files.join(format!("{pod_name}.kubeconfig"));
        std::fs::write(
            &kubeconfig,
            e.sandbox
                .root
                .kubeconfig(RELAYLET_ROOT_USER, &[])
                .expect("relaylet's root kubeconfig"),
        )
        .expect("write kubeconfig");
        // Its Pod, as its Deployment would make it: a replica counts only as a live pod. Made on
        // a thread of its own, so a test may start a process from inside the runtime too.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    super::RT.block_on(async {
                        let admin =
                            crate::sandbox::kube_client(&e.sandbox.root.admin_kubeconfig()?)
                                .await?;
                        crate::sandbox::replica_pod::running(
                            &admin,
                            RELAYLET_NAMESPACE,
                            pod_name,
                            "127.0.0.1",
                        )
                        .await
                    })
                })
                .join()
        })
        .expect("the replica's pod is made without a panic")
        .expect("the replica's pod");
        // A process is told its port by number (NODE_SERVER_PORT must be 1-65535): see
        // relaylet_sim::ports.
        let addr = relaylet_sim::ports::free_loopback_port().expect("a free port");
        let mut command = Command::new(binary);
        command
            .env_clear()
            .env("KUBECONFIG", &kubeconfig)
            .env("LEAF_NODE_IP", "127.0.0.1")
            .env("NODE_SERVER_PORT", addr.port().to_string())
            .env("PREFERRED-ADDRESS-TYPE", "InternalDNS")
            .env("AUTH_MODE", "webhook")
            .env("APISERVER_CERT_LOCATION", files.join("tls.crt"))
            .env("APISERVER_KEY_LOCATION", files.join("tls.key"))
            .env("POD_NAME", pod_name)
            .env("POD_NAMESPACE", RELAYLET_NAMESPACE)
            .env("METRICS_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command.spawn().expect("relaylet starts as its own process");
        RelayletProcess { child, addr }
    }
}

impl Drop for RelayletProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
