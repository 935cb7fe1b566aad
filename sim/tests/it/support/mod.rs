//! Shared helpers for the API server tests: a scratch directory, finding the machine's
//! kubectl binaries, and running one with a kubeconfig.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// A directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "relaylet-sim-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The versioned kubectl binaries beside the machine's `kubectl` (`kubectl.1.27` ...), as
/// (minor version, path), oldest first.
pub fn kubectls() -> Vec<(u32, PathBuf)> {
    let Some(kubectl) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("kubectl"))
            .find(|p| p.is_file())
    }) else {
        return Vec::new();
    };
    let Ok(real) = std::fs::canonicalize(&kubectl) else {
        return Vec::new();
    };
    let Some(dir) = real.parent() else {
        return Vec::new();
    };
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let minor = name.strip_prefix("kubectl.1.")?.parse::<u32>().ok()?;
            Some((minor, e.path()))
        })
        .collect();
    found.sort();
    found
}

/// The wanted kubectl minors that exist here; loud when some are missing.
pub fn kubectl_versions(wanted: &[u32]) -> Vec<(u32, PathBuf)> {
    let all = kubectls();
    let chosen: Vec<(u32, PathBuf)> = all
        .iter()
        .filter(|(m, _)| wanted.contains(m))
        .cloned()
        .collect();
    if chosen.len() < wanted.len() {
        eprintln!(
            "!!!!! SKIPPING kubectl versions: wanted 1.{wanted:?}, found {:?} !!!!!",
            all.iter().map(|(m, _)| *m).collect::<Vec<_>>()
        );
    }
    chosen
}

/// Output of one kubectl run.
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `kubectl args...` with `kubeconfig`, its caches inside `scratch`, for at most 60 s.
pub async fn kubectl(bin: &Path, scratch: &Scratch, kubeconfig: &Path, args: &[&str]) -> Run {
    let out: Output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(bin)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(scratch.0.join("cache"))
            .args(args)
            .env("HOME", &scratch.0)
            .env_remove("KUBECONFIG")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("kubectl timed out")
    .expect("kubectl runs");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
