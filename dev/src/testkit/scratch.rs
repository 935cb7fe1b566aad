//! A directory of a test's own under the system's temporary one, removed when dropped.

use std::path::PathBuf;

/// The directory; its path is `.0`.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// `relaylet-<tag>-<pid>` under the temporary directory, emptied first.
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("relaylet-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
