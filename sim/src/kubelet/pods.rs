//! The pods this kubelet runs: their containers and each container's current and previous
//! instance, laid out on disk like the real kubelet does.
//!
//! Logs go to `<data_dir>/pods/<ns>_<pod>_<uid>/<container>/<restart>.log` (the kubelet's
//! `/var/log/pods` layout); processes run in `<data_dir>/containers/<ns>_<pod>_<uid>/<container>`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::container::{ContainerRun, Instance, Placement};
use super::error::KubeletError;

/// A pod to run.
#[derive(Debug, Clone)]
pub struct PodRun {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub containers: Vec<ContainerRun>,
}

/// A running pod.
pub struct Pod {
    pub name: String,
    pub uid: String,
    pub containers: Vec<Arc<Container>>,
}

impl Pod {
    pub fn container(&self, name: &str) -> Option<&Arc<Container>> {
        self.containers.iter().find(|c| c.spec.name == name)
    }

    /// The id the runtime's streaming server knows the pod sandbox by (shows in errors).
    pub fn sandbox_id(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.uid.bytes() {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        format!("{hash:016x}")
    }

    fn kill_all(&self) {
        for c in &self.containers {
            stop_container(c);
        }
    }
}

/// Ends a container: its exec sessions and every instance's processes.
fn stop_container(c: &Container) {
    c.stopped.cancel();
    if let Ok(instances) = c.instances.lock() {
        for i in instances.iter() {
            i.kill();
        }
    }
}

/// A container of a running pod and its instances (restarts).
pub struct Container {
    pub spec: ContainerRun,
    pub cwd: PathBuf,
    /// Fires when the pod is removed (or the kubelet stops): exec sessions end with it.
    pub stopped: CancellationToken,
    log_dir: PathBuf,
    pod_name: String,
    instances: Mutex<Vec<Arc<Instance>>>,
}

impl Container {
    /// The instance running now (or the last one, if it exited).
    pub fn current(&self) -> Option<Arc<Instance>> {
        self.instances.lock().ok()?.last().cloned()
    }

    /// The instance before the current one, which `previous=true` reads.
    pub fn previous(&self) -> Option<Arc<Instance>> {
        let instances = self.instances.lock().ok()?;
        let n = instances.len();
        (n >= 2).then(|| instances[n - 2].clone())
    }

