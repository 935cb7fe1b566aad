//! The container image as it ships: the repository's Dockerfile built unchanged by
//! `tests/tools/build-image.sh` (podman, base images made from Debian 12's packages) and saved
//! as an archive that podman (`tests/real/image.rs`) and a real node's containerd
//! (`realk8s::real_node`) load. A machine that cannot build it fails the tests that need it
//! with the script's error; they never pass without the image.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The image's name, as the Dockerfile's build tags it and a pod names it.
pub const IMAGE: &str = "localhost/relaylet:dev";

/// Runs `tests/tools/build-image.sh` once for this test binary (it rebuilds only what changed,
/// and takes turns with other runs through its lock) and returns the saved archive's path.
pub fn built() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let out = Command::new("bash")
            .arg(crate::workspace_root().join("tests/tools/build-image.sh"))
            .output()
            .map_err(|e| format!("running tests/tools/build-image.sh: {e}"))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
            return Err(format!(
                "tests/tools/build-image.sh failed ({}); this machine cannot build the image. \
                 Last lines:\n{}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        let cache = match std::env::var_os("RELAYLET_IMAGE_CACHE") {
            Some(dir) => PathBuf::from(dir),
            None => std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .ok_or("neither XDG_CACHE_HOME nor HOME is set")?
                .join("relaylet/image"),
        };
        Ok(cache.join("relaylet.tar"))
    });
    match built {
        Ok(path) => path,
        Err(err) => panic!("{err}"),
    }
}