    async fn start_instance(&self) -> Result<(), KubeletError> {
        let restart = self.instances.lock().map(|i| i.len()).unwrap_or(0) as u32;
        let instance = Instance::start(
            &self.spec,
            Placement {
                log_path: self.log_dir.join(format!("{restart}.log")),
                cwd: self.cwd.clone(),
                pod_name: self.pod_name.clone(),
                restart,
            },
        )
        .await?;
        let mut instances = self
            .instances
            .lock()
            .map_err(|_| KubeletError::Io("container state poisoned".into()))?;
        // Only the current and the previous instance are kept, like the kubelet does.
        if let Some(old) = instances.last() {
            old.kill();
        }
        instances.push(instance);
        let excess = instances.len().saturating_sub(2);
        instances.drain(..excess);
        Ok(())
    }
}

/// All pods of this kubelet.
#[derive(Default)]
pub struct Pods {
    pods: Mutex<HashMap<(String, String), Arc<Pod>>>,
}

impl Pods {
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods
            .lock()
            .ok()?
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Every pod, keyed by (namespace, name).
    pub fn all(&self) -> Vec<((String, String), Arc<Pod>)> {
        self.pods
            .lock()
            .map(|p| p.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// Starts every container of `run` and registers the pod (replacing one of the same name).
    pub async fn run(&self, data_dir: &Path, run: PodRun) -> Result<(), KubeletError> {
        for part in [&run.namespace, &run.name, &run.uid] {
            if part.is_empty() || part.contains(['/', '\0']) || part == ".." {
                return Err(KubeletError::InvalidPod(format!(
                    "invalid name or uid {part:?}"
                )));
            }
        }
        let pod_dir = format!("{}_{}_{}", run.namespace, run.name, run.uid);
        let stopped = CancellationToken::new();
        let mut containers: Vec<Arc<Container>> = Vec::new();
        for spec in run.containers {
            if spec.name.is_empty() || spec.name.contains(['/', '\0']) || spec.name == ".." {
                return Err(KubeletError::InvalidPod(format!(
                    "invalid container name {:?}",
                    spec.name
                )));
            }
            let container = Arc::new(Container {
                cwd: data_dir.join("containers").join(&pod_dir).join(&spec.name),
                log_dir: data_dir.join("pods").join(&pod_dir).join(&spec.name),
                stopped: stopped.clone(),
                pod_name: run.name.clone(),
                spec,
                instances: Mutex::new(Vec::new()),
            });
            if let Err(e) = container.start_instance().await {
                // Nothing of a pod that failed to start may keep running.
                for started in &containers {
                    stop_container(started);
                }
                return Err(e);
            }
            containers.push(container);
        }
        let pod = Arc::new(Pod {
            name: run.name.clone(),
            uid: run.uid,
            containers,
        });
        let old = self
            .pods
            .lock()
            .map_err(|_| KubeletError::Io("pod table poisoned".into()))?
            .insert((run.namespace, run.name), pod);
        if let Some(old) = old {
            old.kill_all();
        }
        Ok(())
    }

    /// Starts one more container in a running pod (an ephemeral container): the pod is replaced
    /// by one that also has it; sessions already open keep theirs.
    pub async fn add_container(
        &self,
        data_dir: &Path,
        namespace: &str,
        name: &str,
        spec: ContainerRun,
    ) -> Result<(), KubeletError> {
        let pod = self
            .get(namespace, name)
            .ok_or_else(|| KubeletError::NotFound(format!("pod {namespace}/{name}")))?;
        if spec.name.is_empty() || spec.name.contains(['/', '\0']) || spec.name == ".." {
            return Err(KubeletError::InvalidPod(format!(
                "invalid container name {:?}",
                spec.name
            )));
        }
        if pod.container(&spec.name).is_some() {
            return Ok(());
        }
        let pod_dir = format!("{namespace}_{name}_{}", pod.uid);
        let stopped = pod
            .containers
            .first()
            .map(|c| c.stopped.clone())
            .unwrap_or_default();
        let container = Arc::new(Container {
            cwd: data_dir.join("containers").join(&pod_dir).join(&spec.name),
            log_dir: data_dir.join("pods").join(&pod_dir).join(&spec.name),
            stopped,
            pod_name: name.to_string(),
            spec,
            instances: Mutex::new(Vec::new()),
        });
        container.start_instance().await?;
        let mut containers = pod.containers.clone();
        containers.push(container);
        let grown = Arc::new(Pod {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            containers,
        });
        self.pods
            .lock()
            .map_err(|_| KubeletError::Io("pod table poisoned".into()))?
            .insert((namespace.to_string(), name.to_string()), grown);
        Ok(())
    }

    /// Stops and forgets a pod.
    pub fn remove(&self, namespace: &str, name: &str) {
        let removed = self
            .pods
            .lock()
            .ok()
            .and_then(|mut p| p.remove(&(namespace.to_string(), name.to_string())));
        if let Some(pod) = removed {
            pod.kill_all();
        }
    }

    /// Kills the current instance of a container and starts a new one.
    pub async fn restart(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<(), KubeletError> {
        let found = self
            .get(namespace, pod)
            .ok_or_else(|| KubeletError::NotFound(format!("pod {namespace}/{pod}")))?;
        let c = found.container(container).cloned().ok_or_else(|| {
            KubeletError::NotFound(format!("container {container} in pod {namespace}/{pod}"))
        })?;
        if let Some(current) = c.current() {
            current.kill();
            // Wait until its output is fully logged, so the previous log is complete.
            let mut running = current.running();
            let _ = running.wait_for(|r| !*r).await;
        }
        c.start_instance().await
    }

    /// Kills every process of every pod.
    pub fn kill_all(&self) {
        if let Ok(pods) = self.pods.lock() {
            for pod in pods.values() {
                pod.kill_all();
            }
        }
    }
}
